// GPU frame preparation (kernels/prepare/prepare.cu) against the CPU path of prepareFrame: pixels, mask and the
// counts bitwise equal with every combination of masters, flat-guard cases, non-finite values, trimmed
// frames (masters of the raw size, strided views), overscan per frame and per row; bleed trails and
// saturation growth along the columns (trails at the frame edges, several per column, NaNs, bleedGrow
// 0..3 and large); the frame taken from the device frame cache when resident (no upload), masters
// uploaded once and kept; the result left as the frame cache; the CPU path when the device has no room.
// GPUPHOT_BENCH_PREPARE=1 adds the 151 Mpx timing (printed; no timing assertion).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/prepare.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;

namespace {

using namespace gpuphot::cudatest;

Frame makeFrame(int w, int h, unsigned seed) {
    Frame f;
    f.pixels = Image<float>(w, h, 0.0f);
    f.mask = Image<std::uint8_t>(w, h, 0);
    SplitMix64 rng(seed);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            float v = rng.normal(1000.0f, 50.0f);
            const float r = rng.uniform();
            if (r < 0.002f) v = std::numeric_limits<float>::quiet_NaN();
            else if (r < 0.004f) v = 65535.0f;
            f.pixels(x, y) = v;
            const float q = rng.uniform();
            if (q < 0.01f) f.mask(x, y) = MaskBad;
            else if (q < 0.02f) f.mask(x, y) = MaskSaturated;
        }
    f.instrument.exptime = 37.5;
    f.instrument.saturation = std::numeric_limits<double>::quiet_NaN(); // no bleed trails here
    f.header.set("EXPTIME", 37.5);
    return f;
}

CalibrationImage makeMaster(int w, int h, float level, float sigma, unsigned seed, bool flat) {
    CalibrationImage c;
    c.pixels = Image<float>(w, h, 0.0f);
    c.mask = Image<std::uint8_t>(w, h, 0);
    SplitMix64 rng(seed);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            float v = rng.normal(level, sigma);
            const float r = rng.uniform();
            if (flat) {
                if (r < 0.003f) v = 0.0f;
                else if (r < 0.006f) v = 0.05f; // == minFlat: guarded
                else if (r < 0.008f) v = std::nextafter(0.05f, 1.0f);
                else if (r < 0.010f) v = -0.3f;
                else if (r < 0.012f) v = std::numeric_limits<float>::infinity();
                else if (r < 0.014f) v = std::numeric_limits<float>::quiet_NaN();
            } else if (r < 0.002f) {
                v = std::numeric_limits<float>::quiet_NaN();
            }
            c.pixels(x, y) = v;
            if (rng.uniform() < 0.003f) c.mask(x, y) = MaskBad;
        }
    c.path = flat ? "flat.fits" : "master.fits";
    return c;
}

PrepareInputs makeInputs(int w, int h, bool bias, bool dark, bool flat, bool bpm, unsigned seed) {
    PrepareInputs in;
    if (bias) in.bias = makeMaster(w, h, 300.0f, 5.0f, seed + 1, false);
    if (dark) {
        in.dark = makeMaster(w, h, 20.0f, 3.0f, seed + 2, false);
        in.dark->header.set("EXPTIME", 60.0);
    }
    if (flat) in.flat = makeMaster(w, h, 1.0f, 0.05f, seed + 3, true);
    if (bpm) {
        in.badPixels = Image<std::uint8_t>(w, h, 0);
        SplitMix64 rng(seed + 4);
        for (std::size_t i = 0; i < in.badPixels.pixelCount(); ++i) in.badPixels.data()[i] = rng.uniform() < 0.005f;
        in.badPixelPath = "bpm.fits";
    }
    return in;
}

::testing::AssertionResult sameFrames(const Frame& a, const Frame& b) {
    if (a.width() != b.width() || a.height() != b.height()) return ::testing::AssertionFailure() << "sizes";
    const std::size_t n = a.pixels.pixelCount();
    std::size_t dp = 0, dnan = 0, dm = 0;
    std::uint32_t ba = 0, bb = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (std::memcmp(&a.pixels.data()[i], &b.pixels.data()[i], sizeof(float)) != 0) {
            if (std::isnan(a.pixels.data()[i]) && std::isnan(b.pixels.data()[i])) {
                if (dnan++ == 0) {
                    std::memcpy(&ba, &a.pixels.data()[i], 4);
                    std::memcpy(&bb, &b.pixels.data()[i], 4);
                }
            } else {
                ++dp;
            }
        }
        if (a.mask.data()[i] != b.mask.data()[i]) ++dm;
    }
    // NaN payloads count too (bitwise), reported apart.
    if (dp || dnan || dm)
        return ::testing::AssertionFailure() << dp << " pixels, " << dnan << " NaN payloads (first 0x" << std::hex
                                             << ba << " vs 0x" << bb << std::dec << ") and " << dm
                                             << " mask values differ";
    return ::testing::AssertionSuccess();
}

