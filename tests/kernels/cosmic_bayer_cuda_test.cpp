// Frame preparation steps 6-8 on the device (kernels/prepare/cosmic_rays.cu, kernels/prepare/bayer.cu) against the CPU
// functions, bitwise: L.A.Cosmic (mask, counts per iteration, saturated-star pixels, the clean image) on
// simulated frames with the simulator's cosmic-ray tracks and every Params case of the CPU tests, on odd
// sizes down to 1 x 1, with input masks, non-finite pixels and strided views; the salt-and-pepper prefilter;
// the CFA super-pixels for every pattern, row order, offset and output; prepareFrame with all of them.
// GPUPHOT_BENCH_COSMIC=1 adds the 151 Mpx timings (printed; no timing assertion), GPUPHOT_BENCH_COSMIC_CPU=1
// also the CPU's time and the bitwise comparison on that frame.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/model/frame.hpp"
#include "core/model/instrument.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/prepare/bayer.hpp"
#include "core/stages/prepare/cosmic_rays.hpp"
#include "core/stages/prepare/prepare.hpp"
#include "core/util/errors.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "tests/core/test_fields.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;
using cudatest::sameBits;
using cudatest::sameImage;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

using Rng = cudatest::SplitMix64; // fast enough for the 151 Mpx benchmark frames

// A field of the CPU test's kind (tests/core/cosmic_rays_test.cpp): stars, some saturated, cosmic rays.
SimResult simulatedField(int cosmicRays, std::uint64_t seed) {
    RunContext ctx = cudatest::cpuContext();
    return simulateField(test::cosmicRayFieldParams(cosmicRays, seed), &ctx);
}

// Noise around `sky`, cosmic-ray tracks (short lines, some saturating), non-finite pixels and mask bits.
struct Field {
    Image<float> pixels;
    Image<std::uint8_t> mask;
};
Field randomField(int w, int h, std::uint64_t seed, float sky, bool defects, int tracks) {
    Field f{Image<float>(w, h, 0.0f), Image<std::uint8_t>(w, h, std::uint8_t{0})};
    Rng rng(seed);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            f.pixels(x, y) = rng.normal(sky, 0.03f * sky);
    for (int t = 0; t < tracks; ++t) {
        int x = rng.below(w), y = rng.below(h);
        const int len = 1 + rng.below(8), dx = rng.below(3) - 1, dy = rng.below(3) - 1;
        const float charge = rng.uniform() < 0.1f ? 70000.0f : 500.0f + 5000.0f * rng.uniform();
        for (int k = 0; k < len && x >= 0 && y >= 0 && x < w && y < h; ++k, x += dx, y += dy)
            f.pixels(x, y) += charge;
    }
    if (defects)
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) {
                const float r = rng.uniform();
                if (r < 0.004f)
                    f.pixels(x, y) = kNaN;
                else if (r < 0.006f)
                    f.pixels(x, y) = kInf;
                else if (r < 0.007f)
                    f.pixels(x, y) = -kInf;
                else if (r < 0.012f)
                    f.mask(x, y) = MaskBad;
                else if (r < 0.015f)
                    f.mask(x, y) = MaskSaturated;
                else if (r < 0.017f)
                    f.mask(x, y) = MaskOutside;
                else if (r < 0.019f)
                    f.mask(x, y) = MaskNonFinite;
            }
    return f;
}

void expectSameCosmics(const CosmicRayResult& c, const CosmicRayResult& g, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_TRUE(sameImage(c.mask, g.mask, "mask"));
    EXPECT_EQ(c.crPixels, g.crPixels);
    EXPECT_EQ(c.saturatedStarPixels, g.saturatedStarPixels);
    EXPECT_EQ(c.perIteration, g.perIteration);
    EXPECT_EQ(std::memcmp(&c.gain, &g.gain, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&c.readnoise, &g.readnoise, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&c.satlevel, &g.satlevel, sizeof(double)), 0);
    EXPECT_TRUE(sameImage(c.cleaned, g.cleaned, "cleaned"));
}

