#include "core/stages/crossmatch.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <string>
#include <tuple>

#include <nanoflann.hpp>
#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

namespace {

constexpr double kDeg = 3.14159265358979323846 / 180.0;

double nanOr(const nlohmann::json& j, const char* key, double fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    return j.at(key).get<double>();
}

using Vec3 = std::array<double, 3>;

Vec3 unitVector(double raDeg, double decDeg) {
    const double ra = raDeg * kDeg, dec = decDeg * kDeg;
    return {std::cos(dec) * std::cos(ra), std::cos(dec) * std::sin(ra), std::sin(dec)};
}

// Great-circle separation (arcsec) from unit vectors: atan2(|a x b|, a.b), accurate at tiny angles.
double separationArcsec(const Vec3& a, const Vec3& b) {
    const double cx = a[1] * b[2] - a[2] * b[1];
    const double cy = a[2] * b[0] - a[0] * b[2];
    const double cz = a[0] * b[1] - a[1] * b[0];
    const double dot = a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    return std::atan2(std::sqrt(cx * cx + cy * cy + cz * cz), dot) / kDeg * 3600.0;
}

// Struct-of-arrays point cloud for nanoflann.
struct PointCloud2D {
    const std::vector<double>& x;
    const std::vector<double>& y;
    std::size_t kdtree_get_point_count() const { return x.size(); }
    double kdtree_get_pt(std::size_t i, std::size_t dim) const { return dim == 0 ? x[i] : y[i]; }
    template <class Bbox> bool kdtree_get_bbox(Bbox&) const { return false; }
};

using KdTree = nanoflann::KDTreeSingleIndexAdaptor<nanoflann::L2_Simple_Adaptor<double, PointCloud2D>,
                                                   PointCloud2D, 2, std::uint32_t>;

// Applies a batched Wcs transform in fixed chunks, one Wcs copy per thread (the Wcs serialises calls).
template <class Fn> void transformChunked(const Wcs& wcs, std::size_t n, int threads, Fn&& fn) {
    constexpr std::size_t kChunk = 16384;
    const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
    if (chunks <= 1 || threads <= 1) {
        if (n > 0) fn(wcs, std::size_t{0}, n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const Wcs local(wcs);
#pragma omp for schedule(static)
        for (long long c = 0; c < chunks; ++c) {
            const std::size_t begin = static_cast<std::size_t>(c) * kChunk;
            fn(local, begin, std::min(n, begin + kChunk) - begin);
        }
    }
}

} // namespace

void to_json(nlohmann::json& j, const CrossmatchParams& p) {
    j = nlohmann::json{{"radiusArcsec", p.radiusArcsec}, {"oneToOne", p.oneToOne}, {"marginPx", p.marginPx}};
    // JSON has no NaN: an absent (or null) cut means none.
    if (std::isfinite(p.refMagBright)) j["refMagBright"] = p.refMagBright;
    if (std::isfinite(p.refMagFaint)) j["refMagFaint"] = p.refMagFaint;
}

void from_json(const nlohmann::json& j, CrossmatchParams& p) {
    const CrossmatchParams d;
    p.radiusArcsec = j.value("radiusArcsec", d.radiusArcsec);
    p.oneToOne = j.value("oneToOne", d.oneToOne);
    p.marginPx = j.value("marginPx", d.marginPx);
    p.refMagBright = nanOr(j, "refMagBright", d.refMagBright);
    p.refMagFaint = nanOr(j, "refMagFaint", d.refMagFaint);
}

ReferenceCatalog cutReferenceToFrame(const ReferenceCatalog& ref, const Wcs& wcs, int width, int height,
                                     double marginArcsec, std::vector<std::int32_t>* rows) {
    if (width <= 0 || height <= 0)
        throw InvalidInput("cutReferenceToFrame: frame size must be positive (got " + std::to_string(width) +
                           "x" + std::to_string(height) + ")");
    if (!(marginArcsec >= 0.0) || !std::isfinite(marginArcsec))
        throw InvalidInput("cutReferenceToFrame: marginArcsec must be >= 0 (got " +
                           std::to_string(marginArcsec) + ")");
    const auto [ra0, dec0] = wcs.pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1));
    if (!std::isfinite(ra0) || !std::isfinite(dec0))
        throw InvalidInput("cutReferenceToFrame: the frame centre does not transform with the WCS (catalog " +
                           ref.path + ")");
    const Vec3 centre = unitVector(ra0, dec0);
    double coneArcsec = 0.0;
    for (int iy = 0; iy <= 4; ++iy)
        for (int ix = 0; ix <= 4; ++ix) {
            const auto [ra, dec] = wcs.pixelToWorld(-0.5 + width * ix / 4.0, -0.5 + height * iy / 4.0);
            if (std::isfinite(ra) && std::isfinite(dec))
                coneArcsec = std::max(coneArcsec, separationArcsec(centre, unitVector(ra, dec)));
        }
    coneArcsec = coneArcsec * 1.01 + marginArcsec;
    const double cosCone = std::cos(std::min(coneArcsec / 3600.0, 180.0) * kDeg);
    const std::size_t n = ref.size();
    std::vector<std::uint8_t> in(n, 0);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < static_cast<long long>(n); ++i) {
        const Vec3 u = unitVector(ref.ra[i], ref.dec[i]);
        in[i] = (u[0] * centre[0] + u[1] * centre[1] + u[2] * centre[2]) >= cosCone;
    }
    ReferenceCatalog out;
    out.skippedNonFinite = ref.skippedNonFinite;
    out.rowsRead = ref.rowsRead;
    out.epoch = ref.epoch;
    out.path = ref.path;
    out.columns = ref.columns;
    if (rows) rows->clear();
    auto copy = [&](const auto& from, auto& to, std::size_t i) {
        if (from.size() == n) to.push_back(from[i]);
    };
    for (std::size_t i = 0; i < n; ++i) {
        if (!in[i]) continue;
        copy(ref.ra, out.ra, i);
        copy(ref.dec, out.dec, i);
        copy(ref.mag, out.mag, i);
        copy(ref.magErr, out.magErr, i);
        copy(ref.color, out.color, i);
        copy(ref.pmRa, out.pmRa, i);
        copy(ref.pmDec, out.pmDec, i);
        copy(ref.id, out.id, i);
        if (rows) rows->push_back(static_cast<std::int32_t>(i));
    }
    return out;
}

