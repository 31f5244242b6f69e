// Astrometric refinement of one real (or simulated) frame at several thread counts: the frame is read and
// reduced up to the calibration once (CPU backend: the detections as the pipeline hands them on), then
// solveAstrometry refines its header WCS against the reference catalog REPEAT times per thread count. Prints
// one line per solve (wall seconds, matches, SIP order, RMS, CRVAL to full precision: every thread count must
// give the same solution) and the fastest solve per thread count with the speed-up over the first count
// (docs/BENCHMARKS.md, "Astrometry").
//
// Usage: bench_astrometry FRAME.fits REF.fits [THREADS,THREADS,...] [REPEAT]   (defaults 1,2 and 3)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "core/catalog/reference_catalog.hpp"
#include "core/io/fits_image.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/astrometry/astrometry.hpp"
#include "core/wcs/wcs.hpp"

using namespace gpuphot;

namespace {

std::vector<int> threadList(const std::string& s) {
    std::vector<int> out;
    std::stringstream ss(s);
    for (std::string tok; std::getline(ss, tok, ',');) {
        const int t = std::stoi(tok);
        if (t < 1) throw std::invalid_argument("thread counts must be >= 1");
        out.push_back(t);
    }
    if (out.empty()) throw std::invalid_argument("no thread count");
    return out;
}

// The process's minor page faults so far (first touches of fresh memory: a first solve's extra time).
long minorFaults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

int run(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s FRAME.fits REF.fits [THREADS,...] [REPEAT]\n", argv[0]);
        return 2;
    }
    const std::vector<int> threads = threadList(argc > 3 ? argv[3] : "1,2");
    const int repeat = argc > 4 ? std::max(1, std::stoi(argv[4])) : 3;
    const Frame frame = readFrame(argv[1]);
    const ReferenceCatalog ref = readReferenceCatalog(argv[2]);
    PipelineConfig config;
    RunContext ctx;
    PipelineResult r;
    runPipelineUntil(frame, config, ctx, r, Stage::Background, Stage::Calibration, &ref);
    const Sources& s = r.detection.sources;
    std::printf("# %s: %dx%d, %zu detections, %zu reference stars\n", argv[1], frame.width(), frame.height(),
                s.size(), ref.size());
    double first = 0.0;
    for (int t : threads) {
        ctx.threads = t;
        double best = 1e30;
        for (int i = 0; i < repeat; ++i) {
            const long faults0 = minorFaults();
            const auto t0 = std::chrono::steady_clock::now();
            const AstrometryResult a =
                solveAstrometry(s.x, s.y, s.fluxIso, frame.width(), frame.height(), ref, frame.wcs.get(),
                                std::nullopt, config.astrometry, ctx);
            const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::min(best, sec);
            const long faults = minorFaults() - faults0;
            std::printf(
                "threads %2d solve %d: %.4f s, %ld page faults, ok %d, %d of %d matches used, SIP %d, "
                "rms %.17g\", crval %.17g %.17g\n",
                t, i, sec, faults, a.ok ? 1 : 0, a.nUsed, a.nMatched, a.sipOrder, a.rmsArcsec, a.wcs.crval[0],
                a.wcs.crval[1]);
        }
        if (first == 0.0) first = best;
        std::printf("threads %2d best %.4f s, speed-up %.2f\n", t, best, first / best);
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_astrometry: %s\n", e.what());
        return 1;
    }
}
