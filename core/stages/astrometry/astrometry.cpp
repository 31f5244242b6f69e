// Stage 7 driver: refine the header WCS when it verifies, else solve blindly; report residuals.
#include "core/stages/astrometry/astrometry.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <memory>
#include <numbers>
#include <numeric>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/astrometry/astrometry_internal.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

// A cone of the sky: centre unit vector and squared chord bound.
struct RefCone {
    std::array<double, 3> centre;
    double chord2;
};

struct RefinementStars {
    const ReferenceCatalog* catalog = nullptr; // the catalog they were cut from
    RefCone cone;
    astrom::RefStars stars;
};

namespace {

astrom::Detections prepareDetections(const std::vector<double>& x, const std::vector<double>& y,
                                     const std::vector<double>& flux, int width, int height) {
    std::vector<std::int32_t> order;
    order.reserve(x.size());
    double minPositive = INFINITY;
    for (double f : flux)
        if (std::isfinite(f) && f > 0.0) minPositive = std::min(minPositive, f);
    if (!std::isfinite(minPositive)) minPositive = 1.0;
    for (std::size_t i = 0; i < x.size(); ++i)
        if (std::isfinite(x[i]) && std::isfinite(y[i])) order.push_back(static_cast<std::int32_t>(i));
    // Brightest first, ties in source order: (-flux, source) pairs sorted, a stable sort by flux.
    std::vector<std::pair<double, std::int32_t>> byFlux(order.size());
    for (std::size_t k = 0; k < order.size(); ++k) {
        const std::int32_t i = order[k];
        byFlux[k] = {-(std::isfinite(flux[i]) && flux[i] > 0.0 ? flux[i] : 0.5 * minPositive), i};
    }
    astrom::sortByKey(byFlux);
    astrom::Detections d;
    d.width = width;
    d.height = height;
    const std::size_t n = byFlux.size();
    d.x.resize(n);
    d.y.resize(n);
    d.flux.resize(n);
    d.index.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
        const std::int32_t i = byFlux[k].second;
        d.x[k] = x[i];
        d.y[k] = y[i];
        d.flux[k] = -byFlux[k].first;
        d.index[k] = i;
    }
    return d;
}

// The usable reference stars (finite position), brightest first (ties by row), with unit vectors. With a
// cone (centre unit vector, chord^2 bound), only the stars inside it: the same stars in the same relative
// order as the whole catalog's preparation, so a refinement that stays inside the cone selects the same.
astrom::RefStars prepareRefs(const ReferenceCatalog& ref, int threads,
                             const std::array<double, 3>* centre = nullptr, double chord2Max = 0.0) {
    const std::size_t nAll = ref.size();
    const int nt = std::max(1, threads);
    // Per fixed chunk of rows: the kept rows and their unit vectors (computed once, for the cone test and
    // the result), concatenated in chunk order: ascending rows whatever the thread count. A row whose
    // declination alone puts it outside the cone is dropped before any trigonometry.
    double decLo = -INFINITY, decHi = INFINITY;
    if (centre) {
        const double cDec = std::asin(std::clamp((*centre)[2], -1.0, 1.0)) * 180.0 / std::numbers::pi;
        const double radius = astrom::degFromChord(std::sqrt(chord2Max)) * (1.0 + 1e-9) + 1e-9;
        decLo = cDec - radius;
        decHi = cDec + radius;
    }
    constexpr std::size_t kChunk = 65536;
    const std::size_t nChunks = (nAll + kChunk - 1) / kChunk;
    std::vector<std::vector<std::int32_t>> chunkRows(nChunks);
    std::vector<std::vector<std::array<double, 3>>> chunkUnit(nChunks);
    ParallelErrors errors;
#pragma omp parallel for schedule(static) num_threads(nt) if (nChunks > 1)
    for (long long c = 0; c < static_cast<long long>(nChunks); ++c)
        errors.run([&] {
            const std::size_t b = static_cast<std::size_t>(c) * kChunk, e = std::min(nAll, b + kChunk);
            for (std::size_t i = b; i < e; ++i) {
                if (!std::isfinite(ref.ra[i]) || !std::isfinite(ref.dec[i])) continue;
                if (ref.dec[i] < decLo || ref.dec[i] > decHi) continue;
                const std::array<double, 3> u = astrom::unitVector(ref.ra[i], ref.dec[i]);
                if (centre) {
                    double d2 = 0.0;
                    for (int k = 0; k < 3; ++k)
                        d2 += (u[k] - (*centre)[k]) * (u[k] - (*centre)[k]);
                    if (!(d2 <= chord2Max)) continue;
                }
                chunkRows[c].push_back(static_cast<std::int32_t>(i));
                chunkUnit[c].push_back(u);
            }
        });
    errors.rethrow();
    std::vector<std::int32_t> keptRows;
    std::vector<std::array<double, 3>> keptUnit;
    concatChunks(chunkRows, keptRows, nt);
    concatChunks(chunkUnit, keptUnit, nt);
    // Kept positions by (magnitude, position): positions ascend with rows, so this is the order of a
    // stable sort of the rows by magnitude.
    std::vector<std::pair<double, std::int32_t>> order(keptRows.size());
    for (std::size_t k = 0; k < keptRows.size(); ++k) {
        const double m = ref.mag[keptRows[k]];
        order[k] = {std::isfinite(m) ? m : 99.0, static_cast<std::int32_t>(k)};
    }
    astrom::sortByKey(order);
    astrom::RefStars r;
    const std::size_t n = order.size();
    r.ra.resize(n);
    r.dec.resize(n);
    r.mag.resize(n);
    r.xyz.resize(n);
    r.index.resize(n);
#pragma omp parallel for schedule(static) num_threads(nt) if (n > 16384)
    for (long long k = 0; k < static_cast<long long>(n); ++k) {
        const std::int32_t pos = order[k].second, i = keptRows[pos];
        r.ra[k] = ref.ra[i];
        r.dec[k] = ref.dec[i];
        r.mag[k] = order[k].first;
        r.xyz[k] = keptUnit[pos];
        r.index[k] = i;
    }
    return r;
}

