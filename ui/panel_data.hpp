#pragma once
// Qt-free data extraction for the workbench's analysis panels (plots, PSF panel, source inspector,
// header view): what each graph shows, computed from a Snapshot's plain result structs, so that it can
// be tested without a display. Pixel coordinates are 0-based here (the widgets add 1 where a user
// reads them). Every function is cheap (O(sources) or O(stamp pixels)): they run on the UI thread.
#include <cstdint>
#include <string>
#include <vector>

namespace gpuphot {
struct BackgroundResult;
struct Frame;
struct PipelineResult;
struct PsfResult;
struct HeaderCard;
} // namespace gpuphot

namespace gpuphot::ui {

struct Snapshot;

// ---- zero point (stage 6) ------------------------------------------------------------------------
struct ZeroPointPoints {
    std::vector<int> sourceIndex;
    std::vector<double> refMag;    // reference magnitude
    std::vector<double> colour;    // reference colour (NaN when the catalog has none)
    std::vector<double> offset;    // ref.mag - mag_inst - ct * colour: the star's own zero point (vs mag)
    std::vector<double> offsetRaw; // ref.mag - mag_inst (vs colour; the model is zp + ct * colour)
    std::vector<double> residual;  // ZeroPointResult::residual: ref.mag - (mag_inst + zp + ct * colour)
    std::size_t size() const { return sourceIndex.size(); }
};

struct ZeroPointPlotData {
    bool available = false;
    std::string why;               // why there is nothing to show (when !available)
    ZeroPointPoints used, clipped; // candidates in the final fit / clipped (or all when the fit failed)
    bool fitOk = false;
    double zp = 0.0, zpErr = 0.0, colourTerm = 0.0;
    bool colourTermFitted = false;
    bool hasColour = false; // any finite colour among the candidates
    double scatter = 0.0;
    std::string summary; // one line: "zp 25.123 ± 0.004, ct ..., 123 of 140 used"
};
ZeroPointPlotData zeroPointPlotData(const Snapshot& s);

// ---- astrometry (stage 7) ------------------------------------------------------------------------
struct AstrometryPoints {
    std::vector<int> sourceIndex;
    std::vector<double> x, y;       // px, 0-based source position
    std::vector<double> dRa, dDec;  // arcsec, fitted minus reference (dRA includes cos Dec)
    std::vector<double> dxPx, dyPx; // px, source position minus the reference star projected through the fit
    std::size_t size() const { return sourceIndex.size(); }
};

struct AstrometryPlotData {
    bool available = false;
    std::string why;
    AstrometryPoints used, clipped;
    double rmsArcsec = 0.0, rmsPx = 0.0;
    int nUsed = 0, nMatched = 0, sipOrder = 0;
    std::string method;
    int width = 0, height = 0; // frame size
    std::string summary;
};
AstrometryPlotData astrometryPlotData(const Snapshot& s);

// Exaggeration factor for the residual vector map: the RMS pixel residual becomes `fraction` of the
// frame's larger side (1 when there are no residuals).
double autoVectorExaggeration(const AstrometryPlotData& d, double fraction = 0.03);

// ---- S/N vs magnitude ----------------------------------------------------------------------------
struct SnrPlotData {
    bool available = false;
    std::string why;
    std::vector<int> sourceIndex;
    std::vector<double> mag, snr; // S/N = 1.0857 / magerr of the instrumental (flux_opt) magnitude
    bool calibrated = false;      // mag = mag_inst + zp (+ ct * median colour), else instrumental
    double limitingMag = 0.0;     // S/N = 5 in the same system as `mag`; NaN when not determinable
    std::string summary;
};
SnrPlotData snrPlotData(const Snapshot& s);

// ---- maps ------------------------------------------------------------------------------------------
// A regular grid over the frame: cell (i, j) (i along x) covers a block of pixels; its centre is at
// pixel (xCentre(i), yCentre(j)). values are row-major, ny rows of nx, NaN where undefined.
struct MapData {
    int nx = 0, ny = 0;
    double x0 = 0, y0 = 0; // px, centre of cell (0, 0)
    double dx = 1, dy = 1; // px between cell centres
    std::vector<double> values;
    double minValue = 0, maxValue = 0; // over the finite values
    double xCentre(int i) const { return x0 + i * dx; }
    double yCentre(int j) const { return y0 + j * dy; }
    double at(int i, int j) const { return values[static_cast<std::size_t>(j) * nx + i]; }
    bool empty() const { return values.empty(); }
};
// The background level map sampled at the centres of square blocks, at most maxCells cells along the
// longer side (the mesh grid when the full map was not kept). Empty when the background did not run.
MapData backgroundMap(const BackgroundResult& bkg, int maxCells = 256);

enum class PsfMapKind { Fwhm, Ellipticity };
// The PSF model's spatial polynomial evaluated at nx x ny cell centres over the frame. Empty without a
// model.
MapData psfFieldMap(const PsfResult& psf, PsfMapKind kind, int nx = 48, int ny = 48);

// ---- PSF panel -------------------------------------------------------------------------------------
// The ePSF cell whose centre is nearest to (x, y) (ties: the lower index); -1 without an ePSF grid.
int nearestEpsfCell(const PsfResult& psf, double x, double y);

struct RadialProfile {
    // ePSF nodes: distance (native px) from the PSF centre and value (fraction of the flux in a native
    // pixel at that offset; the ePSF is normalised to unit sum at native sampling).
    std::vector<double> r, value;
    // The analytic model at the position (geometric-mean FWHM of the spatial model, circularised,
    // the field's median beta, unit flux, integrated over a pixel as the ePSF nodes are).
    std::vector<double> modelR, modelValue;
    double fwhm = 0.0, ellipticity = 0.0, beta = 0.0; // of the model at the position
};
RadialProfile epsfRadialProfile(const PsfResult& psf, int cell, double x, double y);

// ---- source inspector ------------------------------------------------------------------------------
struct Stamp {
    int x0 = 0, y0 = 0; // frame pixel of stamp pixel (0, 0)
    int width = 0, height = 0;
    std::vector<float> values;        // row-major; NaN outside the frame
    std::vector<std::uint8_t> masked; // non-zero: masked in the frame (or outside)
};
// (2 halfSize + 1)^2 pixels centred on the pixel nearest to (x, y).
Stamp extractStamp(const Frame& frame, double x, double y, int halfSize);

// Grey levels 0..255: asinh((v - lo) / softening) scaled so that lo -> 0 and hi -> 255 (NaN -> 0).
std::vector<std::uint8_t> asinhStretch(const std::vector<float>& values, double lo, double hi,
                                       double softening);

struct CurveOfGrowth {
    std::vector<double> radius, flux; // px, ADU (sky subtracted)
};
// The catalog's fixed apertures of source `index` (raw, not aperture corrected).
CurveOfGrowth catalogCurveOfGrowth(const PipelineResult& r, int index);
// Flux within radii step, 2 step, ... rMax around (x, y): Σ overlap (data - sky) with the exact
// pixel/circle overlap of core (aperture_overlap.hpp); pixels with a mask bit other than MaskSaturated
// and non-finite pixels are left out, as stage 4 does.
CurveOfGrowth fineCurveOfGrowth(const Frame& frame, double x, double y, double sky, double rMax, double step);

// Flag names as docs/FLAGS.md lists them ("crowded", "saturated", ...), lowest bit first; unknown bits
// as "bit N".
std::vector<std::string> flagNames(std::uint32_t flags);
std::string flagsText(std::uint32_t flags); // "20 = saturated | aperture_incomplete", "0 = none"

struct DetailRow {
    std::string label, value;
};
// The selected source's numbers as a user reads them (1-based positions, fluxes, mags with errors,
// calibrated magnitude, flags decoded). Empty for an index outside the catalog.
std::vector<DetailRow> sourceDetails(const Snapshot& s, int index);

// ---- header view -----------------------------------------------------------------------------------
// Case-insensitive substring match on the key, value or comment (an empty filter matches every card).
bool headerCardMatches(const HeaderCard& card, const std::string& filter);

} // namespace gpuphot::ui
