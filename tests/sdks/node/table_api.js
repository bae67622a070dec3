// The official Node.js Tablestore SDK against the local server: every table call a Node user makes in a
// CDC set-up (create, put, update, delete, batch write, get, paged getRange), asserted here against a model
// of what the table must hold. Run by tests/sdks/test_node_sdk.py; on success prints one JSON document
// (the final table as this SDK reads it, and the page counts) for the Python side to compare with its own
// SDK's reading. Any failed assertion or SDK error exits non-zero with the reason on stderr.
//
// Connection settings come from the environment (OTS_ENDPOINT, OTS_INSTANCE, OTS_ACCESS_KEY_ID,
// OTS_ACCESS_KEY_SECRET, OTS_TABLE) so that the secret never appears in a process listing.
'use strict';

const assert = require('node:assert/strict');
const TableStore = require('tablestore');

const Long = TableStore.Long;

function env(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`environment variable ${name} is not set`);
  }
  return value;
}

const table = env('OTS_TABLE');
const client = new TableStore.Client({
  endpoint: env('OTS_ENDPOINT'),
  instancename: env('OTS_INSTANCE'),
  accessKeyId: env('OTS_ACCESS_KEY_ID'),
  secretAccessKey: env('OTS_ACCESS_KEY_SECRET'),
  // A retried call would hide a server error behind a slow pass.
  maxRetries: 0,
});

const ignore = () => new TableStore.Condition(TableStore.RowExistenceExpectation.IGNORE, null);

// Values as plain JSON, so that the model, this SDK's answers and the Python SDK's answers compare exactly
// (int64 as decimal strings: a JS number loses precision beyond 2^53).
function plain(value) {
  if (Buffer.isBuffer(value)) {
    return { blob: value.toString('base64') };
  }
  if (typeof value === 'object' && value !== null && typeof value.toString === 'function') {
    return { int: value.toString(10) }; // int64-buffer's Int64LE
  }
  if (typeof value === 'number') {
    return { double: value };
  }
  return value; // string, boolean
}

function rowToPlain(row) {
  const attrs = {};
  for (const cell of row.attributes || []) {
    attrs[cell.columnName] = plain(cell.columnValue);
  }
  return { pk: row.primaryKey.map((c) => [c.name, plain(c.value)]), attrs };
}

// The model: what the table must hold, keyed like the table orders (pk_int, then pk_str).
const model = new Map();
const keyOf = (i, s) => `${String(i).padStart(6, '0')}|${s}`;

function modelPut(i, s, attrs) {
  model.set(keyOf(i, s), { pk: [['pk_int', { int: String(i) }], ['pk_str', s]], attrs: { ...attrs } });
}

function modelRows(filter = () => true) {
  return [...model.keys()].sort().filter(filter).map((k) => model.get(k));
}

const pk = (i, s) => [{ pk_int: Long.fromNumber(i) }, { pk_str: s }];

function attributesFor(i) {
  return [
    { name: `row-${i}` },
    { score: i + 0.25 },
    { count: Long.fromString(String(1e12 + i)) }, // beyond int32: checks 64-bit values both ways
    { active: i % 2 === 0 },
    { payload: Buffer.from([i % 256, 0, 255, 7]) },
  ];
}

function plainAttributes(i) {
  const attrs = {};
  for (const column of attributesFor(i)) {
    const [name, value] = Object.entries(column)[0];
    attrs[name] = plain(value);
  }
  return attrs;
}

async function getRow(i, s, columnsToGet) {
  const params = { tableName: table, primaryKey: pk(i, s), maxVersions: 1 };
  if (columnsToGet) {
    params.columnsToGet = columnsToGet;
  }
  const data = await client.getRow(params);
  // This SDK answers a missing row with an empty object.
  return data.row && data.row.primaryKey ? rowToPlain(data.row) : null;
}

