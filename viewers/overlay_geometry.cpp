#include "viewers/overlay_geometry.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gpuphot::viewers {

namespace {
constexpr float kDegToRad = std::numbers::pi_v<float> / 180.0f;
bool finite(float a, float b) { return std::isfinite(a) && std::isfinite(b); }
} // namespace

std::vector<EllipseInstance> buildSourceEllipses(std::span<const Marker> markers, const OverlayStyle& style) {
    std::vector<EllipseInstance> out;
    out.reserve(markers.size());
    for (const Marker& m : markers) {
        float a = std::isfinite(m.a) ? m.a : 0.f, b = std::isfinite(m.b) ? m.b : 0.f;
        const float th = std::isfinite(m.theta) ? m.theta * kDegToRad : 0.f;
        a = std::max(style.minSemiAxis, style.sourceScale * a);
        b = std::max(style.minSemiAxis, style.sourceScale * b);
        // Non-finite positions still take their slot (the index is the source index) but sit far away.
        const float x = finite(m.x, m.y) ? m.x : -1e9f, y = finite(m.x, m.y) ? m.y : -1e9f;
        out.push_back({x, y, a, b, th, m.flags ? style.flaggedColour : style.sourceColour});
    }
    return out;
}

std::vector<EllipseInstance> buildApertureCircles(std::span<const Marker> markers, std::span<const float> radii,
                                                  float annulusInner, float annulusOuter, const OverlayStyle& style) {
    std::vector<EllipseInstance> out;
    const std::size_t per = radii.size() + (annulusInner > 0) + (annulusOuter > 0);
    out.reserve(markers.size() * per);
    for (const Marker& m : markers) {
        if (!finite(m.x, m.y)) continue;
        for (float r : radii)
            if (r > 0) out.push_back({m.x, m.y, r, r, 0.f, style.apertureColour});
        if (annulusInner > 0) out.push_back({m.x, m.y, annulusInner, annulusInner, 0.f, style.annulusColour});
        if (annulusOuter > 0) out.push_back({m.x, m.y, annulusOuter, annulusOuter, 0.f, style.annulusColour});
    }
    return out;
}

std::vector<EllipseInstance> buildReferenceCircles(std::span<const Vector2> positions, const OverlayStyle& style) {
    std::vector<EllipseInstance> out;
    out.reserve(positions.size());
    const float r = style.referenceRadius;
    for (const Vector2& p : positions)
        if (finite(p.x, p.y)) out.push_back({p.x, p.y, r, r, 0.f, style.referenceColour});
    return out;
}

std::vector<SegmentInstance> buildWhiskers(std::span<const Vector2> whiskers, const OverlayStyle& style) {
    std::vector<SegmentInstance> out;
    out.reserve(whiskers.size());
    for (const Vector2& w : whiskers) {
        if (!finite(w.x, w.y) || !finite(w.dx, w.dy)) continue;
        const float dx = w.dx * style.whiskerScale, dy = w.dy * style.whiskerScale;
        out.push_back({w.x - 0.5f * dx, w.y - 0.5f * dy, dx, dy, style.whiskerColour});
    }
    return out;
}

std::vector<SegmentInstance> buildResidualArrows(std::span<const Vector2> vectors, float exaggeration,
                                                 const OverlayStyle& style) {
    std::vector<SegmentInstance> out;
    out.reserve(vectors.size());
    for (const Vector2& v : vectors) {
        if (!finite(v.x, v.y) || !finite(v.dx, v.dy)) continue;
        out.push_back({v.x, v.y, v.dx * exaggeration, v.dy * exaggeration, style.residualColour});
    }
    return out;
}

std::array<float, 2> ellipseOutlinePoint(const EllipseInstance& e, int k, int n) {
    const float phi = 2.0f * std::numbers::pi_v<float> * static_cast<float>(k) / static_cast<float>(n);
    const float u = e.a * std::cos(phi), v = e.b * std::sin(phi);
    const float c = std::cos(e.theta), s = std::sin(e.theta);
    return {e.x + c * u - s * v, e.y + s * u + c * v};
}

int ellipseSegments(float axisPx) {
    if (!(axisPx > 0)) return 8;
    const int n = static_cast<int>(std::ceil(axisPx * 0.75f));
    return std::clamp((n + 3) / 4 * 4, 8, 128);
}

} // namespace gpuphot::viewers
