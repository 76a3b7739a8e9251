/*
 * Serialized tensors: a TensorProto (tensorflow/core/framework/tensor.proto), as
 * tf.io.serialize_tensor writes it into a bytes_list (and Ray's write_tfrecords for its tensor
 * columns), read into a tensor column's fixed-size row. Header-only like wire.h, so that decode's
 * loop inlines it; every length is checked against the bytes that remain before it is used.
 *
 * tf.io.serialize_tensor writes a number or bool tensor as dtype, tensor_shape and tensor_content
 * (the values' bytes, little-endian, row-major); tf.make_tensor_proto and other writers may list
 * the values in the dtype's typed repeated field instead (int_val, float_val, ...), packed or not.
 * Both are read as tf.io.parse_tensor reads them (Tensor::FromProto): typed values fewer than the
 * shape holds repeat the last one (none: zeros), which is how TensorFlow stores a filled tensor.
 * Where TensorFlow would silently truncate (an int_val outside an int8 tensor's range) or drop
 * (more typed values than the shape holds), the row is refused with its own status instead.
 */
#ifndef RT_TENSOR_H
#define RT_TENSOR_H

#include "wire.h"

/* What a tensor column holds: TensorFlow's dtype, the row's shape, the element size stored (the
 * dtype's own; 4 when bfloat16 is widened to float32), and whether bfloat16 is widened. */
typedef struct {
    int dtype; /* a DT_* code; 0: not a tensor column */
    int esize, rank, widen;
    int64_t dims[RT_TENSOR_MAX_RANK];
} rt_tensor;

/* Field numbers of tensor.proto and tensor_shape.proto. */
enum {
    F_TENSOR_DTYPE = 1,
    F_TENSOR_SHAPE = 2,
    F_TENSOR_CONTENT = 4,
    F_SHAPE_DIM = 2,          /* TensorShapeProto.dim */
    F_SHAPE_UNKNOWN_RANK = 3, /* TensorShapeProto.unknown_rank */
    F_DIM_SIZE = 1,           /* TensorShapeProto.Dim.size */
};

/* Each dtype: its element size, the typed repeated field TensorFlow lists its values in, that
 * field's wire type (varints, fixed32 or fixed64), the range a varint value must lie in, and the
 * Arrow format of the column's leaf. */
typedef struct {
    int dtype, esize;
    uint32_t field;
    int wire;
    int64_t lo, hi; /* lo > hi: any 64-bit value (int64_val, uint64_val) */
    const char *format;
} rt_tensor_dtype;

static const rt_tensor_dtype rt_tensor_dtypes[] = {
    {DT_FLOAT, 4, 5, WT_I32, 0, 0, "f"},
    {DT_DOUBLE, 8, 6, WT_I64, 0, 0, "g"},
    {DT_INT32, 4, 7, WT_VARINT, INT32_MIN, INT32_MAX, "i"},
    {DT_UINT8, 1, 7, WT_VARINT, 0, UINT8_MAX, "C"},
    {DT_INT16, 2, 7, WT_VARINT, INT16_MIN, INT16_MAX, "s"},
    {DT_INT8, 1, 7, WT_VARINT, INT8_MIN, INT8_MAX, "c"},
    {DT_INT64, 8, 10, WT_VARINT, 1, 0, "l"},
    {DT_BOOL, 1, 11, WT_VARINT, 0, 1, "C"}, /* bool as uint8 0/1: Arrow's bools are bits */
    {DT_BFLOAT16, 2, 13, WT_VARINT, 0, UINT16_MAX, "S"}, /* its bits (half_val), or float32 widened */
    {DT_UINT16, 2, 7, WT_VARINT, 0, UINT16_MAX, "S"},
    {DT_HALF, 2, 13, WT_VARINT, 0, UINT16_MAX, "e"},
    {DT_UINT32, 4, 16, WT_VARINT, 0, UINT32_MAX, "I"},
    {DT_UINT64, 8, 17, WT_VARINT, 1, 0, "L"},
};

static inline const rt_tensor_dtype *rt_tensor_dtype_of(int dtype) {
    for (size_t i = 0; i < sizeof(rt_tensor_dtypes) / sizeof(rt_tensor_dtypes[0]); i++)
        if (rt_tensor_dtypes[i].dtype == dtype) return &rt_tensor_dtypes[i];
    return NULL;
}

