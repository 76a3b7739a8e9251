/* Decode: records into the buffers of the schema's columns, without a Python object per value. */
#include "decode.h"

RT_API rt_status rt_decode_init(Cols *cs, int ncols) {
    memset(cs, 0, sizeof(*cs));
    cs->cols = calloc((size_t)(ncols > 0 ? ncols : 1), sizeof(Col));
    if (!cs->cols) return RT_OUT_OF_MEMORY;
    cs->cap = ncols;
    return RT_OK;
}

/* A column's state before its first record: the leading zero of each offsets buffer. */
static rt_status col_begin(Col *c) {
    c->seen = -1;
    int32_t zero = 0;
    Buf *starts[] = {col_bytes(c) ? &c->vals : NULL,
                     c->shape == S_LIST || c->shape == S_SEQUENCE ? &c->rowoff : NULL,
                     c->shape == S_SEQUENCE ? &c->inner : NULL};
    for (int i = 0; i < 3; i++) {
        if (!starts[i]) continue;
        if (buf_reserve(starts[i], 4)) return RT_OUT_OF_MEMORY;
        memcpy(starts[i]->p, &zero, 4);
        starts[i]->len = 4;
    }
    return RT_OK;
}

RT_API rt_status rt_decode_add_column(Cols *cs, const uint8_t *name, size_t name_len, int kind, int shape, int64_t fixed_n,
                               int section) {
    if (cs->ncols >= cs->cap || kind < K_BYTES || kind > K_NULL || shape < S_SCALAR || shape > S_SEQUENCE ||
        fixed_n < 0 ||
        (kind == K_NULL && shape != S_LIST && shape != S_SEQUENCE) ||
        (section != SECTION_CONTEXT && section != SECTION_FEATURE_LISTS))
        return RT_BAD_SPEC;
    if (rt_table_add(&cs->names, name, name_len, section) < 0) return RT_OUT_OF_MEMORY;
    Col *c = &cs->cols[cs->ncols++]; /* counted now: rt_decode_free frees what follows */
    c->kind = kind;
    c->shape = shape;
    c->fixed_n = fixed_n;
    c->section = section;
    return col_begin(c);
}

RT_API rt_status rt_decode_set_tensor(Cols *cs, int ci, int dtype, int rank, const int64_t *dims, int widen) {
    const rt_tensor_dtype *d = rt_tensor_dtype_of(dtype);
    if (ci < 0 || ci >= cs->ncols || !d || rank < 0 || rank > RT_TENSOR_MAX_RANK || (widen && dtype != DT_BFLOAT16))
        return RT_BAD_SPEC;
    Col *c = &cs->cols[ci];
    if (c->kind != K_BYTES || c->shape != S_FIXED || c->section != SECTION_CONTEXT) return RT_BAD_SPEC;
    rt_tensor t = {.dtype = dtype, .esize = widen ? 4 : d->esize, .rank = rank, .widen = widen};
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0 || (dims[i] && n > INT32_MAX / dims[i])) return RT_BAD_SPEC;
        n *= dims[i];
        t.dims[i] = dims[i];
    }
    if (n != c->fixed_n) return RT_BAD_SPEC;
    /* The column was begun as bytes (a leading offset); a tensor column's values start empty. */
    c->vals.len = 0;
    c->tensor = t;
    return RT_OK;
}

RT_API rt_status rt_decode_start(Cols *cs, const Cols *tmpl) {
    rt_status st = rt_decode_init(cs, tmpl->ncols);
    if (st != RT_OK) return st;
    cs->names = tmpl->names;
    cs->shared_names = 1;
    memset(cs->names.pred, 0, sizeof(cs->names.pred));
    for (int i = 0; i < tmpl->ncols; i++) {
        const Col *t = &tmpl->cols[i];
        Col *c = &cs->cols[cs->ncols++];
        c->kind = t->kind;
        c->shape = t->shape;
        c->fixed_n = t->fixed_n;
        c->section = t->section;
        c->tensor = t->tensor;
        if ((st = col_begin(c)) != RT_OK) return st;
    }
    return RT_OK;
}

RT_API void rt_decode_free(Cols *cs) {
    for (int i = 0; i < cs->ncols; i++) {
        Col *c = &cs->cols[i];
        buf_free(&c->valid);
        buf_free(&c->rowoff);
        buf_free(&c->inner);
        buf_free(&c->vals);
        buf_free(&c->data);
    }
    free(cs->cols);
    if (!cs->shared_names) rt_table_free(&cs->names);
    memset(cs, 0, sizeof(*cs));
}

