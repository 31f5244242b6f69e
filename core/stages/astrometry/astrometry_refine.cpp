// Stage 7 internals: iterative refinement of a starting WCS (matching, clipping, SIP order selection,
// verification).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <optional>
#include <string>

#include <Eigen/Dense>

#include "core/stages/astrometry/astrometry_internal.hpp"

namespace gpuphot::astrom {
namespace {
constexpr double kPi = std::numbers::pi;

struct Projected {
    std::vector<double> x, y;
    std::vector<std::int32_t> ids; // into RefStars, brightest first
    std::size_t onFrame = 0;       // of them inside the frame proper
};

// nanoflann's L2_Simple metric between a query and a point, in its order of operations, so that a linear
// scan selects exactly what SkyTree::cone (radiusSearch: dist < c * c) selects.
inline double chord2(const std::array<double, 3>& q, const std::array<double, 3>& p) {
    double r = 0.0;
    for (int k = 0; k < 3; ++k) {
        const double d = q[k] - p[k];
        r += d * d;
    }
    return r;
}

// Cells of a grid (nx x ny) that lie within one cell (3 x 3 neighbourhood) of a marked cell, as one bit per
// cell of the grid extended by one cell on each side: near() is one lookup in a compact bitmap (a byte
// grid with 3 x 3 probes per query missed the cache at every star).
class NearMask {
public:
    NearMask(long long nx, long long ny)
        : m_w(nx + 2), m_h(ny + 2), m_bits(static_cast<std::size_t>((m_w * m_h + 63) / 64), 0) {}
    // Marks cell (cx, cy), 0 <= cx < nx, 0 <= cy < ny.
    void mark(long long cx, long long cy) {
        for (long long ey = cy; ey <= cy + 2; ++ey)
            for (long long ex = cx; ex <= cx + 2; ++ex) {
                const auto b = static_cast<std::size_t>(ey * m_w + ex);
                m_bits[b >> 6] |= std::uint64_t{1} << (b & 63);
            }
    }
    // Whether a marked cell lies within one cell of cell (fx, fy) (floored cell coordinates, any value).
    bool near(double fx, double fy) const {
        if (!(fx >= -1.0 && fy >= -1.0 && fx <= double(m_w - 2) && fy <= double(m_h - 2))) return false;
        const auto b =
            static_cast<std::size_t>((static_cast<long long>(fy) + 1) * m_w + static_cast<long long>(fx) + 1);
        return (m_bits[b >> 6] >> (b & 63)) & 1u;
    }

private:
    long long m_w, m_h;
    std::vector<std::uint64_t> m_bits;
};

// The reference stars a refinement can ever project, cut ONCE from the whole catalog: a cone around the
// starting WCS's frame centre, twice as wide as the first projection cone (which covers the frame with
// 20% to spare). Later cones (the WCS moves by pixels, not by half a field) are answered from this cut
// when they lie inside it (centre distance + radius <= cut radius, with a rounding allowance), else from
// the whole catalog, so the selection is always the same as a cone search of the whole catalog.
// Rows stay in ascending order (brightest first).
class RefPool {
public:
    RefPool(const RefStars& refs, const SkyTree* tree, const TanSip& start, int width, int height,
            double marginPx)
        : m_refs(refs), m_tree(tree) {
        double ra0 = 0, dec0 = 0;
        start.pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1), ra0, dec0);
        const double scaleDeg = start.pixelScaleArcsec() / 3600.0;
        m_radius = 2.0 * (0.5 * std::hypot(width, height) * 1.2 + marginPx) * scaleDeg;
        m_centre = unitVector(ra0, dec0);
        if (!(m_radius < 60.0) || !std::isfinite(ra0) || !std::isfinite(dec0)) return; // no useful cut
        m_rows = select(m_centre, m_radius, nullptr);
        m_cut = true;
    }

    // Rows within radiusDeg of `centre`, ascending.
    std::vector<std::uint32_t> cone(double ra, double dec, double radiusDeg) const {
        const std::array<double, 3> c = unitVector(ra, dec);
        if (m_cut) {
            const double sep = degFromChord(std::sqrt(chord2(c, m_centre)));
            if (sep + radiusDeg + 1e-6 <= m_radius) return select(c, radiusDeg, &m_rows);
        }
        return select(c, radiusDeg, nullptr);
    }

private:
    std::vector<std::uint32_t> select(const std::array<double, 3>& c, double radiusDeg,
                                      const std::vector<std::uint32_t>* from) const {
        if (!from && m_tree) {
            std::vector<std::uint32_t> ids = m_tree->cone(c, radiusDeg);
            std::sort(ids.begin(), ids.end());
            return ids;
        }
        const double ch = chordFromDeg(radiusDeg), c2 = ch * ch;
        std::vector<std::uint32_t> out;
        if (from) {
            for (std::uint32_t id : *from)
                if (chord2(c, m_refs.xyz[id]) < c2) out.push_back(id);
        } else {
            for (std::size_t id = 0; id < m_refs.size(); ++id)
                if (chord2(c, m_refs.xyz[id]) < c2) out.push_back(static_cast<std::uint32_t>(id));
        }
        return out;
    }

    const RefStars& m_refs;
    const SkyTree* m_tree;
    std::array<double, 3> m_centre{};
    double m_radius = 0.0;
    bool m_cut = false;
    std::vector<std::uint32_t> m_rows;
};

// Projects the reference stars of the frame's cone with w (per-star closed form, in parallel: each star's
// result is independent of the thread count) and keeps those within the frame + marginPx, brightest
// first. limit > 0: stop once at least `limit` stars are kept (the first `limit` are the same as without
// a limit; onFrame then counts only the kept ones).
Projected projectRefs(const RefStars& refs, const RefPool& pool, const TanSip& w, int width, int height,
                      double marginPx, int threads, std::size_t limit = 0) {
    Projected out;
    double ra0 = 0, dec0 = 0;
    w.pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1), ra0, dec0);
    const double scaleDeg = w.pixelScaleArcsec() / 3600.0;
    const double radius = (0.5 * std::hypot(width, height) * 1.2 + marginPx) * scaleDeg;
    const std::vector<std::uint32_t> ids = pool.cone(ra0, dec0, std::min(radius, 89.0));
    const std::size_t n = ids.size();
    // Blocks: all at once without a limit, else growing blocks so that few stars are projected in vain.
    std::size_t block = limit > 0 ? std::max<std::size_t>(4096, 2 * limit) : n;
    std::vector<double> px, py;
    std::vector<char> ok;
    for (std::size_t begin = 0; begin < n; begin += block, block *= 2) {
        const std::size_t m = std::min(block, n - begin);
        px.resize(m);
        py.resize(m);
        ok.resize(m);
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (m > 4096)
        for (long long k = 0; k < static_cast<long long>(m); ++k) {
            const std::uint32_t id = ids[begin + k];
            double x = 0, y = 0;
            ok[k] = w.worldToPixel(refs.ra[id], refs.dec[id], x, y) && std::isfinite(x) && std::isfinite(y);
            px[k] = x;
            py[k] = y;
        }
        for (std::size_t k = 0; k < m; ++k) {
            if (!ok[k]) continue;
            const double x = px[k], y = py[k];
            if (x < -marginPx || y < -marginPx || x > width - 1 + marginPx || y > height - 1 + marginPx)
                continue;
            out.x.push_back(x);
            out.y.push_back(y);
            out.ids.push_back(static_cast<std::int32_t>(ids[begin + k]));
            if (x >= -0.5 && y >= -0.5 && x <= width - 0.5 && y <= height - 0.5) ++out.onFrame;
        }
        if (limit > 0 && out.x.size() >= limit) break;
    }
    return out;
}

