// Frame-preparation timing.
//   bench_prepare [width] [height] [repeats]
// CPU: a raw frame (default 14208 x 10656 = 151 MP of data plus a 64-column overscan) prepared with a
// master bias, an EXPTIME-scaled master dark, a master flat and a bad-pixel mask (overscan subtraction,
// trim, calibration, masking, bleed trails); masters resident in memory (loaded once, as reduce does).
// Prints the best of `repeats` for 1..N threads.
//   bench_prepare --gpu FRAME.fits [repeats]          (built with the CUDA backend)
// GPU: FRAME (e.g. `gpuphot simulate --size 14208x10656`) with masters of its size (bias, dark, flat,
// a bad-pixel mask) made resident by a first run; then per configuration the best of `repeats` of
// prepareFrame on the frame already on the device (the device frame cache, as the read phase's raw upload
// leaves it): CUDA-event device time (bleed-trail and calibration kernels), the host copy's download, the
// call's wall time; the same with the frame not resident (upload included) and the CPU backend's figure.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <thread>

#include "core/io/fits_image.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/prepare.hpp"
#ifdef GPUPHOT_BENCH_PREPARE_CUDA
#include "core/pipeline/device_registry.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#endif

using namespace gpuphot;

namespace {

double seconds(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

CalibrationImage constant(int w, int h, float v, float slope, const char* path, double exptime) {
    CalibrationImage c;
    c.pixels = Image<float>(w, h, Image<float>::NoInit{});
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) c.pixels(x, y) = v + slope * static_cast<float>((x * 7 + y * 13) % 101) / 100.0f;
    c.mask = Image<std::uint8_t>(w, h, 0);
    c.path = path;
    if (exptime > 0) c.header.set("EXPTIME", exptime);
    return c;
}

// Master bias, dark (EXPTIME 60) and flat of w x h, a 10,000-pixel bad-pixel mask.
PrepareInputs makeMasters(int w, int h) {
    PrepareInputs in;
    in.bias = constant(w, h, 0.5f, 3.0f, "mbias", 0.0);
    in.dark = constant(w, h, 20.0f, 1.0f, "mdark", 60.0);
    in.flat = constant(w, h, 0.9f, 0.2f, "mflat", 0.0);
    in.badPixels = Image<std::uint8_t>(w, h, 0);
    for (long long k = 0; k < 10000; ++k)
        in.badPixels(static_cast<int>((k * 15485863LL) % w), static_cast<int>((k * 32452843LL) % h)) = 1;
    in.badPixelPath = "bpm";
    return in;
}

int cpuMode(int argc, char** argv) {
    const int w = argc > 1 ? std::atoi(argv[1]) : 14208;
    const int h = argc > 2 ? std::atoi(argv[2]) : 10656;
    const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
    const int over = 64, rw = w + over;
    std::printf("raw frame %d x %d (data %d x %d = %.1f MP, overscan %d columns), best of %d\n", rw, h, w, h,
                w * double(h) / 1e6, over, repeats);

    // The raw frame: bias 1000 + dark + sky 300 through a vignetted response, a few saturated columns.
    Image<float> raw(rw, h, Image<float>::NoInit{});
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y) {
        std::minstd_rand rng(static_cast<unsigned>(y) + 1);
        std::uniform_real_distribution<float> u(-5.0f, 5.0f);
        for (int x = 0; x < rw; ++x) raw(x, y) = (x < w ? 1320.0f : 1000.0f) + u(rng);
    }
    for (int k = 0; k < 200; ++k) {
        const int x = static_cast<int>((k * 7919LL) % w), y0 = static_cast<int>((k * 104729LL) % (h - 200));
        for (int y = y0; y < y0 + 60; ++y) raw(x, y) = 65535.0f;
    }
    const PrepareInputs in = makeMasters(w, h);
    PrepareParams p;
    p.autoBadPixels = false; // the masters' bad pixels are found once at load, not per frame

