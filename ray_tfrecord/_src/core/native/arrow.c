/* Record batches across the Arrow C data interface (see arrow.h).
 *
 * Exporting, every node of either tree owns its private data alone, so a consumer may move a child
 * out and release it apart from its parent, as the interface allows; a parent releases only the
 * children still in place (release not NULL). Importing, the arrays are the producer's and are
 * trusted to keep the format's invariants (buffers as long as length and offset say), as every
 * consumer of the interface does; the encoder still checks every offset against those lengths. */
#include "arrow.h"

#include <stdio.h>

/* What a buffer of no bytes points to: the interface's consumers may read its address. */
static const int64_t arrow_empty[8];

typedef struct {
    Buf owned[3];
    const void *buffers[3];
    struct ArrowArray *kids; /* n_children structs */
    struct ArrowArray *kidp[]; /* n_children pointers into kids */
} ArrayNode;

static void array_release(struct ArrowArray *a) {
    ArrayNode *n = a->private_data;
    for (int64_t i = 0; i < a->n_children; i++)
        if (n->kids[i].release) n->kids[i].release(&n->kids[i]);
    for (int i = 0; i < 3; i++) buf_free(&n->owned[i]);
    free(n->kids);
    free(n);
    a->release = NULL;
}

/* An array node of nbufs buffers (none set yet) and nkids children (zeroed: not yet released). */
static int array_node(struct ArrowArray *a, int64_t length, int64_t nulls, int nbufs, int nkids) {
    memset(a, 0, sizeof(*a));
    ArrayNode *n = calloc(1, sizeof(ArrayNode) + sizeof(struct ArrowArray *) * (size_t)nkids);
    struct ArrowArray *kids = calloc((size_t)(nkids ? nkids : 1), sizeof(struct ArrowArray));
    if (!n || !kids) {
        free(n);
        free(kids);
        return -1;
    }
    for (int i = 0; i < nkids; i++) n->kidp[i] = &kids[i];
    n->kids = kids;
    *a = (struct ArrowArray){.length = length, .null_count = nulls, .n_buffers = nbufs, .n_children = nkids,
                             .buffers = n->buffers, .children = n->kidp, .release = array_release, .private_data = n};
    return 0;
}

/* Buffer i of a's node: b's memory, taken from b (an empty b points at arrow_empty). */
static void array_take(struct ArrowArray *a, int i, Buf *b) {
    ArrayNode *n = a->private_data;
    n->owned[i] = *b;
    *b = (Buf){0};
    n->buffers[i] = n->owned[i].p ? (const void *)n->owned[i].p : (const void *)arrow_empty;
}

/* The leaf values of column c: nvals of its kind, no validity. */
static int leaf_export(Col *c, struct ArrowArray *a) {
    if (c->kind == K_NULL) return array_node(a, c->nvals, c->nvals, 0, 0);
    if (array_node(a, c->nvals, 0, col_bytes(c) ? 3 : 2, 0)) return -1;
    array_take(a, 1, &c->vals);
    if (col_bytes(c)) array_take(a, 2, &c->data);
    return 0;
}

static int column_export(Col *c, int64_t nrows, struct ArrowArray *a) {
    int scalar = c->shape == S_SCALAR, nbufs = scalar ? (col_bytes(c) ? 3 : 2) : c->shape == S_FIXED ? 1 : 2;
    if (scalar) {
        if (array_node(a, nrows, c->nulls, nbufs, 0)) return -1;
        array_take(a, 1, &c->vals);
        if (col_bytes(c)) array_take(a, 2, &c->data);
    } else {
        if (array_node(a, nrows, c->nulls, nbufs, 1)) return -1;
        if (c->shape != S_FIXED) array_take(a, 1, &c->rowoff);
        struct ArrowArray *leaf = a->children[0];
        if (c->shape == S_SEQUENCE) {
            if (array_node(leaf, c->ninner, 0, 2, 1)) return -1;
            array_take(leaf, 1, &c->inner);
            leaf = leaf->children[0];
        }
        if (leaf_export(c, leaf)) return -1;
    }
    /* The bitmap matters only with nulls; without, Arrow wants none (and the pool its memory). */
    if (c->nulls) array_take(a, 0, &c->valid);
    else buf_free(&c->valid);
    return 0;
}

