// gpuphot: photometry and astrometry of CCD/sCMOS frames from the command line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "app/cli/commands.hpp"
#include "app/cli/detached_exit.hpp"
#include "core/db/results_store.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/util/errors.hpp"
#include "core/util/memory.hpp"
#include "core/util/text.hpp"
#include "core/util/timeline.hpp"

namespace {

// SExtractor's command-line overrides, `-KEY value` with KEY upper case (they cannot collide with gpuphot's
// lower-case options), become `--sex-set KEY=value` for the reduce options.
std::vector<std::string> rewriteSextractorOverrides(int argc, char** argv) {
    std::vector<std::string> out;
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        const bool key =
            i > 0 && a.size() > 2 && a[0] == '-' && gpuphot::isUpperCaseName(std::string_view(a).substr(1));
        if (key && i + 1 < argc) {
            out.push_back("--sex-set");
            out.push_back(a.substr(1) + "=" + argv[++i]);
        } else {
            out.push_back(a);
        }
    }
    return out;
}

// Runs a parsed command; its typed errors become the exit codes docs/CLI.md lists.
int runCommand(const gpuphot::cli::Command& c) {
    using namespace gpuphot;
    try {
        const int rc = c.run();
        timelineMark("command returned");
        return rc;
    } catch (const DatabaseError& e) {
        std::fprintf(stderr, "gpuphot: database error: %s\n", e.what());
        return databaseExitCode(e.kind());
    } catch (const InvalidInput& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
        return 2;
    } catch (const IoError& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
        return 3;
    } catch (const OutOfMemory& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
        return kExitOutOfMemory;
    } catch (const std::bad_alloc& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", outOfMemory(e, "gpuphot").what());
        return kExitOutOfMemory;
    } catch (const Cancelled&) {
        std::fprintf(stderr, "gpuphot: cancelled\n");
        return 130;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
        return 1;
    }
}
} // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args = rewriteSextractorOverrides(argc, argv);
    std::vector<char*> argp;
    for (std::string& a : args)
        argp.push_back(a.data());
    argc = static_cast<int>(argp.size());
    argv = argp.data();
    using namespace gpuphot;
#ifdef GPUPHOT_WITH_CUDA
    cuda::linkKernels(); // keeps the CUDA backend's registration in the static link
#endif
    CLI::App app{"gpuphot " GPUPHOT_VERSION " - GPU photometry and astrometry of astronomical frames"};
    app.set_version_flag("--version", "gpuphot " GPUPHOT_VERSION);
    app.require_subcommand(1);
    const std::vector<cli::Command> commands = {
        cli::registerSimulate(app), cli::registerInfo(app),   cli::registerReduce(app),
        cli::registerBench(app),    cli::registerSubmit(app), cli::registerStatus(app),
        cli::registerWatch(app),    cli::registerWorker(app), cli::registerEnqueue(app),
        cli::registerResults(app),  cli::registerMaster(app), cli::registerSeries(app),
        cli::registerQuery(app),
    };
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    for (const auto& c : commands)
        if (c.sub->parsed()) {
            if (c.detach && c.detach()) return cli::runDetached([&c] { return runCommand(c); });
            return runCommand(c);
        }
    return 0;
}
