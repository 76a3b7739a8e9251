/*
 * Native TFRecord core: framing scan with CRC32C, Example/SequenceExample decode into
 * Arrow-layout buffers, feature statistics for schema inference, and encode.
 *
 * Every length read from input is checked against the bytes that remain before it is used,
 * nothing is allocated from an untrusted length, and the long loops run without the GIL.
 * Output buffers are handed to Python as zero-copy buffer objects (pa.py_buffer wraps them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ray_tfrecord's native codec assumes a little-endian host (TFRecord and protobuf are little-endian)"
#endif

/* ------------------------------------------------------------------------------------------ */
/* CRC32C                                                                                      */

static uint32_t crc_table[8][256];

static void crc_init_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32c_sw(uint32_t c, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= c;
        c = crc_table[7][v & 0xFF] ^ crc_table[6][(v >> 8) & 0xFF] ^ crc_table[5][(v >> 16) & 0xFF] ^
            crc_table[4][(v >> 24) & 0xFF] ^ crc_table[3][(v >> 32) & 0xFF] ^
            crc_table[2][(v >> 40) & 0xFF] ^ crc_table[1][(v >> 48) & 0xFF] ^ crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t c, const uint8_t *p, size_t n) {
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--) c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

static uint32_t (*crc32c_update)(uint32_t, const uint8_t *, size_t) = crc32c_sw;

static void crc_init(void) {
    crc_init_table();
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) crc32c_update = crc32c_hw;
#endif
}

static inline uint32_t masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = crc32c_update(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* ------------------------------------------------------------------------------------------ */
/* Buffers: growable while decoding, then handed to Python without a copy                     */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

/* Afterwards b->p is never NULL, so callers may form b->p + b->len even to write nothing. */
static int buf_reserve(Buf *b, size_t extra) {
    if (extra <= b->cap - b->len && b->p) return 0;
    if (extra > SIZE_MAX / 4 - b->len) return -1;
    size_t want = b->len + extra, cap = b->cap ? b->cap : 256;
    while (cap < want) cap *= 2;
    uint8_t *np = realloc(b->p, cap);
    if (!np) return -1;
    b->p = np;
    b->cap = cap;
    return 0;
}

typedef struct {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t size;
} NativeBuffer;

static void nb_dealloc(NativeBuffer *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int nb_getbuffer(NativeBuffer *self, Py_buffer *view, int flags) {
    static uint8_t empty;
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : &empty, self->size, 1, flags);
}

static Py_ssize_t nb_len(NativeBuffer *self) { return self->size; }

static PyBufferProcs nb_as_buffer = {(getbufferproc)nb_getbuffer, NULL};
static PySequenceMethods nb_as_seq = {.sq_length = (lenfunc)nb_len};

static PyTypeObject NativeBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ray_tfrecord._native.Buffer",
    .tp_basicsize = sizeof(NativeBuffer),
    .tp_dealloc = (destructor)nb_dealloc,
    .tp_as_buffer = &nb_as_buffer,
    .tp_as_sequence = &nb_as_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only memory owned by the native codec (supports the buffer protocol).",
};

/* Takes ownership of b's memory; b is left empty. */
static PyObject *buf_to_py(Buf *b) {
    NativeBuffer *o = PyObject_New(NativeBuffer, &NativeBufferType);
    if (!o) return NULL;
    o->data = b->p;
    o->size = (Py_ssize_t)b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors: the core records what went wrong and where; Python turns it into a message that    */
/* names the file, byte offset and column.                                                    */

static PyObject *CodecError;

enum {
    E_OK = 0,
    E_MALFORMED = 1, /* protobuf wire-format violation */
    E_KIND = 2,      /* feature kind differs from the column's kind */
    E_COUNT = 3,     /* scalar / fixed-size column got the wrong number of values */
    E_TOO_LARGE = 4, /* a batch exceeds 32-bit Arrow offsets */
    E_NOMEM = 5,
    E_BAD_INPUT = 6, /* inconsistent buffers handed to encode */
};

typedef struct {
    int code;
    int64_t record; /* record index within the call, -1 if none */
    int col;        /* column index, -1 if none */
    int64_t where;  /* byte offset within the record */
    int64_t a, b;
    const char *what;
} Err;

static PyObject *raise_err(const Err *e, PyObject *colname) {
    PyObject *args = Py_BuildValue("(iLOLLLs)", e->code, (long long)e->record, colname ? colname : Py_None,
                                   (long long)e->where, (long long)e->a, (long long)e->b, e->what ? e->what : "");
    if (args) {
        PyErr_SetObject(CodecError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Framing scan                                                                                */

enum { F_TRUNC_HEADER = 1, F_TRUNC_DATA = 2, F_BAD_LEN_CRC = 3, F_BAD_DATA_CRC = 4 };

typedef struct {
    int64_t pos;
    int code;
    int64_t a, b;
} FrameErr;

/* Whether a record can start at q: its length CRC holds and its data CRC holds. 1 yes, 0 no, 2 not
 * known yet because the data has not all arrived (*need: the candidate's full framed size). A
 * candidate is never accepted unseen: an 8-byte payload followed by its CRC passes the length check
 * by construction, so only the data CRC tells such a false boundary apart. */
static int plausible_boundary(const uint8_t *buf, size_t n, size_t q, int final, size_t *need) {
    if (n - q < 12) return 0;
    if (masked_crc(buf + q, 8) != rd32(buf + q + 8)) return 0;
    uint64_t len = rd64(buf + q);
    if (len > n - q - 12 || n - q - 12 - len < 4) {
        if (final) return 0;
        *need = len > SIZE_MAX - 16 ? SIZE_MAX : (size_t)len + 16;
        return 2;
    }
    return masked_crc(buf + q + 12, (size_t)len) == rd32(buf + q + 12 + len);
}

typedef struct {
    int verify, final, skip, resync; /* in: the options of scan() */
    size_t limit;                    /* in: no record may start at or after this offset */
    Buf pos, lens;                   /* out: record header offsets and payload lengths (int64) */
    FrameErr errs[64];               /* out: the first defects found */
    int nerr, oom, resyncing;
    int64_t nerr_total;
    size_t consumed, need;
} Scan;

/* The framing scan over buf[0, n): pure C, so the fuzz harness can call it without Python. */
static void scan_core(Scan *s, const uint8_t *buf, size_t n) {
    const int final = s->final, skip = s->skip;
    const size_t lim = s->limit;
    FrameErr *errs = s->errs;
    int nerr = 0;
    int64_t nerr_total = 0;
    size_t p = 0, need = 0;
    int resyncing = s->resync, oom = 0;
    while (p < n && p < lim) {
        if (resyncing) {
            size_t q = p;
            int verdict = 0;
            for (; q < n && q < lim; q++) {
                if (n - q < 12 && !final) break;
                verdict = plausible_boundary(buf, n, q, final, &need);
                if (verdict) break;
            }
            if (verdict != 1) {
                /* Wait for more input, still resynchronising: from the candidate whose data is
                 * missing, or from the tail that could still start a record. */
                if (verdict == 0) need = 0;
                p = final && verdict == 0 ? (n < lim ? n : lim) : q;
                break;
            }
            p = q;
            resyncing = 0;
        }
        if (n - p < 12) {
            if (!final) {
                need = 12;
                break;
            }
            if (nerr < 64) errs[nerr++] = (FrameErr){(int64_t)p, F_TRUNC_HEADER, (int64_t)(n - p), 0};
            nerr_total++;
            p = n;
            break;
        }
        uint64_t len = rd64(buf + p);
        if (masked_crc(buf + p, 8) != rd32(buf + p + 8)) {
            if (nerr < 64) errs[nerr++] = (FrameErr){(int64_t)p, F_BAD_LEN_CRC, 0, 0};
            nerr_total++;
            if (!skip) break;
            p += 1;
            resyncing = 1;
            continue;
        }
        size_t avail = n - p - 12;
        if (len > avail || avail - len < 4) {
            if (!final) {
                need = len > SIZE_MAX - 16 ? SIZE_MAX : (size_t)len + 16;
                break;
            }
            if (nerr < 64) errs[nerr++] = (FrameErr){(int64_t)p, F_TRUNC_DATA, (int64_t)(len > INT64_MAX ? INT64_MAX : len), (int64_t)avail};
            nerr_total++;
            if (!skip) break;
            p += 1;
            resyncing = 1;
            continue;
        }
        if (s->verify && masked_crc(buf + p + 12, (size_t)len) != rd32(buf + p + 12 + len)) {
            if (nerr < 64) errs[nerr++] = (FrameErr){(int64_t)p, F_BAD_DATA_CRC, (int64_t)len, 0};
            nerr_total++;
            if (!skip) break;
            /* The length CRC held, so the length is trustworthy: drop exactly this record. */
            p += 16 + (size_t)len;
            continue;
        }
        if (buf_reserve(&s->pos, 8) || buf_reserve(&s->lens, 8)) {
            oom = 1;
            break;
        }
        int64_t ip = (int64_t)p, il = (int64_t)len;
        memcpy(s->pos.p + s->pos.len, &ip, 8);
        memcpy(s->lens.p + s->lens.len, &il, 8);
        s->pos.len += 8;
        s->lens.len += 8;
        p += 16 + (size_t)len;
    }
    s->nerr = nerr;
    s->nerr_total = nerr_total;
    s->consumed = p;
    s->need = need;
    s->resyncing = resyncing;
    s->oom = oom;
}

static PyObject *py_scan(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "verify", "final", "skip", "limit", "resync", NULL};
    Py_buffer view;
    Scan s = {.verify = 1, .final = 1};
    long long limit = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|pppLp", kwlist, &view, &s.verify, &s.final, &s.skip, &limit,
                                     &s.resync))
        return NULL;
    s.limit = limit < 0 ? (size_t)view.len : (size_t)limit;

    Py_BEGIN_ALLOW_THREADS
    scan_core(&s, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&view);
    if (s.oom) {
        free(s.pos.p);
        free(s.lens.p);
        return PyErr_NoMemory();
    }
    PyObject *errlist = PyList_New(s.nerr);
    if (!errlist) goto fail;
    for (int i = 0; i < s.nerr; i++) {
        const FrameErr *e = &s.errs[i];
        PyObject *t = Py_BuildValue("(iLLL)", e->code, (long long)e->pos, (long long)e->a, (long long)e->b);
        if (!t) {
            Py_DECREF(errlist);
            goto fail;
        }
        PyList_SET_ITEM(errlist, i, t);
    }
    PyObject *po = buf_to_py(&s.pos), *lo = buf_to_py(&s.lens);
    if (!po || !lo) {
        Py_XDECREF(po);
        Py_XDECREF(lo);
        Py_DECREF(errlist);
        return NULL;
    }
    return Py_BuildValue("(NNnNLnO)", po, lo, (Py_ssize_t)s.consumed, errlist, (long long)s.nerr_total,
                         (Py_ssize_t)(s.need > (size_t)PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : s.need),
                         s.resyncing ? Py_True : Py_False);
fail:
    free(s.pos.p);
    free(s.lens.p);
    return NULL;
}

static PyObject *py_masked_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS
    c = masked_crc(v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Protobuf wire reading                                                                       */

/* Returns 0 and advances *pp, or -1 on a varint that runs past end or beyond 10 bytes. */
static inline int rd_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) {
        *out = *p;
        *pp = p + 1;
        return 0;
    }
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return -1;
        uint8_t b = *p++;
        if (shift == 63 && b > 1) return -1;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = v;
            *pp = p;
            return 0;
        }
    }
    return -1;
}

