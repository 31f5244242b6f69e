#pragma once
// A simulated night: N exposures of one field with known truth, for the time-series work (`gpuphot
// simulate --series N`). Each exposure is simulateField with the field seed fixed and its own noise seed,
// pointing jitter, airmass (extinction), transparency, seeing and scintillation, and two injected
// variables: a transit (trapezoid of given depth and duration) and a sinusoid.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/sim/sim_params.hpp"

namespace gpuphot {

class RunContext;

struct SimSeriesParams {
    int frames = 300;          // exposures
    double cadence = 60.0;     // s between exposure starts (the exposure time is the field's exptime)
    double airmassStart = 1.0; // airmass of the first exposure; it changes linearly to airmassEnd
    double airmassEnd = 2.0;
    double extinction = 0.15;       // mag per airmass
    double colourExtinction = 0.0;  // mag per airmass per mag of colour (second-order extinction): a star
                                    // of colour c is dimmed by colourExtinction * c * (airmass - 1) more
    double transparency = 0.10;     // fractional: clouds take up to this much light (smooth in time)
    double seeing = 0.15;           // fractional RMS change of the FWHM (smooth in time)
    double jitter = 2.0;            // px: RMS pointing offset per axis, independent per exposure
    double telescopeDiameter = 0.5; // m: scintillation from Young's formula (0: none)
    double transitDepth = 0.01;     // fractional flux loss at mid-transit (0: no transit)
    double transitDuration = 2.0;   // h, first to last contact (ingress and egress 10 % of it each)
    double transitMid = 0.5;        // mid-transit as a fraction of the series
    double transitSnr = 500.0;      // S/N per exposure of the chosen host star
    double sineAmplitude = 0.05;    // mag semi-amplitude of the sinusoidal variable (0: none)
    double sinePeriod = 1.5;        // h
    double sineSnr = 200.0;         // S/N per exposure of the chosen sinusoidal variable
};

void validate(const SimSeriesParams& s);
void to_json(nlohmann::json& j, const SimSeriesParams& s);
void from_json(const nlohmann::json& j, SimSeriesParams& s);

// Young's scintillation estimate (fractional RMS of a star's flux): 0.09 D^(-2/3) X^1.75 exp(-h / 8000 m)
// (2 t)^(-1/2), D in cm, t in s (Young 1967; Osborn et al. 2015 eq. 7 without the empirical factor).
double youngScintillation(double diameterM, double airmass, double elevationM, double exptimeS);

struct SimSeriesFrame {
    std::string file; // NAME_NNNN.fits
    double mjdStart = 0.0, mjdMid = 0.0, airmass = 1.0, transparency = 1.0, fwhm = 0.0;
    double offsetX = 0.0, offsetY = 0.0, zeroPoint = 0.0, scintillation = 0.0;
    double colourTerm = 0.0; // the exposure's colour term (SimParams::colourTerm), with the colour extinction
    std::uint64_t seed = 0;
    std::vector<double> dmag; // per variable (same order as SimSeriesTruth::variables)
};

struct SimSeriesVariable {
    std::int64_t id = 0; // truth id (row of every exposure's truth table)
    std::string kind;    // "transit" or "sine"
    double ra = 0.0, dec = 0.0, mag = 0.0;
    double snr = 0.0; // its S/N per exposure in an aperture of 1.25 FWHM (first exposure)
};

struct SimSeriesTruth {
    SimParams field;
    SimSeriesParams series;
    std::vector<SimSeriesVariable> variables;
    std::vector<SimSeriesFrame> frames;
    double transitMidMjd = 0.0; // mid-exposure time scale (UTC MJD)
};

// The magnitude change of the series' variables at a time, given the series' start (MJD).
double transitDmag(const SimSeriesParams& s, double mjd, double midMjd);
double sineDmag(const SimSeriesParams& s, double mjd, double startMjd);

// Writes DIR/NAME_0001.fits ... (each with .truth.fits and .ref.fits) and DIR/NAME.series.json (the truth
// above). `progress(done, total)` after each exposure. Throws InvalidInput or IoError.
SimSeriesTruth writeSimulatedSeries(const SimParams& field, const SimSeriesParams& series,
                                    const std::string& dir, const std::string& name, int bitpix,
                                    RunContext* ctx = nullptr,
                                    const std::function<void(int, int)>& progress = {});

} // namespace gpuphot