// Stage B's projection: only the reference stars of the frame's cone that can lie within `radius` (px) of a
// detection of `d` are projected exactly (TanSip::worldToPixel, Newton on the SIP); the others are dropped
// after a closed-form pre-selection. For each star its undistorted pixel position p' = p + S(p) (S: the SIP
// distortion) follows from the tangent-plane coordinates (dot products with the tangent point's basis) and
// CD^-1 without iterations; detections are mapped the same way (forward SIP). |p'_ref - p'_det| <=
// (1 + g) |p_ref - p_det|, g a bound on the SIP Jacobian over the frame (grid estimate x 1.5 + 1e-3), so a
// cell grid (cells >= (1 + g) radius) over the detections' p' keeps every star that can match. The result
// (stars within frame + radius, ascending order, exact positions) is the subset of projectRefs' result that
// matchInPixels can use, so the matches are the same. countOnFrame: onFrame counts every star of the cone
// on the frame proper, exactly: p' decides away from the frame's edges (|p - p'| = |S(p)| <= a bound from
// the same grid), stars in a band around the edges are projected exactly.
// Bounds of the SIP distortion S over the frame + marginPx (+10%): largest displacement |S| and largest
// Jacobian norm (Frobenius, by unit differences), on a 25 x 25 grid.
void sipBounds(const TanSip& w, int width, int height, double marginPx, double& maxDisp, double& maxJac) {
    maxDisp = maxJac = 0.0;
    if (w.sipOrder <= 0) return;
    const int g = 24;
    const double ext = marginPx + 0.1 * std::max(width, height) + 1.0;
    for (int j = 0; j <= g; ++j)
        for (int i = 0; i <= g; ++i) {
            const double x = -0.5 - ext + (width + 2 * ext) * i / g,
                         y = -0.5 - ext + (height + 2 * ext) * j / g;
            const double u = x + 1.0 - w.crpix[0], v = y + 1.0 - w.crpix[1];
            double du = 0, dv = 0, du1 = 0, dv1 = 0, du2 = 0, dv2 = 0;
            w.distort(u, v, du, dv);
            w.distort(u + 1.0, v, du1, dv1);
            w.distort(u, v + 1.0, du2, dv2);
            maxDisp = std::max(maxDisp, std::hypot(du, dv));
            maxJac = std::max(maxJac, std::sqrt((du1 - du) * (du1 - du) + (dv1 - dv) * (dv1 - dv) +
                                                (du2 - du) * (du2 - du) + (dv2 - dv) * (dv2 - dv)));
        }
}

// How far the undistorted positions p' (of stars: through the tangent plane and CD^-1; of detections:
// p + S(p)) can move between WCS a and WCS b over the frame + marginPx: grid maxima (x 1.5, + 0.5 px) of
// both, added.
double undistortedShiftBound(const TanSip& a, const TanSip& b, int width, int height, double marginPx) {
    const int g = 16;
    const double detB = b.cd[0][0] * b.cd[1][1] - b.cd[0][1] * b.cd[1][0];
    double dRef = 0.0, dDet = 0.0;
    for (int j = 0; j <= g; ++j)
        for (int i = 0; i <= g; ++i) {
            const double x = -0.5 - marginPx + (width + 2 * marginPx) * i / g;
            const double y = -0.5 - marginPx + (height + 2 * marginPx) * j / g;
            double ua = 0, va = 0, ub = 0, vb = 0;
            a.distort(x + 1.0 - a.crpix[0], y + 1.0 - a.crpix[1], ua, va);
            b.distort(x + 1.0 - b.crpix[0], y + 1.0 - b.crpix[1], ub, vb);
            dDet = std::max(dDet, std::hypot(ub - ua, vb - va));
            double ra = 0, dec = 0, xi = 0, eta = 0;
            a.pixelToWorld(x, y, ra, dec);
            if (!tanProject(b.crval[0], b.crval[1], ra, dec, xi, eta)) return INFINITY;
            const double px = (b.cd[1][1] * xi - b.cd[0][1] * eta) / detB + b.crpix[0] - 1.0;
            const double py = (-b.cd[1][0] * xi + b.cd[0][0] * eta) / detB + b.crpix[1] - 1.0;
            dRef = std::max(dRef, std::hypot(px - (x + ua), py - (y + va)));
        }
    const double bound = 1.5 * (dRef + dDet) + 0.5;
    return std::isfinite(bound) ? bound : INFINITY;
}

// A star's undistorted pixel position p' (0-based) in closed form: tangent-plane coordinates at crval by
// dot products with the tangent point's basis (xi = (p.e) / (p.c), eta = (p.n) / (p.c), radians), then CD^-1.
struct UndistortedMap {
    std::array<double, 3> ec, ee, en;
    double i00, i01, i10, i11; // CD^-1, per radian
    double ox, oy;             // crpix, 0-based
};

UndistortedMap undistortedMapOf(const TanSip& w) {
    UndistortedMap u;
    const double a0 = w.crval[0] * std::numbers::pi / 180.0, d0 = w.crval[1] * std::numbers::pi / 180.0;
    u.ec = {std::cos(d0) * std::cos(a0), std::cos(d0) * std::sin(a0), std::sin(d0)};
    u.ee = {-std::sin(a0), std::cos(a0), 0.0};
    u.en = {-std::sin(d0) * std::cos(a0), -std::sin(d0) * std::sin(a0), std::cos(d0)};
    const double det = w.cd[0][0] * w.cd[1][1] - w.cd[0][1] * w.cd[1][0];
    const double toDeg = 180.0 / std::numbers::pi;
    u.i00 = w.cd[1][1] / det * toDeg;
    u.i01 = -w.cd[0][1] / det * toDeg;
    u.i10 = -w.cd[1][0] / det * toDeg;
    u.i11 = w.cd[0][0] / det * toDeg;
    u.ox = w.crpix[0] - 1.0;
    u.oy = w.crpix[1] - 1.0;
    return u;
}