enum { K_BYTES = 0, K_FLOAT = 1, K_INT64 = 2, K_NULL = 3, K_NONE = -1 };
enum { S_SCALAR = 0, S_LIST = 1, S_FIXED = 2, S_SEQ = 3 };

typedef struct {
    const uint8_t *rec;     /* start of the current record, for error offsets */
    int64_t record;
    Err err;
} Ctx;

static int fail_at(Ctx *c, int code, const uint8_t *at, int col, const char *what) {
    c->err.code = code;
    c->err.record = c->record;
    c->err.col = col;
    c->err.where = at ? (int64_t)(at - c->rec) : -1;
    c->err.what = what;
    return -1;
}

/* Reads a field header and, for length-delimited fields, checks the length against end. */
static inline int rd_field(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t *field, int *wt,
                           const uint8_t **vstart, const uint8_t **vend, int col) {
    const uint8_t *at = *pp;
    uint64_t tag, len;
    *field = 0;
    *wt = -1;
    *vstart = *vend = at;
    if (rd_varint(pp, end, &tag)) return fail_at(c, E_MALFORMED, at, col, "field tag varint runs past its message");
    *field = (uint32_t)(tag >> 3);
    *wt = (int)(tag & 7);
    if (*field == 0 || tag > 0xFFFFFFFFu) return fail_at(c, E_MALFORMED, at, col, "invalid field number");
    const uint8_t *p = *pp;
    switch (*wt) {
    case 0:
        *vstart = p;
        if (rd_varint(&p, end, &len)) return fail_at(c, E_MALFORMED, at, col, "varint runs past its message");
        break;
    case 1:
        if (end - p < 8) return fail_at(c, E_MALFORMED, at, col, "fixed64 field runs past its message");
        *vstart = p;
        p += 8;
        break;
    case 5:
        if (end - p < 4) return fail_at(c, E_MALFORMED, at, col, "fixed32 field runs past its message");
        *vstart = p;
        p += 4;
        break;
    case 2:
        if (rd_varint(&p, end, &len)) return fail_at(c, E_MALFORMED, at, col, "length varint runs past its message");
        if (len > (uint64_t)(end - p)) return fail_at(c, E_MALFORMED, at, col, "length-delimited field overruns its parent message");
        *vstart = p;
        p += len;
        break;
    default:
        return fail_at(c, E_MALFORMED, at, col, "unsupported wire type (groups or invalid)");
    }
    *vend = p;
    *pp = p;
    return 0;
}

/* The common case of rd_field: the expected length-delimited tag with a 1- or 2-byte length.
 * Returns 1 and advances on a match; 0 (nothing consumed) sends the caller to rd_field. */
static inline int ld_fast(const uint8_t **pp, const uint8_t *end, uint8_t tag, const uint8_t **vs, const uint8_t **ve) {
    const uint8_t *p = *pp;
    if (end - p < 3 || p[0] != tag) return 0;
    size_t len = p[1], hdr = 2;
    if (len & 0x80) {
        if (p[2] & 0x80) return 0;
        len = (len & 0x7F) | ((size_t)p[2] << 7);
        hdr = 3;
    }
    if (len > (size_t)(end - p) - hdr) return 0;
    *vs = p + hdr;
    *ve = p + hdr + len;
    *pp = *ve;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Columns                                                                                     */

typedef struct {
    const uint8_t *name;
    Py_ssize_t name_len;
    int kind, shape, section;
    int64_t fixed_n;
    Buf valid, rowoff, inner, vals, data;
    int64_t nrows, nulls, nvals, ninner;
    int64_t row_vals, row_inner, row_data;
    int64_t seen;
    /* statistics for schema inference */
    int64_t present, min_count, max_count, min_inner, max_inner, kind_record;
} Col;

#define PRED 64 /* map entries per record whose column is predicted from the previous record */

typedef struct {
    const uint8_t *key;
    Py_ssize_t len;
    int col;
} Pred;

typedef struct {
    Col *cols;
    int ncols, cap;
    Pred pred[2][PRED];
    int32_t *table; /* open addressing over cols, -1 empty; per section via hash salt */
    uint32_t tmask;
    int inspect; /* collect statistics, create columns on first sight, store no values */
    int64_t nrecords;
} Cols;

static uint64_t hash_key(const uint8_t *k, Py_ssize_t n, int section) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)section;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ULL;
    return h;
}

