#pragma once
// Light curves from a night of reduced frames (`gpuphot series`).
//
// The frames' catalogs (gpuphot's .cat.fits, each with its fitted WCS, MJD-MID and photometry) are
// cross-identified on the sky into one source list; every target gets an ensemble of comparison stars
// chosen automatically and vetted by their own differential curves; its differential light curve comes
// with honest errors and with BJD_TDB / HJD_UTC times. Frames that do not belong (another field or filter,
// no WCS, no time, unreadable) are reported and left out; the series goes on.
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/target_list.hpp"
#include "core/series/barycentric.hpp"
#include "core/series/variability.hpp"

namespace gpuphot {

struct SeriesParams {
    // --- optional, with sensible defaults ---------------------------------------------------------
    std::string flux = "opt";       // catalog flux: "opt" (S/N-optimal, corrected to total), "aper_K" (the
                                    // K-th fixed or FWHM-scaled aperture of the reduction), "psf" or "auto"
    double matchRadius = 1.5;       // arcsec: a detection is a listed source within this distance
    double minFieldMatch = 0.3;     // a frame whose detections match the source list less than this is of
                                    // another field (after the first frame)
    std::string filter;             // frames of another FILTER are left out; "": the first frame's filter
    double minCoverage = 0.9;       // a comparison star is measured (unflagged) in at least this fraction
    double isolation = 8.0;         // arcsec: no listed source brighter than 1/10 of a comparison this close
    double maxMagDiff = 2.0;        // mag: comparison stars within this of the target (relaxed when too few)
    std::string reference;          // reference catalog with a colour (FITS/CSV/ECSV; "": no colours)
    std::string referenceColumns;   // its columns as for reduce --ref-columns ("color=BP-RP", ...)
    double maxColourDiff = 0.5;     // mag: with colours, comparison stars within this of the target's
                                    // colour first (relaxed when too few)
    int ensembleSize = 12;          // comparison stars per target: the nearest suitable ones
    int minEnsemble = 3;            // fewer suitable comparison stars: no light curve, reported
    double vetRatio = 1.6;          // a comparison whose differential scatter over its expected noise exceeds
                                    // this many times the ensemble's median ratio is dropped (variable)
    double telescopeDiameter = 0.0; // m: Young's scintillation estimate in the errors (0: left out)
    std::optional<ObservingSite> site; // the observatory when the catalogs do not say (SITELAT, OBSGEO-*)
    std::vector<std::string> pinned;   // comparison stars to use (target-list names resolved to sources)
    std::vector<std::string> excluded; // stars never to use as comparisons
    bool allStars = false;             // also the light curve of every source measured in minCoverage of the
                                       // frames (each with its own ensemble), in one table
    std::vector<std::string> detrend;  // terms (detrendTerms()) each target's curve is decorrelated against
    VariabilityParams variability;     // the bars of the variable flag; the periodogram's period range
    bool findVariables = false;        // stars whose curves the flag marks are kept out of every ensemble,
                                       // and each target (and flagged star) gets a Lomb-Scargle periodogram
    bool fitTransits = false;          // each target's (detrended) curve gets a blind transit fit
    TransitSearch transit;             // its duration range and detection bar
    // --- internal -------------------------------------------------------------------------------
    int vetIterations = 20; // at most this many comparison stars dropped per target
    double clipSigma = 5.0; // differential points this far out (MAD sigma) do not enter the scatter
};

// Throws InvalidInput naming the first unusable field.
void validate(const SeriesParams& p);
// Every field, as recorded in the report and compared by an append.
nlohmann::json toJson(const SeriesParams& p);

// One catalog row of a source in one frame.
struct SeriesMeasurement {
    float flux = NAN, err = NAN, x = NAN, y = NAN, sky = NAN, magCal = NAN;
    std::int32_t flags = 0;
    bool good() const { return std::isfinite(flux) && flux > 0.0f && std::isfinite(err); }
    bool comparable() const; // good, and none of the flags that keep a star out of an ensemble
};

struct SeriesFrame {
    std::string path;
    std::string sourceFrame; // the reduced frame the catalog was made from (its SRCFILE; "": not said)
    double mjdMid = 0.0, exptime = 0.0, airmass = 0.0, fwhm = 0.0, zeroPoint = 0.0;
    std::string filter, object;
    std::optional<ObservingSite> site;
    std::size_t detections = 0, matched = 0;
    bool used = false;
    std::string problem; // why it was left out ("" when used)
};

struct SeriesSource {
    double ra = 0.0, dec = 0.0; // deg, mean of the matched detections
    int frames = 0;             // frames it was detected in
    double medianFlux = 0.0;    // over those frames
    double medianMagCal = 0.0;  // NaN when no frame was calibrated
    double colour = NAN;        // from SeriesParams::reference (NaN: none)
};

// One comparison star of a target's ensemble.
struct EnsembleStar {
    std::size_t source = 0;
    double weight = 0.0;   // 1 / scatter^2 (normalised to sum 1)
    double scatter = 0.0;  // RMS of its own differential curve (fraction)
    double expected = 0.0; // the RMS its errors predict
    bool dropped = false;  // vetted out
    std::string why;       // "variable", "pinned", ...
};

struct LightCurve {
    std::string name;
    double ra = 0.0, dec = 0.0; // the target's position (deg)
    long source = -1;           // row of the source list (-1: off every frame)
    std::string problem;        // why there is no curve ("" when there is)
    std::vector<EnsembleStar> ensemble;
    // One row per used frame, in time order.
    std::vector<std::size_t> frame;
    std::vector<double> bjdTdb, hjdUtc, jdUtc, airmass, exptime;
    std::vector<double> flux, fluxErr;             // the target's flux (ADU) and its error
    std::vector<double> ensembleFlux, ensembleErr; // the ensemble's normalised flux (~1) and its error
    std::vector<double> relFlux, relFluxErr;       // flux / ensemble, normalised to a median of 1
    std::vector<double> diffMag, diffMagErr;       // -2.5 log10(relFlux)
    std::vector<double> mag, magErr;               // calibrated: median mag_cal + diffMag (NaN uncalibrated)
    std::vector<double> x, y, sky, fwhm;
    std::vector<int> flags, detected, nComparison;
    double rms = 0.0;       // RMS of relFlux over the detected points
    double medianErr = 0.0; // median relFluxErr
    // Of the (detrended) relFlux: the variability indices and the flag (SeriesParams::variability).
    double stetsonJ = NAN, chi2 = NAN; // chi2: reduced, about the weighted mean
    bool variable = false;
    // SeriesParams::findVariables: the periodogram's peak (NaN otherwise).
    double bestPeriod = NAN, bestPower = NAN, falseAlarm = NAN; // d, [0, 1], probability
    Detrend detrendFit; // SeriesParams::detrend: the fitted coefficients (no terms: not detrended)
    TransitFit transit; // SeriesParams::fitTransits: the transit fitted on bjdTdb and relFlux (not fitted:
                        // points 0)
};

// The light curve of one source of the series in the all-stars table (compact: 10^4 stars x 10^3 frames).
struct StarCurve {
    std::size_t source = 0;
    int comparisons = 0;                       // active stars of its ensemble (0: no curve)
    int points = 0;                            // frames with a measurement
    double rms = NAN, medianErr = NAN;         // of rel_flux
    double chi2 = NAN;                         // reduced chi^2 about 1 (variability)
    double stetsonJ = NAN;                     // Stetson J of rel_flux (variability.hpp)
    bool variable = false;                     // flagged by isVariable (findVariables: no comparison star)
    double bestPeriod = NAN, falseAlarm = NAN; // findVariables, flagged stars: the periodogram's peak (d)
    std::vector<float> relFlux, relFluxErr;    // per used frame (NaN: not measured)
};

// What a later call needs to append frames without reading the earlier ones again: the source list,
// the frames, and for each target the measurements of its own source and of its comparison candidates.
struct SeriesState {
    std::string fingerprint; // the parameters and targets it was built with
    std::string filter;
    double ra0 = 0.0, dec0 = 0.0;      // tangent point of the source list
    std::vector<double> xiSum, etaSum; // arcsec, sums of the matched positions per source
    std::vector<int> matched;          // detections summed per source
    std::vector<double> medianFlux, medianMagCal;
    std::vector<SeriesFrame> frames;          // every catalog seen, in time order
    std::vector<std::size_t> used;            // indices into frames of the used ones, in time order
    std::vector<ObserverEphemeris> observers; // per used frame
    struct Target {
        std::vector<std::size_t> sources; // [0] the target's own, then its comparison candidates
        std::vector<std::string> notes;   // per candidate ("pinned", ...)
        std::vector<std::vector<SeriesMeasurement>> meas; // [used frame][k]
    };
    std::vector<Target> targets; // per target-list entry (no sources: off every frame)
};

struct SeriesResult {
    SeriesParams params;
    std::vector<SeriesFrame> frames; // every input, in time order (the used ones and the left-out ones)
    std::vector<std::size_t> used;   // indices into frames of the used ones, in time order
    std::vector<ObserverEphemeris> observers; // per used frame
    std::vector<SeriesSource> sources;
    std::vector<LightCurve> curves; // one per target, in target-list order
    std::vector<StarCurve> stars;   // params.allStars: every well-covered source
    std::vector<std::string> warnings;
    std::string filter;
    SeriesState state;     // for appendSeries
    bool appended = false; // made by appendSeries
};

using SeriesProgress = std::function<void(std::size_t done, std::size_t total)>;

// Builds the series from catalogs. `progress(done, total)` while the catalogs are read. Throws
// InvalidInput when no catalog is usable (the message lists why each was left out).
SeriesResult buildSeries(const std::vector<std::string>& catalogs, const TargetList& targets,
                         const SeriesParams& params, const SeriesProgress& progress = {});

// Adds catalogs not yet in `state` to it and recomputes the targets' curves (their ensembles chosen at
// the build are vetted again). nullopt when the state cannot serve: other parameters or targets, all
// stars wanted, or a target without a source that the new frames detect. The state is updated only when a
// result is returned.
std::optional<SeriesResult> appendSeries(SeriesState& state, const std::vector<std::string>& catalogs,
                                         const TargetList& targets, const SeriesParams& params,
                                         const SeriesProgress& progress = {});
// The same with the state moved into the result (no copy of it is made; nullopt leaves it unspecified).
std::optional<SeriesResult> appendSeries(SeriesState&& state, const std::vector<std::string>& catalogs,
                                         const TargetList& targets, const SeriesParams& params,
                                         const SeriesProgress& progress = {});

// The fingerprint an append compares: parameters and targets.
std::string seriesFingerprint(const TargetList& targets, const SeriesParams& params);

// Forced photometry at every listed source: a targets file (reduce --targets) of the user's targets, then
// each source of the state's list at its mean position, named sourceTargetName(s). Where a source was not
// detected, buildSeries and appendSeries take the STEM.targets.fits row of that name.
inline constexpr const char* kSourceTargetPrefix = "series_src";
std::string sourceTargetName(std::size_t s); // "series_src1" for source 0
// Writes that file as CSV (name, ra, dec; atomically); throws IoError when it cannot.
void writeSourceTargets(const SeriesState& state, const TargetList& targets, const std::string& path);

} // namespace gpuphot
