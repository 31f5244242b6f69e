// The workbench's re-run after a detection edit, through core's API (no Qt): the frame is read once and
// reduced once (frame and background maps resident on the device with the CUDA backend), then for each
// threshold the worker's provisional path (ui/pipeline_worker.cpp) runs: the detection on the resident
// frame (runPipelineUntil, first = Detection, stop = Psf), then provisionalResult (the new background and
// detection moved in, the earlier PSF model on the new sources, apertures, calibration). Each re-run is
// timed (wall and per stage, best and median of --repeat) and checked: its detection and aperture columns
// must equal bit for bit those of the same calls on a fresh run (a new RunContext: background and detection
// from scratch, no device caches).
//   bench_rerun FRAME [--backend auto|cpu|cuda] [--thresholds 1.3,1.7,2.5] [--repeat 3] [--threads N]
//               [--config FILE.json] [--json FILE] [--no-check] [--copy-every-repeat]
// The table's figures are of the re-run that moves the new detection into the provisional result. The
// worker does the same and then, after the provisional result is out, copies the background and detection
// back for the complete run ("give back", not in the totals; with the map's download on another thread, as
// the worker): that path is timed once per threshold.
// The goal: detection + photometry re-run on a 151 MP frame already on the GPU <= 50 ms.
// GPUPHOT_APERTURE_TIMING=1 in the environment: the CUDA aperture stage prints its phases to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
    std::string frame, backend = "auto", config, json;
    std::vector<double> thresholds{1.3, 1.7, 2.5};
    int repeat = 3, threads = 0;
    bool check = true;
    bool copyToo =
        false; // --copy-every-repeat: the worker's copying path on every repeat, not only the first
};

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(
        stderr,
        "bench_rerun: %s\nusage: bench_rerun FRAME [--backend auto|cpu|cuda] [--thresholds a,b,..] "
        "[--repeat N] [--threads N] [--config FILE.json] [--json FILE] [--no-check] [--copy-every-repeat]\n",
        why.c_str());
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(a + " needs a value");
            return argv[++i];
        };
        if (a == "--backend")
            o.backend = value();
        else if (a == "--config")
            o.config = value();
        else if (a == "--json")
            o.json = value();
        else if (a == "--repeat")
            o.repeat = std::max(1, std::atoi(value().c_str()));
        else if (a == "--threads")
            o.threads = std::atoi(value().c_str());
        else if (a == "--no-check")
            o.check = false;
        else if (a == "--copy-every-repeat")
            o.copyToo = true;
        else if (a == "--thresholds") {
            o.thresholds.clear();
            std::stringstream ss(value());
            for (std::string t; std::getline(ss, t, ',');)
                o.thresholds.push_back(std::stod(t));
            if (o.thresholds.empty()) usage("--thresholds is empty");
        } else if (!a.empty() && a[0] == '-')
            usage("unknown option " + a);
        else if (o.frame.empty())
            o.frame = a;
        else
            usage("one frame only");
    }
    if (o.frame.empty()) usage("no frame given");
    return o;
}

RunContext makeContext(const Options& o) {
    RunContext ctx;
    ctx.backend = resolveBackend(parseBackend(o.backend));
    ctx.threads = o.threads;
    ctx.tuning = BackendTuning::fromEnvironment();
    ctx.tuning.applyToProcess();
    return ctx;
}

double best(std::vector<double> v) {
    return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}