static int table_build(Cols *cs) {
    uint32_t size = 16;
    while (size < (uint32_t)cs->ncols * 2 + 2) size *= 2;
    int32_t *t = malloc(sizeof(int32_t) * size);
    if (!t) return -1;
    for (uint32_t i = 0; i < size; i++) t[i] = -1;
    for (int i = 0; i < cs->ncols; i++) {
        uint32_t h = (uint32_t)hash_key(cs->cols[i].name, cs->cols[i].name_len, cs->cols[i].section) & (size - 1);
        while (t[h] >= 0) h = (h + 1) & (size - 1);
        t[h] = i;
    }
    free(cs->table);
    cs->table = t;
    cs->tmask = size - 1;
    return 0;
}

static inline int key_eq(const uint8_t *a, const uint8_t *b, Py_ssize_t n) {
    for (; n >= 8; n -= 8, a += 8, b += 8)
        if (rd64(a) != rd64(b)) return 0;
    while (n--)
        if (*a++ != *b++) return 0;
    return 1;
}

static int find_col(Cols *cs, const uint8_t *k, Py_ssize_t n, int section) {
    uint32_t h = (uint32_t)hash_key(k, n, section) & cs->tmask;
    for (;;) {
        int32_t i = cs->table[h];
        if (i < 0) return -1;
        Col *c = &cs->cols[i];
        if (c->section == section && c->name_len == n && key_eq(c->name, k, n)) return i;
        h = (h + 1) & cs->tmask;
    }
}

static int col_init_buffers(Col *c) {
    int32_t zero = 0;
    if (c->kind == K_BYTES) {
        if (buf_reserve(&c->vals, 4)) return -1;
        memcpy(c->vals.p, &zero, 4);
        c->vals.len = 4;
    }
    if (c->shape == S_LIST || c->shape == S_SEQ) {
        if (buf_reserve(&c->rowoff, 4)) return -1;
        memcpy(c->rowoff.p, &zero, 4);
        c->rowoff.len = 4;
    }
    if (c->shape == S_SEQ) {
        if (buf_reserve(&c->inner, 4)) return -1;
        memcpy(c->inner.p, &zero, 4);
        c->inner.len = 4;
    }
    c->seen = -1;
    c->kind_record = -1;
    c->min_count = c->min_inner = INT64_MAX;
    c->max_count = c->max_inner = -1;
    return 0;
}

/* Sets up a decode column from its spec (name, kind, shape, fixed_n, section).
 * Returns 0, -1 for a spec decode cannot honour, -2 when out of memory. */
static int col_setup(Col *c, const uint8_t *name, Py_ssize_t name_len, int kind, int shape, int64_t fixed_n, int section) {
    if (kind < K_BYTES || kind > K_NULL || shape < S_SCALAR || shape > S_SEQ || fixed_n < 0 ||
        (kind == K_NULL && shape != S_LIST && shape != S_SEQ))
        return -1;
    c->name = name;
    c->name_len = name_len;
    c->kind = kind;
    c->shape = shape;
    c->fixed_n = fixed_n;
    c->section = section;
    return col_init_buffers(c) ? -2 : 0;
}

/* Inspect mode: a feature seen for the first time becomes a column. */
static int add_col(Cols *cs, const uint8_t *k, Py_ssize_t n, int section) {
    if (cs->ncols == cs->cap) {
        int cap = cs->cap ? cs->cap * 2 : 32;
        Col *nc = realloc(cs->cols, sizeof(Col) * (size_t)cap);
        if (!nc) return -1;
        cs->cols = nc;
        cs->cap = cap;
    }
    Col *c = &cs->cols[cs->ncols];
    memset(c, 0, sizeof(Col));
    c->name = k;
    c->name_len = n;
    c->section = section;
    c->kind = K_NONE;
    c->shape = section ? S_SEQ : S_LIST;
    col_init_buffers(c);
    cs->ncols++;
    if ((uint32_t)cs->ncols * 2 + 2 > cs->tmask + 1) return table_build(cs) ? -1 : cs->ncols - 1;
    uint32_t h = (uint32_t)hash_key(k, n, section) & cs->tmask;
    while (cs->table[h] >= 0) h = (h + 1) & cs->tmask;
    cs->table[h] = cs->ncols - 1;
    return cs->ncols - 1;
}

static void cols_free(Cols *cs) {
    for (int i = 0; i < cs->ncols; i++) {
        Col *c = &cs->cols[i];
        free(c->valid.p);
        free(c->rowoff.p);
        free(c->inner.p);
        free(c->vals.p);
        free(c->data.p);
    }
    free(cs->cols);
    free(cs->table);
}

static size_t elem_size(int kind) { return kind == K_INT64 ? 8 : kind == K_FLOAT ? 4 : 0; }

/* Undo what a column took from the current record (a repeated map key: the last one wins). */
static void col_rollback(Col *c) {
    c->nvals = c->row_vals;
    c->ninner = c->row_inner;
    c->data.len = (size_t)c->row_data;
    c->vals.len = c->kind == K_BYTES ? (size_t)(c->row_vals + 1) * 4 : (size_t)c->row_vals * elem_size(c->kind);
    if (c->shape == S_SEQ) c->inner.len = (size_t)(c->row_inner + 1) * 4;
}

/* Determines a Feature's kind the way protobuf's oneof does (a later member replaces an earlier
 * one, a repeat of the same member merges into it) and where the surviving run of fields begins. */
static int feature_kind(Ctx *c, const uint8_t *p, const uint8_t *end, int col, int *kind, const uint8_t **run) {
    *kind = K_NONE;
    *run = p;
    while (p < end) {
        const uint8_t *at = p, *vs, *ve;
        uint32_t f;
        int wt;
        if (rd_field(c, &p, end, &f, &wt, &vs, &ve, col)) return -1;
        if (wt == 2 && f >= 1 && f <= 3) {
            int k = f == 1 ? K_BYTES : f == 2 ? K_FLOAT : K_INT64;
            if (k != *kind) {
                *kind = k;
                *run = at;
            }
        }
    }
    return 0;
}

/* Decodes the varints of [p, end) into out (counting only when out is NULL). A byte-at-a-time
 * loop mispredicts on every other value of random small data (pixels, ids) and chains each load
 * on the previous length; instead one 8-byte load yields every varint that ends inside it (its
 * terminators are the bytes with the high bit clear), so the chain is per word, not per value. */
static inline uint64_t compact7(uint64_t x) {
    x &= 0x7F7F7F7F7F7F7F7FULL;
    x = ((x & 0x7F007F007F007F00ULL) >> 1) | (x & 0x007F007F007F007FULL);
    x = ((x & 0x3FFF00003FFF0000ULL) >> 2) | (x & 0x00003FFF00003FFFULL);
    return ((x & 0x0FFFFFFF00000000ULL) >> 4) | (x & 0x000000000FFFFFFFULL);
}

