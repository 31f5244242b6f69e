#pragma once
// Turns a pipeline snapshot into the viewer's overlay geometry (markers, whiskers, reference stars,
// astrometric residual vectors). Plain data in, plain data out: no widgets, testable without a display.
#include <cstdint>
#include <string>
#include <vector>

#include "core/io/ds9_regions.hpp"
#include "ui/snapshot.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {

struct OverlayGeometry {
    std::vector<viewers::Marker> sources;           // one per detected source, in catalog order
    std::vector<float> apertureRadii;               // px, as measured
    float annulusInner = 0.0f, annulusOuter = 0.0f; // px
    std::vector<viewers::Vector2> whiskers;       // PSF ellipticity on a grid: length FWHM * e * whiskerGain
    double whiskerGain = 0.0;                     // as drawn (px of whisker per px of FWHM * e)
    std::vector<viewers::Vector2> referenceStars; // projected reference stars on the frame
    std::vector<viewers::Vector2> residuals;      // astrometric residuals (px), at the matched sources
};

struct OverlayOptions {
    int whiskerGrid = 12; // whiskers per axis
    // px of whisker per px of FWHM * e; <= 0: the longest whisker spans kWhiskerFill of a grid cell, so
    // that they show at any zoom however round the PSF (their lengths compare with each other).
    double whiskerGain = 0.0;
    static constexpr double kWhiskerFill = 0.8;
    // Reference stars drawn: the brightest this many of those on the frame (a dense catalog on a large
    // frame is otherwise a carpet that hides the image); <= 0: all.
    int maxReferenceStars = 2000;
};

OverlayGeometry buildOverlays(const Snapshot& snapshot, const OverlayOptions& options = {});

// The DS9 regions layer (ui/region_layer.hpp): each region as a closed outline in 0-based image pixels.
struct RegionOutline {
    std::vector<double> xy; // x, y pairs of the outline (closed: the last joins the first); a point: 1 pair
    bool point = false;     // drawn as a small cross
    bool exclude = false;   // drawn dashed (DS9's '-' regions)
    std::uint32_t rgba = 0; // viewers::packRgba; the region's color=, else the global one, else green
    std::string text;       // its text={...}
};
struct RegionOverlay {
    std::vector<RegionOutline> outlines;
    std::vector<std::string> problems; // regions left out (e.g. fk5 without a WCS), one line each
};
// wcs: for regions in fk5/icrs or with sizes on the sky (null: those become problems).
RegionOverlay buildRegionOverlay(const RegionFile& file, const Wcs* wcs, int ellipseSegments = 72);
// A DS9 colour name or #rrggbb as packed RGBA (unknown names: green).
std::uint32_t regionColour(const std::string& name);

} // namespace gpuphot::ui
