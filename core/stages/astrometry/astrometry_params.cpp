// The astrometry stage's parameters (docs/CONFIG.md "astrometry"; core/pipeline/param_table.hpp says what a
// table holds).
#include "core/stages/astrometry/astrometry.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
namespace {
#define F(member) params::field(&P::member, #member)

} // namespace

namespace params {
std::vector<ParamDef> astrometry() {
    using P = AstrometryParams;
    std::vector<ParamDef> v{
        F(blind)
            .lbl("Blind solving")
            .doc("Blind: when the header WCS is missing or fails verification")
            .oneOf({{-1, "automatic"}, {0, "never"}, {1, "always"}}),
        F(maxSipOrder).lbl("Max. SIP order").doc("Highest SIP order tried").range(1, 9),
        F(minSipOrder)
            .lbl("Min. SIP order")
            .doc("Lowest SIP order tried; <= 1 also tries pure TAN")
            .range(0, 9),
        F(minMatchesPerTerm)
            .lbl("Matches per term")
            .doc("An order is tried only with this many matches per term")
            .range(1, 100)
            .ui(0.5, 1),
        F(matchRadiusPx).lbl("Match radius").in("px").doc("Final match radius").range(0.1, 100).ui(0.1, 2),
        F(refineRadiusPx)
            .lbl("Refine radius")
            .in("px")
            .doc("First match radius when refining a header WCS")
            .range(0.1, 1000)
            .ui(1, 1),
        F(clipSigma)
            .lbl("Clip σ")
            .doc("Outlier rejection in robust sigmas per axis")
            .range(0.5, 20)
            .ui(0.1, 2),
        F(iterations).lbl("Iterations").doc("Match + fit + clip rounds").range(1, 100),
        F(scaleLow)
            .flag("--scale-low")
            .lbl("Scale low")
            .in("″/px")
            .doc("Lowest pixel scale searched (no header scale)")
            .range(0.01, 1000)
            .ui(0.1, 2),
        F(scaleHigh)
            .flag("--scale-high")
            .lbl("Scale high")
            .in("″/px")
            .doc("Highest pixel scale searched")
            .range(0.01, 1000)
            .ui(0.5, 2),
        F(headerScaleTolerance)
            .lbl("Header scale tolerance")
            .doc("Relative scale range around the header's")
            .range(0, 1)
            .ui(0.01, 3),
        F(searchRadiusDeg)
            .lbl("Search radius")
            .in("deg")
            .doc("Field centre searched within this of the pointing")
            .range(0, 180)
            .ui(0.5, 2),
        F(nBrightest).lbl("Brightest detections").doc("Used to build quads").range(4, 10000),
        F(refPerCell).lbl("Ref. stars per cell").doc("Uniformisation (16 cells per field)").range(1, 1000),
        F(maxQuadsPerStar)
            .lbl("Quads per star")
            .doc("Reference quads built on a star as first star, at most")
            .range(1, 100000),
        F(codeTolerance)
            .lbl("Code tolerance")
            .doc("Quad code distance accepted as a hit")
            .range(0.001, 1)
            .ui(0.005, 3),
        F(maxFullVerifications)
            .lbl("Max. verifications")
            .doc("At most this many candidate solutions fully verified")
            .range(1, 100000),
        F(seed).lbl("Seed").doc("Reserved for randomised steps").range(0, 2147483647),
        F(verifyMinMatches)
            .lbl("Verify min. matches")
            .doc("A solution needs this many matched stars")
            .range(1, 100000),
        F(verifyMinFraction)
            .lbl("Verify min. fraction")
            .doc("A solution needs this fraction of the detections matched")
            .range(0, 1)
            .ui(0.01, 2),
        F(verifySigma)
            .lbl("Verify σ")
            .doc("Poisson sigmas above the chance-match count")
            .range(0, 1000)
            .ui(0.5, 1),
    };
    return v;
}
} // namespace params

const std::vector<ParamDef>& astrometryParamTable() {
    static const std::vector<ParamDef> table = params::astrometry();
    return table;
}

void to_json(nlohmann::json& j, const AstrometryParams& p) {
    j = params::structToJson(p, astrometryParamTable());
}
void from_json(const nlohmann::json& j, AstrometryParams& p) {
    params::structFromJson(j, p, astrometryParamTable(), "astrometry");
}
#undef F

} // namespace gpuphot