// The detections' undistorted positions p + S(p), marked on occupancy grids over their bounding box (origin
// x0, y0): cells >= (1 + g) radius for the candidates and, when a pool is wanted, cells >= poolRadius.
struct DetectionCells {
    double x0, y0, cell, pcell;
    NearMask occupied, poolOcc;
};

// nullopt when the detections' positions have no finite bounding box.
std::optional<DetectionCells> detectionCells(const TanSip& w, const Detections& d, double radius, double gJac,
                                             bool withPool, double poolRadius, int nt) {
    const std::size_t nd = d.size();
    std::vector<double> dx(nd), dy(nd);
#pragma omp parallel for schedule(static) num_threads(nt) if (nd > 8192)
    for (long long i = 0; i < static_cast<long long>(nd); ++i) {
        double du = 0, dv = 0;
        if (w.sipOrder > 0) w.distort(d.x[i] + 1.0 - w.crpix[0], d.y[i] + 1.0 - w.crpix[1], du, dv);
        dx[i] = d.x[i] + du;
        dy[i] = d.y[i] + dv;
    }
    std::array<double, 4> box{};
    if (!boundingBox(dx, dy, nd, box)) return std::nullopt;
    const double x0 = box[0], y0 = box[1], x1 = box[2], y1 = box[3];
    double cell = radius * (1.0 + gJac) * (1.0 + 1e-9) + 1e-9;
    while ((x1 - x0) / cell * ((y1 - y0) / cell) > 1.6e7) // fine cells: few stars pass for nothing
        cell *= 2.0;
    const auto gx = static_cast<long long>((x1 - x0) / cell) + 1,
               gy = static_cast<long long>((y1 - y0) / cell) + 1;
    NearMask occupied(gx, gy);
    for (std::size_t i = 0; i < nd; ++i)
        occupied.mark(static_cast<long long>((dx[i] - x0) / cell),
                      static_cast<long long>((dy[i] - y0) / cell));
    // The pool's coarser grid (cells >= poolRadius).
    double pcell = std::max(poolRadius, cell) * (1.0 + 1e-9) + 1e-9;
    while ((x1 - x0) / pcell * ((y1 - y0) / pcell) > 1.6e7)
        pcell *= 2.0;
    const auto px_ = withPool ? static_cast<long long>((x1 - x0) / pcell) + 1 : 0LL;
    const auto py_ = withPool ? static_cast<long long>((y1 - y0) / pcell) + 1 : 0LL;
    NearMask poolOcc(px_, py_);
    if (withPool)
        for (std::size_t i = 0; i < nd; ++i)
            poolOcc.mark(static_cast<long long>((dx[i] - x0) / pcell),
                         static_cast<long long>((dy[i] - y0) / pcell));
    return DetectionCells{x0, y0, cell, pcell, std::move(occupied), std::move(poolOcc)};
}

// Classifies the stars of `ids` by their p' (in parallel, each star on its own). Per star: bit 0: candidate
// (can be within radius of a detection); bits 1-2: 1 certainly on the frame, 2 near the frame's edges
// (decided by the exact projection), 0 certainly off (or not counted); bit 3: in the pool.
std::vector<unsigned char> classifyStars(const RefStars& refs, const std::vector<std::uint32_t>& ids,
                                         const UndistortedMap& u, const DetectionCells& dc, bool withPool,
                                         bool countOnFrame, double band, int width, int height, int nt) {
    const std::size_t n = ids.size();
    std::vector<unsigned char> cls(n, 0);
    const double fx0 = -0.5, fy0 = -0.5, fx1 = width - 0.5, fy1 = height - 0.5;
#pragma omp parallel for schedule(static) num_threads(nt) if (n > 16384)
    for (long long k = 0; k < static_cast<long long>(n); ++k) {
        const std::array<double, 3>& p = refs.xyz[ids[k]];
        const double pc = p[0] * u.ec[0] + p[1] * u.ec[1] + p[2] * u.ec[2];
        if (!(pc > 0.0)) continue;
        const double xi = (p[0] * u.ee[0] + p[1] * u.ee[1] + p[2] * u.ee[2]) / pc;
        const double eta = (p[0] * u.en[0] + p[1] * u.en[1] + p[2] * u.en[2]) / pc;
        const double px = u.i00 * xi + u.i01 * eta + u.ox, py = u.i10 * xi + u.i11 * eta + u.oy;
        if (!std::isfinite(px) || !std::isfinite(py)) continue;
        unsigned char c =
            dc.occupied.near(std::floor((px - dc.x0) / dc.cell), std::floor((py - dc.y0) / dc.cell)) ? 1 : 0;
        if (withPool &&
            dc.poolOcc.near(std::floor((px - dc.x0) / dc.pcell), std::floor((py - dc.y0) / dc.pcell)))
            c |= 8;
        if (countOnFrame) {
            if (px >= fx0 + band && px <= fx1 - band && py >= fy0 + band && py <= fy1 - band)
                c |= 2;
            else if (!(px < fx0 - band || px > fx1 + band || py < fy0 - band || py > fy1 + band))
                c |= 4;
        }
        cls[k] = c;
    }
    return cls;
}

// Projects the classified stars that need it exactly (candidates and the edge band; in parallel), fills
// poolOut (when given) with the pool's stars, and keeps the candidates within the frame + marginPx;
// onFrame counts the certain stars and the edge stars that land on the frame.
Projected projectClassified(const RefStars& refs, const std::vector<std::uint32_t>& ids,
                            const std::vector<unsigned char>& cls, const TanSip& w, int width, int height,
                            double marginPx, int nt, std::vector<std::uint32_t>* poolOut) {
    Projected out;
    const std::size_t n = ids.size();
    std::vector<std::size_t> todo;
    todo.reserve(n);
    if (poolOut) poolOut->reserve(n);
    std::size_t certainOn = 0;
    for (std::size_t k = 0; k < n; ++k) {
        if (cls[k] & 2) ++certainOn;
        if (cls[k] & 5) todo.push_back(k);
        if (cls[k] & 8) poolOut->push_back(ids[k]);
    }
    const std::size_t m = todo.size();
    std::vector<double> px(m), py(m);
    std::vector<char> ok(m);
#pragma omp parallel for schedule(static) num_threads(nt) if (m > 4096)
    for (long long t = 0; t < static_cast<long long>(m); ++t) {
        const std::uint32_t id = ids[todo[t]];
        double x = 0, y = 0;
        ok[t] = w.worldToPixel(refs.ra[id], refs.dec[id], x, y) && std::isfinite(x) && std::isfinite(y);
        px[t] = x;
        py[t] = y;
    }
    out.onFrame = certainOn;
    out.x.reserve(m);
    out.y.reserve(m);
    out.ids.reserve(m);
    for (std::size_t t = 0; t < m; ++t) {
        if (!ok[t]) continue;
        const unsigned char c = cls[todo[t]];
        const double x = px[t], y = py[t];
        if (x < -marginPx || y < -marginPx || x > width - 1 + marginPx || y > height - 1 + marginPx) continue;
        if ((c & 4) && x >= -0.5 && y >= -0.5 && x <= width - 0.5 && y <= height - 0.5) ++out.onFrame;
        if (!(c & 1)) continue;
        out.x.push_back(x);
        out.y.push_back(y);
        out.ids.push_back(static_cast<std::int32_t>(ids[todo[t]]));
    }
    return out;
}

