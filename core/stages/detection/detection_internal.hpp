#pragma once
// Internals of the detection stage shared by detection*.cpp (not a public API).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/model/image.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/util/prefault.hpp"
#include "core/util/step_timer.hpp"

namespace gpuphot {
class RunContext;
}

namespace gpuphot::detail {

// Empty when the detection stage takes these inputs, else the InvalidInput message it throws (image,
// mask and background sizes, every parameter's range). The one check of both engines: the CUDA engine
// hands whatever fails it to the CPU stage, which throws.
std::string inputProblem(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                         const DetectionParams& p);

// Step times of the detection stage on stderr when its timing is on (tuning detection.timing, a development
// aid: "detection timing: <step> <ms> ms"), measured from the previous lap.
class StepTimer : public StepLaps {
public:
    StepTimer() : StepLaps(StepTiming::Detection, "detection") {}
};

// Storage for n elements of a trivially destructible T, left uninitialised: the parallel loop that constructs
// them (placement new at data() + i) faults its pages in on every thread, where std::vector<T>(n) zeroes them
// on one (about 2 GB/s: milliseconds for the ~10 MB of a 60k-object frame). Kept between
// calls (reserve), it is not faulted in again.
template <class T> class UninitArray {
    static_assert(std::is_trivially_destructible_v<T>);

public:
    UninitArray() = default;
    explicit UninitArray(std::size_t n) { reserve(n); }
    // Storage for at least n elements (what it held is lost when it grows).
    void reserve(std::size_t n) {
        if (m_bytes && n <= m_capacity) return;
        m_bytes.reset(new std::byte[(n > 0 ? n : 1) * sizeof(T)]);
        m_capacity = n;
    }
    T* data() { return reinterpret_cast<T*>(m_bytes.get()); }
    const T* data() const { return reinterpret_cast<const T*>(m_bytes.get()); }

private:
    std::unique_ptr<std::byte[]> m_bytes;
    std::size_t m_capacity = 0;
};

// A horizontal run of object pixels [x0, x1] (inclusive) in row y.
struct Run {
    std::int32_t y, x0, x1;
};

// 8-connected components of runs sorted in raster order (y, then x0), non-overlapping. Returns the
// component of each run; components are numbered 0.. in order of their first run (raster order of
// their first pixel). Independent of any thread count.
std::vector<std::int32_t> labelRuns(const Run* runs, std::size_t n, std::int32_t& nComponents);
// The same into the caller's buffers (label: the result; parent: working memory), kept between calls.
void labelRunsInto(const Run* runs, std::size_t n, std::vector<std::int32_t>& parent,
                   std::vector<std::int32_t>& label, std::int32_t& nComponents);
// The same labels from bands of whole rows labelled on their own threads, their seams joined after: a
// component's root is its smallest run index either way, and components are numbered in root order.
// Band b holds the runs [start[b], start[b + 1]); the components whose first run lies in band b are
// numbered [firstLabel[b], firstLabel[b + 1]).
struct BandLabels {
    std::vector<std::int32_t> label;
    std::int32_t nComponents = 0;
    std::vector<std::size_t> start;
    std::vector<std::int32_t> firstLabel;
};
constexpr std::size_t kLabelBandRuns = 1 << 16; // runs per band at least (smaller inputs: one band)
BandLabels labelRunsInBands(const Run* runs, std::size_t n, int threads);

inline std::int64_t runsArea(const std::vector<Run>& runs) {
    std::int64_t a = 0;
    for (const Run& r : runs)
        a += r.x1 - r.x0 + 1;
    return a;
}

// Per-pixel state bits.
enum PixelState : std::uint8_t {
    StateBad = 1,       // value replaced by 0 (background), may belong to an object
    StateInvalid = 2,   // never detected
    StateSaturated = 4, // MaskSaturated or raw value >= saturation level
};

struct DetectionImages {
    int width = 0, height = 0;
    ImageView sub; // background-subtracted, bad pixels 0
    ImageView det; // filtered sub (== sub without filter)
    ImageView rms; // empty when rmsSampler gives the rms map
    const BackgroundSampler* rmsSampler = nullptr;
    ImageViewT<std::uint8_t> state;
    double threshold = 0.0;
    bool absolute = false;
    // Owner of det's pixels when detectFromRuns may take them once no step reads them (null: kept): the
    // segmentation map takes them over.
    Image<float>* releasableDet = nullptr;
    // Image coordinates of the views' pixel (0, 0): non-zero for compact copies of a part of the frame
    // (the CUDA backend's deblending of gathered boxes); read through detAt and rmsAt.
    int originX = 0, originY = 0;

