#pragma once
// Every configuration parameter declared once. Each stage folder holds its table
// (core/stages/<stage>/<stage>_params.cpp): per field its key (the member's name), type, unit, range,
// SExtractor name, one-line description, the stage it invalidates, and how the workbench and the CLI
// show it. The default is the member's initialiser in the stage's Params header, beside its declaration.
// From the tables come: PipelineConfig's JSON (read, write and key checking), the range and choice
// checks made when a configuration is read, the workbench's parameter schema (ui/param_schema.cpp),
// the CLI flags of `reduce` and `submit` (app/cli/param_flags.cpp), `firstAffectedStage` and the
// parameter tables of docs/CONFIG.md (`gpuphot config --doc-tables`; a test compares).
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/util/errors.hpp"

namespace gpuphot {

struct PipelineConfig;

// "No limit" in a table's range.
inline constexpr double kNoLimit = std::numeric_limits<double>::infinity();

// The first stage a changed parameter makes run again (the order of core/pipeline/pipeline.hpp's Stage;
// Prepare: the frame is prepared again, then every stage).
enum class ParamStage { Prepare, Background, Detection, Psf, Aperture, Calibration };

enum class ParamType {
    Bool,
    Int,
    Double,
    String,         // free text, or one of `choices`
    Enum,           // a C++ enum written as one of `choices`
    DoubleList,     // JSON array of numbers
    StringList,     // JSON array of strings (a single string is read as a list of one)
    OptionalDouble, // absent: unset
    OptionalString, // absent: unset
    Flags,          // an integer flag mask (docs/FLAGS.md)
};

// How a double whose value may be infinite or NaN is written (JSON has neither).
enum class NonFinite {
    Plain,       // always finite
    InfAsString, // ±infinity written "inf" / "-inf" (an open magnitude range)
    Omitted,     // not finite: the key is left out; absent or null reads as the default
    InfAsNull,   // infinity written null; null reads as infinity
};

// Where a parameter is edited.
enum class ParamAccess {
    Editable,  // the workbench shows an editor
    FromFrame, // the pipeline replaces it with the frame's value (gain, saturation); no editor
    Advanced,  // profile JSON only (no editor)
    Internal,  // set by the pipeline or by tests; never serialised
};

struct ParamDef {
    std::string key;   // JSON path in PipelineConfig's JSON, dot-separated ("detection.threshold")
    std::string group; // the workbench's and docs/CONFIG.md's group: the stage's folder name, or
                       // "instrument", "keywords" (set where the tables are put together)
    ParamType type = ParamType::Double;
    ParamStage stage = ParamStage::Background;
    ParamAccess access = ParamAccess::Editable;
    NonFinite nonFinite = NonFinite::Plain;
    std::string label;                                     // the workbench's label
    std::string unit;                                      // "" none
    std::string help;                                      // one line: what it does
    std::string sextractor;                                // SExtractor / sep name ("" none)
    std::string cli;                                       // the CLI flag that sets it ("" none)
    double min = -std::numeric_limits<double>::infinity(); // accepted range (numbers, list elements)
    double max = std::numeric_limits<double>::infinity();
    double step = 1.0; // the workbench's spin-box step and decimals
    int decimals = 0;
    // String/Enum: the accepted values with their shown text ({json value, text}); Int may have choices too.
    std::vector<std::pair<nlohmann::json, std::string>> choices;
    std::string noneText;     // OptionalDouble: what the workbench shows for "unset"
    nlohmann::json noneValue; // OptionalDouble: the value written for "unset" (null: key removed)

    // Type-erased access to the field inside a PipelineConfig (set by the table builders below).
    std::function<nlohmann::json(const void*)> read;         // the field's JSON value (null: omitted)
    std::function<void(void*, const nlohmann::json&)> write; // parse, check, store; throws InvalidInput

