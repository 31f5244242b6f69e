#include "core/stages/crossmatch/crossmatch.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>

#include <nanoflann.hpp>
#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/header.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"
#include "core/wcs/wcs_chunked.hpp"

namespace gpuphot {

namespace {

constexpr double kDeg = 3.14159265358979323846 / 180.0;

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

} // namespace

CrossmatchIndex resolveCrossmatchIndex(const std::string& index) {
    if (index == "grid" || index == "auto") return CrossmatchIndex::Grid;
    if (index == "kdtree") return CrossmatchIndex::KdTree;
    throw InvalidInput("crossmatch: index must be \"grid\", \"kdtree\" or \"auto\" (got \"" + index + "\")");
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
    ReferenceCatalog out;
    out.skippedNonFinite = ref.skippedNonFinite;
    out.rowsRead = ref.rowsRead;
    out.epoch = ref.epoch;
    out.path = ref.path;
    out.columns = ref.columns;
    // The kept rows in catalog order, chunks copied in parallel (columns absent from `ref` stay empty).
    auto inCone = [&](std::size_t i) {
        const Vec3 u = unitVector(ref.ra[i], ref.dec[i]);
        return (u[0] * centre[0] + u[1] * centre[1] + u[2] * centre[2]) >= cosCone;
    };
    auto resize = [&](std::size_t m) {
        auto size = [&](const auto& from, auto& to) { to.resize(from.size() == n ? m : 0); };
        size(ref.ra, out.ra);
        size(ref.dec, out.dec);
        size(ref.mag, out.mag);
        size(ref.magErr, out.magErr);
        size(ref.color, out.color);
        size(ref.pmRa, out.pmRa);
        size(ref.pmDec, out.pmDec);
        size(ref.id, out.id);
        if (rows) rows->resize(m);
    };
    auto fill = [&](std::size_t k, std::size_t i) {
        auto put = [&](const auto& from, auto& to) {
            if (!to.empty()) to[k] = from[i];
        };
        put(ref.ra, out.ra);
        put(ref.dec, out.dec);
        put(ref.mag, out.mag);
        put(ref.magErr, out.magErr);
        put(ref.color, out.color);
        put(ref.pmRa, out.pmRa);
        put(ref.pmDec, out.pmDec);
        put(ref.id, out.id);
        if (rows) (*rows)[k] = static_cast<std::int32_t>(i);
    };
    compactInOrder(n, 0, inCone, resize, fill);
    return out;
}

namespace detail {

double separationArcsec(const UnitVector& a, const UnitVector& b) {
    return gpuphot::separationArcsec(a, b);
}

void sortCandidates(MatchCandidate* begin, MatchCandidate* end) {
    std::sort(begin, end, [](const MatchCandidate& a, const MatchCandidate& b) {
        return std::tie(a.sep, a.ref) < std::tie(b.sep, b.ref);
    });
}

// Matches expected by chance (CrossmatchResult::chanceMatches).
static double chanceMatchCount(const std::vector<std::uint8_t>& valid, std::size_t nRef, double radiusArcsec,
                               const Wcs& wcs, int width, int height) {
    const double scale = wcs.pixelScaleArcsec(0.5 * (width - 1), 0.5 * (height - 1));
    if (!(scale > 0.0) || !std::isfinite(scale)) return 0.0;
    std::size_t nSrc = 0;
    for (const std::uint8_t v : valid)
        nSrc += v;
    const double r = radiusArcsec / scale;
    return static_cast<double>(nSrc) * static_cast<double>(nRef) * std::numbers::pi * r * r /
           (static_cast<double>(width) * height);
}

namespace {

// The inputs as crossmatch documents them: throws InvalidInput otherwise.
void checkCrossmatchInputs(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                           const ReferenceCatalog& ref, const CrossmatchParams& params) {
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
    if (x.size() > static_cast<std::size_t>(INT32_MAX)) throw InvalidInput("crossmatch: too many sources");
    resolveCrossmatchIndex(params.index);
}

// The cone around the frame centre that holds the frame + margin (sampled on a 5 x 5 grid, with room for
// the distortion between the samples), and the smallest pixel scale found on the frame.
struct FrameCone {
    Vec3 centre;
    double minScale;     // arcsec/px
    double cosCone;      // cos of the cone's radius
    double decLo, decHi; // deg: stars outside this declination range are outside the cone
};

// Also sets setup.lo/hiX/hiY (the frame + margin). Throws InvalidInput when the frame centre does not
// transform or the WCS gives no finite pixel scale.
FrameCone frameCone(const Wcs& wcs, int width, int height, const CrossmatchParams& params,
                    CrossmatchSetup& setup) {
    const double cx = 0.5 * (width - 1), cy = 0.5 * (height - 1);
    const auto [ra0, dec0] = wcs.pixelToWorld(cx, cy);
    if (!std::isfinite(ra0) || !std::isfinite(dec0))
        throw InvalidInput("crossmatch: the frame centre does not transform with the WCS");
    FrameCone cone;
    const Vec3 centre = unitVector(ra0, dec0);
    cone.centre = centre;
    const double lo = -0.5 - params.marginPx;
    const double hiX = width - 0.5 + params.marginPx, hiY = height - 0.5 + params.marginPx;
    setup.lo = lo;
    setup.hiX = hiX;
    setup.hiY = hiY;
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
    cone.minScale = minScale;
    coneArcsec = coneArcsec * 1.01 + 10.0 * minScale; // distortion between the sampled points, rounding
    cone.cosCone = std::cos(std::min(coneArcsec / 3600.0, 180.0) * kDeg);
    const double coneDeg = std::min(coneArcsec / 3600.0, 180.0) * (1.0 + 1e-9) + 1e-9;
    cone.decLo = dec0 - coneDeg;
    cone.decHi = dec0 + coneDeg;
    return cone;
}

// Per fixed chunk of rows (in parallel): the rows inside the cone (after the magnitude cut) and their unit
// vectors, concatenated in chunk order (ascending rows, whatever the thread count).
void selectConeRows(const ReferenceCatalog& ref, const CrossmatchParams& params, const FrameCone& cone,
                    int nt, std::vector<std::int32_t>& coneRows, std::vector<Vec3>& coneUnit) {
    const bool cutBright = std::isfinite(params.refMagBright), cutFaint = std::isfinite(params.refMagFaint);
    const Vec3& centre = cone.centre;
    const double cosCone = cone.cosCone, decLo = cone.decLo, decHi = cone.decHi;
    const std::size_t nRef = ref.size();
    constexpr std::size_t kConeChunk = 65536;
    const std::size_t nChunks = (nRef + kConeChunk - 1) / kConeChunk;
    std::vector<std::vector<std::int32_t>> chunkRows(nChunks);
    std::vector<std::vector<Vec3>> chunkUnit(nChunks);
    ParallelErrors errors;
#pragma omp parallel for schedule(static) num_threads(nt) if (nChunks > 1)
    for (long long c = 0; c < static_cast<long long>(nChunks); ++c)
        errors.run([&] {
            const std::size_t b = static_cast<std::size_t>(c) * kConeChunk,
                              e = std::min(nRef, b + kConeChunk);
            auto& rows = chunkRows[c];
            auto& units = chunkUnit[c];
            for (std::size_t i = b; i < e; ++i) {
                const double m = ref.mag[i];
                if (cutBright && !(m >= params.refMagBright)) continue;
                if (cutFaint && !(m <= params.refMagFaint)) continue;
                if (ref.dec[i] < decLo || ref.dec[i] > decHi) continue; // outside by declination alone
                const Vec3 u = unitVector(ref.ra[i], ref.dec[i]);
                if ((u[0] * centre[0] + u[1] * centre[1] + u[2] * centre[2]) >= cosCone) {
                    rows.push_back(static_cast<std::int32_t>(i));
                    units.push_back(u);
                }
            }
        });
    errors.rethrow();
    concatChunks(chunkRows, coneRows, nt);
    concatChunks(chunkUnit, coneUnit, nt);
}

// The WCS as a TanSip when it is exactly one (closed-form projections); nullopt otherwise, also when its
// header cannot be written or read.
std::optional<TanSip> exactTanSip(const Wcs& wcs) {
    std::optional<TanSip> tan;
    try {
        tan = tanSipFromHeaderExact(wcs.toHeader());
    } catch (const std::exception&) {
        tan.reset();
    }
    return tan;
}

// Tangent-plane basis at the tangent point: xi = (p.e) / (p.c), eta = (p.n) / (p.c) (radians); zeros
// without a TanSip.
struct TangentBasis {
    Vec3 ec{}, ee{}, en{};
};

TangentBasis tangentBasisOf(const std::optional<TanSip>& tan) {
    TangentBasis tb;
    if (tan) {
        const double a0 = tan->crval[0] * kDeg, d0 = tan->crval[1] * kDeg;
        tb.ec = {std::cos(d0) * std::cos(a0), std::cos(d0) * std::sin(a0), std::sin(d0)};
        tb.ee = {-std::sin(a0), std::cos(a0), 0.0};
        tb.en = {-std::sin(d0) * std::cos(a0), -std::sin(d0) * std::sin(a0), std::cos(d0)};
    }
    return tb;
}

// The cone's stars' pixel positions: in closed form through the TanSip when there is one (in parallel;
// NaN behind the tangent plane), else through the WCS in fixed chunks.
void projectCone(const std::vector<std::int32_t>& coneRows, const std::vector<Vec3>& coneUnit,
                 const ReferenceCatalog& ref, const Wcs& wcs, const std::optional<TanSip>& tan,
                 const TangentBasis& tb, int nt, std::vector<double>& cX, std::vector<double>& cY) {
    const std::size_t nCone = coneRows.size();
    cX.resize(nCone);
    cY.resize(nCone);
    if (tan) {
        const Vec3 &ec = tb.ec, &ee = tb.ee, &en = tb.en;
#pragma omp parallel for schedule(static) num_threads(nt) if (nCone > 16384)
        for (long long k = 0; k < static_cast<long long>(nCone); ++k) {
            const Vec3& p = coneUnit[k];
            const double pc = p[0] * ec[0] + p[1] * ec[1] + p[2] * ec[2];
            if (!(pc > 0.0)) {
                cX[k] = cY[k] = std::numeric_limits<double>::quiet_NaN();
                continue;
            }
            const double xi = (p[0] * ee[0] + p[1] * ee[1] + p[2] * ee[2]) / pc / kDeg;
            const double eta = (p[0] * en[0] + p[1] * en[1] + p[2] * en[2]) / pc / kDeg;
            tan->standardToPixel(xi, eta, cX[k], cY[k]);
        }
    } else {
        std::vector<double> cRa(nCone), cDec(nCone);
        for (std::size_t k = 0; k < nCone; ++k) {
            cRa[k] = ref.ra[coneRows[k]];
            cDec[k] = ref.dec[coneRows[k]];
        }
        transformChunked(wcs, nCone, nt, [&](const Wcs& w, std::size_t b, std::size_t n) {
            w.worldToPixel(std::span<const double>(cRa).subspan(b, n),
                           std::span<const double>(cDec).subspan(b, n), std::span<double>(cX).subspan(b, n),
                           std::span<double>(cY).subspan(b, n));
        });
    }
}

// Selects the projected stars within the frame + margin (in cone order) into res.refSelected/refX/refY and
// setup.refUnit, counting those on the frame proper in res.nRefInFrame.
void selectOnFrame(const std::vector<std::int32_t>& coneRows, const std::vector<Vec3>& coneUnit,
                   const std::vector<double>& cX, const std::vector<double>& cY, int width, int height,
                   int nt, CrossmatchSetup& setup, CrossmatchResult& res) {
    const double lo = setup.lo, hiX = setup.hiX, hiY = setup.hiY;
    auto keep = [&](std::size_t k) { return cX[k] >= lo && cX[k] <= hiX && cY[k] >= lo && cY[k] <= hiY; };
    auto resize = [&](std::size_t m) {
        res.refSelected.resize(m);
        res.refX.resize(m);
        res.refY.resize(m);
        setup.refUnit.resize(m);
    };
    auto fill = [&](std::size_t j, std::size_t k) {
        res.refSelected[j] = coneRows[k];
        res.refX[j] = cX[k];
        res.refY[j] = cY[k];
        setup.refUnit[j] = coneUnit[k];
    };
    compactInOrder(coneRows.size(), nt, keep, resize, fill);
    std::size_t inFrame = 0;
    const std::size_t m = res.refX.size();
#pragma omp parallel for schedule(static) num_threads(nt) reduction(+ : inFrame) if (m > 16384)
    for (long long j = 0; j < static_cast<long long>(m); ++j) {
        const double px = res.refX[j], py = res.refY[j];
        inFrame += px >= -0.5 && px <= width - 0.5 && py >= -0.5 && py <= height - 0.5;
    }
    res.nRefInFrame = inFrame;
}

// The sources' unit vectors through the TanSip (in parallel): p = (c + xi e + eta n) / |...|, the gnomonic
// deprojection without trigonometry; sources with a non-finite position stay invalid.
void sourceUnitsTan(const std::vector<double>& x, const std::vector<double>& y, const TanSip& w,
                    const TangentBasis& tb, int nt, CrossmatchSetup& setup) {
    const std::size_t nSrc = x.size();
    const Vec3 &ec = tb.ec, &ee = tb.ee, &en = tb.en;
#pragma omp parallel for schedule(static) num_threads(nt) if (nSrc > 16384)
    for (long long i = 0; i < static_cast<long long>(nSrc); ++i) {
        if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
        const double u = x[i] + 1.0 - w.crpix[0], v = y[i] + 1.0 - w.crpix[1];
        double du = 0, dv = 0;
        if (w.sipOrder > 0) w.distort(u, v, du, dv);
        const double uu = u + du, vv = v + dv;
        const double xi = (w.cd[0][0] * uu + w.cd[0][1] * vv) * kDeg;
        const double eta = (w.cd[1][0] * uu + w.cd[1][1] * vv) * kDeg;
        Vec3 p;
        for (int k = 0; k < 3; ++k)
            p[k] = ec[k] + xi * ee[k] + eta * en[k];
        const double norm = std::sqrt(p[0] * p[0] + p[1] * p[1] + p[2] * p[2]);
        for (int k = 0; k < 3; ++k)
            p[k] /= norm;
        if (!std::isfinite(p[0]) || !std::isfinite(p[1]) || !std::isfinite(p[2])) continue;
        setup.srcUnit[i] = p;
        setup.srcValid[i] = 1;
    }
}

// The sources' unit vectors through the WCS (in fixed chunks), then from (ra, dec) in parallel; sources
// with a non-finite pixel or world position stay invalid.
void sourceUnitsWcs(const std::vector<double>& x, const std::vector<double>& y, const Wcs& wcs, int nt,
                    CrossmatchSetup& setup) {
    const std::size_t nSrc = x.size();
    std::vector<double> srcRa(nSrc), srcDec(nSrc);
    transformChunked(wcs, nSrc, nt, [&](const Wcs& w, std::size_t b, std::size_t n) {
        w.pixelToWorld(std::span<const double>(x).subspan(b, n), std::span<const double>(y).subspan(b, n),
                       std::span<double>(srcRa).subspan(b, n), std::span<double>(srcDec).subspan(b, n));
    });
#pragma omp parallel for schedule(static) num_threads(nt) if (nSrc > 16384)
    for (long long i = 0; i < static_cast<long long>(nSrc); ++i) {
        if (!std::isfinite(x[i]) || !std::isfinite(y[i]) || !std::isfinite(srcRa[i]) ||
            !std::isfinite(srcDec[i]))
            continue;
        setup.srcUnit[i] = unitVector(srcRa[i], srcDec[i]);
        setup.srcValid[i] = 1;
    }
}

} // namespace

CrossmatchSetup prepareCrossmatch(const std::vector<double>& x, const std::vector<double>& y, int width,
                                  int height, const ReferenceCatalog& ref, const Wcs& wcs,
                                  const CrossmatchParams& params, int threads, CrossmatchResult& res) {
    checkCrossmatchInputs(x, y, width, height, ref, params);

    const int nt = std::max(1, threads);
    const std::size_t nSrc = x.size();
    CrossmatchSetup setup;
    res.refIndex.assign(nSrc, -1);
    res.separationArcsec.assign(nSrc, std::numeric_limits<double>::quiet_NaN());

    // --- 1. cone around the frame centre ------------------------------------------------------------
    const FrameCone cone = frameCone(wcs, width, height, params, setup);
    std::vector<std::int32_t> coneRows;
    std::vector<Vec3> coneUnit;
    selectConeRows(ref, params, cone, nt, coneRows, coneUnit);

    // --- 2. projection --------------------------------------------------------------------------------
    const std::optional<TanSip> tan = exactTanSip(wcs);
    const TangentBasis tb = tangentBasisOf(tan);
    std::vector<double> cX, cY;
    projectCone(coneRows, coneUnit, ref, wcs, tan, tb, nt, cX, cY);
    selectOnFrame(coneRows, coneUnit, cX, cY, width, height, nt, setup, res);

    // --- the sources' world positions, as unit vectors ------------------------------------------------
    // The local scale can shrink between the sampled points; 5% (plus half a pixel) covers it.
    res.radiusPx = params.radiusArcsec / cone.minScale * 1.05 + 0.5;
    setup.srcUnit.assign(nSrc, Vec3{0.0, 0.0, 0.0});
    setup.srcValid.assign(nSrc, 0);
    if (tan)
        sourceUnitsTan(x, y, *tan, tb, nt, setup);
    else
        sourceUnitsWcs(x, y, wcs, nt, setup);
    res.chanceMatches =
        chanceMatchCount(setup.srcValid, res.nRefInFrame, params.radiusArcsec, wcs, width, height);
    return setup;
}

void assignMatches(const std::vector<MatchCandidate>& cands, const std::vector<std::uint32_t>& offsets,
                   std::size_t nRef, bool oneToOne, CrossmatchResult& res) {
    const std::size_t nSrc = res.refIndex.size();
    if (!oneToOne) {
        for (std::size_t i = 0; i < nSrc; ++i)
            if (offsets[i] < offsets[i + 1]) {
                res.refIndex[i] = cands[offsets[i]].ref;
                res.separationArcsec[i] = cands[offsets[i]].sep;
            }
    } else {
        // Greedy over all pairs by (separation, source, reference). A source whose best candidate no other
        // source claims takes it at once: it would win it in the greedy pass too (nobody else competes).
        std::vector<std::uint8_t> claims(nRef, 0); // 0, 1, 2 = more than one
        for (const MatchCandidate& c : cands)
            if (claims[c.ref] < 2) ++claims[c.ref];
        std::vector<MatchCandidate> all;
        std::vector<std::uint8_t> refTaken(nRef, 0);
        for (std::size_t i = 0; i < nSrc; ++i) {
            const std::uint32_t b = offsets[i], e = offsets[i + 1];
            if (b == e) continue;
            if (claims[cands[b].ref] == 1) {
                res.refIndex[i] = cands[b].ref;
                res.separationArcsec[i] = cands[b].sep;
                refTaken[cands[b].ref] = 1;
            } else {
                all.insert(all.end(), cands.begin() + b, cands.begin() + e);
            }
        }
        std::sort(all.begin(), all.end(), [](const MatchCandidate& a, const MatchCandidate& b) {
            return std::tie(a.sep, a.src, a.ref) < std::tie(b.sep, b.src, b.ref);
        });
        for (const MatchCandidate& c : all) {
            if (res.refIndex[c.src] >= 0 || refTaken[c.ref]) continue;
            res.refIndex[c.src] = c.ref;
            res.separationArcsec[c.src] = c.sep;
            refTaken[c.ref] = 1;
        }
    }
    res.nMatched = 0;
    for (std::size_t i = 0; i < nSrc; ++i)
        res.nMatched += res.refIndex[i] >= 0;
}

PointGrid::PointGrid(const std::vector<double>& x, const std::vector<double>& y, std::size_t n, double x0,
                     double y0, double spanX, double spanY, double minCell, double perCell)
    : m_x0(x0), m_y0(y0) {
    spanX = std::max(spanX, 0.0);
    spanY = std::max(spanY, 0.0);
    m_cell = std::max(minCell, std::sqrt(spanX * spanY / std::max(1.0, static_cast<double>(n) / perCell)));
    if (!(m_cell > 0.0) || !std::isfinite(m_cell)) m_cell = 1.0;
    auto cellsOf = [&] {
        m_nx = static_cast<long long>(std::min(spanX / m_cell, 1e9)) + 1;
        m_ny = static_cast<long long>(std::min(spanY / m_cell, 1e9)) + 1;
    };
    cellsOf();
    while (static_cast<double>(m_nx) * static_cast<double>(m_ny) > 4.0e6) {
        m_cell *= 2.0;
        cellsOf();
    }
    const std::size_t nCells = static_cast<std::size_t>(m_nx * m_ny);
    m_start.assign(nCells + 1, 0);
    std::vector<std::uint32_t> cellOfPoint(n);
    for (std::size_t k = 0; k < n; ++k) {
        cellOfPoint[k] = static_cast<std::uint32_t>(cellOf(x[k], y[k]));
        ++m_start[cellOfPoint[k] + 1];
    }
    for (std::size_t c = 0; c < nCells; ++c)
        m_start[c + 1] += m_start[c];
    sx.resize(n);
    sy.resize(n);
    index.resize(n);
    std::vector<std::uint32_t> fill(m_start.begin(), m_start.end() - 1);
    for (std::size_t k = 0; k < n; ++k) {
        const std::uint32_t at = fill[cellOfPoint[k]]++;
        sx[at] = x[k];
        sy[at] = y[k];
        index[at] = static_cast<std::uint32_t>(k);
    }
}

std::vector<std::uint32_t> PointGrid::cellOrder(const std::vector<double>& qx, const std::vector<double>& qy,
                                                std::size_t n, const std::vector<std::uint8_t>* valid) const {
    const std::size_t nCells = m_start.size() - 1;
    std::vector<std::uint32_t> start(nCells + 1, 0), cell(n, 0);
    auto usable = [&](std::size_t i) {
        return (!valid || (*valid)[i]) && std::isfinite(qx[i]) && std::isfinite(qy[i]);
    };
    for (std::size_t i = 0; i < n; ++i)
        if (usable(i)) {
            cell[i] = static_cast<std::uint32_t>(cellOf(qx[i], qy[i]));
            ++start[cell[i] + 1];
        }
    for (std::size_t c = 0; c < nCells; ++c)
        start[c + 1] += start[c];
    std::vector<std::uint32_t> order(start[nCells]);
    for (std::size_t i = 0; i < n; ++i)
        if (usable(i)) order[start[cell[i]]++] = static_cast<std::uint32_t>(i);
    return order;
}

} // namespace detail

namespace {

// nanoflann's leaf size for the "kdtree" index (its default 10; 32 builds and searches ~10% faster at 130k
// sources x 1e6 stars, docs/BENCHMARKS.md "Crossmatch index: grid vs k-d tree").
constexpr std::size_t kKdTreeLeafSize = 32;

// The selected stars as step 3 reads them, in the order an index numbers them.
struct StarArrays {
    const double* x;
    const double* y;
    const detail::UnitVector* unit;
    const std::int32_t* row; // row in the ReferenceCatalog
};

// Step 3 for the sources in `order`: search(xs, ys, reach, emit) calls emit(j) for every star j within
// `reach` of the source (a superset is fine); the k-d tree's test (squared pixel distance < radiusPx^2,
// summed from 0) and the arcsec cut then keep the candidates, whatever index proposed them, and each
// source's candidates are sorted by (sep, ref). Fills cands/offsets as assignMatches expects. Fixed chunks
// of `order`, concatenated by source: the result does not depend on the thread count.
template <class Search>
void findCandidates(const std::vector<std::uint32_t>& order, const std::vector<double>& x,
                    const std::vector<double>& y, const detail::CrossmatchSetup& setup, double radiusPx,
                    double radiusArcsec, int threads, const StarArrays& stars, const Search& search,
                    std::vector<detail::MatchCandidate>& cands, std::vector<std::uint32_t>& offsets) {
    const std::size_t nSrc = x.size();
    const double r2 = radiusPx * radiusPx;
    const double reach = radiusPx * (1.0 + 1e-6) + 1e-6;
    constexpr std::size_t kChunk = 4096;
    const std::size_t nChunks = (order.size() + kChunk - 1) / kChunk;
    std::vector<std::vector<detail::MatchCandidate>> found(nChunks);
    std::vector<std::uint32_t> count(nSrc, 0);
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (nChunks > 1)
    for (long long ch = 0; ch < static_cast<long long>(nChunks); ++ch)
        errors.run([&] {
            auto& out = found[ch];
            const std::size_t b = static_cast<std::size_t>(ch) * kChunk,
                              e = std::min(order.size(), b + kChunk);
            for (std::size_t o = b; o < e; ++o) {
                const std::uint32_t i = order[o];
                const double xs = x[i], ys = y[i];
                const detail::UnitVector& su = setup.srcUnit[i];
                const std::size_t first = out.size();
                search(xs, ys, reach, [&](std::uint32_t j) {
                    // the k-d tree's test: (q - p)^2 summed from 0, < radius^2
                    const double dx = xs - stars.x[j], dy = ys - stars.y[j];
                    double d2 = 0.0;
                    d2 += dx * dx;
                    d2 += dy * dy;
                    if (!(d2 < r2)) return;
                    const double sep = detail::separationArcsec(su, stars.unit[j]);
                    if (sep <= radiusArcsec) out.push_back({sep, static_cast<std::int32_t>(i), stars.row[j]});
                });
                detail::sortCandidates(out.data() + first, out.data() + out.size());
                count[i] = static_cast<std::uint32_t>(out.size() - first);
            }
        });
    errors.rethrow();
    for (std::size_t i = 0; i < nSrc; ++i)
        offsets[i + 1] = offsets[i] + count[i];
    cands.resize(offsets[nSrc]);
    for (const auto& out : found)
        for (std::size_t k = 0; k < out.size();) {
            const std::int32_t src = out[k].src;
            std::copy(out.begin() + k, out.begin() + k + count[src], cands.begin() + offsets[src]);
            k += count[src];
        }
}

// The selected stars' pixel positions as a nanoflann point cloud.
struct StarCloud {
    const std::vector<double>& x;
    const std::vector<double>& y;
    std::size_t kdtree_get_point_count() const { return x.size(); }
    double kdtree_get_pt(std::size_t i, std::size_t d) const { return d == 0 ? x[i] : y[i]; }
    template <class Box> bool kdtree_get_bbox(Box&) const { return false; }
};
using StarTree = nanoflann::KDTreeSingleIndexAdaptor<nanoflann::L2_Simple_Adaptor<double, StarCloud>,
                                                     StarCloud, 2, std::uint32_t>;

// A nanoflann result set that hands every point within the radius to `emit` (no list, no sort).
template <class Emit> struct EmitResultSet {
    double radius2;
    Emit& emit;
    std::size_t n = 0;
    void init() {}
    std::size_t size() const { return n; }
    bool full() const { return true; }
    bool addPoint(double d2, std::uint32_t j) {
        if (d2 < radius2) {
            emit(j);
            ++n;
        }
        return true;
    }
    double worstDist() const { return radius2; }
};

} // namespace

CrossmatchResult cpu::crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width,
                                 int height, const ReferenceCatalog& ref, const Wcs& wcs,
                                 const CrossmatchParams& params, RunContext& ctx) {
    const int threads = std::max(1, ctx.threadCount());
    CrossmatchResult res;
    const detail::CrossmatchSetup setup =
        detail::prepareCrossmatch(x, y, width, height, ref, wcs, params, threads, res);
    const std::size_t nSrc = x.size();
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.5);

    // --- 3. candidates per source, through the chosen index over the selected stars (frame + margin) ---
    const std::size_t nSel = res.refSelected.size();
    std::vector<detail::MatchCandidate> cands;
    std::vector<std::uint32_t> offsets(nSrc + 1, 0);
    if (nSel > 0 && nSrc > 0 && resolveCrossmatchIndex(params.index) == CrossmatchIndex::Grid) {
        const double lo = setup.lo;
        const detail::PointGrid grid(res.refX, res.refY, nSel, lo, lo, setup.hiX - lo, setup.hiY - lo,
                                     res.radiusPx * (1.0 + 1e-9));
        std::vector<detail::UnitVector> gu(nSel);
        std::vector<std::int32_t> grow(nSel);
        for (std::size_t j = 0; j < nSel; ++j) {
            gu[j] = setup.refUnit[grid.index[j]];
            grow[j] = res.refSelected[grid.index[j]];
        }
        const StarArrays stars{grid.sx.data(), grid.sy.data(), gu.data(), grow.data()};
        findCandidates(
            grid.cellOrder(x, y, nSrc, &setup.srcValid), x, y, setup, res.radiusPx, params.radiusArcsec,
            threads, stars,
            [&](double xs, double ys, double reach, const auto& emit) { grid.visit(xs, ys, reach, emit); },
            cands, offsets);
    } else if (nSel > 0 && nSrc > 0) {
        const StarCloud cloud{res.refX, res.refY};
        const StarTree tree(2, cloud, nanoflann::KDTreeSingleIndexAdaptorParams(kKdTreeLeafSize));
        std::vector<std::uint32_t> order;
        for (std::size_t i = 0; i < nSrc; ++i)
            if (setup.srcValid[i]) order.push_back(static_cast<std::uint32_t>(i));
        // Queries in bands of 32 pixel rows, by x within a band: consecutive searches walk neighbouring
        // leaves (a third faster than source order at 130k x 1e6). The order does not change the result.
        std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
            const double ba = std::floor(y[a] / 32.0), bb = std::floor(y[b] / 32.0);
            return std::tie(ba, x[a], a) < std::tie(bb, x[b], b);
        });
        const StarArrays stars{res.refX.data(), res.refY.data(), setup.refUnit.data(),
                               res.refSelected.data()};
        findCandidates(
            order, x, y, setup, res.radiusPx, params.radiusArcsec, threads, stars,
            [&](double xs, double ys, double reach, const auto& emit) {
                const double q[2] = {xs, ys};
                EmitResultSet<std::remove_reference_t<decltype(emit)>> rs{reach * reach, emit};
                tree.radiusSearchCustomCallback(q, rs, nanoflann::SearchParams(32, 0.0f, false));
            },
            cands, offsets);
    }
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.8);

    // --- 4. assignment --------------------------------------------------------------------------------
    detail::assignMatches(cands, offsets, ref.size(), params.oneToOne, res);
    ctx.report("crossmatch", 1.0);
    return res;
}

// The stage's public entry point: the CUDA engine when the backend is CUDA and the kernels are linked
// (core/pipeline/cuda_stages.hpp), else the CPU engine.
CrossmatchResult crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                            const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                            RunContext& ctx) {
    if (ctx.backend == Backend::Cuda && cudaStages().crossmatch)
        return cudaStages().crossmatch(x, y, width, height, ref, wcs, params, ctx);
    return cpu::crossmatch(x, y, width, height, ref, wcs, params, ctx);
}

} // namespace gpuphot
