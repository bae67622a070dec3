/* The compiled PlainBuffer reader: cdc.backends.tablestore._plainbuffer.
 *
 * A line-for-line port of the pure-Python reader in cdc/backends/tablestore/plainbuffer.py (_decode,
 * _read_cell, _read_extension): same grammar, same checks, same error messages, same result objects
 * (the module's Row/Cell/SequenceInfo NamedTuples and Special members, handed over by configure()).
 * The Python reader stays the fallback and the reference: the PlainBuffer tests and the fuzz test run
 * against both. Why C at all: the tunnel client spent ~70% of its time in the Python reader.
 *
 * Every read is bounds-checked against the buffer's end; a read past it is the Python reader's
 * IndexError/struct.error, i.e. "malformed PlainBuffer: truncated".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#define HEADER 0x75
#define TAG_ROW_PK 0x01
#define TAG_ROW_DATA 0x02
#define TAG_CELL 0x03
#define TAG_CELL_NAME 0x04
#define TAG_CELL_VALUE 0x05
#define TAG_CELL_TYPE 0x06
#define TAG_CELL_TIMESTAMP 0x07
#define TAG_DELETE_ROW_MARKER 0x08
#define TAG_ROW_CHECKSUM 0x09
#define TAG_CELL_CHECKSUM 0x0A
#define TAG_EXTENSION 0x0B
#define TAG_SEQ_INFO 0x0C
#define TAG_SEQ_INFO_EPOCH 0x0D
#define TAG_SEQ_INFO_TS 0x0E
#define TAG_SEQ_INFO_ROW_INDEX 0x0F
#define VT_INTEGER 0x0
#define VT_DOUBLE 0x1
#define VT_BOOLEAN 0x2
#define VT_STRING 0x3
#define VT_BLOB 0x7
#define VT_INF_MIN 0x9
#define VT_INF_MAX 0xA
#define VT_AUTO_INCREMENT 0xB
#define SEQ_INFO_SIZE 19
#define NAME_SLOTS 64

static PyObject *RowType, *CellType, *SeqType, *ErrorType, *InfMin, *InfMax, *AutoIncrement;
static uint8_t crc_table[256];

/* Rows of one table repeat their column names at the same cell index: a slot per index keeps the last
 * name's bytes and str, so a repeated name costs one memcmp instead of a UTF-8 decode and a CRC. */
typedef struct {
    char *raw;
    Py_ssize_t size;
    PyObject *name;
    uint8_t crc;
} NameSlot;
static NameSlot name_slots[NAME_SLOTS];

typedef struct {
    const uint8_t *buf;
    Py_ssize_t end;
    Py_ssize_t pos;
} Stream;

static int fail(Stream *s, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    PyOS_vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    PyErr_Format(ErrorType, "malformed PlainBuffer at byte %zd of %zd: %s", s->pos, s->end, message);
    return -1;
}

static int truncated(void) {
    PyErr_SetString(ErrorType, "malformed PlainBuffer: truncated");
    return -1;
}

static inline uint8_t crc_bytes(uint8_t crc, const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) crc = crc_table[crc ^ p[i]];
    return crc;
}

static inline int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4); /* PlainBuffer is little-endian; so are the platforms this builds on (checked at init) */
    return v;
}

static inline int64_t rd_i64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The tag after pos, or 0 at the end (as the Python reader). */
static inline int next_tag(Stream *s) {
    if (s->pos < s->end) return s->buf[s->pos++];
    return 0;
}

static PyObject *new_tuple(PyObject *type, Py_ssize_t n) {
    return ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
}

