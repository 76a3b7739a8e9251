/*
 * Fuzz targets for the native codec, one per entry point: scan, decode_example, decode_sequence,
 * inspect, encode, the buffer pool they allocate from, the serialized tensor parser (tensor), and
 * the JPEG window decode (jpeg, built where libjpeg-turbo is found: RT_HAVE_JPEG). They call the codec's Python-free units
 * (every .c file in ray_tfrecord/_src/core/native/ but module.c) directly: no Python header, no libpython.
 * Build one binary per target with -DFUZZ_TARGET=<function>, linking those units (fuzz/run.sh
 * does): linked with -fsanitize=fuzzer it is a libFuzzer target, linked with fuzz/driver.c it
 * replays a corpus and random mutations without libFuzzer.
 *
 * Beyond "no crash and no sanitizer report", each target checks what the core promises its caller:
 * records found by the scan lie inside the buffer with valid CRCs, decoded buffers form valid Arrow
 * layouts, and so does the Arrow C data interface batch assembled from them (every buffer as long
 * as its array needs, every offset in range), whose release frees all it holds, child by child,
 * and which the encoder reads in place and writes back to records that decode to the same batch;
 * inspect's statistics agree with a decode using the schema it implies, encode's output scans and
 * decodes back to exactly its input, and the pool lends a buffer to one owner at a time, with all
 * the capacity it reports, whichever thread frees it, and holds no more than its bound; a
 * TensorProto parses for at most one dtype, into every byte of its row, or fails with a TENSOR_*
 * status naming a byte inside it, and it declares the dtype and shape it parses as.
 */
#include <pthread.h>
#include <stdio.h>

#include "../ray_tfrecord/_src/core/native/arrow.h"

#include "../ray_tfrecord/_src/core/native/crc32c.h"
#include "../ray_tfrecord/_src/core/native/decode.h"
#include "../ray_tfrecord/_src/core/native/encode.h"
#include "../ray_tfrecord/_src/core/native/inspect.h"
#include "../ray_tfrecord/_src/core/native/jpeg.h"
#include "../ray_tfrecord/_src/core/native/scan.h"

#if defined(__SANITIZE_ADDRESS__)
#define FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUZZ_ASAN 1
#endif
#endif
#ifdef FUZZ_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define CHECK(cond)                                                                                 \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);        \
            abort();                                                                                \
        }                                                                                           \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Reading the fuzz input: bytes past its end read as zero, so every input means something.    */

typedef struct {
    const uint8_t *p, *end;
} In;

static uint8_t in_byte(In *in) { return in->p < in->end ? *in->p++ : 0; }

static uint64_t in_u64(In *in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)in_byte(in) << (8 * i);
    return v;
}

static size_t in_take(In *in, size_t want, const uint8_t **at) {
    size_t have = (size_t)(in->end - in->p);
    if (want > have) want = have;
    *at = in->p;
    in->p += want;
    return want;
}

static int64_t rd_i64(const uint8_t *p) { return (int64_t)rd64(p); }
static int32_t rd_i32(const uint8_t *p) { return (int32_t)rd32(p); }

/* ------------------------------------------------------------------------------------------ */
/* Records: the rest of the input as [u16 length][payload] pieces (the last one clipped), laid   */
/* out like framed records. Everything between payloads is poisoned, so a read that strays past */
/* a record's end is an ASan report even when the neighbouring bytes belong to the same buffer. */

typedef struct {
    uint8_t *buf;
    size_t n;
    int64_t *pos, *lens, nrec;
} Records;

static size_t align8(size_t x) { return (x + 7) & ~(size_t)7; }

static void records_from(In *in, Records *r) {
    size_t left = (size_t)(in->end - in->p), max = left / 2 + 1;
    r->pos = malloc(sizeof(int64_t) * max);
    r->lens = malloc(sizeof(int64_t) * max);
    r->nrec = 0;
    const uint8_t **src = malloc(sizeof(*src) * max);
    size_t end = 0; /* where the previous payload ended (8-aligned) */
    while (in->p < in->end) {
        size_t want = in_byte(in);
        want |= (size_t)in_byte(in) << 8;
        const uint8_t *at;
        size_t len = in_take(in, want, &at), e = align8(end + 16 + len);
        src[r->nrec] = at;
        r->pos[r->nrec] = (int64_t)(e - len - 12);
        r->lens[r->nrec++] = (int64_t)len;
        end = e;
    }
    r->n = end; /* the last payload ends at the allocation's end: ASan's heap redzone follows */
    r->buf = malloc(r->n ? r->n : 1);
    size_t prev = 0;
    for (int64_t i = 0; i < r->nrec; i++) {
        size_t start = (size_t)r->pos[i] + 12;
        memcpy(r->buf + start, src[i], (size_t)r->lens[i]);
        POISON(r->buf + prev, start - prev);
        prev = start + (size_t)r->lens[i];
    }
    free(src);
}

/* What the readers take: the records, as the module hands them over. */
static rt_records records_view(const Records *r) { return (rt_records){r->buf, r->n, r->pos, r->lens, r->nrec}; }

static void records_free(Records *r) {
    UNPOISON(r->buf, r->n);
    free(r->buf);
    free(r->pos);
    free(r->lens);
}

/* ------------------------------------------------------------------------------------------ */
/* Decoded columns must be valid Arrow layouts (pyarrow trusts these buffers without checks).   */

static void check_offsets(const Buf *b, int64_t count, int64_t last) {
    CHECK(b->len == (size_t)(count + 1) * 4);
    CHECK(rd_i32(b->p) == 0);
    for (int64_t i = 0; i < count; i++) CHECK(rd_i32(b->p + 4 * i) <= rd_i32(b->p + 4 * (i + 1)));
    CHECK(rd_i32(b->p + 4 * count) == last);
}

static int col_valid(const Col *c, int64_t i) { return (c->valid.p[i / 8] >> (i % 8)) & 1; }

