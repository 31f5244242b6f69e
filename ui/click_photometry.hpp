#pragma once
// Forced aperture photometry at any position of the shown frame (Ctrl+click in the viewer): core's
// forcedPhotometry (core/stages/aperture/forced_photometry.hpp) with the snapshot's apertures,
// background, segmentation, FWHM and aperture corrections, so that a click on a detection gives that
// detection's flux_aper_*. Plain data, no widgets.
#include <cstdint>
#include <string>
#include <vector>

#include "ui/panel_data.hpp"
#include "ui/snapshot.hpp"

namespace gpuphot::ui {

struct ClickPhotometry {
    double x = 0.0, y = 0.0;                       // 0-based position measured
    double ra = 0.0, dec = 0.0;                    // degrees; NaN without a WCS
    std::vector<double> radii, flux, fluxErr;      // per fixed aperture (px, ADU)
    int aperture = -1;                             // 0-based aperture of highest S/N (-1: none usable)
    double magTotal = 0.0, magTotalErr = 0.0;      // instrumental, aperture corrected (NaN: none)
    double magCal = 0.0, magCalErr = 0.0;          // magTotal + ZP (NaN without a zero point)
    double sky = 0.0, skyRms = 0.0;                // ADU per pixel, the local annulus
    std::uint32_t flags = 0;                       // aperture-stage SourceFlags | TargetFlags
    int detection = -1;                            // 0-based index of the detection within 1 FWHM, -1: none
    double annulusInner = 0.0, annulusOuter = 0.0; // px

    double snr() const; // of the chosen aperture (NaN when none)
};

// Throws gpuphot::InvalidInput when the snapshot has no aperture result (not reduced yet) or the
// position is off the frame.
ClickPhotometry measureAt(const Snapshot& snapshot, double x, double y);

// The measurement as the Source panel lists it (1-based position, as sourceDetails does).
std::vector<DetailRow> clickPhotometryDetails(const ClickPhotometry& m);

} // namespace gpuphot::ui
