// PLACEHOLDER: replaced by the real subcommand.
#include <CLI/CLI.hpp>
#include "app/cli/commands.hpp"
namespace gpuphot::cli {
Command registerSimulate(CLI::App& app) {
    auto* sub = app.add_subcommand("simulate", "(under construction)");
    return {sub, [] { return 1; }};
}
}