// restrictTo (optional, ascending): consider only these stars instead of the frame's cone (a pool from an
// earlier call, valid while the WCS has not moved the stars' p' by more than its slack). poolOut (optional):
// receives the cone's stars whose p' lies within poolRadius of a detection's (a coarse grid; a superset).
Projected projectNearDetections(const RefStars& refs, const RefPool& pool, const TanSip& w,
                                const Detections& d, double radius, bool countOnFrame, int threads,
                                const std::vector<std::uint32_t>* restrictTo = nullptr,
                                std::vector<std::uint32_t>* poolOut = nullptr, double poolRadius = 0.0) {
    Projected out;
    const int width = d.width, height = d.height;
    const double marginPx = radius;
    double ra0 = 0, dec0 = 0;
    w.pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1), ra0, dec0);
    const double scaleDeg = w.pixelScaleArcsec() / 3600.0;
    const double coneR = (0.5 * std::hypot(width, height) * 1.2 + marginPx) * scaleDeg;
    const std::vector<std::uint32_t> ids =
        restrictTo ? *restrictTo : pool.cone(ra0, dec0, std::min(coneR, 89.0));
    const std::size_t n = ids.size();
    if (poolOut) poolOut->clear();
    if (n == 0 || d.size() == 0) return out;
    const int nt = std::max(1, threads);

    // SIP bounds over the frame + margin (+10%): displacement |S| and Jacobian norm.
    double maxDisp = 0.0, maxJac = 0.0;
    sipBounds(w, width, height, marginPx, maxDisp, maxJac);
    const double gJac = 1.5 * maxJac + 1e-3;
    const double band = 1.5 * maxDisp + 0.5;

    const bool withPool = poolOut != nullptr;
    const std::optional<DetectionCells> cells = detectionCells(w, d, radius, gJac, withPool, poolRadius, nt);
    if (!cells) return out;
    const std::vector<unsigned char> cls = classifyStars(refs, ids, undistortedMapOf(w), *cells, withPool,
                                                         countOnFrame, band, width, height, nt);
    return projectClassified(refs, ids, cls, w, width, height, marginPx, nt, poolOut);
}

// The most common detection -> reference offset (2-px bins, 3x3 peak); false without a clear peak.
bool voteShift(const Detections& det, std::size_t nDet, const Projected& pr, std::size_t nRef, double radius,
               double& sx, double& sy) {
    const double bin = 2.0;
    const int nb = static_cast<int>(std::ceil(radius / bin));
    const int side = 2 * nb + 1;
    std::vector<int> counts(static_cast<std::size_t>(side) * side, 0);
    nDet = std::min(nDet, det.size());
    nRef = std::min(nRef, pr.x.size());
    for (std::size_t i = 0; i < nDet; ++i)
        for (std::size_t j = 0; j < nRef; ++j) {
            const double dx = pr.x[j] - det.x[i], dy = pr.y[j] - det.y[i];
            if (dx * dx + dy * dy > radius * radius) continue;
            const int bx = static_cast<int>(std::floor(dx / bin + 0.5)) + nb;
            const int by = static_cast<int>(std::floor(dy / bin + 0.5)) + nb;
            if (bx < 0 || by < 0 || bx >= side || by >= side) continue;
            ++counts[static_cast<std::size_t>(by) * side + bx];
        }
    int best = 0, bestX = 0, bestY = 0;
    for (int by = 0; by < side; ++by)
        for (int bx = 0; bx < side; ++bx) {
            int s = 0;
            for (int yy = std::max(0, by - 1); yy <= std::min(side - 1, by + 1); ++yy)
                for (int xx = std::max(0, bx - 1); xx <= std::min(side - 1, bx + 1); ++xx)
                    s += counts[static_cast<std::size_t>(yy) * side + xx];
            if (s > best) {
                best = s;
                bestX = bx;
                bestY = by;
            }
        }
    if (best < 4) return false;
    double sumX = 0, sumY = 0;
    int n = 0;
    const double cx = (bestX - nb) * bin, cy = (bestY - nb) * bin;
    for (std::size_t i = 0; i < nDet; ++i)
        for (std::size_t j = 0; j < nRef; ++j) {
            const double dx = pr.x[j] - det.x[i], dy = pr.y[j] - det.y[i];
            if (std::fabs(dx - cx) <= 1.5 * bin && std::fabs(dy - cy) <= 1.5 * bin) {
                sumX += dx;
                sumY += dy;
                ++n;
            }
        }
    if (n == 0) return false;
    sx = sumX / n;
    sy = sumY / n;
    return true;
}

struct FitSet {
    std::vector<double> x, y, ra, dec, flux, w;
    std::vector<std::array<double, 3>> xyz; // the reference stars' unit vectors
};

int termsOf(int order) {
    return order <= 1 ? 3 : (order + 1) * (order + 2) / 2;
}

