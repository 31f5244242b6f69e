#pragma once
// Many frames through `gpuphot reduce` and `gpuphot watch`: the reduce options both share, the input
// list (files, globs, list files, directories), one warm pipeline (FrameReducer), and the local batch
// runner that hands frames to N long-lived child processes of this binary (`reduce --batch-child`).
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/commands.hpp"
#include "app/cli/param_flags.hpp"
#include "app/cli/prepare_options.hpp"

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
    ParamFlagValues params; // --threshold --aper --gain ... (app/cli/param_flags.hpp)
    std::string reference, refColumns;
    bool noTycho2 = false;
    std::string targets;
    bool writeSolved = false, ignoreHeaderWcs = false;
    PrepareCliOptions prepare;            // --bias --dark --flat --bpm ... (frame preparation)
    std::string sex;                      // --sex FILE: a SExtractor configuration (docs/SEXTRACTOR.md)
    std::vector<std::string> sexSettings; // KEY=value: SExtractor's -KEY value overrides (main rewrites them)
    std::string param;                    // --param FILE: SExtractor output parameters (PARAMETERS_NAME)
    bool sexPerFrameNames = false;        // several frames: each SExtractor catalog is STEM.CATALOG_NAME
    int prefetch = 1;   // --prefetch N: frames read ahead of the one in its stages (0: one at a time)
    int concurrent = 1; // --concurrent K: frames in their stages at once, each with its own RunContext
    int ccdsAtOnce =
        0; // --ccds-at-once K: a mosaic's CCDs in their stages at once (ExposureParams::concurrent)
    int ccdGpus = 0; // --ccd-gpus G: the GPUs a mosaic's CCDs are spread over (ExposureParams::gpus)
};

// Adds the common options (addCommonOptions) and every reduce option to `sub`.
void addReduceOptions(CLI::App& sub, ReduceCliOptions& o);
// Configuration (defaults, --config, command-line overrides) and output options; no reference catalog
// or targets (FrameReducer loads those). Throws InvalidInput for inconsistent options.
ReduceOptions toReduceOptions(const ReduceCliOptions& o);

// One frame for FrameReducer / FramePipeline.
struct FrameTask {
    std::string frame;
    bool force = false; // reduce even when its outputs are complete
    // The options of this frame (`gpuphot worker`: per job); null: the reducer's, with Tycho-2 cut per frame.
    std::shared_ptr<const ReduceOptions> options;
    // A status line already decided by the caller (e.g. a job without a frame): passed through in order.
    std::optional<nlohmann::json> line;
};

// One warm pipeline: the reduce options, the reference catalog / targets / Tycho-2 index files loaded
// once, and one RunContext kept for every frame (so the CUDA context and memory pool stay warm).
class FrameReducer {
public:
    explicit FrameReducer(
        const ReduceCliOptions& o); // loads the reference and targets; throws on bad options
    ~FrameReducer();
    FrameReducer(const FrameReducer&) = delete;
    FrameReducer& operator=(const FrameReducer&) = delete;

    // Reduces one frame and returns its status line (frame_status.hpp). A frame whose outputs are
    // complete and newer than it is skipped unless `force`. A bad frame gives a "failed" line (exit_code 2
    // invalid input, 3 I/O, 1 other); only Cancelled propagates.
    nlohmann::json process(const std::string& frame, bool force);
    nlohmann::json process(FrameTask task);
    const ReduceOptions& options() const;
    RunContext& context();
    // A fresh RunContext made from the same options as context() (backend, threads, --gpu-mem-limit), with
    // context()'s progress and cancellation hooks; its CUDA stream and memory pool are its own (created on
    // first use, on GPU `device` when it is set: RunContext::device). For FramePipeline's extra compute
    // threads and a mosaic's CCDs.
    RunContext makeContext(int device = -1) const;

