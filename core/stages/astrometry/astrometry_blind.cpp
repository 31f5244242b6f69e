// Stage 7 internals: blind solving by asterism matching (astrometry.net-style quads).
//
// Reference side, per scale level (levels sqrt(2) apart between scaleLow and scaleHigh): the
// reference stars of the search area are thinned to the brightest `refPerCell` per cell of a sky grid
// (16 cells per field at that scale); each of them (A) pairs with its brightest fainter neighbours (B) at a
// separation of 0.15..0.6 of the field size, at most maxQuadsPerStar quads per A, each quad with the two
// brightest stars (C, D) inside the circle of diameter AB. Its code is the position of C and D in the frame
// that puts A at (0, 0) and B at (1, 1) (on the tangent plane at the quad's midpoint), made unique by
// xC + xD <= 1 and xC <= xD. A level's codes go into one 4-D k-d tree; a level is built (in parallel,
// the same for any thread count) only when the search reaches it, or taken from an AstrometryIndex that
// holds every level of a whole catalog. Detection side: the nBrightest detections form the same quads (up
// to the 4 brightest inside the circle, every pair of them), in both parities, brightest quads first. Each
// code hit gives a similarity transform (scale, rotation, parity, shift) from 4 stars; it must give a
// pixel scale and centre within the search, match many of the bright detections to thinned reference
// stars (cheap check), then survive the full refinement and its verification (refine()).
#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>
#include <optional>
#include <string>
#include <unordered_map>

#include <nanoflann.hpp>

