#pragma once
// The configuration parameters that have a command-line flag (`--threshold`, `--aper`, `--cosmics`, ...):
// declared with their parameter (core/pipeline/param_table.hpp, ParamDef::cli), added to a subcommand
// here with the parameter's own description, applied to a PipelineConfig with the configuration file's
// checks, or forwarded as they were given (`submit slurm` to `reduce`).
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/pipeline/pipeline_config.hpp"

namespace gpuphot::cli {

struct ParamFlagValues {
    std::map<std::string, std::string> byKey; // parameter key -> the text given ("true" for a switch)
};

// One option per parameter with a flag, in `group` of the subcommand's help.
void addParamFlags(CLI::App& sub, ParamFlagValues& values, const std::string& group = "Parameters");
// Sets the given parameters; a value of the wrong type, out of range or not among the choices is
// InvalidInput naming the flag.
void applyParamFlags(const ParamFlagValues& values, PipelineConfig& config);
// The flags as arguments for another `gpuphot` command ({"--threshold", "2", "--cosmics", ...}).
std::vector<std::string> paramFlagArguments(const ParamFlagValues& values);

} // namespace gpuphot::cli
