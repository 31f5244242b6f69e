// Stage 7 internals: sky k-d tree, pixel matching and the weighted least-squares TAN+SIP fit.
#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>
#include <numeric>

#include <Eigen/Dense>
#include <nanoflann.hpp>

#include "core/stages/astrometry/astrometry_internal.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot::astrom {
namespace {
constexpr double kDeg = std::numbers::pi / 180.0;

struct Cloud3 {
    const std::vector<std::array<double, 3>>* pts = nullptr;
    std::size_t kdtree_get_point_count() const { return pts->size(); }
    double kdtree_get_pt(std::size_t i, std::size_t d) const { return (*pts)[i][d]; }
    template <class B> bool kdtree_get_bbox(B&) const { return false; }
};
using Tree3 = nanoflann::KDTreeSingleIndexAdaptor<nanoflann::L2_Simple_Adaptor<double, Cloud3>, Cloud3, 3>;

} // namespace

std::array<double, 3> unitVector(double raDeg, double decDeg) {
    const double a = raDeg * kDeg, d = decDeg * kDeg;
    return {std::cos(d) * std::cos(a), std::cos(d) * std::sin(a), std::sin(d)};
}
double chordFromDeg(double deg) {
    return 2.0 * std::sin(0.5 * std::min(deg, 180.0) * kDeg);
}
double degFromChord(double chord) {
    return 2.0 * std::asin(std::min(1.0, 0.5 * chord)) / kDeg;
}

struct SkyTree::Impl {
    std::vector<std::array<double, 3>> points; // own copy: the tree must not follow a moved vector
    Cloud3 cloud;
    std::unique_ptr<Tree3> tree;
};

SkyTree::SkyTree(const std::vector<std::array<double, 3>>& points) : m_impl(std::make_unique<Impl>()) {
    m_impl->points = points;
    m_impl->cloud.pts = &m_impl->points;
    m_impl->tree = std::make_unique<Tree3>(3, m_impl->cloud, nanoflann::KDTreeSingleIndexAdaptorParams(16));
}
SkyTree::~SkyTree() = default;

std::vector<std::uint32_t> SkyTree::cone(const std::array<double, 3>& p, double radiusDeg) const {
    std::vector<std::pair<std::uint32_t, double>> hits;
    if (m_impl->cloud.pts->empty()) return {};
    const double c = chordFromDeg(radiusDeg);
    m_impl->tree->radiusSearch(p.data(), c * c, hits, nanoflann::SearchParams(32, 0.0f, false));
    std::sort(hits.begin(), hits.end(), [](const auto& a, const auto& b) {
        return a.second != b.second ? a.second < b.second : a.first < b.first;
    });
    std::vector<std::uint32_t> out(hits.size());
    for (std::size_t i = 0; i < hits.size(); ++i)
        out[i] = hits[i].first;
    return out;
}

std::vector<std::uint32_t> SkyTree::coneByIndex(const std::array<double, 3>& p, double radiusDeg) const {
    std::vector<std::uint32_t> out;
    std::vector<std::pair<std::uint32_t, double>> hits;
    coneByIndex(p, radiusDeg, out, hits);
    return out;
}

void SkyTree::coneByIndex(const std::array<double, 3>& p, double radiusDeg, std::vector<std::uint32_t>& out,
                          std::vector<std::pair<std::uint32_t, double>>& hits) const {
    out.clear();
    hits.clear();
    if (m_impl->cloud.pts->empty()) return;
    const double c = chordFromDeg(radiusDeg);
    m_impl->tree->radiusSearch(p.data(), c * c, hits, nanoflann::SearchParams(32, 0.0f, false));
    out.resize(hits.size());
    for (std::size_t i = 0; i < hits.size(); ++i)
        out[i] = hits[i].first;
    std::sort(out.begin(), out.end());
}

std::pair<std::int64_t, double> SkyTree::nearest(const std::array<double, 3>& p) const {
    if (m_impl->cloud.pts->empty()) return {-1, 0.0};
    std::uint32_t idx = 0;
    double d2 = 0.0;
    m_impl->tree->knnSearch(p.data(), 1, &idx, &d2);
    return {static_cast<std::int64_t>(idx), std::sqrt(d2)};
}