/* Undo what a column took from the current record (a repeated map key: the last one wins). */
static void col_rollback(Col *c) {
    c->nvals = c->row_vals;
    c->ninner = c->row_inner;
    c->data.len = (size_t)c->row_data;
    c->vals.len = col_bytes(c) ? (size_t)(c->row_vals + 1) * 4 : (size_t)c->row_vals * col_esize(c);
    if (c->shape == S_SEQUENCE) c->inner.len = (size_t)(c->row_inner + 1) * 4;
}

/* decode's walk (walk_records): the schema's columns take their features' values. */

/* A feature outside the schema is skipped. */
static inline int decode_column(void *self, Ctx *c, const MapEntry *e, int entry_no, int section, int *ci) {
    Cols *cs = self;
    *ci = rt_table_lookup(&cs->names, entry_no, section, e->key, e->key_len);
    if (*ci < 0) return 0;
    Col *col = &cs->cols[*ci];
    if (col->seen == c->record) col_rollback(col);
    col->seen = c->record;
    return 0;
}

/* The only value of a bytes Feature's lists: *n counts them, [*vs, *ve) is the last. */
static int bytes_value(Ctx *c, const Feature *ft, const uint8_t *end, int ci, const uint8_t **vs, const uint8_t **ve,
                       int64_t *n) {
    const uint8_t *q = ft->only ? ft->only : ft->run, *qe = ft->only ? ft->only_end : end;
    while (q < qe) {
        const uint8_t *ls = q, *le = qe, *s, *e;
        uint32_t f;
        int wt;
        if (!ft->only) {
            rd_field(c, &q, qe, &f, &wt, &ls, &le, ci); /* validated by feature_kind */
            if (wt != WT_LEN || f != F_BYTES_LIST) continue;
        } else {
            q = qe;
        }
        while (ls < le) {
            if (rd_field(c, &ls, le, &f, &wt, &s, &e, ci)) return -1;
            if (f != F_LIST_VALUE || wt != WT_LEN) continue;
            *vs = s;
            *ve = e;
            (*n)++;
        }
    }
    return 0;
}

/* A tensor column's Feature: one bytes value, a TensorProto read into the row's values. An empty
 * bytes_list is a missing tensor (null), as Ray's write_tfrecords writes one. */
static int decode_tensor(Col *col, Ctx *c, int ci, const Feature *ft, const uint8_t *p, const uint8_t *end) {
    const uint8_t *vs = NULL, *ve = NULL;
    int64_t n = 0;
    if (bytes_value(c, ft, end, ci, &vs, &ve, &n)) return -1;
    if (n == 0) {
        col->seen = -2; /* no record's index: the row is closed as null */
        return 0;
    }
    if (n != 1) {
        c->err->actual = n;
        c->err->expected = 1;
        return fail_at(c, RT_COUNT_MISMATCH, p, ci);
    }
    size_t bytes = (size_t)col->fixed_n * (size_t)col->tensor.esize;
    if (buf_reserve(&col->vals, bytes)) return fail_at(c, RT_OUT_OF_MEMORY, p, ci);
    if (tensor_parse(c, &col->tensor, col->fixed_n, vs, ve, col->vals.p + col->vals.len, ci)) return -1;
    col->vals.len += bytes;
    col->nvals += col->fixed_n;
    return 0;
}

static inline int decode_feature(void *self, Ctx *c, int ci, const Feature *ft, const uint8_t *p, const uint8_t *end) {
    Col *col = &((Cols *)self)->cols[ci];
    if (col->tensor.dtype && ft->kind == K_BYTES) return decode_tensor(col, c, ci, ft, p, end);
    if (ft->kind != col->kind) {
        c->err->actual = ft->kind;
        c->err->expected = col->kind;
        return fail_at(c, RT_KIND_MISMATCH, p, ci);
    }
    int64_t n = 0;
    if (feature_collect(c, ft, end, &col->vals, &col->data, ci, 1, &n)) return -1;
    col->nvals += n;
    if (col_bytes(col) && col->nvals > INT32_MAX) return fail_at(c, RT_TOO_MANY_VALUES, p, ci);
    return 0;
}

static int push_i32(Ctx *c, Buf *b, int64_t v, int ci) {
    if (v > INT32_MAX) return fail_at(c, RT_TOO_MANY_VALUES, NULL, ci);
    if (buf_reserve(b, 4)) return fail_at(c, RT_OUT_OF_MEMORY, NULL, ci);
    int32_t x = (int32_t)v;
    memcpy(b->p + b->len, &x, 4);
    b->len += 4;
    return 0;
}

/* A step of a feature_list column ends its inner list. */
static inline int decode_step(void *self, Ctx *c, int ci) {
    Col *col = &((Cols *)self)->cols[ci];
    col->ninner++;
    return push_i32(c, &col->inner, col->nvals, ci);
}

static int set_bit(Buf *b, int64_t i, int v) {
    if ((size_t)(i / 8) >= b->len) {
        if (buf_reserve(b, 1)) return -1;
        b->p[b->len++] = 0;
    }
    if (v) b->p[i / 8] |= (uint8_t)(1u << (i % 8));
    return 0;
}