static int packed_varints(const uint8_t *p, const uint8_t *end, int64_t *out, int64_t *count) {
    int64_t k = 0;
    while (p < end) {
        if (end - p >= 8) {
            uint64_t w = rd64(p);
            uint64_t m = ~w & 0x8080808080808080ULL;
            if (m) {
                int start = 0;
                do {
                    int last = __builtin_ctzll(m) >> 3, nbytes = last - start + 1;
                    uint64_t x = w >> (8 * start);
                    if (nbytes < 8) x &= (1ULL << (8 * nbytes)) - 1;
                    if (out) out[k] = (int64_t)compact7(x);
                    k++;
                    start = last + 1;
                    m &= m - 1;
                } while (m);
                p += start;
                continue;
            }
            /* 9 or 10 bytes: a negative int64, or one of 2^56 and up */
            if (end - p >= 10 && (!(p[8] & 0x80) || (p[8] & 0x80 && p[9] <= 1))) {
                uint64_t v = compact7(w) | ((uint64_t)(p[8] & 0x7F) << 56);
                if (p[8] & 0x80) v |= (uint64_t)p[9] << 63;
                if (out) out[k] = (int64_t)v;
                k++;
                p += (p[8] & 0x80) ? 10 : 9;
                continue;
            }
        }
        uint64_t v;
        if (rd_varint(&p, end, &v)) return -1;
        if (out) out[k] = (int64_t)v;
        k++;
    }
    *count = k;
    return 0;
}

/* Appends (or, in inspect mode, counts) the values of one list message of the given kind. */
static int list_values(Ctx *c, Col *col, int ci, int kind, const uint8_t *p, const uint8_t *end, int store, int64_t *count) {
    while (p < end) {
        const uint8_t *vs, *ve, *at = p;
        uint32_t f = 1;
        int wt = 2;
        if (!ld_fast(&p, end, 0x0A, &vs, &ve)) {
            if (rd_field(c, &p, end, &f, &wt, &vs, &ve, ci)) return -1;
            if (f != 1) continue;
        }
        if (kind == K_INT64) {
            if (wt == 2) {
                if (store && buf_reserve(&col->vals, (size_t)(ve - vs) * 8)) return fail_at(c, E_NOMEM, at, ci, "out of memory");
                int64_t *out = store ? (int64_t *)(col->vals.p + col->vals.len) : NULL;
                int64_t k = 0;
                if (packed_varints(vs, ve, out, &k)) return fail_at(c, E_MALFORMED, vs, ci, "packed int64 varint runs past its list");
                if (store) col->vals.len += (size_t)k * 8;
                *count += k;
            } else if (wt == 0) {
                uint64_t v = 0;
                const uint8_t *q = vs;
                rd_varint(&q, ve, &v);
                if (store) {
                    if (buf_reserve(&col->vals, 8)) return fail_at(c, E_NOMEM, at, ci, "out of memory");
                    int64_t sv = (int64_t)v;
                    memcpy(col->vals.p + col->vals.len, &sv, 8);
                    col->vals.len += 8;
                }
                *count += 1;
            }
        } else if (kind == K_FLOAT) {
            if (wt == 2) {
                size_t nb = (size_t)(ve - vs);
                if (nb % 4) return fail_at(c, E_MALFORMED, at, ci, "packed float list length is not a multiple of 4");
                if (store) {
                    if (buf_reserve(&col->vals, nb)) return fail_at(c, E_NOMEM, at, ci, "out of memory");
                    memcpy(col->vals.p + col->vals.len, vs, nb);
                    col->vals.len += nb;
                }
                *count += (int64_t)(nb / 4);
            } else if (wt == 5) {
                if (store) {
                    if (buf_reserve(&col->vals, 4)) return fail_at(c, E_NOMEM, at, ci, "out of memory");
                    memcpy(col->vals.p + col->vals.len, vs, 4);
                    col->vals.len += 4;
                }
                *count += 1;
            }
        } else if (wt == 2) { /* bytes */
            if (store) {
                size_t nb = (size_t)(ve - vs);
                if (col->data.len + nb > INT32_MAX) return fail_at(c, E_TOO_LARGE, at, ci, "bytes values exceed 2 GiB in one batch");
                if (buf_reserve(&col->data, nb) || buf_reserve(&col->vals, 4)) return fail_at(c, E_NOMEM, at, ci, "out of memory");
                memcpy(col->data.p + col->data.len, vs, nb);
                col->data.len += nb;
                int32_t off = (int32_t)col->data.len;
                memcpy(col->vals.p + col->vals.len, &off, 4);
                col->vals.len += 4;
            }
            *count += 1;
        }
    }
    return 0;
}

/* One Feature message into column ci; returns the number of values through *count. */
static int feature_values(Ctx *c, Cols *cs, int ci, const uint8_t *p, const uint8_t *end, int64_t *count) {
    Col *col = &cs->cols[ci];
    int kind;
    const uint8_t *run, *only = NULL, *only_end = NULL;
    {
        /* The usual Feature is a single kind field: decode it without a second pass. */
        const uint8_t *q = p, *vs, *ve;
        uint32_t f;
        int wt;
        if (end - p >= 3 && p[0] >= 0x0A && p[0] <= 0x1A && (p[0] & 7) == 2 && ld_fast(&q, end, p[0], &vs, &ve) && q == end) {
            kind = p[0] == 0x0A ? K_BYTES : p[0] == 0x12 ? K_FLOAT : K_INT64;
            run = p;
            only = vs;
            only_end = ve;
        } else if (q = p, p < end && rd_field(c, &q, end, &f, &wt, &vs, &ve, ci) == 0 && q == end && wt == 2 && f >= 1 && f <= 3) {
            kind = f == 1 ? K_BYTES : f == 2 ? K_FLOAT : K_INT64;
            run = p;
            only = vs;
            only_end = ve;
        } else if (feature_kind(c, p, end, ci, &kind, &run)) {
            return -1;
        }
    }
    *count = 0;
    if (kind == K_NONE) return 0;
    if (cs->inspect) {
        if (col->kind == K_NONE) {
            col->kind = kind;
            col->kind_record = c->record;
        } else if (col->kind != kind) {
            c->err.a = kind;
            c->err.b = col->kind;
            c->err.code = E_KIND;
            c->err.record = c->record;
            c->err.col = ci;
            c->err.where = col->kind_record; /* the record where the other kind was seen */
            c->err.what = "";
            return -1;
        }
    } else if (kind != col->kind) {
        c->err.a = kind;
        c->err.b = col->kind;
        return fail_at(c, E_KIND, p, ci, "");
    }
    if (only) {
        if (list_values(c, col, ci, kind, only, only_end, !cs->inspect, count)) return -1;
    } else {
        const uint8_t *q = run;
        while (q < end) {
            const uint8_t *vs, *ve;
            uint32_t f;
            int wt;
            rd_field(c, &q, end, &f, &wt, &vs, &ve, ci); /* validated by feature_kind */
            if (wt == 2 && (int)f == (kind == K_BYTES ? 1 : kind == K_FLOAT ? 2 : 3))
                if (list_values(c, col, ci, kind, vs, ve, !cs->inspect, count)) return -1;
        }
    }
    col->nvals += *count;
    if (!cs->inspect && col->kind == K_BYTES && col->nvals > INT32_MAX)
        return fail_at(c, E_TOO_LARGE, p, ci, "more than 2^31 values in one batch");
    return 0;
}

