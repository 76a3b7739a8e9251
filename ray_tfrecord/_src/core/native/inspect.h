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

/* Adds the records rs to st: RT_OK, or the failure's status with e saying where. Names borrow the
 * records' memory. Free st with rt_inspect_free whatever this returns. */
RT_API rt_status rt_inspect_records(Stats *st, int rtype, const rt_records *rs, rt_error *e);
RT_API void rt_inspect_free(Stats *st);

#endif
