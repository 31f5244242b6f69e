#include "core/pipeline/reduce.hpp"

#include <chrono>
#include <cmath>

#include "core/catalog/table.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/frame_checks.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/report.hpp"
#include "core/pipeline/run_context.hpp"

namespace gpuphot {

ReduceSummary reduceFrame(const std::string& path, const ReduceOptions& options, RunContext& ctx) {
    const auto start = std::chrono::steady_clock::now();
    if (options.write) validateOutputOptions(options.output);
    ctx.records.clear();
    FrameReadOptions read = options.read;
    read.keywords = options.config.keywords;
    read.overrides = options.config.instrument;
    Frame frame;
    {
        auto t = ctx.time("read");
        frame = readFrame(path, read);
    }
    validateForReduction(frame);
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
    PipelineResult result = runPipeline(frame, options.config, ctx, reference);

    ReduceSummary summary;
    summary.frame = path;
    summary.sources = result.detection.sources.size();
    summary.warnings = result.warnings;
    summary.calibrationFailed = reference != nullptr && !result.zeropoint.ok;
    {
        auto t = ctx.time("catalog");
        const Table catalog = buildCatalog(frame, result, options.config, reference);
        summary.report = buildReport(frame, result, options.config, ctx);
        if (options.write) summary.outputs = writeReductionOutputs(frame, result, catalog, options.output, summary.report);
    }
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return summary;
}

} // namespace gpuphot
