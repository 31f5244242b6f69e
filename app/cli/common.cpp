// Options and set-up shared by the subcommands.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <string>
#include <omp.h>
#include <unistd.h>

#include "app/cli/commands.hpp"
#include "app/cli/test_hooks.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "core/util/memory.hpp"

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
    const std::string name = sub.get_name();
    if (name == "reduce" || name == "bench" || name == "worker" || name == "watch")
        sub.add_option("--gpu-mem-limit", opts.gpuMemLimit,
                       "GPU memory the CUDA backend may use, e.g. 4G, 512M (default: what the device has free)");
}

namespace {
std::size_t parseByteSize(const std::string& text) {
    auto bad = [&text] {
        return InvalidInput("--gpu-mem-limit: '" + text + "' is not a size (e.g. 4G, 512M, 1.5G, 1073741824)");
    };
    std::size_t pos = 0;
    double v = 0.0;
    try {
        v = std::stod(text, &pos);
    } catch (const std::exception&) {
        throw bad();
    }
    std::string unit = text.substr(pos);
    for (auto& c : unit)
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (unit.size() > 1 && unit.back() == 'B') unit.pop_back(); // GB, MiB, ...
    if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
    double scale = 1.0;
    if (unit == "K")
        scale = 1024.0;
    else if (unit == "M")
        scale = 1024.0 * 1024.0;
    else if (unit == "G")
        scale = 1024.0 * 1024.0 * 1024.0;
    else if (unit == "T")
        scale = 1024.0 * 1024.0 * 1024.0 * 1024.0;
    else if (!unit.empty() && unit != "B")
        throw bad();
    if (!(v >= 0.0) || !std::isfinite(v * scale)) throw bad();
    return static_cast<std::size_t>(v * scale);
}
} // namespace

void applyThreadCount(const CommonOptions& opts) {
    if (opts.threads > 0) omp_set_num_threads(opts.threads);
}

RunContext makeRunContext(const CommonOptions& opts) {
    RunContext ctx;
    // auto: CUDA when the kernels are linked and a device is present; cuda without one throws.
    ctx.backend = resolveBackend(parseBackend(opts.backend));
    if (!opts.gpuMemLimit.empty()) ctx.gpuMemLimit = parseByteSize(opts.gpuMemLimit);
    ctx.threads = opts.threads;
    applyThreadCount(opts);
    startThreadTeam(ctx.threadCount()); // a clean error now rather than libgomp's exit later
    // The tuning from the environment, once per process (docs/CONFIG.md §Tuning); the report records it.
    static const BackendTuning tuning = [] {
        BackendTuning t = BackendTuning::fromEnvironment();
        t.applyToProcess();
        return t;
    }();
    ctx.tuning = tuning;
    ctx.testHooks.cudaFailAfterAllocs = cliTestHooks().cudaFailAfterAllocs;
    ctx.testHooks.calibrationBeside = cliTestHooks().calibrationBeside;
    return ctx;
}

PipelineConfig loadConfig(const CommonOptions& opts) {
    return opts.config.empty() ? PipelineConfig{} : loadPipelineConfig(opts.config);
}

bool stderrIsTty() { return ::isatty(STDERR_FILENO) != 0; }

} // namespace gpuphot::cli
