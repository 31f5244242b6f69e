#pragma once
// Wires the stages for one frame. Stages are pure functions; the pipeline chooses their inputs
// (instrument facts, FWHM from the PSF stage for FWHM-scaled apertures), keeps their results, and can
// re-run from the first stage a parameter change affects (the workbench does that on every edit).
#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/pipeline_config.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/astrometry/astrometry.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/psf/psf.hpp"
#include "core/stages/zeropoint/zeropoint.hpp"

namespace gpuphot {

struct Frame;
struct ReferenceCatalog;
class RunContext;
class Wcs;

enum class Stage { Background = 0, Detection = 1, Psf = 2, Aperture = 3, Calibration = 4, Done = 5 };
const char* stageName(Stage s);

struct PipelineResult {
    BackgroundResult background;
    DetectionResult detection;
    PsfResult psf;
    ApertureResult aperture;
    AstrometryResult astrometry;          // stage 7 (ok = false when it did not run or failed)
    std::shared_ptr<const Wcs> fittedWcs; // the verified fitted WCS (null when none)
    CrossmatchResult crossmatch; // empty unless a reference catalog was given and the frame has a WCS
    ZeroPointResult zeropoint;
    bool calibrationRan = false;    // crossmatch and zero point were attempted
    std::string calibrationProblem; // why there is no zero point ("" when zeropoint.ok)
    // Instrumental magnitudes used for the zero point and mag_cal: -2.5 log10(flux_opt), per source.
    std::vector<double> magInst, magInstErr;
    double fwhm = 0.0;      // px used to scale apertures: the PSF model's median, else the config default
    std::string fwhmSource; // "psf" or "default"
    std::vector<std::string> warnings;
    Stage completed = Stage::Background; // first stage whose result is not valid

    // Set by the caller before a run. false (CPU backend): background.level/rms stay empty; the result
    // keeps the mesh grid and background.sampler, whose exact on-demand values every stage and output
    // uses instead (8 B/px less, the run's peak host memory stays under 4x the frame's float size).
    // true: full-resolution maps (the workbench shows them; the CUDA backend always builds them).
    // The catalog is bitwise the same either way.
    bool keepFullMaps = false;
    // Optional, set by the caller (the workbench's worker, across runs): per-star PSF fits reused where
    // every input is bitwise the same (core/stages/psf/psf.hpp PsfFitCache; CPU backend). Results unchanged.
    std::shared_ptr<PsfFitCache> psfFitCache;
    // Set by the caller before a run (the workbench's worker, CPU backend): the detection keeps the images
    // it thresholds (detectionImages, ~9 B/px) and a later run on this result with another threshold
    // thresholds them again instead of making them anew. Results unchanged.
    bool keepDetectionImages = false;
    std::shared_ptr<const cpu::DetectionInputImages> detectionImages; // made with this result's background
};

// Runs every stage from `first` on (earlier results in `result` are reused and must be valid). The
// calibration stages run when `reference` is given (and are skipped, with calibrationProblem saying
// why, when the frame has no WCS).
void runPipeline(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& result,
                 Stage first = Stage::Background, const ReferenceCatalog* reference = nullptr);
PipelineResult runPipeline(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                           const ReferenceCatalog* reference = nullptr);

// runPipeline for the stages [first, stop) only: result.completed is then `stop` (or earlier when `first`
// was), and a later runPipeline from `stop` continues the run as if it had not paused (the workbench
// stops at Stage::Psf to show a provisional result first).
void runPipelineUntil(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                      PipelineResult& result, Stage first, Stage stop,
                      const ReferenceCatalog* reference = nullptr);

// The calibration of a run stopped before it by runPipelineToCalibration: already under way on a host
// thread (the CUDA backend starts the astrometry and the reference match beside the device stages), or not
// started. Destroying an unfinished one abandons it and waits for its thread.
class PendingCalibration {
public:
    PendingCalibration();
    ~PendingCalibration();
    PendingCalibration(PendingCalibration&&) noexcept;
    PendingCalibration& operator=(PendingCalibration&&) noexcept;
    // Whether finishing it takes the host only: the astrometry and the reference match run beside, and
    // the zero point is a host fit. Then finishCalibration may run on another thread, with a context that
    // has no device state, while the run's context takes the next frame.
    bool hostOnly() const;

    struct Impl;

private:
    friend PendingCalibration runPipelineToCalibration(const Frame&, const PipelineConfig&, RunContext&,
                                                       PipelineResult&, const ReferenceCatalog*);
    friend void finishCalibration(const Frame&, const PipelineConfig&, RunContext&, PipelineResult&,
                                  const ReferenceCatalog*, PendingCalibration);
    std::unique_ptr<Impl> m;
};

// runPipeline's stages from the background to the apertures with `ctx`; the calibration is left pending.
// `frame`, `config`, `result` and `reference` must stay where they are until it is finished or destroyed
// (a thread may be reading them). runPipelineToCalibration then finishCalibration gives runPipeline's
// result bit for bit, and the same stage records in the same order.
PendingCalibration runPipelineToCalibration(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                                            PipelineResult& result, const ReferenceCatalog* reference);
// The calibration stage (stage 5) of such a run, with `ctx`: the run's, or a host context when
// pending.hostOnly() (its records receive the calibration's).
void finishCalibration(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                       PipelineResult& result, const ReferenceCatalog* reference, PendingCalibration pending);

// An earlier PSF model applied to a new source list (a provisional result): the model (spatial
// polynomials, ePSF grid, median FWHM) as it was; per source the model's FWHM, ellipticity and angle at the
// new positions; PSF fluxes NaN (not measured) and no PSF-star flags (the stars belong to the old list).
PsfResult psfModelForSources(const PsfResult& model, const Sources& sources);

// The workbench's provisional result after a re-detection (ui/pipeline_worker.cpp; bench/bench_rerun.cpp):
// `detected` holds `config`'s stages up to the detection (completed >= Stage::Psf, e.g. runPipelineUntil
// to Stage::Psf); `previous` is an earlier complete result on the same frame. Returns the background and
// detection of `detected` (copied), previous's PSF model on the new sources (psfModelForSources), its
// FWHM and its curve of growth (aperture corrections; ApertureParams::givenCurve), and the aperture and
// calibration stages of `config` measured with them (completed == Done); the
// calibration keeps previous's astrometric solution when it has one (its per-match lists left empty) and
// matches the new sources through it. Stage timings go to ctx.records ("provisional psf", "aperture",
// "provisional copy", then calibration).
PipelineResult provisionalResult(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                                 const PipelineResult& detected, const PipelineResult& previous,
                                 const ReferenceCatalog* reference = nullptr);
// The same, moving the background and detection out of `detected` instead of copying them (the detection's
// Sources columns; its segmentation map is shared by copies anyway): for a caller that no longer needs them.
PipelineResult provisionalResult(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                                 PipelineResult&& detected, const PipelineResult& previous,
                                 const ReferenceCatalog* reference = nullptr);

// The first per-source column, as "name[index]" (or "name: sizes differ"), in which the detection's Sources
// or the aperture stage's columns (fluxes, errors, flags, sky, Kron, optimal, corrections) of two results
// differ in any bit; "" when they are bitwise the same. For checks of re-runs and provisional results.
std::string firstPhotometryDifference(const PipelineResult& a, const PipelineResult& b);

// The first stage whose inputs differ between two configs (Done when nothing changed).
Stage firstAffectedStage(const PipelineConfig& before, const PipelineConfig& after);

} // namespace gpuphot