#include "core/pipeline/run_context.hpp"
#include "core/stages/astrometry/astrometry_internal.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot::astrom {
namespace {
constexpr double kDeg = std::numbers::pi / 180.0;
using Cplx = std::complex<double>;
constexpr double kQuadMin = 0.15, kQuadMax = 0.6; // AB as a fraction of sqrt(width * height)

struct Cloud4 {
    std::vector<std::array<double, 4>> pts;
    std::size_t kdtree_get_point_count() const { return pts.size(); }
    double kdtree_get_pt(std::size_t i, std::size_t d) const { return pts[i][d]; }
    template <class B> bool kdtree_get_bbox(B&) const { return false; }
};
using Tree4 = nanoflann::KDTreeSingleIndexAdaptor<nanoflann::L2_Simple_Adaptor<double, Cloud4>, Cloud4, 4>;

struct RefQuad {
    std::array<std::int32_t, 4> star; // RefStars indices in code order A, B, C, D
    int level;
    double abDeg;
};

// Code of 4 points (p[0], p[1] = A, B). Writes the code variant selected by (swapAB, swapCD) and the
// order of the points in it. Returns false when C or D lies outside the circle of diameter AB.
bool quadCode(const std::array<Cplx, 4>& p, bool swapAB, bool swapCD, std::array<int, 4>& order,
              std::array<double, 4>& code) {
    const Cplx a = swapAB ? p[1] : p[0], b = swapAB ? p[0] : p[1];
    const Cplx ab = b - a;
    if (std::abs(ab) == 0.0) return false;
    const Cplx rot(1.0, 1.0);
    const int ic = swapCD ? 3 : 2, id = swapCD ? 2 : 3;
    const Cplx c = (p[ic] - a) / ab * rot, d = (p[id] - a) / ab * rot;
    const Cplx mid(0.5, 0.5);
    if (std::abs(c - mid) > 0.7072 || std::abs(d - mid) > 0.7072) return false;
    order = {swapAB ? 1 : 0, swapAB ? 0 : 1, ic, id};
    code = {c.real(), c.imag(), d.real(), d.imag()};
    return true;
}

// The canonical code (xC + xD <= 1, xC <= xD); with `slack` > 0 also the variants within slack of it.
void codeVariants(const std::array<Cplx, 4>& p, double slack,
                  std::vector<std::pair<std::array<int, 4>, std::array<double, 4>>>& out) {
    out.clear();
    for (int v = 0; v < 4; ++v) {
        std::array<int, 4> order;
        std::array<double, 4> code;
        if (!quadCode(p, v & 1, v & 2, order, code)) continue;
        if (code[0] + code[2] > 1.0 + slack) continue;
        if (code[0] > code[2] + slack) continue;
        out.emplace_back(order, code);
    }
}

struct LevelIndex {
    std::vector<RefQuad> quads;
    Cloud4 codes;
    std::unique_ptr<Tree4> tree;
};

struct Level {
    double scale;                  // arcsec/px (geometric centre)
    std::vector<std::int32_t> sel; // thinned RefStars indices, brightest first
    std::vector<std::array<double, 3>> xyz;
    std::unique_ptr<SkyTree> tree;
    double density = 0.0; // thinned stars per px^2 on the frame at this scale (populated sky)
};

// Similarity z_ref = a z_det + b (least squares over the points).
void similarity(const Cplx* det, const Cplx* ref, int n, Cplx& a, Cplx& b) {
    Cplx md(0, 0), mr(0, 0);
    for (int i = 0; i < n; ++i) {
        md += det[i];
        mr += ref[i];
    }
    md /= double(n);
    mr /= double(n);
    Cplx num(0, 0);
    double den = 0.0;
    for (int i = 0; i < n; ++i) {
        num += (ref[i] - mr) * std::conj(det[i] - md);
        den += std::norm(det[i] - md);
    }
    a = den > 0.0 ? num / den : Cplx(0, 0);
    b = mr - a * md;
}

Cplx tanPoint(double ra0, double dec0, double ra, double dec) {
    double xi = 0, eta = 0;
    tanProject(ra0, dec0, ra, dec, xi, eta);
    return {xi, eta};
}

// Half a level step on a log scale (the levels are sqrt(2) apart): a level covers the scales within this
// factor of its own.
double levelHalfStep() {
    return std::pow(2.0, 0.25);
}

// Level `lv` (its scale set) filled with the reference stars of `area` thinned to the brightest refPerCell
// per sky cell (16 cells per field at that scale) and a sky tree over them.
void fillLevel(const std::vector<std::uint32_t>& area, const RefStars& refs, const AstrometryParams& p,
               double sizePx, Level& lv) {
    const double cellDeg = lv.scale / 3600.0 * sizePx / 4.0;
    std::unordered_map<std::int64_t, int> counts;
    counts.reserve(std::min<std::size_t>(area.size(), 1u << 20));
    for (std::uint32_t id : area) {
        const double dec = refs.dec[id];
        const auto iy = static_cast<std::int64_t>(std::floor((dec + 90.0) / cellDeg));
        const double bandDec = std::clamp(-90.0 + (iy + 0.5) * cellDeg, -89.9, 89.9);
        const double cellRa = cellDeg / std::max(std::cos(bandDec * kDeg), 1e-3);
        const auto ix = static_cast<std::int64_t>(std::floor(refs.ra[id] / cellRa));
        int& c = counts[iy * 4000000 + ix];
        if (c >= p.refPerCell) continue;
        ++c;
        lv.sel.push_back(static_cast<std::int32_t>(id));
        lv.xyz.push_back(refs.xyz[id]);
    }
    lv.tree = std::make_unique<SkyTree>(lv.xyz);
    const double cellPx = sizePx / 4.0;
    lv.density = p.refPerCell / (cellPx * cellPx);
}

// Scale levels sqrt(2) apart from sLo to sHi, their stars not filled yet.
std::vector<Level> levelScales(double sLo, double sHi) {
    const double step = std::sqrt(2.0), half = levelHalfStep();
    std::vector<Level> levels;
    for (double s = sLo * half; s / half < sHi * 1.0000001; s *= step) {
        Level lv;
        lv.scale = s;
        levels.push_back(std::move(lv));
    }
    return levels;
}

struct DetQuad {
    std::array<int, 4> star; // A, B, C, D (detection indices)
    int rank;
};

// Quads of the nq brightest detections: every pair (A, B) at a fraction kQuadMin..kQuadMax of the frame
// size with every pair of the (up to 4) brightest detections inside the circle AB; brightest quads first.
std::vector<DetQuad> detectionQuads(const Detections& det, std::size_t nq, double sizePx) {
    std::vector<DetQuad> dq;
    const double dMinPx = kQuadMin * sizePx, dMaxPx = kQuadMax * sizePx;
    for (std::size_t i = 0; i < nq; ++i)
        for (std::size_t j = i + 1; j < nq; ++j) {
            const double dAB = std::hypot(det.x[i] - det.x[j], det.y[i] - det.y[j]);
            if (dAB < dMinPx || dAB > dMaxPx) continue;
            const double mx = 0.5 * (det.x[i] + det.x[j]), my = 0.5 * (det.y[i] + det.y[j]);
            std::vector<int> inside;
            for (std::size_t k = 0; k < nq && inside.size() < 4; ++k) {
                if (k == i || k == j) continue;
                if (std::hypot(det.x[k] - mx, det.y[k] - my) <= 0.5 * dAB)
                    inside.push_back(static_cast<int>(k));
            }
            for (std::size_t c = 0; c < inside.size(); ++c)
                for (std::size_t d = c + 1; d < inside.size(); ++d) {
                    DetQuad q{{static_cast<int>(i), static_cast<int>(j), inside[c], inside[d]}, 0};
                    q.rank = *std::max_element(q.star.begin(), q.star.end());
                    dq.push_back(q);
                }
        }
    std::stable_sort(dq.begin(), dq.end(),
                     [](const DetQuad& a, const DetQuad& b) { return a.rank < b.rank; });
    return dq;
}

// The gnomonic projection on the plane tangent at a unit vector (east, north axes): tanProject's standard
// coordinates up to a common factor, without trigonometry (a quad's code ignores the scale).
struct TangentPlane {
    std::array<double, 3> m, e, n;
    explicit TangentPlane(const std::array<double, 3>& centre) : m(centre) {
        const double h = std::hypot(m[0], m[1]);
        e = h > 1e-12 ? std::array<double, 3>{-m[1] / h, m[0] / h, 0.0}
                      : std::array<double, 3>{0.0, 1.0, 0.0};
        n = {m[1] * e[2] - m[2] * e[1], m[2] * e[0] - m[0] * e[2], m[0] * e[1] - m[1] * e[0]};
    }
    Cplx operator()(const std::array<double, 3>& v) const {
        const double w = v[0] * m[0] + v[1] * m[1] + v[2] * m[2];
        return {(v[0] * e[0] + v[1] * e[1] + v[2] * e[2]) / w, (v[0] * n[0] + v[1] * n[1] + v[2] * n[2]) / w};
    }
};

double chordOf(const std::array<double, 3>& a, const std::array<double, 3>& b) {
    return std::sqrt((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]) +
                     (a[2] - b[2]) * (a[2] - b[2]));
}

