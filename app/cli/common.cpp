// Options and set-up shared by the subcommands.
#include <CLI/CLI.hpp>
#include <omp.h>
#include <unistd.h>

#include "app/cli/commands.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {

void addCommonOptions(CLI::App& sub, CommonOptions& opts) {
    sub.add_option("--backend", opts.backend, "Compute backend: auto (CUDA when a device is present), cpu, cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
        ->capture_default_str();
    sub.add_option("--threads", opts.threads, "CPU threads (0: all cores)")->check(CLI::NonNegativeNumber)->capture_default_str();
    sub.add_option("--config", opts.config, "JSON file with stage parameters (see docs/CONFIG.md)");
    sub.add_option("-o,--outdir", opts.outdir, "Output directory")->capture_default_str();
    sub.add_flag_callback("-v,--verbose", [&opts] { opts.verbosity = 2; }, "More output");
    sub.add_flag_callback("-q,--quiet", [&opts] { opts.verbosity = 0; }, "Errors only");
}

RunContext makeRunContext(const CommonOptions& opts) {
    RunContext ctx;
    const Backend requested = parseBackend(opts.backend);
    // The measurement stages have CPU implementations only so far (the CUDA stages are their own
    // issue): auto runs on the CPU, and an explicit cuda request is refused rather than faked.
    if (requested == Backend::Cuda)
        throw InvalidInput("--backend cuda: the CUDA implementations of the stages are not part of this version; "
                           "use --backend cpu");
    ctx.backend = Backend::Cpu;
    ctx.threads = opts.threads;
    if (opts.threads > 0) omp_set_num_threads(opts.threads);
    return ctx;
}

PipelineConfig loadConfig(const CommonOptions& opts) {
    return opts.config.empty() ? PipelineConfig{} : loadPipelineConfig(opts.config);
}

bool stderrIsTty() { return ::isatty(STDERR_FILENO) != 0; }

} // namespace gpuphot::cli
