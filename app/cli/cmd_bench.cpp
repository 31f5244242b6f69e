// gpuphot bench: per-stage times and peak memory on a frame (a simulated one when none is given), so any
// user can measure their own machine.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include "app/cli/commands.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {
namespace fs = std::filesystem;

struct BenchCli {
    CommonOptions common;
    std::string frame;
    int repeat = 3;
    std::string size = "4096x4096";
    int stars = 20000;
    std::uint64_t seed = 1;
    bool json = false;
    bool keep = false;
};

int run(BenchCli& o) {
    PipelineConfig config = loadConfig(o.common);
    RunContext ctx = makeRunContext(o.common);
    // CUDA backend: the context comes up while the frame is simulated or read, and the reads upload the
    // frame as they go (cuda_stages.hpp, raw upload).
    startDeviceWarmUp(ctx);
    std::string path = o.frame;
    fs::path tmpDir;
    if (path.empty()) {
        SimParams sp;
        if (std::sscanf(o.size.c_str(), "%dx%d", &sp.width, &sp.height) != 2 || sp.width <= 0 || sp.height <= 0)
            throw InvalidInput("--size must be WIDTHxHEIGHT, got '" + o.size + "'");
        sp.stars = o.stars;
        sp.seed = o.seed;
        tmpDir = fs::temp_directory_path() / ("gpuphot-bench-" + std::to_string(::getpid()));
        fs::create_directories(tmpDir);
        if (o.common.verbosity > 0)
            std::fprintf(stderr, "simulating %dx%d with %d stars...\n", sp.width, sp.height, sp.stars);
        const SimResult sim = simulateField(sp, &ctx);
        writeSimulation(sim, tmpDir.string(), "bench", kBitpixUInt16);
        path = (tmpDir / "bench.fits").string();
    }
    ReduceOptions ro;
    ro.config = config;
    ro.write = false;
    std::map<std::string, std::vector<double>> times;
    std::vector<std::string> order;
    std::vector<double> totals;
    std::size_t sources = 0;
    for (int i = 0; i < std::max(1, o.repeat); ++i) {
        const ReduceSummary s = reduceFrame(path, ro, ctx);
        sources = s.sources;
        totals.push_back(s.seconds);
        for (const auto& r : ctx.records) {
            if (!times.count(r.stage)) order.push_back(r.stage);
            times[r.stage].push_back(r.seconds);
        }
    }
    auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
    const std::size_t peak = peakResidentBytes();
    if (o.json) {
        nlohmann::json j{{"frame", o.frame.empty() ? std::string("simulated ") + o.size : o.frame},
                         {"threads", ctx.threadCount()},
                         {"backend", backendName(ctx.backend)},
                         {"repeat", o.repeat},
                         {"sources", sources},
                         {"total_seconds_best", best(totals)},
                         {"peak_host_bytes", peak}};
        for (const auto& st : order) j["stages"][st] = best(times[st]);
        std::cout << j.dump(2) << "\n";
    } else {
        std::printf("frame: %s\nbackend: %s, threads: %d, repeat: %d, sources: %zu\n",
                    o.frame.empty() ? ("simulated " + o.size + ", " + std::to_string(o.stars) + " stars").c_str()
                                    : o.frame.c_str(),
                    backendName(ctx.backend), ctx.threadCount(), o.repeat, sources);
        std::printf("%-26s %10s\n", "stage", "best s");
        for (const auto& st : order) std::printf("%-26s %10.3f\n", st.c_str(), best(times[st]));
        std::printf("%-26s %10.3f\npeak host memory: %.1f MiB\n", "total (read..catalog)", best(totals), peak / 1048576.0);
    }
    if (!tmpDir.empty() && !o.keep) fs::remove_all(tmpDir);
    return 0;
}

} // namespace

Command registerBench(CLI::App& app) {
    auto o = std::make_shared<BenchCli>();
    auto* sub = app.add_subcommand("bench", "Time every stage on a frame (or a simulated one) and report peak memory");
    sub->add_option("frame", o->frame, "FITS frame (default: simulate one)");
    addCommonOptions(*sub, o->common);
    sub->add_option("--repeat", o->repeat, "Runs; the best time of each stage is reported")->capture_default_str();
    sub->add_option("--size", o->size, "Simulated frame size WIDTHxHEIGHT")->capture_default_str();
    sub->add_option("--stars", o->stars, "Stars in the simulated frame")->capture_default_str();
    sub->add_option("--seed", o->seed, "Simulation seed")->capture_default_str();
    sub->add_flag("--json", o->json, "Machine-readable output");
    sub->add_flag("--keep", o->keep, "Keep the simulated frame");
    return {sub, [o] { return run(*o); }};
}

} // namespace gpuphot::cli
