#pragma once
// Exact geometric overlap of circular and elliptical apertures with pixels (unit squares centred at
// integer coordinates). Used by stage 4 (aperture photometry); no sampling anywhere.
//
// Circle: the area of disc ∩ rectangle is split into the parts above and below the disc's centre line;
// each part is the integral over x of clamp(sqrt(r^2 - x^2), bottom, top) - bottom, integrated in closed
// form with the antiderivative of sqrt(r^2 - x^2) (the arcsine difference taken as one atan of the
// angle-difference identity, accurate for short intervals at large radii). A pixel cut by the arc costs
// one arctangent; pixels wholly inside or outside are answered from their nearest/farthest corner
// distances without any transcendental call.
//
// Ellipse: an affine map turns the ellipse into the unit disc and the pixel into a parallelogram; the
// area of disc ∩ convex polygon is the sum of the polygon's edge pieces inside the disc (triangles with
// the centre) and of circular sectors along the stretches outside. The pixel's overlap is that area
// times the Jacobian (A*B). Also exact (to rounding); no subsampling.
//
// Everything here is inline and GPUPHOT_HD: the CUDA aperture kernels (kernels/aperture/aperture.cu) call the
// same code. The arctangents are overlapAtan/overlapAtan2 below, built from +, -, *, / and sqrt only
// (all correctly rounded on the host and on the device), so host and device weights agree bitwise; the
// C library's atan and CUDA's differ in the last bit for some arguments.
#include <algorithm>
#include <cmath>

#include "core/util/hd.hpp"

