// Stage 7 internals: blind solving by asterism matching (astrometry.net-style quads).
//
// Reference side, per scale level (levels sqrt(2) apart between scaleLow and scaleHigh): the
// reference stars of the search area are thinned to the brightest `refPerCell` per cell of a sky grid
// (16 cells per field at that scale); every pair (A, B) of them whose separation is a fraction
// 0.15..0.6 of the field size forms one quad with the two brightest stars (C, D) inside the circle of
// diameter AB. Its code is the position of C and D in the frame that puts A at (0, 0) and B at (1, 1)
// (on the tangent plane at the quad's midpoint), made unique by xC + xD <= 1 and xC <= xD. All codes
// go into one 4-D k-d tree. Detection side: the nBrightest detections form the same quads (up to the
// 4 brightest inside the circle, every pair of them), in both parities, brightest quads first. Each
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

void raDecOf(const std::array<double, 3>& v, double& ra, double& dec) {
    ra = std::atan2(v[1], v[0]) / kDeg;
    if (ra < 0) ra += 360.0;
    dec = std::asin(std::clamp(v[2], -1.0, 1.0)) / kDeg;
}

// Half a level step on a log scale (the levels are sqrt(2) apart): a level covers the scales within this
// factor of its own.
double levelHalfStep() {
    return std::pow(2.0, 0.25);
}