// CPU and CUDA on the same inputs through the public function (which dispatches by backend).
void compareCosmics(const ImageView& px, const MaskView& mask, const Instrument& inst,
                    const CosmicRayParams& p, const std::string& what, std::size_t* found = nullptr) {
    RunContext cpu = cudatest::cpuContext(), gpu = cudatest::cudaContext();
    const CosmicRayResult c = detectCosmicRays(px, mask, inst, p, cpu);
    const CosmicRayResult g = detectCosmicRays(px, mask, inst, p, gpu);
    expectSameCosmics(c, g, what);
    if (found) *found = c.crPixels;
}

Instrument instrument(double gain, double readNoise, double saturation) {
    Instrument inst;
    inst.gain = gain;
    inst.readNoise = readNoise;
    inst.saturation = saturation;
    return inst;
}

} // namespace

// The simulated frames of the CPU tests with every Params case they use, and variants that exercise each
// branch (saturated-star protection, pedestal, zero read noise, one iteration, low limits).
TEST(CosmicCuda, SimulatedFramesMatchCpu) {
    REQUIRE_DEVICE();
    const SimResult withCr = simulatedField(200, 7);
    const SimResult clean = simulatedField(0, 7);
    const Instrument inst = readInstrument(withCr.header);
    std::vector<std::pair<std::string, CosmicRayParams>> cases;
    cases.emplace_back("defaults", CosmicRayParams{});
    CosmicRayParams p;
    p.clean = true;
    cases.emplace_back("clean", p);
    p = {};
    p.sigclip = 6.0;
    cases.emplace_back("sigclip 6", p);
    p = {};
    p.sigclip = 3.0;
    p.sigfrac = 0.5;
    p.objlim = 1.5;
    p.niter = 6;
    p.clean = true;
    cases.emplace_back("low limits", p);
    p = {};
    p.niter = 1;
    cases.emplace_back("one iteration", p);
    p = {};
    p.satlevel = 3000.0;
    p.pedestal = 120.0;
    p.readnoise = 0.0;
    p.gain = 2.5;
    p.clean = true;
    cases.emplace_back("saturation, pedestal, no read noise", p);
    std::size_t found = 0;
    for (const auto& [name, params] : cases)
        compareCosmics(withCr.image.view(), {}, inst, params, name, &found);
    EXPECT_GT(found, 100u) << "the frame should hold cosmic rays";
    compareCosmics(clean.image.view(), {}, inst, {}, "no cosmic rays");
    // The simulator's defect mask (hot pixels, bad columns, the tracks themselves) as input mask.
    compareCosmics(withCr.image.view(), withCr.defects.view(), inst, cases[1].second, "defect mask");
}

// The CPU test's flat frame with a single hit, a masked hit, and random fields of odd sizes down to 1 x 1
// with non-finite pixels, every mask bit, saturating tracks and a strided view.
TEST(CosmicCuda, OddSizesMasksAndEdges) {
    REQUIRE_DEVICE();
    {
        Image<float> img(64, 64, 500.0f);
        img(20, 30) += 2000.0f;
        img(21, 30) += 800.0f;
        img(0, 0) += 3000.0f; // a corner
        img(63, 17) += 3000.0f;
        CosmicRayParams p;
        p.clean = true;
        const Instrument inst = instrument(2.0, 5.0, std::numeric_limits<double>::infinity());
        std::size_t found = 0;
        compareCosmics(img.view(), {}, inst, p, "single hits", &found);
        EXPECT_GE(found, 2u);
        Image<std::uint8_t> mask(64, 64, std::uint8_t{0});
        mask(20, 30) = MaskBad;
        compareCosmics(img.view(), mask.view(), inst, p, "masked hit");
    }
    const int sizes[][2] = {{1, 1}, {1, 17}, {23, 1}, {2, 3}, {5, 5}, {7, 9}, {33, 8}, {131, 67}, {200, 151}};
    std::uint64_t seed = 1;
    for (const auto& s : sizes)
        for (int variant = 0; variant < 2; ++variant) {
            const Field f = randomField(s[0], s[1], ++seed, 800.0f, variant == 1, s[0] * s[1] / 40 + 1);
            CosmicRayParams p;
            p.clean = true;
            p.sigclip = variant ? 4.5 : 3.5;
            const Instrument inst =
                instrument(1.7, 4.0, variant ? 60000.0 : std::numeric_limits<double>::infinity());
            compareCosmics(f.pixels.view(), variant ? f.mask.view() : MaskView{}, inst, p,
                           std::to_string(s[0]) + "x" + std::to_string(s[1]) + " variant " +
                               std::to_string(variant));
        }
    // A strided view: the inner part of a larger image.
    const Field big = randomField(150, 120, 99, 1000.0f, true, 300);
    const ImageView inner{big.pixels.data() + 7 * 150 + 5, 131, 101, 150};
    const MaskView innerMask{big.mask.data() + 7 * 150 + 5, 131, 101, 150};
    CosmicRayParams p;
    p.clean = true;
    compareCosmics(inner, innerMask, instrument(1.0, 8.0, 50000.0), p, "strided view");
}