void sortByKey(std::vector<std::pair<double, std::int32_t>>& v) {
    const std::size_t n = v.size();
    if (n < 4096) {
        std::sort(v.begin(), v.end());
        return;
    }
    // Keys already in order (a catalog sorted by magnitude): rows ascend, so the stable order stands.
    bool sorted = true;
    for (std::size_t i = 1; i < n && sorted; ++i)
        sorted = !(v[i].first < v[i - 1].first);
    if (sorted) {
        for (auto& e : v)
            e.first += 0.0; // -0 -> +0
        return;
    }
    std::vector<std::uint64_t> key(n), key2(n);
    std::vector<std::int32_t> row(n), row2(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double m = v[i].first + 0.0; // -0 -> +0
        auto b = std::bit_cast<std::uint64_t>(m);
        key[i] = (b >> 63) ? ~b : (b | (std::uint64_t{1} << 63)); // order-preserving map to unsigned
        row[i] = v[i].second;
    }
    constexpr int kBits = 11;
    constexpr std::size_t kBuckets = std::size_t{1} << kBits;
    std::vector<std::size_t> count(kBuckets);
    for (int shift = 0; shift < 64; shift += kBits) {
        std::fill(count.begin(), count.end(), 0);
        for (std::size_t i = 0; i < n; ++i)
            ++count[(key[i] >> shift) & (kBuckets - 1)];
        if (count[(key[0] >> shift) & (kBuckets - 1)] == n) continue; // one digit: the order stands
        std::size_t sum = 0;
        for (std::size_t& c : count) {
            const std::size_t t = c;
            c = sum;
            sum += t;
        }
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t at = count[(key[i] >> shift) & (kBuckets - 1)]++;
            key2[at] = key[i];
            row2[at] = row[i];
        }
        key.swap(key2);
        row.swap(row2);
    }
    for (std::size_t i = 0; i < n; ++i) {
        v[i].second = row[i];
        v[i].first = std::bit_cast<double>((key[i] >> 63) ? (key[i] & ~(std::uint64_t{1} << 63)) : ~key[i]);
    }
}

bool boundingBox(const std::vector<double>& x, const std::vector<double>& y, std::size_t n,
                 std::array<double, 4>& box) {
    box = {INFINITY, INFINITY, -INFINITY, -INFINITY};
    for (std::size_t i = 0; i < n; ++i) {
        box[0] = std::min(box[0], x[i]);
        box[2] = std::max(box[2], x[i]);
        box[1] = std::min(box[1], y[i]);
        box[3] = std::max(box[3], y[i]);
    }
    return std::isfinite(box[0]) && std::isfinite(box[1]) && std::isfinite(box[2]) && std::isfinite(box[3]);
}