static void check_column(const Col *c, int64_t nrec) {
    CHECK(c->nrows == nrec);
    CHECK(c->valid.len == (size_t)(nrec + 7) / 8);
    int64_t nulls = 0;
    for (int64_t i = 0; i < nrec; i++) nulls += !col_valid(c, i);
    CHECK(nulls == c->nulls);
    if (c->shape == S_SCALAR) CHECK(c->nvals == nrec);
    if (c->shape == S_FIXED) CHECK(c->nvals == nrec * c->fixed_n);
    if (c->shape == S_LIST) check_offsets(&c->rowoff, nrec, c->nvals);
    if (c->shape == S_SEQUENCE) {
        check_offsets(&c->rowoff, nrec, c->ninner);
        check_offsets(&c->inner, c->ninner, c->nvals);
    }
    if (c->shape == S_LIST || c->shape == S_SEQUENCE)
        for (int64_t i = 0; i < nrec; i++)
            if (!col_valid(c, i)) CHECK(rd_i32(c->rowoff.p + 4 * i) == rd_i32(c->rowoff.p + 4 * (i + 1)));
    if (c->kind == K_BYTES) check_offsets(&c->vals, c->nvals, (int64_t)c->data.len);
    else CHECK(c->vals.len == (size_t)c->nvals * elem_size(c->kind));
    if (c->kind == K_NULL) CHECK(c->nvals == 0);
}

/* The word-at-a-time varint decoder must agree with the byte-at-a-time one on any bytes. */
static void check_varints(const uint8_t *p, const uint8_t *end) {
    int64_t n = 0, k = 0;
    int fast = packed_varints(p, end, NULL, &n), slow = 0;
    const uint8_t *q = p;
    while (q < end && !slow) {
        uint64_t v;
        slow = rd_varint(&q, end, &v);
        k += !slow;
    }
    CHECK((fast != 0) == (slow != 0));
    if (fast) return;
    CHECK(n == k);
    /* exactly the room the decoder may use (a value per byte), so ASan sees a write past it */
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(end - p > 0 ? end - p : 1));
    CHECK(packed_varints(p, end, out, &k) == 0 && k == n);
    q = p;
    for (int64_t i = 0; i < n; i++) {
        uint64_t v;
        CHECK(rd_varint(&q, end, &v) == 0 && (int64_t)v == out[i]);
    }
    free(out);
}

/* RT_STATUS_LIST keeps the MALFORMED_* statuses together, first to last. */
static int malformed(rt_status s) { return s >= RT_MALFORMED_TAG && s <= RT_MALFORMED_PACKED_FLOAT; }

/* ------------------------------------------------------------------------------------------ */
/* scan: byte 0 holds the flags (and whether byte 1 sets a limit); the rest is the stream.      */

static int fuzz_scan(const uint8_t *data, size_t size) {
    In in = {data, data + size};
    uint8_t flags = in_byte(&in), lim = flags & 0x10 ? in_byte(&in) : 255;
    const uint8_t *buf = in.p;
    size_t n = (size_t)(in.end - in.p);
    rt_scan s = {.verify = flags & 1, .final = (flags >> 1) & 1, .skip = (flags >> 2) & 1, .resync = (flags >> 3) & 1};
    s.limit = lim == 255 ? n : lim == 254 ? n + 1000 : n * lim / 253;
    CHECK(rt_scan_run(&s, buf, n) == RT_OK);
    CHECK(s.nerr <= RT_SCAN_MAX_ERRORS && s.nerr_total >= s.nerr && (s.skip || s.nerr <= 1));
    CHECK(s.consumed <= n);
    size_t nrec = s.pos.len / 8, next = 0;
    CHECK(s.lens.len == s.pos.len);
    for (size_t i = 0; i < nrec; i++) {
        int64_t p = rd_i64(s.pos.p + 8 * i), len = rd_i64(s.lens.p + 8 * i);
        CHECK(p >= 0 && (size_t)p >= next && (size_t)p < s.limit && (size_t)p + 16 <= n);
        CHECK(len >= 0 && (uint64_t)len <= n - (size_t)p - 16);
        CHECK(masked_crc(buf + p, 8) == rd32(buf + p + 8) && rd64(buf + p) == (uint64_t)len);
        if (s.verify) CHECK(masked_crc(buf + p + 12, (size_t)len) == rd32(buf + p + 12 + len));
        next = (size_t)p + 16 + (size_t)len;
    }
    CHECK(next <= s.consumed);
#ifdef RT_HAVE_HW_CRC
    if (rt_crc32c_update == rt_crc32c_hw) CHECK(rt_crc32c_sw(0xFFFFFFFFu, buf, n) == rt_crc32c_hw(0xFFFFFFFFu, buf, n));
#endif
    free(s.pos.p);
    free(s.lens.p);
    return 0;
}

/* The same records read as ByteArray: each payload, end to end, behind int32 offsets. */
static void check_byte_array(const Records *r) {
    Buf off = {0}, data = {0};
    rt_records rs = records_view(r);
    rt_error e = RT_ERROR_INIT;
    CHECK(rt_byte_array(&rs, &off, &data, &e) == RT_OK && e.status == RT_OK);
    CHECK(off.len == (size_t)(r->nrec + 1) * 4 && rd_i32(off.p) == 0);
    for (int64_t i = 0; i < r->nrec; i++) {
        int32_t a = rd_i32(off.p + 4 * i), b = rd_i32(off.p + 4 * (i + 1));
        CHECK(b - a == r->lens[i] && (size_t)b <= data.len);
        CHECK(r->lens[i] == 0 || memcmp(data.p + a, r->buf + r->pos[i] + 12, (size_t)r->lens[i]) == 0);
    }
    CHECK(data.len == (size_t)rd_i32(off.p + 4 * r->nrec));
    free(off.p);
    free(data.p);
}

/* ------------------------------------------------------------------------------------------ */
/* The Arrow C data interface batch: what a consumer may assume of it, checked on its own terms  */
/* (formats, lengths, offsets), reading the last byte each buffer must have, so ASan reports a  */
/* buffer shorter than its array claims.                                                        */

static void touch(const void *p, size_t n) {
    if (n) CHECK(p && ((volatile const uint8_t *)p)[n - 1] == ((const uint8_t *)p)[n - 1]);
}

static int64_t zero_bits(const uint8_t *bits, int64_t n) {
    int64_t z = 0;
    for (int64_t i = 0; i < n; i++) z += !((bits[i / 8] >> (i % 8)) & 1);
    return z;
}

/* int32 offsets of a's n values: from 0, never decreasing; returns the last. */
static int32_t check_arrow_offsets(const void *buf, int64_t n) {
    CHECK(buf != NULL);
    touch(buf, (size_t)(n + 1) * 4);
    const uint8_t *p = buf;
    CHECK(rd_i32(p) == 0);
    for (int64_t i = 0; i < n; i++) CHECK(rd_i32(p + 4 * i) <= rd_i32(p + 4 * (i + 1)));
    return rd_i32(p + 4 * n);
}

