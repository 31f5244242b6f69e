#include "core/stages/aperture_overlap.hpp"

#include <algorithm>
#include <cmath>

namespace gpuphot {

namespace {

// ∫_a^b sqrt(r^2 - x^2) dx for -r <= a <= b <= r. The arcsine difference is taken as one atan2 of the
// angle-difference identity, which stays accurate for a short interval at a large radius.
double chordIntegral(double a, double b, double r) {
    const double r2 = r * r;
    const double ha = std::sqrt(std::max(0.0, r2 - a * a));
    const double hb = std::sqrt(std::max(0.0, r2 - b * b));
    const double sinD = b * ha - a * hb, cosD = hb * ha + a * b; // times r^2
    // atan is cheaper than atan2 and exact here when the angle is below pi/2 (any short interval)
    const double dAsin = cosD > 0.0 ? std::atan(sinD / cosD) : std::atan2(sinD, cosD);
    return 0.5 * (b * hb - a * ha) + 0.5 * r2 * dAsin;
}

// Area of {y >= 0} ∩ disc ∩ [x0, x1] x [y0, y1], as the integral over x of clamp(h(x), lo, hi) - lo with
// h(x) = sqrt(r^2 - x^2), lo = max(y0, 0), hi = y1: the integrand is hi - lo where the arc is above the
// rectangle (|x| <= wh), h(x) - lo where the arc passes through it (wh < |x| <= wl), 0 elsewhere. A pixel
// cut by the arc on one side of x = 0 costs one arcsine difference.
double upperHalfOverlap(double x0, double y0, double x1, double y1, double r) {
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

inline double cross(double ax, double ay, double bx, double by) {
    return ax * by - ay * bx;
}

// Signed area of unit disc ∩ triangle(origin, P, Q).
double discTriangle(double px, double py, double qx, double qy) {
    const double dx = qx - px, dy = qy - py;
    const double A = dx * dx + dy * dy;
    auto sector = [](double ux, double uy, double vx, double vy) {
        return 0.5 * std::atan2(cross(ux, uy, vx, vy), ux * vx + uy * vy);
    };
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

} // namespace

double circleRectOverlap(double x0, double y0, double x1, double y1, double r) {
    if (!(r > 0.0)) return 0.0;
    return upperHalfOverlap(x0, y0, x1, y1, r) + upperHalfOverlap(x0, -y1, x1, -y0, r);
}

double circlePixelOverlap(double cx, double cy, double r, int px, int py) {
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

// Area of unit disc ∩ convex quadrilateral that does not contain the origin and subtends less than pi
// from it: the inside pieces of the edges (triangles with the origin) plus one sector per stretch of
// the boundary outside the disc, so usually a single atan2.
static double discQuadOverlapSmall(const double* xs, const double* ys) {
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
            s += 0.5 * std::atan2(cross(inX1[k], inY1[k], inX0[next], inY0[next]),
                                  inX1[k] * inX0[next] + inY1[k] * inY0[next]);
    }
    return s;
}

double unitDiscPolygonOverlap(const double* xs, const double* ys, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) {
        const int j = (i + 1 == n) ? 0 : i + 1;
        s += discTriangle(xs[i], ys[i], xs[j], ys[j]);
    }
    return s;
}

EllipseAperture::EllipseAperture(double cx, double cy, double semiA, double semiB, double theta)
    : m_cx(cx), m_cy(cy), m_a(semiA), m_b(semiB), m_cos(std::cos(theta)), m_sin(std::sin(theta)),
      m_invA(1.0 / semiA), m_invB(1.0 / semiB) {
    const double margin = std::sqrt(0.5) / std::min(semiA, semiB);
    m_small = margin < 0.5;
    m_inside2 = margin < 1.0 ? (1.0 - margin) * (1.0 - margin) : -1.0;
    m_outside2 = (1.0 + margin) * (1.0 + margin);
    m_hx = std::sqrt(semiA * semiA * m_cos * m_cos + semiB * semiB * m_sin * m_sin);
    m_hy = std::sqrt(semiA * semiA * m_sin * m_sin + semiB * semiB * m_cos * m_cos);
}

double EllipseAperture::pixelOverlap(int px, int py) const {
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
    const double unit = m_small ? discQuadOverlapSmall(us, vs) : unitDiscPolygonOverlap(us, vs, 4);
    const double f = unit * m_a * m_b;
    return std::clamp(f, 0.0, 1.0);
}

} // namespace gpuphot