TEST(SaltPepperCuda, MatchesCpu) {
    REQUIRE_DEVICE();
    const int sizes[][2] = {{1, 1}, {3, 1}, {1, 9}, {6, 7}, {200, 150}, {257, 31}};
    std::uint64_t seed = 40;
    for (const auto& s : sizes)
        for (int window : {3, 5})
            for (int variant = 0; variant < 2; ++variant) {
                Field f = randomField(s[0], s[1], ++seed, 1000.0f, variant == 1, s[0] * s[1] / 50 + 1);
                Rng rng(seed);
                for (int k = 0; k < s[0] * s[1] / 60; ++k)
                    f.pixels(rng.below(s[0]), rng.below(s[1])) -= 300.0f;
                SaltPepperParams p;
                p.window = window;
                p.lowSigma = variant ? 5.0 : 3.0;
                RunContext cpu = cudatest::cpuContext(), gpu = cudatest::cudaContext();
                const MaskView m = variant ? f.mask.view() : MaskView{};
                const SaltPepperResult c = saltPepperMask(f.pixels.view(), m, p, cpu);
                const SaltPepperResult g = saltPepperMask(f.pixels.view(), m, p, gpu);
                SCOPED_TRACE(std::to_string(s[0]) + "x" + std::to_string(s[1]) + " window " +
                             std::to_string(window) + " variant " + std::to_string(variant));
                EXPECT_TRUE(sameImage(c.mask, g.mask, "mask"));
                EXPECT_EQ(c.high, g.high);
                EXPECT_EQ(c.low, g.low);
                EXPECT_EQ(std::memcmp(&c.sigma, &g.sigma, sizeof(double)), 0) << c.sigma << " vs " << g.sigma;
            }
}

// Every pattern, row order, offset and output, luminance sum and mean, odd sizes (the last column / row
// dropped), non-finite pixels, a strided view.
TEST(BayerCuda, SuperPixelsMatchCpu) {
    REQUIRE_DEVICE();
    const int sizes[][2] = {{2, 2}, {3, 3}, {5, 2}, {101, 77}, {64, 50}};
    std::uint64_t seed = 70;
    int compared = 0;
    for (const auto& s : sizes) {
        const Field f = randomField(s[0], s[1], ++seed, 2000.0f, true, 3);
        for (const char* pattern : {"RGGB", "BGGR", "GRBG", "GBRG"})
            for (bool topDown : {false, true})
                for (int xo = 0; xo < 2; ++xo)
                    for (int yo = 0; yo < 2; ++yo)
                        for (CfaOutput out :
                             {CfaOutput::Luminance, CfaOutput::Red, CfaOutput::Green, CfaOutput::Blue})
                            for (bool mean : {false, true}) {
                                if (mean && out != CfaOutput::Luminance) continue;
                                CfaLayout layout;
                                layout.pattern = pattern;
                                layout.topDown = topDown;
                                layout.xOffset = xo;
                                layout.yOffset = yo;
                                RunContext cpu = cudatest::cpuContext(), gpu = cudatest::cudaContext();
                                const Image<float> c =
                                    cfaSuperPixels(f.pixels.view(), layout, out, mean, cpu);
                                const Image<float> g =
                                    cfaSuperPixels(f.pixels.view(), layout, out, mean, gpu);
                                ASSERT_TRUE(sameImage(c, g,
                                                      std::string(pattern) + (topDown ? " top-down" : "") +
                                                          " offsets " + std::to_string(xo) +
                                                          std::to_string(yo) + " output " +
                                                          std::to_string(int(out)) + (mean ? " mean" : "")));
                                ++compared;
                            }
    }
    EXPECT_EQ(compared, 5 * 4 * 2 * 4 * 5);
    const Field big = randomField(90, 70, 5, 1500.0f, true, 10);
    const ImageView inner{big.pixels.data() + 3 * 90 + 1, 81, 63, 90};
    CfaLayout layout;
    RunContext cpu = cudatest::cpuContext(), gpu = cudatest::cudaContext();
    EXPECT_TRUE(sameImage(cfaSuperPixels(inner, layout, CfaOutput::Green, false, cpu),
                          cfaSuperPixels(inner, layout, CfaOutput::Green, false, gpu), "strided view"));
    EXPECT_THROW(
        cfaSuperPixels(ImageView{big.pixels.data(), 1, 5, 90}, layout, CfaOutput::Luminance, false, gpu),
        InvalidInput);
}

