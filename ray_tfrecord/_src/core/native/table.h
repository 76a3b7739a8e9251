/* Feature names -> column indices, for decode (the schema's columns) and inspect (every feature
 * seen). A (name, section) pair is one key: a context feature and a feature_list may share a name. */
#ifndef RT_TABLE_H
#define RT_TABLE_H

#include "common.h"

#define PRED 64 /* map entries per record whose column is predicted from the previous record */

typedef struct {
    const uint8_t *name;
    size_t len;
    int section;
} rt_key;

typedef struct {
    const uint8_t *key;
    size_t len;
    int col;
} Pred;

typedef struct {
    rt_key *keys; /* keys[i]: column i's name */
    int nkeys, cap;
    int32_t *index; /* open addressing over keys, -1 empty; NULL while there are no keys */
    uint32_t mask;
    Pred pred[2][PRED];
} rt_table;

/* Appends a key; returns its column index, or -1 when out of memory. Names are borrowed. */
RT_API int rt_table_add(rt_table *t, const uint8_t *name, size_t len, int section);
/* The first column added with this key, or -1. */
RT_API int rt_table_find(const rt_table *t, const uint8_t *name, size_t len, int section);
RT_API void rt_table_free(rt_table *t);

static inline int key_eq(const uint8_t *a, const uint8_t *b, size_t n) {
    for (; n >= 8; n -= 8, a += 8, b += 8)
        if (rd64(a) != rd64(b)) return 0;
    while (n--)
        if (*a++ != *b++) return 0;
    return 1;
}

/* Records of one dataset list their features in the same order: the column of a record's
 * entry_no-th map entry is looked up once and then predicted from the previous record. */
static inline int rt_table_lookup(rt_table *t, int entry_no, int section, const uint8_t *key, size_t key_len) {
    Pred *pr = entry_no < PRED ? &t->pred[section][entry_no] : NULL;
    if (pr && pr->key && pr->len == key_len && key_eq(pr->key, key, key_len)) return pr->col;
    int ci = rt_table_find(t, key, key_len, section);
    if (pr) *pr = (Pred){key, key_len, ci};
    return ci;
}

/* After rt_table_add: the entry that missed predicts the new column from now on. */
static inline void rt_table_predict(rt_table *t, int entry_no, int section, int ci) {
    if (entry_no < PRED) t->pred[section][entry_no].col = ci;
}

#endif
