/* Decoded columns as an Arrow C data interface struct array and schema (see arrow.h).
 *
 * Every node of either tree owns its private data alone, so a consumer may move a child out and
 * release it apart from its parent, as the interface allows; a parent releases only the children
 * still in place (release not NULL). */
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
    if (array_node(a, c->nvals, 0, c->kind == K_BYTES ? 3 : 2, 0)) return -1;
    array_take(a, 1, &c->vals);
    if (c->kind == K_BYTES) array_take(a, 2, &c->data);
    return 0;
}

static int column_export(Col *c, int64_t nrows, struct ArrowArray *a) {
    int scalar = c->shape == S_SCALAR, nbufs = scalar ? (c->kind == K_BYTES ? 3 : 2) : c->shape == S_FIXED ? 1 : 2;
    if (scalar) {
        if (array_node(a, nrows, c->nulls, nbufs, 0)) return -1;
        array_take(a, 1, &c->vals);
        if (c->kind == K_BYTES) array_take(a, 2, &c->data);
    } else {
        if (array_node(a, nrows, c->nulls, nbufs, 1)) return -1;
        if (c->shape != S_FIXED) array_take(a, 1, &c->rowoff);
        struct ArrowArray *leaf = a->children[0];
        if (c->shape == S_SEQ) {
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

static const char *leaf_format(int kind) {
    return kind == K_INT64 ? "l" : kind == K_FLOAT ? "f" : kind == K_BYTES ? "z" : "n";
}

static int column_schema(const Col *c, const rt_key *k, int nullable, struct ArrowSchema *s) {
    const uint8_t *item = (const uint8_t *)"item";
    int64_t flags = nullable ? ARROW_FLAG_NULLABLE : 0;
    if (c->shape == S_SCALAR) return schema_node(s, leaf_format(c->kind), k->name, k->len, flags, 0);
    char format[32];
    if (c->shape == S_FIXED) snprintf(format, sizeof(format), "+w:%lld", (long long)c->fixed_n);
    else snprintf(format, sizeof(format), "+l");
    if (schema_node(s, format, k->name, k->len, flags, 1)) return -1;
    struct ArrowSchema *leaf = s->children[0];
    if (c->shape == S_SEQ) {
        if (schema_node(leaf, "+l", item, 4, ARROW_FLAG_NULLABLE, 1)) return -1;
        leaf = leaf->children[0];
    }
    return schema_node(leaf, leaf_format(c->kind), item, 4, ARROW_FLAG_NULLABLE, 0);
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
