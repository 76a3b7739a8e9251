/*
 * Recycles large output buffers between calls.
 *
 * A decode's column buffers live until Python drops the Arrow arrays over them: in a Ray read
 * task, until the block is in the object store. Freed, glibc hands such sizes back to the kernel
 * (munmap or a heap trim), so the next chunk's buffers start on fresh pages, and the kernel faults
 * in and zeroes every one of them: a third of a read task's time on image rows. Kept here instead,
 * the next chunk writes into pages that are already mapped.
 *
 * Bounded: at most RT_POOL_BYTES in all, in buffers of at least RT_POOL_MIN (smaller ones glibc
 * reuses well by itself), held in RT_POOL_SLOTS shared slots and RT_POOL_LOCAL slots per thread;
 * anything beyond is freed. While the pool holds under RT_POOL_HOT, buffers are kept as they are,
 * as much as glibc may keep untrimmed; the pages of the rest are marked MADV_FREE where the kernel
 * has it, so that under memory pressure it may take them back (the next write then faults in a
 * zero page, as a fresh buffer would). Marking costs a page-table walk, which is why the first
 * ones are not marked.
 *
 * Thread-safe, since decoding runs without the GIL: each thread first tries its own few slots,
 * without a lock, then the shared ones behind a mutex (a thread that waits sleeps, unlike the spin
 * lock this replaced, which burnt the CPU of a core that a decode could use). A buffer goes back
 * to the cache of the thread that frees it, wherever it was allocated (Arrow's release callbacks
 * run wherever Python drops an array), but only while that thread also allocates: no other thread
 * takes from its slots, so a thread that frees and does not allocate (the main thread that uses and
 * drops the batches that decoder threads make) would strand them there, counted against the bound,
 * and turn recycling off. Such a thread, one that never allocated or has freed more buffers since
 * it last allocated than its slots hold, puts buffers into the shared slots, and moves its own
 * there. A thread's slots also move to the shared ones when it exits.
 */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* madvise and sysconf under -std=c11, when compiled alone (the fuzz harness) */
#endif
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#define RT_POOL_SLOTS 32
#define RT_POOL_LOCAL 4
#define RT_POOL_HOT ((size_t)64 << 20) /* glibc's own largest trim threshold */

typedef struct {
    void *p[RT_POOL_SLOTS];
    size_t cap[RT_POOL_SLOTS];
} Slots;

/* Bytes in every cache, the threads' and the shared one: reserved before a buffer goes in. */
static atomic_size_t pool_held;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static Slots pool_shared;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static pthread_key_t pool_key;
static int pool_key_ok;
/* This thread's slots (the first RT_POOL_LOCAL of a Slots), allocated on first use. */
static _Thread_local Slots *pool_mine;
/* Buffers this thread freed since it last allocated one; a thread that never allocated counts as
 * having freed its slots' worth, so that its first frees already go to the shared slots. */
static _Thread_local size_t pool_frees = RT_POOL_LOCAL;

/* Sizes round up to one of eight steps per power of two, so that the next chunk's slightly
 * different estimate still fits a cached buffer. */
static size_t size_class(size_t want) {
    size_t step = (size_t)1 << (63 - __builtin_clzll((unsigned long long)want) - 3);
    return (want + step - 1) / step * step;
}

/* Takes the smallest buffer of n slots that fits size and is no more than twice it (a far larger
 * one would sit idle), or NULL. */
static void *slots_take(Slots *s, int n, size_t size, size_t *cap) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (s->p[i] && s->cap[i] >= size && s->cap[i] <= 2 * size && (best < 0 || s->cap[i] < s->cap[best])) best = i;
    if (best < 0) return NULL;
    void *p = s->p[best];
    *cap = s->cap[best];
    s->p[best] = NULL;
    atomic_fetch_sub(&pool_held, *cap);
    return p;
}

/* Puts p into a free one of n slots; 0, or -1 when all are taken. */
static int slots_put(Slots *s, int n, void *p, size_t cap) {
    for (int i = 0; i < n; i++)
        if (!s->p[i]) {
            s->p[i] = p;
            s->cap[i] = cap;
            return 0;
        }
    return -1;
}

