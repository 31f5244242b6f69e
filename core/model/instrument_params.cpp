// The instrument overrides and header-keyword lists as parameters (docs/CONFIG.md "instrument",
// "keywords"; core/pipeline/param_table.hpp says what a table holds).
#include "core/model/instrument.hpp"
#include "core/pipeline/param_table.hpp"

namespace gpuphot {
#define F(member) params::field(&P::member, #member)

namespace params {

std::vector<ParamDef> instrumentOverrides() {
    using P = InstrumentOverrides;
    return {
        F(gain)
            .flag("--gain")
            .lbl("Gain")
            .in("e⁻/ADU")
            .doc("Overrides the header")
            .sex("GAIN")
            .range(0, 1e4)
            .ui(0.1, 3)
            .none("header"),
        F(readNoise)
            .flag("--rdnoise")
            .lbl("Read noise")
            .in("e⁻")
            .doc("Overrides the header")
            .range(-1, 1e4)
            .ui(0.1, 2)
            .none("header"),
        F(saturation)
            .flag("--saturation")
            .lbl("Saturation")
            .in("ADU")
            .doc("Overrides the header")
            .sex("SATUR_LEVEL")
            .range(0, 1e12)
            .ui(100, 1)
            .none("header"),
        F(exptime)
            .flag("--exptime")
            .lbl("Exposure time")
            .in("s")
            .doc("Overrides the header")
            .range(-1, 1e7)
            .ui(1, 3)
            .none("header"),
        F(airmass).lbl("Airmass").doc("Overrides the header").range(0, 100).ui(0.01, 3).none("header"),
        F(filter).lbl("Filter").doc("Overrides the header"),
        F(object).lbl("Object").doc("Overrides the header"),
        F(gainIfAbsent)
            .advanced()
            .in("e⁻/ADU")
            .doc("Gain where the header has none")
            .sex("GAIN (with GAIN_KEY)")
            .range(0, 1e4)
            .none("none"),
        F(saturationIfAbsent)
            .advanced()
            .in("ADU")
            .doc("Saturation level where the header has none")
            .sex("SATUR_LEVEL (with SATUR_KEY)")
            .range(0, 1e12)
            .none("none"),
    };
}

std::vector<ParamDef> instrumentKeywords() {
    using P = InstrumentKeywords;
    const auto k = [](ParamDef d, const char* label, const std::string& what) {
        return std::move(d.lbl(label).doc("Header keywords holding " + what + ", in order of preference"));
    };
    return {
        k(F(gain), "Gain", "the gain (e-/ADU)"),
        k(F(gainPerAmp), "Gain per amplifier",
          "per-amplifier gains (their mean is used when no gain keyword is found)"),
        k(F(readNoise), "Read noise", "the read noise (e-)"),
        k(F(saturation), "Saturation", "the saturation level (ADU)"),
        k(F(exptime), "Exposure time", "the exposure time (s)"),
        k(F(filter), "Filter", "the filter"),
        k(F(dateObs), "DATE-OBS", "the start of the exposure (ISO date)"),
        k(F(mjdObs), "MJD-OBS", "the start of the exposure (MJD)"),
        k(F(airmass), "Airmass", "the airmass"),
        k(F(object), "Object", "the object's name"),
    };
}

} // namespace params

namespace {
const std::vector<ParamDef>& overridesTable() {
    static const std::vector<ParamDef> t = params::instrumentOverrides();
    return t;
}
const std::vector<ParamDef>& keywordsTable() {
    static const std::vector<ParamDef> t = params::instrumentKeywords();
    return t;
}
} // namespace

void to_json(nlohmann::json& j, const InstrumentKeywords& k) {
    j = params::structToJson(k, keywordsTable());
}
void from_json(const nlohmann::json& j, InstrumentKeywords& k) {
    params::structFromJson(j, k, keywordsTable(), "keywords");
}
void to_json(nlohmann::json& j, const InstrumentOverrides& o) {
    j = params::structToJson(o, overridesTable());
}
void from_json(const nlohmann::json& j, InstrumentOverrides& o) {
    params::structFromJson(j, o, overridesTable(), "instrument");
}
#undef F

} // namespace gpuphot
