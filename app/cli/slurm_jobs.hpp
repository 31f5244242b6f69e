#pragma once
// What `gpuphot submit slurm` and `gpuphot status` share: running Slurm's command-line tools without a
// shell (sbatch/squeue/sacct/scontrol, never libslurm: sites run many Slurm versions), the layout of
// OUTDIR/slurm/, and the collection of per-frame JSON status lines.
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpuphot::cli {

// OUTDIR/slurm/ as `submit slurm` writes it.
struct SlurmLayout {
    std::string dir;       // OUTDIR/slurm
    std::string frames;    // frames.txt: one absolute frame path a line; array element i reduces line i+1
    std::string script;    // job.sh: the sbatch script
    std::string jobId;     // job_id: the array job id sbatch printed
    std::string statusDir; // status/: one JSONL file per array element (JOBID_TASK.jsonl)
};
SlurmLayout slurmLayout(const std::string& outdir);

struct ProcessResult {
    int exitCode = -1; // the program's exit status; 128+N when killed by signal N
    std::string out, err;
};
// Runs argv[0] (looked up on PATH) with the given arguments through posix_spawnp, no shell involved,
// capturing stdout and stderr. Throws IoError "PROGRAM: not found on PATH" when it cannot be started.
ProcessResult runProcess(const std::vector<std::string>& argv);

// `s` quoted for a POSIX shell (single quotes; embedded single quotes as '\'').
std::string shellQuote(const std::string& s);

// Slurm's array task expression ("3", "0-7", "0-7%2", "[1,3-5]") as the task ids it names.
std::vector<long> expandTaskIds(const std::string& expr);

// One array element as Slurm reports it.
struct SlurmTaskState {
    std::string state;    // PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...
    std::string exitCode; // "code:signal" as sacct/scontrol print it
};
// The elements of array job `jobId` by task id: from sacct when accounting is enabled, otherwise from
// `scontrol show job` (which knows finished jobs for MinJobAge seconds). `source` receives "sacct",
// "scontrol" or "" (neither answered). Never throws for a Slurm error; a missing tool gives an empty map.
std::map<long, SlurmTaskState> querySlurmArray(const std::string& jobId, std::string* source = nullptr);

// True while squeue still lists any element of array job `jobId`. Throws IoError when squeue is missing.
bool slurmArrayActive(const std::string& jobId);

// The collected state of OUTDIR: frames.txt, the JSON lines (OUTDIR/slurm/status/*.jsonl and
// OUTDIR/gpuphot.jsonl; the latest line per frame wins) and, for frames without a line, what Slurm says.
struct FrameState {
    std::string frame;   // absolute path
    std::string status;  // ok, failed, skipped (outputs were complete) or missing (no line)
    nlohmann::json line; // the winning JSON line (null when missing)
    std::string slurm;   // Slurm's state for a missing frame with a known array element ("" otherwise)
};
struct OutdirStatus {
    std::vector<FrameState> frames; // frames.txt order, then frames only seen in the JSON lines
    std::size_t ok = 0, failed = 0, skipped = 0, missing = 0; // skipped is counted in ok too
    std::size_t malformedLines = 0;
    std::string jobId;       // from OUTDIR/slurm/job_id, "" without one
    std::string slurmSource; // "sacct", "scontrol" or ""
    bool allOk() const { return !frames.empty() && failed == 0 && missing == 0; }
    nlohmann::json toJson() const;
};
OutdirStatus collectOutdirStatus(const std::string& outdir, bool askSlurm = true);
// Prints the table (frame, status, sources, zp, rms, seconds), the errors and the totals to stdout.
void printOutdirStatus(const OutdirStatus& s);

} // namespace gpuphot::cli