// Pages through [start, end) with `limit` rows a page, following nextStartPrimaryKey as a user does.
async function scan(start, end, limit, direction = TableStore.Direction.FORWARD) {
  const rows = [];
  let pages = 0;
  let from = start;
  for (;;) {
    const data = await client.getRange({
      tableName: table,
      direction,
      maxVersions: 1,
      inclusiveStartPrimaryKey: from,
      exclusiveEndPrimaryKey: end,
      limit,
    });
    pages += 1;
    assert.ok(data.rows.length <= limit, `a page of ${data.rows.length} rows exceeds the limit ${limit}`);
    rows.push(...data.rows.map(rowToPlain));
    if (!data.nextStartPrimaryKey) {
      break;
    }
    from = data.nextStartPrimaryKey.map((c) => ({ [c.name]: c.value }));
    assert.ok(pages < 1000, 'getRange paging does not end');
  }
  return { rows, pages };
}

async function main() {
  await client.createTable({
    tableMeta: {
      tableName: table,
      primaryKey: [
        { name: 'pk_int', type: 'INTEGER' },
        { name: 'pk_str', type: 'STRING' },
      ],
    },
    reservedThroughput: { capacityUnit: { read: 0, write: 0 } },
    tableOptions: { timeToLive: -1, maxVersions: 1 },
  });
  const listed = await client.listTable({});
  assert.ok(listed.tableNames.includes(table), `listTable misses ${table}: ${listed.tableNames}`);
  const described = await client.describeTable({ tableName: table });
  assert.deepEqual(
    described.tableMeta.primaryKey.map((c) => c.name),
    ['pk_int', 'pk_str'],
  );

  // putRow: 30 rows over two string keys per integer, so ranges bounded on the first column cut pages
  // in the middle of an integer's rows.
  for (let i = 0; i < 15; i += 1) {
    for (const s of ['a', 'b']) {
      const put = await client.putRow({
        tableName: table,
        condition: ignore(),
        primaryKey: pk(i, s),
        attributeColumns: attributesFor(i),
        returnContent: { returnType: TableStore.ReturnType.Primarykey },
      });
      assert.deepEqual(rowToPlain(put.row).pk, [['pk_int', { int: String(i) }], ['pk_str', s]]);
      modelPut(i, s, plainAttributes(i));
    }
  }

  // A put that expects the row absent must fail on an existing row, and change nothing.
  await assert.rejects(
    client.putRow({
      tableName: table,
      condition: new TableStore.Condition(TableStore.RowExistenceExpectation.EXPECT_NOT_EXIST, null),
      primaryKey: pk(3, 'a'),
      attributeColumns: [{ name: 'overwritten' }],
    }),
    (err) => err.code === 'OTSConditionCheckFail' || /Condition/.test(String(err.message)),
  );

  assert.deepEqual(await getRow(4, 'b'), model.get(keyOf(4, 'b')));
  assert.deepEqual((await getRow(4, 'b', ['name', 'count'])).attrs, {
    name: 'row-4',
    count: { int: String(1e12 + 4) },
  });
  assert.equal(await getRow(99, 'a'), null);

  // updateRow: put a column, delete one, change another's type.
  await client.updateRow({
    tableName: table,
    condition: new TableStore.Condition(TableStore.RowExistenceExpectation.EXPECT_EXIST, null),
    primaryKey: pk(5, 'a'),
    updateOfAttributeColumns: [
      { PUT: [{ name: 'renamed-5' }, { extra: Long.fromNumber(-42) }, { active: 'yes' }] },
      { DELETE_ALL: ['payload'] },
    ],
  });
  const updated = model.get(keyOf(5, 'a')).attrs;
  updated.name = 'renamed-5';
  updated.extra = { int: '-42' };
  updated.active = 'yes';
  delete updated.payload;
  assert.deepEqual(await getRow(5, 'a'), model.get(keyOf(5, 'a')));

  // deleteRow.
  await client.deleteRow({ tableName: table, condition: ignore(), primaryKey: pk(6, 'b') });
  model.delete(keyOf(6, 'b'));
  assert.equal(await getRow(6, 'b'), null);

  // batchWriteRow: puts, an update and a delete in one call, each answered per row.
  const batchRows = [];
  for (let i = 15; i < 20; i += 1) {
    batchRows.push({ type: 'PUT', condition: ignore(), primaryKey: pk(i, 'a'), attributeColumns: attributesFor(i) });
    modelPut(i, 'a', plainAttributes(i));
  }
  batchRows.push({
    type: 'UPDATE',
    condition: ignore(),
    primaryKey: pk(7, 'a'),
    attributeColumns: [{ PUT: [{ score: 0.5 }] }, { DELETE_ALL: ['name'] }],
  });
  model.get(keyOf(7, 'a')).attrs.score = { double: 0.5 };
  delete model.get(keyOf(7, 'a')).attrs.name;
  batchRows.push({ type: 'DELETE', condition: ignore(), primaryKey: pk(8, 'b') });
  model.delete(keyOf(8, 'b'));
  const batch = await client.batchWriteRow({ tables: [{ tableName: table, rows: batchRows }] });
  assert.equal(batch.tables.length, batchRows.length);
  for (const result of batch.tables) {
    assert.equal(result.isOk, true, `batch row failed: ${JSON.stringify(result)}`);
  }
  assert.deepEqual(await getRow(17, 'a'), model.get(keyOf(17, 'a')));
  assert.deepEqual(await getRow(7, 'a'), model.get(keyOf(7, 'a')));
  assert.equal(await getRow(8, 'b'), null);

  const INF_MIN = TableStore.INF_MIN;
  const INF_MAX = TableStore.INF_MAX;
  const everything = modelRows();
  const full = await scan([{ pk_int: INF_MIN }, { pk_str: INF_MIN }], [{ pk_int: INF_MAX }, { pk_str: INF_MAX }], 4);
  assert.deepEqual(full.rows, everything);
  assert.ok(full.pages >= Math.ceil(everything.length / 4), `the full scan took ${full.pages} pages`);

  // Bounded: [ (5, INF_MIN), (12, "b") ) holds 5a..12a; pages of 3 end between the two rows of an integer.
  const inBounds = (k) => k >= keyOf(5, '') && k < keyOf(12, 'b');
  const bounded = await scan([{ pk_int: Long.fromNumber(5) }, { pk_str: INF_MIN }], pk(12, 'b'), 3);
  assert.deepEqual(bounded.rows, modelRows(inBounds));
  assert.ok(bounded.pages >= 3, `bounded scan took ${bounded.pages} pages`);

  const backward = await scan(
    [{ pk_int: INF_MAX }, { pk_str: INF_MAX }],
    [{ pk_int: INF_MIN }, { pk_str: INF_MIN }],
    7,
    TableStore.Direction.BACKWARD,
  );
  assert.deepEqual(backward.rows, [...everything].reverse());

  // The table stays for the Python side to read; auto-increment keys (which this SDK pads as it pads
  // INF_MIN/INF_MAX) and deleteTable are checked on a scratch table.
  const scratch = `${table}_scratch`;
  await client.createTable({
    tableMeta: {
      tableName: scratch,
      primaryKey: [
        { name: 'part', type: 'BINARY' },
        { name: 'seq', type: 'INTEGER', option: 'AUTO_INCREMENT' },
      ],
    },
    reservedThroughput: { capacityUnit: { read: 0, write: 0 } },
    tableOptions: { timeToLive: -1, maxVersions: 1 },
  });
  const seqs = [];
  for (let n = 0; n < 2; n += 1) {
    const put = await client.putRow({
      tableName: scratch,
      condition: ignore(),
      primaryKey: [{ part: Buffer.from('p') }, { seq: TableStore.PK_AUTO_INCR }],
      attributeColumns: [{ n: Long.fromNumber(n) }],
      returnContent: { returnType: TableStore.ReturnType.Primarykey },
    });
    seqs.push(BigInt(put.row.primaryKey[1].value.toString(10)));
  }
  assert.ok(seqs[0] < seqs[1], `auto-increment values do not increase: ${seqs}`);
  await client.deleteTable({ tableName: scratch });
  const after = await client.listTable({});
  assert.ok(!after.tableNames.includes(scratch), 'a table is still listed after deleteTable');

  const pages = { full: full.pages, bounded: bounded.pages, backward: backward.pages };
  process.stdout.write(`${JSON.stringify({ rows: full.rows, pages })}\n`);
}

main().catch((err) => {
  // SDK errors carry code/message/requestId; assertion errors carry the compared values in their message.
  process.stderr.write(`${err && err.stack ? err.stack : err}\n${JSON.stringify(err, null, 2)}\n`);
  process.exit(1);
});
