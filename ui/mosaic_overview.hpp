#pragma once
// The data behind the workbench's Mosaic panel (ui/mosaic_panel.hpp), computed off the UI thread:
//   overview   every CCD of a mosaic exposure (core/pipeline/exposure.hpp) read once, binned to a common
//              factor so the whole exposure fits about 1500 px across, its pixels stretched to 8 bits with
//              one robust stretch for all CCDs, and its four corners placed by its header WCS in a common
//              tangent plane about the exposure's centre (axes those of the CCD nearest the centre, so the
//              overview is oriented as the viewer shows a CCD); per CCD the header's gain and, from the
//              pixels, the median sky, its robust sigma and the count of saturated pixels.
//   reduction  the per-CCD numbers of an exposure report (STEM.report.json's "exposure" object).
// Without a usable WCS on every CCD the CCDs are laid out in a grid in HDU order.
#include <QImage>
#include <QPointF>
#include <QRectF>
#include <QString>

#include <array>
#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/pipeline/exposure.hpp"

namespace gpuphot::ui {

struct MosaicCcd {
    ExposureExtension ext;
    double gain = std::numeric_limits<double>::quiet_NaN();      // e-/ADU from the header (NaN: none)
    double saturation = std::numeric_limits<double>::infinity(); // ADU from the header
    double sky = std::numeric_limits<double>::quiet_NaN();       // median of the pixels (ADU)
    double sigma = std::numeric_limits<double>::quiet_NaN();     // 1.4826 MAD (ADU)
    long long saturated = -1;       // pixels at or above the saturation level (-1: no level in the header)
    std::array<QPointF, 4> corners; // plane px (x right, y up): pixel (0,0), (w,0), (w,h), (0,h) corners
    QImage tile;                    // the binned pixels, stretched; row 0 = the CCD's first pixel row
    std::string error;              // why the CCD could not be read ("" when it was)
    QPointF centre() const { return (corners[0] + corners[2]) / 2.0; }
};

struct MosaicOverview {
    std::string path;
    std::vector<MosaicCcd> ccds;
    int bin = 1;                                // CCD pixels per overview pixel, each way
    bool placedByWcs = false;                   // false: a grid in HDU order
    QRectF bounds;                              // of every CCD's corners, plane px
    double stretchLow = 0.0, stretchHigh = 1.0; // ADU mapped to black and white (sqrt between)
};
using MosaicOverviewPtr = std::shared_ptr<const MosaicOverview>;

// The overview's target size, overview pixels across its larger side.
constexpr double kMosaicOverviewPx = 1500.0;

// Reads every extension of `path` (readFrame with its HDU number), several at once. progress(done, total)
// is called from the reading threads after each CCD; a raised `cancel` stops between CCDs (the result is
// then null). A CCD that cannot be read keeps its error and no tile; the others go on.
MosaicOverviewPtr computeMosaicOverview(const std::string& path,
                                        const std::vector<ExposureExtension>& extensions,
                                        const std::function<void(int done, int total)>& progress,
                                        const std::atomic<bool>& cancel);

// One CCD's line of an exposure report (core/pipeline/exposure.hpp).
using MosaicCcdResult = ExposureCcdSummary;

struct MosaicReduction {
    std::string reportPath; // where it was read from ("" when it came from a run in memory)
    double zp = std::numeric_limits<double>::quiet_NaN(), zpErr = zp, scatter = zp;
    std::vector<std::string> outliers; // EXTNAMEs
    std::vector<MosaicCcdResult> ccds;
    const MosaicCcdResult* find(int hdu) const;
};
using MosaicReductionPtr = std::shared_ptr<const MosaicReduction>;

// The per-CCD numbers of a report (the whole report, with its "exposure" object). Throws InvalidInput
// when it has no "exposure" object (a single-frame report).
MosaicReduction parseExposureReport(const nlohmann::json& report);
// STEM.report.json of the exposure `path` in FOLDER/gpuphot/ or FOLDER/ (the first that exists and is an
// exposure report); null when none.
MosaicReductionPtr findExposureReport(const std::string& path);
// FOLDER/gpuphot: where the workbench writes an exposure's reduction by default.
QString defaultMosaicOutputDir(const QString& path);

} // namespace gpuphot::ui
