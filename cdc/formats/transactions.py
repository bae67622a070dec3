"""Debezium transaction metadata (``debezium.transactionTopic``, the Pulsar and Kafka backends): batches that never end inside a source
transaction.

With ``provide.transaction.metadata=true`` Debezium writes a BEGIN and an END event per transaction to a
transaction topic (``<topic.prefix>.transaction``) and adds ``transaction: {id, total_order,
data_collection_order}`` to every change envelope. The END event counts the transaction's events per data
collection (``data_collections: [{data_collection, event_count}]``).

How batch ends are chosen
-------------------------
* **Commit order.** The transaction topic lists transactions in commit order: a transaction's *order* is the
  position of its END there. Within one partition of a data topic, events are in commit order too.
* **Complete transactions** (:class:`TransactionLog`). A transaction is complete when its END has been read
  and, for every data collection of its END that the query's topics carry (one of its events has been
  seen), as many events as the END counts have been indexed, over every partition of every topic of the
  query. The *frontier* is the last order up to which every transaction is complete. A transaction whose END
  has not arrived, or whose events are not all indexed yet, is never taken, nor anything after it.
* **One cut per round, over every partition** (:func:`transaction_cut`). A transaction's events may be spread
  over several partitions (Debezium partitions by key) and several topics: a batch takes, in every channel,
  exactly the events of the transactions up to one order *K*, so a transaction is wholly in a batch or wholly
  out. The planner plans channels one after another; each channel's range narrows the window of orders
  ``[lo, hi]`` that *K* may still take, and the next channel's end is chosen inside it.
* **The budget moves the end forward.** ``maxRecordsPerTrigger`` ending inside a transaction extends the
  range to that transaction's last event (the budget is soft, as the PostgreSQL backend takes a transaction
  larger than the budget whole): moving back instead would plan nothing, forever, once one transaction is
  larger than a channel's share. A bound the range may not pass (``endingOffsets``, an AvailableNow target,
  a truncate with ``debezium.truncate=apply``) moves the end back to before the transaction instead (a
  truncate inside the transaction a range starts with cannot: that transaction is taken whole).
* Messages outside any transaction (snapshot reads, tombstones, envelopes without metadata) are single-event
  transactions: a batch may end before or after any of them.

Assumed, as Debezium does it: a data event is published before its transaction's END event (the driver reads
the transaction topic first, then the data topics, each planning round); a data collection is written to
the query's topics only (any partitions). A collection whose events the query has never seen in a
transaction cannot be waited for: when a transaction touches two topics of the query and the second topic's
events are still unpublished when the first topic's are all indexed, that transaction may be split.

The cost: the driver reads every message of the data topics (each backend's index of its channels: the Pulsar
id index, the Kafka offset index) and parses its transaction block (:func:`transaction_of`); see
``benchmarks/debezium_transactions.py``. What is shared here works over per-channel sequences of positions and
the transaction key of the message at each (:class:`IndexedMessages`); reading the topics is each backend's.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from cdc.formats.debezium import source_table, value_of

log = logging.getLogger(__name__)

INF = math.inf


def transaction_of(payload: bytes) -> tuple[str, str] | None:
    """(transaction key, data collection as ``db.schema.table``) of a change envelope: the key is the
    transaction id, or with the PostgreSQL connector its ``txId`` part (see :func:`_postgres_xid`); ``None``
    for a message outside any transaction (a tombstone, a snapshot read, an envelope without metadata, an
    undecodable one: the executors deal with that).

    Every message of the query passes here on the driver, so the row images (most of an envelope) are not
    decoded: when ``transaction`` and ``source`` occur once as keys (a JSON key cannot occur inside a string,
    so that one is the envelope's own), the id is the transaction block's first field (Debezium writes it
    first) and the names come from the flat source block. Anything else is decoded whole."""
    value = value_of(payload)
    if b'"transaction"' not in value:
        return None
    if value.count(b'"transaction"') == 1 and value.count(b'"source"') == 1:
        tx, source = _TX_ID.search(value), _SOURCE.search(value)
        if tx is not None and source is not None:
            block = source.group(1)
            names = {k.decode(): v.decode(errors="replace") for k, v in _NAMES.findall(block)}
            # a name the pattern skipped (escapes in it) is decoded whole instead
            if "table" in names and all(k.decode() in names for k in _NAME_KEYS if b'"%s"' % k in block):
                return _key(tx.group(1).decode(errors="replace"), names), source_table({"source": names})
        elif _NO_TX.search(value) is not None:
            return None
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    if isinstance(doc, dict) and "op" not in doc and isinstance(doc.get("payload"), dict):
        doc = doc["payload"]
    block = doc.get("transaction") if isinstance(doc, dict) else None
    if not isinstance(block, dict) or not isinstance(block.get("id"), str):
        return None
    source = doc.get("source")
    return _key(block["id"], source), source_table({"source": source})


_TX_ID = re.compile(rb'"transaction"\s*:\s*\{\s*"id"\s*:\s*"([^"\\]*)"')
_NO_TX = re.compile(rb'"transaction"\s*:\s*null')
_SOURCE = re.compile(rb'"source"\s*:\s*\{([^{}]*)\}')
_NAMES = re.compile(rb'"(db|schema|table|connector)"\s*:\s*"([^"\\]*)"')
_NAME_KEYS = (b"db", b"schema", b"table", b"connector")


def _key(tx_id: str, source: Any) -> str:
    if isinstance(source, dict) and source.get("connector") == "postgresql":
        return _postgres_xid(tx_id) or tx_id
    return tx_id


_PG_ID = re.compile(r"([0-9]+):[0-9]+")


def _postgres_xid(tx_id: str) -> str | None:
    """The PostgreSQL transaction id of a Debezium PostgreSQL transaction id: ``<txId>:<lsn>``, where the LSN
    is each event's (DBZ-5329: measured with 3.4.3.Final, every event of one transaction and its END carry
    another one), so only the ``txId`` tells the events of a transaction."""
    m = _PG_ID.fullmatch(tx_id)
    return None if m is None else m.group(1)


def transaction_end(payload: bytes) -> tuple[str, dict[str, int]] | None:
    """(transaction id, events per data collection) of an END event of the transaction topic; ``None`` for
    a BEGIN event or anything else."""
    try:
        doc = json.loads(value_of(payload) or b"null")
    except ValueError:
        return None
    if isinstance(doc, dict) and "status" not in doc and isinstance(doc.get("payload"), dict):
        doc = doc["payload"]  # converter schemas.enable=true
    if not isinstance(doc, dict) or doc.get("status") != "END" or not isinstance(doc.get("id"), str):
        return None
    counts: dict[str, int] = {}
    for dc in doc.get("data_collections") or []:
        if isinstance(dc, dict) and isinstance(dc.get("data_collection"), str):
            counts[dc["data_collection"]] = int(dc.get("event_count") or 0)
    return doc["id"], counts


def _matches(collection: str, data_collection: str) -> bool:
    """Whether an END's data collection (``schema.table`` for PostgreSQL, ``db.table`` for MySQL) names the
    collection of an envelope's source (``db.schema.table``)."""
    mine, theirs = collection.split("."), data_collection.split(".")
    return mine[-len(theirs):] == theirs


