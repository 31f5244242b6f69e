#include "core/pipeline/reduce.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numbers>

#include "core/catalog/table.hpp"
#include "core/io/fits_raw_read.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/frame_checks.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/report.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "core/util/timeline.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

double airmassFromAltitudeKeywords(const Header& h, std::string* keyword) {
    double altitude = std::nan("");
    std::string which;
    if (auto a = h.firstDouble({"ALTITUDE", "ALT", "OBJCTALT", "TELALT", "ELEVATIO", "EL"}, &which)) {
        altitude = *a;
    } else if (auto z = h.firstDouble({"ZD", "ZENDIST", "ZENITH"}, &which)) {
        altitude = 90.0 - *z;
    }
    if (!(altitude > 0.0 && altitude <= 90.0)) return std::nan("");
    if (keyword) *keyword = which;
    // Kasten & Young (1989): X = 1 / (sin h + 0.50572 (h + 6.07995 deg)^-1.6364), h in degrees.
    return 1.0 / (std::sin(altitude * std::numbers::pi / 180.0) + 0.50572 * std::pow(altitude + 6.07995, -1.6364));
}

namespace {
double secondsSince(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
} // namespace

LoadedFrame readFramePhase(const std::string& path, const ReduceOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    if (options.write) validateOutputOptions(options.output);
    FrameReadOptions read = options.read;
    read.keywords = options.config.keywords;
    read.overrides = options.config.instrument;
    LoadedFrame loaded;
    loaded.path = path;
    const auto t = std::chrono::steady_clock::now();
    // CUDA backend: the raw chunks go to the device as they are read (cuda_stages.hpp).
    loaded.deviceUpload = createRawUpload();
    loaded.frame = readFrame(path, read, loaded.deviceUpload.get());
    loaded.read.stage = "read";
    loaded.read.seconds = secondsSince(t);
    loaded.read.peakHostBytes = peakResidentBytes();
    loaded.seconds = secondsSince(start);
    return loaded;
}

namespace {
// The frame uploaded and converted on the device during the read becomes the device frame cache (the first
// CUDA stage, or the device preparation, uploads nothing). Host preparation steps that change the frame in
// place make the cached copy stale: what changed is dropped from the cache (bleed trails change the mask
// only; every other step the pixels) unless the device preparation replaced it with its result.
PrepareResult prepareLoaded(LoadedFrame& loaded, Frame& frame, const ReduceOptions& options,
                            RunContext& ctx) {
    auto t = ctx.time("prepare");
    const bool adopted =
        loaded.deviceUpload && adoptRawUpload(loaded.deviceUpload, frame.view(), frame.maskView(), true, ctx);
    loaded.deviceUpload.reset();
    timelineMark("frame on the device");
    PrepareResult prepared = prepareFrame(frame, options.prepare, options.config.prepare, ctx);
    if (adopted && !prepared.steps.empty()) {
        const bool pixelsAsRead = std::all_of(prepared.steps.begin(), prepared.steps.end(),
                                              [](const std::string& s) { return s == "bleed trails"; });
        settleRawUpload(ctx, !pixelsAsRead, true);
    }
    return prepared;
}

// The frame's checks before its stages, and the header facts the run completes (airmass from altitude,
// the WCS ignored on request).
void checkForRun(Frame& frame, const std::string& path, const ReduceOptions& options) {
    validateForReduction(frame);
    timelineMark("frame prepared and checked");
    noteFramePrepared();
    if (!std::isfinite(frame.instrument.airmass)) frame.instrument.airmass = airmassFromAltitudeKeywords(frame.header);
    if (options.ignoreHeaderWcs && frame.wcs) {
        frame.wcs.reset();
        frame.wcsProblem = "the header WCS is ignored (--ignore-header-wcs)";
    }
    const bool canSolve = options.reference && options.config.fitAstrometry;
    // A header that has a celestial WCS, but a broken one (singular CD, unknown projection, ...): RA/Dec
    // would silently be NaN. An error, unless the frame can be solved or the user opts out.
    if (frame.wcsBroken && !frame.wcs && !options.ignoreHeaderWcs && !canSolve)
        throw InvalidInput(path + ": unusable WCS in the header: " + frame.wcsProblem +
                           " (give --ref REFCAT to solve the frame, or --ignore-header-wcs for a pixel-only catalog)");
    if (options.targets && !frame.wcs && !canSolve)
        throw InvalidInput("--targets " + options.targets->path + ": " + path + " has no WCS to place the targets (" +
                           (frame.wcsProblem.empty() ? std::string("none in the header") : frame.wcsProblem) +
                           "); give --ref REFCAT to solve the frame");
}

// The reference positions at the frame's epoch when the catalog has proper motions and the frame a date
// (`moved` holds them), else `reference` itself.
const ReferenceCatalog* referenceAtEpoch(const ReferenceCatalog* reference, const Frame& frame,
                                         ReferenceCatalog& moved) {
    if (!reference || !std::isfinite(frame.instrument.mjdMid)) return reference;
    bool anyPm = false;
    for (std::size_t i = 0; i < reference->pmRa.size() && !anyPm; ++i)
        anyPm = std::isfinite(reference->pmRa[i]);
    if (!anyPm) return reference;
    moved = *reference;
    applyProperMotion(moved, 2000.0 + (frame.instrument.mjdMid - 51544.5) / 365.25);
    return &moved;
}

// Forced photometry at the --targets positions, placed with the fitted WCS, else the header's.
void measureTargets(ComputedFrame& out, const ReduceOptions& options, RunContext& ctx) {
    const Frame& frame = out.frame;
    PipelineResult& result = out.result;
    const Wcs* wcs = result.fittedWcs ? result.fittedWcs.get() : frame.wcs.get();
    if (!wcs) {
        result.warnings.push_back("--targets: no WCS to place the targets (the astrometric solve failed): "
                                  "no targets table written");
        out.summary.calibrationFailed = true;
        return;
    }
    auto t = ctx.time("forced photometry");
    const TargetList& tl = *options.targets;
    std::vector<double> x(tl.size()), y(tl.size());
    if (tl.size() > 0) wcs->worldToPixel(tl.ra, tl.dec, x, y);
    ApertureParams ap = options.config.aperture;
    if (std::isfinite(frame.instrument.saturation)) ap.saturation = frame.instrument.saturation;
    const ForcedPhotometryResult forced = forcedPhotometry(
        frame.view(), frame.maskView(), result.background, result.detection.segmentation.view(),
        result.detection.sources, result.aperture, x, y, result.fwhm, frame.instrument.gain,
        frame.instrument.readNoise, ap, options.forced, ctx);
    out.targets = buildTargetTable(frame, result, tl, forced);
    std::size_t off = 0;
    for (std::uint32_t f : forced.flags)
        off += (f & FlagTargetOffFrame) != 0;
    if (off > 0)
        result.warnings.push_back("--targets: " + std::to_string(off) + " of " + std::to_string(tl.size()) +
                                  " targets fall outside the frame (flagged, not measured)");
}

// Everything after the stages before the calibration: the calibration's end, forced photometry, the
// catalog table and the report, with `ctx`.
void completeFrame(FrameInFlight& f, const ReduceOptions& options, RunContext& ctx) {
    ComputedFrame& out = f.out;
    const Frame& frame = out.frame;
    PipelineResult& result = out.result;
    finishCalibration(frame, options.config, ctx, result, f.reference, std::move(f.calibration));
    ReduceSummary& summary = out.summary;
    summary.sources = result.detection.sources.size();
    summary.calibrationFailed = f.reference != nullptr && !result.zeropoint.ok;
    if (options.output.writeSolved && !result.fittedWcs)
        result.warnings.push_back("--write-solved: no verified astrometric solution (" +
                                  (!f.reference                        ? std::string("no --ref catalog")
                                   : result.astrometry.message.empty() ? std::string("the fit did not run")
                                                                       : result.astrometry.message) +
                                  "): no solved frame written");
    if (options.targets) measureTargets(out, options, ctx);
    summary.warnings = result.warnings;
    auto t = ctx.time("catalog");
    out.catalog = buildCatalog(frame, result, options.config, f.reference);
    summary.report = buildReport(frame, result, options.config, ctx);
    if (!f.prepared.steps.empty()) summary.report["prepare"] = f.prepared;
    if (const ReferenceCatalog* reference = f.reference)
        summary.report["reference"] = {{"file", reference->path},
                                       {"rows", reference->rowsRead},
                                       {"usable", reference->size()},
                                       {"skipped_nonfinite", reference->skippedNonFinite}};
    if (out.targets)
        summary.report["targets"] = {{"count", out.targets->rows()}, {"file", options.targets->path}};
}

// A context for a frame's host-only finish: the run's settings and its records so far, no device state.
RunContext hostContextOf(const RunContext& ctx) {
    RunContext c;
    c.backend = ctx.backend;
    c.threads = ctx.threads;
    c.progress = ctx.progress;
    c.cancelFlag = ctx.cancelFlag;
    c.tuning = ctx.tuning;
    c.testHooks = ctx.testHooks;
    c.gpuMemLimit = ctx.gpuMemLimit;
    c.records = ctx.records;
    return c;
}
} // namespace

std::unique_ptr<FrameInFlight> startFramePhase(LoadedFrame&& loaded, const ReduceOptions& options,
                                               RunContext& ctx) {
    const auto start = std::chrono::steady_clock::now();
    auto f = std::make_unique<FrameInFlight>();
    ctx.records.clear();
    if (ctx.deviceCheckpoint) ctx.deviceCheckpoint(loaded.read);
    ctx.records.push_back(loaded.read);
    Frame& frame = f->out.frame;
    frame = std::move(loaded.frame);
    f->out.summary.frame = loaded.path;
    f->prepared = prepareLoaded(loaded, frame, options, ctx);
    checkForRun(frame, loaded.path, options);
    f->reference = referenceAtEpoch(options.reference, frame, f->moved);
    f->calibration = runPipelineToCalibration(frame, options.config, ctx, f->out.result, f->reference);
    if (f->calibration.hostOnly() && !options.targets) {
        f->host = hostContextOf(ctx);
    } else {
        completeFrame(*f, options, ctx);
        f->finished = true;
    }
    // What is left (the calibration's end, the catalog, the report, the outputs) reads the frame's size,
    // header and WCS only, unless an output reads its pixels.
    if (!outputsReadPixels(options.output)) frame.dropPixels();
    f->seconds = loaded.seconds + secondsSince(start);
    return f;
}

ComputedFrame finishFramePhase(std::unique_ptr<FrameInFlight> f, const ReduceOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    if (!f->finished) {
        completeFrame(*f, options, f->host);
        f->finished = true;
    }
    f->out.summary.seconds = f->seconds + secondsSince(start);
    return std::move(f->out);
}

ComputedFrame computeFramePhase(LoadedFrame&& loaded, const ReduceOptions& options, RunContext& ctx) {
    return finishFramePhase(startFramePhase(std::move(loaded), options, ctx), options);
}

ReduceSummary writeFramePhase(ComputedFrame&& c, const ReduceOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    ReduceSummary summary = std::move(c.summary);
    if (options.write)
        summary.outputs = writeReductionOutputs(c.frame, c.result, c.catalog, options.output, summary.report,
                                                c.targets ? &*c.targets : nullptr,
                                                outputStem(summary.frame, options.read.hdu));
    summary.seconds += secondsSince(start);
    return summary;
}

ReduceSummary reduceFrame(const std::string& path, const ReduceOptions& options, RunContext& ctx) {
    ComputedFrame computed = computeFramePhase(readFramePhase(path, options), options, ctx);
    auto t = ctx.time("write");
    return writeFramePhase(std::move(computed), options);
}

} // namespace gpuphot