// Residuals (fit minus reference) in intermediate pixel units along x and y. Both sides on the tangent plane
// at w.crval: the detection's standard coordinates are CD (p + S(p)) (what tanProject of w's own
// pixelToWorld gives, without the round trip through the sphere), the reference star's follow from its unit
// vector by dot products with the tangent point's basis (as tanProject, without trigonometry).
void residuals(const FitSet& s, const TanSip& w, std::vector<double>& rx, std::vector<double>& ry,
               int threads) {
    const std::size_t n = s.x.size();
    rx.assign(n, 0.0);
    ry.assign(n, 0.0);
    const double det = w.cd[0][0] * w.cd[1][1] - w.cd[0][1] * w.cd[1][0];
    const double a0 = w.crval[0] * kPi / 180.0, d0 = w.crval[1] * kPi / 180.0;
    const std::array<double, 3> ec = {std::cos(d0) * std::cos(a0), std::cos(d0) * std::sin(a0), std::sin(d0)};
    const std::array<double, 3> ee = {-std::sin(a0), std::cos(a0), 0.0};
    const std::array<double, 3> en = {-std::sin(d0) * std::cos(a0), -std::sin(d0) * std::sin(a0),
                                      std::cos(d0)};
    const double toDeg = 180.0 / kPi;
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (n > 16384)
    for (long long i = 0; i < static_cast<long long>(n); ++i) {
        const double u = s.x[i] + 1.0 - w.crpix[0], v = s.y[i] + 1.0 - w.crpix[1];
        double du = 0, dv = 0;
        w.distort(u, v, du, dv);
        const double uu = u + du, vv = v + dv;
        const double xf = w.cd[0][0] * uu + w.cd[0][1] * vv, yf = w.cd[1][0] * uu + w.cd[1][1] * vv;
        const std::array<double, 3>& p = s.xyz[i];
        const double pc = p[0] * ec[0] + p[1] * ec[1] + p[2] * ec[2];
        const double xr = (p[0] * ee[0] + p[1] * ee[1] + p[2] * ee[2]) / pc * toDeg;
        const double yr = (p[0] * en[0] + p[1] * en[1] + p[2] * en[2]) / pc * toDeg;
        const double dxi = xf - xr, deta = yf - yr;
        rx[i] = (w.cd[1][1] * dxi - w.cd[0][1] * deta) / det;
        ry[i] = (-w.cd[1][0] * dxi + w.cd[0][0] * deta) / det;
    }
}

bool fitSubset(const FitSet& s, const std::vector<char>& used, const double crpix[2], const double crval[2],
               int order, TanSip& out, double* chi2, int threads) {
    FitSet u;
    const auto nUsed = static_cast<std::size_t>(std::count(used.begin(), used.end(), 1));
    for (auto* v : {&u.x, &u.y, &u.ra, &u.dec, &u.w})
        v->reserve(nUsed);
    for (std::size_t i = 0; i < s.x.size(); ++i)
        if (used[i]) {
            u.x.push_back(s.x[i]);
            u.y.push_back(s.y[i]);
            u.ra.push_back(s.ra[i]);
            u.dec.push_back(s.dec[i]);
            u.w.push_back(s.w[i]);
        }
    return fitTanSip(u.x, u.y, u.ra, u.dec, u.w, crpix, crval, order, out, chi2, threads);
}

// Fit with iterative clipping (a point may come back); `used` in: candidates, out: kept.
bool fitClip(const FitSet& s, const double crpix[2], const double crval[2], int order, double clipSigma,
             std::vector<char>& used, TanSip& out, std::vector<double>& rx, std::vector<double>& ry,
             int threads, double* sigmaOut = nullptr) {
    const std::size_t n = s.x.size();
    const std::vector<char> candidates = used;
    for (int loop = 0; loop < 6; ++loop) {
        const auto nUsed = static_cast<std::size_t>(std::count(used.begin(), used.end(), 1));
        if (nUsed < static_cast<std::size_t>(termsOf(order)) + 2) return false;
        if (!fitSubset(s, used, crpix, crval, order, out, nullptr, threads)) return false;
        residuals(s, out, rx, ry, threads);
        std::vector<double> z;
        z.reserve(2 * nUsed);
        for (std::size_t i = 0; i < n; ++i)
            if (used[i]) {
                const double sw = std::sqrt(s.w[i]);
                z.push_back(std::fabs(rx[i]) * sw);
                z.push_back(std::fabs(ry[i]) * sw);
            }
        std::nth_element(z.begin(), z.begin() + z.size() / 2, z.end());
        const double sigma = 1.4826 * z[z.size() / 2];
        if (sigmaOut) *sigmaOut = sigma;
        if (!(sigma > 0.0)) break;
        std::vector<char> next(n, 0);
        for (std::size_t i = 0; i < n; ++i) {
            if (!candidates[i]) continue;
            const double sw = std::sqrt(s.w[i]);
            next[i] = std::max(std::fabs(rx[i]), std::fabs(ry[i])) * sw <= clipSigma * sigma;
        }
        if (next == used) break;
        used = next;
    }
    return true;
}

// Positional noise model sigma^2 = a + b / flux + c / flux^2 (floor, photon-limited, sky-limited) from
// the squared residuals of the used stars: non-negative coefficients (best subset), iteratively
// reweighted by 1 / model^2 (the variance of a squared residual); sets s.w.
void updateWeights(FitSet& s, const std::vector<char>& used, const std::vector<double>& rx,
                   const std::vector<double>& ry, FitSet* also = nullptr) {
    double fscale = 0.0; // flux normalisation for conditioning
    int n = 0;
    double meanVar = 0.0;
    for (std::size_t i = 0; i < s.x.size(); ++i)
        if (used[i]) {
            fscale = std::max(fscale, 1.0 / s.flux[i]);
            meanVar += 0.5 * (rx[i] * rx[i] + ry[i] * ry[i]);
            ++n;
        }
    if (n < 6 || !(fscale > 0.0) || !(meanVar > 0.0)) return;
    meanVar /= n;
    const double floorVar = std::max(1e-4 * meanVar, 1e-12);
    Eigen::Vector3d model(meanVar, 0.0, 0.0);
    auto varOf = [&](double g) { return std::max(model(0) + model(1) * g + model(2) * g * g, floorVar); };
    for (int irls = 0; irls < 4; ++irls) {
        Eigen::Matrix3d m = Eigen::Matrix3d::Zero();
        Eigen::Vector3d t = Eigen::Vector3d::Zero();
        double tt = 0.0;
        for (std::size_t i = 0; i < s.x.size(); ++i) {
            if (!used[i]) continue;
            const double g = 1.0 / s.flux[i] / fscale, r2 = 0.5 * (rx[i] * rx[i] + ry[i] * ry[i]);
            const double v = varOf(g), wt = 1.0 / (v * v);
            const Eigen::Vector3d b(1.0, g, g * g);
            m += wt * b * b.transpose();
            t += wt * b * r2;
            tt += wt * r2 * r2;
        }
        Eigen::Vector3d best = model;
        double bestCost = INFINITY;
        for (int mask = 1; mask < 8; ++mask) {
            std::vector<int> idx;
            for (int k = 0; k < 3; ++k)
                if (mask & (1 << k)) idx.push_back(k);
            Eigen::MatrixXd mm(idx.size(), idx.size());
            Eigen::VectorXd tv(idx.size());
            for (std::size_t a = 0; a < idx.size(); ++a) {
                tv(a) = t(idx[a]);
                for (std::size_t b = 0; b < idx.size(); ++b)
                    mm(a, b) = m(idx[a], idx[b]);
            }
            const Eigen::VectorXd c = mm.ldlt().solve(tv);
            if (!c.allFinite() || (c.array() < 0.0).any()) continue;
            Eigen::Vector3d full = Eigen::Vector3d::Zero();
            for (std::size_t a = 0; a < idx.size(); ++a)
                full(idx[a]) = c(a);
            const double cost = tt - 2.0 * full.dot(t) + full.dot(m * full);
            if (cost < bestCost) {
                bestCost = cost;
                best = full;
            }
        }
        model = best;
    }
    for (std::size_t i = 0; i < s.x.size(); ++i)
        s.w[i] = 1.0 / varOf(1.0 / s.flux[i] / fscale);
    if (also)
        for (std::size_t i = 0; i < also->x.size(); ++i)
            also->w[i] = 1.0 / varOf(1.0 / also->flux[i] / fscale);
}

