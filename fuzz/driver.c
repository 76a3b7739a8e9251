/*
 * A stand-in for libFuzzer where clang's is not available (a gcc -fsanitize=address,undefined
 * build): runs every corpus file through the target, then random mutations of them until the time
 * is up. Usage: driver [-seconds=N] [-seed=N] [-artifact_prefix=DIR/] FILE_OR_DIR...
 * In a sanitized build the input being run when a sanitizer or a check fires is saved as
 * <prefix>crash-<time> so that it can be replayed (driver FILE) and turned into a regression test.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define DRIVER_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DRIVER_SANITIZED 1
#endif
#endif
#ifdef DRIVER_SANITIZED
#include <sanitizer/common_interface_defs.h>
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    uint8_t *p;
    size_t n;
} Input;

static Input *corpus;
static size_t ncorpus, capcorpus;
static const uint8_t *current;
static size_t current_n;
static char prefix[4096] = "./";

static void save_current(void) {
    char path[4200];
    snprintf(path, sizeof(path), "%scrash-%ld", prefix, (long)time(NULL));
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(current, 1, current_n, f);
        fclose(f);
        fprintf(stderr, "driver: input saved to %s\n", path);
    }
}

static void add_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n) n = 0;
    fclose(f);
    if (ncorpus == capcorpus) {
        capcorpus = capcorpus ? capcorpus * 2 : 64;
        corpus = realloc(corpus, capcorpus * sizeof(Input));
    }
    corpus[ncorpus++] = (Input){p, (size_t)(n > 0 ? n : 0)};
}

static void add_path(const char *path) {
    struct stat st;
    if (stat(path, &st)) return;
    if (!S_ISDIR(st.st_mode)) {
        add_file(path);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[4096];
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        add_path(sub);
    }
    if (d) closedir(d);
}

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* One run: an exact-size heap copy, so ASan sees a read one byte past the input. */
static void run(const uint8_t *p, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, p, n);
    current = copy;
    current_n = n;
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
}

/* libFuzzer-like mutations: bit flips, interesting bytes, inserts, erases, copies, splices. */
static size_t mutate(uint8_t *p, size_t n, size_t cap) {
    static const uint8_t interesting[] = {0, 1, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x1A, 0x08, 0x0D, 0x02, 0x05};
    int rounds = 1 + (int)(next() % 4);
    for (int r = 0; r < rounds; r++) {
        size_t at = n ? next() % n : 0;
        switch (next() % 7) {
        case 0:
            if (n) p[at] ^= (uint8_t)(1u << (next() % 8));
            break;
        case 1:
            if (n) p[at] = interesting[next() % sizeof(interesting)];
            break;
        case 2:
            if (n) p[at] = (uint8_t)next();
            break;
        case 3: { /* insert */
            size_t k = 1 + next() % 8;
            if (n + k > cap) break;
            memmove(p + at + k, p + at, n - at);
            for (size_t i = 0; i < k; i++) p[at + i] = (uint8_t)next();
            n += k;
            break;
        }
        case 4: { /* erase */
            size_t k = 1 + next() % 8;
            if (at + k > n) break;
            memmove(p + at, p + at + k, n - at - k);
            n -= k;
            break;
        }
        case 5: { /* copy a stretch within the input */
            if (n < 2) break;
            size_t from = next() % n, k = 1 + next() % (n - (from > at ? from : at));
            memmove(p + at, p + from, k);
            break;
        }
        default: { /* splice in part of another corpus input */
            const Input *o = &corpus[next() % ncorpus];
            if (!o->n) break;
            size_t from = next() % o->n, k = 1 + next() % (o->n - from);
            if (at + k > cap) k = cap - at;
            memcpy(p + at, o->p + from, k);
            if (at + k > n) n = at + k;
        }
        }
    }
    return n;
}

int main(int argc, char **argv) {
    double seconds = 10;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "-seconds=", 9)) seconds = atof(argv[i] + 9);
        else if (!strncmp(argv[i], "-seed=", 6)) rng = strtoull(argv[i] + 6, NULL, 10) | 1;
        else if (!strncmp(argv[i], "-artifact_prefix=", 17)) snprintf(prefix, sizeof(prefix), "%s", argv[i] + 17);
        else if (argv[i][0] != '-') add_path(argv[i]);
    }
#ifdef DRIVER_SANITIZED
    __sanitizer_set_death_callback(save_current);
#endif
    LLVMFuzzerInitialize(&argc, &argv);
    if (!ncorpus) add_file("/dev/null");
    for (size_t i = 0; i < ncorpus; i++) run(corpus[i].p, corpus[i].n);
    size_t cap = 1 << 16, execs = ncorpus;
    uint8_t *buf = malloc(cap);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 >= seconds) break;
        const Input *base = &corpus[next() % ncorpus];
        size_t n = base->n < cap ? base->n : cap;
        memcpy(buf, base->p, n);
        for (int k = 0; k < 64; k++) { /* a few generations from one base */
            n = mutate(buf, n, cap);
            run(buf, n);
            execs++;
        }
    }
    fprintf(stderr, "driver: %zu inputs, %zu executions in %.0f s, no findings\n", ncorpus, execs, seconds);
    free(buf);
    return 0;
}
