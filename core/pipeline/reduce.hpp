#pragma once
// One frame end to end: read, check, run the stages, assemble the catalog and report, write the
// outputs. The CLI's reduce and bench, the batch worker and the tests all call this.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/target_list.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/stages/forced_photometry.hpp"

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
ReduceSummary reduceFrame(const std::string& path, const ReduceOptions& options, RunContext& ctx);

} // namespace gpuphot
