// Shared helpers of the CUDA tests (tests/kernels/*_test.cpp): the device check that skips a test on a
// machine without a GPU, run contexts, bitwise comparisons of arrays, images and every column of the stage
// results (docs/ARCHITECTURE.md, Determinism: CPU and CUDA agree bitwise), and small simulated frames with
// their CPU background and detections (the inputs of the later stages).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/model/image.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"

namespace gpuphot::cudatest {

// True when a CUDA device is usable (links the kernels into the stage table first).
bool haveDevice();

// Skips the calling test (GTEST_SKIP) when there is no CUDA device.
#define GPUPHOT_REQUIRE_DEVICE()                                                                             \
    do {                                                                                                     \
        if (!::gpuphot::cudatest::haveDevice()) GTEST_SKIP() << "no CUDA device";                            \
    } while (0)
#ifndef REQUIRE_DEVICE
#define REQUIRE_DEVICE() GPUPHOT_REQUIRE_DEVICE()
#endif

// A run context for one backend (2 threads by default: CI has 2 cores), with useEnvironment.
RunContext testContext(Backend backend, int threads = 2);
// ctx.tuning from the environment (BackendTuning::fromEnvironment, the documented GPUPHOT_... names) and
// the test hook GPUPHOT_TEST_DETECTION_RANK_MAX: tests set those variables for a scope (EnvOverride) and
// call this before a stage, as the front ends fill the tuning at start-up.
void useEnvironment(RunContext& ctx);
// An environment variable set for a scope (the kernels' comparison switches, GPUPHOT_...), unset after it.
struct EnvOverride {
    EnvOverride(const char* name, const char* value) : m_name(name) { ::setenv(name, value, 1); }
    ~EnvOverride() { ::unsetenv(m_name); }
    EnvOverride(const EnvOverride&) = delete;
    EnvOverride& operator=(const EnvOverride&) = delete;

private:
    const char* m_name;
};

inline RunContext cpuContext() { return testContext(Backend::Cpu); }
inline RunContext cudaContext() { return testContext(Backend::Cuda); }

// splitmix64: a fast, seeded generator for large test images (151 Mpx).
struct SplitMix64 {
    std::uint64_t s;
    explicit SplitMix64(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    std::uint64_t next() {
        std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); } // [0, 1)
    // roughly normal (sum of three uniforms), mean m, sigma sd
    float normal(float m, float sd) { return m + sd * 2.0f * (uniform() + uniform() + uniform() - 1.5f); }
    int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); } // [0, n)
};

// Bitwise comparison of n values; on a difference: the count, the first one and (floating point) the
// largest difference in ulps.
template <class T>
::testing::AssertionResult sameBits(const T* a, const T* b, std::size_t n, const std::string& what) {
    std::size_t diff = 0, first = n;
    long long maxUlp = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(T)) == 0) continue;
        if (first == n) first = i;
        ++diff;
        if constexpr (std::is_floating_point_v<T>) {
            using Bits = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
            Bits ia, ib;
            std::memcpy(&ia, &a[i], sizeof(T));
            std::memcpy(&ib, &b[i], sizeof(T));
            const long long d = static_cast<long long>(ia) - static_cast<long long>(ib);
            maxUlp = std::max(maxUlp, d < 0 ? -d : d);
        }
    }
    if (diff == 0) return ::testing::AssertionSuccess();
    auto failure = ::testing::AssertionFailure();
    failure << what << ": " << diff << " of " << n << " values differ (first at " << first << ": "
            << +a[first] << " vs " << +b[first] << ")";
    if constexpr (std::is_floating_point_v<T>) failure << ", max " << maxUlp << " ulp";
    return failure;
}

template <class T>
::testing::AssertionResult sameVec(const std::vector<T>& a, const std::vector<T>& b,
                                   const std::string& what) {
    if (a.size() != b.size())
        return ::testing::AssertionFailure() << what << ": " << a.size() << " vs " << b.size() << " entries";
    return sameBits(a.data(), b.data(), a.size(), what);
}

template <class T>
::testing::AssertionResult sameImage(const Image<T>& a, const Image<T>& b, const std::string& what) {
    if (a.width() != b.width() || a.height() != b.height())
        return ::testing::AssertionFailure() << what << ": sizes differ";
    return sameBits(a.data(), b.data(), static_cast<std::size_t>(a.width()) * a.height(), what);
}

// Every map, global value and count of two background results, bitwise.
void expectSameBackground(const BackgroundResult& c, const BackgroundResult& g);
// Every Sources column, the counts and the segmentation map of two detection results, bitwise.
void expectSameDetection(const DetectionResult& c, const DetectionResult& g);
// Every column of two aperture results (per radius and per source) and the star count, bitwise.
void expectSameApertures(const ApertureResult& c, const ApertureResult& g);

// Detection parameter sets that exercise each filter path: {"default", defaults}, {"no filter", filter off},
// {"2-D kernel 3x5", a 3-wide, 5-high integer kernel}.
std::vector<std::pair<std::string, DetectionParams>> detectionFilterCases();

// simulateField with its defaults but for the size, the number of stars and the seed.
SimResult simulateSmall(int width, int height, int stars, std::uint64_t seed);

// A simulated field with its CPU background (default parameters) and CPU detections.
struct SimField {
    SimResult sim;
    BackgroundResult bkg;
    DetectionResult det;
};
SimField simulateDetectedField(int width, int height, int stars, std::uint64_t seed);

// The backend's stage called directly (cpu:: or cuda:: by ctx.backend, whether or not core would
// dispatch to it) on a SimField: background and detection with the field's defect mask, detection on the
// field's background; apertures at `sources` with the field's background, optionally without the mask
// and the segmentation map, and the 3.0 / 1.5 / 6.0 gain, read noise and FWHM the CUDA tests use.
BackgroundResult runBackground(const SimField& f, RunContext& ctx);
DetectionResult runDetection(const SimField& f, const DetectionParams& p, RunContext& ctx);
// cpu:: or cuda::measureApertures with a host view of the map, by ctx.backend.
using ApertureStageFn = ApertureResult (*)(const ImageView&, const MaskView&, const BackgroundResult&,
                                           const ImageViewT<std::int32_t>&, const Sources&, double, double,
                                           double, const ApertureParams&, RunContext&);
ApertureStageFn apertureStage(const RunContext& ctx);
ApertureResult runApertures(const SimField& f, const Sources& sources, const ApertureParams& p,
                            RunContext& ctx, bool withMask = true, bool withSeg = true);

} // namespace gpuphot::cudatest
