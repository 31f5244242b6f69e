#include "core/pipeline/param_table.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "core/pipeline/pipeline_config.hpp"

namespace gpuphot {
namespace {

const std::vector<std::pair<std::string, std::string>> kGroups{
    {"prepare", "0 Preparation"},  {"background", "1 Background"},
    {"detection", "2 Detection"},  {"psf", "3 PSF"},
    {"aperture", "4 Aperture"},    {"crossmatch", "5 Crossmatch"},
    {"zeropoint", "6 Zero point"}, {"astrometry", "7 Astrometry"},
    {"instrument", "Instrument"},  {"keywords", "Header keywords"}};

std::size_t groupIndex(const std::string& g) {
    for (std::size_t i = 0; i < kGroups.size(); ++i)
        if (kGroups[i].first == g) return i;
    throw std::logic_error("parameter table: unknown group '" + g + "'");
}

std::vector<ParamDef> buildTable() {
    std::vector<ParamDef> all;
    // A stage's parameters are in its group and invalidate it.
    const auto add = [&all](const char* group, ParamStage stage, std::vector<ParamDef> defs) {
        for (ParamDef& d : defs) {
            d.group = group;
            d.stage = stage;
            all.push_back(std::move(d));
        }
    };
    using PS = ParamStage;
    using C = PipelineConfig;
    add("prepare", PS::Prepare, params::nest(&C::prepare, "prepare", params::prepare()));
    add("background", PS::Background, params::nest(&C::background, "background", params::background()));
    add("detection", PS::Detection, params::nest(&C::detection, "detection", params::detection()));
    add("psf", PS::Psf, params::nest(&C::psf, "psf", params::psf()));
    add("aperture", PS::Aperture, params::nest(&C::aperture, "aperture", params::aperture()));
    add("crossmatch", PS::Calibration, params::nest(&C::crossmatch, "crossmatch", params::crossmatch()));
    add("zeropoint", PS::Calibration, params::nest(&C::zeropoint, "zeropoint", params::zeropoint()));
    add("astrometry", PS::Calibration, params::nest(&C::astrometry, "astrometry", params::astrometry()));
    for (ParamDef& d : params::pipeline())
        all.push_back(std::move(d)); // each names its group and stage
    // Display order: by group; a group's top-level switch (fitAstrometry) before its stage's keys, the
    // other top-level keys after them.
    std::stable_sort(all.begin(), all.end(), [](const ParamDef& a, const ParamDef& b) {
        const std::size_t ga = groupIndex(a.group), gb = groupIndex(b.group);
        if (ga != gb) return ga < gb;
        const auto rank = [](const ParamDef& d) {
            if (d.key == "fitAstrometry") return 0;
            return d.key.find('.') == std::string::npos ? 2 : 1;
        };
        return rank(a) < rank(b);
    });
    return all;
}

std::vector<std::string> splitKey(const std::string& key) {
    std::vector<std::string> parts;
    std::stringstream ss(key);
    for (std::string p; std::getline(ss, p, '.');)
        parts.push_back(p);
    return parts;
}

// The value to write for `def` (nullopt: the key is left out).
std::optional<nlohmann::json> encode(const ParamDef& def, const void* obj) {
    nlohmann::json v = def.read(obj);
    if (def.type == ParamType::Double) {
        const double x = v.get<double>();
        if (std::isfinite(x)) return v;
        switch (def.nonFinite) {
        case NonFinite::InfAsString:
            if (std::isinf(x)) return nlohmann::json(x > 0 ? "inf" : "-inf");
            return v;
        case NonFinite::Omitted:
            return std::nullopt;
        case NonFinite::InfAsNull:
            return std::isinf(x) ? nlohmann::json() : v;
        case NonFinite::Plain:
            return v;
        }
    }
    if ((def.type == ParamType::OptionalDouble || def.type == ParamType::OptionalString) && v.is_null())
        return std::nullopt;
    return v;
}

thread_local std::string tPrefix; // the stage's key in messages about a stage's own table ("detection.")

[[noreturn]] void bad(const ParamDef& def, const std::string& what) {
    throw InvalidInput(tPrefix + def.key + ": " + what);
}

std::string number(double x) {
    std::ostringstream os;
    os << x;
    return os.str();
}

void checkRange(const ParamDef& def, double x) {
    if (!(x >= def.min && x <= def.max))
        bad(def, number(x) + " is outside [" + number(def.min) + ", " + number(def.max) + "]");
}

void checkChoice(const ParamDef& def, const nlohmann::json& v) {
    if (def.choices.empty()) return;
    std::string list;
    for (const auto& [value, text] : def.choices) {
        if (value == v) return;
        list += (list.empty() ? "" : ", ") + value.dump();
    }
    bad(def, v.dump() + " is not one of " + list);
}

bool isInteger(const nlohmann::json& v) {
    return v.is_number_integer() ||
           (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>());
}

// A double's JSON (after `nonFinite`'s spellings) as a number, or nullopt for "the default".
std::optional<double> decodeDouble(const ParamDef& def, const nlohmann::json& v) {
    if (v.is_number()) return v.get<double>();
    if (v.is_null() && (def.nonFinite == NonFinite::Omitted)) return std::nullopt;
    if (v.is_null() && def.nonFinite == NonFinite::InfAsNull) return std::numeric_limits<double>::infinity();
    if (v.is_string() && def.nonFinite == NonFinite::InfAsString) {
        const std::string s = v.get<std::string>();
        if (s == "inf" || s == "+inf") return std::numeric_limits<double>::infinity();
        if (s == "-inf") return -std::numeric_limits<double>::infinity();
    }
    bad(def, "expected a number, got " + v.dump());
}

const PipelineConfig& defaults() {
    static const PipelineConfig d;
    return d;
}

void applyOne(const ParamDef& def, const nlohmann::json& v, void* obj, const void* dflt) {
    if (def.type == ParamType::Double) {
        const std::optional<double> x = decodeDouble(def, v);
        if (!x) {
            def.write(obj, def.read(dflt));
            return;
        }
        if (std::isfinite(*x)) checkRange(def, *x);
        def.write(obj, nlohmann::json(*x));
        return;
    }
    checkParamValue(def, v);
    try {
        def.write(obj, v);
    } catch (const nlohmann::json::exception& e) {
        bad(def, e.what());
    }
}

struct Index {
    std::map<std::string, const ParamDef*> byKey;
    std::set<std::string> objects; // the keys that hold objects of parameters
    explicit Index(const std::vector<ParamDef>& defs) {
        for (const ParamDef& d : defs) {
            if (d.access == ParamAccess::Internal) continue;
            byKey[d.key] = &d;
            for (auto dot = d.key.find('.'); dot != std::string::npos; dot = d.key.find('.', dot + 1))
                objects.insert(d.key.substr(0, dot));
        }
    }
};

void applyObject(const nlohmann::json& j, const std::string& prefix, void* obj, const void* dflt,
                 const Index& index) {
    if (!j.is_object())
        throw InvalidInput((prefix.empty() ? tPrefix.empty() ? std::string("the configuration") : tPrefix
                                           : tPrefix + prefix) +
                           ": expected a JSON object, got " + j.dump());
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
        if (const auto p = index.byKey.find(key); p != index.byKey.end())
            applyOne(*p->second, it.value(), obj, dflt);
        else if (index.objects.count(key))
            applyObject(it.value(), key, obj, dflt, index);
        else
            throw InvalidInput("unknown configuration key '" + tPrefix + key + "'");
    }
}

} // namespace

