// libFuzzer target: what a SExtractor user brings: the .sex configuration (read and applied onto the
// default pipeline configuration, as `reduce --sex` does), the .param list of output parameters and the
// .conv filter. The first byte picks which; the rest is the file.
#include <cstdint>
#include <string>

#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/sextractor_catalog.hpp"
#include "core/pipeline/sextractor_config.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: {
        const std::string path = fuzz::writeScratch(data + 1, size - 1, ".sex");
        fuzz::expectTypedErrorsOnly([&] {
            const SextractorSettings s = readSextractorSettings(path);
            PipelineConfig config;
            const SextractorMapping m = applySextractorSettings(s, config);
            (void)m.warning();
        });
        break;
    }
    case 1: {
        const std::string path = fuzz::writeScratch(data + 1, size - 1, ".param");
        fuzz::expectTypedErrorsOnly([&] { (void)readSextractorParams(path); });
        const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
        fuzz::expectTypedErrorsOnly([&] { (void)parseSextractorParams(text, "fuzz input"); });
        break;
    }
    default: {
        const std::string path = fuzz::writeScratch(data + 1, size - 1, ".conv");
        fuzz::expectTypedErrorsOnly([&] {
            const ConvFilter f = readConvFilter(path);
            volatile float sink = 0;
            for (float v : f.kernel)
                sink = sink + v;
            (void)sink;
        });
    }
    }
    return 0;
}
