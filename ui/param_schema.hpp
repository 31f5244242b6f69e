#pragma once
// What the parameter dock knows about each configuration key beyond its JSON value: label, unit,
// tooltip (meaning and the SExtractor/sep equivalent, after docs/CONFIG.md), editor kind, range and
// step. Keys are JSON paths into PipelineConfig's JSON ("detection.threshold", "defaultFwhm").
// Keys the JSON has but the schema lacks still get a generic editor; hidden keys get none.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuphot::ui {

enum class ParamKind {
    Double,         // QDoubleSpinBox
    Int,            // QSpinBox
    Bool,           // QCheckBox
    Choice,         // QComboBox over `choices` (string or integer JSON values)
    DoubleList,     // QLineEdit, comma-separated numbers ("2, 3, 4, 6")
    StringList,     // QLineEdit, comma-separated words (header keyword lists)
    OptionalDouble, // QDoubleSpinBox whose lowest position means "unset": the key is removed (or `noneValue`)
    OptionalString, // QLineEdit, empty means "unset" (key removed)
    Flags,          // QSpinBox holding a flag mask (docs/FLAGS.md)
    Hidden,         // no editor (values the pipeline takes from the frame)
};

struct ParamSpec {
    std::string key;     // JSON path, dot-separated
    std::string group;   // ParamGroup::id
    std::string label;
    std::string unit;    // shown as the spin box suffix ("" for none)
    std::string tooltip; // meaning; the SExtractor/sep name in brackets where there is one
    ParamKind kind = ParamKind::Double;
    double min = 0.0, max = 1e6, step = 1.0;
    int decimals = 3;
    std::vector<std::pair<std::string, nlohmann::json>> choices; // Choice: shown text, JSON value
    nlohmann::json noneValue;   // OptionalDouble: the value written when unset (null: remove the key)
    std::string noneText = "unset"; // OptionalDouble: shown at the lowest position
};

struct ParamGroup {
    std::string id;
    std::string title;
};

const std::vector<ParamGroup>& paramGroups(); // in display order
const std::vector<ParamSpec>& paramSchema();  // in display order within each group
const ParamSpec* findParamSpec(std::string_view key);
// The group a key without a schema entry belongs to (by its first path component).
std::string groupOfKey(std::string_view key);

// Flag names (docs/FLAGS.md) of the set bits, joined with `separator`; "" for 0.
std::string flagNames(std::uint32_t flags, const char* separator = ",");

} // namespace gpuphot::ui
