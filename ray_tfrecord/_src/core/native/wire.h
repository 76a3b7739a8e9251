/*
 * The protobuf wire format of Example / SequenceExample: its names (wire types, field numbers and
 * tags, which encode writes with too), and its reading, shared by decode (which stores values) and
 * inspect (which counts them) down to one walk of a call's records (walk_records, at the end).
 * Header-only so that both keep their hot loops in one translation unit; every length is checked
 * against the bytes that remain before it is used.
 */
#ifndef RT_WIRE_H
#define RT_WIRE_H

#include "common.h"

/* Protobuf's wire types, by protobuf's names. Groups (SGROUP, EGROUP) are refused as malformed,
 * as TensorFlow's parse_example refuses them. */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };
#define WT_BITS 3 /* a tag is field_number << WT_BITS | wire_type */

/* Field numbers of tensorflow/core/example/{example,feature}.proto. */
enum {
    F_FEATURES = 1,         /* Example.features, SequenceExample.context */
    F_FEATURE_LISTS = 2,    /* SequenceExample.feature_lists */
    F_MAP_ENTRY = 1,        /* Features.feature, FeatureLists.feature_list: the map's entries */
    F_ENTRY_KEY = 1,        /* a map entry's key */
    F_ENTRY_VALUE = 2,      /* its value: a Feature, or a FeatureList */
    F_BYTES_LIST = 1,       /* Feature's oneof kind: bytes_list, */
    F_FLOAT_LIST = 2,       /* float_list, */
    F_INT64_LIST = 3,       /* int64_list */
    F_LIST_VALUE = 1,       /* BytesList, FloatList, Int64List: value */
    F_FEATURE_LIST_STEP = 1 /* FeatureList.feature */
};

/* The one-byte tags of the length-delimited fields above, as written and as matched fast. */
#define RT_TAG(field, wt) ((field) << WT_BITS | (wt))
enum {
    TAG_FEATURES = RT_TAG(F_FEATURES, WT_LEN),
    TAG_FEATURE_LISTS = RT_TAG(F_FEATURE_LISTS, WT_LEN),
    TAG_MAP_ENTRY = RT_TAG(F_MAP_ENTRY, WT_LEN),
    TAG_ENTRY_KEY = RT_TAG(F_ENTRY_KEY, WT_LEN),
    TAG_ENTRY_VALUE = RT_TAG(F_ENTRY_VALUE, WT_LEN),
    TAG_BYTES_LIST = RT_TAG(F_BYTES_LIST, WT_LEN),
    TAG_FLOAT_LIST = RT_TAG(F_FLOAT_LIST, WT_LEN),
    TAG_INT64_LIST = RT_TAG(F_INT64_LIST, WT_LEN),
    TAG_LIST_VALUE = RT_TAG(F_LIST_VALUE, WT_LEN),
    TAG_FEATURE_LIST_STEP = RT_TAG(F_FEATURE_LIST_STEP, WT_LEN),
};

/* A Feature's kind from the field number of its oneof member (F_BYTES_LIST..F_INT64_LIST), and back. */
static inline int kind_of_field(uint32_t f) {
    return f == F_BYTES_LIST ? K_BYTES : f == F_FLOAT_LIST ? K_FLOAT : K_INT64;
}
static inline uint32_t field_of_kind(int kind) {
    return kind == K_BYTES ? F_BYTES_LIST : kind == K_FLOAT ? F_FLOAT_LIST : F_INT64_LIST;
}

/* The record being read, and the caller's rt_error that a failure fills. */
typedef struct {
    const uint8_t *rec; /* start of the current record's payload, for error offsets */
    int64_t record;
    rt_error *err;
} Ctx;

static RT_MAYBE_UNUSED int fail_at(Ctx *c, rt_status status, const uint8_t *at, int col) {
    c->err->status = status;
    c->err->record = c->record;
    c->err->col = col;
    c->err->offset = at ? (int64_t)(at - c->rec) : -1;
    return -1;
}

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