// The reference quad on A = nb[0] and B = nb[b] (nb: A and its neighbours within dMax of the level, ascending
// star order, i.e. brightest first; v: their unit vectors): the two brightest stars inside the circle AB and
// the canonical code; false when there is none.
bool makeRefQuad(const Level& lv, int l, const std::vector<std::uint32_t>& nb,
                 const std::vector<std::array<double, 3>>& v, std::size_t b, double dMin, double dMax,
                 RefQuad& q, std::array<double, 4>& code) {
    const auto& va = v[0];
    const auto& vb = v[b];
    const double dAB = degFromChord(chordOf(va, vb));
    if (dAB < dMin || dAB > dMax) return false;
    std::array<double, 3> m = {va[0] + vb[0], va[1] + vb[1], va[2] + vb[2]};
    const double norm = std::sqrt(m[0] * m[0] + m[1] * m[1] + m[2] * m[2]);
    for (double& c : m)
        c /= norm;
    const double rc = chordFromDeg(0.5 * dAB), rc2 = rc * rc;
    std::size_t inside[2];
    int nIn = 0;
    for (std::size_t k = 1; k < nb.size() && nIn < 2; ++k) {
        if (k == b) continue;
        const auto& vc = v[k];
        const double d2 = (vc[0] - m[0]) * (vc[0] - m[0]) + (vc[1] - m[1]) * (vc[1] - m[1]) +
                          (vc[2] - m[2]) * (vc[2] - m[2]);
        if (d2 <= rc2) inside[nIn++] = k;
    }
    if (nIn < 2) return false;
    const TangentPlane plane(m);
    const std::size_t ids[4] = {0, b, inside[0], inside[1]};
    std::array<Cplx, 4> pts;
    for (int k = 0; k < 4; ++k)
        pts[k] = plane(v[ids[k]]);
    for (int var = 0; var < 4; ++var) { // the canonical variant (codeVariants with no slack, first one)
        std::array<int, 4> order;
        if (!quadCode(pts, var & 1, var & 2, order, code)) continue;
        if (code[0] + code[2] > 1.0 || code[0] > code[2]) continue;
        for (int k = 0; k < 4; ++k)
            q.star[k] = lv.sel[nb[ids[order[k]]]];
        q.level = l;
        q.abDeg = dAB;
        return true;
    }
    return false;
}

