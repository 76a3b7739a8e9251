/* Inspect: walks records like decode, but every feature becomes a column on first sight and its
 * values are only counted. */
#include "inspect.h"

/* A feature seen for the first time becomes a column. */
static int add_stat(Stats *st, const uint8_t *k, size_t n, int section) {
    if (st->ncols == st->cap) {
        int cap = st->cap ? st->cap * 2 : 32;
        Stat *nc = realloc(st->cols, sizeof(Stat) * (size_t)cap);
        if (!nc) return -1;
        st->cols = nc;
        st->cap = cap;
    }
    if (rt_table_add(&st->names, k, n, section) < 0) return -1;
    st->cols[st->ncols] = (Stat){.kind = K_NONE, .section = section, .kind_record = -1, .min_count = INT64_MAX,
                                 .max_count = -1, .seen = -1};
    return st->ncols++;
}

/* inspect's walk (walk_records): every feature becomes a column on first sight. */

static inline int inspect_column(void *self, Ctx *c, const MapEntry *e, int entry_no, int section, int *ci) {
    Stats *st = self;
    *ci = rt_table_lookup(&st->names, entry_no, section, e->key, e->key_len);
    if (*ci < 0) {
        *ci = add_stat(st, e->key, e->key_len, section);
        if (*ci < 0) return fail_at(c, RT_OUT_OF_MEMORY, e->at, -1);
        rt_table_predict(&st->names, entry_no, section, *ci);
    }
    Stat *col = &st->cols[*ci];
    if (col->seen == c->record) { /* a repeated map key: the last one wins */
        col->nvals = col->row_vals;
        col->nsteps = col->row_steps;
    }
    col->seen = c->record;
    return 0;
}

/* A Feature of column ci: its kind must be the one the column already has. */
static inline int inspect_feature(void *self, Ctx *c, int ci, const Feature *ft, const uint8_t *p, const uint8_t *end) {
    Stat *col = &((Stats *)self)->cols[ci];
    if (col->kind == K_NONE) {
        col->kind = ft->kind;
        col->kind_record = c->record;
    } else if (col->kind != ft->kind) {
        c->err->actual = ft->kind;
        c->err->expected = col->kind;
        c->err->other_record = col->kind_record;
        return fail_at(c, RT_KIND_MISMATCH, p, ci);
    }
    int64_t count = 0;
    if (feature_collect(c, ft, end, NULL, NULL, ci, 0, &count)) return -1;
    col->nvals += count;
    return 0;
}

static inline int inspect_step(void *self, Ctx *c, int ci) {
    (void)c;
    ((Stats *)self)->cols[ci].nsteps++;
    return 0;
}

/* Closes the record: the presence and value-count bounds of the features it held. */
static inline int inspect_end_record(void *self, Ctx *c, int64_t count) {
    (void)count;
    Stats *st = self;
    for (int ci = 0; ci < st->ncols; ci++) {
        Stat *col = &st->cols[ci];
        if (col->seen == c->record) {
            int64_t n = col->section == SECTION_FEATURE_LISTS ? col->nsteps - col->row_steps : col->nvals - col->row_vals;
            col->present++;
            if (n < col->min_count) col->min_count = n;
            if (n > col->max_count) col->max_count = n;
        }
        col->row_vals = col->nvals;
        col->row_steps = col->nsteps;
    }
    return 0;
}

RT_API rt_status rt_inspect_records(Stats *st, int rtype, const rt_records *rs, rt_error *e) {
    rt_status s =
        walk_records(rs, rtype, e, (Walker){inspect_column, inspect_feature, inspect_step, inspect_end_record}, st);
    if (s == RT_OK) st->nrecords = rs->count;
    return s;
}

RT_API void rt_inspect_free(Stats *st) {
    free(st->cols);
    rt_table_free(&st->names);
    memset(st, 0, sizeof(*st));
}
