#pragma once
// Numbers in the JSON reports (report.json, the exposure report, series.json, the results store): a value
// that is not finite is written as null, and a key that is missing, null or not a number reads as NaN.
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

namespace gpuphot {

inline nlohmann::json finiteOrNull(double v) {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

inline double numberOrNaN(const nlohmann::json& j, const char* key) {
    if (!j.is_object()) return std::numeric_limits<double>::quiet_NaN();
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

} // namespace gpuphot