// Scale levels sqrt(2) apart from sLo to sHi, each with the reference stars of `area` thinned to the
// brightest refPerCell per sky cell (16 cells per field at that scale) and a sky tree over them.
std::vector<Level> buildLevels(const std::vector<std::uint32_t>& area, const RefStars& refs,
                               const AstrometryParams& p, double sizePx, double sLo, double sHi) {
    const double step = std::sqrt(2.0), half = levelHalfStep();
    std::vector<Level> levels;
    for (double s = sLo * half; s / half < sHi * 1.0000001; s *= step) {
        Level lv;
        lv.scale = s;
        const double cellDeg = s / 3600.0 * sizePx / 4.0;
        std::unordered_map<std::int64_t, int> counts;
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

// The reference quad on the pair (ia, ib) of level `lv` (sortedNb: ia's neighbours within dMax, brightest
// first): the two brightest stars inside the circle AB and the canonical code; false when there is none.
bool makeRefQuad(const Level& lv, int l, const RefStars& refs, std::size_t ia, std::uint32_t ib,
                 const std::vector<std::uint32_t>& sortedNb, double dMin, double dMax, RefQuad& q,
                 std::array<double, 4>& code) {
    const auto& va = lv.xyz[ia];
    const auto& vb = lv.xyz[ib];
    const double chordAB = std::sqrt((va[0] - vb[0]) * (va[0] - vb[0]) + (va[1] - vb[1]) * (va[1] - vb[1]) +
                                     (va[2] - vb[2]) * (va[2] - vb[2]));
    const double dAB = degFromChord(chordAB);
    if (dAB < dMin || dAB > dMax) return false;
    std::array<double, 3> m = {va[0] + vb[0], va[1] + vb[1], va[2] + vb[2]};
    const double norm = std::sqrt(m[0] * m[0] + m[1] * m[1] + m[2] * m[2]);
    for (double& c : m)
        c /= norm;
    const double rc = chordFromDeg(0.5 * dAB);
    std::uint32_t inside[2];
    int nIn = 0;
    for (std::uint32_t ic : sortedNb) {
        if (ic == ia || ic == ib) continue;
        const auto& vc = lv.xyz[ic];
        const double d2 = (vc[0] - m[0]) * (vc[0] - m[0]) + (vc[1] - m[1]) * (vc[1] - m[1]) +
                          (vc[2] - m[2]) * (vc[2] - m[2]);
        if (d2 > rc * rc) continue;
        inside[nIn++] = ic;
        if (nIn == 2) break;
    }
    if (nIn < 2) return false;
    double mra = 0, mdec = 0;
    raDecOf(m, mra, mdec);
    const std::uint32_t ids[4] = {static_cast<std::uint32_t>(ia), ib, inside[0], inside[1]};
    std::array<Cplx, 4> pts;
    for (int k = 0; k < 4; ++k) {
        const std::int32_t r = lv.sel[ids[k]];
        pts[k] = tanPoint(mra, mdec, refs.ra[r], refs.dec[r]);
    }
    std::vector<std::pair<std::array<int, 4>, std::array<double, 4>>> vars;
    codeVariants(pts, 0.0, vars);
    if (vars.empty()) return false;
    for (int k = 0; k < 4; ++k)
        q.star[k] = lv.sel[ids[vars[0].first[k]]];
    q.level = l;
    q.abDeg = dAB;
    code = vars[0].second;
    return true;
}

// Reference quads of level l, with their k-d tree on the code.
void buildLevelIndex(const std::vector<Level>& levels, int l, const RefStars& refs, double sizePx,
                     LevelIndex& out) {
    const double half = levelHalfStep();
    const Level& lv = levels[l];
    const double dMin = kQuadMin * sizePx * lv.scale / half / 3600.0;
    const double dMax = kQuadMax * sizePx * lv.scale * half / 3600.0;
    for (std::size_t ia = 0; ia < lv.sel.size(); ++ia) {
        std::vector<std::uint32_t> sortedNb = lv.tree->cone(lv.xyz[ia], dMax);
        std::sort(sortedNb.begin(), sortedNb.end()); // brightness order
        for (std::uint32_t ib : sortedNb) {
            if (ib <= ia) continue;
            RefQuad q;
            std::array<double, 4> code;
            if (!makeRefQuad(lv, l, refs, ia, ib, sortedNb, dMin, dMax, q, code)) continue;
            out.quads.push_back(q);
            out.codes.pts.push_back(code);
        }
    }
    out.tree = std::make_unique<Tree4>(4, out.codes, nanoflann::KDTreeSingleIndexAdaptorParams(16));
}

// Builds the indexes of levels first, first - 1, ..., first - count + 1 into built[0..count) in parallel
// (one level per thread; each level's index does not depend on the thread count).
void buildLevelBatch(const std::vector<Level>& levels, int first, int count, const RefStars& refs,
                     double sizePx, std::vector<LevelIndex>& built) {
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(count)
    for (int k = 0; k < count; ++k)
        errors.run([&] { buildLevelIndex(levels, first - k, refs, sizePx, built[k]); });
    errors.rethrow();
}

// The search proper: every detection quad against one level's reference quads, each code hit turned into
// a candidate WCS that must pass the search limits, the cheap check and finally refine()'s verification.
class QuadSearch {
public:
    QuadSearch(const Detections& det, const RefStars& refs, const SkyTree& tree, const BlindSearch& search,
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
        RefineOutcome r = refine(m_det, m_refs, &m_tree, w, m_rCheap, false, m_p, m_ctx.threadCount());
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
    const SkyTree& m_tree;
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

RefineOutcome solveBlind(const Detections& det, const RefStars& refs, const SkyTree& tree,
                         const BlindSearch& search, const AstrometryParams& p, RunContext& ctx) {
    RefineOutcome fail;
    const int width = det.width, height = det.height;
    const double sizePx = std::sqrt(double(width) * height);
    const double halfDiagPx = 0.5 * std::hypot(width, height);
    const double sLo = std::max(search.scaleLow, 1e-3), sHi = std::max(search.scaleHigh, sLo);

    // Reference stars of the search area (brightest first).
    const double areaRadius = std::min(180.0, search.radiusDeg + halfDiagPx * sHi / 3600.0 * 1.1);
    std::vector<std::uint32_t> area = tree.cone(unitVector(search.centre[0], search.centre[1]), areaRadius);
    std::sort(area.begin(), area.end());
    if (area.size() < 6) {
        fail.why = "fewer than 6 reference stars in the search area";
        return fail;
    }

    const std::vector<Level> levels = buildLevels(area, refs, p, sizePx, sLo, sHi);
    const std::size_t nq = std::min<std::size_t>(det.size(), std::max(p.nBrightest, 4));
    const std::vector<DetQuad> dq = detectionQuads(det, nq, sizePx);
    QuadSearch quadSearch(det, refs, tree, search, p, ctx, levels, dq, sizePx, nq, sLo, sHi);

    // Levels from the largest scale down (the cheap ones first), built in batches in parallel; the
    // search order (level, then detection quad) and so the answer do not depend on the batch size.
    const int nLevels = static_cast<int>(levels.size());
    const int batch = std::max(1, std::min(ctx.threadCount(), nLevels));
    std::size_t totalQuads = 0;
    for (int first = nLevels - 1; first >= 0; first -= batch) {
        const int count = std::min(batch, first + 1);
        std::vector<LevelIndex> built(count);
        buildLevelBatch(levels, first, count, refs, sizePx, built);
        ctx.checkCancelled();
        for (int k = 0; k < count; ++k) {
            const LevelIndex& li = built[k];
            totalQuads += li.quads.size();
            if (li.quads.empty()) continue;
            ctx.report("astrometry", 0.9 * (nLevels - first + k) / double(nLevels));
            if (auto r = quadSearch.searchLevel(li)) return std::move(*r);
        }
    }
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

} // namespace gpuphot::astrom