double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The worker's provisional path for `config` on a frame whose complete result `previous` exists:
// detection (stop before the PSF stage), then provisionalResult. Stage records and walls into `times`.
// The background and detection are moved into the provisional result. workerWay: as the worker, which
// then copies them back for its complete run ("give back"). Apart from the totals: a copy of the new
// DetectionResult ("detection copy": the segmentation map is shared, O(1)) and the map's download to the
// host ("segmentation materialise": what a host consumer, --write-seg or the workbench overlay, pays; 0 on
// the CPU backend; on the stage thread, and on another thread in the worker's way, as the worker does it).
PipelineResult rerun(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                     const PipelineResult& previous, std::map<std::string, double>& times, bool workerWay) {
    ctx.records.clear();
    const auto t0 = Clock::now();
    PipelineResult detected;
    detected.keepFullMaps = false; // as the worker: lean background maps
    // as the worker on frames up to 16 MP: the detection's images kept with the first run, thresholded again
    detected.keepDetectionImages = previous.keepDetectionImages;
    detected.detectionImages = previous.detectionImages;
    detected.background = previous.background;
    detected.completed = Stage::Detection;
    times["reuse background"] = since(t0);
    const auto t1 = Clock::now();
    runPipelineUntil(frame, config, ctx, detected, Stage::Detection, Stage::Psf);
    times["wall detection"] = since(t1);
    const auto t2 = Clock::now();
    PipelineResult prov = provisionalResult(frame, config, ctx, std::move(detected), previous);
    times["wall provisional"] = since(t2);
    times["wall total"] = since(t0);
    for (const StageRecord& r : ctx.records)
        times[r.stage] += r.seconds;
    auto tc = Clock::now();
    if (workerWay) { // the worker's copies for the complete run, after the provisional result went out
        detected.background = prov.background;
        detected.detection = prov.detection;
        times["give back"] = since(tc);
    } else {
        const DetectionResult copy = prov.detection;
        times["detection copy"] = since(tc);
    }
    tc = Clock::now();
    if (workerWay) { // the worker's way: on another thread (a pageable copy on the map's own stream)
        std::exception_ptr failed;
        std::thread down([&] {
            try {
                prov.detection.segmentation.host();
            } catch (...) {
                failed = std::current_exception();
            }
        });
        down.join();
        if (failed) std::rethrow_exception(failed);
        times["segmentation materialise (other thread)"] = since(tc);
    } else { // on the thread that runs the stages: through the context's pinned staging
        prov.detection.segmentation.host();
        times["segmentation materialise"] = since(tc);
    }
    return prov;
}

} // namespace

