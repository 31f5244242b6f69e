// The prepare stage's parameters (docs/CONFIG.md "prepare"; core/pipeline/param_table.hpp says what a table
// holds).
#include "core/stages/prepare/prepare.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
namespace {
#define F(member) params::field(&P::member, #member)

std::vector<ParamDef> cosmicTable() {
    using P = CosmicRayParams;
    return {
        F(sigclip)
            .lbl("CR σ clip")
            .in("σ")
            .doc("Laplacian-to-noise limit for cosmic-ray pixels")
            .sex("astroscrappy sigclip")
            .range(0.5, 100)
            .ui(0.1, 2),
        F(sigfrac)
            .lbl("CR σ fraction")
            .doc("Fraction of the σ clip for neighbouring pixels")
            .sex("astroscrappy sigfrac")
            .range(0.01, 1)
            .ui(0.05, 2),
        F(objlim)
            .lbl("CR object limit")
            .doc("Minimum contrast of Laplacian to fine structure; raise it when star cores are flagged")
            .sex("astroscrappy objlim")
            .range(0.1, 100)
            .ui(0.5, 2),
        F(gain).advanced().doc("Gain (e-/ADU; 0: the frame's)").sex("astroscrappy gain"),
        F(readnoise).advanced().doc("Read noise (e-; -1: the frame's)").sex("astroscrappy readnoise"),
        F(satlevel).advanced().doc("Saturation (ADU; 0: the frame's)").sex("astroscrappy satlevel"),
        F(pedestal).advanced().doc("Level added before the noise model (ADU)"),
        F(clean).advanced().doc(
            "Replace the cosmic-ray pixels by the local median (the mask is set either way)"),
        F(niter)
            .lbl("CR iterations")
            .doc("Maximum L.A.Cosmic iterations")
            .sex("astroscrappy niter")
            .range(1, 20),
    };
}

std::vector<ParamDef> saltPepperTable() {
    using P = SaltPepperParams;
    return {
        F(highSigma)
            .advanced()
            .doc("Pixels this many MAD sigmas above the local median are bad")
            .range(0, kNoLimit),
        F(lowSigma)
            .advanced()
            .doc("Pixels this many MAD sigmas below the local median are bad")
            .range(0, kNoLimit),
        F(window).advanced().doc("Side of the median window (px, odd)").range(1, 99),
    };
}

std::vector<ParamDef> bayerTable() {
    using P = BayerParams;
    return {
        F(output)
            .advanced()
            .doc("The reduction's output when prepare.bayer is set")
            .oneOf({{"lum", "luminance"}, {"r", "red"}, {"g", "green"}, {"b", "blue"}}),
        F(luminanceMean).advanced().doc("Luminance as the mean of the four pixels (off: their sum)"),
        F(pattern).advanced().doc("CFA pattern (RGGB, BGGR, GRBG, GBRG; empty: the header's BAYERPAT)"),
        F(rowOrder).advanced().doc(
            "Row order of the pattern: \"top-down\", \"bottom-up\" or \"auto\" (the header's ROWORDER)"),
        F(xOffset).advanced().doc("Pattern x offset (px; negative: the header's XBAYROFF)"),
        F(yOffset).advanced().doc("Pattern y offset (px; negative: the header's YBAYROFF)"),
    };
}

} // namespace

namespace params {
std::vector<ParamDef> prepare() {
    using P = PrepareParams;
    std::vector<ParamDef> v{
        F(overscan)
            .lbl("Overscan")
            .doc("Subtract the median of the overscan (BIASSEC) when the header has one"),
        F(overscanMethod)
            .lbl("Overscan method")
            .doc("One level for the frame, or the median of each overscan row")
            .oneOf({{"median", "median"}, {"row", "per row"}}),
        F(trim).lbl("Trim").doc("Cut the frame to TRIMSEC (else DATASEC); CRPIX1/2 shift with it"),
        F(bleedTrails)
            .lbl("Bleed trails")
            .doc("Mask runs of pixels above the bleed fraction of SATURATE along a column touching a "
                 "saturated pixel"),
        F(bleedFraction)
            .lbl("Bleed fraction")
            .doc("Fraction of SATURATE that continues a bleed trail")
            .range(0.01, 1)
            .ui(0.05, 2),
        F(bleedGrow)
            .lbl("Bleed growth")
            .in("px")
            .doc("Saturated pixels and trails grown along the column")
            .range(0, 1000),
        F(minFlat)
            .lbl("Min. flat")
            .doc("Master-flat values at or below this (or NaN) are masked as bad, not divided")
            .range(0, 1)
            .ui(0.01, 3),
        F(autoBadPixels)
            .advanced()
            .doc("Mask hot pixels of the master dark and dead or over-responsive pixels of the master flat"),
        F(hotSigma)
            .advanced()
            .doc("Hot pixels: above the dark's median by this many robust sigmas (1.4826 MAD)")
            .range(0, kNoLimit),
        F(flatLow).advanced().doc("Dead pixels: flat below this fraction of its median").range(0, kNoLimit),
        F(flatHigh)
            .advanced()
            .doc("Over-responsive pixels: flat above this fraction of its median")
            .range(0, kNoLimit),
        F(saltPepper)
            .flag("--salt-pepper")
            .lbl("Salt-and-pepper filter")
            .doc("Mask pixels far above/below the local median as bad"),
        F(cosmics)
            .flag("--cosmics")
            .lbl("Cosmic rays")
            .doc("L.A.Cosmic; found pixels get the cosmic-ray mask bit"),
        F(bayer)
            .flag("--bayer")
            .lbl("Bayer (CFA)")
            .doc("Colour-filter-array frames: 2x2 super-pixel luminance or one colour")
            .oneOf({{"none", "none"}, {"lum", "luminance"}, {"r", "red"}, {"g", "green"}, {"b", "blue"}}),
        F(weightType)
            .flag("--weight-type")
            .lbl("Weight map type")
            .doc("How to read the weight map (--weight): RMS, variance or weight per pixel")
            .sex("WEIGHT_TYPE")
            .oneOf({{"none", "none"}, {"map_rms", "RMS"}, {"map_var", "variance"}, {"map_weight", "weight"}}),
        F(weightThreshold)
            .lbl("Weight threshold")
            .doc("map_weight: weights at or below this are unusable; map_rms/map_var: values at or above "
                 "(0: no limit)")
            .sex("WEIGHT_THRESH")
            .range(0, kNoLimit)
            .ui(0.1, 3),
        F(rescaleWeights)
            .lbl("Rescale weights")
            .doc("Scale a variance or weight map to the measured background noise")
            .sex("RESCALE_WEIGHTS"),
    };
    params::append(v, params::nest(&P::saltPepperParams, "saltPepperParams", saltPepperTable()));
    params::append(v, params::nest(&P::cosmic, "cosmic", cosmicTable()));
    params::append(v, params::nest(&P::bayerParams, "bayerParams", bayerTable()));
    return v;
}
} // namespace params

const std::vector<ParamDef>& prepareParamTable() {
    static const std::vector<ParamDef> table = params::prepare();
    return table;
}

void to_json(nlohmann::json& j, const PrepareParams& p) {
    j = params::structToJson(p, prepareParamTable());
}
void from_json(const nlohmann::json& j, PrepareParams& p) {
    params::structFromJson(j, p, prepareParamTable(), "prepare");
}
#undef F

} // namespace gpuphot
