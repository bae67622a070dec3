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
#include "plainbuffer.h" /* first: it includes Python.h, which must precede the standard headers */

#include <stdarg.h>
#include <string.h>

#define NAME_SLOTS 64

static PyObject *RowType, *CellType, *SeqType, *InfMin, *InfMax, *AutoIncrement;
PyObject *pb_ErrorType;
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


/* Python's formatting (%R is repr), so a cell name with a quote, a backslash or a NUL reads exactly as the
   Python reader's {name!r} does: the two readers raise the same text for the same bytes. */
static int fail(Stream *s, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    PyObject *message = PyUnicode_FromFormatV(fmt, args);
    va_end(args);
    if (message == NULL) return -1;
    PyErr_Format(pb_ErrorType, "malformed PlainBuffer at byte %zd of %zd: %U", s->pos, s->end, message);
    Py_DECREF(message);
    return -1;
}

static int truncated(void) {
    PyErr_SetString(pb_ErrorType, "malformed PlainBuffer: truncated");
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


void pb_cell_clear(CellOut *c) {
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
            if (s->pos + 8 > s->end) return fail(s, "truncated (value of cell %R)", c->name);
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
                return fail(s, "truncated (value of cell %R needs %d bytes)", c->name, vsize);
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
                    return fail(s, "string value of cell %R is not valid UTF-8", c->name);
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
            return fail(s, "cell %R has unsupported value type 0x%02x", c->name, vtype);
        }
        if (s->pos - start != length)
            return fail(s, "cell %R value length prefix %d does not match its %zd bytes", c->name, length,
                        s->pos - start);
        t = next_tag(s);
    }
    if (t == TAG_CELL_TYPE) {
        if (s->pos >= s->end) return truncated();
        c->cell_type = s->buf[s->pos++];
        t = next_tag(s);
    }
    if (t == TAG_CELL_TIMESTAMP) {
        if (s->pos + 8 > s->end) return fail(s, "truncated (timestamp of cell %R)", c->name);
        c->timestamp = rd_i64(s->buf + s->pos);
        c->has_timestamp = 1;
        crc = crc_bytes(crc, s->buf + s->pos, 8);
        s->pos += 8;
        t = next_tag(s);
    }
    if (c->cell_type >= 0) crc = crc_table[crc ^ c->cell_type];
    if (t != TAG_CELL_CHECKSUM) return fail(s, "expected the checksum of cell %R, got tag 0x%02x", c->name, t);
    if (s->pos >= s->end) return truncated();
    int stored = s->buf[s->pos++];
    if (stored != crc)
        return fail(s, "checksum mismatch in cell %R: stored 0x%02x, computed 0x%02x", c->name, stored, crc);
    c->crc = crc;
    *tag = next_tag(s);
    return 0;
}

static int is_known_tag(int tag) { return tag >= 0x01 && tag <= 0x0F; }


void pb_row_clear(RowOut *r) {
    for (Py_ssize_t i = 0; i < r->npk; i++) pb_cell_clear(&r->pk[i]);
    for (Py_ssize_t i = 0; i < r->ncells; i++) pb_cell_clear(&r->cells[i]);
    r->npk = r->ncells = 0;
    r->delete_marker = r->have_seq = 0;
}

void pb_row_free(RowOut *r) {
    pb_row_clear(r);
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
int pb_read_row(Stream *s, Py_ssize_t index, RowOut *r) {
    uint8_t row_crc = 0;
    Py_ssize_t ncell = 0;
    int tag = next_tag(s);
    while (tag == TAG_CELL) {
        CellOut *c = row_slot(&r->pk, &r->npk, &r->cap_pk);
        if (c == NULL) return -1;
        if (read_cell(s, ncell++, c, &tag) < 0) {
            pb_cell_clear(c);
            return -1;
        }
        r->npk++;
        if (c->value == NULL || c->cell_type >= 0 || c->has_timestamp || c->is_float)
            return fail(s, "row %zd: primary-key cell %R must hold exactly one key value", index,
                        c->name);
        row_crc = crc_table[row_crc ^ c->crc];
    }
    if (tag == TAG_ROW_DATA) {
        tag = next_tag(s);
        while (tag == TAG_CELL) {
            CellOut *c = row_slot(&r->cells, &r->ncells, &r->cap_cells);
            if (c == NULL) return -1;
            if (read_cell(s, ncell++, c, &tag) < 0) {
                pb_cell_clear(c);
                return -1;
            }
            r->ncells++;
            if (c->is_special)
                return fail(s, "row %zd: data cell %R holds a primary-key placeholder", index,
                            c->name);
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

int pb_read_header(Stream *s) {
    if (s->end < 4) return truncated();
    int32_t header = rd_i32(s->buf);
    if (header != HEADER) return fail(s, "header is 0x%x, expected 0x%x", (unsigned)header, HEADER);
    s->pos = 4;
    return 0;
}

/* The tag that starts row `index`: 1 = a row follows, 0 = the end (or Node.js SDK padding after the last
 * row: see the Python reader), -1 = an error. */
int pb_row_follows(Stream *s, Py_ssize_t index) {
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
    if (rows == NULL || pb_read_header(&st) < 0) goto error;
    for (;;) {
        Py_ssize_t index = PyList_GET_SIZE(rows);
        int more = pb_row_follows(&st, index);
        if (more < 0) goto error;
        if (more == 0) break;
        if (pb_read_row(&st, index, &r) < 0) goto error;
        PyObject *row = make_row(&r);
        pb_row_clear(&r);
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            goto error;
        }
        Py_DECREF(row);
    }
    pb_row_free(&r);
    PyBuffer_Release(&view);
    return rows;
error:
    pb_row_free(&r);
    Py_XDECREF(rows);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *row, *cell, *seq, *error, *inf_min, *inf_max, *auto_increment;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &row, &cell, &seq, &error, &inf_min, &inf_max, &auto_increment))
        return NULL;
    PyObject *objs[] = {row, cell, seq, error, inf_min, inf_max, auto_increment};
    PyObject **slots[] = {&RowType, &CellType, &SeqType, &pb_ErrorType, &InfMin, &InfMax, &AutoIncrement};
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
    {"layout_columns", pb_layout_columns, METH_VARARGS,
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
