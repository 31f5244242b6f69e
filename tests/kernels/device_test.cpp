#include <gtest/gtest.h>

#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

TEST(CudaDevices, BackendRegistersItselfAndAutoResolves) {
    cuda::linkKernels();
    ASSERT_TRUE(cudaBackendLinked());
    const auto devices = listCudaDevices();
    if (devices.empty()) {
        EXPECT_EQ(resolveBackend(Backend::Auto), Backend::Cpu);
        EXPECT_THROW(resolveBackend(Backend::Cuda), InvalidInput);
        GTEST_SKIP() << "no CUDA device on this machine";
    }
    EXPECT_EQ(resolveBackend(Backend::Auto), Backend::Cuda);
    EXPECT_GT(devices.front().totalBytes, 0u);
    EXPECT_FALSE(devices.front().name.empty());
}