namespace gpuphot {

namespace overlap_detail {

inline constexpr double kPi = 3.141592653589793238462643383279502884;
inline constexpr double kHalfPi = 1.570796326794896619231321691639751442;

// atan(x) for any x (NaN passes through), within a few ulp: |x| > 1 by atan(x) = pi/2 - atan(1/x), then
// two half-angle steps atan(t) = 2 atan(t / (1 + sqrt(1 + t^2))) to |t| <= tan(pi/16) ~ 0.199, where the
// Taylor series to t^29 is converged (0.0396^15 / 31 < 1e-22).
GPUPHOT_HD inline double overlapAtan(double x) {
    if (!(x == x)) return x;
    const bool neg = x < 0.0;
    double a = neg ? -x : x;
    const bool inv = a > 1.0;
    if (inv) a = 1.0 / a;
    double t = a / (1.0 + std::sqrt(1.0 + a * a));
    t = t / (1.0 + std::sqrt(1.0 + t * t));
    const double t2 = t * t;
    double p = -1.0 / 29.0;
    p = p * t2 + 1.0 / 27.0;
    p = p * t2 - 1.0 / 25.0;
    p = p * t2 + 1.0 / 23.0;
    p = p * t2 - 1.0 / 21.0;
    p = p * t2 + 1.0 / 19.0;
    p = p * t2 - 1.0 / 17.0;
    p = p * t2 + 1.0 / 15.0;
    p = p * t2 - 1.0 / 13.0;
    p = p * t2 + 1.0 / 11.0;
    p = p * t2 - 1.0 / 9.0;
    p = p * t2 + 1.0 / 7.0;
    p = p * t2 - 1.0 / 5.0;
    p = p * t2 + 1.0 / 3.0;
    double r = 4.0 * (t - t * (t2 * p));
    if (inv) r = kHalfPi - r;
    return neg ? -r : r;
}

// atan2(y, x) in (-pi, pi] from overlapAtan; atan2(±0, x >= +0) = ±0, atan2(±0, x < 0 or -0) = ±pi.
GPUPHOT_HD inline double overlapAtan2(double y, double x) {
    if (!(x == x) || !(y == y)) return x + y;
    const double ax = x < 0.0 ? -x : x, ay = y < 0.0 ? -y : y;
    double r;
    if (ay == 0.0 && ax == 0.0)
        r = std::signbit(x) ? kPi : 0.0;
    else if (ay <= ax)
        r = overlapAtan(ay / ax);
    else
        r = kHalfPi - overlapAtan(ax / ay);
    if (x < 0.0 && !(ay == 0.0 && ax == 0.0)) r = kPi - r;
    return std::signbit(y) ? -r : r;
}

// ∫_a^b sqrt(r^2 - x^2) dx for -r <= a <= b <= r. The arcsine difference is taken as one atan2 of the
// angle-difference identity, which stays accurate for a short interval at a large radius.
GPUPHOT_HD inline double chordIntegral(double a, double b, double r) {
    const double r2 = r * r;
    const double ha = std::sqrt(std::max(0.0, r2 - a * a));
    const double hb = std::sqrt(std::max(0.0, r2 - b * b));
    const double sinD = b * ha - a * hb, cosD = hb * ha + a * b; // times r^2
    // atan suffices when the angle is below pi/2 (any short interval)
    const double dAsin = cosD > 0.0 ? overlapAtan(sinD / cosD) : overlapAtan2(sinD, cosD);
    return 0.5 * (b * hb - a * ha) + 0.5 * r2 * dAsin;
}

// Area of {y >= 0} ∩ disc ∩ [x0, x1] x [y0, y1], as the integral over x of clamp(h(x), lo, hi) - lo with
// h(x) = sqrt(r^2 - x^2), lo = max(y0, 0), hi = y1: the integrand is hi - lo where the arc is above the
// rectangle (|x| <= wh), h(x) - lo where the arc passes through it (wh < |x| <= wl), 0 elsewhere. A pixel
// cut by the arc on one side of x = 0 costs one arcsine difference.
GPUPHOT_HD inline double upperHalfOverlap(double x0, double y0, double x1, double y1, double r) {
    const double lo = std::max(y0, 0.0), hi = y1;
    if (!(hi > lo) || !(lo < r)) return 0.0;
    const double r2 = r * r;
    const double wl = std::sqrt(r2 - lo * lo);
    const double a = std::max(x0, -wl), b = std::min(x1, wl);
    if (!(b > a)) return 0.0;
    const double wh = hi < r ? std::sqrt(r2 - hi * hi) : 0.0;
    double s = 0.0;
    // flat part |x| <= wh
    const double fa = std::max(a, -wh), fb = std::min(b, wh);
    if (fb > fa) s += (hi - lo) * (fb - fa);
    // arc parts [-wl, -wh] and [wh, wl]
    const double la = a, lb = std::min(b, -wh);
    if (lb > la) s += chordIntegral(la, lb, r) - lo * (lb - la);
    const double ra = std::max(a, wh), rb = b;
    if (rb > ra) s += chordIntegral(ra, rb, r) - lo * (rb - ra);
    return s;
}

GPUPHOT_HD inline double cross(double ax, double ay, double bx, double by) {
    return ax * by - ay * bx;
}

GPUPHOT_HD inline double sector(double ux, double uy, double vx, double vy) {
    return 0.5 * overlapAtan2(cross(ux, uy, vx, vy), ux * vx + uy * vy);
}

// Signed area of unit disc ∩ triangle(origin, P, Q).
GPUPHOT_HD inline double discTriangle(double px, double py, double qx, double qy) {
    const double dx = qx - px, dy = qy - py;
    const double A = dx * dx + dy * dy;
    if (A <= 0.0) return 0.0;
    const double B = px * dx + py * dy; // half of the linear coefficient
    const double C = px * px + py * py - 1.0;
    const double disc = B * B - A * C;
    if (disc <= 0.0) return sector(px, py, qx, qy); // the edge's line misses the disc
    const double sq = std::sqrt(disc);
    const double t1 = (-B - sq) / A, t2 = (-B + sq) / A;
    if (t2 <= 0.0 || t1 >= 1.0) return sector(px, py, qx, qy); // the edge itself stays outside
    double s = 0.0;
    double p1x = px, p1y = py, p2x = qx, p2y = qy;
    if (t1 > 0.0) { // enters the disc at t1: a sector from P up to there
        p1x = px + t1 * dx;
        p1y = py + t1 * dy;
        s += sector(px, py, p1x, p1y);
    }
    if (t2 < 1.0) { // leaves the disc at t2: a sector from there to Q
        p2x = px + t2 * dx;
        p2y = py + t2 * dy;
        s += sector(p2x, p2y, qx, qy);
    }
    return s + 0.5 * cross(p1x, p1y, p2x, p2y);
}

// Area of unit disc ∩ convex quadrilateral that does not contain the origin and subtends less than pi
// from it: the inside pieces of the edges (triangles with the origin) plus one sector per stretch of
// the boundary outside the disc, so usually a single atan2.
GPUPHOT_HD inline double discQuadOverlapSmall(const double* xs, const double* ys) {
    double inX0[4], inY0[4], inX1[4], inY1[4];
    bool startsAtVertex[4], endsAtVertex[4];
    int m = 0;
    for (int i = 0; i < 4; ++i) {
        const int j = (i + 1) & 3;
        const double px = xs[i], py = ys[i];
        const double dx = xs[j] - px, dy = ys[j] - py;
        const double A = dx * dx + dy * dy;
        if (A <= 0.0) continue;
        const double B = px * dx + py * dy;
        const double C = px * px + py * py - 1.0;
        const double disc = B * B - A * C;
        if (disc <= 0.0) continue;
        const double sq = std::sqrt(disc);
        const double t1 = std::max(0.0, (-B - sq) / A), t2 = std::min(1.0, (-B + sq) / A);
        if (!(t2 > t1)) continue;
        inX0[m] = px + t1 * dx;
        inY0[m] = py + t1 * dy;
        inX1[m] = t2 >= 1.0 ? xs[j] : px + t2 * dx;
        inY1[m] = t2 >= 1.0 ? ys[j] : py + t2 * dy;
        if (t1 <= 0.0) {
            inX0[m] = px;
            inY0[m] = py;
        }
        startsAtVertex[m] = t1 <= 0.0;
        endsAtVertex[m] = t2 >= 1.0;
        ++m;
    }
    double s = 0.0;
    for (int k = 0; k < m; ++k) {
        s += 0.5 * cross(inX0[k], inY0[k], inX1[k], inY1[k]);
        const int next = (k + 1) % m;
        if (!(endsAtVertex[k] && startsAtVertex[next])) // an arc from this exit to the next entry
            s += 0.5 * overlapAtan2(cross(inX1[k], inY1[k], inX0[next], inY0[next]),
                                    inX1[k] * inX0[next] + inY1[k] * inY0[next]);
    }
    return s;
}

} // namespace overlap_detail

// Area of the intersection of the disc of radius r centred at the origin with the rectangle
// [x0, x1] x [y0, y1] (x0 <= x1, y0 <= y1). Exact to rounding.
GPUPHOT_HD inline double circleRectOverlap(double x0, double y0, double x1, double y1, double r) {
    if (!(r > 0.0)) return 0.0;
    return overlap_detail::upperHalfOverlap(x0, y0, x1, y1, r) +
           overlap_detail::upperHalfOverlap(x0, -y1, x1, -y0, r);
}

// Overlap (0..1) of pixel (px, py), the unit square [px-0.5, px+0.5] x [py-0.5, py+0.5], with the disc of
// radius r centred at (cx, cy). Fast paths for pixels wholly inside or outside.
GPUPHOT_HD inline double circlePixelOverlap(double cx, double cy, double r, int px, int py) {
    const double x0 = px - 0.5 - cx, x1 = x0 + 1.0;
    const double y0 = py - 0.5 - cy, y1 = y0 + 1.0;
    const double nx = x0 > 0.0 ? x0 : (x1 < 0.0 ? x1 : 0.0);
    const double ny = y0 > 0.0 ? y0 : (y1 < 0.0 ? y1 : 0.0);
    const double r2 = r * r;
    if (nx * nx + ny * ny >= r2) return 0.0;
    const double fx = std::max(x0 * x0, x1 * x1), fy = std::max(y0 * y0, y1 * y1);
    if (fx + fy <= r2) return 1.0;
    return circleRectOverlap(x0, y0, x1, y1, r);
}

// Signed area of the intersection of the unit disc (centre at the origin) with the polygon whose n
// vertices are (xs[i], ys[i]); positive for counter-clockwise polygons. Exact for convex polygons and
// for any simple polygon (edge-wise decomposition).
GPUPHOT_HD inline double unitDiscPolygonOverlap(const double* xs, const double* ys, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) {
        const int j = (i + 1 == n) ? 0 : i + 1;
        s += overlap_detail::discTriangle(xs[i], ys[i], xs[j], ys[j]);
    }
    return s;
}

