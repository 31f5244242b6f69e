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

ComputedFrame computeFramePhase(LoadedFrame&& loaded, const ReduceOptions& options, RunContext& ctx) {
    const auto start = std::chrono::steady_clock::now();
    const std::string& path = loaded.path;
    ctx.records.clear();
    if (ctx.deviceCheckpoint) ctx.deviceCheckpoint(loaded.read);
    ctx.records.push_back(loaded.read);
    ComputedFrame out;
    Frame& frame = out.frame;
    frame = std::move(loaded.frame);
    PrepareResult prepared;
    {
        auto t = ctx.time("prepare");
        // The frame uploaded and converted on the device during the read becomes the device frame cache
        // (the first CUDA stage, or the device preparation, uploads nothing). Host preparation steps that
        // change the frame in place make the cached copy stale: what changed is dropped from the cache
        // (bleed trails change the mask only; every other step the pixels) unless the device preparation
        // replaced it with its result.
        const bool adopted =
            loaded.deviceUpload && adoptRawUpload(loaded.deviceUpload, frame.view(), frame.maskView(), true, ctx);
        loaded.deviceUpload.reset();
        timelineMark("frame on the device");
        prepared = prepareFrame(frame, options.prepare, options.config.prepare, ctx);
        if (adopted && !prepared.steps.empty()) {
            const bool pixelsAsRead = std::all_of(prepared.steps.begin(), prepared.steps.end(),
                                                  [](const std::string& s) { return s == "bleed trails"; });
            settleRawUpload(ctx, !pixelsAsRead, true);
        }
    }
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
    // Reference positions at the frame's epoch when the catalog has proper motions and the frame a date.
    const ReferenceCatalog* reference = options.reference;
    ReferenceCatalog moved;
    if (reference && std::isfinite(frame.instrument.mjdMid)) {
        bool anyPm = false;
        for (std::size_t i = 0; i < reference->pmRa.size() && !anyPm; ++i) anyPm = std::isfinite(reference->pmRa[i]);
        if (anyPm) {
            moved = *reference;
            applyProperMotion(moved, 2000.0 + (frame.instrument.mjdMid - 51544.5) / 365.25);
            reference = &moved;
        }
    }
    out.result = runPipeline(frame, options.config, ctx, reference);
    PipelineResult& result = out.result;

    ReduceSummary& summary = out.summary;
    summary.frame = path;
    summary.sources = result.detection.sources.size();
    summary.warnings = result.warnings;
    summary.calibrationFailed = reference != nullptr && !result.zeropoint.ok;
    if (options.output.writeSolved && !result.fittedWcs)
        result.warnings.push_back("--write-solved: no verified astrometric solution (" +
                                  (!reference ? std::string("no --ref catalog")
                                              : result.astrometry.message.empty() ? std::string("the fit did not run")
                                                                                  : result.astrometry.message) +
                                  "): no solved frame written");
    std::optional<Table>& targetTable = out.targets;
    if (options.targets) {
        const Wcs* wcs = result.fittedWcs ? result.fittedWcs.get() : frame.wcs.get();
        if (!wcs) {
            result.warnings.push_back("--targets: no WCS to place the targets (the astrometric solve failed): "
                                      "no targets table written");
            summary.calibrationFailed = true;
        } else {
            auto t = ctx.time("forced photometry");
            const TargetList& tl = *options.targets;
            std::vector<double> x(tl.size()), y(tl.size());
            if (tl.size() > 0) wcs->worldToPixel(tl.ra, tl.dec, x, y);
            ApertureParams ap = options.config.aperture;
            if (std::isfinite(frame.instrument.saturation)) ap.saturation = frame.instrument.saturation;
            const ForcedPhotometryResult forced =
                forcedPhotometry(frame.view(), frame.maskView(), result.background,
                                 result.detection.segmentation.view(), result.detection.sources, result.aperture, x, y,
                                 result.fwhm, frame.instrument.gain, frame.instrument.readNoise, ap, options.forced,
                                 ctx);
            targetTable = buildTargetTable(frame, result, tl, forced);
            std::size_t off = 0;
            for (std::uint32_t f : forced.flags) off += (f & FlagTargetOffFrame) != 0;
            if (off > 0)
                result.warnings.push_back("--targets: " + std::to_string(off) + " of " + std::to_string(tl.size()) +
                                          " targets fall outside the frame (flagged, not measured)");
        }
    }
    summary.warnings = result.warnings;
    {
        auto t = ctx.time("catalog");
        out.catalog = buildCatalog(frame, result, options.config, reference);
        summary.report = buildReport(frame, result, options.config, ctx);
        if (!prepared.steps.empty()) summary.report["prepare"] = prepared;
        if (reference)
            summary.report["reference"] = {{"file", reference->path},
                                           {"rows", reference->rowsRead},
                                           {"usable", reference->size()},
                                           {"skipped_nonfinite", reference->skippedNonFinite}};
        if (targetTable) summary.report["targets"] = {{"count", targetTable->rows()}, {"file", options.targets->path}};
    }
    summary.seconds = loaded.seconds + secondsSince(start);
    return out;
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