static int push_i32(Ctx *c, Buf *b, int64_t v, int ci) {
    if (v > INT32_MAX) return fail_at(c, E_TOO_LARGE, NULL, ci, "more than 2^31 values in one batch");
    if (buf_reserve(b, 4)) return fail_at(c, E_NOMEM, NULL, ci, "out of memory");
    int32_t x = (int32_t)v;
    memcpy(b->p + b->len, &x, 4);
    b->len += 4;
    return 0;
}

/* A FeatureList (SequenceExample feature_lists value) into a list<list<T>> column. */
static int feature_list_values(Ctx *c, Cols *cs, int ci, const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        const uint8_t *vs, *ve;
        uint32_t f;
        int wt;
        if (rd_field(c, &p, end, &f, &wt, &vs, &ve, ci)) return -1;
        if (f != 1 || wt != 2) continue;
        int64_t n;
        if (feature_values(c, cs, ci, vs, ve, &n)) return -1;
        Col *col = &cs->cols[ci];
        col->ninner++;
        if (cs->inspect) {
            if (n < col->min_inner) col->min_inner = n;
            if (n > col->max_inner) col->max_inner = n;
        } else if (push_i32(c, &col->inner, col->nvals, ci)) {
            return -1;
        }
    }
    return 0;
}

/* A Features or FeatureLists map: entries of (key = 1, value = 2). */
static int parse_map(Ctx *c, Cols *cs, const uint8_t *p, const uint8_t *end, int section) {
    int entry_no = 0;
    while (p < end) {
        const uint8_t *vs, *ve;
        uint32_t f;
        int wt;
        if (!ld_fast(&p, end, 0x0A, &vs, &ve)) {
            if (rd_field(c, &p, end, &f, &wt, &vs, &ve, -1)) return -1;
            if (f != 1 || wt != 2) continue;
        }
        const uint8_t *key = vs, *val = NULL, *val_end = NULL, *q = vs;
        Py_ssize_t key_len = 0;
        {
            const uint8_t *ks, *ke;
            /* the usual entry: key then value, nothing else */
            if (ld_fast(&q, ve, 0x0A, &ks, &ke)) {
                key = ks;
                key_len = ke - ks;
                if (ld_fast(&q, ve, 0x12, &val, &val_end) && q != ve) val = NULL;
            }
            if (q != ve) {
                q = vs;
                key = vs;
                key_len = 0;
                val = val_end = NULL;
            }
        }
        while (q < ve) {
            const uint8_t *s, *e;
            if (rd_field(c, &q, ve, &f, &wt, &s, &e, -1)) return -1;
            if (wt != 2) continue;
            if (f == 1) {
                key = s;
                key_len = e - s;
            } else if (f == 2) {
                val = s;
                val_end = e;
            }
        }
        /* Records of one dataset list their features in the same order: try last record's answer. */
        Pred *pr = entry_no < PRED ? &cs->pred[section][entry_no] : NULL;
        int ci;
        if (pr && pr->key && pr->len == key_len && key_eq(pr->key, key, key_len)) {
            ci = pr->col;
        } else {
            ci = find_col(cs, key, key_len, section);
            if (pr) *pr = (Pred){key, key_len, ci};
        }
        entry_no++;
        if (ci < 0) {
            if (!cs->inspect) continue;
            ci = add_col(cs, key, key_len, section);
            if (ci < 0) return fail_at(c, E_NOMEM, vs, -1, "out of memory");
            if (pr) pr->col = ci;
        }
        Col *col = &cs->cols[ci];
        if (col->seen == c->record) col_rollback(col);
        col->seen = c->record;
        if (!val) continue;
        if (section == 0) {
            int64_t n;
            if (feature_values(c, cs, ci, val, val_end, &n)) return -1;
        } else if (feature_list_values(c, cs, ci, val, val_end)) {
            return -1;
        }
    }
    return 0;
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
        if (cs->inspect) {
            if (present) {
                int64_t n = col->shape == S_SEQ ? col->ninner - col->row_inner : col->nvals - col->row_vals;
                col->present++;
                if (n < col->min_count) col->min_count = n;
                if (n > col->max_count) col->max_count = n;
            }
            col->row_vals = col->nvals;
            col->row_inner = col->ninner;
            continue;
        }
        int64_t n = col->nvals - col->row_vals;
        if (present && col->shape == S_SCALAR && n != 1) {
            c->err.a = n;
            c->err.b = 1;
            return fail_at(c, E_COUNT, NULL, ci, "");
        }
        if (present && col->shape == S_FIXED && n != col->fixed_n) {
            c->err.a = n;
            c->err.b = col->fixed_n;
            return fail_at(c, E_COUNT, NULL, ci, "");
        }
        if (set_bit(&col->valid, col->nrows, present)) return fail_at(c, E_NOMEM, NULL, ci, "out of memory");
        if (!present) {
            col->nulls++;
            int64_t fill = col->shape == S_SCALAR ? 1 : col->shape == S_FIXED ? col->fixed_n : 0;
            for (int64_t k = 0; k < fill; k++) {
                if (col->kind == K_BYTES) {
                    if (push_i32(c, &col->vals, (int64_t)col->data.len, ci)) return -1;
                } else if (col->kind != K_NULL) {
                    size_t es = elem_size(col->kind);
                    if (buf_reserve(&col->vals, es)) return fail_at(c, E_NOMEM, NULL, ci, "out of memory");
                    memset(col->vals.p + col->vals.len, 0, es);
                    col->vals.len += es;
                }
            }
            col->nvals += fill;
        }
        if (col->shape == S_LIST && push_i32(c, &col->rowoff, col->nvals, ci)) return -1;
        if (col->shape == S_SEQ && push_i32(c, &col->rowoff, col->ninner, ci)) return -1;
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

enum { R_EXAMPLE = 0, R_SEQUENCE = 1, R_BYTES = 2 };

static int decode_records(Ctx *c, Cols *cs, int rtype, const uint8_t *buf, size_t n, const int64_t *pos,
                          const int64_t *lens, int64_t nrec) {
    for (int64_t r = 0; r < nrec; r++) {
        c->record = r;
        if (pos[r] < 0 || lens[r] < 0 || (uint64_t)pos[r] > n || (uint64_t)lens[r] > n - (uint64_t)pos[r] ||
            n - (uint64_t)pos[r] - (uint64_t)lens[r] < 12)
            return fail_at(c, E_BAD_INPUT, NULL, -1, "record span lies outside the buffer");
        const uint8_t *p = buf + pos[r] + 12, *end = p + lens[r];
        c->rec = p;
        while (p < end) {
            const uint8_t *vs, *ve;
            uint32_t f;
            int wt;
            if (rd_field(c, &p, end, &f, &wt, &vs, &ve, -1)) return -1;
            if (wt != 2) continue;
            if (f == 1) {
                if (parse_map(c, cs, vs, ve, 0)) return -1;
            } else if (f == 2 && rtype == R_SEQUENCE) {
                if (parse_map(c, cs, vs, ve, 1)) return -1;
            }
        }
        if (finish_record(c, cs)) return -1;
        if (r == 7 && nrec > 64 && !cs->inspect) presize(cs, r + 1, nrec);
    }
    cs->nrecords = nrec;
    return 0;
}

/* Parses the common arguments of decode/inspect: buffer, positions, lengths. */
typedef struct {
    Py_buffer buf, pos, lens;
    int64_t nrec;
} Spans;

static int spans_get(PyObject *b, PyObject *p, PyObject *l, Spans *s) {
    memset(s, 0, sizeof(*s));
    if (PyObject_GetBuffer(b, &s->buf, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(p, &s->pos, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&s->buf);
        return -1;
    }
    if (PyObject_GetBuffer(l, &s->lens, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&s->buf);
        PyBuffer_Release(&s->pos);
        return -1;
    }
    if (s->pos.len != s->lens.len || s->pos.len % 8) {
        PyBuffer_Release(&s->buf);
        PyBuffer_Release(&s->pos);
        PyBuffer_Release(&s->lens);
        PyErr_SetString(PyExc_ValueError, "positions and lengths must be int64 arrays of equal length");
        return -1;
    }
    s->nrec = s->pos.len / 8;
    return 0;
}

static void spans_release(Spans *s) {
    PyBuffer_Release(&s->buf);
    PyBuffer_Release(&s->pos);
    PyBuffer_Release(&s->lens);
}

static PyObject *maybe_buf(Buf *b) {
    if (!b->p) Py_RETURN_NONE;
    return buf_to_py(b);
}

/* Runs decode_records over the spans without the GIL; on failure raises the located CodecError. */
static int run_records(Cols *cs, int rtype, const Spans *s) {
    if (table_build(cs)) {
        PyErr_NoMemory();
        return -1;
    }
    Ctx ctx = {0};
    ctx.record = -1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = decode_records(&ctx, cs, rtype, s->buf.buf, (size_t)s->buf.len, s->pos.buf, s->lens.buf, s->nrec);
    Py_END_ALLOW_THREADS
    if (!rc) return 0;
    if (ctx.err.code == E_NOMEM) {
        PyErr_NoMemory();
        return -1;
    }
    const Col *c = ctx.err.col >= 0 ? &cs->cols[ctx.err.col] : NULL;
    PyObject *name = c ? PyBytes_FromStringAndSize((const char *)c->name, c->name_len) : NULL;
    if (!c || name) raise_err(&ctx.err, name);
    Py_XDECREF(name);
    return -1;
}

/* decode(buffer, positions, lengths, record_type, columns) -> list of
 *   (validity | None, null_count, row_offsets | None, inner_offsets | None, values, data | None, nvals, ninner)
 * columns: sequence of (name: bytes, kind, shape, fixed_n, section). */
static PyObject *py_decode(PyObject *self, PyObject *args) {
    PyObject *b, *p, *l, *spec;
    int rtype;
    if (!PyArg_ParseTuple(args, "OOOiO", &b, &p, &l, &rtype, &spec)) return NULL;
    Spans s;
    if (spans_get(b, p, l, &s)) return NULL;
    PyObject *seq = PySequence_Fast(spec, "columns must be a sequence");
    if (!seq) {
        spans_release(&s);
        return NULL;
    }
    Cols cs = {0};
    PyObject *result = NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    cs.cols = calloc((size_t)(ncols ? ncols : 1), sizeof(Col));
    if (!cs.cols) {
        PyErr_NoMemory();
        goto done;
    }
    cs.cap = (int)ncols;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        Col *c = &cs.cols[i];
        PyObject *name;
        int kind, shape, section;
        long long fixed_n;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "SiiLi", &name, &kind, &shape, &fixed_n, &section))
            goto done;
        int rc = col_setup(c, (const uint8_t *)PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), kind, shape, fixed_n, section);
        cs.ncols++; /* whatever col_setup allocated is freed with the rest */
        if (rc) {
            if (rc == -1) PyErr_SetString(PyExc_ValueError, "invalid column spec");
            else PyErr_NoMemory();
            goto done;
        }
    }
    if (run_records(&cs, rtype, &s)) goto done;
    result = PyList_New(ncols);
    if (!result) goto done;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        Col *c = &cs.cols[i];
        PyObject *valid = c->nulls ? buf_to_py(&c->valid) : (Py_INCREF(Py_None), Py_None);
        PyObject *t = Py_BuildValue("(NLNNNNLL)", valid, (long long)c->nulls, maybe_buf(&c->rowoff), maybe_buf(&c->inner),
                                    buf_to_py(&c->vals), maybe_buf(&c->data), (long long)c->nvals, (long long)c->ninner);
        if (!t) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, t);
    }