    const int maxThreads = std::max(1u, std::thread::hardware_concurrency());
    for (int t = 1; t <= maxThreads; t *= 2) {
        double best = 1e30, bestCpu = 1e30;
        for (int r = 0; r < repeats; ++r) {
            Frame f;
            f.pixels = raw;
            f.mask = Image<std::uint8_t>(rw, h, 0);
            for (std::size_t i = 0; i < f.pixels.pixelCount(); ++i)
                if (f.pixels.data()[i] >= 65535.0f) f.mask.data()[i] = MaskSaturated;
            f.instrument.saturation = 65535.0;
            f.instrument.exptime = 120.0;
            f.header.set("EXPTIME", 120.0);
            f.header.set("BIASSEC", "[" + std::to_string(w + 1) + ":" + std::to_string(rw) + ",1:" + std::to_string(h) + "]");
            f.header.set("TRIMSEC", "[1:" + std::to_string(w) + ",1:" + std::to_string(h) + "]");
            RunContext ctx;
            ctx.threads = t;
            const auto t0 = std::chrono::steady_clock::now();
            const std::clock_t c0 = std::clock();
            const PrepareResult res = prepareFrame(f, &in, p, ctx);
            bestCpu = std::min(bestCpu, static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
            best = std::min(best, seconds(t0));
            if (r == 0 && t == 1)
                std::printf("  overscan %.2f ADU, dark scale %.2f, bleed %zu px, bad %zu px, steps %zu\n",
                            res.overscanLevel, res.darkScale, res.bleedPixels, res.badPixels, res.steps.size());
        }
        std::printf("  threads %d: prepare %.3f s wall (%.1f ns/px), %.3f s CPU (all threads)\n", t, best,
                    best / (w * double(h)) * 1e9, bestCpu);
    }
    return 0;
}

#ifdef GPUPHOT_BENCH_PREPARE_CUDA

struct Config {
    const char* name;
    bool masters;
    bool overscanTrim; // BIASSEC = the last 64 columns, TRIMSEC the rest (masters of the raw size)
    bool cosmics;
    bool bayer;
};

Frame configured(const Frame& raw, const Config& c) {
    Frame f = raw;
    if (c.overscanTrim) {
        const int w = raw.width(), h = raw.height();
        f.header.set("BIASSEC", "[" + std::to_string(w - 63) + ":" + std::to_string(w) + ",1:" + std::to_string(h) + "]");
        f.header.set("TRIMSEC", "[1:" + std::to_string(w - 64) + ",1:" + std::to_string(h) + "]");
    }
    if (c.bayer) f.header.set("BAYERPAT", "RGGB");
    return f;
}

PrepareParams paramsFor(const Config& c) {
    PrepareParams p;
    p.autoBadPixels = false;
    p.cosmics = c.cosmics;
    p.bayer = c.bayer ? "lum" : "none";
    return p;
}

int gpuMode(int argc, char** argv) {
    cuda::linkKernels();
    if (argc < 3) {
        std::fprintf(stderr, "usage: bench_prepare --gpu FRAME.fits [repeats]\n");
        return 2;
    }
    const std::string path = argv[2];
    const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
    const int threads = std::max(1u, std::thread::hardware_concurrency());
    auto t0 = std::chrono::steady_clock::now();
    Frame raw = readFrame(path);
    if (!std::isfinite(raw.instrument.exptime)) {
        raw.instrument.exptime = 120.0;
        raw.header.set("EXPTIME", 120.0);
    }
    const int w = raw.width(), h = raw.height();
    std::size_t sat = 0;
    for (std::size_t i = 0; i < raw.mask.pixelCount(); ++i) sat += (raw.mask.data()[i] & MaskSaturated) != 0;
    std::printf("frame %s: %d x %d (%.1f MP), SATURATE %.0f, %zu saturated pixels, read %.2f s; %d host threads, "
                "best of %d\n",
                path.c_str(), w, h, w * double(h) / 1e6, raw.instrument.saturation, sat, seconds(t0), threads, repeats);
    const PrepareInputs in = makeMasters(w, h);
    const Config configs[] = {
        {"bleed trails only (no masters: gpuphot bench's prepare)", false, false, false, false},
        {"bias+dark+flat+bpm, bleed trails", true, false, false, false},
        {"overscan+trim, bias+dark+flat+bpm, bleed trails", true, true, false, false},
        {"bias+dark+flat+bpm, bleed trails, Bayer lum", true, false, false, true},
        {"bias+dark+flat+bpm, bleed trails, L.A.Cosmic", true, false, true, false},
    };
    RunContext gpu;
    gpu.backend = Backend::Cuda;
    gpu.threads = threads;
    auto& dc = cuda::DeviceContext::of(gpu);
    for (const Config& c : configs) {
        const PrepareParams p = paramsFor(c);
        const PrepareInputs* inputs = c.masters ? &in : nullptr;
        {   // first run: the masters become resident
            Frame f = configured(raw, c);
            t0 = std::chrono::steady_clock::now();
            const PrepareResult r = prepareFrame(f, inputs, p, gpu);
            std::printf("\n%s\n  first run %.1f ms (masters uploaded), bleed %zu px, bad %zu px, cosmic %zu px, "
                        "steps:", c.name, seconds(t0) * 1e3, r.bleedPixels, r.badPixels, r.cosmicPixels);
            for (const auto& s : r.steps) std::printf(" [%s]", s.c_str());
            std::printf("\n");
        }
        for (bool resident : {true, false}) {
            double bestWall = 1e30, bestDevice = 1e30, bestBleed = 1e30, bestCal = 1e30, bestDown = 1e30,
                   bestUp = 1e30, bestCosmic = 1e30;
            bool uploaded = false;
            for (int rep = 0; rep < repeats; ++rep) {
                Frame f = configured(raw, c);
                if (resident) {
                    dc.frame(f.view(), f.maskView()); // as the read phase's raw upload leaves it
                    dc.synchronize();
                } else {
                    dc.dropFrame();
                }
                t0 = std::chrono::steady_clock::now();
                prepareFrame(f, inputs, p, gpu);
                bestWall = std::min(bestWall, seconds(t0) * 1e3);
                const cuda::PrepareTimings t = cuda::prepareLastTimings();
                uploaded = uploaded || t.frameUploaded;
                bestDevice = std::min(bestDevice, t.deviceMs);
                bestBleed = std::min(bestBleed, t.bleedMs);
                bestCal = std::min(bestCal, t.calibrateMs);
                bestDown = std::min(bestDown, t.downloadMs);
                bestUp = std::min(bestUp, t.uploadMs);
                if (c.cosmics) {
                    const cuda::CosmicRayTimings ct = cuda::cosmicRaysLastTimings();
                    double sum = ct.setupMs + ct.outputMs;
                    for (double v : ct.iterationMs) sum += v;
                    bestCosmic = std::min(bestCosmic, sum);
                }
            }
            std::printf("  GPU, frame %s: device %.3f ms (bleed %.3f, overscan/trim/calibration %.3f), upload "
                        "%.1f ms%s, host copy download %.1f ms, prepareFrame wall %.1f ms",
                        resident ? "resident  " : "uploaded  ", bestDevice, bestBleed, bestCal, bestUp,
                        uploaded ? "" : " (none)", bestDown, bestWall);
            if (c.cosmics) std::printf(", L.A.Cosmic device %.1f ms", bestCosmic);
            std::printf("\n");
        }
        if (!c.cosmics) {
            RunContext cpu;
            cpu.threads = threads;
            double best = 1e30;
            for (int rep = 0; rep < repeats; ++rep) {
                Frame f = configured(raw, c);
                t0 = std::chrono::steady_clock::now();
                prepareFrame(f, inputs, p, cpu);
                best = std::min(best, seconds(t0) * 1e3);
            }
            std::printf("  CPU, %d threads: prepareFrame wall %.1f ms\n", threads, best);
        } else {
            std::printf("  CPU: not run (L.A.Cosmic on the CPU: ~18.7 s at 151 MP, docs/BENCHMARKS.md)\n");
        }
    }
    return 0;
}

#endif

} // namespace

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "--gpu") == 0) {
#ifdef GPUPHOT_BENCH_PREPARE_CUDA
        return gpuMode(argc, argv);
#else
        std::fprintf(stderr, "bench_prepare: built without the CUDA backend\n");
        return 2;
#endif
    }
    return cpuMode(argc, argv);
}