// Without device room (a budget below the step's images, or an allocation failure injected midway) each step
// runs on the CPU (plan "cpu"), with the same result, and the context keeps its CUDA backend.
TEST(CosmicCuda, NoDeviceRoomRunsTheCpu) {
    REQUIRE_DEVICE();
    const Field f = randomField(200, 150, 5, 900.0f, true, 60);
    const Instrument inst = instrument(1.5, 5.0, 60000.0);
    CosmicRayParams p;
    p.clean = true;
    RunContext cpu = cudatest::cpuContext();
    const CosmicRayResult c = detectCosmicRays(f.pixels.view(), f.mask.view(), inst, p, cpu);
    const SaltPepperResult sc = saltPepperMask(f.pixels.view(), f.mask.view(), {}, cpu);
    const Image<float> bc = cfaSuperPixels(f.pixels.view(), CfaLayout{}, CfaOutput::Luminance, false, cpu);
    for (int mode = 0; mode < 2; ++mode) {
        SCOPED_TRACE(mode ? "injected failure" : "small budget");
        RunContext gpu = cudatest::cudaContext();
        if (mode == 0)
            gpu.gpuMemLimit = 64 * 1024; // the frame alone is 120 kB
        else
            cuda::DeviceContext::of(gpu).setFailAfter(4); // after the frame's upload
        expectSameCosmics(c, detectCosmicRays(f.pixels.view(), f.mask.view(), inst, p, gpu), "cosmic rays");
        EXPECT_EQ(cuda::DeviceContext::of(gpu).planMode(), "cpu");
        EXPECT_EQ(gpu.backend, Backend::Cuda);
        cuda::DeviceContext::of(gpu).clearPlan();
        if (mode == 1) cuda::DeviceContext::of(gpu).setFailAfter(2);
        const SaltPepperResult sg = saltPepperMask(f.pixels.view(), f.mask.view(), {}, gpu);
        EXPECT_TRUE(sameImage(sc.mask, sg.mask, "salt-and-pepper"));
        EXPECT_EQ(cuda::DeviceContext::of(gpu).planMode(), "cpu");
        cuda::DeviceContext::of(gpu).clearPlan();
        if (mode == 1) cuda::DeviceContext::of(gpu).setFailAfter(2);
        EXPECT_TRUE(sameImage(
            bc, cfaSuperPixels(f.pixels.view(), CfaLayout{}, CfaOutput::Luminance, false, gpu), "bayer"));
        EXPECT_EQ(cuda::DeviceContext::of(gpu).planMode(), "cpu");
        EXPECT_EQ(gpu.backend, Backend::Cuda);
    }
}