static PyObject *cell_name(Stream *s, Py_ssize_t index, Py_ssize_t size, uint8_t *crc) {
    const uint8_t *raw = s->buf + s->pos;
    NameSlot *slot = index < NAME_SLOTS ? &name_slots[index] : NULL;
    if (slot && slot->name && slot->size == size && memcmp(slot->raw, raw, (size_t)size) == 0) {
        *crc = slot->crc;
        Py_INCREF(slot->name);
        return slot->name;
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)raw, size, "strict");
    if (name == NULL) {
        PyErr_Clear();
        s->pos += size;
        fail(s, "cell name is not valid UTF-8");
        return NULL;
    }
    *crc = crc_bytes(0, raw, size);
    if (slot) {
        char *copy = PyMem_Malloc(size > 0 ? (size_t)size : 1);
        if (copy != NULL) {
            memcpy(copy, raw, (size_t)size);
            PyMem_Free(slot->raw);
            Py_XDECREF(slot->name);
            slot->raw = copy;
            slot->size = size;
            slot->crc = *crc;
            Py_INCREF(name);
            slot->name = name;
        }
    }
    return name;
}

typedef struct {
    PyObject *name;
    PyObject *value; /* NULL = none */
    int cell_type;   /* -1 = none */
    int has_timestamp;
    int64_t timestamp;
    int is_float, is_special;
    int vtype; /* -1 = no value */
    uint8_t crc;
} CellOut;

static void cell_clear(CellOut *c) {
    Py_CLEAR(c->name);
    Py_CLEAR(c->value);
}

/* One cell whose TAG_CELL was consumed; leaves the next tag in *tag. Returns -1 with an error set. */
static int read_cell(Stream *s, Py_ssize_t index, CellOut *c, int *tag) {
    memset(c, 0, sizeof *c);
    c->cell_type = -1;
    c->vtype = -1;
    if (s->pos >= s->end || s->buf[s->pos] != TAG_CELL_NAME)
        return fail(s, "expected a cell name tag, got 0x%02x", s->pos < s->end ? s->buf[s->pos] : 0);
    if (s->pos + 5 > s->end) return truncated();
    int32_t size = rd_i32(s->buf + s->pos + 1);
    s->pos += 5;
    if (size < 0 || s->pos + size > s->end) return fail(s, "truncated (cell name needs %d bytes)", size);
    uint8_t crc = 0;
    c->name = cell_name(s, index, size, &crc);
    if (c->name == NULL) return -1;
    s->pos += size;
    const char *name_utf8 = PyUnicode_AsUTF8(c->name);
    if (name_utf8 == NULL) return -1;
    int t = next_tag(s);
    if (t == TAG_CELL_VALUE) {
        if (s->pos + 5 > s->end) return truncated();
        int32_t length = rd_i32(s->buf + s->pos);
        Py_ssize_t start = s->pos + 4;
        int vtype = s->buf[start];
        c->vtype = vtype;
        s->pos = start + 1;
        crc = crc_table[crc ^ vtype];
        if (vtype == VT_INTEGER || vtype == VT_DOUBLE) {
            if (s->pos + 8 > s->end) return fail(s, "truncated (value of cell '%s')", name_utf8);
            if (vtype == VT_INTEGER) {
                c->value = PyLong_FromLongLong(rd_i64(s->buf + s->pos));
            } else {
                double d;
                memcpy(&d, s->buf + s->pos, 8);
                c->value = PyFloat_FromDouble(d);
                c->is_float = 1;
            }
            if (c->value == NULL) return -1;
            crc = crc_bytes(crc, s->buf + s->pos, 8);
            s->pos += 8;
        } else if (vtype == VT_STRING || vtype == VT_BLOB) {
            if (s->pos + 4 > s->end) return truncated();
            int32_t vsize = rd_i32(s->buf + s->pos);
            Py_ssize_t stop = s->pos + 4 + (Py_ssize_t)vsize;
            if (vsize < 0 || stop > s->end)
                return fail(s, "truncated (value of cell '%s' needs %d bytes)", name_utf8, vsize);
            crc = crc_bytes(crc, s->buf + s->pos, stop - s->pos);
            const char *data = (const char *)s->buf + s->pos + 4;
            s->pos = stop;
            if (vtype == VT_BLOB) {
                c->value = PyBytes_FromStringAndSize(data, vsize);
                if (c->value == NULL) return -1;
            } else {
                c->value = PyUnicode_DecodeUTF8(data, vsize, "strict");
                if (c->value == NULL) {
                    PyErr_Clear();
                    return fail(s, "string value of cell '%s' is not valid UTF-8", name_utf8);
                }
            }
        } else if (vtype == VT_BOOLEAN) {
            if (s->pos >= s->end) return truncated();
            int flag = s->buf[s->pos++];
            c->value = PyBool_FromLong(flag != 0);
            crc = crc_table[crc ^ flag];
        } else if (vtype == VT_INF_MIN || vtype == VT_INF_MAX || vtype == VT_AUTO_INCREMENT) {
            c->value = vtype == VT_INF_MIN ? InfMin : vtype == VT_INF_MAX ? InfMax : AutoIncrement;
            Py_INCREF(c->value);
            c->is_special = 1;
        } else {
            return fail(s, "cell '%s' has unsupported value type 0x%02x", name_utf8, vtype);
        }
        if (s->pos - start != length)
            return fail(s, "cell '%s' value length prefix %d does not match its %zd bytes", name_utf8, length,
                        s->pos - start);
        t = next_tag(s);
    }
    if (t == TAG_CELL_TYPE) {
        if (s->pos >= s->end) return truncated();
        c->cell_type = s->buf[s->pos++];
        t = next_tag(s);
    }
    if (t == TAG_CELL_TIMESTAMP) {
        if (s->pos + 8 > s->end) return fail(s, "truncated (timestamp of cell '%s')", name_utf8);
        c->timestamp = rd_i64(s->buf + s->pos);
        c->has_timestamp = 1;
        crc = crc_bytes(crc, s->buf + s->pos, 8);
        s->pos += 8;
        t = next_tag(s);
    }
    if (c->cell_type >= 0) crc = crc_table[crc ^ c->cell_type];
    if (t != TAG_CELL_CHECKSUM) return fail(s, "expected the checksum of cell '%s', got tag 0x%02x", name_utf8, t);
    if (s->pos >= s->end) return truncated();
    int stored = s->buf[s->pos++];
    if (stored != crc)
        return fail(s, "checksum mismatch in cell '%s': stored 0x%02x, computed 0x%02x", name_utf8, stored, crc);
    c->crc = crc;
    *tag = next_tag(s);
    return 0;
}