std::vector<Match> matchInPixels(const Detections& det, std::size_t nDet, const std::vector<double>& refX,
                                 const std::vector<double>& refY, const std::vector<std::int32_t>& refIds,
                                 std::size_t nRef, double radius, int threads) {
    nDet = std::min(nDet, det.size());
    nRef = std::min(nRef, refX.size());
    std::vector<Match> cand;
    if (nDet == 0 || nRef == 0 || !(radius >= 0.0)) return cand;
    // The nearest star of each detection from a uniform grid over the stars (cells >= radius): the cells
    // the detection's radius touches hold every star within the radius. Squared distances as a k-d tree
    // computes them ((q - p)^2 summed from 0); ties go to the lower star row. Same matches as a k-d tree
    // search up to exact distance ties (measure zero).
    std::array<double, 4> box{};
    if (!boundingBox(refX, refY, nRef, box)) return cand;
    const detail::PointGrid grid(refX, refY, nRef, box[0], box[1], box[2] - box[0], box[3] - box[1],
                                 radius * (1.0 + 1e-9));
    const std::vector<std::uint32_t> order = grid.cellOrder(det.x, det.y, nDet);
    const double r2 = radius * radius;
    const double reach = radius * (1.0 + 1e-6) + 1e-6;
    // Nearest star per detection (independent queries, in parallel), then collected in detection order.
    std::vector<Match> nearest(nDet);
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (nDet > 4096)
    for (long long o = 0; o < static_cast<long long>(order.size()); ++o) {
        const std::uint32_t i = order[o];
        const double qx = det.x[i], qy = det.y[i];
        double best = INFINITY;
        std::uint32_t bestJ = 0;
        grid.visit(qx, qy, reach, [&](std::uint32_t j) {
            const double dx = qx - grid.sx[j], dy = qy - grid.sy[j];
            double d2 = 0.0;
            d2 += dx * dx;
            d2 += dy * dy;
            if (d2 < best || (d2 == best && grid.index[j] < bestJ)) {
                best = d2;
                bestJ = grid.index[j];
            }
        });
        if (!(best <= r2)) continue;
        nearest[i] = {static_cast<std::int32_t>(i), static_cast<std::int32_t>(bestJ), std::sqrt(best)};
    }
    // A star claimed by several detections goes to the closest (ties: the lower detection). Each detection
    // claims one star only, so this per-star minimum of (distance, detection) is what taking the
    // candidates in (distance, detection) order and skipping taken stars gives, without the sort.
    cand.reserve(nDet);
    std::vector<std::int32_t> owner(nRef, -1);
    for (std::size_t i = 0; i < nDet; ++i) {
        const Match& m = nearest[i];
        if (m.det < 0) continue;
        std::int32_t& o = owner[static_cast<std::size_t>(m.ref)];
        if (o < 0 || m.dist < nearest[static_cast<std::size_t>(o)].dist) o = m.det;
    }
    for (std::size_t i = 0; i < nDet; ++i) {
        const Match& m = nearest[i];
        if (m.det >= 0 && owner[static_cast<std::size_t>(m.ref)] == m.det)
            cand.push_back({m.det, refIds[m.ref], m.dist});
    }
    return cand;
}