/* Reads a field header and, for length-delimited fields, checks the length against end. */
static inline int rd_field(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t *field, int *wt,
                           const uint8_t **vstart, const uint8_t **vend, int col) {
    const uint8_t *at = *pp;
    uint64_t tag, len;
    *field = 0;
    *wt = -1;
    *vstart = *vend = at;
    if (rd_varint(pp, end, &tag)) return fail_at(c, RT_MALFORMED_TAG, at, col);
    *field = (uint32_t)(tag >> WT_BITS);
    *wt = (int)(tag & ((1u << WT_BITS) - 1));
    if (*field == 0 || tag > 0xFFFFFFFFu) return fail_at(c, RT_MALFORMED_FIELD_NUMBER, at, col);
    const uint8_t *p = *pp;
    switch (*wt) {
    case WT_VARINT:
        *vstart = p;
        if (rd_varint(&p, end, &len)) return fail_at(c, RT_MALFORMED_VARINT, at, col);
        break;
    case WT_I64:
        if (end - p < 8) return fail_at(c, RT_MALFORMED_FIXED64, at, col);
        *vstart = p;
        p += 8;
        break;
    case WT_I32:
        if (end - p < 4) return fail_at(c, RT_MALFORMED_FIXED32, at, col);
        *vstart = p;
        p += 4;
        break;
    case WT_LEN:
        if (rd_varint(&p, end, &len)) return fail_at(c, RT_MALFORMED_LENGTH, at, col);
        if (len > (uint64_t)(end - p)) return fail_at(c, RT_MALFORMED_OVERRUN, at, col);
        *vstart = p;
        p += len;
        break;
    default:
        return fail_at(c, RT_MALFORMED_WIRE_TYPE, at, col);
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

/* Decodes the varints of [p, end) into out (counting only when out is NULL). A byte-at-a-time
 * loop mispredicts on every other value of random small data (pixels, ids) and chains each load
 * on the previous length; instead one 8-byte load yields every varint that ends inside it (its
 * terminators are the bytes with the high bit clear), so the chain is per word, not per value.
 * out must have room for one value per byte of [p, end), the most there can be: whole words are
 * decoded into eight slots at once, past the values that end in them. */
static inline uint64_t compact7(uint64_t x) {
    x &= 0x7F7F7F7F7F7F7F7FULL;
    x = ((x & 0x7F007F007F007F00ULL) >> 1) | (x & 0x007F007F007F007FULL);
    x = ((x & 0x3FFF00003FFF0000ULL) >> 2) | (x & 0x00003FFF00003FFFULL);
    return ((x & 0x0FFFFFFF00000000ULL) >> 4) | (x & 0x000000000FFFFFFFULL);
}

static RT_MAYBE_UNUSED int packed_varints(const uint8_t *p, const uint8_t *end, int64_t *out, int64_t *count) {
    int64_t k = 0;
    while (p < end) {
        if (end - p >= 8) {
            uint64_t w = rd64(p);
            uint64_t m = ~w & 0x8080808080808080ULL;
            if (m == 0x8080808080808080ULL) {
                /* Eight one-byte values (the zeros of an image, small counts): each byte is its
                 * value, so they widen in one go with no per-value shifts. */
                if (out)
                    for (int i = 0; i < 8; i++) out[k + i] = p[i];
                k += 8;
                p += 8;
                continue;
            }
            uint64_t c = w & 0x8080808080808080ULL;
            if (m && !(c & (c << 8))) {
                /* Every value in the word is one or two bytes (pixels 0-255, small ids): compute
                 * all eight slots with no data-dependent branch, the j-th from the j-th byte
                 * that starts a value, and keep the ones that end inside the word. Slots past
                 * them are scratch: k never exceeds the bytes before p, and 8 more remain. */
                uint64_t starts = (m << 8) | 0x80;
                if (out)
                    for (int j = 0; j < 8; j++) {
                        uint64_t x = w >> ((__builtin_ctzll(starts | (1ULL << 63)) - 7) & 63);
                        out[k + j] = (int64_t)((x & 0x7F) | ((x >> 1) & 0x3F80 & (0 - ((x >> 7) & 1))));
                        starts &= starts - 1;
                    }
                /* one bit per byte: a multiply sums them (popcount is a libcall without -mpopcnt) */
                k += (int64_t)(((m >> 7) * 0x0101010101010101ULL) >> 56);
                p += 8 - (__builtin_clzll(m) >> 3);
                continue;
            }
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

/* Determines a Feature's kind the way protobuf's oneof does (a later member replaces an earlier
 * one, a repeat of the same member merges into it) and where the surviving run of fields begins. */
static RT_MAYBE_UNUSED int feature_kind(Ctx *c, const uint8_t *p, const uint8_t *end, int col, int *kind, const uint8_t **run) {
    *kind = K_NONE;
    *run = p;
    while (p < end) {
        const uint8_t *at = p, *vs, *ve;
        uint32_t f;
        int wt;
        if (rd_field(c, &p, end, &f, &wt, &vs, &ve, col)) return -1;
        if (wt == WT_LEN && f >= F_BYTES_LIST && f <= F_INT64_LIST) {
            int k = kind_of_field(f);
            if (k != *kind) {
                *kind = k;
                *run = at;
            }
        }
    }
    return 0;
}

/* Appends (when store) or counts the values of one list message of the given kind: int64 and
 * float values to vals, bytes values to data with their end offsets (int32) to vals. */
static RT_MAYBE_UNUSED int list_values(Ctx *c, Buf *vals, Buf *data, int ci, int kind, const uint8_t *p, const uint8_t *end,
                                       int store, int64_t *count) {
    while (p < end) {
        const uint8_t *vs, *ve, *at = p;
        uint32_t f = F_LIST_VALUE;
        int wt = WT_LEN;
        if (!ld_fast(&p, end, TAG_LIST_VALUE, &vs, &ve)) {
            if (rd_field(c, &p, end, &f, &wt, &vs, &ve, ci)) return -1;
            if (f != F_LIST_VALUE) continue;
        }
        if (kind == K_INT64) {
            if (wt == WT_LEN) {
                if (store && buf_reserve(vals, (size_t)(ve - vs) * 8)) return fail_at(c, RT_OUT_OF_MEMORY, at, ci);
                int64_t *out = store ? (int64_t *)(vals->p + vals->len) : NULL;
                int64_t k = 0;
                if (packed_varints(vs, ve, out, &k)) return fail_at(c, RT_MALFORMED_PACKED_INT64, vs, ci);
                if (store) vals->len += (size_t)k * 8;
                *count += k;
            } else if (wt == WT_VARINT) {
                uint64_t v = 0;
                const uint8_t *q = vs;
                rd_varint(&q, ve, &v);
                if (store) {
                    if (buf_reserve(vals, 8)) return fail_at(c, RT_OUT_OF_MEMORY, at, ci);
                    int64_t sv = (int64_t)v;
                    memcpy(vals->p + vals->len, &sv, 8);
                    vals->len += 8;
                }
                *count += 1;
            }
        } else if (kind == K_FLOAT) {
            if (wt == WT_LEN) {
                size_t nb = (size_t)(ve - vs);
                if (nb % 4) return fail_at(c, RT_MALFORMED_PACKED_FLOAT, at, ci);
                if (store) {
                    if (buf_reserve(vals, nb)) return fail_at(c, RT_OUT_OF_MEMORY, at, ci);
                    memcpy(vals->p + vals->len, vs, nb);
                    vals->len += nb;
                }
                *count += (int64_t)(nb / 4);
            } else if (wt == WT_I32) {
                if (store) {
                    if (buf_reserve(vals, 4)) return fail_at(c, RT_OUT_OF_MEMORY, at, ci);
                    memcpy(vals->p + vals->len, vs, 4);
                    vals->len += 4;
                }
                *count += 1;
            }
        } else if (wt == WT_LEN) { /* bytes */
            if (store) {
                size_t nb = (size_t)(ve - vs);
                if (data->len + nb > INT32_MAX) return fail_at(c, RT_BYTES_TOO_LARGE, at, ci);
                if (buf_reserve(data, nb) || buf_reserve(vals, 4)) return fail_at(c, RT_OUT_OF_MEMORY, at, ci);
                memcpy(data->p + data->len, vs, nb);
                data->len += nb;
                int32_t off = (int32_t)data->len;
                memcpy(vals->p + vals->len, &off, 4);
                vals->len += 4;
            }
            *count += 1;
        }
    }
    return 0;
}

/* A Feature message: its kind (K_NONE: none set), and either its only list (the usual Feature,
 * a single kind field) or the run of fields from which the surviving kind's lists are read. */
typedef struct {
    int kind;
    const uint8_t *run, *only, *only_end;
} Feature;

static inline int feature_parse(Ctx *c, const uint8_t *p, const uint8_t *end, int ci, Feature *ft) {
    const uint8_t *q = p, *vs, *ve;
    uint32_t f;
    int wt;
    ft->only = ft->only_end = NULL;
    if (end - p >= 3 && (p[0] == TAG_BYTES_LIST || p[0] == TAG_FLOAT_LIST || p[0] == TAG_INT64_LIST) &&
        ld_fast(&q, end, p[0], &vs, &ve) && q == end) {
        ft->kind = kind_of_field((uint32_t)p[0] >> WT_BITS);
        ft->run = p;
        ft->only = vs;
        ft->only_end = ve;
    } else if (q = p, p < end && rd_field(c, &q, end, &f, &wt, &vs, &ve, ci) == 0 && q == end && wt == WT_LEN &&
               f >= F_BYTES_LIST && f <= F_INT64_LIST) {
        ft->kind = kind_of_field(f);
        ft->run = p;
        ft->only = vs;
        ft->only_end = ve;
    } else if (feature_kind(c, p, end, ci, &ft->kind, &ft->run)) {
        return -1;
    }
    return 0;
}

/* The values of a parsed Feature (ending at end) through list_values; *count: how many. */
static inline int feature_collect(Ctx *c, const Feature *ft, const uint8_t *end, Buf *vals, Buf *data, int ci, int store,
                                  int64_t *count) {
    if (ft->only) return list_values(c, vals, data, ci, ft->kind, ft->only, ft->only_end, store, count);
    const uint8_t *q = ft->run;
    while (q < end) {
        const uint8_t *vs, *ve;
        uint32_t f;
        int wt;
        rd_field(c, &q, end, &f, &wt, &vs, &ve, ci); /* validated by feature_kind */
        if (wt == WT_LEN && f == field_of_kind(ft->kind))
            if (list_values(c, vals, data, ci, ft->kind, vs, ve, store, count)) return -1;
    }
    return 0;
}

/* The next Feature of a FeatureList (its repeated field 1; other fields are skipped): 1 with
 * [*vs, *ve) set, 0 at the end, -1 on error. */
static inline int next_list_feature(Ctx *c, const uint8_t **pp, const uint8_t *end, int ci,
                                     const uint8_t **vs, const uint8_t **ve) {
    while (*pp < end) {
        uint32_t f;
        int wt;
        if (rd_field(c, pp, end, &f, &wt, vs, ve, ci)) return -1;
        if (f == F_FEATURE_LIST_STEP && wt == WT_LEN) return 1;
    }
    return 0;
}

/* One entry (key = 1, value = 2) of a Features or FeatureLists map. */
typedef struct {
    const uint8_t *at; /* the entry's body, for error offsets */
    const uint8_t *key, *val, *val_end; /* val: NULL when the entry has no value */
    size_t key_len;
} MapEntry;

/* The next entry of the map [*pp, end): 1 and the entry, 0 at the map's end, -1 when malformed. */
static inline int map_entry(Ctx *c, const uint8_t **pp, const uint8_t *end, MapEntry *e) {
    const uint8_t *p = *pp, *vs, *ve;
    uint32_t f;
    int wt;
    for (;;) {
        if (p >= end) return 0;
        if (ld_fast(&p, end, TAG_MAP_ENTRY, &vs, &ve)) break;
        if (rd_field(c, &p, end, &f, &wt, &vs, &ve, -1)) return -1;
        if (f == F_MAP_ENTRY && wt == WT_LEN) break;
    }
    *pp = p;
    const uint8_t *key = vs, *val = NULL, *val_end = NULL, *q = vs;
    size_t key_len = 0;
    {
        const uint8_t *ks, *ke;
        /* the usual entry: key then value, nothing else */
        if (ld_fast(&q, ve, TAG_ENTRY_KEY, &ks, &ke)) {
            key = ks;
            key_len = (size_t)(ke - ks);
            if (ld_fast(&q, ve, TAG_ENTRY_VALUE, &val, &val_end) && q != ve) val = NULL;
        }
        if (q != ve) {
            q = vs;
            key = vs;
            key_len = 0;
            val = val_end = NULL;
        }
    }
    while (q < ve) {
        const uint8_t *s, *e2;
        if (rd_field(c, &q, ve, &f, &wt, &s, &e2, -1)) return -1;
        if (wt != WT_LEN) continue;
        if (f == F_ENTRY_KEY) {
            key = s;
            key_len = (size_t)(e2 - s);
        } else if (f == F_ENTRY_VALUE) {
            val = s;
            val_end = e2;
        }
    }
    *e = (MapEntry){vs, key, val, val_end, key_len};
    return 1;
}

/* Starts record r of rs: checks that its span lies inside the buffer and sets [*p, *end) to its
 * payload. */
static inline int record_begin(Ctx *c, const rt_records *rs, int64_t r, const uint8_t **p, const uint8_t **end) {
    c->record = r;
    if (!rt_span_ok(rs->n, rs->pos[r], rs->lens[r])) return fail_at(c, RT_BAD_SPAN, NULL, -1);
    *p = rs->buf + rs->pos[r] + RT_HEADER_BYTES;
    *end = *p + rs->lens[r];
    c->rec = *p;
    return 0;
}

/* The next map of a record's payload: Features (section 0) and, in a SequenceExample,
 * FeatureLists (section 1). 1 and the map's bytes, 0 at the payload's end, -1 when malformed. */
static inline int record_map(Ctx *c, const uint8_t **pp, const uint8_t *end, int rtype, const uint8_t **vs,
                             const uint8_t **ve, int *section) {
    while (*pp < end) {
        uint32_t f;
        int wt;
        if (rd_field(c, pp, end, &f, &wt, vs, ve, -1)) return -1;
        if (wt != WT_LEN) continue;
        if (f == F_FEATURES || (f == F_FEATURE_LISTS && rtype == R_SEQUENCE_EXAMPLE)) {
            *section = f == F_FEATURES ? SECTION_CONTEXT : SECTION_FEATURE_LISTS;
            return 1;
        }
    }
    return 0;
}

/* The walk of a call's records that decode and inspect share: every record's maps (Features and,
 * in a SequenceExample, FeatureLists), every entry of a map, every step of a FeatureList, every
 * Feature parsed. What a reader does with them is four callbacks on its own state (self), each
 * returning 0, or -1 after fail_at:
 *   column(self, c, entry, entry_no, section, *ci): the column of a map entry, -1 to skip it;
 *   feature(self, c, ci, ft, p, end): a Feature [p, end) of column ci whose kind is set (a context
 *     value, or a step of a feature list);
 *   step(self, c, ci): after each step of a feature list of column ci, whether or not it set a kind;
 *   end_record(self, c, count): after record c->record of count.
 * The walk is always inlined into each reader with its callbacks known, so the compiler flattens it
 * into the loop a hand-written walk would be: decode's hot loop pays no indirect call. */
typedef int (*walk_column_fn)(void *self, Ctx *c, const MapEntry *e, int entry_no, int section, int *ci);
typedef int (*walk_feature_fn)(void *self, Ctx *c, int ci, const Feature *ft, const uint8_t *p, const uint8_t *end);
typedef int (*walk_step_fn)(void *self, Ctx *c, int ci);
typedef int (*walk_record_fn)(void *self, Ctx *c, int64_t count);

typedef struct {
    walk_column_fn column;
    walk_feature_fn feature;
    walk_step_fn step;
    walk_record_fn end_record;
} Walker;

#define RT_FLATTEN inline __attribute__((always_inline))

static RT_FLATTEN int walk_feature(Ctx *c, const Walker w, void *self, int ci, const uint8_t *p, const uint8_t *end) {
    Feature ft;
    if (feature_parse(c, p, end, ci, &ft)) return -1;
    return ft.kind == K_NONE ? 0 : w.feature(self, c, ci, &ft, p, end);
}

static RT_FLATTEN int walk_map(Ctx *c, const Walker w, void *self, const uint8_t *p, const uint8_t *end, int section) {
    MapEntry e;
    int rc;
    for (int entry_no = 0; (rc = map_entry(c, &p, end, &e)) > 0; entry_no++) {
        int ci;
        if (w.column(self, c, &e, entry_no, section, &ci)) return -1;
        if (ci < 0 || !e.val) continue;
        if (section == SECTION_CONTEXT) {
            if (walk_feature(c, w, self, ci, e.val, e.val_end)) return -1;
            continue;
        }
        const uint8_t *q = e.val, *vs, *ve;
        while ((rc = next_list_feature(c, &q, e.val_end, ci, &vs, &ve)) > 0)
            if (walk_feature(c, w, self, ci, vs, ve) || w.step(self, c, ci)) return -1;
        if (rc < 0) return -1;
    }
    return rc;
}

/* Walks the records rs of record type rtype: RT_OK, or the failure's status with e saying where. */
static RT_FLATTEN rt_status walk_records(const rt_records *rs, int rtype, rt_error *e, const Walker w, void *self) {
    Ctx ctx = {.record = -1, .err = e}, *c = &ctx;
    for (int64_t r = 0; r < rs->count; r++) {
        const uint8_t *p, *end, *vs, *ve;
        int section, rc;
        if (record_begin(c, rs, r, &p, &end)) return e->status;
        while ((rc = record_map(c, &p, end, rtype, &vs, &ve, &section)) > 0)
            if (walk_map(c, w, self, vs, ve, section)) return e->status;
        if (rc < 0 || w.end_record(self, c, rs->count)) return e->status;
    }
    return RT_OK;
}

#endif
