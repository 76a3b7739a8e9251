/* Record batches across the Arrow C data interface, without Python: decoded columns assembled
 * into one struct array and its schema (so that a chunk crosses into pyarrow in one import), and
 * the columns of an exported batch read in place by the encoder. */
#ifndef RT_ARROW_H
#define RT_ARROW_H

#include "decode.h"
#include "encode.h"

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

/* Reads column a (format from s) of an exported batch of nrows rows as the encoder's column c, of
 * the given kind and shape (decode's: a fixed-size list is S_FIXED with fixed_n values a row),
 * when its layout is the canonical one: int64 ("l"), float32 ("f"), binary or string with 32- or
 * 64-bit offsets ("z", "u", "Z", "U") or, in lists, null ("n") values; as a scalar, a list ("+l",
 * "+L"), a fixed-size list ("+w:n") or a list of lists. c's buffers point into a's; offsets the
 * encoder reads as int64 that a holds otherwise are widened into owned[0..2] (buf_free them after
 * encoding, whatever this returns). c->key and key_len are left to the caller.
 * RT_OK; RT_BAD_SPEC for any other layout; RT_OUT_OF_MEMORY; RT_NULL_INNER_LIST or
 * RT_NULL_LIST_ELEMENT for a null inside a row's list (as the encoder cannot write one), in
 * e->status too, with e->actual the null's element index in its child array (e->col is left to
 * the caller, which knows the column's index). */
RT_API rt_status rt_arrow_ecol(const struct ArrowArray *a, const struct ArrowSchema *s, int64_t nrows, int kind,
                               int shape, int64_t fixed_n, ECol *c, Buf owned[3], rt_error *e);

#endif
