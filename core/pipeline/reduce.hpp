#pragma once
// One frame end to end: read, check, run the stages, assemble the catalog and report, write the
// outputs. The CLI's reduce and bench, the batch worker and the tests all call this.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/target_list.hpp"
#include "core/pipeline/exposure.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture/forced_photometry.hpp"
#include "core/stages/prepare/prepare.hpp"

namespace gpuphot {

class RunContext;

struct ReduceOptions {
    FrameReadOptions read;   // HDU selection; keywords and overrides are taken from config
    PipelineConfig config;
    OutputOptions output;
    bool write = true;       // false: measure only (bench)
    // Reference catalog for the calibration stages (null: no calibration). Loaded once by the caller
    // and shared by every frame; proper motions are applied to each frame's epoch.
    const ReferenceCatalog* reference = nullptr;
    // Forced photometry at these positions (--targets; null: none), placed with the fitted WCS, else the
    // header's. A frame without any WCS (none in the header, or --ignore-header-wcs, and no --ref to
    // solve with) is InvalidInput naming --targets; when a solve fails on a frame without a header WCS
    // the outputs are written without the targets table and a warning says why.
    const TargetList* targets = nullptr;
    // Master bias/dark/flat and bad-pixel mask (--bias --dark --flat --bpm; null: none), loaded once by the
    // caller (loadPrepareInputs) and shared by every frame. Preparation (config.prepare) runs right after
    // the read either way.
    const PrepareInputs* prepare = nullptr;
    std::shared_ptr<const PrepareInputs> prepareStorage; // owns *prepare when the options loaded it
    ForcedPhotometryParams forced;
    // --ignore-header-wcs: reduce as if the header had no WCS (the solve is blind, from the pointing
    // keywords or none; RA/Dec come only from a verified solution).
    bool ignoreHeaderWcs = false;
    // Mosaic exposures (several image extensions, or --hdu all / a list / a range): exposure.hpp.
    ExposureParams exposure;
};

struct ReduceSummary {
    std::string frame;
    std::size_t sources = 0;
    double seconds = 0.0;
    std::vector<std::string> outputs;
    std::vector<std::string> warnings;
    bool calibrationFailed = false; // a reference was given but no zero point came out (outputs still written)
    nlohmann::json report;
};

// Airmass from the altitude keywords a header may have (ALTITUDE, ALT, OBJCTALT, TELALT, ELEVATIO, EL in
// degrees; or ZD / ZENDIST as zenith distance), Kasten & Young (1989); NaN when none is present and
// above the horizon. reduceFrame uses it only when the airmass keywords (AIRMASS, ...) are absent.
class Header;
double airmassFromAltitudeKeywords(const Header& header, std::string* keyword = nullptr);

// Throws InvalidInput / IoError naming the file; on error nothing is written.
// Equivalent to writeFramePhase(computeFramePhase(readFramePhase(path, options), options, ctx), options).
ReduceSummary reduceFrame(const std::string& path, const ReduceOptions& options, RunContext& ctx);

// reduceFrame in three phases, so that a long-lived worker can overlap frames (read frame N+1 and write
// frame N-1 while frame N is in its stages; app/cli/batch.hpp FramePipeline). The result is the same
// bytes whichever way the phases are scheduled: each phase depends only on its inputs.
//
// 1. Read: the options are checked and the frame file is read and decoded. Host and file system only,
//    no RunContext: safe on another thread while a RunContext is busy with another frame.
class RawChunkSink;
struct LoadedFrame {
    std::string path;
    Frame frame;
    // CUDA backend: the frame uploaded and converted on the device while it was read (cuda_stages.hpp,
    // createRawUpload; null when not armed or off); computeFramePhase gives it to the frame cache.
    std::shared_ptr<RawChunkSink> deviceUpload;
    StageRecord read;     // the "read" stage record (timing, host peak); computeFramePhase puts it first
    double seconds = 0.0; // time spent in the phases so far
};
LoadedFrame readFramePhase(const std::string& path, const ReduceOptions& options);

// 2. Compute: preparation, checks, the stages, forced photometry, the catalog table and the report, with
//    `ctx` (its records start with the read record). Nothing is written.
struct ComputedFrame {
    Frame frame;
    PipelineResult result;
    Table catalog;
    std::optional<Table> targets;
    ReduceSummary summary; // everything but the outputs; seconds: read + compute
};
ComputedFrame computeFramePhase(LoadedFrame&& loaded, const ReduceOptions& options, RunContext& ctx);

// computeFramePhase in two steps, finishFramePhase(startFramePhase(...)), the same bytes: the start runs the
// stages up to the apertures with `ctx`; what is left (the calibration's end, the catalog table and the
// report) needs the host only when the calibration runs beside the device stages and no --targets are
// measured. Then it is left to finishFramePhase, which may run on another thread while `ctx` takes the
// next frame; otherwise the start does it with `ctx` and the finish only hands the frame on.
struct FrameInFlight {
    ComputedFrame out;      // at a fixed address: the calibration's thread reads its frame and detections
    ReferenceCatalog moved; // the reference at the frame's epoch when the catalog has proper motions
    const ReferenceCatalog* reference = nullptr;
    PrepareResult prepared;
    PendingCalibration calibration;
    RunContext host; // the run's settings and stage records without its device state: the finish's context
    bool finished = false;
    double seconds = 0.0; // read and start
};
std::unique_ptr<FrameInFlight> startFramePhase(LoadedFrame&& loaded, const ReduceOptions& options,
                                               RunContext& ctx);
ComputedFrame finishFramePhase(std::unique_ptr<FrameInFlight> frame, const ReduceOptions& options);

// 3. Write: the outputs through the atomic temporary+rename path, the report last (nothing when
//    options.write is false). Host and file system only: safe on another thread. Returns the summary with
//    the output paths and the total seconds of the three phases.
ReduceSummary writeFramePhase(ComputedFrame&& computed, const ReduceOptions& options);

} // namespace gpuphot