/* A failure inside the TensorProto: its status, with actual and expected. */
static RT_MAYBE_UNUSED int tensor_fail(Ctx *c, rt_status st, const uint8_t *at, int ci, int64_t actual, int64_t expected) {
    fail_at(c, st, at, ci);
    c->err->actual = actual;
    c->err->expected = expected;
    return -1;
}

/* rd_field inside the TensorProto: a wire-format failure is TENSOR_MALFORMED, actual its status. */
static inline int tensor_field(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t *f, int *wt, const uint8_t **vs,
                               const uint8_t **ve, int ci) {
    if (rd_field(c, pp, end, f, wt, vs, ve, ci) == 0) return 0;
    c->err->actual = c->err->status;
    c->err->status = RT_TENSOR_MALFORMED;
    c->err->expected = 0;
    return -1;
}

/* The next dimension of the TensorShapeProto [*pp, end): 1 with its size, 2 for unknown_rank set (no
 * size), both with where the field starts; 0 at the shape's end, -1 after fail_at. */
static int tensor_dim(Ctx *c, const uint8_t **pp, const uint8_t *end, const uint8_t **at, int64_t *size, int ci) {
    while (*pp < end) {
        const uint8_t *vs, *ve;
        uint32_t f;
        int wt;
        *at = *pp;
        if (tensor_field(c, pp, end, &f, &wt, &vs, &ve, ci)) return -1;
        if (f == F_SHAPE_UNKNOWN_RANK && wt == WT_VARINT) {
            uint64_t v = 0;
            rd_varint(&vs, ve, &v);
            if (!v) continue;
            return 2;
        }
        if (f != F_SHAPE_DIM) continue;
        if (wt != WT_LEN) return tensor_fail(c, RT_TENSOR_MALFORMED, *at, ci, RT_MALFORMED_WIRE_TYPE, 0);
        uint64_t v = 0; /* a Dim without size has size 0 (proto3) */
        for (const uint8_t *q = vs; q < ve;) {
            const uint8_t *ds, *de;
            if (tensor_field(c, &q, ve, &f, &wt, &ds, &de, ci)) return -1;
            if (f == F_DIM_SIZE && wt == WT_VARINT) rd_varint(&ds, de, &v);
        }
        *size = (int64_t)v; /* a negative size (TensorFlow's unknown dimension) matches no column's */
        return 1;
    }
    return 0;
}

/* Checks one TensorShapeProto [p, end) against t's dims from dimension *k on (the dims of repeated
 * tensor_shape fields add up, as protobuf merges them). */
static int tensor_shape_check(Ctx *c, const rt_tensor *t, const uint8_t *p, const uint8_t *end, int *k, int ci) {
    const uint8_t *at;
    int64_t size;
    int r;
    while ((r = tensor_dim(c, &p, end, &at, &size, ci)) > 0) {
        if (r == 2) {
            c->err->index = -1;
            return tensor_fail(c, RT_TENSOR_SHAPE_MISMATCH, at, ci, -1, t->rank);
        }
        if (*k >= t->rank || size != t->dims[*k]) {
            c->err->index = *k < t->rank ? *k : -1;
            if (*k < t->rank) return tensor_fail(c, RT_TENSOR_SHAPE_MISMATCH, at, ci, size, t->dims[*k]);
            return tensor_fail(c, RT_TENSOR_SHAPE_MISMATCH, at, ci, *k + 1, t->rank);
        }
        (*k)++;
    }
    return r;
}

/* Stores value v (from a typed field) as element i of out, range-checked for its dtype. */
static inline int tensor_put(Ctx *c, const rt_tensor *t, const rt_tensor_dtype *d, uint64_t v, const uint8_t *at,
                             uint8_t *out, int64_t i, int ci) {
    int64_t s = (int64_t)v;
    if (t->dtype == DT_BOOL) s = v != 0; /* protobuf's bool: any non-zero varint is true */
    else if (d->wire == WT_VARINT && d->lo <= d->hi && (s < d->lo || s > d->hi))
        return tensor_fail(c, RT_TENSOR_VALUE_RANGE, at, ci, s, t->dtype);
    if (t->widen) {
        uint32_t w = (uint32_t)s << 16; /* bfloat16 is float32's top half: exact */
        memcpy(out + 4 * i, &w, 4);
    } else if (out) {
        memcpy(out + (size_t)d->esize * (size_t)i, &s, (size_t)d->esize); /* little-endian: the low bytes */
    }
    return 0;
}

