#pragma once
// Each subcommand registers itself on the CLI11 app and returns the exit code when it runs.
#include <functional>
#include <string>

namespace CLI {
class App;
}

namespace gpuphot {
class RunContext;
struct PipelineConfig;
} // namespace gpuphot

namespace gpuphot::cli {

// Options every subcommand shares (docs/ARCHITECTURE.md §Conventions).
struct CommonOptions {
    std::string backend = "auto";
    int threads = 0;
    std::string config;
    std::string outdir = ".";
    int verbosity = 1; // 0: -q, 1: normal, 2: -v
    std::string gpuMemLimit; // --gpu-mem-limit SIZE (reduce, bench): "" or "0" = what the device has free
};

using Runner = std::function<int()>;

struct Command {
    CLI::App* sub = nullptr; // the subcommand it added
    Runner run;              // runs it after parsing; returns the exit code
    // After parsing: whether to run it in a child that hands its status over before the process's teardown
    // (app/cli/detached_exit.hpp); empty: never.
    std::function<bool()> detach = nullptr;
};

// Adds --backend/--threads/--config/-o/-v/-q to a subcommand.
void addCommonOptions(CLI::App& sub, CommonOptions& opts);
// The run context for the options: backend resolved (auto: CUDA when present), thread count applied.
RunContext makeRunContext(const CommonOptions& opts);
// --threads for the OpenMP work that runs before the run context exists (makeRunContext applies it too).
void applyThreadCount(const CommonOptions& opts);
// Stage parameters: defaults, then --config, then the instrument overrides given on the command line.
PipelineConfig loadConfig(const CommonOptions& opts);
// True when stderr is a terminal (progress bars).
bool stderrIsTty();

Command registerInfo(CLI::App& app);
Command registerReduce(CLI::App& app);
Command registerBench(CLI::App& app);
Command registerSimulate(CLI::App& app);
Command registerSubmit(CLI::App& app);
Command registerStatus(CLI::App& app);
Command registerWatch(CLI::App& app);
Command registerWorker(CLI::App& app);  // cmd_worker.cpp: Redis-fed long-lived worker
Command registerEnqueue(CLI::App& app); // cmd_worker.cpp
Command registerResults(CLI::App& app); // cmd_worker.cpp
Command registerMaster(CLI::App& app);  // cmd_master.cpp: master bias/dark/flat
Command registerSeries(CLI::App& app);  // cmd_series.cpp: light curves over a night
Command registerQuery(CLI::App& app);   // cmd_query.cpp: the results database read back

} // namespace gpuphot::cli