// Where the reference stars come from: the catalog, prepared per call (only a cone around the frame for a
// refinement, the whole of it for a blind search), or an AstrometryIndex prepared once.
class RefAccess {
public:
    // prepared (optional): the stars around the frame cut ahead (prepareRefinementStars).
    RefAccess(const ReferenceCatalog& cat, int threads, const RefinementStars* prepared)
        : m_cat(&cat), m_threads(threads), m_prepared(prepared) {}
    explicit RefAccess(const AstrometryIndex::Impl& index) : m_index(&index) {}

    // The stars a refinement starting at frame centre `c` can reach (chord^2 bound).
    const astrom::RefStars& aroundFrame(const std::array<double, 3>& c, double chord2) {
        if (m_index) return all();
        if (m_prepared && m_prepared->catalog == m_cat && m_prepared->cone.centre == c &&
            m_prepared->cone.chord2 == chord2) {
            m_cur = &m_prepared->stars;
            return m_prepared->stars;
        }
        m_own = prepareRefs(*m_cat, m_threads, &c, chord2);
        m_ownAll = false;
        m_cur = &m_own;
        return m_own;
    }
    const astrom::RefStars& all() {
        if (m_index) m_cur = &m_index->refs;
        if (!m_index && !m_ownAll) {
            m_own = prepareRefs(*m_cat, m_threads);
            m_ownAll = true;
            m_cur = &m_own;
        }
        return *m_cur;
    }
    // The sky tree over all(): the index's; without an index none (one blind search scans the stars in
    // less time than a tree over them takes to build).
    const astrom::SkyTree* tree() const { return m_index ? m_index->tree.get() : nullptr; }
    const astrom::QuadLevels* levels() const { return m_index ? m_index->levels.get() : nullptr; }
    // The stars the last outcome's indices refer to.
    const astrom::RefStars& current() const { return *m_cur; }

private:
    const ReferenceCatalog* m_cat = nullptr;
    const AstrometryIndex::Impl* m_index = nullptr;
    int m_threads = 1;
    const RefinementStars* m_prepared = nullptr;
    astrom::RefStars m_own;
    bool m_ownAll = false;
    const astrom::RefStars* m_cur = &m_own;
};

