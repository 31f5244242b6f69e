#include "core/pipeline/pipeline_config.hpp"

#include <fstream>
#include <sstream>

#include "core/util/errors.hpp"

namespace gpuphot {

void to_json(nlohmann::json& j, const PipelineConfig& c) {
    j = nlohmann::json{{"background", c.background},
                       {"backgroundSecondPass", c.backgroundSecondPass},
                       {"secondPassDilate", c.secondPassDilate},
                       {"detection", c.detection},
                       {"psf", c.psf},
                       {"aperture", c.aperture},
                       {"crossmatch", c.crossmatch},
                       {"zeropoint", c.zeropoint},
                       {"fitAstrometry", c.fitAstrometry},
                       {"astrometry", c.astrometry},
                       {"apertureToTotal", c.apertureToTotal},
                       {"defaultFwhm", c.defaultFwhm},
                       {"keywords", c.keywords},
                       {"instrument", c.instrument},
                       {"prepare", c.prepare}};
}

void from_json(const nlohmann::json& j, PipelineConfig& c) {
    auto get = [&](const char* key, auto& field) {
        if (j.contains(key)) j.at(key).get_to(field);
    };
    get("background", c.background);
    get("backgroundSecondPass", c.backgroundSecondPass);
    get("secondPassDilate", c.secondPassDilate);
    get("detection", c.detection);
    get("psf", c.psf);
    get("aperture", c.aperture);
    get("crossmatch", c.crossmatch);
    get("zeropoint", c.zeropoint);
    get("fitAstrometry", c.fitAstrometry);
    get("astrometry", c.astrometry);
    get("apertureToTotal", c.apertureToTotal);
    get("defaultFwhm", c.defaultFwhm);
    get("keywords", c.keywords);
    get("instrument", c.instrument);
    get("prepare", c.prepare);
}

namespace {
// Every key of `given` must exist in `reference` (the serialised defaults), recursively for objects.
void checkKeys(const nlohmann::json& given, const nlohmann::json& reference, const std::string& prefix,
               const std::string& what) {
    if (!given.is_object()) return;
    for (auto it = given.begin(); it != given.end(); ++it) {
        const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
        if (!reference.is_object() || !reference.contains(it.key())) {
            // InstrumentOverrides and the crossmatch magnitude cuts serialise only the values that are set.
            if (prefix == "instrument") continue;
            if (prefix == "crossmatch" && (it.key() == "refMagBright" || it.key() == "refMagFaint")) continue;
            throw InvalidInput(what + ": unknown configuration key '" + path + "'");
        }
        checkKeys(it.value(), reference.at(it.key()), path, what);
    }
}
} // namespace

void applyPipelineConfig(PipelineConfig& config, const nlohmann::json& j, const std::string& what) {
    if (!j.is_object()) throw InvalidInput(what + ": the configuration must be a JSON object");
    checkKeys(j, nlohmann::json(PipelineConfig{}), "", what);
    try {
        nlohmann::json merged = config;
        merged.merge_patch(j);
        config = merged.get<PipelineConfig>();
    } catch (const nlohmann::json::exception& e) {
        throw InvalidInput(what + ": " + e.what());
    } catch (const InvalidInput& e) {
        throw InvalidInput(what + ": " + e.what());
    }
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
