// gpuphot submit slurm FRAMES... -o OUTDIR: one process per image on a Slurm cluster. Writes
// OUTDIR/slurm/frames.txt and OUTDIR/slurm/job.sh (an `sbatch --array` script, one element per frame, each
// running `gpuphot reduce FRAME -o OUTDIR --jsonl OUTDIR/slurm/status/JOB_TASK.jsonl ...` with this very
// binary), submits it with `sbatch --parsable`, prints the job id and, with --wait, polls squeue until the
// array is done and prints `gpuphot status OUTDIR`. Only Slurm's command-line tools are used (no libslurm).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "app/cli/commands.hpp"
#include "app/cli/param_flags.hpp"
#include "app/cli/slurm_jobs.hpp"
#include "core/io/atomic_file.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace fs = std::filesystem;
namespace {

struct SubmitSlurmCli {
    std::vector<std::string> frames;
    std::string outdir;
    int gpusPerTask = 0;
    std::string partition;
    int maxParallel = 0;
    std::string time;
    int cpusPerTask = 0;
    std::string jobName = "gpuphot";
    std::vector<std::string> sbatchArgs;
    bool wait = false, dryRun = false;
    double pollSeconds = 5.0;
    int verbosity = 1;
    // Passed to `gpuphot reduce` as given (file names made absolute).
    std::string ref, refColumns, config, targets, hdu, backend, gpuMemLimit;
    std::vector<std::string> formats, maps;
    ParamFlagValues params; // --threshold --aper ... forwarded to reduce
    std::string threads;
    bool noTycho2 = false;
    std::vector<std::string> passThrough; // everything after `--`
    std::string afterDash;                // placeholder positional (see registerSubmit)
};

std::string absolute(const std::string& p) {
    return fs::absolute(p).lexically_normal().string();
}

bool looksLikeFits(const fs::path& p) {
    std::string n = p.filename().string();
    std::transform(n.begin(), n.end(), n.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const char* ext : {".fits", ".fit", ".fts", ".fits.fz", ".fz", ".fits.gz", ".fit.gz", ".fts.gz"})
        if (n.size() > std::strlen(ext) &&
            n.compare(n.size() - std::strlen(ext), std::string::npos, ext) == 0)
            return true;
    return false;
}

// FRAMES: files (a CFITSIO suffix file.fits[1] is kept), directories (their FITS files, sorted) and
// @LIST files (one frame a line, # comments). Every frame becomes an absolute path that must exist.
std::vector<std::string> expandFrames(const std::vector<std::string>& args) {
    std::vector<std::string> out;
    auto addFile = [&out](const std::string& frame, const std::string& from) {
        std::string file = frame, suffix;
        if (const auto b = file.find('['); b != std::string::npos && file.back() == ']') {
            suffix = file.substr(b);
            file.resize(b);
        }
        std::error_code ec;
        if (!fs::is_regular_file(file, ec))
            throw InvalidInput("submit slurm: " + frame + ": no such frame" +
                               (from.empty() ? "" : " (listed in " + from + ")"));
        const std::string abs = absolute(file) + suffix;
        if (abs.find('\n') != std::string::npos || abs.find('\r') != std::string::npos)
            throw InvalidInput("submit slurm: " + frame +
                               ": a frame name with a line break cannot go into frames.txt");
        out.push_back(abs);
    };
    for (const auto& a : args) {
        std::error_code ec;
        if (a.size() > 1 && a[0] == '@') {
            std::ifstream in(a.substr(1));
            if (!in) throw IoError(a.substr(1) + ": cannot read the frame list");
            std::string line;
            while (std::getline(in, line)) {
                while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
                    line.pop_back();
                const auto b = line.find_first_not_of(" \t");
                if (b == std::string::npos || line[b] == '#') continue;
                addFile(line.substr(b), a.substr(1));
            }
        } else if (fs::is_directory(a, ec)) {
            std::vector<std::string> files;
            for (const auto& e : fs::directory_iterator(a, ec))
                if (e.is_regular_file() && looksLikeFits(e.path())) files.push_back(e.path().string());
            std::sort(files.begin(), files.end());
            for (const auto& f : files)
                addFile(f, a);
        } else {
            addFile(a, "");
        }
    }
    return out;
}

// CLI11 gives the arguments after `--` to the FRAMES positional like any other; /proc/self/cmdline tells
// which they were (the tokens after the first `--` that follows `submit slurm`).
std::vector<std::string> argumentsAfterDoubleDash() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> argv;
    std::string tok;
    while (std::getline(in, tok, '\0'))
        argv.push_back(tok);
    std::size_t i = 1;
    while (i < argv.size() && argv[i] != "submit")
        ++i;
    while (i < argv.size() && argv[i] != "slurm")
        ++i;
    while (i < argv.size() && argv[i] != "--")
        ++i;
    if (i >= argv.size()) return {};
    return {argv.begin() + static_cast<std::ptrdiff_t>(i + 1), argv.end()};
}