// prepareFrame with the masters, the salt-and-pepper prefilter, the CFA binning and L.A.Cosmic: the same
// frame (pixels, mask, instrument) and the same counts on both backends.
TEST(CosmicCuda, PrepareFrameMatchesCpu) {
    REQUIRE_DEVICE();
    const SimResult sim = simulatedField(150, 11);
    const std::pair<std::string, bool> cases[] = {
        {"none", false}, {"none", true}, {"lum", true}, {"g", false}};
    for (const auto& [bayer, saltPepper] : cases) {
        Frame base;
        base.pixels = sim.image;
        base.mask = Image<std::uint8_t>(sim.image.width(), sim.image.height(), std::uint8_t{0});
        base.header = sim.header;
        base.header.set("BAYERPAT", "RGGB");
        base.instrument = readInstrument(base.header);
        base.instrument.exptime = 30.0;
        PrepareInputs in;
        CalibrationImage bias;
        bias.pixels = Image<float>(base.width(), base.height(), 0.0f);
        bias.mask = Image<std::uint8_t>(base.width(), base.height(), std::uint8_t{0});
        Rng rng(3);
        for (std::size_t i = 0; i < bias.pixels.pixelCount(); ++i)
            bias.pixels.data()[i] = rng.normal(20.0f, 1.0f);
        bias.path = "bias.fits";
        in.bias = bias;
        PrepareParams p;
        p.saltPepper = saltPepper;
        p.cosmics = true;
        p.cosmic.clean = false;
        p.bayer = bayer;
        Frame fc = base, fg = base;
        RunContext cpu = cudatest::cpuContext(), gpu = cudatest::cudaContext();
        const PrepareResult rc = prepareFrame(fc, &in, p, cpu);
        const PrepareResult rg = prepareFrame(fg, &in, p, gpu);
        SCOPED_TRACE("bayer " + bayer + (saltPepper ? ", salt-and-pepper" : ""));
        EXPECT_TRUE(sameImage(fc.pixels, fg.pixels, "pixels"));
        EXPECT_TRUE(sameImage(fc.mask, fg.mask, "mask"));
        EXPECT_EQ(rc.cosmicPixels, rg.cosmicPixels);
        EXPECT_EQ(rc.saltPepperPixels, rg.saltPepperPixels);
        EXPECT_EQ(rc.badPixels, rg.badPixels);
        EXPECT_EQ(rc.steps, rg.steps);
        // The prefilter takes the brightest track pixels (MaskBad) before L.A.Cosmic sees them.
        EXPECT_GT(rc.cosmicPixels + rc.saltPepperPixels, 100u);
        if (!saltPepper) {
            EXPECT_GT(rc.cosmicPixels, 100u);
        }
        EXPECT_EQ(std::memcmp(&fc.instrument.saturation, &fg.instrument.saturation, sizeof(double)), 0);
    }
}