RT_API rt_status rt_arrow_export(Cols *cs, struct ArrowArray *out) {
    if (array_node(out, cs->nrecords, 0, 1, cs->ncols)) return RT_OUT_OF_MEMORY;
    for (int i = 0; i < cs->ncols; i++)
        if (column_export(&cs->cols[i], cs->nrecords, out->children[i])) {
            out->release(out);
            return RT_OUT_OF_MEMORY;
        }
    return RT_OK;
}

typedef struct {
    char format[32];
    char *name;
    struct ArrowSchema *kids;
    struct ArrowSchema *kidp[];
} SchemaNode;

static void schema_release(struct ArrowSchema *s) {
    SchemaNode *n = s->private_data;
    for (int64_t i = 0; i < s->n_children; i++)
        if (n->kids[i].release) n->kids[i].release(&n->kids[i]);
    free(n->kids);
    free(n->name);
    free(n);
    s->release = NULL;
}

/* A schema node of the given format, named name[0, len) up to its first NUL, with nkids children. */
static int schema_node(struct ArrowSchema *s, const char *format, const uint8_t *name, size_t len, int64_t flags,
                       int nkids) {
    memset(s, 0, sizeof(*s));
    SchemaNode *n = calloc(1, sizeof(SchemaNode) + sizeof(struct ArrowSchema *) * (size_t)nkids);
    struct ArrowSchema *kids = calloc((size_t)(nkids ? nkids : 1), sizeof(struct ArrowSchema));
    const uint8_t *nul = len ? memchr(name, 0, len) : NULL;
    if (nul) len = (size_t)(nul - name);
    char *copy = malloc(len + 1);
    if (!n || !kids || !copy) {
        free(n);
        free(kids);
        free(copy);
        return -1;
    }
    if (len) memcpy(copy, name, len);
    copy[len] = 0;
    for (int i = 0; i < nkids; i++) n->kidp[i] = &kids[i];
    n->kids = kids;
    n->name = copy;
    snprintf(n->format, sizeof(n->format), "%s", format);
    *s = (struct ArrowSchema){.format = n->format, .name = n->name, .flags = flags, .n_children = nkids,
                              .children = n->kidp, .release = schema_release, .private_data = n};
    return 0;
}

static const char *leaf_format(const Col *c) {
    if (c->tensor.dtype) return c->tensor.widen ? "f" : rt_tensor_dtype_of(c->tensor.dtype)->format;
    return c->kind == K_INT64 ? "l" : c->kind == K_FLOAT ? "f" : c->kind == K_BYTES ? "z" : "n";
}

static int column_schema(const Col *c, const rt_key *k, int nullable, struct ArrowSchema *s) {
    const uint8_t *item = (const uint8_t *)"item";
    int64_t flags = nullable ? ARROW_FLAG_NULLABLE : 0;
    if (c->shape == S_SCALAR) return schema_node(s, leaf_format(c), k->name, k->len, flags, 0);
    char format[32];
    if (c->shape == S_FIXED) snprintf(format, sizeof(format), "+w:%lld", (long long)c->fixed_n);
    else snprintf(format, sizeof(format), "+l");
    if (schema_node(s, format, k->name, k->len, flags, 1)) return -1;
    struct ArrowSchema *leaf = s->children[0];
    if (c->shape == S_SEQUENCE) {
        if (schema_node(leaf, "+l", item, 4, ARROW_FLAG_NULLABLE, 1)) return -1;
        leaf = leaf->children[0];
    }
    return schema_node(leaf, leaf_format(c), item, 4, ARROW_FLAG_NULLABLE, 0);
}

