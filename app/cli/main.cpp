// gpuphot: photometry and astrometry of CCD/sCMOS frames from the command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <vector>

#include "app/cli/commands.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {

void addCommonOptions(CLI::App& sub, CommonOptions& opts) {
    sub.add_option("--backend", opts.backend, "Compute backend: auto (CUDA when a device is present), cpu, cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
        ->capture_default_str();
    sub.add_option("--threads", opts.threads, "CPU threads (0: all cores)")->capture_default_str();
    sub.add_option("--config", opts.config, "JSON file with stage parameters");
    sub.add_option("-o,--outdir", opts.outdir, "Output directory")->capture_default_str();
    sub.add_flag_callback("-v,--verbose", [&opts] { opts.verbosity = 2; }, "More output");
    sub.add_flag_callback("-q,--quiet", [&opts] { opts.verbosity = 0; }, "Errors only");
}

} // namespace gpuphot::cli

int main(int argc, char** argv) {
    using namespace gpuphot;
    CLI::App app{"gpuphot " GPUPHOT_VERSION " - GPU photometry and astrometry of astronomical frames"};
    app.set_version_flag("--version", "gpuphot " GPUPHOT_VERSION);
    app.require_subcommand(1);
    const std::vector<cli::Command> commands = {
        cli::registerSimulate(app),
        cli::registerInfo(app),
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    try {
        for (const auto& c : commands)
            if (c.sub->parsed()) return c.run();
    } catch (const InvalidInput& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
        return 2;
    } catch (const IoError& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
        return 3;
    } catch (const Cancelled&) {
        std::fprintf(stderr, "gpuphot: cancelled\n");
        return 130;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
