// CLEAN: merge detections that are explained by the wing of a brighter neighbour (SExtractor CLEAN /
// CLEAN_PARAM semantics, as documented for SExtractor and sep).
//
// Every object is described on the filtered (detection) image over its footprint: filtered flux F,
// pixel count N, filtered-flux-weighted barycentre and second moments (a, b, cxx, cyy, cxy, with
// SExtractor's 1/12 px^2 guard against singular moments), detection threshold t = the lowest per-pixel
// threshold over the footprint, and
//   - abcor, the correction of the isophotal moments for their truncation: the number of footprint
//     pixels whose unfiltered value lies between t and (t + peak) / 2, over 2 pi a b ln((t + peak) / 2t)
//     (what a Gaussian of those moments would give), at most 1;
//   - mthresh, the height above the threshold of the footprint's minArea-th brightest filtered pixel
//     (filtered value minus the local threshold): lowering the object by more than that leaves fewer than
//     minArea pixels above threshold.
// An object's wing is the Moffat profile W(r) = A (1 + alpha r^2)^-beta with beta = cleanParam, amplitude
// A = F / (2 pi a b abcor) (the peak of a Gaussian of flux F) and alpha such that W = t at the isophotal
// radius (pi a b r^2 = N); r is the elliptical radius (cxx dx^2 + cyy dy^2 + cxy dx dy)^1/2 in sigma units.
// An object i is CLEANed into an object j of larger filtered flux (ties: the lower index) when their
// barycentres are closer than 10 (a_i + a_j) and j's wing at i's barycentre is above i's mthresh: without
// j's wing i would not have been detected. Objects are decided from the brightest down: an object that
// was CLEANed cleans nothing (as in SExtractor, where a swallowed object leaves the list), and each
// CLEANed object goes to the kept neighbour whose wing is largest there (ties: the lower index).
//
// The detection passes the objects' footprints in (the overload with `footprints`); the older overload
// rebuilds them exactly as the detection built them, by re-thresholding, labelling (detail::labelRuns)
// and, for regions that hold more than one object, re-deblending (detail::deblendObject), matching each
// rebuilt child to its object by area and bounding box. Both run per object in parallel and combine in a
// fixed order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <system_error>
#include <thread>
#include <utility>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/model/flags.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/stages/detection/detection_sums.hpp"
#include "core/util/huge_pages.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot::detail {

namespace {
// SExtractor's mthresh (examineiso's heap, pixels in raster order): the first k values are kept; the
// (k + 1)-th pixel only sorts them and is itself dropped; later pixels replace the smallest kept one when
// larger. mthresh is the smallest kept value, or the first pixel's when the object has exactly k pixels
// (the heap was never sorted); objects of fewer than k pixels have none.
void sextractorMthresh(const std::vector<float>& above, std::size_t k, CleanSums& c) {
    if (above.size() < k) return;
    std::vector<float> heap(above.begin(), above.begin() + static_cast<std::ptrdiff_t>(k));
    if (above.size() == k) {
        c.mthresh = heap.front();
    } else {
        std::make_heap(heap.begin(), heap.end(), std::greater<float>()); // min-heap
        for (std::size_t i = k + 1; i < above.size(); ++i)
            if (above[i] > heap.front()) {
                std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
                heap.back() = above[i];
                std::push_heap(heap.begin(), heap.end(), std::greater<float>());
            }
        c.mthresh = heap.front();
    }
    c.hasMthresh = true;
}
} // namespace

CleanSums cleanSumsOf(const std::vector<Run>& runs, const DetectionImages& im, const DetectionParams& p) {
    CleanSums c;
    c.x0 = runs.front().x0;
    c.y0 = runs.front().y;
    const auto k = static_cast<std::size_t>(std::max(1, p.minArea));
    std::vector<float> above; // filtered value minus the local threshold
    for (const Run& r : runs) {
        const float* drow = im.det.row(r.y);
        const float* vrow = im.sub.row(r.y);
        for (std::int32_t x = r.x0; x <= r.x1; ++x) {
            const double d = drow[x], t = im.thresholdAt(x, r.y);
            cleanAddPixel(c, x, r.y, d, vrow[x], t);
            above.push_back(static_cast<float>(d - t));
        }
    }
    if (p.sextractorClean) {
        sextractorMthresh(above, k, c);
    } else if (above.size() >= k) {
        std::nth_element(above.begin(), above.begin() + static_cast<std::ptrdiff_t>(k - 1), above.end(),
                         std::greater<float>());
        c.mthresh = above[k - 1];
        c.hasMthresh = true;
    }
    for (const Run& r : runs) {
        const float* vrow = im.sub.row(r.y);
        for (std::int32_t x = r.x0; x <= r.x1; ++x)
            cleanAddPixel2(c, vrow[x]);
    }
    return c;
}