    float detAt(int x, int y) const { return det(x - originX, y - originY); }
    float rmsAt(int x, int y) const {
        return rms.data ? rms(x - originX, y - originY) : rmsSampler->rmsAt(x, y);
    }
    double thresholdAt(int x, int y) const {
        return absolute ? threshold : threshold * static_cast<double>(rmsAt(x, y));
    }
    bool above(int x, int y) const {
        return !(state(x, y) & StateInvalid) && static_cast<double>(det(x, y)) > thresholdAt(x, y);
    }
};

// Pixels of the region whose filtered value is >= all 8 neighbours in the image (counting stops at 2).
// Every part of a split holds its own maximum, which is such a pixel, so a region with fewer than 2
// never splits (deblendObject returns it whole).
int peakCount(const std::vector<Run>& root, const DetectionImages& im);

// Deblending of one connected region.
struct DeblendOutput {
    std::vector<std::vector<Run>> children; // one entry (the root itself) when not split
    bool split = false;
    bool overflow = false;
};
// peakShortcut = false skips the peakCount test; freezeSinglePeak = false examines at every level the
// branches that hold a single local maximum of the region, which never split
// (tests/core/detection_peaks_test.cpp checks that neither changes the result).
void deblendObject(const std::vector<Run>& root, const DetectionImages& im, const DetectionParams& p,
                   DeblendOutput& out, bool peakShortcut = true, bool freezeSinglePeak = true);

// Isophotal measurements of one object (all pixels of its footprint, raster order, double sums).
struct IsoMeasure {
    double flux = 0.0, fluxVar = 0.0;
    std::int32_t area = 0; // the footprint's pixels
    std::int32_t isoArea =
        0; // the catalog's area_iso: area, or (sextractorIso) the pixels above the threshold
    double xIso = 0.0, yIso = 0.0, x2 = 0.0, y2 = 0.0, xy = 0.0, a = 0.0, b = 0.0, theta = 0.0;
    double cxx = 0.0, cyy = 0.0, cxy = 0.0; // r^2 = cxx dx^2 + cyy dy^2 + cxy dx dy, in units of sigma
    double peak = 0.0;                      // unfiltered
    double detPeak = 0.0;                   // filtered
    std::int32_t detPeakX = 0, detPeakY = 0;
    double thrAtPeak = 0.0;
    std::int32_t xMin = 0, xMax = 0, yMin = 0, yMax = 0;
    std::uint32_t flags = 0; // saturated, edge, bad pixels
};
IsoMeasure measureIsophotal(const std::vector<Run>& runs, const DetectionImages& im,
                            const DetectionParams& p);

// measureIsophotal in two halves: the per-pixel sums (detection_sums.hpp's isoAddRun over the runs in
// order; also computed by the CUDA per-object kernels) and the measurement made from them.
struct IsoSums {
    double x0 = 0.0, y0 = 0.0;                                     // the first pixel (reference for the sums)
    double s = 0, sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;       // value-weighted
    double ds = 0, dsx = 0, dsy = 0, dsxx = 0, dsyy = 0, dsxy = 0; // weighted by the filtered value
    double nAbove = 0; // pixels whose unfiltered value is above the threshold
    double n = 0, nx = 0, ny = 0, nxx = 0, nyy = 0, nxy = 0; // unweighted (fallback)
    double var = 0;
    double peak = -std::numeric_limits<double>::infinity();
    double detPeak = -std::numeric_limits<double>::infinity();
    std::int32_t detPeakX = 0, detPeakY = 0;
    double thrAtPeak = 0.0;
    std::int32_t xMin = 0, xMax = 0, yMin = 0, yMax = 0;
    std::uint8_t stateOr = 0;
};
IsoSums accumulateIsophotal(const std::vector<Run>& runs, const DetectionImages& im,
                            const DetectionParams& p);
// sextractorIso: DetectionParams::sextractorIso (barycentre and shape from the filtered-value sums, isoArea
// the pixels above the threshold).
IsoMeasure finishIsophotal(const IsoSums& sums, int width, int height, bool sextractorIso);

// Windowed centroid (XWIN/YWIN) and its error.
struct WindowResult {
    double x = 0.0, y = 0.0, xErr = 0.0, yErr = 0.0;
};
WindowResult measureWindowed(const IsoMeasure& m, const std::vector<Run>& runs, std::int32_t segId,
                             const Image<std::int32_t>& seg, const DetectionImages& im,
                             const DetectionParams& p);

struct CleanSums;
// Working memory of CLEAN (the objects' descriptions, the grid, the candidates) that a caller may keep
// between frames (the CUDA stage keeps one in its DeviceContext) so that it is not faulted in afresh each
// time (milliseconds at 60k objects). Opaque: makeCleanScratch() makes one; one call at a time.
struct CleanScratch {
    virtual ~CleanScratch() = default;
};
std::shared_ptr<CleanScratch> makeCleanScratch();
// CLEAN from the CLEAN sums of n objects (detection_sums.hpp; sums[i] those of object i): what cleanTargets
// does after describing the footprints. scratch: null, or kept memory (makeCleanScratch).
std::vector<std::int32_t> cleanTargetsFromSums(std::size_t n, const CleanSums* const* sums, int width,
                                               int height, const DetectionParams& p, int threads,
                                               CleanScratch* scratch = nullptr);
// The CLEAN sums of one footprint (both passes; mthresh by selection, any minArea).
CleanSums cleanSumsOf(const std::vector<Run>& runs, const DetectionImages& im, const DetectionParams& p);

// CLEAN: for each object the index of the brighter object it is merged into, or -1.
std::vector<std::int32_t> cleanTargets(const std::vector<IsoMeasure>& m, const DetectionImages& im,
                                       const DetectionParams& p, int threads);
// The same with the objects' footprints given (index as m), so they need not be rebuilt from the images.
std::vector<std::int32_t> cleanTargets(const std::vector<IsoMeasure>& m,
                                       const std::vector<const std::vector<Run>*>& footprints,
                                       const DetectionImages& im, const DetectionParams& p, int threads);

// One object (a deblended branch, or a region that was not split): its pixels as runs in raster order.
struct Object {
    std::vector<Run> runs;
    std::uint32_t flags = 0; // FlagBlended, FlagDeblendOverflow
};

// Steps 2b-4 of the per-object half: the objects after labelling, minimum area, deblending and CLEAN,
// with their isophotal measurements (any order; finishDetection sorts them).
struct DetectedObjects {
    std::vector<Object> objects;
    std::vector<IsoMeasure> iso; // index as objects
    std::size_t nBeforeDeblend = 0, nDeblended = 0, nCleaned = 0;
};
DetectedObjects detectObjects(std::vector<Run> runs, const DetectionImages& im, const DetectionParams& p,
                              RunContext& ctx);
// The last part of detectObjects: objects[i] with target[i] >= 0 (cleanTargets) merged into
// objects[target[i]] (flux, area, extent, flags added; runs re-sorted), then removed; fills `out`.
void applyClean(std::vector<Object> objects, std::vector<IsoMeasure> iso,
                const std::vector<std::int32_t>& target, DetectedObjects& out);
// CLEAN's merge of the measurement v of a CLEANed object into the kept object's e (applyClean): as
// SExtractor, e takes v's flux, area and extent but keeps its own position and shape.
inline void cleanMerge(IsoMeasure& e, const IsoMeasure& v) {
    e.flux += v.flux;
    e.fluxVar += v.fluxVar;
    e.area += v.area;
    e.isoArea += v.isoArea;
    e.peak = std::max(e.peak, v.peak);
    e.xMin = std::min(e.xMin, v.xMin);
    e.xMax = std::max(e.xMax, v.xMax);
    e.yMin = std::min(e.yMin, v.yMin);
    e.yMax = std::max(e.yMax, v.yMax);
    e.flags |= v.flags;
}
// The storage of detectObjects' result (the kept objects and their measurements: ~13 MB at 60k objects, whose
// fresh pages take one thread milliseconds to fault in), made on a helper thread beside the caller's work.
class ObjectStorage {
public:
    ObjectStorage() = default;
    ~ObjectStorage() { join(); }
    ObjectStorage(const ObjectStorage&) = delete;
    ObjectStorage& operator=(const ObjectStorage&) = delete;
    // Starts making `count` value-initialised objects and measurements (room for `capacity`) on a helper
    // thread; nothing when threads <= 1, count < 4096 or no thread can be made (take() makes them then).
    void start(std::size_t count, std::size_t capacity, int threads);
    // The same with the containers of an earlier result (pages already resident, e.g. handed back by the
    // CUDA finish step's release thread): adopted when both have room for `count` (no helper thread; their
    // elements keep stale values, which finishObjectsFromSums overwrites: every kept object's flags, runs
    // and measurement), else freed and start(count, capacity, threads).
    void start(std::size_t count, std::size_t capacity, int threads, std::vector<Object>&& recycledObjects,
               std::vector<IsoMeasure>&& recycledIso);
    // Whether the storage came from recycled containers (tests, timing).
    bool recycled() const { return m_recycled; }
    // Whether the helper thread is still at work (the caller may leave it a core: teamThreads).
    bool busy() const { return m_busy.load(std::memory_order_acquire); }
    int teamThreads(int threads) const { return busy() && threads > 2 ? threads - 1 : threads; }
    // Joins the helper; n value-initialised objects and measurements (the helper's where it made room for
    // them, else made here with their fresh pages faulted in by `threads` threads); recycled ones (start's
    // second form) hold stale values within their old size.
    void take(std::size_t n, int threads, std::vector<Object>& objects, std::vector<IsoMeasure>& iso);

private:
    void join() {
        if (m_thread.joinable()) m_thread.join();
    }
    std::vector<Object> m_objects;
    std::vector<IsoMeasure> m_iso;
    std::thread m_thread;
    std::atomic<bool> m_busy{false};
    bool m_recycled = false;
};

// An object before CLEAN for finishObjectsFromSums: its runs (raster order) at runs[0 .. nRuns), and `owned`,
// when not null, a vector holding them that the kept object takes over (else they are copied).
struct ObjectRuns {
    const Run* runs = nullptr;
    std::size_t nRuns = 0;
    std::vector<Run>* owned = nullptr;
    std::uint32_t flags = 0;
};

// The objects after deblending in detectObjects' order (the roots in order, a split root's children in
// deblending order) for finishObjectsFromSums, from the roots' runs (CSR) and the deblending of the
// multi-peak roots (root multi[m] deblended into deblended[m]; the other roots are not split): the CUDA
// per-object half, whose sums the device makes. Kept between frames, its memory is not faulted in afresh.
struct ObjectPlan {
    std::vector<std::int32_t> multiOf;     // per root: m, or -1
    std::vector<std::int64_t> childFirst;  // per m: its first child among the split roots' children
    std::vector<std::int64_t> firstObject; // per root: its first object (CSR over the roots)
    std::vector<std::int64_t> childStart;  // per child: its first run in childRuns (CSR)
    std::vector<Run> childRuns;            // the split roots' children's runs, in child order
    UninitArray<ObjectRuns> objects;       // [0, nObjects)
    UninitArray<const IsoSums*> isoOf;     // the sums of each object
    UninitArray<const CleanSums*> cleanOf; // null where no CLEAN sums are given
    std::size_t nObjects = 0, nChildren = 0;