RT_API rt_status rt_arrow_schema(const Cols *cs, const uint8_t *not_null, struct ArrowSchema *out) {
    if (schema_node(out, "+s", (const uint8_t *)"", 0, 0, cs->ncols)) return RT_OUT_OF_MEMORY;
    for (int i = 0; i < cs->ncols; i++)
        if (column_schema(&cs->cols[i], &cs->names.keys[i], !(not_null && not_null[i]), out->children[i])) {
            out->release(out);
            return RT_OUT_OF_MEMORY;
        }
    return RT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Reading an exported batch's columns for the encoder                                        */

static int is_format(const struct ArrowSchema *s, const char *f) { return strcmp(s->format, f) == 0; }

/* Whether s is a list ("+l", 32-bit offsets, or "+L", 64-bit) with one child. */
static int is_list(const struct ArrowSchema *s) { return (is_format(s, "+l") || is_format(s, "+L")) && s->n_children == 1; }

/* Element i of a's validity bitmap (1 without one). */
static int arrow_valid(const struct ArrowArray *a, int64_t i) {
    const uint8_t *bits = a->n_buffers ? a->buffers[0] : NULL;
    if (!bits || a->null_count == 0) return 1;
    int64_t b = a->offset + i;
    return (bits[b / 8] >> (b % 8)) & 1;
}

/* Buffer i of a from element a->offset on (elements of es bytes); a buffer that is absent, which
 * the producer may do when it holds no bytes, as an empty one. */
static const void *buffer_at(const struct ArrowArray *a, int i, size_t es) {
    const uint8_t *p = i < a->n_buffers ? a->buffers[i] : NULL;
    return p ? p + (size_t)a->offset * es : (const void *)arrow_empty;
}

/* The n + 1 offsets of a (buffer 1) as int64: in place when they are, else widened into owned.
 * wide: whether a's offsets are 64-bit. */
static rt_status offsets64(const struct ArrowArray *a, int wide, int64_t n, Buf *owned, Mem *m) {
    if (a->n_buffers < 2 || (!a->buffers[1] && n)) return RT_BAD_SPEC;
    if (!a->buffers[1]) { /* no rows, no offsets buffer: the one offset is 0 */
        *m = (Mem){arrow_empty, 8};
        return RT_OK;
    }
    if (wide) {
        *m = (Mem){buffer_at(a, 1, 8), (size_t)(n + 1) * 8};
        return RT_OK;
    }
    if (buf_reserve(owned, (size_t)(n + 1) * 8)) return RT_OUT_OF_MEMORY;
    const int32_t *o = buffer_at(a, 1, 4);
    int64_t *w = (int64_t *)owned->p;
    for (int64_t k = 0; k <= n; k++) w[k] = o[k];
    owned->len = (size_t)(n + 1) * 8;
    *m = (Mem){owned->p, owned->len};
    return RT_OK;
}

/* The encoder cannot write a null inside a list: the first null among elements [lo, hi) of a
 * (every element of a null array is one). */
static rt_status no_nulls(const struct ArrowArray *a, const struct ArrowSchema *s, int64_t lo, int64_t hi,
                          rt_status st, rt_error *e) {
    for (int64_t k = lo; k < hi; k++)
        if (is_format(s, "n") || !arrow_valid(a, k)) {
            e->actual = k;
            return e->status = st;
        }
    return RT_OK;
}

/* The leaf values of c from array a of schema s. */
static rt_status leaf_read(const struct ArrowArray *a, const struct ArrowSchema *s, int kind, ECol *c, Buf *owned) {
    int wide = is_format(s, "Z") || is_format(s, "U");
    if (kind == K_NULL) return is_format(s, "n") ? RT_OK : RT_BAD_SPEC;
    if (kind == K_BYTES) {
        if (!(wide || is_format(s, "z") || is_format(s, "u")) || a->n_buffers != 3) return RT_BAD_SPEC;
        rt_status st = offsets64(a, wide, a->length, owned, &c->vals);
        if (st != RT_OK) return st;
        /* the data's offsets are absolute (not from a->offset): it is whole, up to the last */
        int64_t end = ((const int64_t *)c->vals.buf)[a->length];
        if (end > 0 && !a->buffers[2]) return RT_BAD_SPEC;
        c->data = (Mem){a->buffers[2] ? a->buffers[2] : (const void *)arrow_empty, end > 0 ? (size_t)end : 0};
        c->has_vals = c->has_data = 1;
        return RT_OK;
    }
    size_t es = kind == K_INT64 ? 8 : 4;
    if (!is_format(s, kind == K_INT64 ? "l" : "f") || a->n_buffers != 2 || (a->length && !a->buffers[1]))
        return RT_BAD_SPEC;
    c->vals = (Mem){buffer_at(a, 1, es), (size_t)a->length * es};
    c->has_vals = 1;
    return RT_OK;
}

RT_API rt_status rt_arrow_ecol(const struct ArrowArray *a, const struct ArrowSchema *s, int64_t nrows, int kind,
                               int shape, int64_t fixed_n, ECol *c, Buf owned[3], rt_error *e) {
    if (a->length < nrows || a->offset < 0 || a->n_children != s->n_children) return RT_BAD_SPEC;
    c->kind = kind;
    c->shape = shape == S_FIXED ? S_LIST : shape;
    /* null_count may be -1, unknown: then the bitmap tells */
    c->has_valid = a->n_buffers > 0 && a->buffers[0] && a->null_count != 0;
    if (c->has_valid) c->valid = (Mem){a->buffers[0], (size_t)((a->offset + nrows + 7) / 8)};
    c->valid_off = a->offset;
    if (shape == S_SCALAR) return kind == K_NULL ? RT_BAD_SPEC : leaf_read(a, s, kind, c, &owned[2]);
    const struct ArrowArray *child = a->n_children == 1 ? a->children[0] : NULL;
    const struct ArrowSchema *cs = child ? s->children[0] : NULL;
    if (!child) return RT_BAD_SPEC;
    rt_status st;
    if (shape == S_FIXED) {
        /* as many values a row: offsets (a->offset + i) * n into the child, made here */
        char want[32];
        snprintf(want, sizeof(want), "+w:%lld", (long long)fixed_n);
        if (!is_format(s, want) || (fixed_n && child->length / fixed_n < a->offset + nrows)) return RT_BAD_SPEC;
        if (buf_reserve(&owned[0], (size_t)(nrows + 1) * 8)) return RT_OUT_OF_MEMORY;
        int64_t *w = (int64_t *)owned[0].p;
        for (int64_t i = 0; i <= nrows; i++) w[i] = (a->offset + i) * fixed_n;
        owned[0].len = (size_t)(nrows + 1) * 8;
        c->rowoff = (Mem){owned[0].p, owned[0].len};
        c->has_rowoff = 1;
        /* A null row is written as a missing feature, whatever its slots hold; a valid row's
         * elements are written, and a null among them has no TFRecord form. */
        int child_nulls = is_format(cs, "n") || (child->n_buffers && child->buffers[0] && child->null_count != 0);
        for (int64_t i = 0; child_nulls && i < nrows; i++)
            if (arrow_valid(a, i) &&
                (st = no_nulls(child, cs, w[i], w[i + 1], RT_NULL_LIST_ELEMENT, e)) != RT_OK)
                return st;
        return leaf_read(child, cs, kind, c, &owned[2]);
    }
    if (!is_list(s)) return RT_BAD_SPEC;
    if ((st = offsets64(a, is_format(s, "+L"), nrows, &owned[0], &c->rowoff)) != RT_OK) return st;
    c->has_rowoff = 1;
    const int64_t *r = c->rowoff.buf;
    int64_t lo = nrows ? r[0] : 0, hi = nrows ? r[nrows] : 0;
    if (lo < 0 || hi > child->length) return RT_BAD_SPEC;
    if (shape == S_SEQUENCE) {
        if (!is_list(cs)) return RT_BAD_SPEC;
        if ((st = no_nulls(child, cs, lo, hi, RT_NULL_INNER_LIST, e)) != RT_OK ||
            (st = offsets64(child, is_format(cs, "+L"), child->length, &owned[1], &c->inner)) != RT_OK)
            return st;
        c->has_inner = 1;
        const int64_t *in = c->inner.buf;
        lo = nrows ? in[lo] : 0;
        hi = nrows ? in[hi] : 0;
        child = child->n_children == 1 ? child->children[0] : NULL;
        cs = child ? cs->children[0] : NULL;
        if (!child || lo < 0 || hi > child->length) return RT_BAD_SPEC;
    }
    if ((st = no_nulls(child, cs, lo, hi, RT_NULL_LIST_ELEMENT, e)) != RT_OK) return st;
    return leaf_read(child, cs, kind, c, &owned[2]);
}
