/*
 * Recycles large output buffers between calls.
 *
 * A decode's column buffers live until Python drops the Arrow arrays over them: in a Ray read
 * task, until the block is in the object store. Freed, glibc hands such sizes back to the kernel
 * (munmap or a heap trim), so the next chunk's buffers start on fresh pages, and the kernel faults
 * in and zeroes every one of them: a third of a read task's time on image rows. Kept here instead,
 * the next chunk writes into pages that are already mapped.
 *
 * Bounded: at most RT_POOL_SLOTS buffers and RT_POOL_BYTES in all, each at least RT_POOL_MIN
 * (smaller ones glibc reuses well by itself); anything beyond is freed. The first RT_POOL_HOT are
 * kept as they are, as much as glibc may keep untrimmed; the pages of the rest are marked
 * MADV_FREE where the kernel has it, so that under memory pressure it may take them back (the
 * next write then faults in a zero page, as a fresh buffer would). Marking costs a page-table
 * walk, which is why the first ones are not marked. Thread-safe: decoding runs without the GIL.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* madvise and sysconf under -std=c11, when compiled alone (the fuzz harness) */
#endif
#include "common.h"

#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#define RT_POOL_BYTES ((size_t)256 << 20)
#define RT_POOL_SLOTS 32
#define RT_POOL_HOT ((size_t)64 << 20) /* glibc's own largest trim threshold */

static struct {
    atomic_flag lock;
    void *p[RT_POOL_SLOTS];
    size_t cap[RT_POOL_SLOTS];
    size_t bytes;
} pool = {ATOMIC_FLAG_INIT, {0}, {0}, 0};

static void pool_lock(void) {
    while (atomic_flag_test_and_set_explicit(&pool.lock, memory_order_acquire)) {
    }
}

static void pool_unlock(void) { atomic_flag_clear_explicit(&pool.lock, memory_order_release); }

/* Sizes round up to one of eight steps per power of two, so that the next chunk's slightly
 * different estimate still fits a cached buffer. */
static size_t size_class(size_t want) {
    size_t step = (size_t)1 << (63 - __builtin_clzll((unsigned long long)want) - 3);
    return (want + step - 1) / step * step;
}

RT_API void *rt_pool_alloc(size_t want, size_t *cap) {
    if (want < RT_POOL_MIN) {
        *cap = want;
        return malloc(want);
    }
    size_t size = size_class(want);
    int best = -1;
    pool_lock();
    /* The smallest that fits, and no more than twice the size: a far larger one would sit idle. */
    for (int i = 0; i < RT_POOL_SLOTS; i++)
        if (pool.p[i] && pool.cap[i] >= size && pool.cap[i] <= 2 * size && (best < 0 || pool.cap[i] < pool.cap[best]))
            best = i;
    void *p = NULL;
    if (best >= 0) {
        p = pool.p[best];
        *cap = pool.cap[best];
        pool.p[best] = NULL;
        pool.bytes -= *cap;
    }
    pool_unlock();
    if (p) return p;
    *cap = size;
    return malloc(size);
}

RT_API void rt_pool_free(void *p, size_t cap) {
    if (!p) return;
    if (cap < RT_POOL_MIN || cap > RT_POOL_BYTES) {
        free(p);
        return;
    }
#ifdef MADV_FREE
    /* Beyond what glibc itself keeps untrimmed, let the kernel take the pages back under pressure.
     * Done before the buffer is shared again, so that its next owner's writes come after it; only
     * whole pages inside it, as malloc's bookkeeping around it is not ours. */
    pool_lock();
    size_t held = pool.bytes;
    pool_unlock();
    if (held + cap > RT_POOL_HOT) {
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = ((uintptr_t)p + page - 1) & ~(page - 1),
                  end = ((uintptr_t)p + cap) & ~(page - 1);
        if (end > start) madvise((void *)start, end - start, MADV_FREE);
    }
#endif
    int slot = -1;
    pool_lock();
    if (pool.bytes + cap <= RT_POOL_BYTES)
        for (int i = 0; i < RT_POOL_SLOTS && slot < 0; i++)
            if (!pool.p[i]) slot = i;
    if (slot >= 0) {
        pool.p[slot] = p;
        pool.cap[slot] = cap;
        pool.bytes += cap;
    }
    pool_unlock();
    if (slot < 0) free(p);
}