class TransactionLog:
    """The transaction topic's END events and the transactions of the data messages indexed so far. The
    backend feeds it: each END event read (:meth:`read_end`, in the topic's order), each data message indexed
    (:meth:`saw`)."""

    def __init__(self) -> None:
        self.order: dict[str, int] = {}  # transaction key -> commit order (position of its END)
        self._keys: list[tuple[str, ...]] = []  # by order: the keys data events of the transaction may carry
        self._ends: list[dict[str, int] | None] = []  # by order: events per data collection; None once complete
        self._seen: dict[str, Counter[tuple[str, str]]] = {}  # key -> (topic, collection) -> events indexed
        self.frontier = -1  # every transaction of order <= frontier is complete
        self._waiting: str | None = None

    def read_end(self, data: bytes) -> None:
        """A message of the transaction topic (BEGIN events and anything else are passed over)."""
        end = transaction_end(data)
        if end is not None:
            # Both keys a data event may carry (the END does not say which connector wrote it); a later END
            # of the same key (a PostgreSQL txId after wraparound) is the one events from now on belong to.
            key, xid = end[0], _postgres_xid(end[0])
            self.order[key] = len(self._ends)
            if xid is not None:
                self.order[xid] = len(self._ends)
            self._keys.append((key,) if xid is None else (key, xid))
            self._ends.append(end[1])

    def saw(self, topic: str, data: bytes) -> str | None:
        """Count a data message just indexed; returns its transaction key (``None``: outside any). ``topic``
        names what the backend reads again as one piece (:meth:`forget`): a Pulsar topic, a Kafka partition."""
        found = transaction_of(data)
        if found is None:
            return None
        tx, collection = found
        if self.order.get(tx, INF) > self.frontier:
            self._seen.setdefault(tx, Counter())[(topic, collection)] += 1
        return tx

    def forget(self, topic: str) -> None:
        """The counts of a topic (see :meth:`saw`) whose index is read again from its start (they would be
        counted twice)."""
        for counts in self._seen.values():
            for k in [k for k in counts if k[0] == topic]:
                del counts[k]

    def advance(self) -> int:
        """Move the frontier past the transactions now complete; returns it."""
        while self.frontier + 1 < len(self._ends):
            nxt = self.frontier + 1
            keys = self._keys[nxt]
            if not self._complete(keys, nxt):
                break
            self.frontier = nxt
            self._ends[nxt] = None
            for key in keys:
                self._seen.pop(key, None)
        return self.frontier

    def _complete(self, keys: tuple[str, ...], order: int) -> bool:
        expected = self._ends[order]
        if expected is None:
            return True
        seen: Counter[str] = Counter()
        for key in keys:
            for (_, collection), n in self._seen.get(key, Counter()).items():
                seen[collection] += n
        for data_collection, count in expected.items():
            mine = [c for c in seen if _matches(c, data_collection)]
            have = sum(seen[c] for c in mine)
            if mine and have < count:
                if self._waiting != keys[0]:
                    self._waiting = keys[0]
                    log.info("transaction %s: %d of its %d %s events indexed; batches end before it until all "
                             "are", keys[0], have, count, data_collection)
                return False
        return True