FitSet makeFitSet(const Detections& det, const RefStars& refs, const std::vector<Match>& m, int threads) {
    FitSet s;
    const std::size_t n = m.size();
    s.x.resize(n);
    s.y.resize(n);
    s.ra.resize(n);
    s.dec.resize(n);
    s.flux.resize(n);
    s.w.assign(n, 1.0);
    s.xyz.resize(n);
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (n > 16384)
    for (long long k = 0; k < static_cast<long long>(n); ++k) {
        const Match& mm = m[k];
        s.x[k] = det.x[mm.det];
        s.y[k] = det.y[mm.det];
        s.ra[k] = refs.ra[mm.ref];
        s.dec[k] = refs.dec[mm.ref];
        s.flux[k] = det.flux[mm.det];
        s.xyz[k] = refs.xyz[mm.ref];
    }
    return s;
}

// What the steps of refine() share.
struct RefineInputs {
    const Detections& det;
    const RefStars& refs;
    const RefPool& pool;
    const AstrometryParams& p;
    int threads; // projections, matching and the fits' sums (blocked: results do not depend on it)
    int width, height;
    double crpix[2]; // the fits' reference pixel: the frame centre (1-based)
    double matchR;   // final match radius (px)
    bool skipAtFixedPoint = true;
};

// Stage A: bright stars (the nB brightest detections, the 2 nB brightest projected stars), an optional
// vote for the offset, then affine (pure TAN) fits at shrinking radii. Updates w and the radius r; false
// (with why) when there are too few matches or a fit fails.
bool affineStage(const RefineInputs& in, bool vote, std::size_t nB, TanSip& w, double& r, std::string& why) {
    const int fitThreads = in.threads; // the fits' sums are blocked: results do not depend on it
    const double matchR = in.matchR;
    // Stage A uses only the 2 nB brightest projected stars: projection stops there.
    Projected pr = projectRefs(in.refs, in.pool, w, in.width, in.height, r, in.threads, 2 * nB);
    if (vote) {
        double sx = 0, sy = 0;
        if (voteShift(in.det, nB, pr, 2 * nB, r, sx, sy)) {
            w.crpix[0] -= sx;
            w.crpix[1] -= sy;
            r = std::max(3.0 * matchR, r / 3.0);
        }
    }
    for (int round = 0; round < 5; ++round) {
        pr = projectRefs(in.refs, in.pool, w, in.width, in.height, r, in.threads, 2 * nB);
        const auto m = matchInPixels(in.det, nB, pr.x, pr.y, pr.ids, 2 * nB, r, in.threads);
        if (m.size() < 6) {
            why = "too few matches (" + std::to_string(m.size()) + ") with the starting WCS";
            return false;
        }
        FitSet s = makeFitSet(in.det, in.refs, m, in.threads);
        std::vector<char> used(s.x.size(), 1);
        std::vector<double> rx, ry;
        TanSip fit;
        if (!fitClip(s, in.crpix, w.crval, 1, in.p.clipSigma, used, fit, rx, ry, fitThreads)) {
            why = "the affine fit failed";
            return false;
        }
        w = fit;
        double ss = 0;
        int n = 0;
        for (std::size_t i = 0; i < used.size(); ++i)
            if (used[i]) {
                ss += rx[i] * rx[i] + ry[i] * ry[i];
                ++n;
            }
        const double rms = std::sqrt(ss / std::max(n, 1));
        const double next = std::max(1.5 * matchR, std::min(r / 1.5, 5.0 * rms));
        if (round >= 1 && next >= r) break;
        r = next;
    }
    return true;
}

// The detections of stage B's intermediate rounds: a stratified subset (brightest per cell; all of them
// when few), with subRow: sub row -> det row.
void detectionSubset(const Detections& det, Detections& sub, std::vector<std::int32_t>& subRow) {
    const std::vector<std::size_t> pick =
        stratifiedSubset(det.x, det.y, det.width, det.height, kRefineDetCap);
    sub.width = det.width;
    sub.height = det.height;
    for (std::size_t i : pick) {
        sub.x.push_back(det.x[i]);
        sub.y.push_back(det.y[i]);
        sub.flux.push_back(det.flux[i]);
        sub.index.push_back(det.index[i]);
        subRow.push_back(static_cast<std::int32_t>(i));
    }
}

// The intermediate rounds look only at a pool of stars near the subset's detections, found by the first of
// them with a slack, and found again when the WCS has moved the stars by more than it allows.
struct NearPool {
    std::vector<std::uint32_t> ids;
    TanSip wcs;          // the WCS it was found with
    double radius = 0.0; // px, in p'
    bool have = false;
};

// One stage-B round's projection: near every detection in the last round (counting the stars on the
// frame), near the subset's detections in the intermediate ones (from the pool while it is valid).
Projected projectRound(const RefineInputs& in, const TanSip& w, const Detections& d, double radius, bool last,
                       NearPool& np) {
    if (last) return projectNearDetections(in.refs, in.pool, w, d, radius, true, in.threads);
    const double poolSlack = 16.0; // px
    bool valid = false;
    if (np.have) {
        double maxDisp = 0.0, maxJac = 0.0;
        sipBounds(w, in.width, in.height, radius, maxDisp, maxJac);
        valid =
            radius * (1.5 * maxJac + 1.001) + undistortedShiftBound(np.wcs, w, in.width, in.height, radius) <=
            np.radius;
    }
    if (valid) return projectNearDetections(in.refs, in.pool, w, d, radius, false, in.threads, &np.ids);
    double maxDisp = 0.0, maxJac = 0.0;
    sipBounds(w, in.width, in.height, radius, maxDisp, maxJac);
    np.radius = radius * (1.5 * maxJac + 1.001) + poolSlack;
    Projected pr =
        projectNearDetections(in.refs, in.pool, w, d, radius, false, in.threads, nullptr, &np.ids, np.radius);
    np.wcs = w;
    np.have = true;
    return pr;
}