done:
    cols_free(&cs);
    Py_DECREF(seq);
    spans_release(&s);
    return result;
}

/* inspect(buffer, positions, lengths, record_type) -> list of
 *   (name, section, kind, present, min_count, max_count, min_inner, max_inner, kind_record) */
static PyObject *py_inspect(PyObject *self, PyObject *args) {
    PyObject *b, *p, *l;
    int rtype;
    if (!PyArg_ParseTuple(args, "OOOi", &b, &p, &l, &rtype)) return NULL;
    Spans s;
    if (spans_get(b, p, l, &s)) return NULL;
    Cols cs = {0};
    cs.inspect = 1;
    PyObject *result = NULL;
    if (run_records(&cs, rtype, &s)) goto done;
    result = PyList_New(cs.ncols);
    if (!result) goto done;
    for (int i = 0; i < cs.ncols; i++) {
        Col *c = &cs.cols[i];
        PyObject *t = Py_BuildValue("(y#iiLLLLLL)", (const char *)c->name, c->name_len, c->section, c->kind,
                                    (long long)c->present, (long long)c->min_count, (long long)c->max_count,
                                    (long long)c->min_inner, (long long)c->max_inner, (long long)c->kind_record);
        if (!t) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, t);
    }
done:
    cols_free(&cs);
    spans_release(&s);
    return result;
}