namespace {
constexpr double kPi = 3.14159265358979323846;
constexpr double kCleanZone = 10.0; // in units of the sum of the two objects' major-axis sigmas
constexpr int kCell = 32;           // px, grid cell for the neighbour search

// An object as CLEAN sees it (SExtractor's fdflux, fdnpix, mx, my, a, b, cxx, cyy, cxy, dthresh, abcor,
// mthresh).
struct CleanObject {
    bool valid = false;
    double flux = 0.0;
    std::int64_t npix = 0;
    double mx = 0.0, my = 0.0, a = 0.0, b = 0.0, cxx = 0.0, cyy = 0.0, cxy = 0.0;
    double thresh = 0.0, abcor = 1.0, mthresh = 0.0;
    // The wing: W(r2) = amp (1 + alpha r2)^-beta; amp <= 0 or alpha <= 0: no wing.
    double amp = 0.0, alpha = 0.0;
    std::int32_t yLast = 0, xFirst = 0; // the footprint's last row and first column (sextractorClean's order)
};

CleanObject describeFromSums(const CleanSums& c, double beta) {
    CleanObject o;
    const double x0 = c.x0, y0 = c.y0;
    const double s = c.s, sx = c.sx, sy = c.sy, sxx = c.sxx, syy = c.syy, sxy = c.sxy;
    const double thresh = c.thresh, peak = c.peak;
    const std::int64_t n = c.n;
    o.npix = n;
    o.flux = s;
    o.thresh = thresh;
    if (!(s > 0.0) || n == 0) return o;
    if (c.hasMthresh) o.mthresh = c.mthresh;
    const double mx = sx / s, my = sy / s;
    double vxx = sxx / s - mx * mx, vyy = syy / s - my * my;
    const double vxy = sxy / s - mx * my;
    double det = vxx * vyy - vxy * vxy;
    if (det < 0.00694) { // SExtractor's guard against singular (one-pixel-wide) moments
        vxx += 1.0 / 12.0;
        vyy += 1.0 / 12.0;
        det = vxx * vyy - vxy * vxy;
    }
    if (!(det > 0.0)) return o;
    o.mx = x0 + mx;
    o.my = y0 + my;
    const double half = 0.5 * (vxx + vyy);
    const double root = std::sqrt(0.25 * (vxx - vyy) * (vxx - vyy) + vxy * vxy);
    o.a = std::sqrt(half + root);
    o.b = std::sqrt(std::max(0.0, half - root));
    o.cxx = vyy / det;
    o.cyy = vxx / det;
    o.cxy = -2.0 * vxy / det;
    if (!(o.b > 0.0)) return o;

    // Truncation correction of the moments: pixels above t and above (t + peak) / 2, unfiltered values.
    const double thresh2 = 0.5 * (thresh + peak);
    const std::int64_t nAbove = c.nAbove, nAbove2 = c.nAbove2;
    const double ratio = thresh / thresh2;
    if (ratio > 0.0) {
        const double darea = static_cast<double>(nAbove2 - nAbove);
        o.abcor = (darea < 0.0 ? darea : -1.0) / (2.0 * kPi * std::log(std::min(ratio, 0.99)) * o.a * o.b);
        o.abcor = std::min(o.abcor, 1.0);
    }
    const double unitArea = kPi * o.a * o.b;
    o.amp = o.flux / (2.0 * unitArea * o.abcor);
    if (thresh > 0.0)
        o.alpha = (std::pow(o.amp / thresh, 1.0 / beta) - 1.0) * unitArea / static_cast<double>(n);
    o.valid = std::isfinite(o.amp) && std::isfinite(o.alpha) && std::isfinite(o.mthresh);
    return o;
}

CleanObject describe(const std::vector<Run>& runs, const DetectionImages& im, const DetectionParams& p,
                     double beta) {
    CleanObject o = describeFromSums(cleanSumsOf(runs, im, p), beta);
    o.yLast = runs.back().y;
    o.xFirst = runs.front().x0;
    for (const Run& r : runs)
        o.xFirst = std::min(o.xFirst, r.x0);
    return o;
}

// All above-threshold runs of the frame in raster order (the detection's thresholding rule).
std::vector<Run> aboveRuns(const DetectionImages& im, int threads) {
    constexpr int kBlock = 64;
    const int nBlocks = (im.height + kBlock - 1) / kBlock;
    std::vector<std::vector<Run>> blocks(nBlocks);
    ParallelErrors errors;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int b = 0; b < nBlocks; ++b)
        errors.run([&] {
            const int y1 = std::min(im.height, (b + 1) * kBlock);
            for (int y = b * kBlock; y < y1; ++y) {
                int x = 0;
                while (x < im.width) {
                    if (!im.above(x, y)) {
                        ++x;
                        continue;
                    }
                    const int xStart = x;
                    while (x < im.width && im.above(x, y))
                        ++x;
                    blocks[b].push_back({y, xStart, x - 1});
                }
            }
        });
    errors.rethrow();
    std::vector<Run> runs;
    for (const auto& v : blocks)
        runs.insert(runs.end(), v.begin(), v.end());
    return runs;
}

struct Box {
    std::int64_t area = 0;
    std::int32_t xMin = 0, xMax = 0, yMin = 0, yMax = 0;
};

Box boxOf(const std::vector<Run>& runs) {
    Box b{0, runs.front().x0, runs.front().x1, runs.front().y, runs.front().y};
    for (const Run& r : runs) {
        b.area += r.x1 - r.x0 + 1;
        b.xMin = std::min(b.xMin, r.x0);
        b.xMax = std::max(b.xMax, r.x1);
        b.yMin = std::min(b.yMin, r.y);
        b.yMax = std::max(b.yMax, r.y);
    }
    return b;
}

