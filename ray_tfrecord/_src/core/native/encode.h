/* Encode: Arrow-layout column buffers into framed Example / SequenceExample records. */
#ifndef RT_ENCODE_H
#define RT_ENCODE_H

#include "common.h"

/* One column: its feature name, and the caller's buffers (offsets as int64; values int64, float32,
 * or for bytes int64 offsets into data). Absent buffers have has_* = 0. */
typedef struct {
    const uint8_t *key;
    size_t key_len;
    int kind, shape;
    Mem valid, rowoff, inner, vals, data;
    int has_valid, has_rowoff, has_inner, has_vals, has_data;
    int64_t valid_off;
    int64_t nrowoff, ninner, nvals, ndata; /* element counts of the buffers (rt_encode_prepare) */
} ECol;

static inline int ecol_valid(const ECol *c, int64_t i) {
    if (!c->has_valid) return 1;
    int64_t b = c->valid_off + i;
    return (((const uint8_t *)c->valid.buf)[b / 8] >> (b % 8)) & 1;
}

/* The span of value elements (or, for sequences, of steps) that row i owns. */
static inline void row_span(const ECol *c, int64_t i, int64_t *a, int64_t *b) {
    if (c->shape == S_SCALAR) {
        *a = i;
        *b = i + 1;
    } else {
        const int64_t *r = c->rowoff.buf;
        *a = r[i];
        *b = r[i + 1];
    }
}

/* Checks a column's spec against the record type and derives the element counts of its buffers:
 * RT_OK or RT_BAD_SPEC. */
RT_API rt_status rt_encode_prepare(ECol *c, int rtype, int64_t ncols);
/* Checks every prepared column's buffers, then encodes nrows records into out and their start
 * offsets (int64) into offs: RT_OK, or the failure's status, in e too, with e->col naming the
 * inconsistent column (-1 for a failure of the whole call: RT_OUT_OF_MEMORY, RT_SIZE_MISMATCH). */
RT_API rt_status rt_encode(const ECol *cols, int ncols, int rtype, int64_t nrows, Buf *out, Buf *offs, rt_error *e);

#endif
