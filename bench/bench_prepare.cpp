// Frame-preparation timing on the CPU: a raw frame (default 14208 x 10656 = 151 MP of data plus a
// 64-column overscan) prepared with a master bias, an EXPTIME-scaled master dark, a master flat and a
// bad-pixel mask (overscan subtraction, trim, calibration, masking, bleed trails); masters resident in
// memory (loaded once, as reduce does). Prints the best of `repeats` for 1..N threads.
//   bench_prepare [width] [height] [repeats]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <thread>

#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare.hpp"

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

} // namespace

int main(int argc, char** argv) {
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
    PrepareInputs in;
    in.bias = constant(w, h, 0.5f, 3.0f, "mbias", 0.0);
    in.dark = constant(w, h, 20.0f, 1.0f, "mdark", 60.0);
    in.flat = constant(w, h, 0.9f, 0.2f, "mflat", 0.0);
    in.badPixels = Image<std::uint8_t>(w, h, 0);
    for (long long k = 0; k < 10000; ++k)
        in.badPixels(static_cast<int>((k * 15485863LL) % w), static_cast<int>((k * 32452843LL) % h)) = 1;
    in.badPixelPath = "bpm";
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