/* byte_array(buffer, positions, lengths) -> (offsets int32, data): the raw payloads as one binary column. */
static PyObject *py_byte_array(PyObject *self, PyObject *args) {
    PyObject *b, *p, *l;
    if (!PyArg_ParseTuple(args, "OOO", &b, &p, &l)) return NULL;
    Spans s;
    if (spans_get(b, p, l, &s)) return NULL;
    Buf off = {0}, data = {0};
    const uint8_t *buf = s.buf.buf;
    const int64_t *pos = s.pos.buf, *lens = s.lens.buf;
    uint64_t n = (uint64_t)s.buf.len, total = 0;
    int bad = 0;
    for (int64_t r = 0; r < s.nrec; r++) {
        if (pos[r] < 0 || lens[r] < 0 || (uint64_t)pos[r] > n || (uint64_t)lens[r] > n - (uint64_t)pos[r] ||
            n - (uint64_t)pos[r] - (uint64_t)lens[r] < 12) {
            bad = 1;
            break;
        }
        total += (uint64_t)lens[r];
    }
    if (bad || total > INT32_MAX) {
        spans_release(&s);
        PyErr_SetString(PyExc_ValueError, bad ? "record span lies outside the buffer" : "records exceed 2 GiB in one batch");
        return NULL;
    }
    if (buf_reserve(&off, (size_t)(s.nrec + 1) * 4) || buf_reserve(&data, (size_t)total)) {
        free(off.p);
        free(data.p);
        spans_release(&s);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    int32_t o = 0;
    memcpy(off.p, &o, 4);
    for (int64_t r = 0; r < s.nrec; r++) {
        memcpy(data.p + o, buf + pos[r] + 12, (size_t)lens[r]);
        o += (int32_t)lens[r];
        memcpy(off.p + 4 * (r + 1), &o, 4);
    }
    off.len = (size_t)(s.nrec + 1) * 4;
    data.len = (size_t)total;
    Py_END_ALLOW_THREADS
    spans_release(&s);
    return Py_BuildValue("(NN)", buf_to_py(&off), buf_to_py(&data));
}

/* ------------------------------------------------------------------------------------------ */
/* Encode                                                                                      */

/* Memory lent by the caller (a Py_buffer's, or the fuzz harness's). */
typedef struct {
    const void *buf;
    Py_ssize_t len;
} Mem;

typedef struct {
    const uint8_t *key;
    size_t key_len;
    int kind, shape;
    Mem valid, rowoff, inner, vals, data;
    int has_valid, has_rowoff, has_inner, has_vals, has_data;
    int64_t valid_off;
    int64_t nrowoff, ninner, nvals, ndata; /* element counts of the buffers */
} ECol;

static inline size_t vsize(uint64_t v) { return 1 + (size_t)(63 - __builtin_clzll(v | 1)) / 7; }

static inline uint8_t *put_varint(uint8_t *o, uint64_t v) {
    while (v >= 0x80) {
        *o++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *o++ = (uint8_t)v;
    return o;
}

static inline int ecol_valid(const ECol *c, int64_t i) {
    if (!c->has_valid) return 1;
    int64_t b = c->valid_off + i;
    return (((const uint8_t *)c->valid.buf)[b / 8] >> (b % 8)) & 1;
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
    *o++ = c->kind == K_BYTES ? 0x0A : c->kind == K_FLOAT ? 0x12 : 0x1A;
    o = put_varint(o, ls);
    if (b <= a) return o;
    if (c->kind == K_INT64) {
        const int64_t *v = c->vals.buf;
        *o++ = 0x0A;
        o = put_varint(o, payload);
        for (int64_t k = a; k < b; k++) o = put_varint(o, (uint64_t)v[k]);
    } else if (c->kind == K_FLOAT) {
        *o++ = 0x0A;
        o = put_varint(o, payload);
        memcpy(o, (const uint8_t *)c->vals.buf + a * 4, payload);
        o += payload;
    } else {
        const int64_t *off = c->vals.buf;
        const uint8_t *d = c->data.buf;
        for (int64_t k = a; k < b; k++) {
            size_t len = (size_t)(off[k + 1] - off[k]);
            *o++ = 0x0A;
            o = put_varint(o, len);
            memcpy(o, d + off[k], len);
            o += len;
        }
    }
    return o;
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

/* Size of row i's map value (a Feature, or a FeatureList); *payload keeps a Feature's list payload. */
static size_t body_size(const ECol *c, int64_t i, size_t *payload) {
    int64_t a, b;
    row_span(c, i, &a, &b);
    if (c->shape != S_SEQ) {
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
    *o++ = 0x0A;
    o = put_varint(o, entry);
    *o++ = 0x0A;
    o = put_varint(o, c->key_len);
    memcpy(o, c->key, c->key_len);
    o += c->key_len;
    *o++ = 0x12;
    o = put_varint(o, body);
    int64_t a, b;
    row_span(c, i, &a, &b);
    if (c->shape != S_SEQ) return write_feature(o, c, a, b, payload);
    const int64_t *in = c->inner.buf;
    for (int64_t k = a; k < b; k++) {
        size_t step = list_payload(c, in[k], in[k + 1]);
        *o++ = 0x0A;
        o = put_varint(o, feature_size(c, in[k], in[k + 1], step));
        o = write_feature(o, c, in[k], in[k + 1], step);
    }
    return o;
}

static inline size_t entry_total(const ECol *c, size_t body) {
    size_t entry = 1 + vsize(c->key_len) + c->key_len + 1 + vsize(body) + body;
    return 1 + vsize(entry) + entry;
}

static int monotone(const int64_t *o, int64_t n, int64_t hi) {
    if (n < 1 || o[0] < 0) return 0;
    for (int64_t k = 1; k < n; k++)
        if (o[k] < o[k - 1]) return 0;
    return o[n - 1] <= hi;
}

/* Checks that every offset stays inside the buffers it points into. Sums of caller-supplied
 * counts are written as differences, which cannot overflow (all of them are >= 0). */
static const char *ecol_check(const ECol *c, int64_t nrows) {
    if (c->has_valid && (int64_t)c->valid.len * 8 - nrows < c->valid_off) return "validity bitmap too short";
    int64_t elems = c->kind == K_INT64 ? c->nvals : c->kind == K_FLOAT ? c->nvals : c->kind == K_BYTES ? c->nvals - 1 : 0;
    if (c->kind == K_BYTES && !monotone(c->vals.buf, c->nvals, c->ndata)) return "bytes offsets out of range";
    if (c->shape == S_SCALAR) return elems >= nrows ? NULL : "fewer values than rows";
    if (c->nrowoff - 1 < nrows) return "fewer list offsets than rows";
    if (c->shape == S_SEQ) {
        if (!monotone(c->rowoff.buf, nrows + 1, c->ninner - 1)) return "sequence offsets out of range";
        if (c->kind == K_NULL) return NULL;
        return monotone(c->inner.buf, c->ninner, elems) ? NULL : "inner list offsets out of range";
    }
    if (c->kind == K_NULL) {
        const int64_t *r = c->rowoff.buf;
        for (int64_t i = 0; i < nrows; i++)
            if (r[i + 1] != r[i] && ecol_valid(c, i)) return "null-typed list holds values";
        return NULL;
    }
    return monotone(c->rowoff.buf, nrows + 1, elems) ? NULL : "list offsets out of range";
}

/* Checks a column's spec against the record type and derives the element counts of its buffers. */
static int ecol_prepare(ECol *c, int rtype, int64_t ncols) {
    int bad = c->kind < K_BYTES || c->kind > K_NULL || c->valid_off < 0 ||
              (c->shape != S_SCALAR && c->shape != S_LIST && c->shape != S_SEQ) ||
              (c->shape != S_SCALAR && !c->has_rowoff) || (c->shape == S_SEQ && c->kind != K_NULL && !c->has_inner) ||
              (c->kind != K_NULL && !c->has_vals) || (c->kind == K_BYTES && !c->has_data) ||
              (c->kind == K_NULL && c->shape == S_SCALAR) || (rtype == R_EXAMPLE && c->shape == S_SEQ) ||
              (rtype == R_BYTES && (ncols != 1 || c->kind != K_BYTES || c->shape != S_SCALAR || c->has_valid));
    if (bad) return -1;
    c->nrowoff = c->has_rowoff ? c->rowoff.len / 8 : 0;
    c->ninner = c->has_inner ? c->inner.len / 8 : 0;
    c->nvals = c->has_vals ? c->vals.len / (c->kind == K_FLOAT ? 4 : 8) : 0;
    c->ndata = c->has_data ? c->data.len : 0;
    if (c->shape == S_SEQ && c->kind == K_NULL && !c->has_inner) c->ninner = 0;
    return 0;
}

static int encode_records(ECol *cols, int ncols, int rtype, int64_t nrows, Buf *out, Buf *offs, const char **why) {
    /* per column of the current row: its map value's size (SIZE_MAX: null) and list payload */
    size_t *body = malloc(sizeof(size_t) * 2 * (size_t)(ncols ? ncols : 1)), *pay = body + (ncols ? ncols : 1);
    /* more rows than memory can hold offsets for must not wrap nrows * 8 around to a small size */
    if (!body || (uint64_t)nrows > SIZE_MAX / 8 || buf_reserve(offs, (size_t)nrows * 8)) {
        free(body);
        *why = "out of memory";
        return -1;
    }
    for (int64_t i = 0; i < nrows; i++) {
        size_t ctx = 0, fl = 0;
        if (rtype == R_BYTES) { /* the single binary column is the record payload itself */
            int64_t a, b;
            row_span(&cols[0], i, &a, &b);
            const int64_t *off = cols[0].vals.buf;
            ctx = (size_t)(off[a + 1] - off[a]);
        }
        for (int ci = 0; ci < ncols && rtype != R_BYTES; ci++) {
            ECol *c = &cols[ci];
            if (!ecol_valid(c, i)) {
                body[ci] = SIZE_MAX;
                continue;
            }
            body[ci] = body_size(c, i, &pay[ci]);
            if (c->shape == S_SEQ) fl += entry_total(c, body[ci]);
            else ctx += entry_total(c, body[ci]);
        }
        size_t msg = rtype == R_BYTES ? ctx : 1 + vsize(ctx) + ctx;
        if (rtype == R_SEQUENCE) msg += 1 + vsize(fl) + fl;
        if (buf_reserve(out, msg + 16)) {
            free(body);
            *why = "out of memory";
            return -1;
        }
        int64_t start = (int64_t)out->len;
        memcpy(offs->p + offs->len, &start, 8);
        offs->len += 8;
        uint8_t *h = out->p + out->len, *o = h + 12;
        uint64_t len64 = msg;
        memcpy(h, &len64, 8);
        uint32_t lc = masked_crc(h, 8);
        memcpy(h + 8, &lc, 4);
        if (rtype == R_BYTES) {
            const int64_t *off = cols[0].vals.buf;
            memcpy(o, (const uint8_t *)cols[0].data.buf + off[i], ctx);
            o += ctx;
        } else {
            *o++ = 0x0A;
            o = put_varint(o, ctx);
        }
        for (int ci = 0; ci < ncols && rtype != R_BYTES; ci++)
            if (body[ci] != SIZE_MAX && cols[ci].shape != S_SEQ) o = write_entry(o, &cols[ci], i, body[ci], pay[ci]);
        if (rtype == R_SEQUENCE) {
            *o++ = 0x12;
            o = put_varint(o, fl);
            for (int ci = 0; ci < ncols; ci++)
                if (body[ci] != SIZE_MAX && cols[ci].shape == S_SEQ) o = write_entry(o, &cols[ci], i, body[ci], 0);
        }
        if ((size_t)(o - (h + 12)) != msg) { /* a size/write mismatch would be a codec bug: fail loudly */
            free(body);
            *why = "internal error: encoded size mismatch";
            return -1;
        }
        uint32_t dc = masked_crc(h + 12, msg);
        memcpy(o, &dc, 4);
        out->len += msg + 16;
    }
    free(body);
    return 0;
}

/* Checks every column's buffers, then encodes; returns NULL or why it failed (*bad_col: which
 * column's buffers were inconsistent, -1 if none). */
static const char *encode_core(ECol *cols, int ncols, int rtype, int64_t nrows, Buf *out, Buf *offs, int *bad_col) {
    const char *why = NULL;
    *bad_col = -1;
    for (int ci = 0; ci < ncols && !why; ci++) {
        why = ecol_check(&cols[ci], nrows);
        if (why) *bad_col = ci;
    }
    if (!why) encode_records(cols, ncols, rtype, nrows, out, offs, &why); /* sets why when it fails */
    return why;
}

/* Borrows o's memory for m (None: absent), keeping the view in v for release. */
static int get_opt_buffer(PyObject *o, Py_buffer *v, Mem *m, int *has) {
    *has = 0;
    if (o == Py_None) return 0;
    if (PyObject_GetBuffer(o, v, PyBUF_SIMPLE) < 0) return -1;
    m->buf = v->buf;
    m->len = v->len;
    *has = 1;
    return 0;
}

/* encode(record_type, nrows, columns) -> (framed records, record start offsets as int64)
 * columns: (name: bytes, kind, shape, validity|None, validity_bit_offset, row_offsets|None,
 *           inner_offsets|None, values|None, data|None); offsets are int64 arrays. */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    int rtype;
    long long nrows;
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "iLO", &rtype, &nrows, &spec)) return NULL;
    if (nrows < 0 || rtype < R_EXAMPLE || rtype > R_BYTES) {
        PyErr_SetString(PyExc_ValueError, "invalid record type or row count");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(spec, "columns must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    ECol *cols = calloc((size_t)(ncols ? ncols : 1), sizeof(ECol));
    Py_buffer(*views)[5] = calloc((size_t)(ncols ? ncols : 1), sizeof(*views)); /* valid, rowoff, inner, vals, data */
    PyObject *result = NULL;
    Buf out = {0}, offs = {0};
    if (!cols || !views) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        ECol *c = &cols[i];
        Py_buffer *v = views[i];
        PyObject *name, *valid, *rowoff, *inner, *vals, *data;
        long long voff;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "SiiOLOOOO", &name, &c->kind, &c->shape, &valid,
                              &voff, &rowoff, &inner, &vals, &data))
            goto done;
        c->key = (const uint8_t *)PyBytes_AS_STRING(name);
        c->key_len = (size_t)PyBytes_GET_SIZE(name);
        c->valid_off = voff;
        if (get_opt_buffer(valid, &v[0], &c->valid, &c->has_valid) ||
            get_opt_buffer(rowoff, &v[1], &c->rowoff, &c->has_rowoff) ||
            get_opt_buffer(inner, &v[2], &c->inner, &c->has_inner) ||
            get_opt_buffer(vals, &v[3], &c->vals, &c->has_vals) || get_opt_buffer(data, &v[4], &c->data, &c->has_data))
            goto done;
        if (ecol_prepare(c, rtype, ncols)) {
            PyErr_Format(PyExc_ValueError, "invalid encode spec for column %R", name);
            goto done;
        }
    }
    const char *why;
    int bad_col;
    Py_BEGIN_ALLOW_THREADS
    why = encode_core(cols, (int)ncols, rtype, nrows, &out, &offs, &bad_col);
    Py_END_ALLOW_THREADS
    if (why) {
        if (bad_col >= 0) PyErr_Format(PyExc_ValueError, "column %R: %s", PyTuple_GET_ITEM(PySequence_Fast_GET_ITEM(seq, bad_col), 0), why);
        else if (strcmp(why, "out of memory") == 0) PyErr_NoMemory();
        else PyErr_SetString(PyExc_RuntimeError, why);
        goto done;
    }
    result = Py_BuildValue("(NN)", buf_to_py(&out), buf_to_py(&offs));
done:
    for (Py_ssize_t i = 0; i < ncols && views; i++)
        for (int k = 0; k < 5; k++)
            if (views[i][k].obj) PyBuffer_Release(&views[i][k]);
    free(cols);
    free(views);
    free(out.p);
    free(offs.p);
    Py_DECREF(seq);
    return result;
}

