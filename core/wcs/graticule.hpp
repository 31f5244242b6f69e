#pragma once
// A coordinate grid (graticule) over part of a frame: lines of constant RA (meridians) and of constant Dec
// (parallels) at round steps (RA in hours, minutes and seconds of time; Dec in degrees, arcminutes and
// arcseconds), as polylines in pixel coordinates clipped to the region, each with a label where it leaves
// the region. The workbench draws it over the image (View > Coordinate grid), as DS9's coordinate grid.
#include <string>
#include <vector>

namespace gpuphot {

class Wcs;

struct GraticuleLine {
    bool meridian = false; // constant RA (else constant Dec)
    double value = 0.0;    // its RA or Dec, deg
    std::string label;     // "12h34m", "-05d30'" (sexagesimal to the step's precision)
    // Pieces inside the region: x0, y0, x1, y1, ... (0-based pixels).
    std::vector<std::vector<double>> pieces;
    // Where the label goes: the end of a piece on the region's bottom edge (meridians) or left edge
    // (parallels), else the first point of the first piece.
    double labelX = 0.0, labelY = 0.0;
};

struct Graticule {
    double raStep = 0.0, decStep = 0.0; // deg
    std::vector<GraticuleLine> lines;   // meridians first
};

struct GraticuleRegion {
    double x0 = 0.0, y0 = 0.0, x1 = 0.0, y1 = 0.0; // pixel bounds (x0 < x1, y0 < y1)
};

// The graticule over `region` with about `lines` lines each way (round steps, at most 2 * lines).
// Empty when the WCS does not transform the region (no line at all).
Graticule makeGraticule(const Wcs& wcs, const GraticuleRegion& region, int lines = 5);

// Labels: RA as hours ("12h", "12h34m", "12h34m56s", "12h34m56.7s"), Dec as degrees ("+45d",
// "+45d30'", "+45d30'15\"", "+45d30'15.5\""), to the precision of the step (deg).
std::string raLabel(double raDeg, double stepDeg);
std::string decLabel(double decDeg, double stepDeg);

} // namespace gpuphot