void checkParamValue(const ParamDef& def, const nlohmann::json& v) {
    switch (def.type) {
    case ParamType::Bool:
        if (!v.is_boolean()) bad(def, "expected true or false, got " + v.dump());
        return;
    case ParamType::Int:
    case ParamType::Flags:
        if (!isInteger(v)) bad(def, "expected an integer, got " + v.dump());
        if (!(v.get<double>() >= -2147483648.0 && v.get<double>() <= 2147483647.0))
            bad(def, v.dump() + " is too large");
        checkRange(def, v.get<double>());
        checkChoice(def, v);
        return;
    case ParamType::Double:
        if (!v.is_number()) bad(def, "expected a number, got " + v.dump());
        checkRange(def, v.get<double>());
        return;
    case ParamType::String:
    case ParamType::Enum:
        if (!v.is_string()) bad(def, "expected a string, got " + v.dump());
        checkChoice(def, v);
        return;
    case ParamType::DoubleList:
        if (!v.is_array()) bad(def, "expected a list of numbers, got " + v.dump());
        for (const auto& x : v) {
            if (!x.is_number()) bad(def, "expected a list of numbers, got " + v.dump());
            checkRange(def, x.get<double>());
        }
        return;
    case ParamType::StringList:
        if (v.is_string()) return;
        if (!v.is_array()) bad(def, "expected a list of strings, got " + v.dump());
        for (const auto& x : v)
            if (!x.is_string()) bad(def, "expected a list of strings, got " + v.dump());
        return;
    case ParamType::OptionalDouble:
        if (v.is_null()) return;
        if (!v.is_number()) bad(def, "expected a number or null, got " + v.dump());
        checkRange(def, v.get<double>());
        return;
    case ParamType::OptionalString:
        if (!v.is_null() && !v.is_string()) bad(def, "expected a string or null, got " + v.dump());
        return;
    }
}