CrossmatchResult cpu::crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                            const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                            RunContext& ctx) {
    if (x.size() != y.size())
        throw InvalidInput("crossmatch: x has " + std::to_string(x.size()) + " entries, y " +
                           std::to_string(y.size()));
    if (width <= 0 || height <= 0)
        throw InvalidInput("crossmatch: frame size must be positive (got " + std::to_string(width) + "x" +
                           std::to_string(height) + ")");
    if (!(params.radiusArcsec > 0.0) || !std::isfinite(params.radiusArcsec))
        throw InvalidInput("crossmatch: radiusArcsec must be positive (got " +
                           std::to_string(params.radiusArcsec) + ")");
    if (!(params.marginPx >= 0.0) || !std::isfinite(params.marginPx))
        throw InvalidInput("crossmatch: marginPx must be >= 0 (got " + std::to_string(params.marginPx) + ")");
    if (ref.size() > static_cast<std::size_t>(INT32_MAX))
        throw InvalidInput("crossmatch: reference catalog " + ref.path + " has too many rows");
    if (ref.dec.size() != ref.size() || ref.mag.size() != ref.size())
        throw InvalidInput("crossmatch: reference catalog " + ref.path + " has columns of different lengths");

    const int threads = ctx.threadCount();
    const std::size_t nSrc = x.size();
    CrossmatchResult res;
    res.refIndex.assign(nSrc, -1);
    res.separationArcsec.assign(nSrc, std::numeric_limits<double>::quiet_NaN());

    // --- 1. cone around the frame centre ------------------------------------------------------------
    const double cx = 0.5 * (width - 1), cy = 0.5 * (height - 1);
    const auto [ra0, dec0] = wcs.pixelToWorld(cx, cy);
    if (!std::isfinite(ra0) || !std::isfinite(dec0))
        throw InvalidInput("crossmatch: the frame centre does not transform with the WCS");
    const Vec3 centre = unitVector(ra0, dec0);
    const double lo = -0.5 - params.marginPx;
    const double hiX = width - 0.5 + params.marginPx, hiY = height - 0.5 + params.marginPx;
    double coneArcsec = 0.0;
    double minScale = std::numeric_limits<double>::infinity();
    for (int iy = 0; iy <= 4; ++iy)
        for (int ix = 0; ix <= 4; ++ix) {
            const double px = lo + (hiX - lo) * ix / 4.0, py = lo + (hiY - lo) * iy / 4.0;
            const auto [ra, dec] = wcs.pixelToWorld(px, py);
            if (std::isfinite(ra) && std::isfinite(dec))
                coneArcsec = std::max(coneArcsec, separationArcsec(centre, unitVector(ra, dec)));
            const double s =
                wcs.pixelScaleArcsec(std::clamp(px, 0.0, width - 1.0), std::clamp(py, 0.0, height - 1.0));
            if (std::isfinite(s) && s > 0.0) minScale = std::min(minScale, s);
        }
    if (!std::isfinite(minScale))
        throw InvalidInput("crossmatch: the WCS gives no finite pixel scale on the frame");
    coneArcsec = coneArcsec * 1.01 + 10.0 * minScale; // distortion between the sampled points, rounding
    const double cosCone = std::cos(std::min(coneArcsec / 3600.0, 180.0) * kDeg);

    const bool cutBright = std::isfinite(params.refMagBright), cutFaint = std::isfinite(params.refMagFaint);
    const std::size_t nRef = ref.size();
    std::vector<std::uint8_t> inCone(nRef, 0);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long long i = 0; i < static_cast<long long>(nRef); ++i) {
        const double m = ref.mag[i];
        if (cutBright && !(m >= params.refMagBright)) continue;
        if (cutFaint && !(m <= params.refMagFaint)) continue;
        const Vec3 u = unitVector(ref.ra[i], ref.dec[i]);
        inCone[i] = (u[0] * centre[0] + u[1] * centre[1] + u[2] * centre[2]) >= cosCone;
    }
    std::vector<std::int32_t> coneRows;
    for (std::size_t i = 0; i < nRef; ++i)
        if (inCone[i]) coneRows.push_back(static_cast<std::int32_t>(i));
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.2);

    // --- 2. projection --------------------------------------------------------------------------------
    const std::size_t nCone = coneRows.size();
    std::vector<double> cRa(nCone), cDec(nCone), cX(nCone), cY(nCone);
    for (std::size_t k = 0; k < nCone; ++k) {
        cRa[k] = ref.ra[coneRows[k]];
        cDec[k] = ref.dec[coneRows[k]];
    }
    transformChunked(wcs, nCone, threads, [&](const Wcs& w, std::size_t b, std::size_t n) {
        w.worldToPixel(std::span<const double>(cRa).subspan(b, n),
                       std::span<const double>(cDec).subspan(b, n), std::span<double>(cX).subspan(b, n),
                       std::span<double>(cY).subspan(b, n));
    });
    std::vector<std::size_t> selectedCone; // per selected star: its row in the cone arrays
    for (std::size_t k = 0; k < nCone; ++k) {
        const double px = cX[k], py = cY[k];
        if (!(px >= lo && px <= hiX && py >= lo && py <= hiY)) continue;
        if (px >= -0.5 && px <= width - 0.5 && py >= -0.5 && py <= height - 0.5) ++res.nRefInFrame;
        res.refSelected.push_back(coneRows[k]);
        res.refX.push_back(px);
        res.refY.push_back(py);
        selectedCone.push_back(k);
    }
    const std::size_t nSel = selectedCone.size();
    std::vector<Vec3> refUnit(nSel);