    // process() in its three phases (for FramePipeline); a phase that fails, or finds the frame skipped,
    // decides the frame's status line and the later phases pass it through. load: skip check, Tycho-2
    // cut, read (host and files only: any thread); compute: the stages with this reducer's RunContext
    // (one thread at a time); write: the outputs (host and files only: any thread). Only Cancelled
    // propagates.
    struct Work;
    std::unique_ptr<Work> load(FrameTask task);
    void compute(Work& work);
    // The same with another RunContext (one of makeContext()'s): several frames may be in this phase at once
    // on different threads, each thread with its own context. The shared inputs (options, reference
    // catalog, targets, master frames) are only read (the masters' median cache takes a lock).
    void compute(Work& work, RunContext& ctx);
    // What compute left of the frame's reduction: the host-only end of the calibration, the catalog table
    // and the report (reduce.hpp, finishFramePhase); no RunContext: any thread, while the context that
    // computed it takes the next frame.
    void finish(Work& work);
    nlohmann::json write(Work& work);

private:
    void readCatalogs(const ReduceCliOptions& o); // targets, reference (or Tycho-2's files)
    struct State;
    std::unique_ptr<State> m_state;
};

// Frames through one FrameReducer with their phases overlapped: a reader thread reads and decodes up to
// `prefetch` frames ahead of the one in its stages (which run on a thread of their own with the reducer's
// RunContext), and a writer thread writes the outputs of the frame before, still through the atomic
// temporary+rename path. `done` receives each frame's status line, in submission order, on the writer
// thread, after the frame's outputs are complete. The catalogs are the bytes the sequential reducer
// writes. `concurrent` K > 1: K compute threads take the loaded frames in order, each with a RunContext of
// its own (the reducer's, then makeContext()'s: own CUDA stream and pool, the GPU shared), so the host
// parts of K frames' stages overlap. K finishing threads do what a frame's stages leave to the host
// (FrameReducer::finish: on the CUDA backend the end of the calibration, the catalog table and the report)
// while its compute thread takes the next frame; at most K + 1 frames wait between the stages and the
// writer, which takes them in submission order. Up to prefetch + K - 1 frames wait ahead of the stages
// (K = 1: `prefetch`). prefetch 0 and K 1: no threads, each frame runs start to end inside submit().
class FramePipeline {
public:
    using Done = std::function<void(std::size_t ticket, nlohmann::json line)>;
    FramePipeline(FrameReducer& reducer, int prefetch, Done done, int concurrent = 1);
    ~FramePipeline(); // abandons frames not yet written (a frame being written is finished first)
    FramePipeline(const FramePipeline&) = delete;
    FramePipeline& operator=(const FramePipeline&) = delete;

    // Queues a frame and returns its ticket (0, 1, ... in submission order); blocks while prefetch + K - 1
    // frames wait ahead of the stages.
    std::size_t submit(FrameTask task);
    bool full() const;            // submit() would block now
    std::size_t inFlight() const; // submitted, line not yet delivered
    bool failed() const;          // a phase threw Cancelled (or the callback threw): finish() rethrows it
    // Waits until every submitted frame's line is delivered; rethrows Cancelled (or an internal error).
    void finish();
    // A stop: the frames already in their stages, or being written, are finished and their lines
    // delivered; the frames still waiting ahead of the stages (queued, being read or read) are dropped,
    // and their lines never come. Rethrows as finish() does.
    void finishStarted();

private:
    struct Impl;
    std::unique_ptr<Impl> m;
};

// Expands the frame arguments: plain files; globs (*, ?, [) expanded here too (for quoted globs);
// `@FILE` list files; directories (their FITS files: .fits .fit .fts, .fz, .gz, sorted by name); and
// `listFile` (--list), one path per line, '#' comments and blank lines ignored, relative paths taken
// relative to the list file's directory. Order kept, duplicates dropped. Throws InvalidInput naming an
// argument that matches nothing (a glob without matches, a missing list file).
std::vector<std::string> expandFrameInputs(const std::vector<std::string>& args,
                                           const std::string& listFile = {});

struct BatchOptions {
    int jobs = 0;                       // -j N; 0: default (1 per visible GPU with CUDA, else 1 in-process)
    bool force = false;                 // --force: redo frames whose outputs are complete
    std::string jsonl;                  // --jsonl FILE ("" : OUTDIR/gpuphot.jsonl when more than one frame)
    std::vector<std::string> childArgs; // the reduce options for the children (reproduceArgs)
    bool threadsGiven = false;          // --threads was given (else each CPU child gets cores / N)
    std::string db;                     // --db URL: each reduced frame also stored there (app/cli/db_cli.hpp)
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