    // Fluent setters for the tables.
    ParamDef& lbl(std::string s) {
        label = std::move(s);
        return *this;
    }
    ParamDef& in(std::string s) {
        unit = std::move(s);
        return *this;
    }
    ParamDef& doc(std::string s) {
        help = std::move(s);
        return *this;
    }
    ParamDef& sex(std::string s) {
        sextractor = std::move(s);
        return *this;
    }
    ParamDef& flag(std::string s) {
        cli = std::move(s);
        return *this;
    }
    ParamDef& range(double lo, double hi) {
        min = lo;
        max = hi;
        return *this;
    }
    ParamDef& ui(double s, int d) {
        step = s;
        decimals = d;
        return *this;
    }
    ParamDef& from(ParamStage s) {
        stage = s;
        return *this;
    }
    ParamDef& inGroup(std::string g) {
        group = std::move(g);
        return *this;
    }
    ParamDef& oneOf(std::vector<std::pair<nlohmann::json, std::string>> c) {
        choices = std::move(c);
        return *this;
    }
    ParamDef& none(std::string text, nlohmann::json value = nullptr) {
        noneText = std::move(text);
        noneValue = std::move(value);
        return *this;
    }
    ParamDef& fromFrame() {
        access = ParamAccess::FromFrame;
        return *this;
    }
    ParamDef& advanced() {
        access = ParamAccess::Advanced;
        return *this;
    }
    ParamDef& internal() {
        access = ParamAccess::Internal;
        return *this;
    }
    ParamDef& flags() {
        type = ParamType::Flags;
        return *this;
    }
    ParamDef& nonFiniteAs(NonFinite n) {
        nonFinite = n;
        return *this;
    }
};

// The value read from JSON for `def`, checked against its type, range and choices (InvalidInput names
// the key). Used by the builders below; exposed for the CLI flags.
void checkParamValue(const ParamDef& def, const nlohmann::json& value);

namespace params {

template <class T> struct IsOptional : std::false_type {};
template <class T> struct IsOptional<std::optional<T>> : std::true_type {};
template <class T> struct IsVector : std::false_type {};
template <class T> struct IsVector<std::vector<T>> : std::true_type {};

template <class T> constexpr ParamType typeOf() {
    if constexpr (std::is_same_v<T, bool>)
        return ParamType::Bool;
    else if constexpr (std::is_enum_v<T>)
        return ParamType::Enum;
    else if constexpr (std::is_integral_v<T>)
        return ParamType::Int;
    else if constexpr (std::is_floating_point_v<T>)
        return ParamType::Double;
    else if constexpr (std::is_same_v<T, std::string>)
        return ParamType::String;
    else if constexpr (std::is_same_v<T, std::optional<double>>)
        return ParamType::OptionalDouble;
    else if constexpr (std::is_same_v<T, std::optional<std::string>>)
        return ParamType::OptionalString;
    else if constexpr (std::is_same_v<T, std::vector<std::string>>)
        return ParamType::StringList;
    else {
        static_assert(IsVector<T>::value, "unsupported parameter type");
        return ParamType::DoubleList;
    }
}

// One field of the Params struct S, declared by its member pointer; `name` is the member's name (the
// F(member) macro of the table files passes both). The definition is completed with the setters above.
template <class S, class T> ParamDef field(T S::*member, const char* name) {
    ParamDef d;
    d.key = name;
    d.type = typeOf<T>();
    d.read = [member](const void* s) -> nlohmann::json {
        const T& v = static_cast<const S*>(s)->*member;
        // A double is returned as it is (infinite, NaN): paramsToJson writes it as `nonFinite` says.
        if constexpr (IsOptional<T>::value)
            return v ? nlohmann::json(*v) : nlohmann::json();
        else
            return nlohmann::json(v);
    };
    d.write = [member](void* s, const nlohmann::json& j) {
        T& v = static_cast<S*>(s)->*member;
        if constexpr (IsOptional<T>::value) {
            if (j.is_null())
                v.reset();
            else
                v = j.get<typename T::value_type>();
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            v = j.is_string() ? std::vector<std::string>{j.get<std::string>()} : j.get<T>();
        } else {
            j.get_to(v);
        }
    };
    return d;
}

// A field that is not a parameter (set by the pipeline; never serialised), listed so that every field of a
// Params struct is in its table.
template <class S, class T> ParamDef internalField(T S::*, const char* name) {
    ParamDef d;
    d.key = name;
    d.access = ParamAccess::Internal;
    return d;
}

// A member that is itself a table (PrepareParams::cosmic, PipelineConfig::detection): its definitions
// with `prefix.` in front of their keys, reading and writing through the member.
template <class S, class T>
std::vector<ParamDef> nest(T S::*member, const std::string& prefix, std::vector<ParamDef> defs) {
    for (ParamDef& d : defs) {
        d.key = prefix + "." + d.key;
        auto read = std::move(d.read);
        auto write = std::move(d.write);
        d.read = [member, read](const void* s) { return read(&(static_cast<const S*>(s)->*member)); };
        d.write = [member, write](void* s, const nlohmann::json& j) {
            write(&(static_cast<S*>(s)->*member), j);
        };
    }
    return defs;
}

inline void append(std::vector<ParamDef>& to, std::vector<ParamDef> more) {
    for (ParamDef& d : more)
        to.push_back(std::move(d));
}

// JSON of a struct through its table (keys relative to it), and back: missing keys keep their values;
// unknown keys, wrong types, values out of range or not among the choices are InvalidInput naming the
// key (with `prefix.` in front). `dflt`: a default-constructed struct (what null means for
// NonFinite::Omitted).
nlohmann::json toJson(const void* obj, const std::vector<ParamDef>& defs);
void fromJson(const nlohmann::json& j, void* obj, const void* dflt, const std::vector<ParamDef>& defs,
              const std::string& prefix);
// to_json / from_json of a stage's Params through its table (the stage's _params.cpp defines them with
// these).
template <class S> nlohmann::json structToJson(const S& s, const std::vector<ParamDef>& defs) {
    return toJson(&s, defs);
}
template <class S>
void structFromJson(const nlohmann::json& j, S& s, const std::vector<ParamDef>& defs,
                    const std::string& prefix) {
    static const S dflt{};
    fromJson(j, &s, &dflt, defs, prefix);
}

// Each stage's table (in its folder), keys relative to the stage's object.
std::vector<ParamDef> prepare();
std::vector<ParamDef> background();
std::vector<ParamDef> detection();
std::vector<ParamDef> psf();
std::vector<ParamDef> aperture();
std::vector<ParamDef> crossmatch();
std::vector<ParamDef> zeropoint();
std::vector<ParamDef> astrometry();
std::vector<ParamDef> pipeline();            // the top-level keys, instrument overrides and header keywords
std::vector<ParamDef> instrumentOverrides(); // core/model/instrument_params.cpp
std::vector<ParamDef> instrumentKeywords();

} // namespace params

// All parameters, in the order of the stages (the workbench's order within each group).
const std::vector<ParamDef>& paramTable();
const ParamDef* findParam(std::string_view key);
// The groups in display order: {id, title}.
const std::vector<std::pair<std::string, std::string>>& paramGroups();

// PipelineConfig <-> JSON through the table (pipeline_config.cpp's to_json / from_json).
nlohmann::json paramsToJson(const PipelineConfig& c);
// Missing keys keep their values; unknown keys, wrong types, values out of range or not among the choices
// are InvalidInput naming the key.
void paramsFromJson(const nlohmann::json& j, PipelineConfig& c);
// The JSON value `def` has in `c` as written (nullopt: left out).
std::optional<nlohmann::json> encodedParam(const ParamDef& def, const PipelineConfig& c);

// Number of fields of an aggregate (the test that no Params field is missing from its table).
namespace detail {
struct AnyField {
    template <class T> operator T() const;
};
template <class T, class... A> constexpr std::size_t fieldCount(A... a) {
    if constexpr (requires { T{a..., AnyField{}}; })
        return fieldCount<T>(a..., AnyField{});
    else
        return sizeof...(A);
}
} // namespace detail
template <class T> constexpr std::size_t aggregateFieldCount() {
    return detail::fieldCount<T>();
}

// The Markdown tables of docs/CONFIG.md, one per group, between the markers
// "<!-- params:GROUP -->" and "<!-- /params -->".
std::string configDocTable(const std::string& group);
// docs/CONFIG.md's text with every marked table replaced by configDocTable's.
std::string regenerateConfigDoc(const std::string& text);

} // namespace gpuphot