#pragma omp parallel for schedule(static) num_threads(threads) if (nSel > 16384)
    for (long long k = 0; k < static_cast<long long>(nSel); ++k)
        refUnit[k] = unitVector(cRa[selectedCone[k]], cDec[selectedCone[k]]);
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.5);

    // --- 3. candidates per source -----------------------------------------------------------------------
    // The local scale can shrink between the sampled points; 5% (plus half a pixel) covers it.
    res.radiusPx = params.radiusArcsec / minScale * 1.05 + 0.5;
    std::vector<double> srcRa(nSrc), srcDec(nSrc);
    transformChunked(wcs, nSrc, threads, [&](const Wcs& w, std::size_t b, std::size_t n) {
        w.pixelToWorld(std::span<const double>(x).subspan(b, n), std::span<const double>(y).subspan(b, n),
                       std::span<double>(srcRa).subspan(b, n), std::span<double>(srcDec).subspan(b, n));
    });

    struct Candidate {
        double sep;
        std::int32_t src, ref; // ref: row in the catalog
    };
    std::vector<std::vector<Candidate>> cands(nSrc);
    // The k-d tree holds only the selected stars that can be within radiusPx of a source: with many more
    // stars than sources, a grid of cells >= radiusPx over the sources drops the others first (a star is
    // kept when one of its 3x3 cells holds a source). Radius searches return the same candidates.
    std::vector<std::uint32_t> treeRows; // tree point -> selected star
    bool allRows = true;
    if (nSel > 4 * nSrc + 4096) {
        double x0 = INFINITY, y0 = INFINITY, x1 = -INFINITY, y1 = -INFINITY;
        for (std::size_t i = 0; i < nSrc; ++i)
            if (std::isfinite(x[i]) && std::isfinite(y[i])) {
                x0 = std::min(x0, x[i]);
                x1 = std::max(x1, x[i]);
                y0 = std::min(y0, y[i]);
                y1 = std::max(y1, y[i]);
            }
        allRows = false;
        if (std::isfinite(x0) && std::isfinite(y0)) {
            double cell = res.radiusPx * (1.0 + 1e-9); // rounding allowance
            while ((x1 - x0) / cell * ((y1 - y0) / cell) > 4.0e6)
                cell *= 2.0;
            const auto nx = static_cast<long long>((x1 - x0) / cell) + 1;
            const auto ny = static_cast<long long>((y1 - y0) / cell) + 1;
            std::vector<std::uint8_t> occupied(static_cast<std::size_t>(nx * ny), 0);
            for (std::size_t i = 0; i < nSrc; ++i)
                if (std::isfinite(x[i]) && std::isfinite(y[i]))
                    occupied[static_cast<std::size_t>(static_cast<long long>((y[i] - y0) / cell) * nx +
                                                      static_cast<long long>((x[i] - x0) / cell))] = 1;
            for (std::size_t k = 0; k < nSel; ++k) {
                const double fx = std::floor((res.refX[k] - x0) / cell);
                const double fy = std::floor((res.refY[k] - y0) / cell);
                if (!(fx >= -1.0 && fy >= -1.0 && fx <= double(nx) && fy <= double(ny))) continue;
                const auto gx = static_cast<long long>(fx), gy = static_cast<long long>(fy);
                bool near = false;
                for (long long yy = std::max(0LL, gy - 1); yy <= std::min(ny - 1, gy + 1) && !near; ++yy)
                    for (long long xx = std::max(0LL, gx - 1); xx <= std::min(nx - 1, gx + 1); ++xx)
                        if (occupied[static_cast<std::size_t>(yy * nx + xx)]) {
                            near = true;
                            break;
                        }
                if (near) treeRows.push_back(static_cast<std::uint32_t>(k));
            }
        }
    }
    std::vector<double> treeX, treeY;
    if (!allRows) {
        treeX.reserve(treeRows.size());
        treeY.reserve(treeRows.size());
        for (std::uint32_t k : treeRows) {
            treeX.push_back(res.refX[k]);
            treeY.push_back(res.refY[k]);
        }
    }
    if (allRows ? !res.refSelected.empty() : !treeRows.empty()) {
        const PointCloud2D cloud{allRows ? res.refX : treeX, allRows ? res.refY : treeY};
        const KdTree tree(2, cloud, nanoflann::KDTreeSingleIndexAdaptorParams(10));
        const double r2 = res.radiusPx * res.radiusPx;
#pragma omp parallel num_threads(threads)
        {
            std::vector<std::pair<std::uint32_t, double>> found;
#pragma omp for schedule(dynamic, 256)
            for (long long i = 0; i < static_cast<long long>(nSrc); ++i) {
                if (!std::isfinite(x[i]) || !std::isfinite(y[i]) || !std::isfinite(srcRa[i]) ||
                    !std::isfinite(srcDec[i]))
                    continue;
                const double q[2] = {x[i], y[i]};
                found.clear();
                tree.radiusSearch(q, r2, found, nanoflann::SearchParams(32, 0.0f, false));
                const Vec3 s = unitVector(srcRa[i], srcDec[i]);
                auto& c = cands[i];
                for (const auto& [t, d2] : found) {
                    const std::size_t k = allRows ? t : treeRows[t];
                    const double sep = separationArcsec(s, refUnit[k]);
                    if (sep <= params.radiusArcsec)
                        c.push_back({sep, static_cast<std::int32_t>(i), res.refSelected[k]});
                }
                std::sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
                    return std::tie(a.sep, a.ref) < std::tie(b.sep, b.ref);
                });
            }
        }
    }
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.8);

    // --- 4. assignment --------------------------------------------------------------------------------
    if (!params.oneToOne) {
        for (std::size_t i = 0; i < nSrc; ++i)
            if (!cands[i].empty()) {
                res.refIndex[i] = cands[i].front().ref;
                res.separationArcsec[i] = cands[i].front().sep;
            }
    } else {
        std::vector<Candidate> all;
        for (const auto& c : cands)
            all.insert(all.end(), c.begin(), c.end());
        std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
            return std::tie(a.sep, a.src, a.ref) < std::tie(b.sep, b.src, b.ref);
        });
        std::vector<std::uint8_t> refTaken(nRef, 0);
        for (const Candidate& c : all) {
            if (res.refIndex[c.src] >= 0 || refTaken[c.ref]) continue;
            res.refIndex[c.src] = c.ref;
            res.separationArcsec[c.src] = c.sep;
            refTaken[c.ref] = 1;
        }
    }
    for (std::size_t i = 0; i < nSrc; ++i)
        res.nMatched += res.refIndex[i] >= 0;
    ctx.report("crossmatch", 1.0);
    return res;
}

} // namespace gpuphot
