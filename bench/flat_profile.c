// A flat CPU profile of any process, for machines without perf (the GPU machine): built as a preload,
//   gcc -O2 -shared -fPIC -o libflat_profile.so bench/flat_profile.c
//   LD_PRELOAD=$PWD/libflat_profile.so FLAT_PROFILE_OUT=/tmp/prof gpuphot reduce ...
// SIGPROF fires every FLAT_PROFILE_US (default 1000) microseconds of the process's CPU time (every thread
// counts); the handler records the interrupted instruction and thread. At exit, OUT.<pid> holds the samples,
// /proc/self/maps and the live threads' names; bench/flat_profile.py symbolises them against unstripped
// binaries. Kernel time (page faults, copies in system calls) is charged to the user instruction that
// entered the kernel. Child processes are not profiled. FLAT_PROFILE_DEPTH=N (at most 8) also records N
// return addresses of the interrupted stack (glibc's backtrace: unwind tables, no frame pointers needed),
// so that time in libc and libm is charged to the caller that spent it.
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#include "preload_dump.h"

#define CAPACITY (1u << 21)
#define MAX_DEPTH 8
static unsigned long* g_pcs;
static void** g_stacks; // MAX_DEPTH + 2 per sample: the handler's own frames first
static int g_depth;
static unsigned int* g_tids;
static atomic_uint g_count;
static char g_out[4096];

static void onSample(int sig, siginfo_t* info, void* context) {
    (void)sig;
    (void)info;
    const unsigned i = atomic_fetch_add(&g_count, 1);
    if (i >= CAPACITY) return;
    g_pcs[i] = (unsigned long)((ucontext_t*)context)->uc_mcontext.gregs[REG_RIP];
    g_tids[i] = (unsigned int)syscall(SYS_gettid);
    if (g_depth > 0) {
        void** frames = g_stacks + (size_t)i * (MAX_DEPTH + 2);
        const int got = backtrace(frames, g_depth + 2);
        for (int k = got; k < MAX_DEPTH + 2; ++k)
            frames[k] = 0;
    }
}

static void dump(void) {
    const struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    char path[4200];
    snprintf(path, sizeof path, "%s.%d", g_out, getpid());
    FILE* f = fopen(path, "w");
    if (!f) return;
    unsigned n = atomic_load(&g_count);
    if (n > CAPACITY) n = CAPACITY;
    fprintf(f, "samples %u\n", n);
    for (unsigned i = 0; i < n; ++i) {
        fprintf(f, "%lx %u", g_pcs[i], g_tids[i]);
        for (int k = 0; g_depth > 0 && k < MAX_DEPTH + 2; ++k)
            fprintf(f, " %lx", (unsigned long)g_stacks[(size_t)i * (MAX_DEPTH + 2) + k]);
        fprintf(f, "\n");
    }
    writeMapsAndThreads(f);
    fclose(f);
}

__attribute__((constructor)) static void start(void) {
    const char* out = getenv("FLAT_PROFILE_OUT");
    if (!out) return;
    snprintf(g_out, sizeof g_out, "%s", out);
    const char* us = getenv("FLAT_PROFILE_US");
    const int period = us ? atoi(us) : 1000;
    unsetenv("LD_PRELOAD");
    unsetenv("FLAT_PROFILE_OUT");
    g_pcs = malloc(sizeof(unsigned long) * CAPACITY);
    g_tids = malloc(sizeof(unsigned int) * CAPACITY);
    const char* depth = getenv("FLAT_PROFILE_DEPTH");
    g_depth = depth ? atoi(depth) : 0;
    g_depth = g_depth < 0 ? 0 : g_depth > MAX_DEPTH ? MAX_DEPTH : g_depth;
    if (g_depth > 0) {
        void* warm[4];
        backtrace(warm, 4); // loads libgcc_s now: the handler must not
        g_stacks = calloc((size_t)CAPACITY * (MAX_DEPTH + 2), sizeof(void*));
        if (!g_stacks) g_depth = 0;
    }
    if (!g_pcs || !g_tids) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = onSample;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    const struct itimerval every = {{0, period > 0 ? period : 1000}, {0, period > 0 ? period : 1000}};
    setitimer(ITIMER_PROF, &every, NULL);
    atexit(dump);
}