static void check_arrow(const struct ArrowArray *a, const struct ArrowSchema *s) {
    const char *f = s->format;
    CHECK(a->release && s->release && a->offset == 0 && a->length >= 0 && a->dictionary == NULL);
    CHECK(s->n_children == a->n_children && s->name != NULL);
    if (strcmp(f, "n") == 0) {
        CHECK(a->n_buffers == 0 && a->n_children == 0 && a->null_count == a->length);
        return;
    }
    CHECK(a->n_buffers >= 1 && a->null_count >= 0 && a->null_count <= a->length);
    if (a->null_count) {
        touch(a->buffers[0], (size_t)(a->length + 7) / 8);
        CHECK(zero_bits(a->buffers[0], a->length) == a->null_count);
    } else {
        CHECK(a->buffers[0] == NULL);
    }
    if (strcmp(f, "l") == 0 || strcmp(f, "f") == 0) {
        CHECK(a->n_buffers == 2 && a->n_children == 0 && a->buffers[1]);
        touch(a->buffers[1], (size_t)a->length * (f[0] == 'l' ? 8 : 4));
    } else if (strcmp(f, "z") == 0) {
        CHECK(a->n_buffers == 3 && a->n_children == 0 && a->buffers[2]);
        touch(a->buffers[2], (size_t)check_arrow_offsets(a->buffers[1], a->length));
    } else if (strcmp(f, "+l") == 0) {
        CHECK(a->n_buffers == 2 && a->n_children == 1 && strcmp(s->children[0]->name, "item") == 0);
        CHECK(check_arrow_offsets(a->buffers[1], a->length) == a->children[0]->length);
        check_arrow(a->children[0], s->children[0]);
    } else {
        long long n = -1;
        CHECK(sscanf(f, "+w:%lld", &n) == 1 && n >= 0);
        CHECK(a->n_buffers == 1 && a->n_children == 1 && a->children[0]->length == a->length * n);
        check_arrow(a->children[0], s->children[0]);
    }
}

/* Two decoded arrays of the same schema hold the same rows: lengths, nulls, offsets, values. */
static void check_same_arrow(const struct ArrowArray *x, const struct ArrowArray *y, const struct ArrowSchema *s) {
    const char *f = s->format;
    CHECK(x->length == y->length && x->null_count == y->null_count && x->n_buffers == y->n_buffers);
    for (int64_t i = 0; i < x->length && x->null_count; i++)
        CHECK(zero_bits(x->buffers[0], i + 1) - zero_bits(x->buffers[0], i) ==
              zero_bits(y->buffers[0], i + 1) - zero_bits(y->buffers[0], i));
    if (strcmp(f, "n") == 0) return;
    if (strcmp(f, "l") == 0 || strcmp(f, "f") == 0) {
        CHECK(memcmp(x->buffers[1], y->buffers[1], (size_t)x->length * (f[0] == 'l' ? 8 : 4)) == 0);
        return;
    }
    if (strcmp(f, "z") == 0 || strcmp(f, "+l") == 0)
        CHECK(memcmp(x->buffers[1], y->buffers[1], (size_t)(x->length + 1) * 4) == 0);
    if (strcmp(f, "z") == 0) {
        int32_t end = rd_i32((const uint8_t *)x->buffers[1] + 4 * x->length);
        CHECK(memcmp(x->buffers[2], y->buffers[2], (size_t)end) == 0);
        return;
    }
    check_same_arrow(x->children[0], y->children[0], s->children[0]);
}

/* The encoder reads the exported batch in place (rt_arrow_ecol, as for a pyarrow batch), and what
 * it writes decodes to the same batch. Skipped where a schema has no such round trip: two columns
 * under one key, or a feature_list column in an Example. */
static void check_reencode(const Cols *tmpl, int rtype, const struct ArrowArray *a, const struct ArrowSchema *s) {
    int n = tmpl->ncols;
    for (int i = 0; i < n; i++) {
        const rt_key *k = &tmpl->names.keys[i];
        if (rt_table_find(&tmpl->names, k->name, k->len, k->section) != i ||
            (rtype == R_EXAMPLE && tmpl->cols[i].shape == S_SEQUENCE))
            return;
    }
    ECol cols[8];
    Buf owned[8][3];
    memset(cols, 0, sizeof(cols));
    memset(owned, 0, sizeof(owned));
    for (int i = 0; i < n; i++) {
        const Col *t = &tmpl->cols[i];
        rt_error e = {0};
        CHECK(rt_arrow_ecol(a->children[i], s->children[i], a->length, t->kind, t->shape, t->fixed_n, &cols[i], owned[i],
                            &e) == RT_OK);
        cols[i].key = tmpl->names.keys[i].name;
        cols[i].key_len = tmpl->names.keys[i].len;
        CHECK(rt_encode_prepare(&cols[i], rtype, n) == RT_OK);
    }
    Buf out = {0}, offs = {0};
    rt_error e = RT_ERROR_INIT;
    CHECK(rt_encode(cols, n, rtype, a->length, &out, &offs, &e) == RT_OK);
    rt_scan sc = {.verify = 1, .final = 1, .limit = out.len};
    CHECK(rt_scan_run(&sc, out.p, out.len) == RT_OK);
    CHECK(sc.nerr_total == 0 && (int64_t)(sc.pos.len / 8) == a->length);
    Cols again;
    CHECK(rt_decode_start(&again, tmpl) == RT_OK);
    rt_records rs = {out.p, out.len, (const int64_t *)sc.pos.p, (const int64_t *)sc.lens.p, a->length};
    CHECK(rt_decode_records(&again, rtype, &rs, &e) == RT_OK);
    struct ArrowArray b;
    CHECK(rt_arrow_export(&again, &b) == RT_OK);
    for (int i = 0; i < n; i++) check_same_arrow(a->children[i], b.children[i], s->children[i]);
    b.release(&b);
    rt_decode_free(&again);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 3; j++) buf_free(&owned[i][j]);
    buf_free(&out);
    buf_free(&offs);
    free(sc.pos.p);
    free(sc.lens.p);
}

/* Assembles cs's batch and schema, checks them, and releases them: all at once, or (move) with
 * the first column moved out and released on its own, as the interface lets a consumer do. */
