/* Decoded columns as one Arrow record batch, through the Arrow C data interface: a struct array
 * whose children are the columns, and its schema, built without Python so that a chunk crosses
 * into pyarrow in one import. */
#ifndef RT_ARROW_H
#define RT_ARROW_H

#include "decode.h"

/* The Arrow C data interface's ABI, verbatim from https://arrow.apache.org/docs/format/CDataInterface.html */
#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#endif

/* Moves the columns cs decoded into out: a struct array of cs->nrecords rows without nulls,
 * child i holding column i in the layout its kind and shape decode to (binary, int64, float32 or
 * null leaves; list, fixed_size_list, list of lists). out owns the buffers from then on, and its
 * release callbacks (which may run on any thread) hand them back to the pool; cs is left to
 * rt_decode_free. RT_OK, or RT_OUT_OF_MEMORY with out released. */
RT_API rt_status rt_arrow_export(Cols *cs, struct ArrowArray *out);

/* The schema of what rt_arrow_export makes of cs: field i named cs->names.keys[i] (its bytes, up
 * to the first NUL), nullable unless not_null[i] (not_null may be NULL); list items are named
 * "item" and nullable, as pyarrow names them. RT_OK, or RT_OUT_OF_MEMORY with out released. */
RT_API rt_status rt_arrow_schema(const Cols *cs, const uint8_t *not_null, struct ArrowSchema *out);

#endif
