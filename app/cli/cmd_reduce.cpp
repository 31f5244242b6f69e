// gpuphot reduce: detection, PSF and aperture photometry of frames into calibrated catalogs; many frames
// (files, globs, list files, directories) in one warm process or N worker processes (app/cli/batch.hpp).
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "app/cli/batch.hpp"
#include "app/cli/commands.hpp"
#include "app/cli/db_cli.hpp"
#include "core/pipeline/backend_tuning.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

struct ReduceCli {
    ReduceCliOptions options;
    std::vector<std::string> frames;
    std::string list;
    BatchOptions batch;
    bool batchChild = false;
    bool dumpConfig = false;
    CLI::App* sub = nullptr;
    std::optional<std::vector<std::string>> expanded; // the frames the inputs name, once listed
};

// The frames the inputs name (globs, @LIST files, directories), listed once per run.
const std::vector<std::string>& framesOf(ReduceCli& o) {
    if (!o.expanded) o.expanded = expandFrameInputs(o.frames, o.list);
    return *o.expanded;
}

int run(ReduceCli& o) {
    if (o.dumpConfig) {
        std::cout << nlohmann::json(toReduceOptions(o.options).config).dump(2) << "\n";
        return 0;
    }
    if (o.batchChild) return runBatchChild(o.options);
    const std::vector<std::string>& frames = framesOf(o);
    if (frames.empty())
        throw InvalidInput("reduce: no frame given (gpuphot reduce FRAME.fits ..., @LIST, DIR)");
    BatchOptions b = o.batch;
    b.childArgs = reproduceArgs(
        *o.sub, {"-j", "--jsonl", "--db", "--list", "--force", "--batch-child", "--dump-config", "-v", "-q"});
    b.threadsGiven = o.sub->count("--threads") > 0;
    if (frames.size() > 1 && !o.options.sexPerFrameNames) { // one CATALOG_NAME cannot hold several frames
        o.options.sexPerFrameNames = true;
        b.childArgs.push_back("--sex-per-frame-names");
    }
    return runBatch(frames, o.options, b);
}

// A single frame on a backend that may use CUDA: the device's release after the outputs need not hold the
// shell (app/cli/detached_exit.hpp). Decided before anything starts the CUDA driver or a thread.
bool detachTeardown(ReduceCli& o) {
    if (o.dumpConfig || o.batchChild || o.options.common.backend == "cpu") return false;
    const std::string mode = BackendTuning::fromEnvironment().detachedExit;
    if (mode == "0") return false;
#ifdef GPUPHOT_WITH_CUDA
    const bool device = ::access("/dev/nvidiactl", F_OK) == 0;
#else
    const bool device = false;
#endif
    if (mode != "1" && !device) return false;
    try {
        return framesOf(o).size() == 1;
    } catch (const std::exception&) {
        return false; // the run reports it
    }
}

} // namespace

Command registerReduce(CLI::App& app) {
    auto o = std::make_shared<ReduceCli>();
    auto* sub =
        app.add_subcommand("reduce", "Detect and measure sources; write catalog, maps and a JSON report");
    o->sub = sub;
    sub->add_option("frames", o->frames,
                    "FITS frames (also .fz, .gz, file.fits[EXT]), globs, @LIST files (one path per line), "
                    "directories (their FITS files)");
    addReduceOptions(*sub, o->options);
    sub->add_option("--list", o->list, "File listing frames, one path per line ('#' comments)");
    sub->add_option("-j,--jobs", o->batch.jobs,
                    "Worker processes (default: one per visible GPU with the CUDA backend, else one process "
                    "using all threads; on the CPU each worker gets cores/N threads)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--jsonl", o->batch.jsonl,
                    "Append one JSON status line per frame to this file (default with several frames: "
                    "OUTDIR/gpuphot.jsonl)");
    addDbOption(*sub, o->batch.db);
    sub->add_flag("--force", o->batch.force,
                  "Reduce frames again even when their outputs are complete and newer");
    sub->add_flag("--batch-child", o->batchChild, "")->group(""); // internal: a worker of `reduce -j N`
    sub->add_flag("--dump-config", o->dumpConfig, "Print the effective configuration as JSON and exit");
    return {sub, [o] { return run(*o); }, [o] { return detachTeardown(*o); }};
}

} // namespace gpuphot::cli