// The CLEAN description of every object, from its rebuilt footprint (invalid where it was not found).
std::vector<CleanObject> describeAll(const std::vector<IsoMeasure>& m, const DetectionImages& im,
                                     const DetectionParams& p, double beta, int threads) {
    const auto n = static_cast<std::int32_t>(m.size());
    std::vector<CleanObject> out(n);
    std::vector<Run> runs = aboveRuns(im, threads);
    std::int32_t nComp = 0;
    const std::vector<std::int32_t> label = labelRuns(runs.data(), runs.size(), nComp);
    std::vector<std::size_t> rowStart(static_cast<std::size_t>(im.height) + 1, 0);
    for (const Run& r : runs)
        ++rowStart[r.y + 1];
    for (int y = 0; y < im.height; ++y)
        rowStart[y + 1] += rowStart[y];

    // The region of each object: the one holding its filtered peak.
    std::vector<std::int32_t> compOf(n, -1);
    for (std::int32_t i = 0; i < n; ++i) {
        const std::int32_t px = m[i].detPeakX, py = m[i].detPeakY;
        if (py < 0 || py >= im.height) continue;
        const auto first = runs.begin() + static_cast<std::ptrdiff_t>(rowStart[py]);
        const auto last = runs.begin() + static_cast<std::ptrdiff_t>(rowStart[py + 1]);
        const auto it =
            std::upper_bound(first, last, px, [](std::int32_t x, const Run& r) { return x < r.x0; });
        if (it != first && std::prev(it)->x1 >= px) compOf[i] = label[std::prev(it) - runs.begin()];
    }
    // Regions holding objects, in order of their first run; their objects in index order.
    std::vector<std::int32_t> regionOf(nComp, -1), regionComp;
    std::vector<std::vector<std::int32_t>> regionObjects;
    for (std::int32_t i = 0; i < n; ++i) {
        const std::int32_t c = compOf[i];
        if (c < 0) continue;
        if (regionOf[c] < 0) {
            regionOf[c] = static_cast<std::int32_t>(regionComp.size());
            regionComp.push_back(c);
            regionObjects.emplace_back();
        }
        regionObjects[regionOf[c]].push_back(i);
    }
    std::vector<std::vector<Run>> regionRuns(regionComp.size());
    for (std::size_t r = 0; r < runs.size(); ++r)
        if (regionOf[label[r]] >= 0) regionRuns[regionOf[label[r]]].push_back(runs[r]);
    runs = {};

    const auto nRegions = static_cast<std::int64_t>(regionComp.size());
    ParallelErrors errors;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
    for (std::int64_t g = 0; g < nRegions; ++g)
        errors.run([&] {
            const std::vector<std::int32_t>& objs = regionObjects[g];
            const std::vector<Run>& root = regionRuns[g];
            if (objs.size() == 1 && runsArea(root) == m[objs.front()].area) {
                out[objs.front()] = describe(root, im, p, beta);
                return;
            }
            DeblendOutput d;
            deblendObject(root, im, p, d);
            std::vector<char> used(objs.size(), 0);
            for (const std::vector<Run>& child : d.children) {
                const Box b = boxOf(child);
                for (std::size_t q = 0; q < objs.size(); ++q) {
                    const IsoMeasure& mi = m[objs[q]];
                    if (used[q] || mi.area != b.area || mi.xMin != b.xMin || mi.xMax != b.xMax ||
                        mi.yMin != b.yMin || mi.yMax != b.yMax)
                        continue;
                    used[q] = 1;
                    out[objs[q]] = describe(child, im, p, beta);
                    break;
                }
            }
        });
    errors.rethrow();
    return out;
}

struct Candidate {
    std::int32_t i, j; // i is CLEANed into j
    double wing;
};

// What the candidate search reads of the objects of a grid cell, stored with the cell's list (contiguous: the
// search does not jump through the descriptions).
struct GridItem {
    double mx, my, a;
    std::int32_t index;
};

struct CleanScratchImpl final : CleanScratch {
    UninitArray<CleanObject> o; // the descriptions, constructed anew by each call
    std::vector<std::int32_t> cellOf, cellStart, rowOffset, rowStart, byRow;
    std::vector<GridItem> items;
    std::vector<std::vector<Candidate>> perThread;
    std::vector<std::size_t> candStart, candFill, groupStart;
    std::vector<Candidate> cand;
    std::vector<std::int32_t> order, groups;
    std::vector<std::int32_t> final; // the targets
    std::vector<std::int32_t> kept, mergeFirst, merged;
};
} // namespace

std::shared_ptr<CleanScratch> makeCleanScratch() {
    return std::make_shared<CleanScratchImpl>();
}

namespace {
// The targets left in s.final.
void cleanDescribed(std::int32_t n, const CleanObject* o, int width, int height, const DetectionParams& p,
                    int threads, CleanScratchImpl& s);

// cleanTargetsFromSums (count >= 2, cleanParam > 0) into s.final.
// isoSums (null: none) give the footprints' extents for sextractorClean's order.
const std::vector<std::int32_t>& cleanTargetsInto(std::size_t count, const CleanSums* const* sums, int width,
                                                  int height, const DetectionParams& p, int threads,
                                                  CleanScratchImpl& s,
                                                  const IsoSums* const* isoSums = nullptr) {
    const auto n = static_cast<std::int64_t>(count);
    s.o.reserve(count); // constructed below, in parallel
    CleanObject* o = s.o.data();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 256)
    for (std::int64_t i = 0; i < n; ++i) {
        new (o + i) CleanObject(describeFromSums(*sums[i], p.cleanParam));
        if (isoSums) {
            o[i].yLast = isoSums[i]->yMax;
            o[i].xFirst = isoSums[i]->xMin;
        }
    }
    cleanDescribed(static_cast<std::int32_t>(n), o, width, height, p, threads, s);
    return s.final;
}
} // namespace

std::vector<std::int32_t> cleanTargets(const std::vector<IsoMeasure>& m, const DetectionImages& im,
                                       const DetectionParams& p, int threads) {
    if (m.size() < 2 || !(p.cleanParam > 0.0)) return std::vector<std::int32_t>(m.size(), -1);
    const std::vector<CleanObject> o = describeAll(m, im, p, p.cleanParam, threads);
    CleanScratchImpl s;
    cleanDescribed(static_cast<std::int32_t>(m.size()), o.data(), im.width, im.height, p, threads, s);
    return std::move(s.final);
}

std::vector<std::int32_t> cleanTargets(const std::vector<IsoMeasure>& m,
                                       const std::vector<const std::vector<Run>*>& footprints,
                                       const DetectionImages& im, const DetectionParams& p, int threads) {
    const auto n = static_cast<std::int64_t>(m.size());
    if (n < 2 || !(p.cleanParam > 0.0)) return std::vector<std::int32_t>(m.size(), -1);
    CleanScratchImpl s;
    s.o.reserve(m.size()); // constructed below, in parallel
    CleanObject* o = s.o.data();
    ParallelErrors errors;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (std::int64_t i = 0; i < n; ++i)
        errors.run([&] { new (o + i) CleanObject(describe(*footprints[i], im, p, p.cleanParam)); });
    errors.rethrow();
    cleanDescribed(static_cast<std::int32_t>(n), o, im.width, im.height, p, threads, s);
    return std::move(s.final);
}

