// gpuphot: photometry and astrometry of CCD/sCMOS frames from the command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <vector>

#include "app/cli/commands.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/util/errors.hpp"



int main(int argc, char** argv) {
    using namespace gpuphot;
#ifdef GPUPHOT_WITH_CUDA
    cuda::linkKernels(); // keeps the CUDA backend's registration in the static link
#endif
    CLI::App app{"gpuphot " GPUPHOT_VERSION " - GPU photometry and astrometry of astronomical frames"};
    app.set_version_flag("--version", "gpuphot " GPUPHOT_VERSION);
    app.require_subcommand(1);
    const std::vector<cli::Command> commands = {
        cli::registerSimulate(app),
        cli::registerInfo(app),
        cli::registerReduce(app),
        cli::registerBench(app),
        cli::registerSubmit(app),
        cli::registerStatus(app),
        cli::registerWatch(app),
        cli::registerWorker(app),
        cli::registerEnqueue(app),
        cli::registerResults(app),
        cli::registerMaster(app),
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