PrepareParams paramsNoExtras() {
    PrepareParams p;
    p.autoBadPixels = false;
    p.bleedTrails = false;
    return p;
}

} // namespace

TEST(PrepareCuda, EveryCombinationOfMastersMatchesCpuBitwise) {
    REQUIRE_DEVICE();
    ASSERT_NE(cudaStages().prepare, nullptr);
    const int w = 203, h = 117; // odd sizes: partial blocks
    int combos = 0;
    for (int bits = 1; bits < 16; ++bits) {
        const PrepareInputs in = makeInputs(w, h, bits & 1, bits & 2, bits & 4, bits & 8, 10u * bits);
        const Frame raw = makeFrame(w, h, 100u + bits);
        Frame a = raw, b = raw;
        RunContext cc = testContext(Backend::Cpu), gc = testContext(Backend::Cuda);
        PrepareParams p = paramsNoExtras();
        p.minFlat = 0.05;
        const PrepareResult ra = prepareFrame(a, &in, p, cc);
        const PrepareResult rb = prepareFrame(b, &in, p, gc);
        EXPECT_TRUE(sameFrames(a, b)) << "masters " << bits;
        EXPECT_EQ(ra.badPixels, rb.badPixels) << bits;
        EXPECT_EQ(ra.steps, rb.steps) << bits;
        EXPECT_EQ(a.instrument.saturation == b.instrument.saturation ||
                      (std::isnan(a.instrument.saturation) && std::isnan(b.instrument.saturation)),
                  true);
        if (bits & 4) {
            EXPECT_GT(rb.badPixels, 0u); // the flat guard fired
        }
        EXPECT_EQ(cuda::DeviceContext::of(gc).planMode(), "whole");
        ++combos;
    }
    EXPECT_EQ(combos, 15);
}

TEST(PrepareCuda, TrimmedFrameWithRawSizeMastersAndBleedTrails) {
    REQUIRE_DEVICE();
    const int rw = 160, rh = 96;
    const PrepareInputs in = makeInputs(rw, rh, true, true, true, true, 77);
    Frame raw = makeFrame(rw, rh, 78);
    raw.header.set("TRIMSEC", "[5:150,3:90]");
    raw.header.set("BIASSEC", "[152:160,1:96]");
    raw.instrument.saturation = 60000.0; // bleed trails before the calibration
    for (int y = 31; y < 40; ++y) raw.mask(20, y) = MaskSaturated;
    for (const char* method : {"median", "row"}) {
        Frame a = raw, b = raw;
        RunContext cc = testContext(Backend::Cpu), gc = testContext(Backend::Cuda);
        PrepareParams p;
        p.overscanMethod = method;
        const PrepareResult ra = prepareFrame(a, &in, p, cc);
        const PrepareResult rb = prepareFrame(b, &in, p, gc);
        ASSERT_TRUE(ra.trimmed);
        EXPECT_EQ(a.width(), 146);
        EXPECT_TRUE(sameFrames(a, b)) << method;
        EXPECT_EQ(ra.badPixels, rb.badPixels);
        EXPECT_EQ(ra.bleedPixels, rb.bleedPixels);
        EXPECT_EQ(ra.overscanLevel, rb.overscanLevel);
    }
}

