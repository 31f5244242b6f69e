#include "ui/overlay_builder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <QColor>

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
        g.sources.push_back({static_cast<float>(s.x[i]), static_cast<float>(s.y[i]),
                             static_cast<float>(s.a[i]), static_cast<float>(s.b[i]),
                             static_cast<float>(s.theta[i]), s.flags[i]});
    for (double rad : r.aperture.radii)
        g.apertureRadii.push_back(static_cast<float>(rad));
    const ApertureParams& ap = snap.config.aperture;
    const double scale = ap.annulusInFwhm ? r.fwhm : 1.0;
    g.annulusInner = static_cast<float>(ap.annulusInner * scale);
    g.annulusOuter = static_cast<float>(ap.annulusOuter * scale);

    const PsfResult& psf = r.psf;
    if (psf.hasModel() && psf.width > 0 && psf.height > 0 && opt.whiskerGrid > 0) {
        const int n = opt.whiskerGrid;
        struct Shape {
            double x, y, fe, theta;
        };
        std::vector<Shape> grid;
        double longest = 0.0;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < n; ++i) {
                const double x = (i + 0.5) * psf.width / n - 0.5, y = (j + 0.5) * psf.height / n - 0.5;
                const PsfResult::ShapeAt at = psf.shapeAt(x, y);
                const double fe = at.fwhm * at.ellipticity;
                if (std::isfinite(fe)) longest = std::max(longest, std::fabs(fe));
                grid.push_back({x, y, fe, at.theta});
            }
        const double cell = std::min(psf.width, psf.height) / static_cast<double>(n);
        g.whiskerGain = opt.whiskerGain > 0.0 ? opt.whiskerGain
                        : longest > 0.0       ? OverlayOptions::kWhiskerFill * cell / longest
                                              : 0.0;
        for (const Shape& w : grid) {
            const double len = w.fe * g.whiskerGain, th = w.theta * M_PI / 180.0;
            g.whiskers.push_back({static_cast<float>(w.x), static_cast<float>(w.y),
                                  static_cast<float>(len * std::cos(th)),
                                  static_cast<float>(len * std::sin(th))});
        }
    }

    const CrossmatchResult& cm = r.crossmatch;
    for (std::size_t k : brightestReferences(cm, snap.reference.get(), opt.maxReferenceStars))
        g.referenceStars.push_back(
            {static_cast<float>(cm.refX[k]), static_cast<float>(cm.refY[k]), 0.0f, 0.0f});

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

// ---- DS9 regions -----------------------------------------------------------------------------------
namespace {

// The outline of a circle, ellipse or box: the shape's own axes rotated by its angle about its centre.
std::vector<double> outline(const PixelRegion& p, int segments) {
    const double cx = p.points[0], cy = p.points[1];
    const double t = p.angle * M_PI / 180.0, c = std::cos(t), s = std::sin(t);
    std::vector<std::pair<double, double>> local;
    if (p.shape == RegionShape::Box) {
        const double hw = 0.5 * p.sizes[0], hh = 0.5 * p.sizes[1];
        local = {{-hw, -hh}, {hw, -hh}, {hw, hh}, {-hw, hh}};
    } else {
        const double a = p.sizes[0], b = p.shape == RegionShape::Ellipse ? p.sizes[1] : p.sizes[0];
        for (int k = 0; k < segments; ++k) {
            const double u = 2.0 * M_PI * k / segments;
            local.emplace_back(a * std::cos(u), b * std::sin(u));
        }
    }
    std::vector<double> xy;
    for (const auto& [u, v] : local) {
        xy.push_back(cx + u * c - v * s);
        xy.push_back(cy + u * s + v * c);
    }
    return xy;
}

std::string globalColour(const std::string& global) {
    const std::size_t at = global.find("color=");
    if (at == std::string::npos) return "green";
    const std::size_t end = global.find(' ', at);
    return global.substr(at + 6, end == std::string::npos ? std::string::npos : end - at - 6);
}

} // namespace

std::uint32_t regionColour(const std::string& name) {
    const QColor c(QString::fromStdString(name));
    return c.isValid() ? viewers::packRgba(c.red(), c.green(), c.blue()) : viewers::packRgba(0, 255, 0);
}

RegionOverlay buildRegionOverlay(const RegionFile& file, const Wcs* wcs, int ellipseSegments) {
    RegionOverlay o;
    const std::string fallback = globalColour(file.global);
    for (const Region& r : file.regions) {
        PixelRegion p;
        try {
            p = toPixels(r, wcs);
        } catch (const std::exception& e) {
            o.problems.push_back("line " + std::to_string(r.line) + ": " + e.what());
            continue;
        }
        RegionOutline out;
        out.point = p.shape == RegionShape::Point;
        out.exclude = p.exclude;
        out.rgba = regionColour(r.color.empty() ? fallback : r.color);
        out.text = r.text;
        const bool vertices = p.shape == RegionShape::Polygon || out.point;
        out.xy = vertices ? p.points : outline(p, ellipseSegments);
        o.outlines.push_back(std::move(out));
    }
    return o;
}

} // namespace gpuphot::ui