/* The typed values of one occurrence [vs, ve) of the dtype's field (wire type wt): counted, and
 * stored as elements *m.. of out when out is set (at most n). */
static int tensor_typed(Ctx *c, const rt_tensor *t, const rt_tensor_dtype *d, int wt, const uint8_t *at,
                        const uint8_t *vs, const uint8_t *ve, uint8_t *out, int64_t n, int64_t *m, int ci) {
    int packed = wt == WT_LEN;
    if (!packed && wt != d->wire) return tensor_fail(c, RT_TENSOR_MALFORMED, at, ci, RT_MALFORMED_WIRE_TYPE, 0);
    if (d->wire != WT_VARINT) {
        size_t w = d->wire == WT_I32 ? 4 : 8, nb = (size_t)(ve - vs);
        if (nb % w) return tensor_fail(c, RT_TENSOR_MALFORMED, at, ci, RT_MALFORMED_PACKED_FLOAT, 0);
        int64_t k = (int64_t)(nb / w);
        if (out) {
            if (*m + k > n) return tensor_fail(c, RT_TENSOR_TOO_MANY_VALUES, at, ci, *m + k, n);
            memcpy(out + w * (size_t)*m, vs, nb);
        }
        *m += k;
        return 0;
    }
    for (const uint8_t *q = vs; q < ve;) {
        uint64_t v;
        if (rd_varint(&q, ve, &v)) return tensor_fail(c, RT_TENSOR_MALFORMED, at, ci, RT_MALFORMED_PACKED_INT64, 0);
        if (out) {
            if (*m >= n) return tensor_fail(c, RT_TENSOR_TOO_MANY_VALUES, at, ci, *m + 1, n);
            if (tensor_put(c, t, d, v, at, out, *m, ci)) return -1;
        }
        (*m)++;
    }
    return 0;
}

/* Reads the TensorProto [p, end) into out: n elements of t->esize bytes, n the product of t's dims.
 * 0, or -1 after fail_at with a TENSOR_* status (or OUT_OF_MEMORY never: out is the caller's). */
static RT_MAYBE_UNUSED int tensor_parse(Ctx *c, const rt_tensor *t, int64_t n, const uint8_t *p, const uint8_t *end,
                                        uint8_t *out, int ci) {
    const rt_tensor_dtype *d = rt_tensor_dtype_of(t->dtype);
    const uint8_t *start = p, *content = NULL, *content_end = NULL, *first_typed = NULL;
    uint64_t dtype = 0; /* DT_INVALID when absent */
    int k = 0;
    if (!d) return tensor_fail(c, RT_BAD_SPEC, p, ci, 0, t->dtype);
    /* Pass 1: the dtype (the last one wins, as protobuf's scalars do), the shape, the content. */
    while (p < end) {
        const uint8_t *vs, *ve;
        uint32_t f;
        int wt;
        if (tensor_field(c, &p, end, &f, &wt, &vs, &ve, ci)) return -1;
        if (f == F_TENSOR_DTYPE && wt == WT_VARINT) rd_varint(&vs, ve, &dtype);
        else if (f == F_TENSOR_CONTENT && wt == WT_LEN) content = vs, content_end = ve;
        else if (f == d->field && !first_typed) first_typed = vs;
    }
    if (dtype != (uint64_t)t->dtype) return tensor_fail(c, RT_TENSOR_DTYPE_MISMATCH, start, ci, (int64_t)dtype, t->dtype);
    /* Pass 2: the shape, dimension by dimension. */
    for (p = start; p < end;) {
        const uint8_t *at = p, *vs, *ve;
        uint32_t f;
        int wt;
        tensor_field(c, &p, end, &f, &wt, &vs, &ve, ci); /* validated by pass 1 */
        if (f != F_TENSOR_SHAPE) continue;
        if (wt != WT_LEN) return tensor_fail(c, RT_TENSOR_MALFORMED, at, ci, RT_MALFORMED_WIRE_TYPE, 0);
        if (tensor_shape_check(c, t, vs, ve, &k, ci)) return -1;
    }
    if (k != t->rank) {
        c->err->index = -1;
        return tensor_fail(c, RT_TENSOR_SHAPE_MISMATCH, start, ci, k, t->rank);
    }
    size_t src = (size_t)d->esize; /* the stored element size, before any widening */
    if (content && content_end > content) {
        size_t nb = (size_t)(content_end - content);
        if ((uint64_t)nb != (uint64_t)n * src)
            return tensor_fail(c, RT_TENSOR_CONTENT_SIZE, content, ci, (int64_t)nb, n * (int64_t)src);
        if (t->dtype == DT_BOOL)
            for (size_t i = 0; i < nb; i++)
                if (content[i] > 1) return tensor_fail(c, RT_TENSOR_VALUE_RANGE, content + i, ci, content[i], t->dtype);
        if (t->widen) {
            for (int64_t i = 0; i < n; i++) {
                uint16_t h;
                memcpy(&h, content + 2 * i, 2);
                uint32_t w = (uint32_t)h << 16;
                memcpy(out + 4 * i, &w, 4);
            }
        } else if (nb) {
            memcpy(out, content, nb);
        }
        return 0;
    }
    /* Pass 3: no content, so the values are the typed field's (every occurrence, in order). */
    int64_t m = 0;
    for (p = start; first_typed && p < end;) {
        const uint8_t *at = p, *vs, *ve;
        uint32_t f;
        int wt;
        tensor_field(c, &p, end, &f, &wt, &vs, &ve, ci);
        if (f == d->field && tensor_typed(c, t, d, wt, at, vs, ve, out, n, &m, ci)) return -1;
    }
    size_t es = (size_t)t->esize;
    if (m == 0) {
        if (n) memset(out, 0, (size_t)n * es);
    } else {
        for (int64_t i = m; i < n; i++) memcpy(out + es * (size_t)i, out + es * (size_t)(m - 1), es);
    }
    return 0;
}

