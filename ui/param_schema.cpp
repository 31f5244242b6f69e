#include "ui/param_schema.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>

#include "core/model/flags.hpp"
#include "core/pipeline/param_table.hpp"

namespace gpuphot::ui {
namespace {

const std::string kFlagList =
    " Bits (docs/FLAGS.md): 1 crowded, 2 blended, 4 saturated, 8 edge, 16 aperture incomplete, "
    "32 bad pixels, 64 aperture masked, 128 PSF fit failed, 256 sky failed, 512 Kron failed, "
    "1024 deblend overflow.";

ParamKind kindOf(const ParamDef& d) {
    if (d.access != ParamAccess::Editable) return ParamKind::Hidden;
    switch (d.type) {
    case ParamType::Bool:
        return ParamKind::Bool;
    case ParamType::Int:
        return d.choices.empty() ? ParamKind::Int : ParamKind::Choice;
    case ParamType::Double:
        return d.noneText.empty() ? ParamKind::Double : ParamKind::OptionalDouble;
    case ParamType::String:
        return d.choices.empty() ? ParamKind::OptionalString : ParamKind::Choice;
    case ParamType::Enum:
        return ParamKind::Choice;
    case ParamType::DoubleList:
        return ParamKind::DoubleList;
    case ParamType::StringList:
        return ParamKind::StringList;
    case ParamType::OptionalDouble:
        return ParamKind::OptionalDouble;
    case ParamType::OptionalString:
        return ParamKind::OptionalString;
    case ParamType::Flags:
        return ParamKind::Flags;
    }
    return ParamKind::Hidden;
}

// The dock's editor of one parameter, from its declaration (core/pipeline/param_table.hpp).
ParamSpec specOf(const ParamDef& d) {
    constexpr double kWide = 1e9; // a spin box's bound where the parameter has none
    ParamSpec s;
    s.key = d.key;
    s.group = d.group;
    s.label = d.label;
    s.unit = d.unit;
    s.kind = kindOf(d);
    s.tooltip = d.help;
    if (!d.sextractor.empty()) s.tooltip += " [" + d.sextractor + "]";
    if (!d.cli.empty()) s.tooltip += "; CLI " + d.cli;
    if (d.type == ParamType::Flags) s.tooltip += "." + kFlagList;
    if (d.access == ParamAccess::FromFrame) s.tooltip = "from the frame";
    if (d.access == ParamAccess::Advanced) s.tooltip = "advanced: profile JSON";
    s.min = std::max(d.min, -kWide);
    s.max = std::min(d.max, kWide);
    s.step = d.step;
    s.decimals = d.decimals;
    for (const auto& [value, text] : d.choices)
        s.choices.emplace_back(text, value);
    if (!d.noneText.empty()) {
        s.noneText = d.noneText;
        s.noneValue = d.noneValue;
    }
    return s;
}

std::vector<ParamSpec> buildSchema() {
    std::vector<ParamSpec> v;
    std::set<std::string> objects;
    for (const ParamDef& d : paramTable()) {
        if (d.access == ParamAccess::Internal) continue;
        v.push_back(specOf(d));
        // The dock's leaf keys are one level deep: an object two levels down (prepare.cosmic) has no editor
        // of its own, its fields have.
        const auto first = d.key.find('.');
        const auto second = first == std::string::npos ? first : d.key.find('.', first + 1);
        if (second != std::string::npos && objects.insert(d.key.substr(0, second)).second) {
            ParamSpec o;
            o.key = d.key.substr(0, second);
            o.group = d.group;
            o.kind = ParamKind::Hidden;
            o.tooltip = "fields listed separately";
            v.push_back(std::move(o));
        }
    }
    return v;
}

} // namespace

const std::vector<ParamGroup>& paramGroups() {
    static const std::vector<ParamGroup> groups = [] {
        std::vector<ParamGroup> g;
        for (const auto& [id, title] : gpuphot::paramGroups())
            g.push_back({id, title});
        return g;
    }();
    return groups;
}

const std::vector<ParamSpec>& paramSchema() {
    static const std::vector<ParamSpec> schema = buildSchema();
    return schema;
}

const ParamSpec* findParamSpec(std::string_view key) {
    for (const auto& s : paramSchema())
        if (s.key == key) return &s;
    return nullptr;
}

std::string groupOfKey(std::string_view key) {
    if (const ParamSpec* s = findParamSpec(key)) return s->group;
    const auto dot = key.find('.');
    const std::string first(key.substr(0, dot));
    for (const auto& g : paramGroups())
        if (g.id == first) return first;
    return "background";
}

std::string flagNames(std::uint32_t f, const char* separator) {
    static const std::pair<std::uint32_t, const char*> names[] = {
        {FlagCrowded, "crowded"},
        {FlagBlended, "blended"},
        {FlagSaturated, "saturated"},
        {FlagEdge, "edge"},
        {FlagApertureIncomplete, "aperture_incomplete"},
        {FlagBadPixels, "bad_pixels"},
        {FlagApertureMasked, "aperture_masked"},
        {FlagPsfFitFailed, "psf_fit_failed"},
        {FlagSkyFailed, "sky_failed"},
        {FlagKronFailed, "kron_failed"},
        {FlagDeblendOverflow, "deblend_overflow"},
        {FlagPsfStar, "psf_star"},
        {FlagCalibrator, "calibrator"},
        {FlagAstromStar, "astrom_star"}};
    std::string out;
    for (const auto& [bit, name] : names)
        if (f & bit) {
            if (!out.empty()) out += separator;
            out += name;
        }
    return out;
}

} // namespace gpuphot::ui