// An elliptical aperture: centre, semi-axes A (along theta) and B, theta in radians counter-clockwise
// from +x. Precomputes the map to the unit disc so that per-pixel calls are cheap. Trivially copyable
// (the CUDA kernels take it by value).
class EllipseAperture {
public:
    EllipseAperture() = default;
    EllipseAperture(double cx, double cy, double semiA, double semiB, double theta)
        : EllipseAperture(cx, cy, semiA, semiB, std::cos(theta), std::sin(theta)) {}
    // With cos(theta) and sin(theta) given (computed once on the host).
    GPUPHOT_HD EllipseAperture(double cx, double cy, double semiA, double semiB, double cosTheta,
                               double sinTheta)
        : m_cx(cx), m_cy(cy), m_a(semiA), m_b(semiB), m_cos(cosTheta), m_sin(sinTheta), m_invA(1.0 / semiA),
          m_invB(1.0 / semiB) {
        const double margin = std::sqrt(0.5) / std::min(semiA, semiB);
        m_small = margin < 0.5;
        m_inside2 = margin < 1.0 ? (1.0 - margin) * (1.0 - margin) : -1.0;
        m_outside2 = (1.0 + margin) * (1.0 + margin);
        m_hx = std::sqrt(semiA * semiA * m_cos * m_cos + semiB * semiB * m_sin * m_sin);
        m_hy = std::sqrt(semiA * semiA * m_sin * m_sin + semiB * semiB * m_cos * m_cos);
    }

