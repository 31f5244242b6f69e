// The detection stage's parameters (docs/CONFIG.md "detection"; core/pipeline/param_table.hpp says what a
// table holds).
#include "core/stages/detection/detection.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
namespace {
#define F(member) params::field(&P::member, #member)

} // namespace

namespace params {
std::vector<ParamDef> detection() {
    using P = DetectionParams;
    std::vector<ParamDef> v{
        F(threshold)
            .flag("--threshold")
            .lbl("Threshold")
            .in("σ")
            .doc("Detection threshold in units of the local background RMS")
            .sex("DETECT_THRESH")
            .range(0.1, 1e6)
            .ui(0.1, 2),
        F(thresholdIsAbsolute).lbl("Absolute threshold").doc("Threshold in ADU").sex("THRESH_TYPE ABSOLUTE"),
        F(minArea)
            .flag("--minarea")
            .lbl("Minimum area")
            .in("px")
            .doc("Minimum object area, also of a deblended branch")
            .sex("DETECT_MINAREA")
            .range(1, 10000),
        F(filter).lbl("Matched filter").doc("Convolve with a Gaussian before thresholding").sex("FILTER"),
        F(filterFwhm)
            .lbl("Filter FWHM")
            .in("px")
            .doc("FWHM of the Gaussian matched filter")
            .sex("FILTER_NAME")
            .range(0.5, 50)
            .ui(0.1, 2),
        F(filterKernel)
            .lbl("Filter kernel")
            .doc("A supplied kernel instead (row-major, comma-separated); empty: Gaussian"),
        F(filterKernelWidth).lbl("Kernel width").in("px").doc("Width of the supplied kernel").range(0, 99),
        F(deblendLevels)
            .lbl("Deblend levels")
            .doc("Number of deblending thresholds [DEBLEND_NTHRESH]; 1 disables deblending")
            .range(1, 256),
        F(deblendContrast)
            .lbl("Deblend contrast")
            .doc("Minimum contrast of a branch")
            .sex("DEBLEND_MINCONT")
            .range(0, 1)
            .ui(0.0005, 5),
        F(deblendMaxChildren)
            .lbl("Max. branches")
            .doc("More branches in one blend: stop, flag deblend_overflow")
            .range(1, 1048576),
        F(clean).lbl("Clean").doc("Remove spurious detections in the wings of bright objects").sex("CLEAN"),
        F(cleanParam)
            .lbl("Clean parameter")
            .doc("Moffat beta of the CLEAN wing model")
            .sex("CLEAN_PARAM")
            .range(0.1, 10)
            .ui(0.1, 2),
        F(sextractorIso)
            .lbl("SExtractor isophotes")
            .doc("Barycentre and shape weighted by the filtered image, isophotal area above the threshold "
                 "in the unfiltered one (SExtractor's X_IMAGE, A_IMAGE, ISOAREA_IMAGE)")
            .sex("X_IMAGE, A_IMAGE, ISOAREA_IMAGE"),
        F(sextractorClean)
            .lbl("SExtractor CLEAN order")
            .doc(
                "CLEAN in the order a scan completes the objects, fluxes growing as they merge (SExtractor's "
                "order-dependent CLEAN); off: in order of brightness against the original wings")
            .sex("CLEAN"),
        F(windowSigmaFactor)
            .lbl("Window σ factor")
            .doc("Windowed centroid (XWIN): window sigma = factor x half-light radius")
            .range(0.1, 5)
            .ui(0.01, 4),
        F(windowMinSigma)
            .lbl("Window min. σ")
            .in("px")
            .doc("Lower bound of the window sigma")
            .range(0, 10)
            .ui(0.1, 2),
        F(windowMaxSigma)
            .lbl("Window max. σ")
            .in("px")
            .doc("Upper bound of the window sigma (0: none); bounds the cost of huge objects")
            .range(0, 1000)
            .ui(1, 1),
        F(windowMaxIterations)
            .lbl("Window iterations")
            .doc("Maximum iterations of the windowed centroid")
            .range(0, 100),
        F(windowTolerance)
            .lbl("Window tolerance")
            .in("px")
            .doc("Convergence tolerance of the windowed centroid")
            .range(0, 1)
            .ui(0.0001, 5),
        F(gain).fromFrame().doc("Gain (e-/ADU) for the flux errors"),
        F(saturationLevel)
            .fromFrame()
            .nonFiniteAs(NonFinite::Omitted)
            .doc("Saturation level (ADU; absent: none)"),
    };
    return v;
}
} // namespace params

const std::vector<ParamDef>& detectionParamTable() {
    static const std::vector<ParamDef> table = params::detection();
    return table;
}

void to_json(nlohmann::json& j, const DetectionParams& p) {
    j = params::structToJson(p, detectionParamTable());
}
void from_json(const nlohmann::json& j, DetectionParams& p) {
    params::structFromJson(j, p, detectionParamTable(), "detection");
}
#undef F

} // namespace gpuphot
