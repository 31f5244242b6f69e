#include "core/pipeline/pipeline_config.hpp"

#include <fstream>
#include <sstream>

#include "core/pipeline/param_table.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

// Through the parameter table (core/pipeline/param_table.hpp): every key declared once, in its stage's
// folder.
void to_json(nlohmann::json& j, const PipelineConfig& c) {
    j = paramsToJson(c);
}

void from_json(const nlohmann::json& j, PipelineConfig& c) {
    paramsFromJson(j, c);
}

void applyPipelineConfig(PipelineConfig& config, const nlohmann::json& j, const std::string& what) {
    if (!j.is_object()) throw InvalidInput(what + ": the configuration must be a JSON object");
    PipelineConfig next = config; // nothing changes unless all of it is valid
    try {
        paramsFromJson(j, next);
    } catch (const InvalidInput& e) {
        throw InvalidInput(what + ": " + e.what());
    }
    config = std::move(next);
}

PipelineConfig loadPipelineConfig(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw IoError(path + ": cannot open the configuration file");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in, nullptr, true, /*ignore_comments=*/true);
    } catch (const nlohmann::json::exception& e) {
        // parse_error, and out_of_range for a number beyond double's range (found by tests/fuzz/fuzz_config)
        throw InvalidInput(path + ": not valid JSON: " + e.what());
    }
    PipelineConfig c;
    applyPipelineConfig(c, j, path);
    return c;
}

} // namespace gpuphot