/* Closes the current row of every column: validity, offsets, value-count rules, null fill. */
static int finish_record(Ctx *c, Cols *cs) {
    for (int ci = 0; ci < cs->ncols; ci++) {
        Col *col = &cs->cols[ci];
        int present = col->seen == c->record;
        int64_t n = col->nvals - col->row_vals;
        if (present && col->shape == S_SCALAR && n != 1) {
            c->err->actual = n;
            c->err->expected = 1;
            return fail_at(c, RT_COUNT_MISMATCH, NULL, ci);
        }
        if (present && col->shape == S_FIXED && n != col->fixed_n) {
            c->err->actual = n;
            c->err->expected = col->fixed_n;
            return fail_at(c, RT_COUNT_MISMATCH, NULL, ci);
        }
        if (set_bit(&col->valid, col->nrows, present)) return fail_at(c, RT_OUT_OF_MEMORY, NULL, ci);
        if (!present) {
            col->nulls++;
            int64_t fill = col->shape == S_SCALAR ? 1 : col->shape == S_FIXED ? col->fixed_n : 0;
            for (int64_t k = 0; k < fill; k++) {
                if (col_bytes(col)) {
                    if (push_i32(c, &col->vals, (int64_t)col->data.len, ci)) return -1;
                } else if (col->kind != K_NULL) {
                    size_t es = col_esize(col);
                    if (buf_reserve(&col->vals, es)) return fail_at(c, RT_OUT_OF_MEMORY, NULL, ci);
                    memset(col->vals.p + col->vals.len, 0, es);
                    col->vals.len += es;
                }
            }
            col->nvals += fill;
        }
        if (col->shape == S_LIST && push_i32(c, &col->rowoff, col->nvals, ci)) return -1;
        if (col->shape == S_SEQUENCE && push_i32(c, &col->rowoff, col->ninner, ci)) return -1;
        col->row_vals = col->nvals;
        col->row_inner = col->ninner;
        col->row_data = (int64_t)col->data.len;
        col->nrows++;
    }
    return 0;
}

/* Records of a dataset are alike: after a few, reserve what the whole call will need, so buffers
 * do not grow by repeated doubling (each doubling copies and touches fresh pages). A wrong guess
 * costs nothing in correctness; buffers still grow on demand. */
static void presize(Cols *cs, int64_t done, int64_t nrec) {
    double scale = (double)nrec / (double)done * 1.05;
    for (int i = 0; i < cs->ncols; i++) {
        Col *c = &cs->cols[i];
        Buf *bufs[] = {&c->valid, &c->rowoff, &c->inner, &c->vals, &c->data};
        for (int b = 0; b < 5; b++) {
            size_t want = (size_t)((double)bufs[b]->len * scale) + 64;
            if (want > bufs[b]->cap) buf_reserve(bufs[b], want - bufs[b]->len);
        }
    }
}

static inline int decode_end_record(void *self, Ctx *c, int64_t count) {
    if (finish_record(c, self)) return -1;
    if (c->record == 7 && count > 64) presize(self, c->record + 1, count);
    return 0;
}

RT_API rt_status rt_decode_records(Cols *cs, int rtype, const rt_records *rs, rt_error *e) {
    rt_status st =
        walk_records(rs, rtype, e, (Walker){decode_column, decode_feature, decode_step, decode_end_record}, cs);
    if (st == RT_OK) cs->nrecords = rs->count;
    return st;
}

RT_API rt_status rt_byte_array(const rt_records *rs, Buf *offsets, Buf *data, rt_error *e) {
    const int64_t nrec = rs->count, *pos = rs->pos, *lens = rs->lens;
    uint64_t total = 0;
    for (int64_t r = 0; r < nrec; r++) {
        if (!rt_span_ok(rs->n, pos[r], lens[r])) {
            e->record = r;
            return e->status = RT_BAD_SPAN;
        }
        total += (uint64_t)lens[r];
    }
    if (total > INT32_MAX) return e->status = RT_RECORDS_TOO_LARGE;
    if (buf_reserve(offsets, (size_t)(nrec + 1) * 4) || buf_reserve(data, (size_t)total))
        return e->status = RT_OUT_OF_MEMORY;
    int32_t o = 0;
    memcpy(offsets->p, &o, 4);
    for (int64_t r = 0; r < nrec; r++) {
        memcpy(data->p + o, rs->buf + pos[r] + RT_HEADER_BYTES, (size_t)lens[r]);
        o += (int32_t)lens[r];
        memcpy(offsets->p + 4 * (r + 1), &o, 4);
    }
    offsets->len = (size_t)(nrec + 1) * 4;
    data->len = (size_t)total;
    return RT_OK;
}
