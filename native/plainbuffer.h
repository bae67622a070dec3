/* What the two halves of cdc.backends.tablestore._plainbuffer share: plainbuffer.c reads PlainBuffer rows
 * (the grammar, checks and errors of the Python reader), layout.c lays stream records out as Arrow columns
 * on that reader. */
#ifndef CDC_PLAINBUFFER_H
#define CDC_PLAINBUFFER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

typedef struct {
    const uint8_t *buf;
    Py_ssize_t end;
    Py_ssize_t pos;
} Stream;

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

/* One decoded row: its cells (names and values owned until row_clear) and its trailer. */
typedef struct {
    CellOut *pk, *cells;
    Py_ssize_t npk, ncells, cap_pk, cap_cells;
    int delete_marker, have_seq;
    int32_t epoch, row_index;
    int64_t seq_ts;
} RowOut;

/* the module's PlainBufferError (set by configure()) */
extern PyObject *pb_ErrorType;

void pb_cell_clear(CellOut *c);
void pb_row_clear(RowOut *r);
void pb_row_free(RowOut *r);
/* 0, or -1 with PlainBufferError set; the stream is then past the header */
int pb_read_header(Stream *s);
/* 1 = a row follows (its TAG_ROW_PK consumed), 0 = the end or trailing padding, -1 = an error */
int pb_row_follows(Stream *s, Py_ssize_t index);
/* one row whose TAG_ROW_PK was consumed, into r (cleared by the caller): 0, or -1 with an error set */
int pb_read_row(Stream *s, Py_ssize_t index, RowOut *r);
PyObject *pb_layout_columns(PyObject *self, PyObject *args);

#endif