int main(int argc, char** argv) {
#ifdef GPUPHOT_WITH_CUDA
    cuda::linkKernels();
#endif
    const Options o = parse(argc, argv);
    try {
        if (o.threads > 0) omp_set_num_threads(o.threads);
        const PipelineConfig base = o.config.empty() ? PipelineConfig{} : loadPipelineConfig(o.config);
        FrameReadOptions read;
        read.keywords = base.keywords;
        read.overrides = base.instrument;
        auto t = Clock::now();
        const Frame frame = readFrame(o.frame, read);
        const double readSeconds = since(t);
        RunContext ctx = makeContext(o);
        std::fprintf(stderr, "bench_rerun: %s %dx%d, backend %s, %d threads, read %.3f s\n", o.frame.c_str(),
                     frame.width(), frame.height(), backendName(ctx.backend), ctx.threadCount(), readSeconds);

        // The complete first run (uploads the frame, builds the maps), twice: the second one is warm.
        PipelineResult first;
        double firstSeconds = 0.0;
        for (int k = 0; k < 2; ++k) {
            ctx.records.clear();
            first = PipelineResult{};
            first.keepFullMaps = false;
            first.keepDetectionImages = static_cast<double>(frame.width()) * frame.height() <= 16e6;
            t = Clock::now();
            runPipeline(frame, base, ctx, first);
            firstSeconds = since(t);
        }
        std::fprintf(stderr, "full run (warm): %.3f s, %zu sources, fwhm %.3f (%s); stages:", firstSeconds,
                     first.detection.sources.size(), first.fwhm, first.fwhmSource.c_str());
        for (const StageRecord& r : ctx.records)
            std::fprintf(stderr, " %s %.4f", r.stage.c_str(), r.seconds);
        std::fprintf(stderr, "\n");

        // The worker copies the whole previous result into the new run's before re-running from the
        // detection (ui/pipeline_worker.cpp processPending); the bench reuses the background alone.
        t = Clock::now();
        { const PipelineResult copy = first; }
        const double workerCopySeconds = since(t);
        std::fprintf(stderr, "copy (and release) of the whole previous result: %.1f ms\n",
                     1e3 * workerCopySeconds);
        nlohmann::json out{{"frame", o.frame},
                           {"previous_result_copy_seconds", workerCopySeconds},
                           {"width", frame.width()},
                           {"height", frame.height()},
                           {"backend", backendName(ctx.backend)},
                           {"threads", ctx.threadCount()},
                           {"repeat", o.repeat},
                           {"full_run_seconds", firstSeconds},
                           {"full_run_sources", first.detection.sources.size()},
                           {"base_threshold", base.detection.threshold}};
        bool allSame = true;
        // Control: the provisional path at the unchanged threshold gives the full run's columns exactly (its
        // curve of growth is the full run's, without the curve stars' list, which indexes earlier sources).
        if (o.check) {
            std::map<std::string, double> ignored;
            PipelineResult same = rerun(frame, base, ctx, first, ignored, true);
            same.aperture.apCorrStarIndex = first.aperture.apCorrStarIndex;
            const std::string d = firstPhotometryDifference(same, first);
            std::fprintf(stderr, "control (threshold unchanged) vs the full run: %s\n",
                         d.empty() ? "bitwise the same" : ("DIFFERS at " + d).c_str());
            out["control_same_as_full_run"] = d.empty();
            allSame = allSame && d.empty();
        }
        std::printf("%-9s %8s %9s %9s %9s %9s %9s %9s %9s  %s\n", "threshold", "sources", "total ms",
                    "det ms", "copy ms", "aper ms", "calib ms", "median", "first", "check");
        // The timings of every threshold first, one threshold after another as a slider moves; the checks
        // (fresh contexts, whose set-up and teardown would disturb the next threshold's first re-run) after.
        struct Row {
            double thr = 0.0;
            std::map<std::string, std::vector<double>> times;
            std::map<std::string, std::vector<double>> copied; // the worker's way (with the give back)
            PipelineResult prov;
        };
        std::vector<Row> rows;
        for (const double thr : o.thresholds) {
            PipelineConfig config = base;
            config.detection.threshold = thr;
            Row& row = rows.emplace_back();
            row.thr = thr;
            for (int k = 0; k < o.repeat; ++k) {
                std::map<std::string, double> one, withCopy;
                row.prov = rerun(frame, config, ctx, first, one, false);
                for (const auto& [name, s] : one)
                    row.times[name].push_back(s);
                if (k == 0 || o.copyToo) {
                    rerun(frame, config, ctx, first, withCopy, true);
                    for (const auto& [name, s] : withCopy)
                        row.copied[name].push_back(s);
                }
            }
        }
        for (Row& row : rows) {
            const double thr = row.thr;
            PipelineConfig config = base;
            config.detection.threshold = thr;
            auto& times = row.times;
            auto& copied = row.copied;
            const PipelineResult& prov = row.prov;
            std::string check = "not checked";
            if (o.check) {
                // The same calls on a fresh context: background and detection from scratch, no device caches.
                RunContext fresh = makeContext(o);
                PipelineResult detected;
                detected.keepFullMaps = false;
                runPipelineUntil(frame, config, fresh, detected, Stage::Background, Stage::Psf);
                const PipelineResult expect = provisionalResult(frame, config, fresh, detected, first);
                const std::string d = firstPhotometryDifference(prov, expect);
                check = d.empty() ? "bitwise the same as a fresh run" : "DIFFERS at " + d;
                allSame = allSame && d.empty();
            }
            nlohmann::json j{
                {"threshold", thr}, {"sources", prov.detection.sources.size()}, {"check", check}};
            for (const auto& [name, v] : times) {
                j["best"][name] = best(v);
                j["median"][name] = median(v);
                j["all"][name] = v; // every repeat, in order (the outliers' stages)
            }
            for (const auto& [name, v] : copied)
                j["worker_way_best"][name] = best(v);
            j["first"]["wall total"] = times["wall total"].front();
            out["reruns"].push_back(j);
            auto ms = [&](const char* name) { return times.count(name) ? 1e3 * best(times[name]) : 0.0; };
            const double calib = ms("calibration") + ms("astrometry") + ms("crossmatch") + ms("zeropoint");
            // "first": the first repeat at this threshold (what the workbench's first re-run at a new
            // source count pays: buffers and pinned buffers that grow), the others are best and median.
            std::printf("%-9.2f %8zu %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f  %s\n", thr,
                        prov.detection.sources.size(), ms("wall total"), ms("wall detection"),
                        ms("provisional copy"), ms("aperture"), calib, 1e3 * median(times["wall total"]),
                        1e3 * times["wall total"].front(), check.c_str());
            std::printf("          the worker's way: total %.1f ms; then, after it is out, give back "
                        "%.1f ms\n",
                        1e3 * best(copied["wall total"]), 1e3 * best(copied["give back"]));
            std::printf("          detection copy %.3f ms; segmentation map to the host %.1f ms, on another "
                        "thread %.1f ms (not in the totals)\n",
                        ms("detection copy"), ms("segmentation materialise"),
                        copied.count("segmentation materialise (other thread)")
                            ? 1e3 * best(copied["segmentation materialise (other thread)"])
                            : 0.0);
            std::fflush(stdout);
        }
        out["all_checks_same"] = allSame;
        if (!o.json.empty()) {
            std::ofstream f(o.json);
            f << out.dump(2) << "\n";
        } else {
            std::printf("%s\n", out.dump().c_str());
        }
        return allSame ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_rerun: %s\n", e.what());
        return 2;
    }
}