TEST(PrepareCuda, MastersStayResidentAndTheResultIsTheFrameCache) {
    REQUIRE_DEVICE();
    const int w = 128, h = 96;
    const PrepareInputs in = makeInputs(w, h, true, true, true, true, 5);
    RunContext gc = testContext(Backend::Cuda);
    const PrepareParams p = paramsNoExtras();
    Frame f1 = makeFrame(w, h, 1);
    prepareFrame(f1, &in, p, gc);
    const std::uint64_t afterFirst = cuda::prepareMasterUploads();
    auto& dc = cuda::DeviceContext::of(gc);
    // The following stages find the calibrated frame on the device: no upload.
    const std::uint64_t frameUploads = dc.uploads();
    const auto df = dc.frame(f1.view(), f1.maskView());
    EXPECT_EQ(dc.uploads(), frameUploads);
    ASSERT_NE(df.pixels, nullptr);
    std::vector<float> back(static_cast<std::size_t>(w) * h);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); // the frame cache is written on a non-blocking stream
    ASSERT_EQ(cudaMemcpy(back.data(), df.pixels, back.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::memcmp(back.data(), f1.pixels.data(), back.size() * sizeof(float)), 0);
    // More frames with the same masters: nothing uploaded again.
    for (unsigned s = 2; s < 5; ++s) {
        Frame f = makeFrame(w, h, s), c = f;
        prepareFrame(f, &in, p, gc);
        RunContext cc = testContext(Backend::Cpu);
        prepareFrame(c, &in, p, cc);
        EXPECT_TRUE(sameFrames(f, c));
    }
    EXPECT_EQ(cuda::prepareMasterUploads(), afterFirst);
    // Other masters: uploaded.
    const PrepareInputs other = makeInputs(w, h, true, false, true, false, 9);
    Frame f5 = makeFrame(w, h, 5);
    prepareFrame(f5, &other, p, gc);
    EXPECT_GT(cuda::prepareMasterUploads(), afterFirst);
    // A later in-place step (salt-and-pepper) keeps the result off the frame cache: uploaded again.
    PrepareParams sp = p;
    sp.saltPepper = true;
    Frame f6 = makeFrame(w, h, 6);
    prepareFrame(f6, &in, sp, gc);
    const std::uint64_t before = dc.uploads();
    dc.frame(f6.view(), f6.maskView());
    EXPECT_EQ(dc.uploads(), before + 1);
}

TEST(PrepareCuda, BudgetTooSmallRunsTheCpuPathAndSaysSo) {
    REQUIRE_DEVICE();
    const int w = 256, h = 256;
    const PrepareInputs in = makeInputs(w, h, true, true, true, false, 3);
    RunContext gc = testContext(Backend::Cuda), cc = testContext(Backend::Cpu);
    gc.gpuMemLimit = 100000; // < one master
    Frame f = makeFrame(w, h, 3), c = f;
    const PrepareResult rg = prepareFrame(f, &in, paramsNoExtras(), gc);
    const PrepareResult rc = prepareFrame(c, &in, paramsNoExtras(), cc);
    EXPECT_TRUE(sameFrames(f, c));
    EXPECT_EQ(rg.badPixels, rc.badPixels);
    EXPECT_EQ(rg.steps, rc.steps);
    auto& dc = cuda::DeviceContext::of(gc);
    EXPECT_EQ(dc.planMode(), "cpu");
    EXPECT_NE(dc.planNote().find("prepare"), std::string::npos) << dc.planNote();
}

namespace {

// A field with bleed trails: saturated pixels (value >= SATURATE, MaskSaturated as readFrame sets it) in
// vertical runs above bleedFraction * SATURATE, some touching the first or last row or column, several per
// column, runs that never saturate (not trails), NaNs inside runs, isolated saturated mask bits, other
// mask bits that must survive.
Frame bleedField(int w, int h, unsigned seed, int trails) {
    Frame f;
    f.pixels = Image<float>(w, h, 0.0f);
    f.mask = Image<std::uint8_t>(w, h, 0);
    SplitMix64 rng(seed);
    const float sat = 60000.0f;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            f.pixels(x, y) = rng.normal(1000.0f, 30.0f);
            const float q = rng.uniform();
            if (q < 0.01f) f.mask(x, y) = MaskBad;
            else if (q < 0.012f) f.mask(x, y) = MaskSaturated; // a saturated bit on a low value
        }
    for (int k = 0; k < trails; ++k) {
        int x = rng.below(w);
        if (k % 7 == 0) x = 0;
        if (k % 7 == 1) x = w - 1;
        if (k % 11 == 2) x = w / 2; // several trails in one column
        const int len = std::min(h, 1 + rng.below(std::max(2, h / 4)));
        int y0 = rng.below(std::max(1, h - len + 1));
        if (k % 5 == 0) y0 = 0;
        if (k % 5 == 1) y0 = h - len;
        const bool saturates = rng.uniform() < 0.75f;
        for (int y = y0; y < y0 + len; ++y) {
            float v = 54000.0f + 5000.0f * rng.uniform(); // >= 0.9 * SATURATE
            if (rng.uniform() < 0.03f) v = std::numeric_limits<float>::quiet_NaN(); // breaks the run
            if (rng.uniform() < 0.02f) v = 53999.0f;                                // just below: breaks it
            f.pixels(x, y) = v;
        }
        if (saturates) {
            const int ys = y0 + rng.below(len);
            f.pixels(x, ys) = 65535.0f;
            f.mask(x, ys) |= MaskSaturated;
        }
    }
    f.instrument.saturation = sat;
    f.instrument.exptime = 37.5;
    f.header.set("EXPTIME", 37.5);
    return f;
}

} // namespace

