/* Decode: Example / SequenceExample records into Arrow-layout column buffers. */
#ifndef RT_DECODE_H
#define RT_DECODE_H

#include "common.h"
#include "table.h"
#include "tensor.h"
#include "wire.h"

/* One schema column. Buffers follow Arrow's layouts: a validity bitmap, int32 row offsets (list
 * and sequence shapes), int32 step offsets (sequence), values (int64, float32, or for bytes the
 * int32 offsets into data). */
typedef struct {
    int kind, shape, section;
    int64_t fixed_n;
    rt_tensor tensor; /* a tensor column (tensor.dtype set): bytes features, each one TensorProto, read
                       * into fixed_n values of tensor.esize bytes (rt_decode_set_tensor) */
    Buf valid, rowoff, inner, vals, data;
    int64_t nrows, nulls, nvals, ninner;
    int64_t row_vals, row_inner, row_data; /* where the current record's values begin */
    int64_t seen;                          /* the last record that held this feature */
} Col;

typedef struct {
    Col *cols;
    int ncols, cap;
    rt_table names; /* names.keys[i]: cols[i]'s name */
    int shared_names; /* names belongs to the Cols this one started from (rt_decode_start) */
    int64_t nrecords;
} Cols;

static inline size_t elem_size(int kind) { return kind == K_INT64 ? 8 : kind == K_FLOAT ? 4 : 0; }
/* Whether a column's values are bytes (offsets and data); a tensor column reads bytes features
 * but stores fixed-width values. */
static inline int col_bytes(const Col *c) { return c->kind == K_BYTES && !c->tensor.dtype; }
static inline size_t col_esize(const Col *c) { return c->tensor.dtype ? (size_t)c->tensor.esize : elem_size(c->kind); }

/* Room for ncols columns; RT_OK or RT_OUT_OF_MEMORY. Free with rt_decode_free whatever it returns. */
RT_API rt_status rt_decode_init(Cols *cs, int ncols);
/* Adds the next column (its name borrowed until rt_decode_free): RT_OK, RT_BAD_SPEC for a spec
 * decode cannot honour (nothing added), or RT_OUT_OF_MEMORY. */
RT_API rt_status rt_decode_add_column(Cols *cs, const uint8_t *name, size_t name_len, int kind, int shape, int64_t fixed_n,
                               int section);
/* Makes column ci (added as bytes, S_FIXED, fixed_n values) a tensor column: each of its features
 * one TensorProto of this DT_* dtype and shape dims[0, rank), whose values it stores (bfloat16 bits
 * widened to float32 when widen). RT_OK, or RT_BAD_SPEC when the spec is inconsistent (the dims'
 * product is not fixed_n, an unknown dtype, widen but not bfloat16), the column left as it was. */
RT_API rt_status rt_decode_set_tensor(Cols *cs, int ci, int dtype, int rank, const int64_t *dims, int widen);
/* Decodes the records rs into cs's columns: RT_OK, or the failure's status with e saying where. */
RT_API rt_status rt_decode_records(Cols *cs, int rtype, const rt_records *rs, rt_error *e);
/* A call's columns from a decoder's, built once with rt_decode_init and rt_decode_add_column: the
 * same specs, and the same name table read-only (its lookup predictions are this call's own), so
 * that calls on several threads share one decoder. RT_OK or RT_OUT_OF_MEMORY; free cs with
 * rt_decode_free whatever it returns, and before tmpl. */
RT_API rt_status rt_decode_start(Cols *cs, const Cols *tmpl);
RT_API void rt_decode_free(Cols *cs);

/* ByteArray records: their raw payloads as one binary column (int32 offsets, data). RT_OK;
 * RT_BAD_SPAN (e->record: the record), RT_RECORDS_TOO_LARGE or RT_OUT_OF_MEMORY. */
RT_API rt_status rt_byte_array(const rt_records *rs, Buf *offsets, Buf *data, rt_error *e);

#endif
