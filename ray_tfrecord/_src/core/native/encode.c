/* Encode: two passes per row, sizes first, so every message is written once, in place. */
#include "encode.h"

#include "crc32c.h"
#include "wire.h"

/* 1 + floor(log2 / 7) without a division (protobuf's formula): it runs once per value, 784 per image. */
static inline size_t vsize(uint64_t v) { return ((size_t)(63 - __builtin_clzll(v | 1)) * 9 + 73) >> 6; }

/* Every put_varint stores whole 8- and 2-byte words, up to VARINT_SLACK bytes past the varint's
 * end, so that a value costs no branch on its length (pixel values are 1 or 2 bytes at random, and
 * a branch per byte mispredicts half the time). The bytes past the end are garbage that the next
 * write covers: output buffers keep VARINT_SLACK spare bytes after the last record. */
#define VARINT_SLACK 16

/* The low 56 bits of v as eight 7-bit groups, one per byte (continuation bits clear). */
static inline uint64_t spread7(uint64_t v) {
    return (v & 0x7F) | (v << 1 & 0x7F00) | (v << 2 & 0x7F0000) | (v << 3 & 0x7F000000) |
           (v << 4 & 0x7F00000000) | (v << 5 & 0x7F0000000000) | (v << 6 & 0x7F000000000000) |
           (v << 7 & 0x7F00000000000000);
}

static inline uint8_t *put_varint(uint8_t *o, uint64_t v) {
    if (v < (1u << 14)) { /* lengths, pixels, small ids: the common case, two bytes at most */
        uint64_t two = (v + 0x3F80) >> 14; /* v >= 0x80, as arithmetic: compilers turn a compare into a branch */
        uint16_t w = (uint16_t)((v & 0x7F) | (v << 1 & 0x7F00) | two << 7);
        memcpy(o, &w, 2);
        return o + 1 + two;
    }
    size_t n = vsize(v);
    /* continuation bits on every byte but the last, among the first eight */
    uint64_t cont = n > 8 ? 0x8080808080808080u : 0x8080808080808080u & ((1ull << (8 * (n - 1))) - 1);
    uint64_t lo = spread7(v) | cont;
    uint16_t hi = (uint16_t)((v >> 56 & 0x7F) | (v >> 63) << 7 | (v >> 63) << 8); /* bytes 9 and 10 */
    memcpy(o, &lo, 8);
    memcpy(o + 8, &hi, 2);
    return o + n;
}

/* Payload of a packed Int64List / FloatList, or the whole BytesList body, over elements [a, b). */
static size_t list_payload(const ECol *c, int64_t a, int64_t b) {
    size_t s = 0;
    if (c->kind == K_INT64) {
        const int64_t *v = c->vals.buf;
        for (int64_t k = a; k < b; k++) s += vsize((uint64_t)v[k]);
    } else if (c->kind == K_FLOAT) {
        s = (size_t)(b - a) * 4;
    } else if (c->kind == K_BYTES) {
        const int64_t *o = c->vals.buf;
        for (int64_t k = a; k < b; k++) {
            size_t len = (size_t)(o[k + 1] - o[k]);
            s += 1 + vsize(len) + len;
        }
    }
    return s;
}

static inline size_t list_size(const ECol *c, int64_t a, int64_t b, size_t payload) {
    if (b <= a) return 0;
    return c->kind == K_BYTES ? payload : 1 + vsize(payload) + payload;
}

/* A Feature message; a null-typed column writes a Feature with no kind set. */
/* Sizes take the list payload from the caller: summing varint sizes is a pass over the values,
 * and the size pass's result serves the write pass too. */
static size_t feature_size(const ECol *c, int64_t a, int64_t b, size_t payload) {
    if (c->kind == K_NULL) return 0;
    size_t ls = list_size(c, a, b, payload);
    return 1 + vsize(ls) + ls;
}