std::vector<std::int32_t> cleanTargetsFromSums(std::size_t count, const CleanSums* const* sums, int width,
                                               int height, const DetectionParams& p, int threads,
                                               CleanScratch* scratch) {
    const auto n = static_cast<std::int64_t>(count);
    if (n < 2 || !(p.cleanParam > 0.0)) return std::vector<std::int32_t>(count, -1);
    CleanScratchImpl local;
    CleanScratchImpl& s = scratch ? static_cast<CleanScratchImpl&>(*scratch) : local;
    return cleanTargetsInto(count, sums, width, height, p, threads, s);
}

void ObjectStorage::start(std::size_t count, std::size_t capacity, int threads,
                          std::vector<Object>&& recycledObjects, std::vector<IsoMeasure>&& recycledIso) {
    if (recycledObjects.capacity() >= count && recycledIso.capacity() >= count && count > 0) {
        join();
        m_objects = std::move(recycledObjects); // their old size: take(n) resizes within the capacity
        m_iso = std::move(recycledIso);
        m_recycled = true;
        return;
    }
    recycledObjects = {};
    recycledIso = {};
    start(count, capacity, threads);
}

void ObjectStorage::start(std::size_t count, std::size_t capacity, int threads) {
    join();
    m_recycled = false;
    m_objects = {};
    m_iso = {};
    if (threads <= 1 || count < 4096) return;
    m_busy.store(true, std::memory_order_release);
    try {
        m_thread = std::thread([this, count, capacity] {
            try {
                const std::size_t room = std::max(count, capacity);
                m_iso.reserve(room);
                adviseHugePages(m_iso.data(), room * sizeof(IsoMeasure));
                m_objects.reserve(room);
                adviseHugePages(m_objects.data(), room * sizeof(Object));
                m_iso.resize(count);
                m_objects.resize(count);
            } catch (...) {
                m_objects = {}; // made by take() instead
                m_iso = {};
            }
            m_busy.store(false, std::memory_order_release);
        });
    } catch (const std::system_error&) {
        m_busy.store(false, std::memory_order_release);
    }
}

void ObjectStorage::take(std::size_t n, int threads, std::vector<Object>& objects,
                         std::vector<IsoMeasure>& iso) {
    join();
    objects = std::move(m_objects);
    iso = std::move(m_iso);
    m_objects = {};
    m_iso = {};
    // Within the room made at most the pages beyond the helper's count are new; else all are.
    if (objects.capacity() >= n && objects.capacity() > 0) {
        objects.resize(n);
    } else {
        objects = prefaultedVector<Object>(n, threads);
    }
    if (iso.capacity() >= n && iso.capacity() > 0) {
        iso.resize(n);
    } else {
        iso = prefaultedVector<IsoMeasure>(n, threads);
    }
}

void ObjectPlan::plan(std::size_t nRoots, const std::vector<std::int32_t>& multi,
                      const std::vector<DeblendOutput>& deblended) {
    multiOf.assign(nRoots, -1);
    childFirst.assign(multi.size() + 1, 0);
    for (std::size_t m = 0; m < multi.size(); ++m) {
        multiOf[multi[m]] = static_cast<std::int32_t>(m);
        const std::size_t nc = deblended[m].children.size();
        childFirst[m + 1] = childFirst[m] + (nc > 1 ? static_cast<std::int64_t>(nc) : 0);
    }
    nChildren = static_cast<std::size_t>(childFirst.back());
    firstObject.resize(nRoots + 1);
    firstObject[0] = 0;
    for (std::size_t r = 0; r < nRoots; ++r)
        firstObject[r + 1] =
            firstObject[r] +
            (multiOf[r] < 0 ? 1 : static_cast<std::int64_t>(deblended[multiOf[r]].children.size()));
    nObjects = static_cast<std::size_t>(firstObject[nRoots]);
}

void ObjectPlan::fill(const Run* rootRuns, const std::int64_t* rootStart,
                      std::vector<DeblendOutput>& deblended, const IsoSums* rootIso,
                      const CleanSums* rootClean, const IsoSums* childIso, const CleanSums* childClean,
                      int threads) {
    const std::size_t nRoots = multiOf.size();
    objects.reserve(nObjects);
    isoOf.reserve(nObjects);
    cleanOf.reserve(nObjects);
    childStart.assign(nChildren + 1, 0);
    for (std::size_t m = 0; m < deblended.size(); ++m) {
        const auto& ch = deblended[m].children;
        if (ch.size() < 2) continue;
        for (std::size_t c = 0; c < ch.size(); ++c) {
            const std::size_t q = static_cast<std::size_t>(childFirst[m]) + c;
            childStart[q + 1] = childStart[q] + static_cast<std::int64_t>(ch[c].size());
        }
    }
    childRuns.resize(static_cast<std::size_t>(childStart[nChildren]));
    ObjectRuns* obj = objects.data();
    const IsoSums** iso = isoOf.data();
    const CleanSums** cs = cleanOf.data();
    parallelFor(nRoots, threads, 1024, [&](std::int64_t r) {
        const std::int64_t first = firstObject[r];
        const std::int32_t m = multiOf[r];
        if (m < 0 || deblended[m].children.size() < 2) { // the root is its own object
            iso[first] = rootIso + r;
            cs[first] = rootClean ? rootClean + r : nullptr;
            if (m < 0) {
                new (obj + first)
                    ObjectRuns{rootRuns + rootStart[r],
                               static_cast<std::size_t>(rootStart[r + 1] - rootStart[r]), nullptr, 0u};
                return;
            }
        }
        DeblendOutput& d = deblended[m];
        const std::uint32_t fl = (d.split ? FlagBlended : 0u) | (d.overflow ? FlagDeblendOverflow : 0u);
        for (std::size_t c = 0; c < d.children.size(); ++c) {
            if (d.children.size() > 1) {
                const std::size_t q = static_cast<std::size_t>(childFirst[m]) + c;
                std::copy(d.children[c].begin(), d.children[c].end(), childRuns.begin() + childStart[q]);
                iso[first + c] = childIso + q;
                cs[first + c] = childClean ? childClean + q : nullptr;
            }
            new (obj + first + c) ObjectRuns{d.children[c].data(), d.children[c].size(), &d.children[c], fl};
        }
    });
}

