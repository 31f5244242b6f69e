#pragma once
// Turns a pipeline snapshot into the viewer's overlay geometry (markers, whiskers, reference stars,
// astrometric residual vectors). Plain data in, plain data out: no widgets, testable without a display.
#include <vector>

#include "ui/snapshot.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {

struct OverlayGeometry {
    std::vector<viewers::Marker> sources;      // one per detected source, in catalog order
    std::vector<float> apertureRadii;          // px, as measured
    float annulusInner = 0.0f, annulusOuter = 0.0f; // px
    std::vector<viewers::Vector2> whiskers;    // PSF ellipticity on a grid: length FWHM * e * whiskerGain
    std::vector<viewers::Vector2> referenceStars; // projected reference stars on the frame
    std::vector<viewers::Vector2> residuals;   // astrometric residuals (px), at the matched sources
};

struct OverlayOptions {
    int whiskerGrid = 12;      // whiskers per axis
    double whiskerGain = 10.0; // px of whisker per px of FWHM*e
    // Reference stars drawn: the brightest this many of those on the frame (a dense catalog on a large
    // frame is otherwise a carpet that hides the image); <= 0: all.
    int maxReferenceStars = 2000;
};

OverlayGeometry buildOverlays(const Snapshot& snapshot, const OverlayOptions& options = {});

} // namespace gpuphot::ui
