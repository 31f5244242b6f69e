// Where a process's large heap allocations come from, for machines without perf or heaptrack (the GPU
// machine): a preload that records every malloc, calloc, realloc and aligned allocation of at least
// ALLOC_TRACE_MIN bytes (default 1 MiB) with its caller's stack,
//   gcc -O2 -shared -fPIC -o liballoc_trace.so bench/alloc_trace.c
//   LD_PRELOAD=$PWD/liballoc_trace.so ALLOC_TRACE_OUT=/tmp/alloc gpuphot reduce ...
// glibc serves a request of 32 MiB or more with a fresh mapping, so its bytes are page faults when first
// touched: the bytes recorded here, per caller, bound the fresh pages the heap costs (buffers kept by
// core/util/host_pool.hpp are allocated once and then reused: they appear once). At exit, OUT.<pid> holds
// the records in bench/flat_profile.c's format (size in hex where the sampled address would be, the
// thread, ALLOC_TRACE_DEPTH return addresses, default 10), /proc/self/maps and the threads' names;
// bench/alloc_trace.py symbolises them. Child processes are not traced.
#define _GNU_SOURCE
#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "preload_dump.h"

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);

#define CAPACITY (1u << 20)
#define MAX_DEPTH 16
struct Record {
    size_t bytes;
    unsigned tid;
    int depth;
    void* stack[MAX_DEPTH];
};
static struct Record* g_records;
static unsigned g_count;
static size_t g_min = (size_t)1 << 20;
static int g_depth = 10;
static int g_on;
static char g_out[4096];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int t_inside; // backtrace may allocate: not recorded

static void record(size_t bytes) {
    if (!g_on || bytes < g_min || t_inside) return;
    t_inside = 1;
    void* frames[MAX_DEPTH + 2];
    const int got = backtrace(frames, g_depth + 2);
    pthread_mutex_lock(&g_lock);
    if (g_count < CAPACITY) {
        struct Record* r = &g_records[g_count++];
        r->bytes = bytes;
        r->tid = (unsigned)syscall(SYS_gettid);
        r->depth = got > 2 ? got - 2 : 0; // without record and the wrapper
        memcpy(r->stack, frames + 2, sizeof(void*) * (size_t)r->depth);
    }
    pthread_mutex_unlock(&g_lock);
    t_inside = 0;
}

void* malloc(size_t n) {
    record(n);
    return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
    record(a * b);
    return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
    record(n);
    return __libc_realloc(p, n);
}
void* memalign(size_t align, size_t n) {
    record(n);
    return __libc_memalign(align, n);
}
void* aligned_alloc(size_t align, size_t n) {
    record(n);
    return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
    record(n);
    void* p = __libc_memalign(align, n);
    if (!p) return 12; // ENOMEM
    *out = p;
    return 0;
}

static void dump(void) {
    g_on = 0;
    char path[4200];
    snprintf(path, sizeof path, "%s.%d", g_out, getpid());
    FILE* f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "samples %u\n", g_count);
    for (unsigned i = 0; i < g_count; ++i) {
        const struct Record* r = &g_records[i];
        fprintf(f, "%zx %u", r->bytes, r->tid);
        for (int k = 0; k < r->depth; ++k)
            fprintf(f, " %lx", (unsigned long)r->stack[k]);
        fprintf(f, "\n");
    }
    writeMapsAndThreads(f);
    fclose(f);
}

__attribute__((constructor)) static void start(void) {
    const char* out = getenv("ALLOC_TRACE_OUT");
    if (!out) return;
    snprintf(g_out, sizeof g_out, "%s", out);
    const char* min = getenv("ALLOC_TRACE_MIN");
    if (min) g_min = (size_t)strtoull(min, NULL, 10);
    const char* depth = getenv("ALLOC_TRACE_DEPTH");
    if (depth) g_depth = atoi(depth);
    g_depth = g_depth < 1 ? 1 : g_depth > MAX_DEPTH ? MAX_DEPTH : g_depth;
    unsetenv("LD_PRELOAD");
    unsetenv("ALLOC_TRACE_OUT");
    void* warm[4];
    backtrace(warm, 4); // loads libgcc_s now
    g_records = __libc_calloc(CAPACITY, sizeof(struct Record));
    if (!g_records) return;
    g_on = 1;
    atexit(dump);
}