// 151 Mpx timings (GPUPHOT_BENCH_COSMIC=1): L.A.Cosmic per iteration, the salt-and-pepper prefilter, the
// Bayer binning, and the whole prepareFrame with resident masters without and with cosmic rays.
TEST(CosmicCuda, Bench151Mpx) {
    REQUIRE_DEVICE();
    if (!std::getenv("GPUPHOT_BENCH_COSMIC")) GTEST_SKIP() << "set GPUPHOT_BENCH_COSMIC=1";
    const int w = 14208, h = 10656;
    using Clock = std::chrono::steady_clock;
    auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
    };
    auto t0 = Clock::now();
    const Field f = randomField(w, h, 2026, 1000.0f, false, 300000);
    std::printf("[bench] frame %dx%d generated in %.0f ms\n", w, h, ms(t0, Clock::now()));
    const Instrument inst = instrument(1.5, 6.0, 65535.0);
    RunContext gpu = cudatest::cudaContext();
    gpu.threads = 16;
    for (int rep = 0; rep < 2; ++rep) {
        t0 = Clock::now();
        const CosmicRayResult r = detectCosmicRays(f.pixels.view(), {}, inst, {}, gpu);
        const double wall = ms(t0, Clock::now());
        const cuda::CosmicRayTimings t = cuda::cosmicRaysLastTimings();
        std::printf("[bench] cosmic %d: wall %.1f ms, setup (upload, level, masks) %.2f ms, iterations", rep,
                    wall, t.setupMs);
        for (std::size_t k = 0; k < t.iterationMs.size(); ++k)
            std::printf(" %.2f (%zu new)", t.iterationMs[k], r.perIteration[k]);
        std::printf(" ms, output %.2f ms; %zu CR px\n", t.outputMs, r.crPixels);
    }
    if (std::getenv("GPUPHOT_BENCH_COSMIC_CPU")) {
        // The CPU on the same frame: time and bitwise agreement at full size.
        RunContext cpu = cudatest::cpuContext();
        cpu.threads = 16;
        CosmicRayParams p;
        p.clean = true;
        const CosmicRayResult g = detectCosmicRays(f.pixels.view(), {}, inst, p, gpu);
        t0 = Clock::now();
        const CosmicRayResult c = detectCosmicRays(f.pixels.view(), {}, inst, p, cpu);
        std::printf("[bench] cosmic CPU (16 threads, clean): %.0f ms\n", ms(t0, Clock::now()));
        expectSameCosmics(c, g, "151 Mpx");
        t0 = Clock::now();
        const SaltPepperResult sc = saltPepperMask(f.pixels.view(), {}, {}, cpu);
        std::printf("[bench] salt-and-pepper CPU (16 threads): %.0f ms\n", ms(t0, Clock::now()));
        const SaltPepperResult sg = saltPepperMask(f.pixels.view(), {}, {}, gpu);
        EXPECT_TRUE(sameImage(sc.mask, sg.mask, "salt-and-pepper 151 Mpx"));
        EXPECT_EQ(std::memcmp(&sc.sigma, &sg.sigma, sizeof(double)), 0);
    }
    for (int rep = 0; rep < 2; ++rep) {
        t0 = Clock::now();
        const SaltPepperResult sp = saltPepperMask(f.pixels.view(), {}, {}, gpu);
        std::printf("[bench] salt-and-pepper %d: wall %.1f ms, %zu high %zu low\n", rep, ms(t0, Clock::now()),
                    sp.high, sp.low);
    }
    CfaLayout layout;
    for (CfaOutput out : {CfaOutput::Luminance, CfaOutput::Green, CfaOutput::Red})
        for (int rep = 0; rep < 2; ++rep) {
            t0 = Clock::now();
            const Image<float> b = cfaSuperPixels(f.pixels.view(), layout, out, false, gpu);
            std::printf("[bench] bayer output %d rep %d: kernel %.3f ms, upload+kernel+download %.2f ms, "
                        "wall %.1f ms\n",
                        int(out), rep, cuda::cfaKernelMilliseconds(), cuda::cfaTotalMilliseconds(),
                        ms(t0, Clock::now()));
        }
    {
        RunContext cpu = cudatest::cpuContext();
        cpu.threads = 16;
        t0 = Clock::now();
        const Image<float> b = cfaSuperPixels(f.pixels.view(), layout, CfaOutput::Luminance, false, cpu);
        std::printf("[bench] bayer lum CPU (16 threads): %.1f ms\n", ms(t0, Clock::now()));
    }
    // prepareFrame with resident masters (bias, dark, flat).
    PrepareInputs in;
    auto master = [&](float level, float sd, std::uint64_t seed) {
        CalibrationImage c;
        c.pixels = Image<float>(w, h, Image<float>::NoInit{});
        c.mask = Image<std::uint8_t>(w, h, std::uint8_t{0});
        Rng rng(seed);
        for (std::size_t i = 0; i < c.pixels.pixelCount(); ++i)
            c.pixels.data()[i] = rng.normal(level, sd);
        c.path = "master";
        return c;
    };
    in.bias = master(100.0f, 2.0f, 1);
    in.dark = master(5.0f, 1.0f, 2);
    in.dark->header.set("EXPTIME", 60.0);
    in.flat = master(1.0f, 0.01f, 3);
    Frame base;
    base.pixels = f.pixels;
    base.mask = Image<std::uint8_t>(w, h, std::uint8_t{0});
    base.instrument = inst;
    base.instrument.exptime = 30.0;
    base.header.set("EXPTIME", 30.0);
    for (int cosmics = 0; cosmics < 2; ++cosmics)
        for (int rep = 0; rep < 3; ++rep) {
            Frame fr = base;
            PrepareParams p;
            p.cosmics = cosmics == 1;
            t0 = Clock::now();
            const PrepareResult r = prepareFrame(fr, &in, p, gpu);
            const double wall = ms(t0, Clock::now());
            std::printf("[bench] prepareFrame %s rep %d: wall %.1f ms (calibration kernel %.2f ms, master "
                        "uploads %llu)",
                        cosmics ? "with cosmics" : "calibration only", rep, wall,
                        cuda::prepareKernelMilliseconds(),
                        static_cast<unsigned long long>(cuda::prepareMasterUploads()));
            if (cosmics) {
                const cuda::CosmicRayTimings t = cuda::cosmicRaysLastTimings();
                double sum = t.setupMs + t.outputMs;
                for (double v : t.iterationMs)
                    sum += v;
                std::printf(", cosmic device time %.1f ms, %zu CR px", sum, r.cosmicPixels);
            }
            std::printf("\n");
        }
}
