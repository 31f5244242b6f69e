#pragma once
// The cursor readout: 1-based pixel position (FITS convention, as every user-visible coordinate), pixel
// value, mask state and RA/Dec in sexagesimal and degrees from the given WCS.
#include <QString>

namespace gpuphot {
struct Frame;
class Wcs;
} // namespace gpuphot

namespace gpuphot::ui {

// x, y: 0-based image coordinates (pixel centres at integers).
QString formatReadout(const Frame& frame, const Wcs* wcs, double x, double y);
// "hh:mm:ss.ss" for RA (degrees), "+dd:mm:ss.s" for Dec.
QString formatRa(double raDeg);
QString formatDec(double decDeg);

} // namespace gpuphot::ui
