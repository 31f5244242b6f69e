#include "core/stages/aperture/forced_photometry.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model/sources.hpp"
#include "core/stages/background/background.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool inFrame(double x, double y, int w, int h) {
    return std::isfinite(x) && std::isfinite(y) && x >= -0.5 && y >= -0.5 && x < w - 0.5 && y < h - 0.5;
}
} // namespace

ForcedPhotometryResult
forcedPhotometry(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                 const ImageViewT<std::int32_t>& segmentation, const Sources& detections,
                 const ApertureResult& detected, const std::vector<double>& x, const std::vector<double>& y,
                 double fwhm, double gain, double readNoise, const ApertureParams& params,
                 const ForcedPhotometryParams& forced, RunContext& ctx) {
    if (x.size() != y.size()) throw InvalidInput("forced photometry: x and y differ in length");
    if (!(forced.matchRadiusFwhm >= 0.0) || !std::isfinite(forced.matchRadiusFwhm))
        throw InvalidInput("forced photometry: matchRadiusFwhm must be >= 0");
    if (detections.y.size() != detections.x.size())
        throw InvalidInput("forced photometry: detection x and y differ in length");
    const std::size_t n = x.size();
    const int w = image.width, h = image.height;
    ForcedPhotometryResult res;
    res.count = n;
    res.x = x;
    res.y = y;
    res.detIndex.assign(n, -1);
    res.detSeparation.assign(n, kNaN);
    res.calAperture.assign(n, -1);
    res.magTotal.assign(n, kNaN);
    res.magTotalErr.assign(n, kNaN);
    res.flags.assign(n, 0);

    // Counterparts: the nearest detection within the radius (ties: the lower index). Brute force: target
    // lists are short.
    const double radius = forced.matchRadiusFwhm * (std::isfinite(fwhm) && fwhm > 0.0 ? fwhm : 0.0);
    for (std::size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
        double best = radius * radius;
        std::int32_t bestIndex = -1;
        for (std::size_t j = 0; j < detections.size(); ++j) {
            const double dx = detections.x[j] - x[i], dy = detections.y[j] - y[i];
            const double d2 = dx * dx + dy * dy;
            if (d2 <= best && (bestIndex < 0 || d2 < best)) {
                best = d2;
                bestIndex = static_cast<std::int32_t>(j);
            }
        }
        if (bestIndex >= 0) {
            res.detIndex[i] = bestIndex;
            res.detSeparation[i] = std::sqrt(best);
            res.flags[i] |= FlagTargetDetected;
        }
    }

    // The aperture stage at the targets. Each target's own segment (its counterpart's, else the
    // segmentation under its centre) decides which neighbouring object pixels count as crowding.
    Sources at;
    at.x.resize(n);
    at.y.resize(n);
    at.segmentId.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
        const bool on = inFrame(x[i], y[i], w, h);
        at.x[i] = on ? x[i] : kNaN;
        at.y[i] = on ? y[i] : kNaN;
        if (!on) {
            res.flags[i] |= FlagTargetOffFrame;
            continue;
        }
        const std::int32_t d = res.detIndex[i];
        if (d >= 0 && static_cast<std::size_t>(d) < detections.segmentId.size()) {
            at.segmentId[i] = detections.segmentId[static_cast<std::size_t>(d)];
        } else if (!segmentation.empty()) {
            const int px = std::clamp(static_cast<int>(std::lround(x[i])), 0, w - 1);
            const int py = std::clamp(static_cast<int>(std::lround(y[i])), 0, h - 1);
            at.segmentId[i] = segmentation(px, py);
        }
    }
    res.aperture = measureApertures(image, mask, bkg, segmentation, at, fwhm, gain, readNoise, params, ctx);
    const ApertureResult& ap = res.aperture;
    const double annulusOuter = ap.skyAnnulusOuter;
    for (std::size_t i = 0; i < n; ++i) {
        if (res.flags[i] & FlagTargetOffFrame) continue;
        res.flags[i] |= ap.flags[i];
        const double edge = std::min({x[i] + 0.5, w - 0.5 - x[i], y[i] + 0.5, h - 0.5 - y[i]});
        if (annulusOuter > 0.0 && edge < annulusOuter) res.flags[i] |= FlagTargetNearEdge;
        // The fixed aperture of highest S/N, corrected to total with the main catalog's correction.
        double bestSnr = 0.0;
        for (std::size_t k = 0; k < ap.radii.size(); ++k) {
            const double f = ap.flux[k][i], e = ap.fluxErr[k][i];
            if (!(f > 0.0) || !(e > 0.0) || !std::isfinite(f) || !std::isfinite(e)) continue;
            if (f / e > bestSnr) {
                bestSnr = f / e;
                res.calAperture[i] = static_cast<std::int32_t>(k);
            }
        }
        const std::int32_t k = res.calAperture[i];
        if (k < 0 || static_cast<std::size_t>(k) >= detected.apCorrMag.size()) continue;
        const double corr = detected.apCorrMag[static_cast<std::size_t>(k)];
        const double corrErr = static_cast<std::size_t>(k) < detected.apCorrMagErr.size() &&
                                       std::isfinite(detected.apCorrMagErr[static_cast<std::size_t>(k)])
                                   ? detected.apCorrMagErr[static_cast<std::size_t>(k)]
                                   : 0.0;
        const double f = ap.flux[static_cast<std::size_t>(k)][i],
                     e = ap.fluxErr[static_cast<std::size_t>(k)][i];
        res.magTotal[i] = -2.5 * std::log10(f) + corr;
        res.magTotalErr[i] = std::hypot(2.5 / std::log(10.0) * e / f, corrErr);
    }
    return res;
}

} // namespace gpuphot
