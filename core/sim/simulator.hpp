#pragma once
// The field simulator: the project's ground truth for tests, benchmarks, the demo and teaching.
//
// simulateField draws a star list (and optional clusters and galaxies) serially from the seed, renders
// pixel-integrated profiles with a smoothly varying PSF in parallel row bands (each band owns its
// rows; sources are added in id order), adds sky, Poisson photon noise and read noise from a
// counter-based RNG keyed by pixel, bias, hot pixels, cosmic rays and bad columns, and clips at
// saturation. The image is bitwise identical for any thread count. Alongside come the header (WCS,
// possibly wrong on purpose; instrument keywords; SIM* truth keywords), the truth table, a reference
// catalog and the true TAN-SIP WCS.
#include <cstdint>
#include <string>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/model/header.hpp"
#include "core/model/image.hpp"
#include "core/sim/sim_params.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot {

class RunContext;

struct SimResult {
    SimParams params;
    Image<float> image;           // ADU (sky, sources, noise, bias, defects; clipped at saturation)
    Image<std::uint8_t> defects;  // MaskBits: MaskBad (hot pixels, bad columns), MaskCosmicRay
    Header header;                // what the image file carries: WCS (unless writeWcs = false), instrument, SIM*
    // Truth, one row per source (stars, then galaxies): id, x, y (1-based FITS pixels), ra, dec (deg, at
    // the frame's epoch), flux (ADU, total), mag (calibrated), mag_inst, colour, fwhm (px, PSF at the
    // source), ellipticity, theta (deg), is_galaxy, r_eff (px), sersic_n, saturated (a pixel within
    // 1 px of the centre at the saturation level), cluster (0: field), ref_id (-1: not in the reference).
    // meta: SIMZP, SIMCT, EPOCH and the true WCS keywords.
    Table truth;
    // Reference catalog: id, ra, dec (deg at refEpoch), mag, mag_err, [colour], [pmra, pmdec mas/yr],
    // truth_id (-1: a star outside the frame). Sorted by magnitude.
    Table reference;
    TanSip trueWcs;               // the truth
    TanSip headerWcs;             // what the header says (equal to trueWcs unless made wrong on purpose)
};

// `variation` (optional) dims chosen sources in this exposure (series variables).
SimResult simulateField(const SimParams& params, RunContext* ctx = nullptr, const SimVariation* variation = nullptr);

// Writes DIR/NAME.fits (bitpix 16: unsigned 16-bit via BZERO, or -32: float), DIR/NAME.truth.fits and
// DIR/NAME.ref.fits, each atomically. Creates DIR when missing. Throws IoError or InvalidInput.
void writeSimulation(const SimResult& result, const std::string& dir, const std::string& name, int bitpix);

// Raw-detector truth over the data section (0-based data-section pixels), for frame-preparation tests:
// the relative response (flat; median ~1, 1 without flatVignetting/flatPixelSigma), the bias (ADU: level
// plus row/column pattern) and the dark current (e-/s, hot pixels included).
Image<float> simFlatMap(const SimParams& p);
Image<float> simBiasMap(const SimParams& p);
Image<float> simDarkMap(const SimParams& p);
// Calibration frame `index` (0-based) of `type` ("bias", "dark" or "flat") for the camera of `light`: the same
// detector (detectorSeed, or the light's seed), its own noise and cosmic rays (seed), no sources. Darks have
// the light's exposure time, flats kCalibrationFlatExptime.
constexpr double kCalibrationFlatExptime = 2.0; // s
SimParams calibrationFrameParams(const SimParams& light, const std::string& type, int index);
// Writes DIR/NAME.bias_01.fits ... NAME.dark_NN.fits, NAME.flat_NN.fits (`count` of each); returns the paths.
std::vector<std::string> writeCalibrationFrames(const SimParams& light, const std::string& dir,
                                                const std::string& name, int count, int bitpix,
                                                RunContext* ctx = nullptr);

// The field-dependent truths the simulation used (0-based pixel positions).
struct SimPsf {
    double fwhm = 0.0;        // px, geometric mean of the major and minor FWHM
    double ellipticity = 0.0; // 1 - b/a
    double angle = 0.0;       // deg, major axis counter-clockwise from +x
};
SimPsf simPsfAt(const SimParams& p, double x, double y);
double simSkyAt(const SimParams& p, double x, double y); // ADU, without bias
TanSip makeTrueWcs(const SimParams& p);
TanSip makeHeaderWcs(const SimParams& p, const TanSip& truth); // truth with the requested errors
// Position (deg) at `distArcmin` from (ra, dec) towards position angle paDeg (east of north).
void offsetPosition(double ra, double dec, double distArcmin, double paDeg, double& raOut, double& decOut);
// MJD -> ISO-8601 "YYYY-MM-DDThh:mm:ss.sss" (UTC, no leap seconds).
std::string mjdToIso(double mjd);

} // namespace gpuphot