void finishObjectsFromSums(std::vector<Object> objects, const IsoSums* const* isoSums,
                           const CleanSums* const* cleanSums, int width, int height, const DetectionParams& p,
                           int threads, DetectedObjects& out, CleanScratch* scratch) {
    std::vector<ObjectRuns> given(objects.size());
    for (std::size_t i = 0; i < objects.size(); ++i)
        given[i] =
            ObjectRuns{objects[i].runs.data(), objects[i].runs.size(), &objects[i].runs, objects[i].flags};
    finishObjectsFromSums(objects.size(), given.data(), isoSums, cleanSums, width, height, p, threads, out,
                          scratch);
}

void finishObjectsFromSums(std::size_t n, const ObjectRuns* objects, const IsoSums* const* isoSums,
                           const CleanSums* const* cleanSums, int width, int height, const DetectionParams& p,
                           int threads, DetectedObjects& out, CleanScratch* scratch, ObjectStorage* storage) {
    StepTimer timer;
    // The result's storage (at most n kept objects) is made on a helper thread while CLEAN runs, unless the
    // caller started it earlier.
    ObjectStorage local;
    if (!storage) {
        local.start(n, n, threads);
        storage = &local;
    }
    CleanScratchImpl localScratch;
    CleanScratchImpl& s = scratch ? static_cast<CleanScratchImpl&>(*scratch) : localScratch;
    const bool anyClean = p.clean && cleanSums && n >= 2 && p.cleanParam > 0.0;
    const std::vector<std::int32_t>* target =
        anyClean
            ? &cleanTargetsInto(n, cleanSums, width, height, p, storage->teamThreads(threads), s, isoSums)
            : nullptr;
    timer.lap("CLEAN targets (host)");
    // The kept objects in order, and the CLEANed ones of each kept object j in increasing index (applyClean's
    // order of the additions): `merged` holds the CLEANed objects by target, then index (one pass over the
    // objects, then a stable sort of the few CLEANed ones), mergeFirst[j] the first of j's (-1: none); in the
    // scratch memory (not faulted in afresh).
    std::vector<std::int32_t>& kept = s.kept;
    kept.clear();
    kept.reserve(n);
    std::vector<std::int32_t>& mergeFirst = s.mergeFirst;
    std::vector<std::int32_t>& merged = s.merged;
    mergeFirst.clear();
    merged.clear();
    const std::int32_t* t = target ? target->data() : nullptr;
    if (t) {
        for (std::size_t i = 0; i < n; ++i)
            (t[i] < 0 ? kept : merged).push_back(static_cast<std::int32_t>(i));
        if (!merged.empty()) {
            std::stable_sort(merged.begin(), merged.end(),
                             [t](std::int32_t a, std::int32_t b) { return t[a] < t[b]; });
            mergeFirst.assign(n, -1);
            for (std::size_t k = merged.size(); k-- > 0;)
                mergeFirst[t[merged[k]]] = static_cast<std::int32_t>(k);
        }
    } else {
        kept.resize(n);
        for (std::size_t i = 0; i < n; ++i)
            kept[i] = static_cast<std::int32_t>(i);
    }
    timer.lap("CLEAN merge lists (host)");
    std::vector<Object> objs;
    std::vector<IsoMeasure> iso;
    storage->take(kept.size(), threads, objs, iso);
    timer.lap("result storage (host)");
    // Each kept object: its runs (taken over or copied), its measurement, the CLEANed ones' measurements and
    // runs added (the runs re-sorted).
    parallelFor(kept.size(), threads, 256, [&](std::int64_t q) {
        const std::int32_t j = kept[q];
        const ObjectRuns& src = objects[j];
        Object& dst = objs[q];
        dst.flags = src.flags;
        if (src.owned) {
            dst.runs = std::move(*src.owned);
        } else {
            dst.runs.assign(src.runs, src.runs + src.nRuns);
        }
        IsoMeasure e = finishIsophotal(*isoSums[j], width, height, p.sextractorIso);
        if (!mergeFirst.empty() && mergeFirst[j] >= 0) {
            for (std::size_t k = static_cast<std::size_t>(mergeFirst[j]);
                 k < merged.size() && t[merged[k]] == j; ++k) {
                const std::int32_t i = merged[k];
                cleanMerge(e, finishIsophotal(*isoSums[i], width, height, p.sextractorIso));
                dst.runs.insert(dst.runs.end(), objects[i].runs, objects[i].runs + objects[i].nRuns);
            }
            std::sort(dst.runs.begin(), dst.runs.end(),
                      [](const Run& a, const Run& b) { return a.y < b.y || (a.y == b.y && a.x0 < b.x0); });
        }
        iso[q] = e;
    });
    timer.lap("objects + measurements + CLEAN merge (host)");
    out.nCleaned += n - kept.size();
    out.objects = std::move(objs);
    out.iso = std::move(iso);
}

