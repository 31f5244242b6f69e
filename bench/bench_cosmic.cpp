// Cosmic-ray detection timing: L.A.Cosmic (detectCosmicRays, 4 iterations at most) and the salt-and-pepper
// prefilter on a simulated frame (default 4096 x 4096) with stars and cosmic-ray tracks, with 1..N
// threads; also the exact 3x3 / 5x5 / 7x7 median filters alone (the bulk of the work).
//   bench_cosmic [size] [repeats] [tracks]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "core/model/instrument.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/prepare/cosmic_rays.hpp"

using namespace gpuphot;

namespace {
double seconds(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
// Process CPU time (all threads): meaningful on a loaded machine, where wall time is not.
double cpuSeconds() {
    return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}
} // namespace

int main(int argc, char** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 4096;
    const int repeats = argc > 2 ? std::atoi(argv[2]) : 2;
    const int tracks = argc > 3 ? std::atoi(argv[3]) : n * n / 20000;
    SimParams sp;
    sp.width = sp.height = n;
    sp.stars = n * n / 5000;
    sp.cosmicRays = tracks;
    sp.seed = 5;
    RunContext simCtx;
    const SimResult sim = simulateField(sp, &simCtx);
    const Instrument inst = readInstrument(sim.header);
    std::size_t truth = 0;
    for (std::size_t i = 0; i < sim.defects.pixelCount(); ++i)
        truth += (sim.defects.data()[i] & MaskCosmicRay) != 0;
    std::printf("frame %d x %d (%.1f Mpx), %d stars, %d tracks (%zu CR pixels), best of %d\n", n, n,
                n * double(n) / 1e6, sp.stars, tracks, truth, repeats);

    const int maxThreads = std::max(1u, std::thread::hardware_concurrency());
    for (int t = 1; t <= maxThreads; t = t < maxThreads && 2 * t > maxThreads ? maxThreads : 2 * t) {
        RunContext ctx;
        ctx.threads = t;
        double best = 1e30, bestCpu = 1e30, bestSp = 1e30, bestMed[3] = {1e30, 1e30, 1e30};
        CosmicRayResult res;
        for (int r = 0; r < repeats; ++r) {
            auto t0 = std::chrono::steady_clock::now();
            const double c0 = cpuSeconds();
            res = detectCosmicRays(sim.image.view(), {}, inst, {}, ctx);
            best = std::min(best, seconds(t0));
            bestCpu = std::min(bestCpu, cpuSeconds() - c0);
            t0 = std::chrono::steady_clock::now();
            const SaltPepperResult s = saltPepperMask(sim.image.view(), {}, {}, ctx);
            bestSp = std::min(bestSp, seconds(t0));
            (void)s;
            for (int k = 0; k < 3; ++k) {
                t0 = std::chrono::steady_clock::now();
                const Image<float> m = medianFilter(sim.image.view(), 3 + 2 * k, ctx);
                bestMed[k] = std::min(bestMed[k], seconds(t0));
            }
        }
        std::size_t found = 0;
        for (std::size_t i = 0; i < res.mask.pixelCount(); ++i)
            found += res.mask.data()[i] && (sim.defects.data()[i] & MaskCosmicRay);
        std::printf("  threads %2d: L.A.Cosmic %.3f s wall, %.3f s CPU (%zu iterations, %zu px flagged, "
                    "%.2f%% of CR px); "
                    "salt-and-pepper %.3f s; median 3x3 %.3f s, 5x5 %.3f s, 7x7 %.3f s\n",
                    t, best, bestCpu, res.perIteration.size(), res.crPixels,
                    truth ? 100.0 * found / truth : 0.0, bestSp, bestMed[0], bestMed[1], bestMed[2]);
        if (t == maxThreads) break;
    }
    return 0;
}
