// PLACEHOLDER: replaced by the real subcommand.
#include <CLI/CLI.hpp>
#include "app/cli/commands.hpp"
namespace gpuphot::cli {
Command registerInfo(CLI::App& app) {
    auto* sub = app.add_subcommand("info", "(under construction)");
    return {sub, [] { return 1; }};
}
}
