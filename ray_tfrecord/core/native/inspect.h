/* Inspect: per-feature statistics over a sample of records, for schema inference. */
#ifndef RT_INSPECT_H
#define RT_INSPECT_H

#include "common.h"
#include "table.h"
#include "wire.h"

/* A feature seen in the sample; the values themselves are counted, never stored. */
typedef struct {
    int kind, section;    /* kind: K_NONE until a record sets one */
    int64_t kind_record;  /* the record that gave the feature its kind, -1 if none */
    int64_t present;      /* records holding the feature */
    int64_t min_count, max_count; /* values per record (steps per record for a feature_list) */
    int64_t seen, nvals, nsteps, row_vals, row_steps;
} Stat;

typedef struct {
    Stat *cols;
    int ncols, cap;
    rt_table names; /* names.keys[i]: cols[i]'s name, pointing into the records */
    int64_t nrecords;
} Stats;

/* 0, or -1 with c->err set. Names borrow the records' memory. Free with rt_inspect_free. */
RT_API int rt_inspect_records(Ctx *c, Stats *st, int rtype, const uint8_t *buf, size_t n, const int64_t *pos,
                       const int64_t *lens, int64_t nrec);
RT_API void rt_inspect_free(Stats *st);

#endif
