// RunContext::threadCount: an explicit count as given; 0 resolves to OpenMP's count, less two for the CUDA
// backend on 8 or more (its helper threads run beside the stages' loops).
#include <gtest/gtest.h>
#include <omp.h>

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

} // namespace
} // namespace gpuphot