const std::vector<ParamDef>& paramTable() {
    static const std::vector<ParamDef> table = buildTable();
    return table;
}

const ParamDef* findParam(std::string_view key) {
    for (const ParamDef& d : paramTable())
        if (d.key == key) return &d;
    return nullptr;
}

const std::vector<std::pair<std::string, std::string>>& paramGroups() {
    return kGroups;
}

namespace params {

nlohmann::json toJson(const void* obj, const std::vector<ParamDef>& defs) {
    nlohmann::json j = nlohmann::json::object();
    for (const ParamDef& d : defs) {
        if (d.access == ParamAccess::Internal) continue;
        const std::vector<std::string> parts = splitKey(d.key);
        nlohmann::json* at = &j;
        for (std::size_t i = 0; i + 1 < parts.size(); ++i) { // the objects exist even when all is left out
            nlohmann::json& next = (*at)[parts[i]];
            if (next.is_null()) next = nlohmann::json::object();
            at = &next;
        }
        if (std::optional<nlohmann::json> v = encode(d, obj)) (*at)[parts.back()] = std::move(*v);
    }
    return j;
}

void fromJson(const nlohmann::json& j, void* obj, const void* dflt, const std::vector<ParamDef>& defs,
              const std::string& prefix) {
    const Index index(defs);
    struct Restore {
        std::string saved = tPrefix;
        ~Restore() { tPrefix = saved; }
    } restore;
    tPrefix = prefix.empty() ? std::string() : prefix + ".";
    applyObject(j, "", obj, dflt, index);
}

} // namespace params

nlohmann::json paramsToJson(const PipelineConfig& c) {
    return params::toJson(&c, paramTable());
}

void paramsFromJson(const nlohmann::json& j, PipelineConfig& c) {
    params::fromJson(j, &c, &defaults(), paramTable(), "");
}

std::optional<nlohmann::json> encodedParam(const ParamDef& def, const PipelineConfig& c) {
    return encode(def, &c);
}

std::string configDocTable(const std::string& group) {
    std::ostringstream os;
    os << "| key | default | meaning |\n|---|---|---|\n";
    for (const ParamDef& d : paramTable()) {
        if (d.group != group || d.access == ParamAccess::Internal) continue;
        const std::optional<nlohmann::json> def = encode(d, &defaults());
        std::string key = d.key;
        if (group != "instrument" && group != "keywords" && key.rfind(group + ".", 0) == 0)
            key = key.substr(group.size() + 1);
        os << "| `" << key << "` | " << (def ? "`" + def->dump() + "`" : std::string("unset")) << " | "
           << d.help;
        if (!d.unit.empty()) os << " (" << d.unit << ")";
        if (!d.choices.empty()) {
            os << "; one of";
            for (std::size_t i = 0; i < d.choices.size(); ++i)
                os << (i ? ", " : " ") << "`" << d.choices[i].first.dump() << "`";
        } else if (std::isfinite(d.min) || std::isfinite(d.max)) {
            if (d.type != ParamType::Bool && d.type != ParamType::StringList && d.type != ParamType::String)
                os << "; " << (std::isfinite(d.min) ? number(d.min) : "-∞") << " to "
                   << (std::isfinite(d.max) ? number(d.max) : "∞");
        }
        if (!d.sextractor.empty()) os << " [" << d.sextractor << "]";
        if (!d.cli.empty()) os << "; `" << d.cli << "`";
        if (d.access == ParamAccess::FromFrame) os << "; replaced by the frame's value";
        os << " |\n";
    }
    return os.str();
}

std::string regenerateConfigDoc(const std::string& text) {
    std::string out;
    std::size_t pos = 0;
    const std::string open = "<!-- params:", close = "<!-- /params -->";
    for (;;) {
        const std::size_t a = text.find(open, pos);
        if (a == std::string::npos) break;
        const std::size_t nameEnd = text.find(" -->", a);
        const std::size_t b = text.find(close, a);
        if (nameEnd == std::string::npos || b == std::string::npos)
            throw InvalidInput("CONFIG.md: unclosed params marker");
        const std::string group = text.substr(a + open.size(), nameEnd - a - open.size());
        out += text.substr(pos, nameEnd + 4 - pos) + "\n" + configDocTable(group);
        pos = b;
    }
    return out + text.substr(pos);
}

} // namespace gpuphot
