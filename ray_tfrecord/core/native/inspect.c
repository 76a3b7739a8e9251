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

/* One Feature message of column ci: its kind must be the one the column already has. */
static int count_feature(Ctx *c, Stats *st, int ci, const uint8_t *p, const uint8_t *end) {
    Stat *col = &st->cols[ci];
    Feature ft;
    if (feature_parse(c, p, end, ci, &ft)) return -1;
    if (ft.kind == K_NONE) return 0;
    if (col->kind == K_NONE) {
        col->kind = ft.kind;
        col->kind_record = c->record;
    } else if (col->kind != ft.kind) {
        c->err->actual = ft.kind;
        c->err->expected = col->kind;
        c->err->other_record = col->kind_record;
        return fail_at(c, RT_KIND_MISMATCH, p, ci);
    }
    int64_t count = 0;
    if (feature_collect(c, &ft, end, NULL, NULL, ci, 0, &count)) return -1;
    col->nvals += count;
    return 0;
}

static int count_feature_list(Ctx *c, Stats *st, int ci, const uint8_t *p, const uint8_t *end) {
    const uint8_t *vs, *ve;
    int rc;
    while ((rc = next_list_feature(c, &p, end, ci, &vs, &ve)) > 0) {
        if (count_feature(c, st, ci, vs, ve)) return -1;
        st->cols[ci].nsteps++;
    }
    return rc;
}

static int inspect_map(Ctx *c, Stats *st, const uint8_t *p, const uint8_t *end, int section) {
    MapEntry e;
    int rc;
    for (int entry_no = 0; (rc = map_entry(c, &p, end, &e)) > 0; entry_no++) {
        int ci = rt_table_lookup(&st->names, entry_no, section, e.key, e.key_len);
        if (ci < 0) {
            ci = add_stat(st, e.key, e.key_len, section);
            if (ci < 0) return fail_at(c, RT_OUT_OF_MEMORY, e.at, -1);
            rt_table_predict(&st->names, entry_no, section, ci);
        }
        Stat *col = &st->cols[ci];
        if (col->seen == c->record) { /* a repeated map key: the last one wins */
            col->nvals = col->row_vals;
            col->nsteps = col->row_steps;
        }
        col->seen = c->record;
        if (!e.val) continue;
        if (section == SECTION_CONTEXT ? count_feature(c, st, ci, e.val, e.val_end)
                                       : count_feature_list(c, st, ci, e.val, e.val_end))
            return -1;
    }
    return rc;
}

static void finish_stats(Ctx *c, Stats *st) {
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
}

RT_API rt_status rt_inspect_records(Stats *st, int rtype, const rt_records *rs, rt_error *e) {
    Ctx ctx = {.record = -1, .err = e}, *c = &ctx;
    for (int64_t r = 0; r < rs->count; r++) {
        const uint8_t *p, *end, *vs, *ve;
        int section, rc;
        if (record_begin(c, rs, r, &p, &end)) return e->status;
        while ((rc = record_map(c, &p, end, rtype, &vs, &ve, &section)) > 0)
            if (inspect_map(c, st, vs, ve, section)) return e->status;
        if (rc < 0) return e->status;
        finish_stats(c, st);
    }
    st->nrecords = rs->count;
    return RT_OK;
}

RT_API void rt_inspect_free(Stats *st) {
    free(st->cols);
    rt_table_free(&st->names);
    memset(st, 0, sizeof(*st));
}