namespace {
// The grid of kCell x kCell pixel cells over the frame in which the neighbours are searched; positions
// outside it fall into its edge cells.
struct CellGrid {
    int gw = 0, gh = 0;
    int cellX(double x) const { return std::clamp(static_cast<int>(std::floor(x / kCell)), 0, gw - 1); }
    int cellY(double y) const { return std::clamp(static_cast<int>(std::floor(y / kCell)), 0, gh - 1); }
};

// Grid of the objects by barycentre; each cell lists its objects in index order (s.cellStart, s.items).
// Built in parallel in one team, three phases (the same cellStart and lists as a serial counting sort:
// cellStart[c] = the valid objects in cells before c, raster order of the cells; each cell's objects in
// index order): (1) each thread takes a contiguous share of the objects, notes each one's cell and counts
// its share's objects per row of cells; (2) one thread turns the counts into offsets (row by row, the
// shares in order within a row) and the shares place their objects into byRow, by row of cells, in index
// order within each row; (3) the rows of cells in parallel: each row's objects counted by cell, the row's
// cellStart entries, its lists. At 60k objects one thread took 1.4 ms for the lists on a 16-core host.
void buildGrid(std::int32_t n, const CleanObject* o, const CellGrid& grid, int threads, CleanScratchImpl& s) {
    const int gw = grid.gw, gh = grid.gh;
    std::vector<std::int32_t>& cellOf = s.cellOf;
    std::vector<std::int32_t>& cellStart = s.cellStart;
    std::vector<std::int32_t>& rowOffset = s.rowOffset; // [thread][row]: count, then the share's offset
    std::vector<std::int32_t>& rowStart = s.rowStart;   // [row]: its first object in byRow
    std::vector<std::int32_t>& byRow = s.byRow;
    std::vector<GridItem>& items = s.items;
    const int team = std::max(1, threads);
    cellOf.resize(static_cast<std::size_t>(n));
    cellStart.resize(static_cast<std::size_t>(gw) * gh + 1);
    rowOffset.assign(static_cast<std::size_t>(team) * gh, 0);
    rowStart.resize(static_cast<std::size_t>(gh) + 1);
    ParallelErrors errors;
#pragma omp parallel num_threads(team)
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        const std::int32_t i0 = static_cast<std::int32_t>(static_cast<std::int64_t>(n) * t / nt);
        const std::int32_t i1 = static_cast<std::int32_t>(static_cast<std::int64_t>(n) * (t + 1) / nt);
        std::int32_t* mine = rowOffset.data() + static_cast<std::size_t>(t) * gh;
        for (std::int32_t i = i0; i < i1; ++i) {
            const std::int32_t c = o[i].valid ? grid.cellY(o[i].my) * gw + grid.cellX(o[i].mx) : -1;
            cellOf[i] = c;
            if (c >= 0) ++mine[c / gw];
        }
#pragma omp barrier
#pragma omp single
        errors.run([&] {
            std::int32_t at = 0;
            for (int cy = 0; cy < gh; ++cy) {
                rowStart[cy] = at;
                for (int u = 0; u < nt; ++u) {
                    std::int32_t& v = rowOffset[static_cast<std::size_t>(u) * gh + cy];
                    const std::int32_t count = v;
                    v = at;
                    at += count;
                }
            }
            rowStart[gh] = at;
            byRow.resize(static_cast<std::size_t>(at));
            items.resize(static_cast<std::size_t>(at));
        }); // implicit barrier
        for (std::int32_t i = i0; i < i1 && !errors.failed(); ++i)
            if (cellOf[i] >= 0) byRow[mine[cellOf[i] / gw]++] = i;
#pragma omp barrier
        std::vector<std::int32_t> fill;
        errors.run([&] { fill.resize(static_cast<std::size_t>(gw) + 1); });
#pragma omp for schedule(dynamic, 4)
        for (int cy = 0; cy < gh; ++cy) {
            if (errors.failed()) continue;
            const std::size_t c0 = static_cast<std::size_t>(cy) * gw;
            std::fill(fill.begin(), fill.end(), 0);
            for (std::int32_t q = rowStart[cy]; q < rowStart[cy + 1]; ++q)
                ++fill[cellOf[byRow[q]] - c0 + 1];
            std::int32_t at = rowStart[cy];
            for (int cx = 0; cx < gw; ++cx) {
                cellStart[c0 + cx] = at;
                at += fill[cx + 1];
                fill[cx] = cellStart[c0 + cx]; // the cell's fill cursor
            }
            for (std::int32_t q = rowStart[cy]; q < rowStart[cy + 1]; ++q) {
                const std::int32_t i = byRow[q];
                items[fill[cellOf[i] - c0]++] = GridItem{o[i].mx, o[i].my, o[i].a, i};
            }
        }
    }
    errors.rethrow();
    cellStart[static_cast<std::size_t>(gw) * gh] = rowStart[gh];
}

// The CLEAN candidates (i, j, j's wing at i) into s.perThread: each pair within the zone,
// 10 (a_q + a_r) <= 20 max(a_q, a_r), is examined once, by the object with the larger a (ties: the lower
// index), which searches 20 a around itself.
void findCandidates(std::int32_t n, const CleanObject* o, const CellGrid& grid, double beta, int threads,
                    CleanScratchImpl& s) {
    const int gw = grid.gw;
    const std::vector<std::int32_t>& cellStart = s.cellStart;
    const std::vector<GridItem>& items = s.items;
    std::vector<std::vector<Candidate>>& perThread = s.perThread;
    perThread.resize(static_cast<std::size_t>(std::max(1, threads)));
    for (auto& v : perThread)
        v.clear();
    ParallelErrors errors;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (std::int32_t q = 0; q < n; ++q)
        errors.run([&] {
            const CleanObject& oq = o[q];
            if (!oq.valid) return;
            const double reach = 2.0 * kCleanZone * oq.a;
            const int cx0 = grid.cellX(oq.mx - reach), cx1 = grid.cellX(oq.mx + reach);
            const int cy0 = grid.cellY(oq.my - reach), cy1 = grid.cellY(oq.my + reach);
#ifdef _OPENMP
            auto& out = perThread[omp_get_thread_num()];
#else
            auto& out = perThread[0];
#endif
            for (int cy = cy0; cy <= cy1; ++cy) {
                // The cells cx0..cx1 of the row are consecutive in the lists.
                const std::size_t c0 = static_cast<std::size_t>(cy) * gw;
                for (std::int32_t k = cellStart[c0 + cx0]; k < cellStart[c0 + cx1 + 1]; ++k) {
                    const GridItem& it = items[k];
                    const std::int32_t r = it.index;
                    if (r == q || it.a > oq.a || (it.a == oq.a && r < q)) continue;
                    const double dx = oq.mx - it.mx, dy = oq.my - it.my;
                    const double rlim = oq.a + it.a;
                    if (!(dx * dx + dy * dy < rlim * rlim * kCleanZone * kCleanZone)) continue;
                    const CleanObject& orr = o[r];
                    // j: the larger filtered flux (ties: the lower index) may CLEAN i.
                    const bool qBrighter = oq.flux > orr.flux || (oq.flux == orr.flux && q < r);
                    const std::int32_t j = qBrighter ? q : r, i = qBrighter ? r : q;
                    const CleanObject& oj = o[j];
                    if (!(oj.alpha > 0.0)) continue;
                    const double val =
                        1.0 + oj.alpha * (oj.cxx * dx * dx + oj.cyy * dy * dy + oj.cxy * dx * dy);
                    if (!(val > 1.0) || !(val < 1e10)) continue;
                    const double wing = oj.amp * std::pow(val, -beta);
                    if (static_cast<float>(wing) > static_cast<float>(o[i].mthresh))
                        out.push_back({i, j, wing});
                }
            }
        });
    errors.rethrow();
}