static uint8_t *write_feature(uint8_t *o, const ECol *c, int64_t a, int64_t b, size_t payload) {
    if (c->kind == K_NULL) return o;
    size_t ls = list_size(c, a, b, payload);
    *o++ = (uint8_t)RT_TAG(field_of_kind(c->kind), WT_LEN);
    o = put_varint(o, ls);
    if (b <= a) return o;
    if (c->kind == K_INT64) {
        const int64_t *v = c->vals.buf;
        *o++ = TAG_LIST_VALUE;
        o = put_varint(o, payload);
        for (int64_t k = a; k < b; k++) o = put_varint(o, (uint64_t)v[k]);
    } else if (c->kind == K_FLOAT) {
        *o++ = TAG_LIST_VALUE;
        o = put_varint(o, payload);
        memcpy(o, (const uint8_t *)c->vals.buf + a * 4, payload);
        o += payload;
    } else {
        const int64_t *off = c->vals.buf;
        const uint8_t *d = c->data.buf;
        for (int64_t k = a; k < b; k++) {
            size_t len = (size_t)(off[k + 1] - off[k]);
            *o++ = TAG_LIST_VALUE;
            o = put_varint(o, len);
            memcpy(o, d + off[k], len);
            o += len;
        }
    }
    return o;
}

/* Size of row i's map value (a Feature, or a FeatureList); *payload keeps a Feature's list payload. */
static size_t body_size(const ECol *c, int64_t i, size_t *payload) {
    int64_t a, b;
    row_span(c, i, &a, &b);
    if (c->shape != S_SEQUENCE) {
        *payload = list_payload(c, a, b);
        return feature_size(c, a, b, *payload);
    }
    const int64_t *in = c->inner.buf;
    size_t s = 0;
    for (int64_t k = a; k < b; k++) {
        size_t fs = feature_size(c, in[k], in[k + 1], list_payload(c, in[k], in[k + 1]));
        s += 1 + vsize(fs) + fs;
    }
    return s;
}

static uint8_t *write_entry(uint8_t *o, const ECol *c, int64_t i, size_t body, size_t payload) {
    size_t entry = 1 + vsize(c->key_len) + c->key_len + 1 + vsize(body) + body;
    *o++ = TAG_MAP_ENTRY;
    o = put_varint(o, entry);
    *o++ = TAG_ENTRY_KEY;
    o = put_varint(o, c->key_len);
    memcpy(o, c->key, c->key_len);
    o += c->key_len;
    *o++ = TAG_ENTRY_VALUE;
    o = put_varint(o, body);
    int64_t a, b;
    row_span(c, i, &a, &b);
    if (c->shape != S_SEQUENCE) return write_feature(o, c, a, b, payload);
    const int64_t *in = c->inner.buf;
    for (int64_t k = a; k < b; k++) {
        size_t step = list_payload(c, in[k], in[k + 1]);
        *o++ = TAG_FEATURE_LIST_STEP;
        o = put_varint(o, feature_size(c, in[k], in[k + 1], step));
        o = write_feature(o, c, in[k], in[k + 1], step);
    }
    return o;
}

static inline size_t entry_total(const ECol *c, size_t body) {
    size_t entry = 1 + vsize(c->key_len) + c->key_len + 1 + vsize(body) + body;
    return 1 + vsize(entry) + entry;
}

/* Its own function (and so, with -falign-functions, at a fixed place in a cache line): this loop
 * is the whole cost of encoding a few rows sliced from a long list column, whose child's offsets
 * are all checked, and its speed halved when inlining let it straddle a cache-line boundary. */
static __attribute__((noinline)) int monotone(const int64_t *o, int64_t n, int64_t hi) {
    if (n < 1 || o[0] < 0) return 0;
    for (int64_t k = 1; k < n; k++)
        if (o[k] < o[k - 1]) return 0;
    return o[n - 1] <= hi;
}

/* Checks that every offset stays inside the buffers it points into. Sums of caller-supplied
 * counts are written as differences, which cannot overflow (all of them are >= 0). */
