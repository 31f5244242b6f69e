#pragma once
// Parameters of the field simulator (the project's ground truth). A plain struct with defaults and
// units; every field can be set from JSON (`gpuphot simulate --config FILE.json`, `--set key=value`)
// under its member name, and `simulate --dump-config` prints them all.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpuphot {

struct SimParams {
    // --- frame ----------------------------------------------------------------------------------
    int width = 2048;            // px (up to 14208 x 10656)
    int height = 2048;           // px
    int stars = 3000;            // stars on the frame (hundreds to 150,000+)
    std::uint64_t seed = 42;     // everything random derives from it (bitwise reproducible)
    std::uint64_t fieldSeed = 0; // seed of the sky (stars, galaxies, SIP terms, reference); 0: `seed`. Keep
                                 // it and vary `seed` for frames of one field in a time series.

    // --- luminosity function and photometric truth -----------------------------------------------
    double magBright = 11.0;     // mag (calibrated): brightest star
    double magFaint = 20.0;      // mag: faintest star (defaults: ~80% above the frame's 5-sigma limit)
    double lfSlope = 0.3;        // dlog10(N)/dmag of the power-law luminosity function (0: flat)
    double zeroPoint = 26.0;     // mag: true ZP, mag_cal = -2.5 log10(flux_ADU) + zp (docs/ARCHITECTURE.md)
    double colourMean = 0.7;     // mag: mean colour index of the stars (e.g. BP-RP)
    double colourSigma = 0.3;    // mag: spread of the colour index (0: no colour column in the reference)
    double colourTerm = 0.0;     // mag/mag: m_inst = mag - zp - colourTerm * colour

    // --- clusters (Plummer spheres) --------------------------------------------------------------
    int clusters = 0;            // number of clusters
    double clusterRadius = 60.0; // px: Plummer scale radius
    double clusterFraction = 0.2;// fraction of the stars that belong to clusters

    // --- PSF: FWHM, ellipticity and angle vary smoothly across the field ------------------------------
    std::string psf = "moffat";  // "moffat" or "gaussian"
    double moffatBeta = 3.0;     // Moffat beta (> 1)
    double fwhm = 3.0;           // px: FWHM at the frame centre (geometric mean of the major/minor FWHM)
    double fwhmCornerFactor = 1.0; // FWHM(corner) / FWHM(centre), quadratic in the distance from the centre
    double fwhmGradientX = 0.0;  // fractional linear change of FWHM from the centre to the right edge
    double fwhmGradientY = 0.0;  // fractional linear change of FWHM from the centre to the top edge
    double ellipticity = 0.05;   // 1 - b/a at the centre
    double ellipticityCorner = 0.10; // 1 - b/a at the corners (quadratic in between)
    double psfAngle = 30.0;      // deg, major axis counter-clockwise from +x
    bool psfAngleRadial = false; // true: major axis points radially away from the centre (off-axis blur)
    double renderThreshold = 0.01; // ADU/px: surface brightness where a profile is truncated (continuously)
    double maxStampRadius = 150.0; // px: largest rendered radius (bright stars)

    // --- galaxies (softened Sersic blobs) ------------------------------------------------------
    int galaxies = 0;            // number of galaxies (in the truth table, never in the reference)
    double galaxyMagBright = 15.0; // mag
    double galaxyMagFaint = 21.0;  // mag
    double galaxyReMin = 1.5;    // px: effective (half-light) radius range
    double galaxyReMax = 6.0;    // px
    double galaxySersicMin = 0.7;// Sersic index range
    double galaxySersicMax = 4.0;

    // --- sky and camera ------------------------------------------------------------------------
    double sky = 300.0;          // ADU/px at the centre
    double skyGradientX = 0.0;   // ADU: sky(right edge) - sky(left edge)
    double skyGradientY = 0.0;   // ADU: sky(top edge) - sky(bottom edge)
    double skyCorner = 0.0;      // ADU: sky(corner) - sky(centre), quadratic (vignetting / scattered light)
    double gain = 1.5;           // e-/ADU
    double readNoise = 6.0;      // e- RMS
    double bias = 0.0;           // ADU added to every pixel (not in SIMSKY)
    double saturation = 65535.0; // ADU: pixels are clipped here (SATURATE); <= 0: no clipping
    bool noise = true;           // false: no photon or read noise (sky, bias and defects still there)
    int hotPixels = 0;           // number of hot pixels
    double hotPixelMin = 500.0;  // ADU added to a hot pixel: log-uniform between min and max
    double hotPixelMax = 30000.0;
    int cosmicRays = 0;          // number of cosmic-ray tracks
    double cosmicRayLengthMax = 12.0; // px: longest track
    double cosmicRayCharge = 3000.0;  // e- deposited per pixel of a track (exponentially distributed)
    int badColumns = 0;          // bad columns, each from a random row to the top: dead (bias only) or hot
                                 // (+hotPixelMin ADU), alternately