// Buffers of quadsOfStar, reused from star to star.
struct StarScratch {
    std::vector<std::uint32_t> nb;
    std::vector<std::pair<std::uint32_t, double>> hits;
    std::vector<std::array<double, 3>> v;
};

// The quads with star ia of level l as A (at most maxPerStar, partners B fainter than A, brightest first),
// appended. C and D may be brighter than A.
void quadsOfStar(const Level& lv, int l, std::size_t ia, double dMin, double dMax, int maxPerStar,
                 StarScratch& s, std::vector<RefQuad>& quads, std::vector<std::array<double, 4>>& codes) {
    std::vector<std::uint32_t>& nb = s.nb;
    lv.tree->coneByIndex(lv.xyz[ia], dMax, nb, s.hits);
    // A first, then the others in star order.
    const auto self = std::find(nb.begin(), nb.end(), static_cast<std::uint32_t>(ia));
    if (self != nb.end())
        std::rotate(nb.begin(), self, self + 1);
    else
        nb.insert(nb.begin(), static_cast<std::uint32_t>(ia));
    s.v.resize(nb.size());
    for (std::size_t k = 0; k < nb.size(); ++k)
        s.v[k] = lv.xyz[nb[k]];
    int made = 0;
    for (std::size_t b = 1; b < nb.size() && made < maxPerStar; ++b) {
        if (nb[b] <= ia) continue;
        RefQuad q;
        std::array<double, 4> code;
        if (!makeRefQuad(lv, l, nb, s.v, b, dMin, dMax, q, code)) continue;
        quads.push_back(q);
        codes.push_back(code);
        ++made;
    }
}

// Reference quads of level l, with their k-d tree on the code. The stars are cut into a fixed number of
// chunks built on `threads` threads and joined in star order: the same index for any thread count.
void buildLevelIndex(const std::vector<Level>& levels, int l, double sizePx, const AstrometryParams& p,
                     int threads, LevelIndex& out) {
    const double half = levelHalfStep();
    const Level& lv = levels[l];
    const double dMin = kQuadMin * sizePx * lv.scale / half / 3600.0;
    const double dMax = kQuadMax * sizePx * lv.scale * half / 3600.0;
    const std::size_t n = lv.sel.size();
    const std::size_t nChunks = std::min<std::size_t>(n, 64);
    std::vector<std::vector<RefQuad>> cq(nChunks);
    std::vector<std::vector<std::array<double, 4>>> cc(nChunks);
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::max(1, threads)) if (n > 256)
    for (long long c = 0; c < static_cast<long long>(nChunks); ++c)
        errors.run([&] {
            const std::size_t b = n * c / nChunks, e = n * (c + 1) / nChunks;
            StarScratch scratch;
            for (std::size_t ia = b; ia < e; ++ia)
                quadsOfStar(lv, l, ia, dMin, dMax, p.maxQuadsPerStar, scratch, cq[c], cc[c]);
        });
    errors.rethrow();
    for (std::size_t c = 0; c < nChunks; ++c) {
        out.quads.insert(out.quads.end(), cq[c].begin(), cq[c].end());
        out.codes.pts.insert(out.codes.pts.end(), cc[c].begin(), cc[c].end());
    }
    out.tree = std::make_unique<Tree4>(4, out.codes, nanoflann::KDTreeSingleIndexAdaptorParams(16));
}

// The search proper: every detection quad against one level's reference quads, each code hit turned into
// a candidate WCS that must pass the search limits, the cheap check and finally refine()'s verification.
class QuadSearch {
public:
    QuadSearch(const Detections& det, const RefStars& refs, const SkyTree* tree, const BlindSearch& search,
               const AstrometryParams& p, RunContext& ctx, const std::vector<Level>& levels,
               const std::vector<DetQuad>& dq, double sizePx, std::size_t nq, double sLo, double sHi)
        : m_det(det), m_refs(refs), m_tree(tree), m_search(search), m_p(p), m_ctx(ctx), m_levels(levels),
          m_dq(dq), m_sLo(sLo), m_sHi(sHi), m_cx(0.5 * (det.width - 1)),
          m_cy(0.5 * (det.height - 1)), m_crpix{m_cx + 1.0, m_cy + 1.0},
          m_rCheap(std::max(3.0 * p.matchRadiusPx, 0.01 * sizePx)), m_nCheck(nq),
          m_searchCentre(unitVector(search.centre[0], search.centre[1])),
          m_tol2(p.codeTolerance * p.codeTolerance) {}

