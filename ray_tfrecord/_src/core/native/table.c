/* The feature-name hash table: FNV-1a, linear probing, at most half full. */
#include "table.h"

static uint64_t hash_key(const uint8_t *k, size_t n, int section) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)section;
    for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 1099511628211ULL;
    return h;
}

static void index_put(int32_t *index, uint32_t mask, const rt_key *k, int32_t i) {
    uint32_t h = (uint32_t)hash_key(k->name, k->len, k->section) & mask;
    while (index[h] >= 0) h = (h + 1) & mask;
    index[h] = i;
}

/* Rebuilding in insertion order keeps the first of equal keys first on its probe path. */
static int index_build(rt_table *t) {
    uint32_t size = 16;
    while (size < (uint32_t)t->nkeys * 2 + 2) size *= 2;
    int32_t *index = malloc(sizeof(int32_t) * size);
    if (!index) return -1;
    for (uint32_t i = 0; i < size; i++) index[i] = -1;
    for (int i = 0; i < t->nkeys; i++) index_put(index, size - 1, &t->keys[i], i);
    free(t->index);
    t->index = index;
    t->mask = size - 1;
    return 0;
}

RT_API int rt_table_add(rt_table *t, const uint8_t *name, size_t len, int section) {
    if (t->nkeys == t->cap) {
        int cap = t->cap ? t->cap * 2 : 32;
        rt_key *nk = realloc(t->keys, sizeof(rt_key) * (size_t)cap);
        if (!nk) return -1;
        t->keys = nk;
        t->cap = cap;
    }
    t->keys[t->nkeys] = (rt_key){name, len, section};
    t->nkeys++;
    if (!t->index || (uint32_t)t->nkeys * 2 + 2 > t->mask + 1) {
        if (index_build(t)) {
            t->nkeys--;
            return -1;
        }
    } else {
        index_put(t->index, t->mask, &t->keys[t->nkeys - 1], t->nkeys - 1);
    }
    return t->nkeys - 1;
}

RT_API int rt_table_find(const rt_table *t, const uint8_t *name, size_t len, int section) {
    if (!t->index) return -1;
    uint32_t h = (uint32_t)hash_key(name, len, section) & t->mask;
    for (;;) {
        int32_t i = t->index[h];
        if (i < 0) return -1;
        const rt_key *k = &t->keys[i];
        if (k->section == section && k->len == len && key_eq(k->name, name, len)) return i;
        h = (h + 1) & t->mask;
    }
}

RT_API void rt_table_free(rt_table *t) {
    free(t->keys);
    free(t->index);
    t->keys = NULL;
    t->index = NULL;
    t->nkeys = t->cap = 0;
}