void checkInputs(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& flux,
                 int width, int height, const AstrometryParams& params) {
    if (x.size() != y.size() || x.size() != flux.size())
        throw InvalidInput("astrometry: x, y and flux have different lengths (" + std::to_string(x.size()) +
                           ", " + std::to_string(y.size()) + ", " + std::to_string(flux.size()) + ")");
    if (width <= 0 || height <= 0)
        throw InvalidInput("astrometry: frame size " + std::to_string(width) + "x" + std::to_string(height) +
                           " is not positive");
    if (!(params.matchRadiusPx > 0.0) || params.maxSipOrder > 9 || !(params.scaleLow > 0.0) ||
        !(params.scaleHigh >= params.scaleLow) || params.nBrightest < 4)
        throw InvalidInput("astrometry: unusable parameters (matchRadiusPx > 0, maxSipOrder <= 9, "
                           "0 < scaleLow <= scaleHigh, nBrightest >= 4)");
}

// The blind search's area and scales: around the header WCS (its scale within headerScaleTolerance), else
// around the pointing, else the whole sky around the reference stars' mean direction.
astrom::BlindSearch blindSearchOf(const std::optional<TanSip>& start,
                                  const std::optional<std::pair<double, double>>& pointingRaDec,
                                  const astrom::RefStars& refs, int width, int height,
                                  const AstrometryParams& params) {
    astrom::BlindSearch search;
    search.scaleLow = params.scaleLow;
    search.scaleHigh = params.scaleHigh;
    if (start) {
        start->pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1), search.centre[0], search.centre[1]);
        search.radiusDeg = params.searchRadiusDeg;
        const double s = start->pixelScaleArcsec();
        search.scaleLow = s * (1.0 - params.headerScaleTolerance);
        search.scaleHigh = s * (1.0 + params.headerScaleTolerance);
    } else if (pointingRaDec) {
        search.centre[0] = pointingRaDec->first;
        search.centre[1] = pointingRaDec->second;
        search.radiusDeg = params.searchRadiusDeg;
    } else { // the whole reference catalog: centre on its mean direction
        double sx = 0, sy = 0, sz = 0;
        for (const auto& v : refs.xyz) {
            sx += v[0];
            sy += v[1];
            sz += v[2];
        }
        const double n = std::sqrt(sx * sx + sy * sy + sz * sz);
        if (n > 0) {
            search.centre[0] = std::atan2(sy, sx) * 180.0 / std::numbers::pi;
            if (search.centre[0] < 0) search.centre[0] += 360.0;
            search.centre[1] = std::asin(std::clamp(sz / n, -1.0, 1.0)) * 180.0 / std::numbers::pi;
        }
        search.radiusDeg = 180.0;
    }
    return search;
}

// The result of a verified outcome: WCS, residuals per match, RMS.
void fillResult(const astrom::RefineOutcome& outcome, const astrom::Detections& det,
                const astrom::RefStars& refs, AstrometryResult& res, int threads) {
    res.ok = true;
    res.wcs = outcome.wcs;
    res.sipOrder = outcome.sipOrder;
    res.nMatched = static_cast<int>(outcome.matches.size());
    res.nUsed = outcome.nUsed;
    res.chanceMatches = outcome.chance;
    const std::size_t n = outcome.matches.size();
    res.sourceIndex.resize(n);
    res.refIndex.resize(n);
    res.dxArcsec.resize(n);
    res.dyArcsec.resize(n);
    res.used.assign(outcome.used.begin(), outcome.used.end());
    // Each match's residual on its own (in parallel); their sum in match order.
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (n > 16384)
    for (long long k = 0; k < static_cast<long long>(n); ++k) {
        const astrom::Match& m = outcome.matches[k];
        double ra = 0, dec = 0;
        res.wcs.pixelToWorld(det.x[m.det], det.y[m.det], ra, dec);
        double dra = ra - refs.ra[m.ref];
        if (dra > 180.0) dra -= 360.0;
        if (dra < -180.0) dra += 360.0;
        res.dxArcsec[k] = dra * std::cos(refs.dec[m.ref] * std::numbers::pi / 180.0) * 3600.0;
        res.dyArcsec[k] = (dec - refs.dec[m.ref]) * 3600.0;
        res.sourceIndex[k] = det.index[m.det];
        res.refIndex[k] = refs.index[m.ref];
    }
    double ss = 0.0;
    for (std::size_t k = 0; k < n; ++k)
        if (outcome.used[k]) ss += res.dxArcsec[k] * res.dxArcsec[k] + res.dyArcsec[k] * res.dyArcsec[k];
    res.rmsArcsec = std::sqrt(ss / std::max(1, res.nUsed));
    res.rmsPx = res.rmsArcsec / res.wcs.pixelScaleArcsec();
    res.message = "astrometry: " + res.method + " solution, " + std::to_string(res.nUsed) + " of " +
                  std::to_string(res.nMatched) + " matches used, SIP order " + std::to_string(res.sipOrder);
}

