// The aperture stage's parameters (docs/CONFIG.md "aperture"; core/pipeline/param_table.hpp says what a table
// holds).
#include "core/stages/aperture/aperture.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
NLOHMANN_JSON_SERIALIZE_ENUM(SkyEstimator, {{SkyEstimator::Mean, "mean"},
                                            {SkyEstimator::Median, "median"},
                                            {SkyEstimator::Mode, "mode"}})
NLOHMANN_JSON_SERIALIZE_ENUM(NeighbourPixels, {{NeighbourPixels::Sum, "sum"},
                                               {NeighbourPixels::None, "none"},
                                               {NeighbourPixels::Blank, "blank"},
                                               {NeighbourPixels::Correct, "correct"}})

namespace {
#define F(member) params::field(&P::member, #member)

} // namespace

namespace params {
std::vector<ParamDef> aperture() {
    using P = ApertureParams;
    std::vector<ParamDef> v{
        F(radii).flag("--aper").lbl("Radii").doc(
            "Aperture RADII in px, or FWHM multiples (SExtractor's PHOT_APERTURES are diameters)"),
        F(radiiInFwhm).lbl("Radii in FWHM").doc("Radii are multiples of the PSF FWHM"),
        F(useLocalSky)
            .lbl("Local sky")
            .doc("Local sky from an annulus (off: the background map)")
            .sex("BACKPHOTO_TYPE LOCAL"),
        F(annulusInner)
            .lbl("Annulus inner")
            .doc("Sky annulus inner radius (px or FWHM)")
            .range(0, 1000)
            .ui(0.5, 2),
        F(annulusOuter)
            .lbl("Annulus outer")
            .doc("Sky annulus outer radius (px or FWHM)")
            .sex("BACKPHOTO_THICK")
            .range(0, 1000)
            .ui(0.5, 2),
        F(annulusInFwhm).lbl("Annulus in FWHM").doc("Annulus radii are FWHM multiples"),
        F(skyEstimator)
            .lbl("Sky estimator")
            .doc("Sigma-clipped estimator of the annulus")
            .oneOf({{"mean", "mean"}, {"median", "median"}, {"mode", "mode (SExtractor)"}}),
        F(skyClipSigma).lbl("Sky clip σ").doc("Sigma clip of the annulus values").range(0.5, 20).ui(0.1, 2),
        F(skyClipIterations)
            .lbl("Sky clip iterations")
            .doc("Clipping iterations of the annulus values")
            .range(0, 100),
        F(minSkyPixels)
            .lbl("Min. sky pixels")
            .in("px")
            .doc("Fewer annulus pixels: the map is used and sky_failed flagged")
            .range(1, 100000),
        F(kronFactor)
            .lbl("Kron factor")
            .doc("Kron aperture: this many Kron radii")
            .sex("PHOT_AUTOPARAMS k")
            .range(0.5, 10)
            .ui(0.1, 2),
        F(kronMinRadius)
            .lbl("Kron min. radius")
            .doc("Smallest Kron aperture (units of a, b)")
            .sex("PHOT_AUTOPARAMS min radius")
            .range(0.1, 50)
            .ui(0.1, 2),
        F(kronMaxRadius)
            .lbl("Kron max. radius")
            .doc("Maximum Kron radius (units of a, b)")
            .range(0.1, 100)
            .ui(0.5, 2),
        F(kronPixelCentres)
            .lbl("Kron pixel centres")
            .doc("FLUX_AUTO sums the pixels whose centres lie in the Kron ellipse (SExtractor), not exact "
                 "overlaps"),
        F(centreOnBarycentre)
            .lbl("Centre on barycentre")
            .doc("Apertures centred on the isophotal barycentre (SExtractor), not the windowed centroid"),
        F(neighbourPixels)
            .lbl("Neighbour pixels")
            .doc("Other objects' pixels in the aperture and Kron sums")
            .sex("MASK_TYPE")
            .oneOf({{"sum", "summed"},
                    {"none", "none (SExtractor)"},
                    {"blank", "blanked (SExtractor)"},
                    {"correct", "mirrored (SExtractor)"}}),
        F(apertureCorrection)
            .lbl("Aperture correction")
            .doc("Curve-of-growth correction from bright isolated stars"),
        F(apCorrRefRadius)
            .lbl("Correction ref. radius")
            .in("FWHM")
            .doc("Reference radius of the curve of growth")
            .range(0.5, 50)
            .ui(0.5, 2),
        F(apCorrMaxStars)
            .lbl("Correction max. stars")
            .doc("At most this many curve-of-growth stars (brightest isolated first)")
            .range(1, 100000),
        F(apCorrMinStars)
            .lbl("Correction min. stars")
            .doc("Fewer qualifying stars: the PSF model's curve of growth is used")
            .range(1, 10000),
        F(apCorrMinSnr)
            .lbl("Correction min. S/N")
            .doc("S/N a curve-of-growth star needs")
            .range(0, 1e5)
            .ui(5, 1),
        F(apCorrClip)
            .lbl("Correction clip σ")
            .doc("Sigma clip of the stars' curves of growth")
            .range(0.5, 20)
            .ui(0.1, 2),
        F(apCorrIsolation)
            .lbl("Correction isolation")
            .doc("Neighbours' light in a correction star's reference aperture at most this fraction (0: off)")
            .range(0, 1)
            .ui(0.001, 4),
        F(apCorrModelErr)
            .lbl("Model curve error")
            .in("mag")
            .doc("Error of a curve of growth taken from the PSF model")
            .range(0, 1)
            .ui(0.001, 4),
        F(optimal).lbl("Optimal aperture").doc("S/N-optimal aperture per source (flux_opt)"),
        F(optimalMinRadius)
            .lbl("Optimal min. radius")
            .in("FWHM")
            .doc("Smallest S/N-optimal radius")
            .range(0.05, 10)
            .ui(0.05, 2),
        F(cogStep)
            .lbl("Curve-of-growth step")
            .in("FWHM")
            .doc("Radius step of the curves of growth")
            .range(0.001, 1)
            .ui(0.01, 3),
        F(saturation).fromFrame().nonFiniteAs(NonFinite::InfAsNull).doc("Saturation level (ADU; null: none)"),
        params::internalField(&P::psfApertureFractions, "psfApertureFractions"),
        params::internalField(&P::psfApertureFractionsSource, "psfApertureFractionsSource"),
        params::internalField(&P::cogStarScale, "cogStarScale"),
        params::internalField(&P::givenCurve, "givenCurve"),
    };
    return v;
}
} // namespace params

const std::vector<ParamDef>& apertureParamTable() {
    static const std::vector<ParamDef> table = params::aperture();
    return table;
}

void to_json(nlohmann::json& j, const ApertureParams& p) {
    j = params::structToJson(p, apertureParamTable());
}
void from_json(const nlohmann::json& j, ApertureParams& p) {
    params::structFromJson(j, p, apertureParamTable(), "aperture");
}
#undef F

} // namespace gpuphot
