// gpuphot status OUTDIR: what became of every frame of a batch (Slurm array, local batch, workers), from
// the per-frame JSON status lines; frames without a line are "missing" and, when OUTDIR/slurm/job_id
// exists, annotated with what sacct (or scontrol) says about their array element.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "app/cli/commands.hpp"
#include "app/cli/slurm_jobs.hpp"

namespace gpuphot::cli {
namespace {

struct StatusCli {
    std::string outdir;
    bool json = false;
    bool noSlurm = false;
};

int run(const StatusCli& o) {
    const OutdirStatus s = collectOutdirStatus(o.outdir, !o.noSlurm);
    if (o.json)
        std::cout << s.toJson().dump(2) << "\n";
    else if (s.frames.empty())
        std::printf("%s: no frames (no slurm/frames.txt and no status lines)\n", o.outdir.c_str());
    else
        printOutdirStatus(s);
    return s.allOk() ? 0 : 1;
}

} // namespace

Command registerStatus(CLI::App& app) {
    auto o = std::make_shared<StatusCli>();
    auto* sub = app.add_subcommand(
        "status", "Collect the per-frame results of a batch in OUTDIR (exit 0 when every frame is ok)");
    sub->add_option("outdir", o->outdir, "Output directory of `gpuphot submit slurm` or `gpuphot reduce`")
        ->required();
    sub->add_flag("--json", o->json, "Machine-readable output (JSON on stdout)");
    sub->add_flag("--no-slurm", o->noSlurm, "Do not ask sacct/scontrol about frames without a status line");
    return {sub, [o] { return run(*o); }};
}

} // namespace gpuphot::cli