// The cone of reference stars a refinement starting at `start` is handed: the stars within twice its first
// projection cone of the starting frame centre (RefPool in astrometry_refine.cpp), with a margin of 1.25,
// prepared (sorted, unit vectors) without touching the rest of a large catalog. nullopt: the whole
// catalog (no finite centre, or a cone of 30 deg or more).
std::optional<RefCone> refinementCone(const TanSip& start, int width, int height,
                                      const AstrometryParams& params) {
    double ra0 = 0, dec0 = 0;
    start.pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1), ra0, dec0);
    const double r = std::max(params.refineRadiusPx, std::max(params.matchRadiusPx, 0.1));
    const double coneDeg =
        2.5 * (0.5 * std::hypot(width, height) * 1.2 + r) * start.pixelScaleArcsec() / 3600.0;
    if (!(std::isfinite(ra0) && std::isfinite(dec0) && coneDeg < 30.0)) return std::nullopt;
    const double ch = astrom::chordFromDeg(coneDeg);
    return RefCone{astrom::unitVector(ra0, dec0), ch * ch};
}

// Refines the header WCS (when there is one and blind != 1); on success sets res.method.
astrom::RefineOutcome refineHeader(const astrom::Detections& det, const TanSip& start, RefAccess& refs,
                                   const AstrometryParams& params, RunContext& ctx, AstrometryResult& res,
                                   std::string& refineWhy) {
    const std::optional<RefCone> cone = refinementCone(start, det.width, det.height, params);
    const astrom::RefStars* cut = cone ? &refs.aroundFrame(cone->centre, cone->chord2) : &refs.all();
    astrom::RefineOutcome outcome;
    if (cut->size() >= 6) {
        outcome = astrom::refine(det, *cut, refs.tree(), start, params.refineRadiusPx, true, params,
                                 ctx.threadCount());
        if (outcome.ok)
            res.method = "refined";
        else
            refineWhy = "refining the header WCS failed: " + outcome.why + "; ";
    } else {
        refineWhy = "refining the header WCS failed: " + std::to_string(cut->size()) +
                    " reference stars around the frame; ";
    }
    return outcome;
}

AstrometryResult solveWith(const std::vector<double>& x, const std::vector<double>& y,
                           const std::vector<double>& flux, int width, int height, RefAccess& refs,
                           const Wcs* headerWcs, std::optional<std::pair<double, double>> pointingRaDec,
                           const AstrometryParams& params, RunContext& ctx) {
    AstrometryResult res;
    const astrom::Detections det = prepareDetections(x, y, flux, width, height);
    if (det.size() < 6) {
        res.message = "astrometry: too few detections (" + std::to_string(det.size()) + ")";
        return res;
    }
    std::optional<TanSip> start;
    std::string headerNote;
    if (headerWcs) {
        try {
            start = tanSipFromWcs(*headerWcs, width, height, params.maxSipOrder);
        } catch (const InvalidInput& e) {
            headerNote = std::string(" (header WCS unusable: ") + e.what() + ")";
        }
    }
    astrom::RefineOutcome outcome;
    std::string refineWhy;
    if (start && params.blind != 1) outcome = refineHeader(det, *start, refs, params, ctx, res, refineWhy);
    if (!outcome.ok && params.blind != 0) {
        const astrom::RefStars& all = refs.all();
        if (all.size() < 6) {
            res.message = "astrometry: too few reference stars (" + std::to_string(all.size()) + ")";
            return res;
        }
        const astrom::BlindSearch search = blindSearchOf(start, pointingRaDec, all, width, height, params);
        const auto t0 = std::chrono::steady_clock::now();
        outcome = astrom::solveBlind(det, all, refs.tree(), search, params, ctx, refs.levels());
        res.solveSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (outcome.ok) res.method = "blind";
    }
    if (!outcome.ok) {
        res.message = "astrometry: no solution: " + refineWhy +
                      (params.blind != 0 ? "blind solve failed: " : "") + outcome.why + headerNote;
        return res;
    }
    fillResult(outcome, det, refs.current(), res, ctx.threadCount());
    ctx.report("astrometry", 1.0);
    return res;
}

} // namespace

