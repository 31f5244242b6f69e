// The zeropoint stage's parameters (docs/CONFIG.md "zeropoint"; core/pipeline/param_table.hpp says what a
// table holds).
#include "core/stages/zeropoint/zeropoint.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
namespace {
#define F(member) params::field(&P::member, #member)

} // namespace

namespace params {
std::vector<ParamDef> zeropoint() {
    using P = ZeroPointParams;
    std::vector<ParamDef> v{
        F(magBright)
            .nonFiniteAs(NonFinite::InfAsString)
            .lbl("Calibrator mag bright")
            .in("mag")
            .doc("Reference magnitude range of calibrators (bright end)")
            .range(-5, 40)
            .ui(0.1, 2)
            .none("none", "-inf"),
        F(magFaint)
            .nonFiniteAs(NonFinite::InfAsString)
            .lbl("Calibrator mag faint")
            .in("mag")
            .doc("Reference magnitude range of calibrators (faint end)")
            .range(-5, 40)
            .ui(0.1, 2)
            .none("none", "inf"),
        F(minSnr).lbl("Calibrator min. S/N").doc("S/N of the instrumental magnitude").range(0, 1e5).ui(1, 1),
        F(predictedSnr)
            .lbl("S/N from reference")
            .doc("The S/N cut and the weights use the flux the reference magnitude predicts, not the "
                 "measured one (whose noise would favour stars that scattered bright)"),
        F(excludeFlags)
            .lbl("Exclude flags")
            .doc("Calibrators must have none of these flag bits.")
            .flags()
            .range(0, 65535),
        F(isolationFwhm)
            .lbl("Isolation (FWHM)")
            .in("FWHM")
            .doc("Drop calibrators with a brighter reference star within this many FWHM (0: off, unless the "
                 "radius is given in arcsec)")
            .range(0, 100)
            .ui(0.5, 2),
        F(isolationArcsec)
            .lbl("Isolation (arcsec)")
            .in("arcsec")
            .doc("> 0: the isolation radius in arcsec, instead of in FWHM")
            .range(0, 3600)
            .ui(0.5, 2),
        F(isolationDeltaMag)
            .lbl("Isolation Δmag")
            .in("mag")
            .doc("Neighbours brighter than own mag + this count")
            .range(0, 20)
            .ui(0.1, 2),
        F(method)
            .lbl("Method")
            .doc("Zero-point estimator")
            .oneOf({{"clipped-mean", "clipped mean"}, {"ransac", "RANSAC"}}),
        F(clipSigma).lbl("Clip σ").doc("Sigma clip of the calibrators").range(0.5, 20).ui(0.1, 2),
        F(maxIterations).lbl("Clip iterations").doc("Clipping iterations").range(1, 1000),
        F(fitColourTerm).lbl("Colour term").doc("Fit a colour term (needs the reference colour)"),
        F(colourTermMinSignificance)
            .lbl("Colour term min. significance")
            .in("σ")
            .doc("The colour term is dropped when under this many standard errors")
            .range(0, 1000)
            .ui(0.5, 1),
        F(seed).lbl("RANSAC seed").doc("Seed of the RANSAC draws and of the bootstrap").range(0, 2147483647),
        F(ransacIterations).lbl("RANSAC iterations").doc("RANSAC draws").range(1, 1000000),
        F(ransacThreshold)
            .lbl("RANSAC threshold")
            .in("mag")
            .doc("Inlier residual")
            .range(0.001, 5)
            .ui(0.01, 3),
        F(minStars)
            .lbl("Min. calibrators")
            .doc("Fewer calibrators after clipping: no zero point")
            .range(1, 100000),
        F(magSource)
            .lbl("Calibrated magnitudes")
            .doc("Which instrumental magnitudes are calibrated (auto: the one with the smaller zero-point "
                 "error)")
            .oneOf({{"auto", "auto"}, {"aperture", "aperture"}, {"psf", "PSF fit"}}),
        F(matchSigma)
            .lbl("Matches above chance")
            .in("σ")
            .doc("Matches must exceed chance by this many sigmas (0: off)")
            .range(0, 1000)
            .ui(1, 1),
        F(bootstrap).lbl("Bootstrap resamples").doc("0: the formal error alone").range(0, 100000),
        F(maxZpErr)
            .lbl("Max. zero-point error")
            .in("mag")
            .doc("A less certain zero point is not reported (0: no limit)")
            .range(0, 10)
            .ui(0.01, 3),
    };
    return v;
}
} // namespace params

const std::vector<ParamDef>& zeropointParamTable() {
    static const std::vector<ParamDef> table = params::zeropoint();
    return table;
}

void to_json(nlohmann::json& j, const ZeroPointParams& p) {
    j = params::structToJson(p, zeropointParamTable());
}
void from_json(const nlohmann::json& j, ZeroPointParams& p) {
    params::structFromJson(j, p, zeropointParamTable(), "zeropoint");
}
#undef F

} // namespace gpuphot
