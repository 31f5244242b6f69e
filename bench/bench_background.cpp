// Background stage timing: a simulated frame (default 4096 x 4096), gpuphot's CPU background with 1..N
// threads against sep_background + sep_bkg_array/rmsarray on the same pixels (sep loaded with dlopen when
// libsep is installed; never a build dependency).
//   bench_background [size] [repeats] [meshSize]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include <dlfcn.h>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"

#if __has_include(<sep.h>)
extern "C" {
#include <sep.h>
}
#define BENCH_HAVE_SEP_H 1
#endif

using namespace gpuphot;

namespace {

double seconds(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Image<float> simulate(int n, unsigned seed) {
    Image<float> img(n, n, Image<float>::NoInit{});
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 30.0f);
    for (int y = 0; y < n; ++y)
        for (int x = 0; x < n; ++x)
            img(x, y) = 1000.0f + 0.01f * x - 0.02f * y + noise(rng);
    std::uniform_real_distribution<double> u(0.0, n), f(0.0, 1.0);
    const int stars = n * n / 20000;
    for (int s = 0; s < stars; ++s) {
        const double cx = u(rng), cy = u(rng), peak = 200.0 * std::pow(f(rng) + 1e-3, -1.2);
        for (int y = std::max(0, int(cy) - 8); y <= std::min(n - 1, int(cy) + 8); ++y)
            for (int x = std::max(0, int(cx) - 8); x <= std::min(n - 1, int(cx) + 8); ++x)
                img(x, y) += static_cast<float>(
                    peak * std::exp(-0.5 * ((x - cx) * (x - cx) + (y - cy) * (y - cy)) / 2.25));
    }
    return img;
}

} // namespace

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 4096;
    const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
    const int mesh = argc > 3 ? std::atoi(argv[3]) : 64;
    const Image<float> img = simulate(n, 1);
    std::printf("frame %d x %d (%.1f Mpx), mesh %d, filter 3, best of %d\n", n, n, n * double(n) / 1e6, mesh,
                repeats);

    const int maxThreads = std::max(1u, std::thread::hardware_concurrency());
    BackgroundParams p;
    p.meshSize = mesh;
    for (int t = 1; t <= maxThreads; t *= 2) {
        double best = 1e30, bestMesh = 1e30;
        for (int r = 0; r < repeats; ++r) {
            RunContext ctx;
            ctx.threads = t;
            double meshDone = 0.0;
            const auto t0 = std::chrono::steady_clock::now();
            ctx.progress = [&](const std::string&, double f) {
                if (f >= 0.5 && meshDone == 0.0) meshDone = seconds(t0);
            };
            const BackgroundResult res = estimateBackground(img.view(), {}, p, ctx);
            best = std::min(best, seconds(t0));
            bestMesh = std::min(bestMesh, meshDone);
            if (r == 0 && t == 1)
                std::printf("  gpuphot global %.3f rms %.3f\n", res.globalLevel, res.globalRms);
        }
        std::printf("  gpuphot cpu, %d thread(s): %.3f s (meshes %.3f s, maps %.3f s)\n", t, best, bestMesh,
                    best - bestMesh);
    }

#ifdef BENCH_HAVE_SEP_H
    void* lib = dlopen("libsep.so.0", RTLD_NOW);
    if (!lib) lib = dlopen("libsep.so", RTLD_NOW);
    if (!lib) {
        std::printf("  sep: libsep not found\n");
        return 0;
    }
    auto bg = reinterpret_cast<decltype(&sep_background)>(dlsym(lib, "sep_background"));
    auto arr = reinterpret_cast<decltype(&sep_bkg_array)>(dlsym(lib, "sep_bkg_array"));
    auto rmsarr = reinterpret_cast<decltype(&sep_bkg_rmsarray)>(dlsym(lib, "sep_bkg_rmsarray"));
    auto glob = reinterpret_cast<decltype(&sep_bkg_global)>(dlsym(lib, "sep_bkg_global"));
    auto globrms = reinterpret_cast<decltype(&sep_bkg_globalrms)>(dlsym(lib, "sep_bkg_globalrms"));
    auto freeb = reinterpret_cast<decltype(&sep_bkg_free)>(dlsym(lib, "sep_bkg_free"));
    if (!bg || !arr || !rmsarr || !freeb) return 1;
    sep_image im{};
    im.data = img.data();
    im.dtype = SEP_TFLOAT;
    im.w = n;
    im.h = n;
    std::vector<float> level(img.pixelCount()), rms(img.pixelCount());
    double best = 1e30, bestMesh = 1e30;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        sep_bkg* b = nullptr;
        if (bg(&im, mesh, mesh, 3, 3, 0.0, &b) != 0) return 1;
        const double tm = seconds(t0);
        arr(b, level.data(), SEP_TFLOAT);
        rmsarr(b, rms.data(), SEP_TFLOAT);
        best = std::min(best, seconds(t0));
        bestMesh = std::min(bestMesh, tm);
        if (r == 0) std::printf("  sep     global %.3f rms %.3f\n", glob(b), globrms(b));
        freeb(b);
    }
    std::printf("  sep 1 thread: %.3f s (sep_background %.3f s, bkg/rms arrays %.3f s)\n", best, bestMesh,
                best - bestMesh);
#endif
    return 0;
}
