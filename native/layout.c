/* layout_columns of cdc.backends.tablestore._plainbuffer: see the comment below. */
#include "plainbuffer.h"

/* The fast path of records.RecordLayout.to_batch: stream records straight into one Python list per
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
    if (pb_read_header(&st) < 0 || pb_row_follows(&st, 0) != 1 || pb_read_row(&st, 0, r) < 0 || pb_row_follows(&st, 1) != 0) {
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(pb_ErrorType)) return -1;
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

PyObject *pb_layout_columns(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *payloads, *actions, *channel, *catalog, *codes, *strs_tuple, *value_names;
    int base, partial, ots;
    long long first_n;
    Py_ssize_t nkeys;
    if (!PyArg_ParseTuple(args, "O!O!pLUO!SnppO!O!", &PyList_Type, &payloads, &PyList_Type, &actions, &base,
                          &first_n, &channel, &PyDict_Type, &catalog, &codes, &nkeys, &partial, &ots,
                          &PyTuple_Type, &strs_tuple, &PyTuple_Type, &value_names))
        return NULL;
    if (pb_ErrorType == NULL) {
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
        pb_row_clear(&r);
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
    pb_row_free(&r);
    PyMem_Free(slots);
    PyMem_Free(cols);
    Py_XDECREF(out);
    return result;
}