TEST(PrepareCuda, BleedTrailsMatchCpuBitwise) {
    REQUIRE_DEVICE();
    ASSERT_NE(cudaStages().prepareFrame, nullptr);
    struct Case {
        int w, h, trails;
    };
    int withTrails = 0;
    for (const Case c : {Case{203, 117, 60}, Case{31, 300, 40}, Case{1, 64, 3}, Case{64, 1, 10}, Case{129, 77, 200}})
        for (int grow : {0, 1, 2, 3, 40}) {
            const Frame raw = bleedField(c.w, c.h, 1000u + c.w * 7u + grow, c.trails);
            PrepareParams p = paramsNoExtras();
            p.bleedTrails = true;
            p.bleedGrow = grow;
            Frame a = raw, b = raw;
            RunContext cc = testContext(Backend::Cpu), gc = testContext(Backend::Cuda);
            const PrepareResult ra = prepareFrame(a, nullptr, p, cc);
            const PrepareResult rb = prepareFrame(b, nullptr, p, gc);
            EXPECT_TRUE(sameFrames(a, b)) << c.w << "x" << c.h << " grow " << grow;
            EXPECT_EQ(ra.bleedPixels, rb.bleedPixels) << c.w << "x" << c.h << " grow " << grow;
            EXPECT_EQ(ra.steps, rb.steps);
            // and the building block on its own
            Image<std::uint8_t> m = raw.mask;
            EXPECT_EQ(maskBleedTrails(raw.view(), m, raw.instrument.saturation, p.bleedFraction, grow), rb.bleedPixels);
            EXPECT_EQ(std::memcmp(m.data(), b.mask.data(), m.pixelCount()), 0);
            EXPECT_EQ(std::memcmp(raw.pixels.data(), b.pixels.data(), raw.pixels.pixelCount() * sizeof(float)), 0);
            withTrails += rb.bleedPixels > 0;
        }
    EXPECT_GE(withTrails, 20);
}

TEST(PrepareCuda, WholePreparationWithTrailsOverscanTrimAndMastersMatchesCpu) {
    REQUIRE_DEVICE();
    const int rw = 180, rh = 150;
    const PrepareInputs in = makeInputs(rw, rh, true, true, true, true, 91);
    for (int grow : {0, 1, 2, 3})
        for (const char* method : {"median", "row"})
            for (bool trim : {false, true}) {
                Frame raw = bleedField(rw, rh, 500u + grow, 80);
                raw.header.set("BIASSEC", "[171:180,1:150]");
                if (trim) raw.header.set("TRIMSEC", "[3:168,2:149]");
                PrepareParams p;
                p.autoBadPixels = false;
                p.bleedGrow = grow;
                p.overscanMethod = method;
                Frame a = raw, b = raw;
                RunContext cc = testContext(Backend::Cpu), gc = testContext(Backend::Cuda);
                const PrepareResult ra = prepareFrame(a, &in, p, cc);
                const PrepareResult rb = prepareFrame(b, &in, p, gc);
                const std::string what = std::string(method) + (trim ? " trimmed" : "") + " grow " + std::to_string(grow);
                EXPECT_EQ(ra.trimmed, trim);
                EXPECT_TRUE(sameFrames(a, b)) << what;
                EXPECT_EQ(ra.bleedPixels, rb.bleedPixels) << what;
                EXPECT_GT(rb.bleedPixels, 0u) << what;
                EXPECT_EQ(ra.badPixels, rb.badPixels) << what;
                EXPECT_EQ(ra.overscanLevel, rb.overscanLevel) << what;
                EXPECT_EQ(ra.steps, rb.steps) << what;
                EXPECT_EQ(a.instrument.saturation, b.instrument.saturation) << what;
                EXPECT_EQ(a.header.getDouble("LTV1"), b.header.getDouble("LTV1")) << what;
                // the prepared frame is the frame cache: found without an upload, with the host's bits
                auto& dc = cuda::DeviceContext::of(gc);
                const std::uint64_t uploads = dc.uploads();
                const auto df = dc.frame(b.view(), b.maskView());
                EXPECT_EQ(dc.uploads(), uploads) << what;
                std::vector<float> back(b.pixels.pixelCount());
                std::vector<std::uint8_t> backMask(b.mask.pixelCount());
                dc.synchronize();
                ASSERT_EQ(cudaMemcpy(back.data(), df.pixels, back.size() * sizeof(float), cudaMemcpyDeviceToHost),
                          cudaSuccess);
                ASSERT_EQ(cudaMemcpy(backMask.data(), df.mask, backMask.size(), cudaMemcpyDeviceToHost), cudaSuccess);
                EXPECT_EQ(std::memcmp(back.data(), b.pixels.data(), back.size() * sizeof(float)), 0) << what;
                EXPECT_EQ(std::memcmp(backMask.data(), b.mask.data(), backMask.size()), 0) << what;
            }
}