// Few candidates: all gathered into s.cand and sorted at once by (i, wing descending, j), then grouped by i.
void sortCandidatesAtOnce(CleanScratchImpl& s) {
    std::vector<Candidate>& cand = s.cand;
    cand.clear();
    for (const auto& v : s.perThread)
        cand.insert(cand.end(), v.begin(), v.end());
    std::sort(cand.begin(), cand.end(), [](const Candidate& x, const Candidate& y) {
        return x.i < y.i || (x.i == y.i && (x.wing > y.wing || (x.wing == y.wing && x.j < y.j)));
    });
    for (std::size_t k = 0; k < cand.size(); ++k)
        if (k == 0 || cand[k].i != cand[k - 1].i) {
            s.groupStart.push_back(k);
            s.order.push_back(cand[k].i);
        }
}

// Many candidates: bucketed by i into s.cand (a counting sort), each bucket sorted by (wing descending, j)
// in parallel, then grouped by i.
void bucketCandidates(std::int32_t n, int threads, CleanScratchImpl& s) {
    std::vector<Candidate>& cand = s.cand;
    std::vector<std::size_t>& candStart = s.candStart;
    candStart.assign(static_cast<std::size_t>(n) + 1, 0);
    for (const auto& v : s.perThread)
        for (const Candidate& c : v)
            ++candStart[c.i + 1];
    for (std::int32_t i = 0; i < n; ++i)
        candStart[i + 1] += candStart[i];
    cand.resize(candStart[n]);
    s.candFill.assign(candStart.begin(), candStart.end() - 1);
    for (const auto& v : s.perThread)
        for (const Candidate& c : v)
            cand[s.candFill[c.i]++] = c;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1024)
    for (std::int32_t i = 0; i < n; ++i) {
        if (candStart[i + 1] - candStart[i] < 2) continue;
        std::sort(cand.begin() + static_cast<std::ptrdiff_t>(candStart[i]),
                  cand.begin() + static_cast<std::ptrdiff_t>(candStart[i + 1]),
                  [](const Candidate& x, const Candidate& y) {
                      return x.wing > y.wing || (x.wing == y.wing && x.j < y.j);
                  });
    }
    for (std::int32_t i = 0; i < n; ++i)
        if (candStart[i + 1] > candStart[i]) {
            s.groupStart.push_back(candStart[i]);
            s.order.push_back(i);
        }
}

// Candidates ordered by (i, wing descending, j) (a total order: each pair occurs once, so any sorting
// gives the same sequence), in groups by i: few of them (a crowded frame: a few thousand among 60k
// objects) are sorted at once, many are bucketed by i and each bucket sorted. s.order: the objects with
// candidates, increasing; s.groupStart[g]: the first candidate of order[g] (one extra entry at the end).
void groupCandidates(std::int32_t n, int threads, CleanScratchImpl& s) {
    s.groupStart.clear();
    s.order.clear();
    std::size_t nCand = 0;
    for (const auto& v : s.perThread)
        nCand += v.size();
    if (nCand * 8 < static_cast<std::size_t>(n)) {
        sortCandidatesAtOnce(s);
    } else {
        bucketCandidates(n, threads, s);
    }
    s.groupStart.push_back(s.cand.size());
}

// The targets into s.final (-1: kept), decided from the brightest down. Only an object with candidates can
// be CLEANed, and only a CLEANed object changes a later decision: the decisions visit those objects alone,
// in the order of the whole list.
void decideTargets(std::int32_t n, const CleanObject* o, CleanScratchImpl& s) {
    const std::vector<std::int32_t>& order = s.order;
    std::vector<std::int32_t>& groups = s.groups;
    groups.resize(order.size());
    for (std::size_t g = 0; g < order.size(); ++g)
        groups[g] = static_cast<std::int32_t>(g);
    std::sort(groups.begin(), groups.end(), [&](std::int32_t gx, std::int32_t gy) {
        const std::int32_t x = order[gx], y = order[gy];
        return o[x].flux > o[y].flux || (o[x].flux == o[y].flux && x < y);
    });
    std::vector<std::int32_t>& final = s.final;
    final.assign(static_cast<std::size_t>(n), -1);
    for (const std::int32_t g : groups) {
        const std::int32_t i = order[g];
        for (std::size_t k = s.groupStart[g]; k < s.groupStart[g + 1]; ++k) {
            if (final[s.cand[k].j] >= 0) continue; // that neighbour was CLEANed itself
            final[i] = s.cand[k].j;
            break;
        }
    }
}

