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

namespace gpuphot {

// Area of the intersection of the disc of radius r centred at the origin with the rectangle
// [x0, x1] x [y0, y1] (x0 <= x1, y0 <= y1). Exact to rounding.
double circleRectOverlap(double x0, double y0, double x1, double y1, double r);

// Overlap (0..1) of pixel (px, py), the unit square [px-0.5, px+0.5] x [py-0.5, py+0.5], with the disc of
// radius r centred at (cx, cy). Fast paths for pixels wholly inside or outside.
double circlePixelOverlap(double cx, double cy, double r, int px, int py);

// Signed area of the intersection of the unit disc (centre at the origin) with the polygon whose n
// vertices are (xs[i], ys[i]); positive for counter-clockwise polygons. Exact for convex polygons and
// for any simple polygon (edge-wise decomposition).
double unitDiscPolygonOverlap(const double* xs, const double* ys, int n);

// An elliptical aperture: centre, semi-axes A (along theta) and B, theta in radians counter-clockwise
// from +x. Precomputes the map to the unit disc so that per-pixel calls are cheap.
class EllipseAperture {
public:
    EllipseAperture(double cx, double cy, double semiA, double semiB, double theta);

    // Squared normalised radius of the offset (dx, dy) from the centre (1 on the boundary).
    double normRadius2(double dx, double dy) const {
        const double u = (dx * m_cos + dy * m_sin) * m_invA;
        const double v = (-dx * m_sin + dy * m_cos) * m_invB;
        return u * u + v * v;
    }
    // Overlap (0..1) of pixel (px, py) with the ellipse. Fast paths for pixels wholly inside or outside
    // (normalised radius of the pixel centre +- the pixel's half diagonal over the minor semi-axis).
    double pixelOverlap(int px, int py) const;
    // Half-widths of the ellipse's bounding box (px).
    double halfWidthX() const { return m_hx; }
    double halfWidthY() const { return m_hy; }

private:
    double m_cx, m_cy, m_a, m_b, m_cos, m_sin, m_invA, m_invB, m_inside2, m_outside2, m_hx, m_hy;
    bool m_small;
};

} // namespace gpuphot