    int fullVerifications() const { return m_fullVerifications; }
    const std::string& lastWhy() const { return m_lastWhy; }

    // Every detection quad (both parities, every code variant) against the level's quads; a value when
    // the search ends there (a verified solution, or giving up after maxFullVerifications).
    std::optional<RefineOutcome> searchLevel(const LevelIndex& li) {
        for (std::size_t qi = 0; qi < m_dq.size(); ++qi) {
            const DetQuad& q = m_dq[qi];
            for (int parity = 1; parity >= -1; parity -= 2) {
                std::array<Cplx, 4> pts;
                for (int k = 0; k < 4; ++k)
                    pts[k] = Cplx(parity * m_det.x[q.star[k]], m_det.y[q.star[k]]);
                codeVariants(pts, 2.0 * m_p.codeTolerance, m_vars);
                for (const auto& [order, code] : m_vars) {
                    m_hits.clear();
                    li.tree->radiusSearch(code.data(), m_tol2, m_hits,
                                          nanoflann::SearchParams(32, 0.0f, true));
                    std::sort(m_hits.begin(), m_hits.end(), [](const auto& a, const auto& b) {
                        return a.second != b.second ? a.second < b.second : a.first < b.first;
                    });
                    for (const auto& h : m_hits)
                        if (auto r = tryHit(q, parity, order, li.quads[h.first])) return r;
                }
            }
        }
        return std::nullopt;
    }

private:
    // One code hit: the candidate WCS, the cheap check, then the full refinement and verification; a
    // value when the search ends here.
    std::optional<RefineOutcome> tryHit(const DetQuad& q, int parity, const std::array<int, 4>& order,
                                        const RefQuad& rq) {
        TanSip w;
        if (!candidateWcs(q, parity, order, rq, w)) return std::nullopt;
        if (!passesCheapCheck(w, m_levels[rq.level])) return std::nullopt;
        // Full refinement and verification.
        ++m_fullVerifications;
        RefineOutcome r = refine(m_det, m_refs, m_tree, w, m_rCheap, false, m_p, m_ctx.threadCount());
        if (r.ok) return r;
        m_lastWhy = r.why;
        if (m_fullVerifications >= m_p.maxFullVerifications) {
            RefineOutcome fail;
            fail.why = "gave up after " + std::to_string(m_fullVerifications) +
                       " candidate solutions; last: " + m_lastWhy;
            return fail;
        }
        return std::nullopt;
    }

    // The similarity transform from the 4 stars of a hit as a WCS; false when its pixel scale or its centre
    // lies outside the search.
    bool candidateWcs(const DetQuad& q, int parity, const std::array<int, 4>& order, const RefQuad& rq,
                      TanSip& w) const {
        const int dA = q.star[order[0]], dB = q.star[order[1]];
        const double abPx = std::hypot(m_det.x[dA] - m_det.x[dB], m_det.y[dA] - m_det.y[dB]);
        const double scale = rq.abDeg * 3600.0 / abPx;
        if (scale < m_sLo || scale > m_sHi) return false;
        // Similarity on the tangent plane at the reference quad's first star, then again at the predicted
        // frame centre.
        Cplx zd[4], zr[4];
        const double ra0 = m_refs.ra[rq.star[0]], dec0 = m_refs.dec[rq.star[0]];
        for (int k = 0; k < 4; ++k) {
            const int di = q.star[order[k]];
            zd[k] = Cplx(parity * (m_det.x[di] - m_cx), m_det.y[di] - m_cy);
            zr[k] = tanPoint(ra0, dec0, m_refs.ra[rq.star[k]], m_refs.dec[rq.star[k]]);
        }
        Cplx a, b;
        similarity(zd, zr, 4, a, b);
        double cra = 0, cdec = 0;
        tanDeproject(ra0, dec0, b.real(), b.imag(), cra, cdec);
        for (int k = 0; k < 4; ++k)
            zr[k] = tanPoint(cra, cdec, m_refs.ra[rq.star[k]], m_refs.dec[rq.star[k]]);
        similarity(zd, zr, 4, a, b);
        double ra1 = 0, dec1 = 0;
        tanDeproject(cra, cdec, b.real(), b.imag(), ra1, dec1);
        const auto c1 = unitVector(ra1, dec1);
        const auto& s0 = m_searchCentre;
        const double chordC =
            std::sqrt((c1[0] - s0[0]) * (c1[0] - s0[0]) + (c1[1] - s0[1]) * (c1[1] - s0[1]) +
                      (c1[2] - s0[2]) * (c1[2] - s0[2]));
        if (degFromChord(chordC) > m_search.radiusDeg) return false;
        w.crpix[0] = m_crpix[0];
        w.crpix[1] = m_crpix[1];
        w.crval[0] = ra1;
        w.crval[1] = dec1;
        // (xi + i eta) = a (parity u + i v)
        w.cd[0][0] = parity * a.real();
        w.cd[0][1] = -a.imag();
        w.cd[1][0] = parity * a.imag();
        w.cd[1][1] = a.real();
        return true;
    }