// SExtractor's wing of object o, with its flux and pixel count as merges have grown them, at offset (dx, dy)
// from its barycentre (0 outside its validity).
double growingWing(const CleanObject& o, double flux, double npix, double dx, double dy, double beta) {
    const double unitArea = kPi * o.a * o.b;
    const double amp = flux / (2.0 * unitArea * o.abcor);
    if (!(o.thresh > 0.0)) return 0.0;
    const double alpha = (std::pow(amp / o.thresh, 1.0 / beta) - 1.0) * unitArea / npix;
    const double val = 1.0 + alpha * (o.cxx * dx * dx + o.cyy * dy * dy + o.cxy * dx * dy);
    return val > 1.0 && val < 1e10 ? amp * std::pow(val, -beta) : 0.0;
}

// DetectionParams::sextractorClean: the objects in the order a scan completes them (last row, then first
// column, then index), each against the kept objects before it in their order, as SExtractor's clean():
// a brighter one whose wing is above the newcomer's mthresh takes it (the first such); else the newcomer
// takes the fainter ones its wing lifts above their mthresh. The taker's flux and pixel count grow by the
// taken object's. The targets, resolved to kept objects, into s.final.
void sequentialClean(std::int32_t n, const CleanObject* o, double beta, CleanScratchImpl& s) {
    constexpr double kCellSize = 32.0;
    std::vector<std::int32_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [o](std::int32_t a, std::int32_t b) {
        return o[a].yLast != o[b].yLast     ? o[a].yLast < o[b].yLast
               : o[a].xFirst != o[b].xFirst ? o[a].xFirst < o[b].xFirst
                                            : a < b;
    });
    std::vector<double> flux(static_cast<std::size_t>(n)), npix(static_cast<std::size_t>(n));
    double aMax = 0.0;
    for (std::int32_t i = 0; i < n; ++i) {
        flux[i] = o[i].flux;
        npix[i] = static_cast<double>(o[i].npix);
        if (o[i].valid) aMax = std::max(aMax, o[i].a);
    }
    std::vector<std::int32_t>& final = s.final;
    final.assign(static_cast<std::size_t>(n), -1);
    std::vector<std::int64_t> seq(static_cast<std::size_t>(n), -1); // list position; -1: not in the list
    std::map<std::pair<int, int>, std::vector<std::int32_t>> cells; // the list's objects by cell
    auto cellOf = [](double v) { return static_cast<int>(std::floor(v / kCellSize)); };
    std::int64_t next = 0;
    std::vector<std::int32_t> near, victims;
    for (const std::int32_t q : order) {
        const CleanObject& oq = o[q];
        if (!oq.valid) continue;
        const double reach = kCleanZone * (oq.a + aMax);
        near.clear();
        for (int cy = cellOf(oq.my - reach); cy <= cellOf(oq.my + reach); ++cy)
            for (int cx = cellOf(oq.mx - reach); cx <= cellOf(oq.mx + reach); ++cx) {
                const auto it = cells.find({cx, cy});
                if (it == cells.end()) continue;
                for (const std::int32_t j : it->second)
                    if (seq[j] >= 0) near.push_back(j);
            }
        std::sort(near.begin(), near.end(), [&](std::int32_t a, std::int32_t b) { return seq[a] < seq[b]; });
        victims.clear();
        bool taken = false;
        for (const std::int32_t j : near) {
            const CleanObject& oj = o[j];
            const double dx = oq.mx - oj.mx, dy = oq.my - oj.my, rlim = oq.a + oj.a;
            if (!(dx * dx + dy * dy < rlim * rlim * kCleanZone * kCleanZone)) continue;
            if (flux[j] < flux[q]) {
                if (static_cast<float>(growingWing(oq, flux[q], npix[q], dx, dy, beta)) >
                    static_cast<float>(oj.mthresh))
                    victims.push_back(j);
            } else if (static_cast<float>(growingWing(oj, flux[j], npix[j], dx, dy, beta)) >
                       static_cast<float>(oq.mthresh)) {
                final[q] = j;
                flux[j] += flux[q];
                npix[j] += npix[q];
                taken = true;
                break;
            }
        }
        if (taken) continue;
        for (auto v = victims.rbegin(); v != victims.rend(); ++v) {
            final[*v] = q;
            flux[q] += flux[*v];
            npix[q] += npix[*v];
            seq[*v] = -1;
        }
        seq[q] = next++;
        cells[{cellOf(oq.mx), cellOf(oq.my)}].push_back(q);
    }
    for (std::int32_t i = 0; i < n; ++i) { // a taker taken later: its objects go to the final taker
        std::int32_t t = final[i];
        while (t >= 0 && final[t] >= 0)
            t = final[t];
        final[i] = t;
    }
}

// CLEAN of the n described objects: grid, candidate pairs, decisions; the targets into s.final.
void cleanDescribed(std::int32_t n, const CleanObject* o, int width, int height, const DetectionParams& p,
                    int threads, CleanScratchImpl& s) {
    const double beta = p.cleanParam;
    if (p.sextractorClean) return sequentialClean(n, o, beta, s);
    StepTimer timer;
    const CellGrid grid{(width + kCell - 1) / kCell, (height + kCell - 1) / kCell};
    buildGrid(n, o, grid, threads, s);
    timer.lap("CLEAN: grid");
    findCandidates(n, o, grid, beta, threads, s);
    timer.lap("CLEAN: candidate search");
    // Decide from the brightest down (filtered flux, ties: the lower index): an object is CLEANed when a
    // brighter neighbour that is itself kept has its wing above the object's mthresh; it goes to the kept
    // neighbour with the largest wing there (ties: the lower index). An object already CLEANed cleans
    // nothing, as in SExtractor, where a swallowed object leaves the list. Candidates are sorted first, so
    // the outcome does not depend on how the search was split between threads.
    groupCandidates(n, threads, s);
    decideTargets(n, o, s);
    timer.lap("CLEAN: sorts + decisions");
}

} // namespace

} // namespace gpuphot::detail