    // Numbers the objects and the children of the split roots (multiOf, childFirst, firstObject, nObjects,
    // nChildren).
    void plan(std::size_t nRoots, const std::vector<std::int32_t>& multi,
              const std::vector<DeblendOutput>& deblended);
    // After plan: objects (a root that is not split by its runs in rootRuns, the children by theirs in
    // `deblended`, which must outlive the objects), their sums (root r's at rootIso[r], rootClean[r], child
    // q's at childIso[q], childClean[q]; the clean ones may be null), and childStart, childRuns.
    void fill(const Run* rootRuns, const std::int64_t* rootStart, std::vector<DeblendOutput>& deblended,
              const IsoSums* rootIso, const CleanSums* rootClean, const IsoSums* childIso,
              const CleanSums* childClean, int threads);
};

// The end of detectObjects from the objects' sums (the CUDA per-object half; isoSums[i], cleanSums[i] those
// of objects[i]): CLEAN from cleanSums (null when p.clean is off, or there are fewer than 2 objects or no
// cleanParam: nothing is CLEANed), then the measurements of the kept objects (finishIsophotal) with the
// CLEANed ones merged in, built compacted and in parallel. Fills `out` as applyClean(objects, the
// finishIsophotal of every object, the CLEAN targets, out) does.
void finishObjectsFromSums(std::vector<Object> objects, const IsoSums* const* isoSums,
                           const CleanSums* const* cleanSums, int width, int height, const DetectionParams& p,
                           int threads, DetectedObjects& out, CleanScratch* scratch = nullptr);
// The same from n objects given by their runs (objects[i]; runs read, or taken over, while the kept objects
// are built). storage: the result's storage started by the caller with room for the kept objects (else made
// here), or null (started here).
void finishObjectsFromSums(std::size_t n, const ObjectRuns* objects, const IsoSums* const* isoSums,
                           const CleanSums* const* cleanSums, int width, int height, const DetectionParams& p,
                           int threads, DetectedObjects& out, CleanScratch* scratch = nullptr,
                           ObjectStorage* storage = nullptr);

// The 8-connected components of `runs` (raster order) with at least minArea pixels, in order of their first
// run, as CSR: the runs of root k are runs[start[k] .. start[k + 1]) in raster order.
struct RootRuns {
    std::vector<Run> runs;
    std::vector<std::int64_t> start{0};
    std::size_t size() const { return start.size() - 1; }
};
// The components of at least minArea pixels, each with its runs in raster order, components in order of
// their first run; the same for any thread count.
RootRuns labelRoots(const std::vector<Run>& runs, int minArea, int threads = 1);

// body(i) for i = 0..n-1 on `threads` OpenMP threads in dynamic chunks (each i writes only its own slot); for
// callers compiled without OpenMP (the CUDA sources).
void parallelFor(std::size_t n, int threads, int chunk, const std::function<void(std::int64_t)>& body);

// Background subtraction, pixel states, the matched filter and the runs above threshold (the CPU
// detection's step 1): sub, state, filtered (empty without a filter) own the pixels that im views.
struct PreparedDetection {
    Image<float> sub, filtered;
    Image<std::uint8_t> state;
    std::vector<Run> runs;
    DetectionImages im;
    int width = 0, height = 0;
    bool filter = false; // det is `filtered` (else `sub`)
};
void prepareDetection(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                      const DetectionParams& p, int threads, PreparedDetection& out);
// The views of prep's images with bkg's rms and p's threshold (releasableDet null).
DetectionImages detectionImagesOf(const PreparedDetection& prep, const BackgroundResult& bkg,
                                  const DetectionParams& p);
// Steps 5-6: final order (first pixel in raster order), segmentation map, windowed positions, the Sources
// columns. The segmentation map takes over im.releasableDet's pixels.
void finishDetection(DetectedObjects found, const DetectionImages& im, const DetectionParams& p,
                     RunContext& ctx, DetectionResult& result);

// The per-object half of detection, shared by the CPU and CUDA backends: labels the above-threshold runs
// (raster order), applies the minimum area, deblends, measures, cleans and fills the result. `im` must
// stay valid for the call; `runs` is consumed.
DetectionResult detectFromRuns(std::vector<Run> runs, const DetectionImages& im, const DetectionParams& p,
                               RunContext& ctx);

} // namespace gpuphot::detail
