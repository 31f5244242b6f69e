#include "ui/overlay_builder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/wcs/wcs.hpp"

namespace gpuphot::ui {
namespace {

// Indices into the crossmatch's projected reference stars: all of them, or the `limit` brightest (by the
// catalog's magnitude; stars without one last), in their original order.
std::vector<std::size_t> brightestReferences(const CrossmatchResult& cm, const ReferenceCatalog* ref,
                                             int limit) {
    const std::size_t n = std::min(cm.refX.size(), cm.refY.size());
    std::vector<std::size_t> idx(n);
    std::iota(idx.begin(), idx.end(), std::size_t(0));
    if (limit <= 0 || n <= static_cast<std::size_t>(limit) || !ref || cm.refSelected.size() < n) return idx;
    const auto mag = [&](std::size_t k) {
        const auto row = static_cast<std::size_t>(cm.refSelected[k]);
        const double m = row < ref->mag.size() ? ref->mag[row] : NAN;
        return std::isfinite(m) ? m : INFINITY;
    };
    std::nth_element(idx.begin(), idx.begin() + limit, idx.end(), [&](std::size_t a, std::size_t b) {
        return mag(a) < mag(b) || (mag(a) == mag(b) && a < b);
    });
    idx.resize(static_cast<std::size_t>(limit));
    std::sort(idx.begin(), idx.end());
    return idx;
}

} // namespace

OverlayGeometry buildOverlays(const Snapshot& snap, const OverlayOptions& opt) {
    OverlayGeometry g;
    const PipelineResult& r = snap.result;
    const Sources& s = r.detection.sources;
    g.sources.reserve(s.size());
    for (std::size_t i = 0; i < s.size(); ++i)
        g.sources.push_back({static_cast<float>(s.x[i]), static_cast<float>(s.y[i]), static_cast<float>(s.a[i]),
                             static_cast<float>(s.b[i]), static_cast<float>(s.theta[i]), s.flags[i]});
    for (double rad : r.aperture.radii)
        g.apertureRadii.push_back(static_cast<float>(rad));
    const ApertureParams& ap = snap.config.aperture;
    const double scale = ap.annulusInFwhm ? r.fwhm : 1.0;
    g.annulusInner = static_cast<float>(ap.annulusInner * scale);
    g.annulusOuter = static_cast<float>(ap.annulusOuter * scale);

    const PsfResult& psf = r.psf;
    if (psf.hasModel() && psf.width > 0 && psf.height > 0 && opt.whiskerGrid > 0) {
        const int n = opt.whiskerGrid;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < n; ++i) {
                const double x = (i + 0.5) * psf.width / n - 0.5, y = (j + 0.5) * psf.height / n - 0.5;
                const double len = psf.fwhmAt(x, y) * psf.ellipticityAt(x, y) * opt.whiskerGain;
                const double th = psf.thetaAt(x, y) * M_PI / 180.0;
                g.whiskers.push_back({static_cast<float>(x), static_cast<float>(y),
                                      static_cast<float>(len * std::cos(th)), static_cast<float>(len * std::sin(th))});
            }
    }

    const CrossmatchResult& cm = r.crossmatch;
    for (std::size_t k : brightestReferences(cm, snap.reference.get(), opt.maxReferenceStars))
        g.referenceStars.push_back({static_cast<float>(cm.refX[k]), static_cast<float>(cm.refY[k]), 0.0f, 0.0f});

    // Residuals: reference minus measured position through the fitted WCS, in pixels.
    const AstrometryResult& as = r.astrometry;
    if (as.ok && r.fittedWcs && snap.reference) {
        const ReferenceCatalog& ref = *snap.reference;
        for (std::size_t k = 0; k < as.sourceIndex.size(); ++k) {
            const int si = as.sourceIndex[k], ri = as.refIndex[k];
            if (si < 0 || ri < 0 || static_cast<std::size_t>(si) >= s.size() ||
                static_cast<std::size_t>(ri) >= ref.ra.size())
                continue;
            const auto [px, py] = r.fittedWcs->worldToPixel(ref.ra[ri], ref.dec[ri]);
            if (!std::isfinite(px) || !std::isfinite(py)) continue;
            g.residuals.push_back({static_cast<float>(s.x[si]), static_cast<float>(s.y[si]),
                                   static_cast<float>(px - s.x[si]), static_cast<float>(py - s.y[si])});
        }
    }
    return g;
}

} // namespace gpuphot::ui