    // Squared normalised radius of the offset (dx, dy) from the centre (1 on the boundary).
    GPUPHOT_HD double normRadius2(double dx, double dy) const {
        const double u = (dx * m_cos + dy * m_sin) * m_invA;
        const double v = (-dx * m_sin + dy * m_cos) * m_invB;
        return u * u + v * v;
    }
    // Overlap (0..1) of pixel (px, py) with the ellipse. Fast paths for pixels wholly inside or outside
    // (normalised radius of the pixel centre +- the pixel's half diagonal over the minor semi-axis).
    GPUPHOT_HD double pixelOverlap(int px, int py) const {
        const double dx = px - m_cx, dy = py - m_cy;
        const double rho2 = normRadius2(dx, dy);
        if (rho2 >= m_outside2) return 0.0;
        if (rho2 <= m_inside2) return 1.0;
        // corners counter-clockwise, mapped to the frame where the ellipse is the unit disc
        const double cxs[4] = {dx - 0.5, dx + 0.5, dx + 0.5, dx - 0.5};
        const double cys[4] = {dy - 0.5, dy - 0.5, dy + 0.5, dy + 0.5};
        double us[4], vs[4];
        for (int k = 0; k < 4; ++k) {
            us[k] = (cxs[k] * m_cos + cys[k] * m_sin) * m_invA;
            vs[k] = (-cxs[k] * m_sin + cys[k] * m_cos) * m_invB;
        }
        // boundary pixels of an ellipse whose minor axis exceeds the pixel's diagonal neither contain the
        // centre nor subtend pi: the one-arc form applies; otherwise the edge-wise decomposition
        const double unit =
            m_small ? overlap_detail::discQuadOverlapSmall(us, vs) : unitDiscPolygonOverlap(us, vs, 4);
        const double f = unit * m_a * m_b;
        return std::clamp(f, 0.0, 1.0);
    }
    GPUPHOT_HD double centreX() const { return m_cx; }
    GPUPHOT_HD double centreY() const { return m_cy; }
    // Half-widths of the ellipse's bounding box (px).
    GPUPHOT_HD double halfWidthX() const { return m_hx; }
    GPUPHOT_HD double halfWidthY() const { return m_hy; }

private:
    double m_cx = 0, m_cy = 0, m_a = 1, m_b = 1, m_cos = 1, m_sin = 0, m_invA = 1, m_invB = 1, m_inside2 = 0,
           m_outside2 = 0, m_hx = 0, m_hy = 0;
    bool m_small = false;
};

} // namespace gpuphot
