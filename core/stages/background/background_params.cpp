// The background stage's parameters (docs/CONFIG.md "background"; core/pipeline/param_table.hpp says what a
// table holds).
#include "core/stages/background/background.hpp"

#include "core/pipeline/param_table.hpp"

namespace gpuphot {
namespace {
#define F(member) params::field(&P::member, #member)

} // namespace

namespace params {
std::vector<ParamDef> background() {
    using P = BackgroundParams;
    std::vector<ParamDef> v{
        F(meshSize)
            .lbl("Mesh width")
            .in("px")
            .doc("Background mesh width")
            .sex("BACK_SIZE, sep bw")
            .range(4, 4096),
        F(meshHeight)
            .lbl("Mesh height")
            .in("px")
            .doc("Mesh height; 0: same as the width")
            .sex("sep bh")
            .range(0, 4096),
        F(filterSize)
            .lbl("Filter width")
            .in("meshes")
            .doc("Median filter of the mesh grid")
            .sex("BACK_FILTERSIZE, sep fw")
            .range(1, 15),
        F(filterHeight)
            .lbl("Filter height")
            .in("meshes")
            .doc("0: same as the width")
            .sex("sep fh")
            .range(0, 15),
        F(filterThreshold)
            .lbl("Filter threshold")
            .in("ADU")
            .doc("Replace a mesh by its filtered value only above this difference")
            .sex("BACK_FILTERTHRESH, sep fthresh")
            .range(0, kNoLimit)
            .ui(1, 2),
        F(minGoodFraction)
            .lbl("Min. good fraction")
            .doc("Fraction of valid pixels a mesh needs; others are filled from neighbours")
            .range(0, 1)
            .ui(0.05, 2),
        F(fullMaps)
            .lbl("Full-resolution maps")
            .doc("Build full-resolution level/rms maps (off: mesh grids only)"),
        F(sextractorSpline)
            .lbl("SExtractor spline")
            .doc("Reproduce sep/SExtractor's interpolation quirks bit for bit (default: exact natural "
                 "splines)"),
        F(uniformRms)
            .lbl("Uniform RMS")
            .doc("One RMS for the frame, the median of the mesh RMS grid: thresholds and errors against it")
            .sex("WEIGHT_TYPE NONE"),
        F(manualLevel)
            .lbl("Manual level")
            .in("ADU")
            .doc("A constant background level instead of the measured one (the RMS is still measured)")
            .sex("BACK_TYPE MANUAL, BACK_VALUE")
            .range(-1e12, 1e12)
            .ui(1, 2)
            .none("measured"),
    };
    return v;
}
} // namespace params

const std::vector<ParamDef>& backgroundParamTable() {
    static const std::vector<ParamDef> table = params::background();
    return table;
}

void to_json(nlohmann::json& j, const BackgroundParams& p) {
    j = params::structToJson(p, backgroundParamTable());
}
void from_json(const nlohmann::json& j, BackgroundParams& p) {
    params::structFromJson(j, p, backgroundParamTable(), "background");
}
#undef F

} // namespace gpuphot