static void check_export(Cols *cs, const Cols *tmpl, int rtype, const uint8_t *not_null, int move) {
    struct ArrowSchema s;
    struct ArrowArray a;
    CHECK(rt_arrow_schema(cs, not_null, &s) == RT_OK);
    CHECK(rt_arrow_export(cs, &a) == RT_OK);
    CHECK(strcmp(s.format, "+s") == 0 && s.n_children == cs->ncols && s.flags == 0);
    CHECK(a.length == cs->nrecords && a.null_count == 0 && a.n_buffers == 1 && a.buffers[0] == NULL);
    for (int i = 0; i < cs->ncols; i++) {
        const struct ArrowSchema *c = s.children[i];
        const rt_key *k = &cs->names.keys[i];
        size_t len = strlen(c->name);
        CHECK(len <= k->len && memcmp(c->name, k->name, len) == 0 && (len == k->len || k->name[len] == 0));
        CHECK(c->flags == (not_null[i] ? 0 : ARROW_FLAG_NULLABLE));
        CHECK(a.children[i]->length == cs->nrecords && a.children[i]->null_count == cs->cols[i].nulls);
        check_arrow(a.children[i], c);
        /* every buffer its layout uses is the array's now (or, a bitmap without nulls, freed) */
        const Col *col = &cs->cols[i];
        int list = col->shape == S_LIST || col->shape == S_SEQUENCE;
        CHECK(!col->valid.p && (!list || !col->rowoff.p) && (col->shape != S_SEQUENCE || !col->inner.p));
        CHECK((col->kind == K_NULL || !col->vals.p) && (col->kind != K_BYTES || !col->data.p));
    }
    check_reencode(tmpl, rtype, &a, &s);
    if (move && a.n_children) {
        struct ArrowArray col = *a.children[0];
        struct ArrowSchema field = *s.children[0];
        a.children[0]->release = NULL;
        s.children[0]->release = NULL;
        a.release(&a);
        s.release(&s);
        CHECK(col.release && field.release);
        col.release(&col);
        field.release(&field);
        CHECK(!col.release && !field.release);
    } else {
        a.release(&a);
        s.release(&s);
    }
    CHECK(!a.release && !s.release);
}

/* ------------------------------------------------------------------------------------------ */
/* decode: a column spec, then records. Spec: byte ncols (& 7; bit 3: release the batch's first
 * column apart); per column a byte (kind: bits 0-1, shape: bits 2-3, name length: bits 4-7), a byte
 * (fixed_n: bits 0-2; bit 3: not nullable), the name. As the codec does, a
 * feature_list column (shape 3) lives in section 1. */

static int fuzz_decode(const uint8_t *data, size_t size, int rtype) {
    In in = {data, data + size};
    uint8_t head = in_byte(&in);
    int ncols = head & 7;
    Cols tmpl, cs;
    uint8_t not_null[8];
    CHECK(rt_decode_init(&tmpl, ncols) == RT_OK);
    for (int i = 0; i < ncols; i++) {
        uint8_t k = in_byte(&in), f = in_byte(&in);
        const uint8_t *name;
        size_t len = in_take(&in, k >> 4, &name);
        int shape = (k >> 2) & 3;
        rt_status st = rt_decode_add_column(&tmpl, name, len, k & 3, shape, f & 7, shape == S_SEQUENCE);
        CHECK(st == RT_OK || st == RT_BAD_SPEC);
        if (st == RT_OK) not_null[tmpl.ncols - 1] = (f >> 3) & 1;
    }
    /* A call starts from the decoder's columns, as the module's Decoder does for every chunk. */
    CHECK(rt_decode_start(&cs, &tmpl) == RT_OK && cs.ncols == tmpl.ncols);
    Records r;
    records_from(&in, &r);
    rt_records rs = records_view(&r);
    rt_error e = RT_ERROR_INIT;
    rt_status st = rt_decode_records(&cs, rtype, &rs, &e);
    if (st == RT_OK) {
        CHECK(e.status == RT_OK);
        CHECK(cs.nrecords == r.nrec);
        for (int i = 0; i < cs.ncols; i++) check_column(&cs.cols[i], r.nrec);
        check_export(&cs, &tmpl, rtype, not_null, head >> 3);
    } else {
        CHECK(e.status == st);
        CHECK(malformed(st) || st == RT_KIND_MISMATCH || st == RT_COUNT_MISMATCH);
        CHECK(e.record >= 0 && e.record < r.nrec && e.col < cs.ncols);
        CHECK(e.offset >= -1 && e.offset <= r.lens[e.record]);
        if (st == RT_KIND_MISMATCH) CHECK(e.actual != e.expected && e.col >= 0);
    }
    for (int64_t i = 0; i < r.nrec; i++) check_varints(r.buf + r.pos[i] + 12, r.buf + r.pos[i] + 12 + r.lens[i]);
    check_byte_array(&r);
    records_free(&r);
    rt_decode_free(&cs);
    rt_decode_free(&tmpl);
    return 0;
}

static int fuzz_decode_example(const uint8_t *data, size_t size) { return fuzz_decode(data, size, R_EXAMPLE); }
static int fuzz_decode_sequence(const uint8_t *data, size_t size) {
    return fuzz_decode(data, size, R_SEQUENCE_EXAMPLE);
}

/* ------------------------------------------------------------------------------------------ */
/* inspect: byte 0 picks Example or SequenceExample; then records. When inspect succeeds, a     */
/* decode with the schema it implies must succeed too and see the same presence and counts.     */