// The gpuphot reduce command line of one array element ($FRAME and $STATUS are set by job.sh).
std::string reduceCommand(const SubmitSlurmCli& o, const std::string& self, const std::string& outdir) {
    std::vector<std::string> args = {"reduce"};
    auto opt = [&args](const char* name, const std::string& value) {
        if (!value.empty()) {
            args.push_back(name);
            args.push_back(value);
        }
    };
    auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v)
            s += (s.empty() ? "" : ",") + x;
        return s;
    };
    opt("-o", outdir);
    opt("--ref", o.ref.empty() ? "" : absolute(o.ref));
    opt("--ref-columns", o.refColumns);
    opt("--config", o.config.empty() ? "" : absolute(o.config));
    opt("--targets", o.targets.empty() ? "" : absolute(o.targets));
    opt("--hdu", o.hdu);
    opt("--backend", o.backend);
    opt("--gpu-mem-limit", o.gpuMemLimit);
    opt("--formats", join(o.formats));
    opt("--maps", join(o.maps));
    for (const std::string& a : paramFlagArguments(o.params))
        args.push_back(a);
    opt("--threads", o.threads);
    if (o.noTycho2) args.push_back("--no-tycho2");
    args.insert(args.end(), o.passThrough.begin(), o.passThrough.end());
    std::string cmd = shellQuote(self);
    for (const auto& a : args)
        cmd += " " + shellQuote(a);
    // Without --threads, use the CPUs Slurm gave the element rather than every core of the node.
    if (o.threads.empty() &&
        std::find(o.passThrough.begin(), o.passThrough.end(), "--threads") == o.passThrough.end())
        cmd += " ${SLURM_CPUS_PER_TASK:+--threads \"$SLURM_CPUS_PER_TASK\"}";
    return cmd + " \"$FRAME\" --jsonl \"$STATUS\"";
}

// An #SBATCH line; values with blanks or quotes are double-quoted (sbatch strips the quotes).
std::string sbatchLine(const std::string& option, const std::string& value) {
    if (value.find_first_of(" \t\"'") == std::string::npos) return "#SBATCH " + option + "=" + value + "\n";
    if (value.find('"') != std::string::npos)
        throw InvalidInput("submit slurm: " + option + " " + value +
                           ": a double quote cannot go into an #SBATCH line");
    return "#SBATCH " + option + "=\"" + value + "\"\n";
}

std::string jobScript(const SubmitSlurmCli& o, std::size_t n, const SlurmLayout& L, const std::string& self,
                      const std::string& outdir) {
    std::ostringstream s;
    s << "#!/bin/bash\n";
    s << sbatchLine("--job-name", o.jobName);
    s << "#SBATCH --array=0-" << n - 1 << (o.maxParallel > 0 ? "%" + std::to_string(o.maxParallel) : "")
      << "\n";
    s << sbatchLine("--output", (fs::path(L.dir) / "%A_%a.out").string());
    s << sbatchLine("--chdir", outdir); // every path in the job is absolute; OUTDIR is shared by the nodes
    s << "#SBATCH --ntasks=1\n";
    if (o.gpusPerTask > 0) s << "#SBATCH --gres=gpu:" << o.gpusPerTask << "\n";
    if (o.cpusPerTask > 0) s << "#SBATCH --cpus-per-task=" << o.cpusPerTask << "\n";
    if (!o.partition.empty()) s << sbatchLine("--partition", o.partition);
    if (!o.time.empty()) s << sbatchLine("--time", o.time);
    for (const auto& a : o.sbatchArgs) {
        if (a.rfind("--", 0) != 0 || a.find('\n') != std::string::npos)
            throw InvalidInput("submit slurm: --sbatch-arg '" + a +
                               "': give one long option, e.g. --account=astro");
        s << "#SBATCH " << a << "\n";
    }
    s << "# Written by gpuphot submit slurm: element i reduces line i+1 of frames.txt and appends its JSON\n"
         "# status line to status/JOBID_TASK.jsonl; `gpuphot status "
      << outdir << "` collects them.\n";
    s << "set -u\n";
    s << "FRAMES=" << shellQuote(L.frames) << "\n";
    s << "FRAME=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" \"$FRAMES\")\n";
    s << "if [ -z \"$FRAME\" ]; then\n"
         "    echo \"gpuphot job: no frame on line $((SLURM_ARRAY_TASK_ID + 1)) of $FRAMES\" >&2\n"
         "    exit 2\n"
         "fi\n";
    s << "STATUS=" << shellQuote(L.statusDir) << "/\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.jsonl\"\n";
    s << "echo \"gpuphot job ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} on $(hostname): $FRAME"
         "${CUDA_VISIBLE_DEVICES:+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)}\"\n";
    s << "exec " << reduceCommand(o, self, outdir) << "\n";
    return s.str();
}

