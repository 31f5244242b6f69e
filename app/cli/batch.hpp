#pragma once
// Many frames through `gpuphot reduce` and `gpuphot watch`: the reduce options both share, the input
// list (files, globs, list files, directories), one warm pipeline (FrameReducer), and the local batch
// runner that hands frames to N long-lived child processes of this binary (`reduce --batch-child`).
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/prepare_options.hpp"
#include "app/cli/commands.hpp"

namespace gpuphot {
struct ReduceOptions;
struct ReferenceCatalog;
struct TargetList;
} // namespace gpuphot

namespace gpuphot::cli {

// The options of one frame's reduction (everything `reduce` and `watch` share; not the inputs).
struct ReduceCliOptions {
    CommonOptions common;
    std::string hdu;
    std::vector<std::string> formats, maps;
    std::optional<double> gain, readNoise, saturation, exptime;
    std::optional<double> threshold;
    std::optional<int> minArea;
    std::vector<double> radii;
    std::string reference, refColumns;
    bool noTycho2 = false;
    std::string targets;
    bool writeSolved = false, ignoreHeaderWcs = false;
    std::optional<double> scaleLow, scaleHigh;
    PrepareCliOptions prepare; // --bias --dark --flat --bpm ... (frame preparation)
};

// Adds the common options (addCommonOptions) and every reduce option to `sub`.
void addReduceOptions(CLI::App& sub, ReduceCliOptions& o);
// Configuration (defaults, --config, command-line overrides) and output options; no reference catalog
// or targets (FrameReducer loads those). Throws InvalidInput for inconsistent options.
ReduceOptions toReduceOptions(const ReduceCliOptions& o);

// One warm pipeline: the reduce options, the reference catalog / targets / Tycho-2 index files loaded
// once, and one RunContext kept for every frame (so the CUDA context and memory pool stay warm).
class FrameReducer {
public:
    explicit FrameReducer(const ReduceCliOptions& o); // loads the reference and targets; throws on bad options
    ~FrameReducer();
    FrameReducer(const FrameReducer&) = delete;
    FrameReducer& operator=(const FrameReducer&) = delete;

    // Reduces one frame and returns its status line (frame_status.hpp). A frame whose outputs are
    // complete and newer than it is skipped unless `force`. A bad frame gives a "failed" line (exit_code 2
    // invalid input, 3 I/O, 1 other); only Cancelled propagates.
    nlohmann::json process(const std::string& frame, bool force);
    const ReduceOptions& options() const;
    RunContext& context();

private:
    struct State;
    std::unique_ptr<State> m_state;
};

// Expands the frame arguments: plain files; globs (*, ?, [) expanded here too (for quoted globs);
// `@FILE` list files; directories (their FITS files: .fits .fit .fts, .fz, .gz, sorted by name); and
// `listFile` (--list), one path per line, '#' comments and blank lines ignored, relative paths taken
// relative to the list file's directory. Order kept, duplicates dropped. Throws InvalidInput naming an
// argument that matches nothing (a glob without matches, a missing list file).
std::vector<std::string> expandFrameInputs(const std::vector<std::string>& args, const std::string& listFile = {});

struct BatchOptions {
    int jobs = 0;              // -j N; 0: default (1 per visible GPU with CUDA, else 1 in-process)
    bool force = false;        // --force: redo frames whose outputs are complete
    std::string jsonl;         // --jsonl FILE ("" : OUTDIR/gpuphot.jsonl when more than one frame)
    std::vector<std::string> childArgs; // the reduce options for the children (reproduceArgs)
    bool threadsGiven = false; // --threads was given (else each CPU child gets cores / N)
};

// Reduces `frames` (in-process with one frame or when one worker suffices, else with N child processes),
// appends one status line per frame to the JSONL file, shows progress and a summary table. Returns 0
// when every frame was reduced or skipped, 1 when any failed, 4 when all were reduced but some could not
// be calibrated. With a single frame that fails the CLI's exit code for the error (2, 3 or 1).
int runBatch(const std::vector<std::string>& frames, const ReduceCliOptions& o, const BatchOptions& b);

// `reduce --batch-child`: reads frame paths on stdin, one per line, and answers one JSON status line per
// frame on stdout (everything else the pipeline prints goes to stderr). Returns at end of input.
int runBatchChild(const ReduceCliOptions& o);

// The parsed options of `sub` as command-line arguments (`--name=value`, flags repeated per count),
// leaving out positionals and the options named in `exclude` (any of their names, e.g. "--jsonl").
std::vector<std::string> reproduceArgs(const CLI::App& sub, const std::set<std::string>& exclude);

// The human line for a status line ("frame: 123 sources, FWHM 2.31 px, zp ..., 0.42 s -> cat").
std::string describeStatus(const nlohmann::json& line);
// The summary table (frame, status, sources, FWHM, zp, astrometric rms, seconds) and the totals.
void printSummaryTable(std::FILE* out, const std::vector<nlohmann::json>& lines, double wallSeconds);
// 0 all ok/skipped, 1 any failed, 4 all reduced but some uncalibrated.
int batchExitStatus(const std::vector<nlohmann::json>& lines);

} // namespace gpuphot::cli