TEST(PrepareCuda, ResidentFrameIsNotUploadedAgain) {
    REQUIRE_DEVICE();
    const int w = 150, h = 120;
    const PrepareInputs in = makeInputs(w, h, true, true, true, true, 17);
    RunContext gc = testContext(Backend::Cuda), cc = testContext(Backend::Cpu);
    PrepareParams p;
    p.autoBadPixels = false;
    auto& dc = cuda::DeviceContext::of(gc);
    for (int rep = 0; rep < 3; ++rep) {
        Frame f = bleedField(w, h, 40u + rep, 30), c = f;
        const bool resident = rep > 0;
        if (resident) dc.frame(f.view(), f.maskView()); // as the read phase's upload leaves it
        const std::uint64_t uploads = dc.uploads();
        prepareFrame(f, &in, p, gc);
        prepareFrame(c, &in, p, cc);
        EXPECT_TRUE(sameFrames(f, c)) << rep;
        const cuda::PrepareTimings t = cuda::prepareLastTimings();
        EXPECT_EQ(t.frameUploaded, !resident) << rep;
        EXPECT_EQ(dc.uploads(), uploads + (resident ? 0u : 1u)) << rep;
        EXPECT_GE(t.deviceMs, 0.0);
    }
}

// 151 Mpx, masters resident. Prints the kernel time (CUDA events) and the call's wall time
// (raw frame upload + kernel + download), and the CPU loop's time through prepareFrame for reference.
TEST(PrepareCuda, Benchmark151Mpx) {
    REQUIRE_DEVICE();
    if (!std::getenv("GPUPHOT_BENCH_PREPARE")) GTEST_SKIP() << "set GPUPHOT_BENCH_PREPARE=1";
    const int w = 14208, h = 10656;
    const PrepareInputs in = makeInputs(w, h, true, true, true, true, 1);
    Frame raw = makeFrame(w, h, 2);
    PrepareCalibration cal;
    cal.bias = in.bias->pixels.view();
    cal.dark = in.dark->pixels.view();
    cal.flat = in.flat->pixels.view();
    cal.biasMask = in.bias->mask.view();
    cal.darkMask = in.dark->mask.view();
    cal.flatMask = in.flat->mask.view();
    cal.badPixels = in.badPixels.view();
    cal.darkScale = 37.5 / 60.0;
    cal.minFlat = 0.05f;
    RunContext gc = testContext(Backend::Cuda);
    gc.threads = 16;
    Frame f = raw;
    auto t0 = std::chrono::steady_clock::now();
    cuda::prepareCalibrate(f.pixels, f.mask, cal, gc);
    const double firstMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("PREP151 first call (masters upload) %.1f ms kernel %.3f ms\n", firstMs,
                cuda::prepareKernelMilliseconds());
    double bestKernel = 1e30, bestCall = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        t0 = std::chrono::steady_clock::now();
        cuda::prepareCalibrate(f.pixels, f.mask, cal, gc);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        bestCall = std::min(bestCall, ms);
        bestKernel = std::min(bestKernel, cuda::prepareKernelMilliseconds());
        std::printf("PREP151 rep %d kernel %.3f ms call %.1f ms\n", rep, cuda::prepareKernelMilliseconds(), ms);
    }
    std::printf("PREP151 best kernel %.3f ms (%.0f GB/s effective), best call %.1f ms\n", bestKernel,
                double(w) * h * 26.0 / (bestKernel * 1e-3) / 1e9, bestCall);
    // correctness at full size, and the CPU loop for reference
    Frame a = raw, b = raw;
    RunContext cc = testContext(Backend::Cpu);
    cc.threads = 16;
    const PrepareParams p = paramsNoExtras();
    t0 = std::chrono::steady_clock::now();
    prepareFrame(a, &in, p, cc);
    const double cpuMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    prepareFrame(b, &in, p, gc);
    const double gpuMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("PREP151 prepareFrame (incl. host robust medians of the masters) cpu %.1f ms cuda %.1f ms\n", cpuMs,
                gpuMs);
    EXPECT_TRUE(sameFrames(a, b));
}