std::string selfExecutable() {
    std::error_code ec;
    const fs::path p = fs::read_symlink("/proc/self/exe", ec);
    if (ec)
        throw IoError("/proc/self/exe: cannot find the gpuphot binary to run in the job: " + ec.message());
    return p.string();
}

int waitForArray(const std::string& jobId, double pollSeconds, int verbosity) {
    const auto start = std::chrono::steady_clock::now();
    int errors = 0;
    for (;;) {
        bool active = true;
        try {
            active = slurmArrayActive(jobId);
            errors = 0;
        } catch (const IoError& e) {
            // The controller may be briefly unreachable; squeue missing altogether is fatal.
            if (std::string(e.what()).find("not found on PATH") != std::string::npos || ++errors > 10) throw;
            if (verbosity > 0) std::fprintf(stderr, "gpuphot: warning: %s (retrying)\n", e.what());
        }
        if (!active) break;
        std::this_thread::sleep_for(std::chrono::duration<double>(pollSeconds));
        if (verbosity > 1)
            std::fprintf(stderr, "gpuphot: waiting for job %s (%.0f s)\n", jobId.c_str(),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return 0;
}

int run(SubmitSlurmCli& o) {
    o.passThrough = argumentsAfterDoubleDash();
    if (!o.passThrough.empty()) {
        // CLI11 put them at the end of FRAMES.
        const std::size_t k = o.passThrough.size();
        if (o.frames.size() < k || !std::equal(o.passThrough.begin(), o.passThrough.end(),
                                               o.frames.end() - static_cast<std::ptrdiff_t>(k)))
            throw InvalidInput("submit slurm: cannot tell the frames from the reduce arguments after `--`");
        o.frames.resize(o.frames.size() - k);
    }
    if (!(o.pollSeconds > 0)) throw InvalidInput("submit slurm: --poll must be > 0 seconds");
    const std::vector<std::string> frames = expandFrames(o.frames);
    if (frames.empty())
        throw InvalidInput("submit slurm: no frames (give FITS files, directories or @LIST files)");
    const std::string outdir = absolute(o.outdir);
    const SlurmLayout L = slurmLayout(outdir);
    std::error_code ec;
    fs::create_directories(L.statusDir, ec);
    if (ec) throw IoError(L.statusDir + ": cannot create: " + ec.message());

    std::string list;
    for (const auto& f : frames)
        list += f + "\n";
    writeTextFileAtomic(L.frames, list);
    writeTextFileAtomic(L.script, jobScript(o, frames.size(), L, selfExecutable(), outdir));
    fs::permissions(L.script, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                    fs::perm_options::add, ec);

    const std::vector<std::string> sbatch = {"sbatch", "--parsable", L.script};
    if (o.dryRun) {
        std::printf("%s\n", L.script.c_str());
        if (o.verbosity > 0)
            std::fprintf(stderr, "gpuphot: dry run: %zu frames in %s; submit with: sbatch --parsable %s\n",
                         frames.size(), L.frames.c_str(), shellQuote(L.script).c_str());
        return 0;
    }
    ProcessResult r;
    try {
        r = runProcess(sbatch);
    } catch (const IoError& e) {
        throw IoError(std::string(e.what()) +
                      " (is Slurm installed on this host? `gpuphot submit slurm --dry-run` "
                      "writes " +
                      L.script + " without submitting)");
    }
    if (r.exitCode != 0) {
        std::string err = r.err;
        while (!err.empty() && (err.back() == '\n' || err.back() == ' '))
            err.pop_back();
        throw IoError("sbatch " + L.script + " failed (exit " + std::to_string(r.exitCode) +
                      "): " + (err.empty() ? "(no message)" : err));
    }
    std::string jobId = r.out.substr(0, r.out.find_first_of(";\n"));
    jobId.erase(0, jobId.find_first_not_of(" \t"));
    if (jobId.empty() || jobId.find_first_not_of("0123456789") != std::string::npos)
        throw IoError("sbatch " + L.script + ": unexpected output '" + r.out + "' (expected a job id)");
    writeTextFileAtomic(L.jobId, jobId + "\n");
    std::printf("%s\n", jobId.c_str());
    std::fflush(stdout);
    if (o.verbosity > 0)
        std::fprintf(stderr, "gpuphot: submitted Slurm array job %s: %zu frames -> %s (gpuphot status %s)\n",
                     jobId.c_str(), frames.size(), outdir.c_str(), shellQuote(outdir).c_str());
    if (!o.wait) return 0;

    waitForArray(jobId, o.pollSeconds, o.verbosity);
    const OutdirStatus s = collectOutdirStatus(outdir, true);
    printOutdirStatus(s);
    return s.allOk() ? 0 : 1;
}

} // namespace

Command registerSubmit(CLI::App& app) {
    auto o = std::make_shared<SubmitSlurmCli>();
    auto* sub = app.add_subcommand("submit", "Submit frames to a cluster scheduler (one process per image)");
    sub->require_subcommand(1);
    auto* slurm = sub->add_subcommand(
        "slurm",
        "Write and submit an sbatch job array, one element per frame: gpuphot submit slurm FRAMES... "
        "-o OUTDIR [--ref REF] [-- REDUCE_ARGS...]");
    slurm->allow_extras(); // the `--` that separates the reduce arguments (see argumentsAfterDoubleDash)
    slurm->add_option("frames", o->frames, "FITS frames, directories of frames, or @LIST files (one a line)");
    // Never filled (FRAMES takes every positional): its presence keeps CLI11 from handing everything after
    // `--` back to the parent command once FRAMES has its first value.
    slurm->add_option("reduce-args", o->afterDash, "Arguments after -- go to gpuphot reduce verbatim")
        ->group("");
    slurm->add_option("-o,--outdir", o->outdir, "Output directory (shared by the nodes)")->required();
    slurm->add_option("--gpus-per-task", o->gpusPerTask, "GPUs per array element (--gres=gpu:K); 0: none")
        ->check(CLI::NonNegativeNumber);
    slurm->add_option("--partition", o->partition, "Slurm partition");
    slurm->add_option("--max-parallel", o->maxParallel, "At most N elements running at once (--array=...%N)")
        ->check(CLI::NonNegativeNumber);
    slurm->add_option("--time", o->time, "Time limit per element (sbatch --time, e.g. 10:00)");
    slurm->add_option("--cpus-per-task", o->cpusPerTask, "CPUs per element (also the reduce thread count)")
        ->check(CLI::NonNegativeNumber);
    slurm->add_option("--job-name", o->jobName, "Slurm job name")->capture_default_str();
    slurm
        ->add_option("--sbatch-arg", o->sbatchArgs, "Extra #SBATCH option, e.g. --sbatch-arg=--account=astro")
        ->allow_extra_args(false);
    slurm->add_flag("--wait", o->wait, "Wait until the array is done and print the status summary");
    slurm->add_option("--poll", o->pollSeconds, "Seconds between squeue polls with --wait")
        ->capture_default_str();
    slurm->add_flag("--dry-run", o->dryRun,
                    "Write frames.txt and job.sh, print the script's path, do not submit");
    slurm->add_flag_callback(
        "-v,--verbose", [o] { o->verbosity = 2; }, "More output");
    slurm->add_flag_callback(
        "-q,--quiet", [o] { o->verbosity = 0; }, "Only the job id (and the summary)");
    auto group = "Passed to gpuphot reduce";
    slurm->add_option("--ref", o->ref, "Reference catalog")->group(group);
    slurm->add_option("--ref-columns", o->refColumns, "Reference column map")->group(group);
    slurm->add_option("--config", o->config, "JSON file with stage parameters")->group(group);
    slurm->add_option("--targets", o->targets, "Forced photometry positions")->group(group);
    slurm->add_option("--hdu", o->hdu, "HDU by number or EXTNAME")->group(group);
    slurm->add_option("--backend", o->backend, "auto, cpu or cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
        ->group(group);
    slurm->add_option("--gpu-mem-limit", o->gpuMemLimit, "GPU memory limit, e.g. 4G")->group(group);
    slurm->add_option("--threads", o->threads, "CPU threads (default: $SLURM_CPUS_PER_TASK)")->group(group);
    slurm->add_option("--formats", o->formats, "Extra catalog formats: ecsv,csv,reg")
        ->delimiter(',')
        ->allow_extra_args(false)
        ->group(group);
    slurm->add_option("--maps", o->maps, "Maps: bkg,rms,seg,psf,resid")
        ->delimiter(',')
        ->allow_extra_args(false)
        ->group(group);
    addParamFlags(*slurm, o->params, group);
    slurm->add_flag("--no-tycho2", o->noTycho2, "Do not calibrate against Tycho-2 without --ref")
        ->group(group);
    return {sub, [o, slurm] {
                if (!slurm->parsed())
                    throw InvalidInput("submit: name a scheduler (gpuphot submit slurm ...)");
                // allow_extras() is only for the `--`; anything else CLI11 did not know is an error.
                for (const auto& extra : slurm->remaining())
                    if (extra != "--") throw InvalidInput("submit slurm: unknown argument '" + extra + "'");
                return run(*o);
            }};
}

} // namespace gpuphot::cli