class Messages(ABC):
    """A partition's indexed messages as the cut sees them: each one's transaction order, and where the
    messages inside a transaction are (a snapshot's millions of reads outside any are skipped, not scanned)."""

    n: int

    @abstractmethod
    def order(self, k: int) -> float | None:
        """The order of message ``k``'s transaction (``inf``: its END is not read yet); ``None`` outside any."""

    @abstractmethod
    def next_tx(self, x: int) -> int:
        """The first message at or after ``x`` inside a transaction, or ``n``."""

    @abstractmethod
    def prev_tx(self, x: int) -> int:
        """The last message before ``x`` inside a transaction, or -1."""


class OrderList(Messages):
    """Messages given as a list of orders (``None`` outside any transaction)."""

    def __init__(self, orders: Sequence[float | None]) -> None:
        self.orders, self.n = orders, len(orders)

    def order(self, k: int) -> float | None:
        return self.orders[k]

    def next_tx(self, x: int) -> int:
        return next((k for k in range(x, self.n) if self.orders[k] is not None), self.n)

    def prev_tx(self, x: int) -> int:
        return next((k for k in range(x - 1, -1, -1) if self.orders[k] is not None), -1)


class Indexed(Protocol):
    """A channel's index as a backend keeps it: the positions of its data messages in order (``keys``), each
    one's transaction key or ``None`` (``marks``), and the positions whose mark is not ``None`` (``marked``)."""

    @property
    def keys(self) -> Sequence[Any]: ...

    @property
    def marks(self) -> Sequence[Any]: ...

    @property
    def marked(self) -> Sequence[Any]: ...


class IndexedMessages(Messages):
    """A channel of a backend's index (:class:`Indexed`: Pulsar's message ids, Kafka's offsets); ``marked``, the
    positions of the messages inside a transaction, finds the next and previous ones by bisection."""

    def __init__(self, ids: Indexed, orders: Mapping[str, int]) -> None:
        self.keys, self.marks, self.marked, self.orders = ids.keys, ids.marks, ids.marked, orders
        self.n = len(self.keys)

    def order(self, k: int) -> float | None:
        tx = self.marks[k]
        return None if tx is None else self.orders.get(tx, INF)

    def next_tx(self, x: int) -> int:
        if x >= self.n:
            return self.n
        t = bisect.bisect_left(self.marked, self.keys[x])
        return self.n if t == len(self.marked) else bisect.bisect_left(self.keys, self.marked[t])

    def prev_tx(self, x: int) -> int:
        if x <= 0:
            return -1
        t = bisect.bisect_right(self.marked, self.keys[x - 1]) - 1
        return -1 if t < 0 else bisect.bisect_left(self.keys, self.marked[t])


def _last_tx(m: Messages, i: int, j: int) -> float | None:
    """The order of the last message of ``[i, j)`` inside a transaction."""
    k = m.prev_tx(j)
    return m.order(k) if k >= i else None


def _first_tx(m: Messages, frm: int, above: float = -INF) -> tuple[int, float]:
    """(index, order) of the first message at or after ``frm`` inside a transaction of order > ``above``;
    ``(n, inf)`` when none is indexed."""
    k = m.next_tx(frm)
    while k < m.n:
        o = m.order(k)
        if o is not None and o > above:
            return k, o
        k = m.next_tx(k + 1)
    return m.n, INF


def transaction_cut(m: Messages, i: int, j: int, limit: int, window: tuple[float, float]) -> tuple[int, tuple[float, float]]:
    """Where a channel's range ``[i, ...)`` of its indexed messages ends, at a transaction boundary
    consistent with the channels planned before it in the round; returns (end index, the narrowed window).

    ``j`` is where the record budget ends it, ``limit`` what it may not pass (``j <= limit``); ``window``
    ``(lo, hi)``: the orders *K* that the round's cut may still take (``lo``: transactions other channels
    took, which this one must take too; ``hi``: the frontier, or what other channels left out). The channel
    takes its messages of the transactions up to *K*: the one the budget ends in (forward), or ``hi`` when
    the budget does not bind; within ``[lo, hi]`` and before the first transaction at ``limit``."""
    lo, hi = window
    top = min(hi, _first_tx(m, limit)[1] - 1)
    if top < lo:
        log.warning("a bound (endingOffsets, or a truncate) falls inside a transaction another channel takes "
                    "whole: that transaction is split across batches")
    budget_ends_in = None if j >= m.n else _last_tx(m, i, j)
    target = hi if j >= m.n else lo if budget_ends_in is None else budget_ends_in
    k = min(max(target, lo), top)
    p, _ = _first_tx(m, i, k)  # the first message this channel leaves out
    # messages outside transactions right before it: the end may fall anywhere among them
    q = max(i, m.prev_tx(p) + 1)
    end = min(max(j, q), p, limit)
    taken = _last_tx(m, i, end)
    _, left = _first_tx(m, end)
    return end, (lo if taken is None else max(lo, taken), min(hi, left - 1))
