#pragma once
// SExtractor configuration files (.sex) and convolution filters (.conv) read onto a PipelineConfig, so that
// SExtractor users can bring the settings they have tuned. docs/SEXTRACTOR.md lists the keys, how each
// maps, and where the semantics still differ.

#include <string>
#include <utility>
#include <vector>

#include "core/pipeline/sextractor_catalog.hpp"

namespace gpuphot {

struct PipelineConfig;

// The KEY value lines of a .sex file in file order ('#' starts a comment; the value is the rest of the line,
// trimmed), then the command-line overrides (SExtractor's `-KEY value`), which win.
struct SextractorSettings {
    std::string path; // the file ("" for overrides only); FILTER_NAME is looked up beside it
    std::vector<std::pair<std::string, std::string>> entries;
    // The last value of `key` ("" when absent).
    const std::string* find(const std::string& key) const;
};

// Throws InvalidInput naming the file for an unreadable file or a line that is not "KEY [value]"
// (keys are upper case, digits and '_').
SextractorSettings readSextractorSettings(const std::string& path);
// Appends an override; throws InvalidInput for a key that is not upper case.
void addSextractorOverride(SextractorSettings& s, const std::string& key, const std::string& value);

// A .conv filter: "CONV NORM" or "CONV NONORM", then rows of numbers ('#' comments).
struct ConvFilter {
    std::vector<float> kernel; // row-major
    int width = 0, height = 0;
    bool normalise = true; // CONV NORM
};
ConvFilter readConvFilter(const std::string& path); // throws InvalidInput naming the file

// What applying the settings did.
struct SextractorMapping {
    std::vector<std::string> applied;     // "KEY value -> our.key = ..." for each key that was mapped
    std::vector<std::string> unsupported; // "KEY value" for each key that changes nothing here
    std::vector<std::string> differences; // where the mapping is not SExtractor's semantics exactly
    // The SExtractor catalog: CATALOG_NAME, CATALOG_TYPE, PARAMETERS_NAME's parameters, MAG_ZEROPOINT,
    // PHOT_FLUXFRAC. writesCatalog is false for CATALOG_TYPE NONE, for a PARAMETERS_NAME that is not
    // found (as given or beside the file) and for one that lists no parameter.
    SextractorCatalogOptions catalog;
    bool writesCatalog = false;
    std::string
        weightImage; // WEIGHT_IMAGE with WEIGHT_TYPE MAP_* (found as given or beside the file), else ""
    // The one warning a front end prints: the unsupported keys and the differences ("" when none).
    std::string warning() const;
};

// Applies the settings onto `config` (the keys docs/SEXTRACTOR.md maps; the others are listed in
// `unsupported`). Throws InvalidInput for a value that cannot be read (naming KEY and the file).
SextractorMapping applySextractorSettings(const SextractorSettings& s, PipelineConfig& config);

} // namespace gpuphot