/* The dtype and shape the TensorProto [p, end) declares, for a caller with no column to check it
 * against (inspect's hint): into t (dtype, rank, dims, esize the dtype's, no widening) and *n, their
 * element count. 0, or -1 after fail_at with TENSOR_MALFORMED; TENSOR_DTYPE_MISMATCH for a dtype no
 * tensor column reads (expected 0); TENSOR_SHAPE_MISMATCH for an unknown rank or more than
 * RT_TENSOR_MAX_RANK dimensions (index -1, expected RT_TENSOR_MAX_RANK), or a dimension that is
 * negative or takes the count past INT32_MAX, rt_decode_set_tensor's bound (index: that dimension,
 * expected -1). Whether the values parse is tensor_parse's to say. */
static RT_MAYBE_UNUSED int tensor_describe(Ctx *c, rt_tensor *t, int64_t *n, const uint8_t *p, const uint8_t *end,
                                           int ci) {
    const uint8_t *start = p;
    uint64_t dtype = 0; /* DT_INVALID when absent */
    *t = (rt_tensor){0};
    *n = 1;
    while (p < end) {
        const uint8_t *at = p, *vs, *ve, *dim;
        uint32_t f;
        int wt, r;
        int64_t size;
        if (tensor_field(c, &p, end, &f, &wt, &vs, &ve, ci)) return -1;
        if (f == F_TENSOR_DTYPE && wt == WT_VARINT) rd_varint(&vs, ve, &dtype);
        if (f != F_TENSOR_SHAPE) continue;
        if (wt != WT_LEN) return tensor_fail(c, RT_TENSOR_MALFORMED, at, ci, RT_MALFORMED_WIRE_TYPE, 0);
        while ((r = tensor_dim(c, &vs, ve, &dim, &size, ci)) > 0) {
            if (r == 2 || t->rank == RT_TENSOR_MAX_RANK) {
                c->err->index = -1;
                return tensor_fail(c, RT_TENSOR_SHAPE_MISMATCH, dim, ci, r == 2 ? -1 : t->rank + 1, RT_TENSOR_MAX_RANK);
            }
            if (size < 0 || (size && *n > INT32_MAX / size)) {
                c->err->index = t->rank;
                return tensor_fail(c, RT_TENSOR_SHAPE_MISMATCH, dim, ci, size, -1);
            }
            t->dims[t->rank++] = size;
            *n *= size;
        }
        if (r < 0) return -1;
    }
    const rt_tensor_dtype *d = dtype <= INT32_MAX ? rt_tensor_dtype_of((int)dtype) : NULL;
    if (!d) return tensor_fail(c, RT_TENSOR_DTYPE_MISMATCH, start, ci, (int64_t)dtype, 0);
    t->dtype = d->dtype;
    t->esize = d->esize;
    return 0;
}

#endif
