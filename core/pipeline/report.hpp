#pragma once
// The machine-readable JSON report of one reduction: timings and memory per stage, counts, FWHM,
// background, aperture corrections, warnings, outputs and the full configuration.
#include <nlohmann/json.hpp>

namespace gpuphot {

struct Frame;
struct PipelineConfig;
struct PipelineResult;
class RunContext;

nlohmann::json buildReport(const Frame& frame, const PipelineResult& result, const PipelineConfig& config,
                           const RunContext& ctx);

} // namespace gpuphot