namespace {

// The fit's design: the polynomial terms, the normalisation of (u, v), the row blocks of the sums and the
// basis (the k terms at every star, row-major).
struct FitDesign {
    std::vector<std::pair<int, int>> terms; // (p, q), by total degree
    int order = 1;
    int k = 0;
    std::size_t kk = 0, n = 0, nBlocks = 0;
    double scale = 1.0; // u, v divided by it: about [-1, 1] for conditioning
    int threads = 1;
    std::vector<double> basis;
    std::vector<double> sinDec, cosDec; // of every star (sinCosDeg): the same for every tangent point tried
};

// The normal matrix A^T W A: the basis of every star and the lower triangle's partial sums per block (in
// parallel), then the block sums added in block order and mirrored to the upper triangle.
Eigen::MatrixXd normalMatrix(FitDesign& f, const std::vector<double>& x, const std::vector<double>& y,
                             const std::vector<double>& w, const double crpix[2]) {
    const std::size_t n = f.n, nBlocks = f.nBlocks, kk = f.kk;
    const int k = f.k, order = f.order;
    const double scale = f.scale;
    const std::vector<std::pair<int, int>>& terms = f.terms;
    std::vector<double>& basis = f.basis;
    basis.resize(kk * n);
    std::vector<double> blockAta(nBlocks * kk * kk, 0.0);
    ParallelErrors errors;
#pragma omp parallel num_threads(f.threads)
    {
        std::vector<double> powU, powV;
        errors.run([&] {
            powU.resize(static_cast<std::size_t>(order) + 1);
            powV.resize(powU.size());
        });
        const bool ok = !errors.failed();
#pragma omp for schedule(static)
        for (long long bl = 0; bl < static_cast<long long>(nBlocks); ++bl) {
            if (!ok) continue;
            const std::size_t i0 = static_cast<std::size_t>(bl) * kFitBlock, i1 = std::min(n, i0 + kFitBlock);
            double* ata = &blockAta[static_cast<std::size_t>(bl) * kk * kk];
            for (std::size_t i = i0; i < i1; ++i) {
                const double u = (x[i] + 1.0 - crpix[0]) / scale, v = (y[i] + 1.0 - crpix[1]) / scale;
                powU[0] = powV[0] = 1.0;
                for (int e = 1; e <= order; ++e) {
                    powU[e] = powU[e - 1] * u;
                    powV[e] = powV[e - 1] * v;
                }
                double* b = &basis[i * kk];
                for (int t = 0; t < k; ++t)
                    b[t] = powU[terms[t].first] * powV[terms[t].second];
                const double wi = w[i];
                for (int r = 0; r < k; ++r) {
                    const double wr = wi * b[r];
                    for (int c = 0; c <= r; ++c)
                        ata[r * kk + c] += wr * b[c];
                }
            }
        }
    }
    errors.rethrow();
    Eigen::MatrixXd ata = Eigen::MatrixXd::Zero(k, k);
    for (std::size_t bl = 0; bl < nBlocks; ++bl)
        for (int r = 0; r < k; ++r)
            for (int c = 0; c <= r; ++c)
                ata(r, c) += blockAta[bl * kk * kk + r * kk + c];
    for (int r = 0; r < k; ++r)
        for (int c = r + 1; c < k; ++c)
            ata(r, c) = ata(c, r);
    return ata;
}

// The right-hand sides A^T W xi and A^T W eta per block (in parallel), with the standard coordinates
// (xi, eta) of every star about crval; true when a star lies behind the tangent plane.
bool rhsBlocks(const FitDesign& f, const std::vector<double>& ra, const std::vector<double>& w,
               const double crval[2], std::vector<double>& xi, std::vector<double>& eta,
               std::vector<double>& blockB) {
    const std::size_t n = f.n, nBlocks = f.nBlocks, kk = f.kk;
    const int k = f.k;
    const std::vector<double>& basis = f.basis;
    bool behind = false;
    double sinDec0 = 0, cosDec0 = 0;
    sinCosDeg(crval[1], sinDec0, cosDec0);
    std::fill(blockB.begin(), blockB.end(), 0.0);
#pragma omp parallel for schedule(static) num_threads(f.threads) reduction(|| : behind)
    for (long long bl = 0; bl < static_cast<long long>(nBlocks); ++bl) {
        const std::size_t i0 = static_cast<std::size_t>(bl) * kFitBlock, i1 = std::min(n, i0 + kFitBlock);
        double* bx = &blockB[static_cast<std::size_t>(bl) * 2 * kk];
        double* by = bx + kk;
        for (std::size_t i = i0; i < i1; ++i) {
            if (!tanProjectSinCos(crval[0], sinDec0, cosDec0, ra[i], f.sinDec[i], f.cosDec[i], xi[i],
                                  eta[i])) {
                behind = true;
                continue;
            }
            const double* b = &basis[i * kk];
            const double wx = w[i] * xi[i], wy = w[i] * eta[i];
            for (int r = 0; r < k; ++r) {
                bx[r] += b[r] * wx;
                by[r] += b[r] * wy;
            }
        }
    }
    return behind;
}

// Solves for the coefficients (cx: xi, cy: eta) and moves the tangent point crval until the polynomial has
// no constant term (at most 8 times); xi, eta: the stars' standard coordinates about the last crval used.
// False when a star is behind the tangent plane or the solution is not finite.
bool solveMovingTangentPoint(const FitDesign& f, const Eigen::LDLT<Eigen::MatrixXd>& ldlt,
                             const std::vector<double>& ra, const std::vector<double>& w, double crval[2],
                             Eigen::VectorXd& cx, Eigen::VectorXd& cy, std::vector<double>& xi,
                             std::vector<double>& eta) {
    const std::size_t nBlocks = f.nBlocks, kk = f.kk;
    const int k = f.k;
    std::vector<double> blockB(nBlocks * 2 * kk);
    for (int iter = 0; iter < 8; ++iter) {
        if (rhsBlocks(f, ra, w, crval, xi, eta, blockB)) return false;
        Eigen::VectorXd bx = Eigen::VectorXd::Zero(k), by = Eigen::VectorXd::Zero(k);
        for (std::size_t bl = 0; bl < nBlocks; ++bl)
            for (int r = 0; r < k; ++r) {
                bx(r) += blockB[bl * 2 * kk + r];
                by(r) += blockB[bl * 2 * kk + kk + r];
            }
        cx = ldlt.solve(bx);
        cy = ldlt.solve(by);
        if (!cx.allFinite() || !cy.allFinite()) return false;
        if (std::hypot(cx(0), cy(0)) < 1e-11) break;
        double nra = 0, ndec = 0;
        tanDeproject(crval[0], crval[1], cx(0), cy(0), nra, ndec);
        crval[0] = nra;
        crval[1] = ndec;
    }
    return true;
}

// The TanSip of the solved coefficients: CD from the linear terms, SIP A/B from the higher ones (in pixel
// units through CD^-1); det: CD's determinant. False when CD is singular or not finite.
bool tanSipOfCoefficients(const FitDesign& f, const double crpix[2], const double crval[2],
                          const Eigen::VectorXd& cx, const Eigen::VectorXd& cy, TanSip& s, double& det) {
    const double scale = f.scale;
    s.crpix[0] = crpix[0];
    s.crpix[1] = crpix[1];
    s.crval[0] = crval[0];
    s.crval[1] = crval[1];
    // Linear terms are at t = 1 (u) and t = 2 (v).
    s.cd[0][0] = cx(1) / scale;
    s.cd[0][1] = cx(2) / scale;
    s.cd[1][0] = cy(1) / scale;
    s.cd[1][1] = cy(2) / scale;
    det = s.cd[0][0] * s.cd[1][1] - s.cd[0][1] * s.cd[1][0];
    if (!(std::fabs(det) > 0.0) || !std::isfinite(det)) return false;
    if (f.order >= 2) {
        s.setSipOrder(f.order);
        for (int t = 3; t < f.k; ++t) {
            const auto [p, q] = f.terms[t];
            const double fs = std::pow(scale, p + q);
            const double px = cx(t) / fs, py = cy(t) / fs;
            s.coeffA(p, q) = (s.cd[1][1] * px - s.cd[0][1] * py) / det;
            s.coeffB(p, q) = (-s.cd[1][0] * px + s.cd[0][0] * py) / det;
        }
    }
    return true;
}

// The weighted chi^2 of the fit in px^2: per block (in parallel), the block sums added in block order.
double weightedChi2(const FitDesign& f, const std::vector<double>& w, const std::vector<double>& xi,
                    const std::vector<double>& eta, const Eigen::VectorXd& cx, const Eigen::VectorXd& cy,
                    double det) {
    const std::size_t n = f.n, nBlocks = f.nBlocks, kk = f.kk;
    const int k = f.k;
    const std::vector<double>& basis = f.basis;
    std::vector<double> blockChi(nBlocks, 0.0);
#pragma omp parallel for schedule(static) num_threads(f.threads)
    for (long long bl = 0; bl < static_cast<long long>(nBlocks); ++bl) {
        const std::size_t i0 = static_cast<std::size_t>(bl) * kFitBlock, i1 = std::min(n, i0 + kFitBlock);
        double sum = 0.0;
        for (std::size_t i = i0; i < i1; ++i) {
            const double* b = &basis[i * kk];
            double fx = 0, fy = 0;
            for (int t = 0; t < k; ++t) {
                fx += cx(t) * b[t];
                fy += cy(t) * b[t];
            }
            sum += w[i] * ((fx - xi[i]) * (fx - xi[i]) + (fy - eta[i]) * (fy - eta[i]));
        }
        blockChi[static_cast<std::size_t>(bl)] = sum;
    }
    double sum = 0.0;
    for (double v : blockChi)
        sum += v;
    const double pxDeg = std::sqrt(std::fabs(det));
    return sum / (pxDeg * pxDeg); // in px^2 (weighted)
}

} // namespace