static rt_status ecol_check(const ECol *c, int64_t nrows) {
    if (c->has_valid && (int64_t)c->valid.len * 8 - nrows < c->valid_off) return RT_VALIDITY_TOO_SHORT;
    int64_t elems = c->kind == K_INT64 ? c->nvals : c->kind == K_FLOAT ? c->nvals : c->kind == K_BYTES ? c->nvals - 1 : 0;
    if (c->kind == K_BYTES && !monotone(c->vals.buf, c->nvals, c->ndata)) return RT_BYTES_OFFSETS_OUT_OF_RANGE;
    if (c->shape == S_SCALAR) return elems >= nrows ? RT_OK : RT_FEWER_VALUES_THAN_ROWS;
    if (c->nrowoff - 1 < nrows) return RT_FEWER_LIST_OFFSETS_THAN_ROWS;
    if (c->shape == S_SEQUENCE) {
        if (!monotone(c->rowoff.buf, nrows + 1, c->ninner - 1)) return RT_SEQUENCE_OFFSETS_OUT_OF_RANGE;
        if (c->kind == K_NULL) return RT_OK;
        return monotone(c->inner.buf, c->ninner, elems) ? RT_OK : RT_INNER_OFFSETS_OUT_OF_RANGE;
    }
    if (c->kind == K_NULL) {
        const int64_t *r = c->rowoff.buf;
        for (int64_t i = 0; i < nrows; i++)
            if (r[i + 1] != r[i] && ecol_valid(c, i)) return RT_NULL_LIST_HOLDS_VALUES;
        return RT_OK;
    }
    return monotone(c->rowoff.buf, nrows + 1, elems) ? RT_OK : RT_LIST_OFFSETS_OUT_OF_RANGE;
}

RT_API rt_status rt_encode_prepare(ECol *c, int rtype, int64_t ncols) {
    int bad = c->kind < K_BYTES || c->kind > K_NULL || c->valid_off < 0 ||
              (c->shape != S_SCALAR && c->shape != S_LIST && c->shape != S_SEQUENCE) ||
              (c->shape != S_SCALAR && !c->has_rowoff) ||
              (c->shape == S_SEQUENCE && c->kind != K_NULL && !c->has_inner) ||
              (c->kind != K_NULL && !c->has_vals) || (c->kind == K_BYTES && !c->has_data) ||
              (c->kind == K_NULL && c->shape == S_SCALAR) || (rtype == R_EXAMPLE && c->shape == S_SEQUENCE) ||
              (rtype == R_BYTE_ARRAY && (ncols != 1 || c->kind != K_BYTES || c->shape != S_SCALAR || c->has_valid));
    if (bad) return RT_BAD_SPEC;
    c->nrowoff = c->has_rowoff ? (int64_t)(c->rowoff.len / 8) : 0;
    c->ninner = c->has_inner ? (int64_t)(c->inner.len / 8) : 0;
    c->nvals = c->has_vals ? (int64_t)(c->vals.len / (c->kind == K_FLOAT ? 4 : 8)) : 0;
    c->ndata = c->has_data ? (int64_t)c->data.len : 0;
    return RT_OK;
}

/* Room to ask for before row i (of nrows) whose record needs `need` bytes after `used`: when the
 * buffer must grow anyway, it grows to what the rows so far project for all rows, so that a batch
 * of similar rows reallocates (and copies what it wrote) once or twice rather than at every doubling. */
static size_t reserve_for(size_t used, size_t need, int64_t i, int64_t nrows) {
    size_t per_row = (used + need) / (size_t)(i + 1), rest = (size_t)(nrows - i);
    if (per_row > (SIZE_MAX / 8) / rest) return need; /* no projection beyond what memory can hold */
    size_t projected = per_row * rest + per_row / 8;
    return projected > need ? projected : need;
}