    // Cheap check: enough of the bright detections land near thinned reference stars of the level (far
    // more than the level's density gives by chance).
    bool passesCheapCheck(const TanSip& w, const Level& lv) const {
        const double sc = w.pixelScaleArcsec() / 3600.0;
        int good = 0;
        for (std::size_t i = 0; i < m_nCheck; ++i) {
            double ra = 0, dec = 0;
            w.pixelToWorld(m_det.x[i], m_det.y[i], ra, dec);
            const auto [idx, chord] = lv.tree->nearest(unitVector(ra, dec));
            if (idx >= 0 && degFromChord(chord) / sc <= m_rCheap) ++good;
        }
        const double ratio = w.pixelScaleArcsec() / lv.scale;
        const double lambda = m_nCheck * std::numbers::pi * m_rCheap * m_rCheap * lv.density * ratio * ratio;
        return !(good < std::max(8.0, lambda + 5.0 * std::sqrt(lambda) + 4.0));
    }

    const Detections& m_det;
    const RefStars& m_refs;
    const SkyTree* m_tree;
    const BlindSearch& m_search;
    const AstrometryParams& m_p;
    RunContext& m_ctx;
    const std::vector<Level>& m_levels;
    const std::vector<DetQuad>& m_dq;
    const double m_sLo, m_sHi;
    const double m_cx, m_cy;
    const double m_crpix[2];
    const double m_rCheap;
    const std::size_t m_nCheck;
    const std::array<double, 3> m_searchCentre;
    const double m_tol2;
    int m_fullVerifications = 0;
    std::string m_lastWhy = "no quad of the detections matched a reference quad";
    std::vector<std::pair<std::array<int, 4>, std::array<double, 4>>> m_vars; // reused buffers
    std::vector<std::pair<std::uint32_t, double>> m_hits;
};
} // namespace

struct QuadLevels {
    std::vector<Level> levels;
    std::vector<LevelIndex> index; // one per level
};

std::shared_ptr<const QuadLevels> buildQuadLevels(const RefStars& refs, int width, int height,
                                                  const AstrometryParams& p, int threads) {
    auto out = std::make_shared<QuadLevels>();
    const double sizePx = std::sqrt(double(width) * height);
    const double sLo = std::max(p.scaleLow, 1e-3), sHi = std::max(p.scaleHigh, sLo);
    std::vector<std::uint32_t> all(refs.size());
    for (std::size_t i = 0; i < all.size(); ++i)
        all[i] = static_cast<std::uint32_t>(i);
    out->levels = levelScales(sLo, sHi);
    out->index.resize(out->levels.size());
    for (std::size_t l = 0; l < out->levels.size(); ++l) {
        fillLevel(all, refs, p, sizePx, out->levels[l]);
        buildLevelIndex(out->levels, static_cast<int>(l), sizePx, p, threads, out->index[l]);
    }
    return out;
}

std::size_t quadCount(const QuadLevels& q) {
    std::size_t n = 0;
    for (const LevelIndex& li : q.index)
        n += li.quads.size();
    return n;
}

