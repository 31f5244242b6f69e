#pragma once
// One frame end to end: read, check, run the stages, assemble the catalog and report, write the
// outputs. The CLI's reduce and bench, the batch worker and the tests all call this.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/io/fits_image.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/pipeline_config.hpp"

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

// Throws InvalidInput / IoError naming the file; on error nothing is written.
ReduceSummary reduceFrame(const std::string& path, const ReduceOptions& options, RunContext& ctx);

} // namespace gpuphot
