// libFuzzer target: the --config JSON loader (every stage's Params, unknown keys and wrong types must be
// typed InvalidInput) and the round trip through to_json.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/pipeline/pipeline_config.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    // Through the file loader (as `--config FILE` does) ...
    const std::string path = fuzz::writeScratch(data, size, ".json");
    fuzz::expectTypedErrorsOnly([&] {
        const PipelineConfig c = loadPipelineConfig(path);
        nlohmann::json j = c;
        PipelineConfig back;
        applyPipelineConfig(back, j, "round trip");
        (void)j.dump();
    });
    // ... and onto a default config directly.
    const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
    if (j.is_discarded()) return 0;
    fuzz::expectTypedErrorsOnly([&] {
        PipelineConfig c;
        applyPipelineConfig(c, j, "fuzz input");
    });
    return 0;
}