namespace {
// Levels from the largest scale down (the cheap ones first), each built (in parallel inside) just before it
// is searched, or taken from `prebuilt` (the levels that overlap the searched scales); the search order
// (level, then detection quad) and so the answer do not depend on the thread count.
// `levels` is `own` (filled here) or prebuilt's levels.
RefineOutcome searchLevels(QuadSearch& quadSearch, const std::vector<Level>& levels, std::vector<Level>& own,
                           const QuadLevels* prebuilt, const std::vector<std::uint32_t>& area,
                           const RefStars& refs, double sizePx, double sLo, double sHi,
                           const AstrometryParams& p, RunContext& ctx) {
    const int nLevels = static_cast<int>(levels.size());
    const double half = levelHalfStep();
    std::size_t totalQuads = 0;
    for (int l = nLevels - 1; l >= 0; --l) {
        if (levels[l].scale * half < sLo || levels[l].scale / half > sHi) continue;
        LevelIndex built;
        if (!prebuilt) {
            fillLevel(area, refs, p, sizePx, own[l]);
            buildLevelIndex(levels, l, sizePx, p, ctx.threadCount(), built);
        }
        const LevelIndex& li = prebuilt ? prebuilt->index[l] : built;
        ctx.checkCancelled();
        totalQuads += li.quads.size();
        if (li.quads.empty()) continue;
        ctx.report("astrometry", 0.9 * (nLevels - l) / double(nLevels));
        if (auto r = quadSearch.searchLevel(li)) return std::move(*r);
    }
    RefineOutcome fail;
    if (totalQuads == 0) {
        fail.why = "no reference quads in the search area";
        return fail;
    }
    const int fullVerifications = quadSearch.fullVerifications();
    const std::string& lastWhy = quadSearch.lastWhy();
    fail.why = fullVerifications > 0
                   ? "no candidate solution passed verification (" + std::to_string(fullVerifications) +
                         " tried; last: " + lastWhy + ")"
                   : lastWhy;
    return fail;
}

// The stars within radiusDeg of the unit vector c, in ascending order: through the tree when given, else by a
// linear scan (cheaper than building a tree for one search).
std::vector<std::uint32_t> areaStars(const RefStars& refs, const SkyTree* tree,
                                     const std::array<double, 3>& c, double radiusDeg) {
    std::vector<std::uint32_t> area;
    if (tree) {
        area = tree->cone(c, radiusDeg);
        std::sort(area.begin(), area.end());
        return area;
    }
    const double ch = chordFromDeg(radiusDeg), ch2 = ch * ch;
    for (std::size_t i = 0; i < refs.size(); ++i) {
        const auto& v = refs.xyz[i];
        const double d2 =
            (v[0] - c[0]) * (v[0] - c[0]) + (v[1] - c[1]) * (v[1] - c[1]) + (v[2] - c[2]) * (v[2] - c[2]);
        if (d2 < ch2) area.push_back(static_cast<std::uint32_t>(i));
    }
    return area;
}
} // namespace

RefineOutcome solveBlind(const Detections& det, const RefStars& refs, const SkyTree* tree,
                         const BlindSearch& search, const AstrometryParams& p, RunContext& ctx,
                         const QuadLevels* prebuilt) {
    RefineOutcome fail;
    const int width = det.width, height = det.height;
    const double sizePx = std::sqrt(double(width) * height);
    const double halfDiagPx = 0.5 * std::hypot(width, height);
    const double sLo = std::max(search.scaleLow, 1e-3), sHi = std::max(search.scaleHigh, sLo);

    std::vector<Level> ownLevels; // filled level by level as the search reaches them
    std::vector<std::uint32_t> area;
    if (!prebuilt) { // the reference stars of the search area (brightest first)
        const double areaRadius = std::min(180.0, search.radiusDeg + halfDiagPx * sHi / 3600.0 * 1.1);
        area = areaStars(refs, tree, unitVector(search.centre[0], search.centre[1]), areaRadius);
        if (area.size() < 6) {
            fail.why = "fewer than 6 reference stars in the search area";
            return fail;
        }
        ownLevels = levelScales(sLo, sHi);
    }
    const std::vector<Level>& levels = prebuilt ? prebuilt->levels : ownLevels;
    const std::size_t nq = std::min<std::size_t>(det.size(), std::max(p.nBrightest, 4));
    const std::vector<DetQuad> dq = detectionQuads(det, nq, sizePx);
    QuadSearch quadSearch(det, refs, tree, search, p, ctx, levels, dq, sizePx, nq, sLo, sHi);
    return searchLevels(quadSearch, levels, ownLevels, prebuilt, area, refs, sizePx, sLo, sHi, p, ctx);
}

} // namespace gpuphot::astrom
