#pragma once
// Every stage's Params in one JSON-serialisable struct: the CLI's --config file, the workbench's saved
// profiles and the report's "config" section are all this. Keys are documented in docs/CONFIG.md.
#include <string>

#include <nlohmann/json.hpp>

#include "core/model/instrument.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/astrometry/astrometry.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/prepare/prepare.hpp"
#include "core/stages/psf/psf.hpp"
#include "core/stages/zeropoint/zeropoint.hpp"

namespace gpuphot {

struct PipelineConfig {
    BackgroundParams background;
    bool backgroundSecondPass = false; // re-estimate the background with detected objects masked, detect again
    int secondPassDilate = 2;          // px, growth of the object mask for the second pass
    DetectionParams detection;
    PsfParams psf;
    ApertureParams aperture;
    CrossmatchParams crossmatch;       // stage 5 (runs when a reference catalog and a WCS are available)
    ZeroPointParams zeropoint;         // stage 6
    bool fitAstrometry = true;         // stage 7: refine (or solve) the WCS against the reference catalog
    AstrometryParams astrometry;
    // Extend the aperture correction from its reference radius to the total flux with the PSF model
    // (the light beyond the radius and in the sky annulus); false: "total" means "within the radius".
    bool apertureToTotal = true;
    double defaultFwhm = 3.0;          // px, used for FWHM-scaled apertures when no PSF model can be built
    InstrumentKeywords keywords;       // which header keywords hold gain, read noise, ...
    InstrumentOverrides instrument;    // explicit values (CLI --gain ...), win over the header
    PrepareParams prepare;             // frame preparation before stage 1 (overscan, masters, bad pixels, cosmics)
};

void to_json(nlohmann::json& j, const PipelineConfig& c);
void from_json(const nlohmann::json& j, PipelineConfig& c); // missing keys keep defaults

// Reads a config file. Unknown keys (typos) and wrong types are InvalidInput naming the file and key.
PipelineConfig loadPipelineConfig(const std::string& path);
// Applies a JSON object onto an existing config with the same checks (`what` names it in errors).
void applyPipelineConfig(PipelineConfig& config, const nlohmann::json& j, const std::string& what);

} // namespace gpuphot