static int fuzz_inspect(const uint8_t *data, size_t size) {
    In in = {data, data + size};
    int rtype = in_byte(&in) & 1 ? R_SEQUENCE_EXAMPLE : R_EXAMPLE;
    Records r;
    records_from(&in, &r);
    Stats cs = {0};
    rt_records rs = records_view(&r);
    rt_error e = RT_ERROR_INIT;
    rt_status st = rt_inspect_records(&cs, rtype, &rs, &e);
    if (st == RT_OK) {
        CHECK(cs.nrecords == r.nrec);
        Cols ds;
        CHECK(rt_decode_init(&ds, cs.ncols) == RT_OK);
        for (int i = 0; i < cs.ncols; i++) {
            const Stat *c = &cs.cols[i];
            const rt_key *k = &cs.names.keys[i];
            int kind = c->kind == K_NONE ? K_NULL : c->kind;
            CHECK(c->kind == K_NONE ? c->kind_record == -1 : c->kind_record >= 0 && c->kind_record < r.nrec);
            int shape = c->section ? S_SEQUENCE : S_LIST;
            CHECK(rt_decode_add_column(&ds, k->name, k->len, kind, shape, 0, c->section) == RT_OK);
        }
        CHECK(rt_decode_records(&ds, rtype, &rs, &e) == RT_OK);
        for (int i = 0; i < cs.ncols; i++) {
            const Stat *c = &cs.cols[i];
            const Col *d = &ds.cols[i];
            check_column(d, r.nrec);
            CHECK(c->present == r.nrec - d->nulls);
            int64_t lo = INT64_MAX, hi = -1;
            for (int64_t k = 0; k < r.nrec; k++) {
                if (!col_valid(d, k)) continue;
                int64_t n = rd_i32(d->rowoff.p + 4 * (k + 1)) - rd_i32(d->rowoff.p + 4 * k);
                lo = n < lo ? n : lo;
                hi = n > hi ? n : hi;
            }
            CHECK(c->min_count == lo && c->max_count == hi);
        }
        rt_decode_free(&ds);
    } else {
        CHECK(e.status == st);
        CHECK(malformed(st) || st == RT_KIND_MISMATCH);
        CHECK(e.record >= 0 && e.record < r.nrec && e.col < cs.ncols);
        if (st == RT_KIND_MISMATCH) CHECK(e.other_record >= 0 && e.other_record <= e.record);
    }
    records_free(&r);
    rt_inspect_free(&cs);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* encode: Arrow-like buffers built from the input. With byte 0's high bit clear they are valid  */
/* (as codec.encode passes them) and must encode, scan and decode back to the same values. With  */
/* it set, offsets, lengths, row count and bitmap offset come raw from the input: the checks must */
/* reject what does not fit, and whatever they accept must encode to well-framed records.        */

#define MAXCOLS 4

typedef struct {
    ECol e;
    uint8_t name[8];
    uint8_t *valid, *data;
    int64_t *rowoff, *inner, *vals; /* vals: int64 values, or byte offsets into data */
    float *fvals;
} GenCol;

static int64_t gen_int(In *in) {
    uint8_t b = in_byte(in);
    switch (b & 3) {
    case 0: return (int8_t)in_byte(in);
    case 1: return -(int64_t)(in_byte(in) | (uint64_t)in_byte(in) << 8);
    case 2: return (int64_t)(((uint64_t)1 << (b >> 2)) - 1);
    default: return (int64_t)in_u64(in);
    }
}

/* A count or offset: mostly small, sometimes one of the values where 64-bit arithmetic overflows. */
static int64_t raw_count(In *in) {
    static const int64_t big[] = {INT64_MAX, INT64_MAX - 1, (int64_t)1 << 61, ((int64_t)1 << 61) + 1, (int64_t)1 << 62};
    uint8_t b = in_byte(in);
    return b < 0xF0 ? b % 24 : big[(b - 0xF0) % 5];
}

/* Element spans per row: rows own [rowoff[i], rowoff[i+1]) of steps (SEQ) or elements (LIST). */
static void gen_valid_col(In *in, GenCol *g, int rtype, int ci, int64_t nrows) {
    ECol *e = &g->e;
    uint8_t b = in_byte(in);
    e->kind = b & 3;
    e->shape = (b >> 2) % 3 == 2 ? S_SEQUENCE : (b >> 2) % 3;
    if (rtype == R_EXAMPLE && e->shape == S_SEQUENCE) e->shape = S_LIST;
    if (e->kind == K_NULL && e->shape == S_SCALAR) e->shape = S_LIST;
    if (rtype == R_BYTE_ARRAY) e->kind = K_BYTES, e->shape = S_SCALAR;
    g->name[0] = (uint8_t)ci; /* distinct keys: a repeated key would rightly lose its first value */
    const uint8_t *at;
    size_t nl = in_take(in, b >> 5, &at);
    memcpy(g->name + 1, at, nl);
    e->key = g->name;
    e->key_len = 1 + nl;
    e->has_valid = rtype != R_BYTE_ARRAY && (in_byte(in) & 1);
    e->valid_off = e->has_valid ? in_byte(in) & 15 : 0;
    size_t vbytes = (size_t)(e->valid_off + nrows + 7) / 8;
    g->valid = calloc(vbytes ? vbytes : 1, 1);
    for (size_t k = 0; k < vbytes; k++) g->valid[k] = in_byte(in);
    e->valid = (Mem){g->valid, (size_t)vbytes};
    /* rows, then steps, then elements; a leading unused stretch as in a sliced Arrow array */
    int64_t lead = e->shape == S_SCALAR ? 0 : in_byte(in) % 3, nsteps = lead, nelems = 0;
    g->rowoff = malloc(sizeof(int64_t) * (size_t)(nrows + 1));
    g->rowoff[0] = lead;
    for (int64_t i = 0; i < nrows; i++) {
        int64_t n = e->shape == S_SCALAR ? 1 : in_byte(in) % 5;
        if (e->kind == K_NULL && e->shape == S_LIST && ecol_valid(e, i)) n = 0; /* only ever empty */
        g->rowoff[i + 1] = g->rowoff[i] + n;
    }
    if (e->shape == S_SEQUENCE) {
        nsteps = g->rowoff[nrows] + in_byte(in) % 2;
        g->inner = malloc(sizeof(int64_t) * (size_t)(nsteps + 1));
        g->inner[0] = in_byte(in) % 3;
        for (int64_t k = 0; k < nsteps; k++) g->inner[k + 1] = g->inner[k] + (e->kind == K_NULL ? 0 : in_byte(in) % 4);
        nelems = g->inner[nsteps];
        e->inner = (Mem){g->inner, (size_t)(8 * (nsteps + 1))};
        e->has_inner = 1;
    } else {
        nelems = e->shape == S_SCALAR ? nrows : g->rowoff[nrows];
    }
    if (e->shape != S_SCALAR) {
        e->rowoff = (Mem){g->rowoff, (size_t)(8 * (nrows + 1))};
        e->has_rowoff = 1;
    }
    if (e->kind == K_INT64) {
        g->vals = malloc(sizeof(int64_t) * (size_t)(nelems ? nelems : 1));
        for (int64_t k = 0; k < nelems; k++) g->vals[k] = gen_int(in);
        e->vals = (Mem){g->vals, (size_t)(8 * nelems)};
        e->has_vals = 1;
    } else if (e->kind == K_FLOAT) {
        g->fvals = malloc(sizeof(float) * (size_t)(nelems ? nelems : 1));
        for (int64_t k = 0; k < nelems; k++) {
            uint32_t bits = (uint32_t)in_byte(in) << 24 | (uint32_t)in_byte(in) << 16 | in_byte(in);
            memcpy(&g->fvals[k], &bits, 4);
        }
        e->vals = (Mem){g->fvals, (size_t)(4 * nelems)};
        e->has_vals = 1;
    } else if (e->kind == K_BYTES) {
        g->vals = malloc(sizeof(int64_t) * (size_t)(nelems + 1));
        g->vals[0] = 0;
        for (int64_t k = 0; k < nelems; k++) g->vals[k + 1] = g->vals[k] + in_byte(in) % 6;
        g->data = malloc((size_t)g->vals[nelems] + 1);
        for (int64_t k = 0; k < g->vals[nelems]; k++) g->data[k] = in_byte(in);
        e->vals = (Mem){g->vals, (size_t)(8 * (nelems + 1))};
        e->data = (Mem){g->data, (size_t)g->vals[nelems]};
        e->has_vals = e->has_data = 1;
    }
}

static void *gen_raw_buffer(In *in, Mem *m, int *has, int elem) {
    uint8_t b = in_byte(in);
    *has = b & 1;
    size_t n = (size_t)(b >> 1) % 12;
    int64_t *v = malloc(sizeof(int64_t) * (n ? n : 1));
    for (size_t k = 0; k < n; k++) v[k] = elem == 8 ? raw_count(in) - 2 : (int64_t)in_u64(in);
    *m = (Mem){v, (size_t)(n * 8)};
    return v;
}

static void gen_raw_col(In *in, GenCol *g, int ci) {
    ECol *e = &g->e;
    uint8_t b = in_byte(in);
    e->kind = (int)(b & 7) - 1;
    e->shape = (b >> 3) & 3;
    g->name[0] = (uint8_t)ci;
    e->key = g->name;
    e->key_len = 1;
    e->valid_off = raw_count(in) - 2;
    g->valid = gen_raw_buffer(in, &e->valid, &e->has_valid, 1);
    g->rowoff = gen_raw_buffer(in, &e->rowoff, &e->has_rowoff, 8);
    g->inner = gen_raw_buffer(in, &e->inner, &e->has_inner, 8);
    g->vals = gen_raw_buffer(in, &e->vals, &e->has_vals, 8);
    g->data = gen_raw_buffer(in, &e->data, &e->has_data, 1);
}

static void gencol_free(GenCol *g) {
    free(g->valid);
    free(g->data);
    free(g->rowoff);
    free(g->inner);
    free(g->vals);
    free(g->fvals);
}

static void check_same_elems(const ECol *e, int64_t a, int64_t b, const Col *d, int64_t da, int64_t db) {
    CHECK(b - a == db - da);
    for (int64_t k = 0; k < b - a; k++) {
        if (e->kind == K_INT64) {
            CHECK(((const int64_t *)e->vals.buf)[a + k] == rd_i64(d->vals.p + 8 * (da + k)));
        } else if (e->kind == K_FLOAT) {
            CHECK(memcmp((const uint8_t *)e->vals.buf + 4 * (a + k), d->vals.p + 4 * (da + k), 4) == 0);
        } else if (e->kind == K_BYTES) {
            const int64_t *o = e->vals.buf;
            int64_t s = rd_i32(d->vals.p + 4 * (da + k)), len = rd_i32(d->vals.p + 4 * (da + k + 1)) - s;
            CHECK(len == o[a + k + 1] - o[a + k]);
            CHECK(len == 0 || memcmp((const uint8_t *)e->data.buf + o[a + k], d->data.p + s, (size_t)len) == 0);
        }
    }
}

/* Decodes what was encoded and compares every row with the buffers it came from. */
static void check_round_trip(GenCol *g, int ncols, int rtype, int64_t nrows, const Buf *out, const rt_scan *s) {
    if (rtype == R_BYTE_ARRAY) {
        for (int64_t i = 0; i < nrows; i++) {
            const int64_t *o = g[0].e.vals.buf;
            int64_t len = rd_i64(s->lens.p + 8 * i), p = rd_i64(s->pos.p + 8 * i);
            CHECK(len == o[i + 1] - o[i]);
            CHECK(len == 0 || memcmp(out->p + p + 12, (const uint8_t *)g[0].e.data.buf + o[i], (size_t)len) == 0);
        }
        return;
    }
    Cols cs;
    CHECK(rt_decode_init(&cs, ncols) == RT_OK);
    for (int i = 0; i < ncols; i++) {
        const ECol *e = &g[i].e;
        CHECK(rt_decode_add_column(&cs, e->key, e->key_len, e->kind, e->shape, 0, e->shape == S_SEQUENCE) == RT_OK);
    }
    rt_records rs = {out->p, out->len, (const int64_t *)s->pos.p, (const int64_t *)s->lens.p, nrows};
    rt_error e = RT_ERROR_INIT;
    CHECK(rt_decode_records(&cs, rtype, &rs, &e) == RT_OK);
    for (int i = 0; i < ncols; i++) {
        const ECol *e = &g[i].e;
        const Col *d = &cs.cols[i];
        check_column(d, nrows);
        for (int64_t r = 0; r < nrows; r++) {
            CHECK(col_valid(d, r) == ecol_valid(e, r));
            if (!ecol_valid(e, r)) continue;
            int64_t a, b, da = r, db = r + 1;
            row_span(e, r, &a, &b);
            if (e->shape != S_SCALAR) {
                da = rd_i32(d->rowoff.p + 4 * r);
                db = rd_i32(d->rowoff.p + 4 * (r + 1));
            }
            if (e->shape != S_SEQUENCE) {
                check_same_elems(e, a, b, d, da, db);
                continue;
            }
            CHECK(b - a == db - da);
            const int64_t *in = e->inner.buf;
            for (int64_t k = 0; k < b - a; k++) {
                int64_t ia = e->kind == K_NULL ? 0 : in[a + k], ib = e->kind == K_NULL ? 0 : in[a + k + 1];
                check_same_elems(e, ia, ib, d, rd_i32(d->inner.p + 4 * (da + k)), rd_i32(d->inner.p + 4 * (da + k + 1)));
            }
        }
    }
    rt_decode_free(&cs);
}

static int fuzz_encode(const uint8_t *data, size_t size) {
    In in = {data, data + size};
    uint8_t b = in_byte(&in);
    int raw = b >> 7, rtype = (b & 3) % 3, ncols = rtype == R_BYTE_ARRAY ? 1 : (b >> 2) % (MAXCOLS + 1);
    int64_t nrows = raw ? raw_count(&in) : in_byte(&in) % 12;
    GenCol g[MAXCOLS];
    memset(g, 0, sizeof(g));
    int ok = 1;
    for (int i = 0; i < ncols; i++) {
        if (raw) gen_raw_col(&in, &g[i], i);
        else gen_valid_col(&in, &g[i], rtype, i, nrows);
        ok = ok && rt_encode_prepare(&g[i].e, rtype, ncols) == RT_OK;
    }
    CHECK(ok || raw);
    Buf out = {0}, offs = {0};
    rt_error e = RT_ERROR_INIT;
    rt_status st = RT_OK;
    ECol cols[MAXCOLS];
    for (int i = 0; i < ncols; i++) cols[i] = g[i].e;
    if (ok) st = rt_encode(cols, ncols, rtype, nrows, &out, &offs, &e);
    if (ok) CHECK(e.status == st);
    if (ok && st != RT_OK) CHECK(raw && (e.col >= 0 || st == RT_OUT_OF_MEMORY));
    if (ok && st == RT_OK) {
        CHECK(offs.len == (size_t)nrows * 8);
        rt_scan s = {.verify = 1, .final = 1, .limit = out.len};
        CHECK(rt_scan_run(&s, out.p, out.len) == RT_OK);
        CHECK(s.nerr == 0 && s.consumed == out.len && s.pos.len == offs.len);
        CHECK(offs.len == 0 || memcmp(s.pos.p, offs.p, offs.len) == 0);
        check_round_trip(g, ncols, rtype, nrows, &out, &s);
        free(s.pos.p);
        free(s.lens.p);
    }
    free(out.p);
    free(offs.p);
    for (int i = 0; i < ncols; i++) gencol_free(&g[i]);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* pool: each 3 bytes an operation on up to 16 live buffers: byte 0 picks the slot (bits 0-3),   */
/* and takes a buffer of 128 KiB to 8 MiB (bytes 1-2) into an empty one or gives a full one      */
/* back; bit 7 does it on a new thread, which ends right after (its cache goes to the shared one). */
/* At the end a thread that never allocates drops every live buffer and, while it is still alive,  */
/* another thread takes each one the pool kept back: none may be stranded in the dropper's slots.  */

typedef struct {
    uint8_t **p;
    size_t *cap, want;
    int tag;
} PoolOp;

static void pool_op(PoolOp *op) {
    uint8_t *p = *op->p;
    size_t cap = *op->cap;
    if (p) {
        /* every live buffer still holds its own tag: the pool never lent it out twice */
        CHECK(p[0] == (uint8_t)op->tag && p[cap - 1] == (uint8_t)op->tag && p[cap / 2] == (uint8_t)op->tag);
        rt_pool_free(p, cap);
        *op->p = NULL;
    } else {
        p = rt_pool_alloc(op->want, op->cap);
        CHECK(p && *op->cap >= op->want);
        /* the last byte too: ASan reports a capacity the allocation does not have */
        p[0] = p[*op->cap / 2] = p[*op->cap - 1] = (uint8_t)op->tag;
        *op->p = p;
    }
}

static void *pool_thread(void *op) {
    pool_op(op);
    return NULL;
}

enum { POOL_LIVE = 16 };

typedef struct {
    uint8_t **p;
    size_t *cap, kept[POOL_LIVE];
    int nkept;
} PoolDrop;

/* Takes back the buffers the dropper's frees kept, largest first, so that each finds one. */
static void *pool_take_back(void *arg) {
    PoolDrop *d = arg;
    for (int i = 1; i < d->nkept; i++)
        for (int j = i; j > 0 && d->kept[j] > d->kept[j - 1]; j--) {
            size_t t = d->kept[j];
            d->kept[j] = d->kept[j - 1];
            d->kept[j - 1] = t;
        }
    void *got[POOL_LIVE];
    size_t cap[POOL_LIVE];
    for (int i = 0; i < d->nkept; i++) {
        size_t held = rt_pool_held();
        got[i] = rt_pool_alloc(d->kept[i], &cap[i]);
        CHECK(got[i] && cap[i] >= d->kept[i] && rt_pool_held() < held); /* recycled, not malloc'd */
    }
    for (int i = 0; i < d->nkept; i++) rt_pool_free(got[i], cap[i]);
    return NULL;
}

/* Drops every live buffer on a thread that never allocated, and takes the kept ones back on another. */
static void *pool_drop_all(void *arg) {
    PoolDrop *d = arg;
    for (int s = 0; s < POOL_LIVE; s++) {
        if (!d->p[s]) continue;
        size_t held = rt_pool_held();
        rt_pool_free(d->p[s], d->cap[s]);
        if (rt_pool_held() == held + d->cap[s]) d->kept[d->nkept++] = d->cap[s];
    }
    pthread_t t;
    CHECK(pthread_create(&t, NULL, pool_take_back, d) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    return NULL;
}

static int fuzz_pool(const uint8_t *data, size_t size) {
    enum { LIVE = POOL_LIVE };
    uint8_t *p[LIVE] = {0};
    size_t cap[LIVE] = {0};
    for (size_t i = 0; i + 3 <= size; i += 3) {
        int s = data[i] % LIVE;
        PoolOp op = {&p[s], &cap[s], ((size_t)128 << 10) + (size_t)(data[i + 1] << 8 | data[i + 2]) * 126, s};
        pthread_t t;
        if (data[i] & 0x80) {
            CHECK(pthread_create(&t, NULL, pool_thread, &op) == 0);
            CHECK(pthread_join(t, NULL) == 0);
        } else {
            pool_op(&op);
        }
        CHECK(rt_pool_held() <= RT_POOL_BYTES);
    }
    PoolDrop d = {p, cap, {0}, 0};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, pool_drop_all, &d) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(rt_pool_held() <= RT_POOL_BYTES);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* tensor: a declared shape, then a TensorProto read by tensor_parse for every dtype (decode.c's  */
/* tensor columns). Byte 0: the rank (low 3 bits) and bfloat16 widened to float32 (bit 7); then  */
/* one byte per dimension (a dimension that would take the shape past 4096 elements reads as 1).  */

static int tensor_ok(rt_status s) { return s == RT_OK || (s >= RT_TENSOR_MALFORMED && s <= RT_TENSOR_VALUE_RANGE); }

/* Parses the proto [p, p + len) as t with out prefilled by fill: its status, err filled on a failure. */
static rt_status tensor_run(const rt_tensor *t, int64_t n, const uint8_t *p, size_t len, uint8_t *out, uint8_t fill,
                            rt_error *err) {
    memset(out, fill, (size_t)n * (size_t)t->esize);
    *err = (rt_error){.status = RT_OK, .record = -1, .col = -1, .offset = -1, .index = 0};
    Ctx c = {.rec = p, .record = 5, .err = err};
    int rc = tensor_parse(&c, t, n, p, p + len, out, 3);
    CHECK((rc == 0) == (err->status == RT_OK) && (rc == 0 || rc == -1));
    return err->status;
}

static int fuzz_tensor(const uint8_t *data, size_t size) {
    In in = {data, data + size};
    uint8_t head = in_byte(&in);
    rt_tensor t = {.rank = head & 7};
    int64_t n = 1;
    for (int i = 0; i < t.rank; i++) {
        int64_t d = in_byte(&in);
        if (n * d > 4096) d = 1;
        t.dims[i] = d;
        n *= d;
    }
    /* The proto in an allocation of its own size: a read past its end is an ASan report. */
    size_t len = (size_t)(in.end - in.p);
    uint8_t *proto = malloc(len ? len : 1);
    CHECK(proto != NULL);
    if (len) memcpy(proto, in.p, len);
    int64_t matched = 0; /* the dtype (a DT_* code) that parsed, 0 for none */
    for (size_t k = 0; k < sizeof(rt_tensor_dtypes) / sizeof(rt_tensor_dtypes[0]); k++) {
        const rt_tensor_dtype *d = &rt_tensor_dtypes[k];
        t.dtype = d->dtype;
        t.widen = d->dtype == DT_BFLOAT16 && (head & 0x80);
        t.esize = t.widen ? 4 : d->esize;
        size_t bytes = (size_t)n * (size_t)t.esize; /* the row: exactly the shape's elements x their size */
        uint8_t *a = malloc(bytes ? bytes : 1), *b = malloc(bytes ? bytes : 1);
        CHECK(a != NULL && b != NULL);
        rt_error ea, eb;
        rt_status sa = tensor_run(&t, n, proto, len, a, 0xA5, &ea), sb = tensor_run(&t, n, proto, len, b, 0x5A, &eb);
        CHECK(tensor_ok(sa) && sa == sb);
        if (sa == RT_OK) {
            /* Every byte of the row is written (two fills, one result), and only one dtype matches. */
            CHECK(memcmp(a, b, bytes) == 0);
            CHECK(matched == 0 || matched == d->dtype);
            matched = d->dtype;
            for (int64_t i = 0; d->dtype == DT_BOOL && i < n; i++) CHECK(a[i] <= 1);
            for (int64_t i = 0; t.widen && i < n; i++) CHECK(rd32(a + 4 * i) % 65536 == 0);
        } else {
            /* A failure names the record, the column and a byte inside the proto, as the first run did. */
            CHECK(ea.record == 5 && ea.col == 3 && ea.offset >= 0 && (size_t)ea.offset <= len);
            CHECK(ea.offset == eb.offset && ea.actual == eb.actual && ea.expected == eb.expected);
            CHECK(sa != RT_TENSOR_MALFORMED || malformed((rt_status)ea.actual));
            CHECK(sa != RT_TENSOR_DTYPE_MISMATCH || ea.expected == d->dtype);
            CHECK(sa != RT_TENSOR_SHAPE_MISMATCH || (ea.index >= -1 && ea.index < t.rank));
            CHECK(sa != RT_TENSOR_CONTENT_SIZE || ea.expected == n * d->esize);
            CHECK(sa != RT_TENSOR_TOO_MANY_VALUES || (ea.actual > n && ea.expected == n));
        }
        free(a);
        free(b);
    }
    /* What the proto declares (inspect's hint): the dtype and shape a parse above matched, and a shape
     * that its own dtype's parse never refuses for dtype or shape. */
    rt_tensor said;
    int64_t said_n;
    rt_error e = {.status = RT_OK};
    Ctx c = {.rec = proto, .record = 5, .err = &e};
    int rc = tensor_describe(&c, &said, &said_n, proto, proto + len, 3);
    CHECK(rc == 0 ? e.status == RT_OK : rc == -1 && tensor_ok(e.status) && e.status != RT_OK);
    CHECK(rc == 0 || (e.offset >= 0 && (size_t)e.offset <= len));
    if (matched) {
        CHECK(rc == 0 && said.dtype == matched && said.rank == t.rank && said_n == n);
        CHECK(memcmp(said.dims, t.dims, sizeof(int64_t) * (size_t)t.rank) == 0);
    }
    if (rc == 0) {
        CHECK(said_n >= 0 && said_n <= INT32_MAX && said.rank <= RT_TENSOR_MAX_RANK && rt_tensor_dtype_of(said.dtype));
        size_t bytes = (size_t)said_n * (size_t)said.esize;
        uint8_t *out = bytes <= (1u << 20) ? malloc(bytes ? bytes : 1) : NULL;
        if (out) {
            rt_status s = tensor_run(&said, said_n, proto, len, out, 0, &e);
            CHECK(s != RT_TENSOR_DTYPE_MISMATCH && s != RT_TENSOR_SHAPE_MISMATCH);
            free(out);
        }
    }
    free(proto);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */

#ifdef RT_HAVE_JPEG
/* Five bytes of window (scale and channels, y, x, h - 1, w - 1: small, so most windows fit the seeds'
 * images), then the JPEG. Whatever the bytes, the decode returns one of its statuses and a message. */
static int fuzz_jpeg(const uint8_t *data, size_t size) {
    if (size < 5) return 0;
    int denom = 1 << (data[0] & 3), channels = data[0] & 4 ? 1 : 3;
    int y = data[1] & 63, x = data[2] & 63, h = (data[3] & 63) + 1, w = (data[4] & 63) + 1;
    size_t len = (size_t)h * (size_t)w * (size_t)channels;
    uint8_t *out = malloc(len);
    CHECK(out != NULL);
    char message[RT_JPEG_MESSAGE];
    rt_status s = rt_jpeg_decode_window(data + 5, size - 5, denom, channels, y, x, h, w, out, len, message);
    CHECK(s == RT_OK || s == RT_JPEG_CORRUPT || s == RT_JPEG_UNSUPPORTED || s == RT_JPEG_BAD_WINDOW ||
          s == RT_OUT_OF_MEMORY);
    CHECK(memchr(message, 0, RT_JPEG_MESSAGE) != NULL);
    CHECK(s != RT_JPEG_BAD_WINDOW || message[0] == 0);
    free(out);
    /* Arguments that can never fit are refused before any byte of the JPEG is read. */
    CHECK(rt_jpeg_decode_window(data + 5, size - 5, 3, 3, 0, 0, 1, 1, out, 3, message) == RT_JPEG_BAD_WINDOW);
    CHECK(rt_jpeg_decode_window(data + 5, size - 5, 1, 3, 0, 0, 1, 1, out, 4, message) == RT_JPEG_BAD_WINDOW);
    return 0;
}
#endif

/* ------------------------------------------------------------------------------------------ */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    rt_crc_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return FUZZ_TARGET(data, size); }
