#pragma once
// A simulated mosaic exposure (issue 26: mosaic cameras, e.g. DECam's 62 CCDs): one multi-extension FITS
// file with an empty primary HDU carrying the exposure's keywords and one image extension per CCD, each
// with its own WCS, gain, saturation and throughput (zero-point offset), with known truth
// (`gpuphot simulate --mosaic N`). Every CCD is simulateField with its own parameters (mosaicCcdParams),
// so the mosaic is the single-frame simulator laid out on a shared tangent plane, not a new one.
//
// Layout: CCD k (1-based) sits in row (k - 1) / columns (row 0 at the top, +y of the focal plane) and
// column (k - 1) % columns (0 at the left); a partly filled last row is centred. CCD centres are
// (width + gapPx) and (height + gapPx) pixels apart in the tangent plane about the pointing (ccd.ra,
// ccd.dec), whose axes are those of a single frame with ccd.rotation, ccd.pixelScale and ccd.flipParity.
// Each CCD's own TAN(-SIP) WCS is tangent at its centre, its +y along the focal plane's +y there, turned
// by its small rotation.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/sim/sim_params.hpp"

namespace gpuphot {

class RunContext;

struct MosaicSimParams {
    // The per-CCD parameters: width/height are the CCD's size, stars its stars, ra/dec the exposure's
    // pointing centre, seed (and fieldSeed, detectorSeed when set) the exposure's, from which every
    // CCD's own seeds derive; zeroPoint the exposure's true zero point, gain the mean gain.
    SimParams ccd = [] {
        SimParams p;
        p.width = 2048;
        p.height = 4096;
        return p;
    }();
    int ccds = 60;                   // CCDs in the exposure (1..999)
    int columns = 0;                 // CCDs per row; 0: the count that makes the footprint nearest a square
    double gapPx = 150.0;            // px between neighbouring CCDs (>= 0)
    double gainSpread = 0.1;         // relative RMS of the per-CCD gains around ccd.gain
    double zpSpread = 0.02;          // mag RMS of the per-CCD throughput (zero-point) offsets
    double rotationSpreadDeg = 0.05; // deg RMS of the per-CCD rotations
    int badCcd = -1;                 // 1-based CCD with a large zero-point offset (-1: none)
    double badCcdOffset = 0.3;       // mag: the bad CCD's offset before the median is subtracted
    std::vector<int> compressed;     // 1-based CCDs written tile-compressed (RICE_1; -32: GZIP_2 tiles)
    bool tableExtension = false;     // append a BINTABLE "GUIDESTARS" after the CCDs (readers must skip it)
};

// One CCD's truth. zpOffset: the CCD's true zero point is ccd.zeroPoint + zpOffset (mag = -2.5
// log10(flux_ADU) + ZP); the median of the offsets over the exposure is 0 (the bad CCD included).
struct MosaicCcd {
    int number = 0;                    // 1-based CCDNUM
    std::string extname;               // "CCD01" ...
    int hdu = 0;                       // 0-based HDU index in the file (= number)
    int row = 0, column = 0;           // 0-based place in the layout (row 0 at the top)
    double focalX = 0.0, focalY = 0.0; // px: the CCD centre in the shared tangent plane, from the pointing
    double gain = 0.0;                 // e-/ADU
    double zpOffset = 0.0;             // mag
    double rotation = 0.0;             // deg: the CCD's own small rotation
    double positionAngle = 0.0; // deg: the CCD's +y east of north (SimParams::rotation of its simulation)
    double ra = 0.0, dec = 0.0; // deg: the CCD centre
    bool bad = false;
    SimParams params; // what simulateField renders this CCD with
};

struct MosaicTruth {
    MosaicSimParams params;
    int columns = 0, rows = 0;
    double zeroPoint = 0.0; // the exposure's true zero point (= params.ccd.zeroPoint)
    std::vector<MosaicCcd> ccds;
    std::size_t truthRows = 0, referenceRows = 0; // rows of NAME.truth.fits and NAME.ref.fits
};

// Throws InvalidInput naming the first unusable field (the CCD's SimParams included).
void validate(const MosaicSimParams& m);
// JSON of the mosaic fields under their member names (not `ccd`: that is a SimParams, set with --set).
// from_json accepts any subset and throws InvalidInput for an unknown key or a value of the wrong type.
void to_json(nlohmann::json& j, const MosaicSimParams& m);
void from_json(const nlohmann::json& j, MosaicSimParams& m);

// The layout's columns and rows.
void mosaicGrid(const MosaicSimParams& m, int& columns, int& rows);
// Every CCD's place, gain, zero point, rotation and simulation parameters (no pixels). Validates.
std::vector<MosaicCcd> planMosaic(const MosaicSimParams& m);

// Simulates the exposure and writes, in DIR (created when missing), each file atomically:
//   NAME.fits        the MEF: empty primary (NAXIS = 0, exposure keywords, NEXTEND), extensions CCD01..;
//                    bitpix 16 (unsigned, BZERO 32768) or -32 (float); GUIDESTARS table if asked for
//   NAME.ref.fits    one reference catalog (union of the CCDs', ids unique, no two within 0.5")
//   NAME.truth.fits  the CCDs' truth tables with `ccd` and `extname` columns; ref_id into NAME.ref.fits
//   NAME.mosaic.json the truth above
// CCDs are simulated on ctx's threads (one CCD per thread, each single-threaded: the image does not depend
// on it) and written in order as they finish, so at most a few CCDs are in memory at once.
// `progress(ccd, total)` after each CCD is written, on the calling thread. Throws InvalidInput or IoError.
MosaicTruth writeSimulatedMosaic(const MosaicSimParams& m, const std::string& dir, const std::string& name,
                                 int bitpix, RunContext* ctx = nullptr,
                                 const std::function<void(const MosaicCcd&, int total)>& progress = {});

} // namespace gpuphot