AstrometryIndex::AstrometryIndex(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
AstrometryIndex::~AstrometryIndex() = default;
std::size_t AstrometryIndex::stars() const {
    return m_impl->refs.size();
}
std::size_t AstrometryIndex::quads() const {
    return astrom::quadCount(*m_impl->levels);
}
int AstrometryIndex::width() const {
    return m_impl->width;
}
int AstrometryIndex::height() const {
    return m_impl->height;
}
double AstrometryIndex::buildSeconds() const {
    return m_impl->seconds;
}

std::shared_ptr<const AstrometryIndex> buildAstrometryIndex(const ReferenceCatalog& ref, int width,
                                                            int height, const AstrometryParams& params,
                                                            RunContext& ctx) {
    checkInputs({}, {}, {}, width, height, params);
    const auto t0 = std::chrono::steady_clock::now();
    auto impl = std::make_unique<AstrometryIndex::Impl>();
    impl->width = width;
    impl->height = height;
    impl->refs = prepareRefs(ref, ctx.threadCount());
    impl->tree = std::make_unique<astrom::SkyTree>(impl->refs.xyz);
    impl->levels = astrom::buildQuadLevels(impl->refs, width, height, params, ctx.threadCount());
    impl->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::make_shared<const AstrometryIndex>(std::move(impl));
}

std::shared_ptr<const RefinementStars> prepareRefinementStars(const ReferenceCatalog& ref,
                                                              const Wcs& headerWcs, int width, int height,
                                                              const AstrometryParams& params, int threads) {
    if (params.blind == 1 || width <= 0 || height <= 0) return nullptr;
    std::optional<TanSip> start;
    try {
        start = tanSipFromWcs(headerWcs, width, height, params.maxSipOrder);
    } catch (const InvalidInput&) {
        return nullptr; // solveAstrometry says why
    }
    const std::optional<RefCone> cone = refinementCone(*start, width, height, params);
    if (!cone) return nullptr;
    auto out = std::make_shared<RefinementStars>();
    out->catalog = &ref;
    out->cone = *cone;
    out->stars = prepareRefs(ref, threads, &cone->centre, cone->chord2);
    return out;
}

AstrometryResult solveAstrometry(const std::vector<double>& x, const std::vector<double>& y,
                                 const std::vector<double>& flux, int width, int height,
                                 const ReferenceCatalog& ref, const Wcs* headerWcs,
                                 std::optional<std::pair<double, double>> pointingRaDec,
                                 const AstrometryParams& params, RunContext& ctx,
                                 const RefinementStars* prepared) {
    checkInputs(x, y, flux, width, height, params);
    RefAccess refs(ref, ctx.threadCount(), prepared);
    return solveWith(x, y, flux, width, height, refs, headerWcs, pointingRaDec, params, ctx);
}

AstrometryResult solveAstrometry(const std::vector<double>& x, const std::vector<double>& y,
                                 const std::vector<double>& flux, int width, int height,
                                 const AstrometryIndex& index, const Wcs* headerWcs,
                                 std::optional<std::pair<double, double>> pointingRaDec,
                                 const AstrometryParams& params, RunContext& ctx) {
    checkInputs(x, y, flux, width, height, params);
    if (width != index.width() || height != index.height())
        throw InvalidInput("astrometry: the index was built for " + std::to_string(index.width()) + "x" +
                           std::to_string(index.height()) + " frames, not " + std::to_string(width) + "x" +
                           std::to_string(height));
    RefAccess refs(index.impl());
    return solveWith(x, y, flux, width, height, refs, headerWcs, pointingRaDec, params, ctx);
}

} // namespace gpuphot
