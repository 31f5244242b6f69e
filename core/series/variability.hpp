#pragma once
// Variability and detrending of light curves (`gpuphot series --variability --detrend ...`, the
// workbench's light-curve panel): a variability index per star (Stetson J and the reduced chi^2 of a
// constant), the flag that keeps variables out of every ensemble, a Lomb-Scargle periodogram, and a
// linear decorrelation of a differential curve against airmass, FWHM, sky and position.
#include <cmath>
#include <string>
#include <vector>

namespace gpuphot {

struct LightCurve;

struct VariabilityParams {
    // --- optional, with sensible defaults ---------------------------------------------------------
    double stetsonJ = 0.8;   // a star whose Stetson J exceeds this is flagged variable ...
    double chi2 = 5.0;       // ... and so is one whose reduced chi^2 about a constant exceeds this
    double minPeriod = 0.01; // d: the periodogram's shortest period (~15 min)
    double maxPeriod = 0.0;  // d: its longest (0: half the series' time span)
    int oversample = 10;     // frequency grid: this many points per 1/T
};

// Stetson (1996) J of one curve (no pairing: each point its own pair), from values and their errors
// (non-finite or non-positive errors are left out). NaN with fewer than 3 points.
double stetsonJ(const std::vector<double>& value, const std::vector<double>& err);
// The reduced chi^2 of the values about their weighted mean. NaN with fewer than 2 points.
double chi2Constant(const std::vector<double>& value, const std::vector<double>& err);
// A star is variable when either index passes its bar.
bool isVariable(double stetsonJ, double chi2, const VariabilityParams& p);

// The generalised (floating-mean, error-weighted) Lomb-Scargle periodogram of Zechmeister & Kuerster
// (2009), normalised to [0, 1], on a grid uniform in frequency.
struct Periodogram {
    std::vector<double> frequency; // 1/d
    std::vector<double> power;
    double bestPeriod = NAN; // d, refined between grid points (parabola through the peak)
    double bestPower = NAN;
    double falseAlarm = NAN; // probability of the peak from noise (Baluev 2008 approximation)
};
// Times in days (any zero point), values and errors; points with a non-finite value, time or error are
// left out. Throws InvalidInput for a period range that is empty or finer than the data can tell.
Periodogram lombScargle(const std::vector<double>& time, const std::vector<double>& value,
                        const std::vector<double>& err, const VariabilityParams& p = {});
// The false-alarm probability of a peak of that power on a grid up to maxFrequency (1/d) for these times and
// errors: Baluev (2008) eq. 6, as astropy's LombScargle.false_alarm_probability(method="baluev").
double baluevFalseAlarm(double power, double maxFrequency, const std::vector<double>& time,
                        const std::vector<double>& err);

// Decorrelation terms: "airmass", "fwhm", "sky", "x", "y" (the LightCurve's columns of that name), and
// "time" (a linear drift).
const std::vector<std::string>& detrendTerms();
struct Detrend {
    std::vector<std::string> terms;
    std::vector<double> coef, coefErr; // per term: d(rel_flux)/d(term - its median), with 1-sigma errors
    double rmsBefore = NAN, rmsAfter = NAN;
    int points = 0;
};
// Fits rel_flux = 1 + sum_k c_k (term_k - median_k) by weighted least squares over the points with
// finite values (5-sigma clipped once), and divides the fitted trend out of `curve` (relFlux,
// relFluxErr, diffMag, mag; rms recomputed). Throws InvalidInput naming an unknown term; a curve with
// fewer points than terms + 2 is left as it was (points = 0).
Detrend detrend(LightCurve& curve, const std::vector<std::string>& terms);

// A transit or eclipse: a symmetric trapezoid dip, found blind (mid-time and duration searched over the
// series, depth and baseline linear) and refined. Times in days on the curve's own scale (BJD_TDB).
struct TransitFit {
    bool found = false;                 // a dip with snr >= minSnr that the series covers
    double depth = NAN, depthErr = NAN; // fractional flux loss at mid-transit, 1 sigma
    double mid = NAN, midErr = NAN;     // d
    double duration = NAN;              // d, first to last contact
    double ingress = NAN;               // ingress (and egress) as a fraction of the duration
    double baseline = NAN;              // out-of-transit level of the curve
    double snr = NAN;                   // depth / depthErr
    double chi2 = NAN;                  // reduced chi^2 of the fitted model
    bool covered = false;          // both contacts observed (points in or before the ingress and in or after
                                   // the egress) and mid within the series: a dip the series only half
                                   // covers is fitted but not found, its mid-time being undetermined
    int points = 0, inTransit = 0; // usable points; points between first and last contact
};
struct TransitSearch {
    double minDuration = 0.02; // d (~30 min)
    double maxDuration = 0.0;  // d (0: half the series' span)
    double minSnr = 7.0;
};
// Points with a non-finite time, value or error, or an error <= 0, are left out; with fewer than 10 nothing
// is fitted. Throws InvalidInput for an empty or impossible duration range (minDuration <= 0, maxDuration
// below it, or a series too short for minDuration: its span, or half of it with maxDuration 0).
TransitFit fitTransit(const std::vector<double>& time, const std::vector<double>& value,
                      const std::vector<double>& err, const TransitSearch& search = {});
// The fitted model at time t (baseline * (1 - depth * shape)); the baseline where nothing was found.
double transitModel(const TransitFit& fit, double t);

} // namespace gpuphot