/* ------------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_VARARGS | METH_KEYWORDS,
     "scan(buffer, verify=True, final=True, skip=False, limit=-1, resync=False)\n"
     "-> (positions, lengths, consumed, errors, error_count, need, resyncing)"},
    {"masked_crc32c", py_masked_crc32c, METH_O, "masked_crc32c(data) -> int"},
    {"decode", py_decode, METH_VARARGS, "decode(buffer, positions, lengths, record_type, columns) -> list"},
    {"inspect", py_inspect, METH_VARARGS, "inspect(buffer, positions, lengths, record_type) -> list"},
    {"byte_array", py_byte_array, METH_VARARGS, "byte_array(buffer, positions, lengths) -> (offsets, data)"},
    {"encode", py_encode, METH_VARARGS, "encode(record_type, nrows, columns) -> (data, offsets)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_native", .m_doc = "Native TFRecord codec core.", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    if (PyType_Ready(&NativeBufferType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    CodecError = PyErr_NewException("ray_tfrecord._native.CodecError", PyExc_ValueError, NULL);
    if (!CodecError || PyModule_AddObjectRef(m, "CodecError", CodecError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *hw = PyBool_FromLong(crc32c_update != crc32c_sw);
    if (PyModule_AddObject(m, "HARDWARE_CRC", hw) < 0) {
        Py_DECREF(hw);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