static void *shared_take(size_t size, size_t *cap) {
    pthread_mutex_lock(&pool_lock);
    void *p = slots_take(&pool_shared, RT_POOL_SLOTS, size, cap);
    pthread_mutex_unlock(&pool_lock);
    return p;
}

/* Into the shared slots, or freed when they are full (its bytes were reserved in pool_held). */
static void shared_put(void *p, size_t cap) {
    pthread_mutex_lock(&pool_lock);
    int rc = slots_put(&pool_shared, RT_POOL_SLOTS, p, cap);
    pthread_mutex_unlock(&pool_lock);
    if (rc) {
        atomic_fetch_sub(&pool_held, cap);
        free(p);
    }
}

/* A thread's slots to the shared ones. */
static void slots_drain(Slots *s) {
    for (int i = 0; i < RT_POOL_LOCAL; i++)
        if (s->p[i]) {
            shared_put(s->p[i], s->cap[i]);
            s->p[i] = NULL;
        }
}

/* At a thread's exit. */
static void mine_drain(void *arg) {
    slots_drain(arg);
    free(arg);
    pool_mine = NULL;
}

/* A fork while another thread holds the lock would leave the child's copy locked for good. */
static void lock_for_fork(void) { pthread_mutex_lock(&pool_lock); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&pool_lock); }

static size_t slots_bytes(const Slots *s, int n) {
    size_t sum = 0;
    for (int i = 0; i < n; i++)
        if (s->p[i]) sum += s->cap[i];
    return sum;
}

/* The child has only the forking thread: the other threads' slots are gone from it (their memory
 * unreachable), so what it holds is the shared slots and its own; counting the rest would shrink
 * its pool for good. */
static void child_after_fork(void) {
    size_t held = slots_bytes(&pool_shared, RT_POOL_SLOTS);
    if (pool_mine) held += slots_bytes(pool_mine, RT_POOL_LOCAL);
    atomic_store(&pool_held, held);
    pthread_mutex_unlock(&pool_lock);
}

static void pool_init(void) {
    pool_key_ok = pthread_key_create(&pool_key, mine_drain) == 0;
    pthread_atfork(lock_for_fork, unlock_after_fork, child_after_fork);
}

/* This thread's slots, or NULL when it cannot have any (then only the shared ones are used). */
static Slots *mine(void) {
    if (pool_mine) return pool_mine;
    pthread_once(&pool_once, pool_init);
    if (!pool_key_ok) return NULL;
    Slots *s = calloc(1, sizeof(Slots));
    if (s && pthread_setspecific(pool_key, s)) {
        free(s);
        s = NULL;
    }
    return pool_mine = s;
}

RT_API void *rt_pool_alloc(size_t want, size_t *cap) {
    if (want < RT_POOL_MIN) {
        *cap = want;
        return malloc(want);
    }
    size_t size = size_class(want);
    pool_frees = 0;
    Slots *s = mine();
    void *p = s ? slots_take(s, RT_POOL_LOCAL, size, cap) : NULL;
    if (!p) p = shared_take(size, cap);
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
    int keep = pool_frees < RT_POOL_LOCAL; /* whether this thread's own slots still get taken from */
    if (keep) pool_frees++;
    else if (pool_mine) slots_drain(pool_mine);
    size_t held = atomic_fetch_add(&pool_held, cap);
    if (held + cap > RT_POOL_BYTES) {
        atomic_fetch_sub(&pool_held, cap);
        free(p);
        return;
    }
#ifdef MADV_FREE
    /* Beyond what glibc itself keeps untrimmed, let the kernel take the pages back under pressure.
     * Done before the buffer is shared again, so that its next owner's writes come after it; only
     * whole pages inside it, as malloc's bookkeeping around it is not ours. */
    if (held + cap > RT_POOL_HOT) {
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = ((uintptr_t)p + page - 1) & ~(page - 1),
                  end = ((uintptr_t)p + cap) & ~(page - 1);
        if (end > start) madvise((void *)start, end - start, MADV_FREE);
    }
#endif
    Slots *s = keep ? mine() : NULL;
    if (!s || slots_put(s, RT_POOL_LOCAL, p, cap)) shared_put(p, cap);
}

RT_API size_t rt_pool_held(void) { return atomic_load(&pool_held); }
