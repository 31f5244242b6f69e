// The top-level parameters of PipelineConfig (docs/CONFIG.md "Top level"); the stages' own tables are in
// their folders, the instrument's in core/model/instrument_params.cpp.
#include "core/pipeline/param_table.hpp"
#include "core/pipeline/pipeline_config.hpp"

namespace gpuphot::params {

std::vector<ParamDef> pipeline() {
#define F(member) params::field(&P::member, #member)
    using P = PipelineConfig;
    std::vector<ParamDef> v{
        F(backgroundSecondPass)
            .inGroup("background")
            .from(ParamStage::Background)
            .lbl("Second pass")
            .doc("Re-estimate the background with the detected objects masked, then detect again"),
        F(secondPassDilate)
            .inGroup("background")
            .from(ParamStage::Background)
            .lbl("Second-pass mask growth")
            .in("px")
            .doc("Growth of the object mask for the second pass")
            .range(0, 64),
        F(defaultFwhm)
            .inGroup("psf")
            .from(ParamStage::Psf)
            .lbl("Default FWHM")
            .in("px")
            .doc("Used to scale apertures when no PSF model could be built")
            .range(0.5, 100)
            .ui(0.1, 2),
        F(apertureToTotal)
            .inGroup("aperture")
            .from(ParamStage::Aperture)
            .lbl("Correct to total")
            .doc("Extend the aperture correction from its reference radius to the total flux with the PSF "
                 "model"),
        F(fitAstrometry)
            .inGroup("astrometry")
            .from(ParamStage::Calibration)
            .lbl("Fit astrometry")
            .doc("Refine (or solve) the WCS against the reference catalog"),
    };
#undef F
    for (ParamDef& d : nest(&P::instrument, "instrument", instrumentOverrides()))
        v.push_back(std::move(d.inGroup("instrument").from(ParamStage::Background)));
    for (ParamDef& d : nest(&P::keywords, "keywords", instrumentKeywords()))
        v.push_back(std::move(d.inGroup("keywords").from(ParamStage::Background)));
    return v;
}

} // namespace gpuphot::params