static rt_status encode_records(const ECol *cols, int ncols, int rtype, int64_t nrows, Buf *out, Buf *offs) {
    /* per column of the current row: its map value's size (SIZE_MAX: null) and list payload */
    size_t *body = malloc(sizeof(size_t) * 2 * (size_t)(ncols ? ncols : 1)), *pay = body + (ncols ? ncols : 1);
    /* more rows than memory can hold offsets for must not wrap nrows * 8 around to a small size */
    if (!body || (uint64_t)nrows > SIZE_MAX / 8 || buf_reserve(offs, (size_t)nrows * 8)) {
        free(body);
        return RT_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < nrows; i++) {
        size_t ctx = 0, fl = 0;
        if (rtype == R_BYTE_ARRAY) { /* the single binary column is the record payload itself */
            int64_t a, b;
            row_span(&cols[0], i, &a, &b);
            const int64_t *off = cols[0].vals.buf;
            ctx = (size_t)(off[a + 1] - off[a]);
        }
        for (int ci = 0; ci < ncols && rtype != R_BYTE_ARRAY; ci++) {
            const ECol *c = &cols[ci];
            if (!ecol_valid(c, i)) {
                body[ci] = SIZE_MAX;
                continue;
            }
            body[ci] = body_size(c, i, &pay[ci]);
            if (c->shape == S_SEQUENCE) fl += entry_total(c, body[ci]);
            else ctx += entry_total(c, body[ci]);
        }
        size_t msg = rtype == R_BYTE_ARRAY ? ctx : 1 + vsize(ctx) + ctx;
        if (rtype == R_SEQUENCE_EXAMPLE) msg += 1 + vsize(fl) + fl;
        size_t need = msg + RT_FRAME_OVERHEAD + VARINT_SLACK;
        if (need > out->cap - out->len && buf_reserve(out, reserve_for(out->len, need, i, nrows))) {
            free(body);
            return RT_OUT_OF_MEMORY;
        }
        int64_t start = (int64_t)out->len;
        memcpy(offs->p + offs->len, &start, 8);
        offs->len += 8;
        uint8_t *h = out->p + out->len, *o = h + RT_HEADER_BYTES;
        uint64_t len64 = msg;
        memcpy(h, &len64, sizeof(len64));
        uint32_t lc = masked_crc(h, RT_LENGTH_BYTES);
        memcpy(h + RT_LENGTH_BYTES, &lc, sizeof(lc));
        if (rtype == R_BYTE_ARRAY) {
            const int64_t *off = cols[0].vals.buf;
            memcpy(o, (const uint8_t *)cols[0].data.buf + off[i], ctx);
            o += ctx;
        } else {
            *o++ = TAG_FEATURES;
            o = put_varint(o, ctx);
        }
        for (int ci = 0; ci < ncols && rtype != R_BYTE_ARRAY; ci++)
            if (body[ci] != SIZE_MAX && cols[ci].shape != S_SEQUENCE)
                o = write_entry(o, &cols[ci], i, body[ci], pay[ci]);
        if (rtype == R_SEQUENCE_EXAMPLE) {
            *o++ = TAG_FEATURE_LISTS;
            o = put_varint(o, fl);
            for (int ci = 0; ci < ncols; ci++)
                if (body[ci] != SIZE_MAX && cols[ci].shape == S_SEQUENCE) o = write_entry(o, &cols[ci], i, body[ci], 0);
        }
        if ((size_t)(o - (h + RT_HEADER_BYTES)) != msg) { /* a size/write mismatch would be a codec bug: fail loudly */
            free(body);
            return RT_SIZE_MISMATCH;
        }
        uint32_t dc = masked_crc(h + RT_HEADER_BYTES, msg);
        memcpy(o, &dc, 4);
        out->len += msg + RT_FRAME_OVERHEAD;
    }
    free(body);
    return RT_OK;
}

RT_API rt_status rt_encode(const ECol *cols, int ncols, int rtype, int64_t nrows, Buf *out, Buf *offs, rt_error *e) {
    for (int ci = 0; ci < ncols; ci++) {
        rt_status s = ecol_check(&cols[ci], nrows);
        if (s != RT_OK) {
            e->col = ci;
            return e->status = s;
        }
    }
    return e->status = encode_records(cols, ncols, rtype, nrows, out, offs);
}
