// The crossmatch stage's parameters (docs/CONFIG.md "crossmatch"; core/pipeline/param_table.hpp says what a
// table holds).
#include "core/stages/crossmatch/crossmatch.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
namespace {
#define F(member) params::field(&P::member, #member)

} // namespace

namespace params {
std::vector<ParamDef> crossmatch() {
    using P = CrossmatchParams;
    std::vector<ParamDef> v{
        F(radiusArcsec)
            .lbl("Match radius")
            .in("arcsec")
            .doc("Match radius (great-circle separation)")
            .sex("CROSSID_RADIUS")
            .range(0.01, 3600)
            .ui(0.1, 2),
        F(oneToOne).lbl("One to one").doc("Each reference star matches at most one source (closest wins)"),
        F(refMagBright)
            .nonFiniteAs(NonFinite::Omitted)
            .lbl("Ref. mag bright")
            .in("mag")
            .doc("Brightest reference magnitude used for matching")
            .range(-5, 40)
            .ui(0.1, 2)
            .none("none"),
        F(refMagFaint)
            .nonFiniteAs(NonFinite::Omitted)
            .lbl("Ref. mag faint")
            .in("mag")
            .doc("Faintest reference magnitude used for matching")
            .range(-5, 40)
            .ui(0.1, 2)
            .none("none"),
        F(marginPx)
            .lbl("Margin")
            .in("px")
            .doc("Reference stars projected this far outside the frame are kept")
            .range(0, 10000)
            .ui(1, 1),
        F(index)
            .lbl("Search index")
            .doc("Spatial index of the candidate search (same matches either way; auto = grid, the faster)")
            .oneOf({{"auto", "auto"}, {"grid", "grid"}, {"kdtree", "k-d tree"}}),
    };
    return v;
}
} // namespace params

const std::vector<ParamDef>& crossmatchParamTable() {
    static const std::vector<ParamDef> table = params::crossmatch();
    return table;
}

void to_json(nlohmann::json& j, const CrossmatchParams& p) {
    j = params::structToJson(p, crossmatchParamTable());
}
void from_json(const nlohmann::json& j, CrossmatchParams& p) {
    params::structFromJson(j, p, crossmatchParamTable(), "crossmatch");
}
#undef F

} // namespace gpuphot