bool fitTanSip(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& ra,
               const std::vector<double>& dec, const std::vector<double>& w, const double crpix[2],
               const double crval0[2], int order, TanSip& out, double* chi2, int threads) {
    const std::size_t n = x.size();
    FitDesign f;
    f.n = n;
    f.order = order = std::max(order, 1);
    for (int d = 0; d <= order; ++d)
        for (int p = d; p >= 0; --p)
            f.terms.emplace_back(p, d - p);
    const int k = f.k = static_cast<int>(f.terms.size());
    if (n < static_cast<std::size_t>(k)) return false;
    // Normalise u, v to about [-1, 1] for conditioning.
    double scale = 1.0;
    for (std::size_t i = 0; i < n; ++i)
        scale = std::max({scale, std::fabs(x[i] + 1.0 - crpix[0]), std::fabs(y[i] + 1.0 - crpix[1])});
    f.scale = scale;
    // Every sum over the stars is taken over fixed blocks of kFitBlock rows (partial sums per block, in row
    // order within it), and the block sums are added in block order: the result is the same for any thread
    // count (threads only decide who computes which block).
    f.nBlocks = (n + kFitBlock - 1) / kFitBlock;
    // Parallel only for large sets: a fit runs up to 9 parallel regions, and on a busy machine every one
    // of them can wait a time slice for a descheduled thread (the intermediate rounds' 4000-star fits
    // were 4x slower on 2 threads than on 1 under load).
    f.threads = n > 8 * kFitBlock ? std::max(1, threads) : 1;
    f.kk = static_cast<std::size_t>(k);
    f.sinDec.resize(n);
    f.cosDec.resize(n);
#pragma omp parallel for schedule(static) num_threads(f.threads)
    for (long long i = 0; i < static_cast<long long>(n); ++i)
        sinCosDeg(dec[i], f.sinDec[i], f.cosDec[i]);
    Eigen::LDLT<Eigen::MatrixXd> ldlt(normalMatrix(f, x, y, w, crpix));
    if (ldlt.info() != Eigen::Success) return false;
    double crval[2] = {crval0[0], crval0[1]};
    Eigen::VectorXd cx, cy;
    std::vector<double> xi(n), eta(n);
    if (!solveMovingTangentPoint(f, ldlt, ra, w, crval, cx, cy, xi, eta)) return false;
    TanSip s;
    double det = 0.0;
    if (!tanSipOfCoefficients(f, crpix, crval, cx, cy, s, det)) return false;
    if (chi2) *chi2 = weightedChi2(f, w, xi, eta, cx, cy, det);
    out = std::move(s);
    return true;
}

} // namespace gpuphot::astrom

