#include "app/cli/param_flags.hpp"

#include <cmath>
#include <sstream>

#include "core/pipeline/param_table.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

std::string helpOf(const ParamDef& d) {
    std::string h = d.help;
    if (!d.unit.empty()) h += " (" + d.unit + ")";
    if (!d.sextractor.empty()) h += " [" + d.sextractor + "]";
    return h + "; config " + d.key;
}

// The flag's text as the parameter's JSON value.
nlohmann::json valueOf(const ParamDef& d, const std::string& text) {
    const auto number = [&](const std::string& t) -> nlohmann::json {
        std::size_t used = 0;
        double x = 0;
        try {
            x = std::stod(t, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || used != t.size()) throw InvalidInput(d.cli + ": expected a number, got '" + t + "'");
        if (d.type == ParamType::Int && std::nearbyint(x) == x) return static_cast<long long>(x);
        return x;
    };
    switch (d.type) {
    case ParamType::Bool:
        return text == "true";
    case ParamType::Int:
    case ParamType::Flags:
    case ParamType::Double:
    case ParamType::OptionalDouble:
        return number(text);
    case ParamType::DoubleList: {
        nlohmann::json list = nlohmann::json::array();
        std::stringstream ss(text);
        for (std::string item; std::getline(ss, item, ',');)
            if (!item.empty()) list.push_back(number(item));
        return list;
    }
    case ParamType::StringList: {
        nlohmann::json list = nlohmann::json::array();
        std::stringstream ss(text);
        for (std::string item; std::getline(ss, item, ',');)
            list.push_back(item);
        return list;
    }
    default:
        return text;
    }
}

} // namespace

void addParamFlags(CLI::App& sub, ParamFlagValues& values, const std::string& group) {
    for (const ParamDef& d : paramTable()) {
        if (d.cli.empty()) continue;
        const std::string key = d.key;
        if (d.type == ParamType::Bool) {
            sub.add_flag_callback(
                   d.cli, [&values, key] { values.byKey[key] = "true"; }, helpOf(d))
                ->group(group);
        } else if (d.type == ParamType::DoubleList || d.type == ParamType::StringList) {
            sub.add_option_function<std::vector<std::string>>(
                   d.cli,
                   [&values, key](const std::vector<std::string>& v) {
                       std::string joined;
                       for (const std::string& s : v)
                           joined += (joined.empty() ? "" : ",") + s;
                       values.byKey[key] = joined;
                   },
                   helpOf(d))
                ->delimiter(',')
                ->allow_extra_args(false)
                ->group(group);
        } else {
            sub.add_option_function<std::string>(
                   d.cli, [&values, key](const std::string& v) { values.byKey[key] = v; }, helpOf(d))
                ->group(group);
        }
    }
}

void applyParamFlags(const ParamFlagValues& values, PipelineConfig& config) {
    for (const auto& [key, text] : values.byKey) {
        const ParamDef* d = findParam(key);
        if (!d) throw InvalidInput("no parameter '" + key + "'");
        nlohmann::json patch = nlohmann::json::object();
        nlohmann::json* at = &patch;
        std::stringstream ss(key);
        std::vector<std::string> parts;
        for (std::string p; std::getline(ss, p, '.');)
            parts.push_back(p);
        for (std::size_t i = 0; i + 1 < parts.size(); ++i)
            at = &(*at)[parts[i]];
        (*at)[parts.back()] = valueOf(*d, text);
        applyPipelineConfig(config, patch, d->cli);
    }
}

std::vector<std::string> paramFlagArguments(const ParamFlagValues& values) {
    std::vector<std::string> args;
    for (const auto& [key, text] : values.byKey) {
        const ParamDef* d = findParam(key);
        if (!d) continue;
        args.push_back(d->cli);
        if (d->type != ParamType::Bool) args.push_back(text);
    }
    return args;
}

} // namespace gpuphot::cli
