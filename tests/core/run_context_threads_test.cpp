// RunContext::threadCount: an explicit count as given; 0 resolves to OpenMP's count, less two for the CUDA
// backend on 8 or more (its helper threads run beside the stages' loops).
#include <gtest/gtest.h>
#include <omp.h>
#include <thread>

#include "core/pipeline/run_context.hpp"

namespace gpuphot {
namespace {

TEST(RunContextThreads, CudaBackendLeavesCoresForItsHelperThreads) {
    const int saved = omp_get_max_threads();
    RunContext ctx;
    omp_set_num_threads(16);
    ctx.backend = Backend::Cpu;
    EXPECT_EQ(ctx.threadCount(), 16);
    ctx.backend = Backend::Cuda;
    EXPECT_EQ(ctx.threadCount(), 12); // 16 or more: four free
    omp_set_num_threads(32);
    EXPECT_EQ(ctx.threadCount(), 28);
    omp_set_num_threads(15); // 8 to 15: two
    EXPECT_EQ(ctx.threadCount(), 13);
    omp_set_num_threads(8);
    EXPECT_EQ(ctx.threadCount(), 6);
    omp_set_num_threads(4); // small machines: all of them
    EXPECT_EQ(ctx.threadCount(), 4);
    ctx.threads = 16; // explicit: as given, on any backend
    EXPECT_EQ(ctx.threadCount(), 16);
    ctx.backend = Backend::Cpu;
    ctx.threads = 3;
    EXPECT_EQ(ctx.threadCount(), 3);
    omp_set_num_threads(saved);
}

TEST(RunContextThreads, OmpThreadLimitHoldsOnItsThreadOnly) {
    const int saved = omp_get_max_threads();
    auto onAnotherThread = [] {
        int n = 0;
        std::thread([&] { n = omp_get_max_threads(); }).join();
        return n;
    };
    const int fresh = onAnotherThread(); // what a new thread starts with
    const int n = fresh + 1;             // a count no other thread has
    omp_set_num_threads(fresh + 2);
    {
        const OmpThreadLimit limit(n);
        EXPECT_EQ(omp_get_max_threads(), n);
        int team = 0;
#pragma omp parallel
        {
#pragma omp single
            team = omp_get_num_threads();
        }
        EXPECT_LE(team, n); // a region that names no count (dynamic adjustment may give fewer)
        EXPECT_GE(team, 1);
        EXPECT_EQ(onAnotherThread(), fresh);
        {
            const OmpThreadLimit none(0); // no change
            EXPECT_EQ(omp_get_max_threads(), n);
        }
    }
    EXPECT_EQ(omp_get_max_threads(), fresh + 2);
    omp_set_num_threads(saved);
}

} // namespace
} // namespace gpuphot

// One of K contexts in flight left at all cores gets ceil(cores / K); a count given is kept, as is one
// context alone.
TEST(RunContextThreads, ThreadShareSplitsAllCoresOnly) {
    gpuphot::RunContext all;
    const int cores = all.threadCount();
    EXPECT_EQ(gpuphot::threadShare(all, 3), (cores + 2) / 3);
    EXPECT_EQ(gpuphot::threadShare(all, 1), 0);
    gpuphot::RunContext given;
    given.threads = 5;
    EXPECT_EQ(gpuphot::threadShare(given, 3), 5);
}