    // --- raw detector: calibration structure for frame preparation (all off by default) ------------
    // A raw pixel is bias(x, y) + Poisson(gain * (signal(x, y) * flat(x, y) + dark(x, y) * exptime / gain)) / gain
    // + read noise, with signal = sources + sky (light), 0 (bias, dark) or flatLevel (flat).
    std::string frameType = "light"; // "light", "bias", "dark" or "flat" (IMAGETYP); calibration frames have
                                     // no sources, bias frames no exposure (EXPTIME = 0)
    std::uint64_t detectorSeed = 0;  // seed of the fixed detector structure (hot pixels, bad columns, bias
                                     // pattern, dark hot pixels, pixel response); 0: `seed`. Keep it and vary
                                     // `seed` for the calibration frames of one camera.
    double biasRowAmplitude = 0.0;   // ADU: RMS of a fixed row-to-row bias pattern (also in the overscan)
    double biasColumnAmplitude = 0.0;// ADU: RMS of a fixed column-to-column bias pattern (data area only)
    int prescan = 0;                 // bias-only columns left of the data (header CRPIX1 shifts by this; the
                                     // truth stays in data-section pixels)
    int overscan = 0;                // bias-only columns right of the data (BIASSEC; DATASEC/TRIMSEC written
                                     // whenever prescan + overscan > 0)
    double darkCurrent = 0.0;        // e-/s/px, uniform
    int darkHotPixels = 0;           // pixels with a high dark current (they scale with exptime)
    double darkHotMin = 20.0;        // e-/s: log-uniform range of the hot pixels' dark current
    double darkHotMax = 2000.0;
    double flatVignetting = 0.0;     // fractional response loss at the corners (quadratic in radius)
    double flatPixelSigma = 0.0;     // RMS pixel-to-pixel response (PRNU), fraction
    double flatLevel = 20000.0;      // ADU: illumination of a flat frame (frameType "flat", before the response)

    // --- observation keywords --------------------------------------------------------------------
    double exptime = 60.0;       // s
    std::string filter = "r";
    double mjd = 60390.1234;     // MJD at the start of the exposure (DATE-OBS is derived from it)
    double airmass = 1.2;
    std::string object = "SIMFIELD";

    // --- true WCS: TAN + SIP ------------------------------------------------------------------------
    double ra = 150.0;           // deg: RA of the frame centre
    double dec = 20.0;           // deg: Dec of the frame centre
    double pixelScale = 1.0;     // arcsec/px
    double rotation = 0.0;       // deg: position angle of the frame's +y axis east of north
    bool flipParity = false;     // true: east to the right (mirror image)
    int sipOrder = 3;            // 0 (pure TAN), 2 or 3
    double sipStrength = 1.5;    // px: largest SIP displacement at the corners

    // --- header WCS (possibly wrong on purpose; the truth keeps the true one) ---------------------------
    bool writeWcs = true;        // false: no WCS, only RA/DEC pointing keywords
    bool headerSip = true;       // the header WCS carries the SIP terms of the truth
    double wcsOffset = 0.0;      // arcmin: header CRVAL moved away from the truth (also RA/DEC keywords)
    double wcsOffsetAngle = 45.0;// deg: direction of that offset, east of north
    double wcsRotation = 0.0;    // deg: header CD rotated by this much
    double wcsScaleError = 0.0;  // fraction: header CD scaled by (1 + this)

    // --- reference catalog ------------------------------------------------------------------------
    double refMagLimit = 19.0;   // mag: stars brighter than this are in the reference
    double refMargin = 0.1;      // deg: the reference covers the frame's circumscribed circle plus this
    double refMagErrFloor = 0.01;// mag: catalogue error floor
    double refMagErrAtLimit = 0.05; // mag: extra error at the limit, scaling as 10^(0.4 (m - limit))
    double refPosErr = 10.0;     // mas: catalogue position noise per coordinate
    bool properMotions = false;  // pmra/pmdec columns; the reference is at refEpoch, the frame at its date
    double pmSigma = 5.0;        // mas/yr per coordinate
    double refEpoch = 2016.0;    // Julian year of the reference positions
    // --- time series: one exposure of a series (gpuphot simulate --series; all off by default) ------
    double offsetX = 0.0;        // px: the field moved on the detector (pointing jitter), the WCS with it
    double offsetY = 0.0;        // px
    double scintillation = 0.0;  // fractional RMS of a multiplicative flux noise per star (scintillation)
    bool writeSite = false;      // write SITELAT, SITELONG (east positive) and SITEELEV
    double siteLatitude = -30.24;  // deg
    double siteLongitude = -70.74; // deg, east positive
    double siteElevation = 2200.0; // m
};

// Magnitude changes of chosen sources in one exposure (variables in a simulated series): the source with
// truth id ids[k] is rendered dmag[k] fainter.
struct SimVariation {
    std::vector<std::int64_t> ids;
    std::vector<double> dmag;
};

// The seed of the sky: fieldSeed, else seed.
inline std::uint64_t fieldSeedOf(const SimParams& p) { return p.fieldSeed != 0 ? p.fieldSeed : p.seed; }

// Throws InvalidInput naming the first unusable field.
void validate(const SimParams& p);

// JSON under the member names. from_json accepts any subset of the fields and throws InvalidInput for
// an unknown key or a value of the wrong type (so a typo in a config file never goes unnoticed).
void to_json(nlohmann::json& j, const SimParams& p);
void from_json(const nlohmann::json& j, SimParams& p);

} // namespace gpuphot