// The fit set of a round: a stratified subset of the matches (brightest per cell; matches are in detection
// order, i.e. brightest first), at most kFinalFitCap in the last round; fitPos: their positions in matches.
FitSet fitSetOf(const RefineInputs& in, const std::vector<Match>& matches, bool last,
                std::vector<std::size_t>& fitPos) {
    std::vector<double> mx(matches.size()), my(matches.size());
    for (std::size_t k = 0; k < matches.size(); ++k) {
        mx[k] = in.det.x[matches[k].det];
        my[k] = in.det.y[matches[k].det];
    }
    fitPos = stratifiedSubset(mx, my, in.width, in.height, last ? kFinalFitCap : kRefineFitCap);
    std::vector<Match> fitMatches;
    fitMatches.reserve(fitPos.size());
    for (std::size_t k : fitPos)
        fitMatches.push_back(matches[k]);
    return makeFitSet(in.det, in.refs, fitMatches, in.threads);
}

// A round's TAN+SIP fit at the highest order the fit set supports: clipped, then reweighted by the noise
// model and clipped again (every match a candidate again).
struct RoundFit {
    int maxOrder = 1;
    TanSip fit;
    std::vector<char> used; // kept by the weighted fit
    std::vector<double> rx, ry;
    double sigma = 0.0; // the weighted fit's robust sigma
};

// all (optional): every match of the final round, reweighted with the fit set. False (with why) when a
// fit fails.
bool weightedFit(const RefineInputs& in, FitSet& s, FitSet* all, const TanSip& w, RoundFit& f,
                 std::string& why) {
    const std::size_t n = s.x.size();
    f.used.assign(n, 1);
    for (int o = std::max(2, in.p.minSipOrder); o <= std::min(in.p.maxSipOrder, 9); ++o)
        if (termsOf(o) * in.p.minMatchesPerTerm <= static_cast<double>(n)) f.maxOrder = o;
    if (!fitClip(s, in.crpix, w.crval, f.maxOrder, in.p.clipSigma, f.used, f.fit, f.rx, f.ry, in.threads)) {
        why = "the TAN+SIP fit failed";
        return false;
    }
    updateWeights(s, f.used, f.rx, f.ry, all);
    f.used.assign(n, 1); // every match is a candidate again under the new weights
    if (!fitClip(s, in.crpix, w.crval, f.maxOrder, in.p.clipSigma, f.used, f.fit, f.rx, f.ry, in.threads,
                 &f.sigma)) {
        why = "the weighted TAN+SIP fit failed";
        return false;
    }
    return true;
}

// Order selection on the kept stars: BIC = chi2 + (number of parameters) ln(observations). Returns the
// best fit (the weighted fit when no order fits) and its order in `chosen`.
TanSip selectOrder(const RefineInputs& in, const FitSet& s, const RoundFit& f, const TanSip& w, int& chosen) {
    const auto nUsed = static_cast<double>(std::count(f.used.begin(), f.used.end(), 1));
    const int lo = in.p.minSipOrder <= 1 ? 1 : std::min(f.maxOrder, in.p.minSipOrder);
    double bestBic = INFINITY;
    TanSip best = f.fit;
    chosen = f.maxOrder;
    for (int o = lo; o <= f.maxOrder; ++o) {
        TanSip fo;
        double chi2 = 0.0;
        if (!fitSubset(s, f.used, in.crpix, w.crval, o, fo, &chi2, in.threads)) continue;
        const double bic = chi2 + 2.0 * termsOf(o) * std::log(2.0 * nUsed);
        if (bic < bestBic) {
            bestBic = bic;
            best = fo;
            chosen = o;
        }
    }
    return best;
}

// Every match of the final round (when only a subset was fitted) is judged by the fit's clipping rule
// (weighted residual <= clipSigma robust sigmas); the fitted ones keep the fit's own decision.
void judgeAllMatches(const RefineInputs& in, const FitSet& all, const TanSip& w, const RoundFit& f,
                     const std::vector<std::size_t>& fitPos, std::size_t nMatches,
                     std::vector<char>& usedFinal) {
    std::vector<double> ax, ay;
    residuals(all, w, ax, ay, in.threads);
    usedFinal.assign(nMatches, 0);
    for (std::size_t k = 0; k < nMatches; ++k) {
        const double sw = std::sqrt(all.w[k]);
        usedFinal[k] =
            !(f.sigma > 0.0) || std::max(std::fabs(ax[k]), std::fabs(ay[k])) * sw <= in.p.clipSigma * f.sigma;
    }
    for (std::size_t j = 0; j < fitPos.size(); ++j)
        usedFinal[fitPos[j]] = f.used[j];
}

// Stage B's result: the final round's matches, their verdicts ("used") and the chosen SIP order.
struct SipStageResult {
    std::vector<Match> matches;
    std::vector<char> usedFinal;
    int chosen = 1;
};

// Whether two WCS are the same bit for bit (so that a deterministic step gives the same result on both).
bool sameBits(const TanSip& a, const TanSip& b) {
    auto same = [](const std::vector<double>& u, const std::vector<double>& v) {
        return u.size() == v.size() &&
               (u.empty() || std::memcmp(u.data(), v.data(), u.size() * sizeof(double)) == 0);
    };
    return std::memcmp(a.crpix, b.crpix, sizeof a.crpix) == 0 &&
           std::memcmp(a.crval, b.crval, sizeof a.crval) == 0 && std::memcmp(a.cd, b.cd, sizeof a.cd) == 0 &&
           a.sipOrder == b.sipOrder && a.sipInvOrder == b.sipInvOrder && same(a.a, b.a) && same(a.b, b.b) &&
           same(a.ap, b.ap) && same(a.bp, b.bp);
}