namespace gpuphot {

TanSip tanSipFromWcs(const Wcs& wcs, int width, int height, int maxSipOrder) {
    const int g = 21;
    std::vector<double> px, py;
    for (int j = 0; j < g; ++j)
        for (int i = 0; i < g; ++i) {
            px.push_back((width - 1) * i / double(g - 1));
            py.push_back((height - 1) * j / double(g - 1));
        }
    std::vector<double> ra(px.size()), dec(px.size());
    wcs.pixelToWorld(px, py, ra, dec);
    std::vector<double> x, y, r, d;
    for (std::size_t i = 0; i < px.size(); ++i)
        if (std::isfinite(ra[i]) && std::isfinite(dec[i])) {
            x.push_back(px[i]);
            y.push_back(py[i]);
            r.push_back(ra[i]);
            d.push_back(dec[i]);
        }
    const double crpix[2] = {0.5 * (width + 1), 0.5 * (height + 1)};
    const auto centre = wcs.pixelToWorld(crpix[0] - 1.0, crpix[1] - 1.0);
    const double crval[2] = {centre.first, centre.second};
    std::vector<double> w(x.size(), 1.0);
    TanSip best;
    bool have = false;
    for (int order = 1; order <= std::max(1, maxSipOrder); ++order) {
        TanSip s;
        if (!astrom::fitTanSip(x, y, r, d, w, crpix, crval, order, s)) continue;
        best = s;
        have = true;
        double worst = 0.0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            double fx = 0, fy = 0;
            if (!s.worldToPixel(r[i], d[i], fx, fy)) continue;
            worst = std::max(worst, std::hypot(fx - x[i], fy - y[i]));
        }
        if (worst < 1e-4) break;
    }
    if (!have)
        throw InvalidInput("astrometry: the header WCS cannot be approximated by TAN+SIP over the frame");
    return best;
}

double wcsDifferencePx(const TanSip& a, const TanSip& b, int width, int height, int grid) {
    double sum = 0.0;
    int n = 0;
    for (int j = 0; j < grid; ++j)
        for (int i = 0; i < grid; ++i) {
            const double x = (width - 1) * i / double(grid - 1), y = (height - 1) * j / double(grid - 1);
            double ra = 0, dec = 0, bx = 0, by = 0;
            a.pixelToWorld(x, y, ra, dec);
            if (!b.worldToPixel(ra, dec, bx, by)) return INFINITY;
            sum += (bx - x) * (bx - x) + (by - y) * (by - y);
            ++n;
        }
    return std::sqrt(sum / n);
}

} // namespace gpuphot