static int is_known_tag(int tag) { return tag >= 0x01 && tag <= 0x0F; }

/* One decoded row: its cells (names and values owned until row_clear) and its trailer. */
typedef struct {
    CellOut *pk, *cells;
    Py_ssize_t npk, ncells, cap_pk, cap_cells;
    int delete_marker, have_seq;
    int32_t epoch, row_index;
    int64_t seq_ts;
} RowOut;

static void row_clear(RowOut *r) {
    for (Py_ssize_t i = 0; i < r->npk; i++) cell_clear(&r->pk[i]);
    for (Py_ssize_t i = 0; i < r->ncells; i++) cell_clear(&r->cells[i]);
    r->npk = r->ncells = 0;
    r->delete_marker = r->have_seq = 0;
}

static void row_free(RowOut *r) {
    row_clear(r);
    PyMem_Free(r->pk);
    PyMem_Free(r->cells);
}

static CellOut *row_slot(CellOut **cells, Py_ssize_t *n, Py_ssize_t *cap) {
    if (*n == *cap) {
        Py_ssize_t grown = *cap ? *cap * 2 : 16;
        CellOut *more = PyMem_Realloc(*cells, (size_t)grown * sizeof(CellOut));
        if (more == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        *cells = more;
        *cap = grown;
    }
    return &(*cells)[*n];
}

/* An extension block whose TAG_EXTENSION was consumed; fills the row's sequence info if it has one. */
static int read_extension(Stream *s, RowOut *r, int *tag) {
    if (s->pos + 4 > s->end) return truncated();
    int32_t length = rd_i32(s->buf + s->pos);
    s->pos += 4;
    Py_ssize_t stop = s->pos + (Py_ssize_t)length;
    if (length < 0 || stop > s->end) return fail(s, "extension length %d runs past the end", length);
    while (s->pos < stop) {
        int item = s->buf[s->pos];
        if (s->pos + 5 > s->end) return truncated();
        int32_t size = rd_i32(s->buf + s->pos + 1);
        s->pos += 5;
        if (size < 0 || s->pos + size > stop)
            return fail(s, "extension item 0x%02x length %d runs past the extension", item, size);
        if (item == TAG_SEQ_INFO) {
            if (size != SEQ_INFO_SIZE) return fail(s, "sequence info length %d, expected %d", size, SEQ_INFO_SIZE);
            const uint8_t *p = s->buf + s->pos;
            if (p[0] != TAG_SEQ_INFO_EPOCH || p[5] != TAG_SEQ_INFO_TS || p[14] != TAG_SEQ_INFO_ROW_INDEX)
                return fail(s, "sequence info: unexpected tags");
            r->epoch = rd_i32(p + 1);
            r->seq_ts = rd_i64(p + 6);
            r->row_index = rd_i32(p + 15);
            r->have_seq = 1;
        } else if (is_known_tag(item)) {
            return fail(s, "tag 0x%02x is not an extension", item);
        }
        /* else: an extension this reader does not know: skipped, as the Java SDK does */
        s->pos += size;
    }
    *tag = next_tag(s);
    return 0;
}

/* One row whose TAG_ROW_PK was consumed (the row grammar, shared by decode_rows and layout_columns). */
static int read_row(Stream *s, Py_ssize_t index, RowOut *r) {
    uint8_t row_crc = 0;
    Py_ssize_t ncell = 0;
    int tag = next_tag(s);
    while (tag == TAG_CELL) {
        CellOut *c = row_slot(&r->pk, &r->npk, &r->cap_pk);
        if (c == NULL) return -1;
        if (read_cell(s, ncell++, c, &tag) < 0) {
            cell_clear(c);
            return -1;
        }
        r->npk++;
        if (c->value == NULL || c->cell_type >= 0 || c->has_timestamp || c->is_float)
            return fail(s, "row %zd: primary-key cell '%s' must hold exactly one key value", index,
                        PyUnicode_AsUTF8(c->name));
        row_crc = crc_table[row_crc ^ c->crc];
    }
    if (tag == TAG_ROW_DATA) {
        tag = next_tag(s);
        while (tag == TAG_CELL) {
            CellOut *c = row_slot(&r->cells, &r->ncells, &r->cap_cells);
            if (c == NULL) return -1;
            if (read_cell(s, ncell++, c, &tag) < 0) {
                cell_clear(c);
                return -1;
            }
            r->ncells++;
            if (c->is_special)
                return fail(s, "row %zd: data cell '%s' holds a primary-key placeholder", index,
                            PyUnicode_AsUTF8(c->name));
            row_crc = crc_table[row_crc ^ c->crc];
        }
    }
    r->delete_marker = tag == TAG_DELETE_ROW_MARKER;
    if (r->delete_marker) tag = next_tag(s);
    row_crc = crc_table[row_crc ^ (r->delete_marker ? 1 : 0)];
    if (tag == TAG_EXTENSION && read_extension(s, r, &tag) < 0) return -1;
    if (tag != TAG_ROW_CHECKSUM) return fail(s, "row %zd: expected the row checksum tag, got 0x%02x", index, tag);
    if (s->pos >= s->end) return truncated();
    int stored = s->buf[s->pos++];
    if (stored != row_crc)
        return fail(s, "row %zd: row checksum mismatch: stored 0x%02x, computed 0x%02x", index, stored, row_crc);
    return 0;
}

static PyObject *make_cell(CellOut *c) {
    PyObject *o = new_tuple(CellType, 4);
    if (o == NULL) return NULL;
    PyObject *none = Py_None;
    PyTuple_SET_ITEM(o, 0, c->name);
    c->name = NULL;
    if (c->value) {
        PyTuple_SET_ITEM(o, 1, c->value);
        c->value = NULL;
    } else {
        Py_INCREF(none);
        PyTuple_SET_ITEM(o, 1, none);
    }
    PyObject *ct = c->cell_type >= 0 ? PyLong_FromLong(c->cell_type) : (Py_INCREF(none), none);
    PyObject *ts = c->has_timestamp ? PyLong_FromLongLong(c->timestamp) : (Py_INCREF(none), none);
    PyTuple_SET_ITEM(o, 2, ct);
    PyTuple_SET_ITEM(o, 3, ts);
    if (ct == NULL || ts == NULL) {
        Py_DECREF(o);
        return NULL;
    }
    return o;
}

static PyObject *make_row(RowOut *r) {
    PyObject *pk = PyTuple_New(r->npk), *cells = PyTuple_New(r->ncells), *seq = NULL, *row = NULL;
    if (pk == NULL || cells == NULL) goto error;
    for (Py_ssize_t i = 0; i < r->npk; i++) {
        PyObject *pair = PyTuple_Pack(2, r->pk[i].name, r->pk[i].value);
        if (pair == NULL) goto error;
        PyTuple_SET_ITEM(pk, i, pair);
    }
    for (Py_ssize_t i = 0; i < r->ncells; i++) {
        PyObject *cell = make_cell(&r->cells[i]);
        if (cell == NULL) goto error;
        PyTuple_SET_ITEM(cells, i, cell);
    }
    if (r->have_seq) {
        seq = new_tuple(SeqType, 3);
        if (seq == NULL) goto error;
        PyTuple_SET_ITEM(seq, 0, PyLong_FromLong(r->epoch));
        PyTuple_SET_ITEM(seq, 1, PyLong_FromLongLong(r->seq_ts));
        PyTuple_SET_ITEM(seq, 2, PyLong_FromLong(r->row_index));
        if (PyTuple_GET_ITEM(seq, 0) == NULL || PyTuple_GET_ITEM(seq, 1) == NULL ||
            PyTuple_GET_ITEM(seq, 2) == NULL)
            goto error;
    } else {
        Py_INCREF(Py_None);
        seq = Py_None;
    }
    row = new_tuple(RowType, 4);
    if (row == NULL) goto error;
    PyObject *marker = r->delete_marker ? Py_True : Py_False;
    Py_INCREF(marker);
    PyTuple_SET_ITEM(row, 0, pk);
    PyTuple_SET_ITEM(row, 1, cells);
    PyTuple_SET_ITEM(row, 2, marker);
    PyTuple_SET_ITEM(row, 3, seq);
    return row;
error:
    Py_XDECREF(pk);
    Py_XDECREF(cells);
    Py_XDECREF(seq);
    return NULL;
}

static int all_zero(const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static int read_header(Stream *s) {
    if (s->end < 4) return truncated();
    int32_t header = rd_i32(s->buf);
    if (header != HEADER) return fail(s, "header is 0x%x, expected 0x%x", (unsigned)header, HEADER);
    s->pos = 4;
    return 0;
}

/* The tag that starts row `index`: 1 = a row follows, 0 = the end (or Node.js SDK padding after the last
 * row: see the Python reader), -1 = an error. */
static int row_follows(Stream *s, Py_ssize_t index) {
    if (s->pos >= s->end) return 0;
    int tag = s->buf[s->pos++];
    if (tag == TAG_ROW_PK) return 1;
    if (tag == 0 && index > 0 && all_zero(s->buf + s->pos, s->end - s->pos)) return 0;
    return fail(s, "row %zd: expected the primary-key tag, got 0x%02x", index, tag);
}

static PyObject *decode(PyObject *self, PyObject *arg) {
    (void)self;
    if (RowType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_plainbuffer.configure() was not called");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Stream st = {(const uint8_t *)view.buf, view.len, 0};
    RowOut r = {0};
    PyObject *rows = PyList_New(0);
    if (rows == NULL || read_header(&st) < 0) goto error;
    for (;;) {
        Py_ssize_t index = PyList_GET_SIZE(rows);
        int more = row_follows(&st, index);
        if (more < 0) goto error;
        if (more == 0) break;
        if (read_row(&st, index, &r) < 0) goto error;
        PyObject *row = make_row(&r);
        row_clear(&r);
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            goto error;
        }
        Py_DECREF(row);
    }
    row_free(&r);
    PyBuffer_Release(&view);
    return rows;
error:
    row_free(&r);
    Py_XDECREF(rows);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------ layout_columns
 * The fast path of records.RecordLayout.to_batch: stream records straight into one Python list per
 * Arrow column, without Row/Cell objects and the per-record Python of RecordLayout._row (which was ~80%
 * of the decode + layout time once the reader was compiled). Same rules as _row; a record this path does
 * not cover exactly (malformed, a value of the wrong type, an unknown action or cell type, an overflow)
 * makes it return None, and the caller lays the whole batch out by the Python path, which raises or
 * quarantines with its own messages. */

enum { ACCEPT_INT, ACCEPT_FLOAT, ACCEPT_BOOL, ACCEPT_STR, ACCEPT_BYTES };
enum { S_INSERT, S_UPDATE, S_DELETE, S_SNAPSHOT, S_PUT, S_REC_UPDATE, S_REC_DELETE, S_DEL_ONE, S_DEL_ALL, S_N };
#define ACTION_PUT 1
#define ACTION_UPDATE 2
#define ACTION_DELETE 3
#define DELETE_ALL_VERSION 0x01
#define DELETE_ONE_VERSION 0x03

static int accepts(int code, int vtype) {
    switch (code) {
    case ACCEPT_INT: return vtype == VT_INTEGER;
    case ACCEPT_FLOAT: return vtype == VT_DOUBLE || vtype == VT_INTEGER;
    case ACCEPT_BOOL: return vtype == VT_BOOLEAN;
    case ACCEPT_STR: return vtype == VT_STRING;
    default: return vtype == VT_BLOB;
    }
}

typedef struct {
    PyObject *value; /* borrowed from the RowOut; NULL = null */
    int vtype;
    PyObject *kind; /* borrowed; NULL = not mentioned */
} Slot;

/* 1 = the record is laid out in row i of the columns, 0 = not this path's (no error set), -1 = error. */
static int lay_record(PyObject *payload, long action, int base, long long n, Py_ssize_t i, PyObject **cols,
                      PyObject *channel, PyObject *catalog, const char *codes, Py_ssize_t nkeys, Py_ssize_t nvals,
                      int partial, int ots, PyObject **strs, PyObject *value_names, RowOut *r, Slot *slots) {
    if (!PyBytes_CheckExact(payload)) return 0;
    Stream st = {(const uint8_t *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload), 0};
    if (read_header(&st) < 0 || row_follows(&st, 0) != 1 || read_row(&st, 0, r) < 0 || row_follows(&st, 1) != 0) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(ErrorType)) return -1;
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t ncat = nkeys + nvals;
    for (Py_ssize_t k = 0; k < ncat; k++) slots[k] = (Slot){NULL, -1, NULL};
    for (Py_ssize_t k = 0; k < r->npk; k++) {
        PyObject *index = PyDict_GetItemWithError(catalog, r->pk[k].name);
        if (index == NULL) {
            if (PyErr_Occurred()) return -1;
            continue;
        }
        Py_ssize_t j = PyLong_AsSsize_t(index);
        if (j >= 0 && j < nkeys) slots[j] = (Slot){r->pk[k].value, r->pk[k].vtype, NULL};
    }
    for (Py_ssize_t k = 0; k < nkeys; k++)
        if (slots[k].value == NULL || !accepts(codes[k], slots[k].vtype)) return 0;
    int delete_row = !base && action == ACTION_DELETE;
    int64_t max_ts = 0;
    int have_ts = 0;
    for (Py_ssize_t k = 0; k < r->ncells; k++) {
        CellOut *c = &r->cells[k];
        if (c->has_timestamp && (!have_ts || c->timestamp > max_ts)) {
            max_ts = c->timestamp;
            have_ts = 1;
        }
        if (delete_row) continue;
        PyObject *index = PyDict_GetItemWithError(catalog, c->name);
        if (index == NULL) {
            if (PyErr_Occurred()) return -1;
            continue; /* not in the catalog: not read */
        }
        Py_ssize_t j = PyLong_AsSsize_t(index);
        if (j < nkeys || j >= ncat) continue; /* a key named again as a data cell: _row outputs no such cell */
        Slot *sl = &slots[j];
        if (c->cell_type < 0) {
            *sl = (Slot){c->value, c->vtype, strs[S_PUT]};
        } else if (c->cell_type == DELETE_ONE_VERSION || c->cell_type == DELETE_ALL_VERSION) {
            *sl = (Slot){NULL, -1, strs[c->cell_type == DELETE_ONE_VERSION ? S_DEL_ONE : S_DEL_ALL]};
        } else {
            return 0;
        }
    }
    for (Py_ssize_t k = nkeys; k < ncat; k++)
        if (slots[k].value != NULL && slots[k].value != Py_None && !accepts(codes[k], slots[k].vtype)) return 0;
    PyObject *op, *record_type;
    long long seq, commit_us;
    PyObject *record_ts;
    if (base) {
        op = strs[S_SNAPSHOT];
        record_type = strs[S_PUT];
        seq = n;
        if (have_ts && __builtin_mul_overflow(max_ts, (int64_t)1000, &max_ts)) return 0;
        commit_us = have_ts ? max_ts : 0;
        Py_INCREF(Py_None);
        record_ts = Py_None;
    } else {
        if (action < ACTION_PUT || action > ACTION_DELETE || !r->have_seq) return 0;
        if (r->row_index < 0 || r->row_index >= 1024) return 0;
        int64_t shifted;
        if (__builtin_mul_overflow(r->seq_ts, (int64_t)1024, &shifted) ||
            __builtin_add_overflow(shifted, (int64_t)r->row_index, &shifted))
            return 0;
        op = strs[S_INSERT + (action - ACTION_PUT)];
        record_type = strs[S_PUT + (action - ACTION_PUT)];
        seq = shifted;
        commit_us = r->seq_ts;
        record_ts = PyLong_FromLongLong(r->seq_ts);
        if (record_ts == NULL) return -1;
    }
    Py_ssize_t col = 0;
    PyObject *item;
#define PUT(obj)                                                                                               \
    do {                                                                                                       \
        item = (obj);                                                                                          \
        if (item == NULL) goto error;                                                                          \
        PyList_SET_ITEM(cols[col++], i, item);                                                                 \
    } while (0)
#define PUT_BORROWED(obj)                                                                                      \
    do {                                                                                                       \
        item = (obj) ? (obj) : Py_None;                                                                        \
        Py_INCREF(item);                                                                                       \
        PyList_SET_ITEM(cols[col++], i, item);                                                                 \
    } while (0)
    PUT_BORROWED(op);
    PUT(PyLong_FromLongLong(seq));
    PUT(PyLong_FromLongLong(commit_us));
    PUT_BORROWED(channel);
    PUT(PyLong_FromLongLong(n));
    if (partial) {
        PyObject *unchanged = NULL;
        if (!base && action == ACTION_UPDATE) {
            for (Py_ssize_t k = 0; k < nvals; k++) {
                if (slots[nkeys + k].kind != NULL) continue;
                if (unchanged == NULL && (unchanged = PyList_New(0)) == NULL) goto error;
                if (PyList_Append(unchanged, PyTuple_GET_ITEM(value_names, k)) < 0) {
                    Py_DECREF(unchanged);
                    goto error;
                }
            }
        }
        if (unchanged != NULL) PUT(unchanged);
        else PUT_BORROWED(NULL);
    }
    for (Py_ssize_t k = 0; k < ncat; k++) PUT_BORROWED(slots[k].value);
    if (ots) {
        PUT_BORROWED(record_type);
        PUT(record_ts);
        record_ts = NULL;
        for (Py_ssize_t k = nkeys; k < ncat; k++) PUT_BORROWED(slots[k].kind);
    }
#undef PUT
#undef PUT_BORROWED
    Py_XDECREF(record_ts);
    return 1;
error:
    Py_XDECREF(record_ts);
    return -1;
}

static PyObject *layout_columns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *payloads, *actions, *channel, *catalog, *codes, *strs_tuple, *value_names;
    int base, partial, ots;
    long long first_n;
    Py_ssize_t nkeys;
    if (!PyArg_ParseTuple(args, "O!O!pLUO!SnppO!O!", &PyList_Type, &payloads, &PyList_Type, &actions, &base,
                          &first_n, &channel, &PyDict_Type, &catalog, &codes, &nkeys, &partial, &ots,
                          &PyTuple_Type, &strs_tuple, &PyTuple_Type, &value_names))
        return NULL;
    if (ErrorType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_plainbuffer.configure() was not called");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(payloads), nvals = PyTuple_GET_SIZE(value_names);
    Py_ssize_t ncat = nkeys + nvals;
    if (PyList_GET_SIZE(actions) != n || PyTuple_GET_SIZE(strs_tuple) != S_N || PyBytes_GET_SIZE(codes) != ncat ||
        nkeys < 0) {
        PyErr_SetString(PyExc_ValueError, "layout_columns: inconsistent arguments");
        return NULL;
    }
    PyObject *strs[S_N];
    for (int k = 0; k < S_N; k++) strs[k] = PyTuple_GET_ITEM(strs_tuple, k);
    Py_ssize_t ncols = 5 + (partial ? 1 : 0) + ncat + (ots ? 2 + nvals : 0);
    PyObject *out = PyList_New(ncols), *result = NULL;
    PyObject **cols = PyMem_Calloc((size_t)ncols, sizeof(PyObject *));
    Slot *slots = PyMem_Calloc((size_t)(ncat > 0 ? ncat : 1), sizeof(Slot));
    RowOut r = {0};
    if (out == NULL || cols == NULL || slots == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t c = 0; c < ncols; c++) {
        /* items start NULL, which a list given up on half-built frees safely */
        cols[c] = PyList_New(n);
        if (cols[c] == NULL) goto done;
        PyList_SET_ITEM(out, c, cols[c]);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long action = PyLong_AsLong(PyList_GET_ITEM(actions, i));
        if (action == -1 && PyErr_Occurred()) goto done;
        int got = lay_record(PyList_GET_ITEM(payloads, i), action, base, first_n + i, i, cols, channel, catalog,
                             PyBytes_AS_STRING(codes), nkeys, nvals, partial, ots, strs, value_names, &r, slots);
        row_clear(&r);
        if (got != 1) {
            if (got == 0) {
                Py_INCREF(Py_None);
                result = Py_None;
            }
            goto done;
        }
    }
    result = out;
    out = NULL;
done:
    row_free(&r);
    PyMem_Free(slots);
    PyMem_Free(cols);
    Py_XDECREF(out);
    return result;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *row, *cell, *seq, *error, *inf_min, *inf_max, *auto_increment;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &row, &cell, &seq, &error, &inf_min, &inf_max, &auto_increment))
        return NULL;
    PyObject *objs[] = {row, cell, seq, error, inf_min, inf_max, auto_increment};
    PyObject **slots[] = {&RowType, &CellType, &SeqType, &ErrorType, &InfMin, &InfMax, &AutoIncrement};
    for (int i = 0; i < 7; i++) {
        Py_INCREF(objs[i]);
        Py_XSETREF(*slots[i], objs[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_rows", decode, METH_O, "Decode every row of a PlainBuffer payload (bytes-like, non-empty)."},
    {"configure", configure, METH_VARARGS,
     "configure(Row, Cell, SequenceInfo, PlainBufferError, INF_MIN, INF_MAX, AUTO_INCREMENT)"},
    {"layout_columns", layout_columns, METH_VARARGS,
     "layout_columns(payloads, actions, base, first_n, channel, catalog, codes, nkeys, partial, ots, strs, "
     "value_names): one list per Arrow column of records.RecordLayout, or None (see the C source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_plainbuffer",
                                    "The compiled PlainBuffer reader (see cdc.backends.tablestore.plainbuffer).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__plainbuffer(void) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "the compiled PlainBuffer reader needs a little-endian machine");
        return NULL;
    }
    for (int i = 0; i < 256; i++) {
        uint8_t x = (uint8_t)i;
        for (int b = 0; b < 8; b++) x = (uint8_t)((x << 1) ^ ((x & 0x80) ? 0x07 : 0));
        crc_table[i] = x;
    }
    return PyModule_Create(&module);
}