// Stage B: TAN+SIP with the order chosen by BIC, re-matched each iteration. The intermediate rounds
// match a stratified subset of the detections and fit a stratified subset of those matches; the final
// round matches every detection and fits a stratified subset of at most kFinalFitCap of them. Updates w;
// sets out.refsOnFrame, and out.why when it fails (false).
// An intermediate round after the first (same radius) is a function of the WCS it starts from alone: once
// one returns its starting WCS bit for bit, the rounds left before the final one would each return it
// again, and are skipped (the result is the same as running them).
bool sipStage(const RefineInputs& in, double r, TanSip& w, SipStageResult& res, RefineOutcome& out) {
    Detections sub;                   // the detections of the intermediate rounds (all of them when few)
    std::vector<std::int32_t> subRow; // sub row -> det row
    detectionSubset(in.det, sub, subRow);
    std::vector<Match>& matches = res.matches;
    const int iterations = std::max(1, in.p.iterations);
    NearPool np;
    for (int it = 0; it < iterations; ++it) {
        const bool last = it == iterations - 1;
        const Detections& d = last ? in.det : sub;
        const double radius = it == 0 ? std::max(in.matchR, std::min(r, 2.0 * in.matchR)) : in.matchR;
        const Projected pr = projectRound(in, w, d, radius, last, np);
        matches = matchInPixels(d, d.size(), pr.x, pr.y, pr.ids, pr.x.size(), radius, in.threads);
        if (!last)
            for (Match& mm : matches)
                mm.det = subRow[static_cast<std::size_t>(mm.det)];
        if (last) out.refsOnFrame = pr.onFrame;
        std::vector<std::size_t> fitPos;
        FitSet s = fitSetOf(in, matches, last, fitPos);
        const std::size_t n = s.x.size();
        if (n < 6) {
            out.why = "too few matches (" + std::to_string(matches.size()) + ")";
            return false;
        }
        const bool subset = n < matches.size();
        FitSet all; // every match, when the fit set is a subset (final round)
        if (last && subset) all = makeFitSet(in.det, in.refs, matches, in.threads);
        RoundFit f;
        if (!weightedFit(in, s, last && subset ? &all : nullptr, w, f, out.why)) return false;
        const TanSip start = w;
        w = selectOrder(in, s, f, w, res.chosen);
        ++out.rounds;
        if (!last && it >= 1 && in.skipAtFixedPoint && sameBits(start, w))
            it = iterations - 2; // a fixed point: on to the final round
        if (!last) continue;
        if (!subset) {
            res.usedFinal = f.used;
            continue;
        }
        judgeAllMatches(in, all, w, f, fitPos, matches.size(), res.usedFinal);
    }
    return true;
}

// Fills the outcome from the final WCS and matches, then verifies it: enough matches in absolute terms, as
// a fraction of the detections (or stars on the frame), and above the matches expected by chance.
void verifyOutcome(const RefineInputs& in, const TanSip& w, const SipStageResult& b, RefineOutcome& out) {
    const AstrometryParams& p = in.p;
    const double matchR = in.matchR;
    const std::vector<Match>& matches = b.matches;
    out.wcs = w;
    out.sipOrder = b.chosen >= 2 ? b.chosen : 0;
    out.matches = matches;
    out.used.assign(b.usedFinal.begin(), b.usedFinal.end());
    out.nUsed = static_cast<int>(std::count(b.usedFinal.begin(), b.usedFinal.end(), 1));
    const double nDet = static_cast<double>(in.det.size());
    out.chance = nDet * out.refsOnFrame / (double(in.width) * in.height) * kPi * matchR * matchR;
    const double nMatched = static_cast<double>(matches.size());
    const double needFraction = p.verifyMinFraction * std::min(nDet, static_cast<double>(out.refsOnFrame));
    const double needChance = out.chance + p.verifySigma * std::sqrt(out.chance);
    if (nMatched < p.verifyMinMatches || nMatched < needFraction || nMatched < needChance) {
        out.why = "verification failed: " + std::to_string(matches.size()) + " matches (need " +
                  std::to_string(static_cast<int>(std::ceil(
                      std::max({static_cast<double>(p.verifyMinMatches), needFraction, needChance})))) +
                  "; " + std::to_string(out.chance) + " expected by chance)";
        return;
    }
    out.ok = true;
}
} // namespace

std::vector<std::size_t> stratifiedSubset(const std::vector<double>& x, const std::vector<double>& y,
                                          int width, int height, std::size_t cap) {
    const std::size_t n = x.size();
    std::vector<std::size_t> out;
    if (n <= cap) {
        out.resize(n);
        std::iota(out.begin(), out.end(), std::size_t{0});
        return out;
    }
    // About 16 items per cell at the cap.
    const int g =
        std::clamp(static_cast<int>(std::lround(std::sqrt(static_cast<double>(cap) / 16.0))), 2, 64);
    auto cellOf = [&](double v, int size) {
        const double f = std::floor((v + 0.5) / std::max(size, 1) * g);
        return f >= 0.0 ? static_cast<int>(std::min(f, double(g - 1))) : 0; // NaN, below: cell 0
    };
    std::vector<std::uint32_t> inCell(static_cast<std::size_t>(g) * g, 0), rank(n);
    std::vector<std::size_t> perRank; // number of items of each rank
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t c = static_cast<std::size_t>(cellOf(y[i], height)) * g + cellOf(x[i], width);
        rank[i] = inCell[c]++;
        if (rank[i] >= perRank.size()) perRank.push_back(0);
        ++perRank[rank[i]];
    }
    // All items of rank < R, then the first `rest` items of rank R (in input order).
    std::size_t R = 0, taken = 0;
    while (R < perRank.size() && taken + perRank[R] <= cap)
        taken += perRank[R++];
    std::size_t rest = cap - taken;
    out.reserve(cap);
    for (std::size_t i = 0; i < n; ++i)
        if (rank[i] < R || (rank[i] == R && rest > 0 && (--rest, true))) out.push_back(i);
    return out;
}

RefineOutcome refine(const Detections& det, const RefStars& refs, const SkyTree* tree, const TanSip& start,
                     double startRadiusPx, bool vote, const AstrometryParams& p, int threads,
                     bool skipAtFixedPoint) {
    RefineOutcome out;
    const int width = det.width, height = det.height;
    TanSip w = start;
    const double matchR = std::max(p.matchRadiusPx, 0.1);

    // Stage A: bright stars, affine (pure TAN) fits at shrinking radii.
    const std::size_t nB = std::min<std::size_t>(det.size(), std::max(200, 4 * p.nBrightest));
    double r = std::max(startRadiusPx, matchR);
    const RefPool pool(refs, tree, start, width, height, r);
    const RefineInputs in{.det = det,
                          .refs = refs,
                          .pool = pool,
                          .p = p,
                          .threads = threads,
                          .width = width,
                          .height = height,
                          .crpix = {0.5 * (width + 1), 0.5 * (height + 1)},
                          .matchR = matchR,
                          .skipAtFixedPoint = skipAtFixedPoint};
    if (!affineStage(in, vote, nB, w, r, out.why)) return out;

    // Stage B: TAN+SIP with the order chosen by BIC, re-matched each iteration.
    SipStageResult b;
    if (!sipStage(in, r, w, b, out)) return out;
    verifyOutcome(in, w, b, out);
    return out;
}

} // namespace gpuphot::astrom
