// The psf stage's parameters (docs/CONFIG.md "psf"; core/pipeline/param_table.hpp says what a table holds).
#include "core/stages/psf/psf.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
namespace {
#define F(member) params::field(&P::member, #member)

} // namespace

namespace params {
std::vector<ParamDef> psf() {
    using P = PsfParams;
    std::vector<ParamDef> v{
        F(model)
            .lbl("Model")
            .doc("Analytic profile fitted to each PSF star")
            .oneOf({{"moffat", "Moffat"}, {"gaussian", "Gaussian"}}),
        F(moffatBeta).lbl("Moffat β").doc("Moffat beta start value").range(0.5, 30).ui(0.1, 2),
        F(fitBeta).lbl("Fit β").doc("Moffat beta free (off: fixed)"),
        F(betaMin).lbl("β min").doc("Lower bound of the fitted beta").range(0.5, 30).ui(0.1, 2),
        F(betaMax).lbl("β max").doc("Upper bound of the fitted beta").range(0.5, 100).ui(0.5, 2),
        F(pixelIntegration)
            .lbl("Pixel integration")
            .in("nodes")
            .doc("Gauss-Legendre nodes per axis over a pixel (1: point samples)")
            .range(1, 10),
        F(stampRadius)
            .lbl("Stamp radius")
            .in("px")
            .doc("Fit stamp half-size (0: 4 x FWHM guess)")
            .range(0, 200),
        F(minSnr).lbl("Star min. S/N").doc("PSF star selection: minimum S/N").range(0, 1e5).ui(5, 1),
        F(maxPeakFraction)
            .lbl("Max. peak fraction")
            .doc("PSF stars peak below this fraction of saturation")
            .range(0, 1)
            .ui(0.05, 2),
        F(isolationRadius)
            .lbl("Isolation radius")
            .in("px")
            .doc("No other source this close (0: automatic)")
            .range(0, 500)
            .ui(1, 1),
        F(excludeFlags)
            .lbl("Exclude flags")
            .doc("PSF stars must have none of these flag bits.")
            .flags()
            .range(0, 65535),
        F(maxStars).lbl("Max. stars").doc("At most this many PSF stars (brightest first)").range(1, 100000),
        F(maxMaskedFraction)
            .lbl("Max. masked fraction")
            .doc("PSF star stamps with more masked pixels are skipped")
            .range(0, 1)
            .ui(0.01, 2),
        F(maxIterations).lbl("LM iterations").doc("Levenberg-Marquardt iterations per star").range(1, 10000),
        F(maxStarsPerCell)
            .lbl("Stars per ePSF cell")
            .doc("Most candidate stars fitted per ePSF grid cell, brightest first (0: no limit)")
            .range(0, 100000),
        F(clipSigma).lbl("Clip σ").doc("Outlier clipping of the fitted shapes").range(0.5, 20).ui(0.1, 2),
        F(clipIterations)
            .lbl("Clip iterations")
            .doc("Clipping iterations of the fitted shapes")
            .range(0, 100),
        F(polyOrder)
            .lbl("Spatial order")
            .doc("Polynomial order of FWHM, e1, e2 across the field (lowered when stars are few)")
            .range(0, 6),
        F(minStarsPerTerm).lbl("Stars per term").doc("Minimum stars per polynomial term").range(1, 100),
        F(epsfOversampling).lbl("ePSF oversampling").doc("Empirical PSF nodes per pixel").range(1, 10),
        F(gridNx).lbl("ePSF cells x").doc("Empirical PSF cells across the frame").range(1, 20),
        F(gridNy).lbl("ePSF cells y").doc("Empirical PSF cells down the frame").range(1, 20),
        F(epsfMinStars).lbl("ePSF min. stars").doc("Stars an ePSF cell needs").range(1, 1000),
        F(psfPhotometry).lbl("PSF photometry").doc("PSF-fit flux (flux_psf) with the ePSF"),
        F(psfFitRadius).lbl("PSF fit radius").in("px").doc("0: automatic").range(0, 100).ui(0.5, 2),
        F(psfFitBackground).lbl("Fit background").doc("Fit a constant background with the PSF flux"),
        F(maxMaskedPsfWeight)
            .lbl("Max. masked PSF weight")
            .doc("PSF fit fails above this masked share of the PSF")
            .range(0, 1)
            .ui(0.01, 2),
        F(saturation).fromFrame().doc("Saturation level (ADU; 0: none)"),
    };
    return v;
}
} // namespace params

const std::vector<ParamDef>& psfParamTable() {
    static const std::vector<ParamDef> table = params::psf();
    return table;
}

void to_json(nlohmann::json& j, const PsfParams& p) {
    j = params::structToJson(p, psfParamTable());
}
void from_json(const nlohmann::json& j, PsfParams& p) {
    params::structFromJson(j, p, psfParamTable(), "psf");
}
#undef F

} // namespace gpuphot
