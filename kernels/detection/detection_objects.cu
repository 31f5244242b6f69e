// The CUDA detection's per-object half up to CLEAN (see detection_objects.hpp). Every number that reaches
// the catalog is computed in the CPU's operation order: the per-pixel sums with core's isoAddRun /
// cleanAddPixel (detection_sums.hpp, -fmad=false), the functions of them (sqrt, atan2, log, pow) on the
// host with core's finishIsophotal / cleanTargetsFromSums, the deblending with core's deblendObject.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/model/flags.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/stages/detection/detection_sums.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/detection/detection_device.cuh"
#include "kernels/detection/detection_finish.hpp"
#include "kernels/detection/detection_objects.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {
namespace {

using detail::Run;

void checkLaunch(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        throw CudaError(std::string("detection objects: launching ") + what + ": " + cudaGetErrorString(e));
}

// core's detail::peakCount (capped at 2) of every root that deblendObject examines beyond its first tests (an
// area of at least 2 minArea and 2 pixels), 0 for the others: one thread per root.
__global__ void peakCountKernel(DeviceDetectionImages im, const Run* runs, const std::int64_t* start,
                                int nRoots, int minArea, std::uint8_t* peaks) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= nRoots) return;
    std::int64_t area = 0;
    for (std::int64_t j = start[k]; j < start[k + 1]; ++j)
        area += runs[j].x1 - runs[j].x0 + 1;
    int count = 0;
    if (area >= 2 * static_cast<std::int64_t>(minArea) && area >= 2) {
        for (std::int64_t j = start[k]; j < start[k + 1] && count < 2; ++j) {
            const Run r = runs[j];
            const int ya = max(0, r.y - 1), yb = min(im.height - 1, r.y + 1);
            for (std::int32_t x = r.x0; x <= r.x1; ++x) {
                const float f = im.detAt(x, r.y);
                const int xa = max(0, x - 1), xb = min(im.width - 1, x + 1);
                bool peak = true;
                for (int yy = ya; yy <= yb && peak; ++yy)
                    for (int xx = xa; xx <= xb; ++xx)
                        if (im.detAt(xx, yy) > f) {
                            peak = false;
                            break;
                        }
                if (peak && ++count >= 2) break;
            }
        }
    }
    peaks[k] = static_cast<std::uint8_t>(count);
}

// A box of the frame copied compactly (row stride w) at offset off of the gather buffers.
struct Box {
    std::int32_t x0, y0, w, h;
    std::int64_t off;
};

// The filtered image and the rms of each box: one block per box.
__global__ void gatherBoxesKernel(DeviceDetectionImages im, const Box* boxes, int nBoxes, float* det,
                                  float* rms) {
    for (int b = blockIdx.x; b < nBoxes; b += gridDim.x) {
        const Box bx = boxes[b];
        const std::int64_t n = static_cast<std::int64_t>(bx.w) * bx.h;
        for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const int x = bx.x0 + static_cast<int>(i % bx.w), y = bx.y0 + static_cast<int>(i / bx.w);
            det[bx.off + i] = im.detAt(x, y);
            rms[bx.off + i] = im.rmsAt(x, y);
        }
    }
}

__device__ void deviceCleanSums(const DeviceDetectionImages& im, const Run* r, std::int64_t nr, int k,
                                bool sexOrder, detail::CleanSums& out);

// The isophotal sums (threads 0..nObj-1) and with clean the CLEAN sums (threads nObj..2 nObj-1) of every
// object: one thread per object and kind, its runs in order, core's accumulation functions.
__global__ void objectSumsKernel(DeviceDetectionImages im, const Run* runs, const std::int64_t* start,
                                 int nObj, double gain, int k, bool clean, bool sexOrder,
                                 detail::IsoSums* iso, detail::CleanSums* cs) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const bool cleanThread = t >= nObj;
    const int i = cleanThread ? t - nObj : t;
    if (i >= nObj || (cleanThread && !clean)) return;
    const Run* r = runs + start[i];
    const std::int64_t nr = start[i + 1] - start[i];
    if (cleanThread) {
        deviceCleanSums(im, r, nr, k, sexOrder, cs[i]);
        return;
    }
    detail::IsoSums q;
    q.x0 = r[0].x0;
    q.y0 = r[0].y;
    q.xMin = r[0].x0;
    q.xMax = r[0].x1;
    q.yMin = r[0].y;
    q.yMax = r[nr - 1].y;
    for (std::int64_t j = 0; j < nr; ++j) {
        const std::int32_t y = r[j].y;
        detail::isoAddRun(q, r[j], gain, [&](std::int32_t x) {
            const std::size_t a = im.at(x, y);
            const std::uint8_t st = im.state[a];
            const float sub = (st & detail::StateBad) ? 0.0f : im.frame[a] - im.level[a];
            return detail::IsoPixel{sub, im.det ? im.det[a] : sub, im.rms[a], st, im.thresholdAt(x, y)};
        });
    }
    q.thrAtPeak = im.thresholdAt(q.detPeakX, q.detPeakY);
    iso[i] = q;
}

// core's cleanSumsOf (detection_clean.cpp) of one object: mthresh selected in a per-thread array (k <=
// kMaxMinArea); sexOrder (DetectionParams::sextractorClean): SExtractor's heap, core's sextractorMthresh
// (the (k + 1)-th pixel left out; an object of k pixels keeps its first pixel's value).
__device__ void deviceCleanSums(const DeviceDetectionImages& im, const Run* r, std::int64_t nr, int k,
                                bool sexOrder, detail::CleanSums& out) {
    detail::CleanSums c;
    c.x0 = r[0].x0;
    c.y0 = r[0].y;
    float top[kMaxMinArea];
    int count = 0;
    std::int64_t seen = 0;
    float first = 0.0f;
    for (std::int64_t j = 0; j < nr; ++j) {
        const Run rj = r[j];
        for (std::int32_t x = rj.x0; x <= rj.x1; ++x) {
            const double d = im.detAt(x, rj.y), t = im.thresholdAt(x, rj.y);
            detail::cleanAddPixel(c, x, rj.y, d, im.subAt(x, rj.y), t);
            const float v = static_cast<float>(d - t);
            if (seen == 0) first = v;
            if (!sexOrder || seen != k) detail::topKInsert(top, count, k, v);
            ++seen;
        }
    }
    if (count >= k) {
        c.mthresh = sexOrder && seen == k ? first : top[k - 1];
        c.hasMthresh = true;
    }
    for (std::int64_t j = 0; j < nr; ++j) {
        const Run rj = r[j];
        for (std::int32_t x = rj.x0; x <= rj.x1; ++x)
            detail::cleanAddPixel2(c, im.subAt(x, rj.y));
    }
    out = c;
}

int gridFor(std::size_t n, int threads) {
    return static_cast<int>(std::max<std::size_t>(1, (n + threads - 1) / threads));
}

// ---- labelling: union-find over the runs (8-connectivity), the smaller run index always the root ----------

// First and one-past-last run of each row (rows without runs keep 0, 0).
__global__ void rowRangesKernel(const Run* runs, int n, int* rowBegin, int* rowEnd) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int y = runs[i].y;
    if (i == 0 || runs[i - 1].y != y) rowBegin[y] = i;
    if (i == n - 1 || runs[i + 1].y != y) rowEnd[y] = i + 1;
}

// Volatile reads: other threads re-parent roots concurrently (never a non-root).
__device__ int findRoot(const int* parent, int i) {
    const volatile int* pv = parent;
    int p = pv[i];
    while (p != i) {
        i = p;
        p = pv[i];
    }
    return i;
}

// Hooks the larger of the two roots onto the smaller (atomicCAS: only a root is ever re-parented).
__device__ void unite(int* parent, int a, int b) {
    while (true) {
        a = findRoot(parent, a);
        b = findRoot(parent, b);
        if (a == b) return;
        if (a < b) {
            const int t = a;
            a = b;
            b = t;
        }
        const int old = atomicCAS(&parent[a], a, b);
        if (old == a) return;
    }
}

// Each run with the runs of the row above that touch it ([x0 - 1, x1 + 1] overlaps).
__global__ void uniteRunsKernel(const Run* runs, int n, const int* rowBegin, const int* rowEnd, int* parent) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const Run r = runs[i];
    if (r.y == 0) return;
    int lo = rowBegin[r.y - 1], hi = rowEnd[r.y - 1];
    while (lo < hi) { // first run of the row above with x1 >= x0 - 1
        const int mid = (lo + hi) / 2;
        if (runs[mid].x1 < r.x0 - 1)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int k = lo; k < rowEnd[r.y - 1] && runs[k].x0 <= r.x1 + 1; ++k)
        unite(parent, i, k);
}

// label = the root (the component's first run); isRoot for the component numbering.
__global__ void flattenKernel(const int* parent, int n, int* label, int* isRoot) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int r = findRoot(parent, i);
    label[i] = r;
    isRoot[i] = r == i ? 1 : 0;
}

// Area and run count of each component (integer sums: any order).
__global__ void componentSizesKernel(const Run* runs, int n, const int* label, const int* compOfRoot,
                                     unsigned long long* area, int* nRuns) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int c = compOfRoot[label[i]];
    atomicAdd(&area[c], static_cast<unsigned long long>(runs[i].x1 - runs[i].x0 + 1));
    atomicAdd(&nRuns[c], 1);
}

// nComp on the device (the component count's scan total); keep[c] stays 0 for c >= nComp.
__global__ void keepKernel(const unsigned long long* area, const int* nComp, int n, int minArea, int* keep) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < n && c < *nComp) keep[c] = area[c] >= static_cast<unsigned long long>(minArea) ? 1 : 0;
}

// Sort key of each run: its root's index among the kept components, nKept for the dropped ones.
__global__ void runKeysKernel(const int* label, const int* compOfRoot, int n, const int* keep,
                              const int* rootOfComp, int nKept, int* keys, int* index) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int c = compOfRoot[label[i]];
    keys[i] = keep[c] ? rootOfComp[c] : nKept;
    index[i] = i;
}

// Run counts of the kept components in order (the CSR's sizes).
__global__ void keptCountsKernel(const int* nRuns, const int* keep, const int* rootOfComp, int n,
                                 std::int64_t* counts) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < n && keep[c]) counts[rootOfComp[c]] = nRuns[c];
}

__global__ void gatherRunsKernel(const Run* runs, const int* order, int n, Run* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = runs[order[i]];
}

template <class T> T downloadOne(DeviceContext& dc, const T* p) {
    T v{};
    GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(&v, p, sizeof(T), cudaMemcpyDeviceToHost, dc.stream()));
    dc.synchronize();
    return v;
}

// Exclusive sum of n values into out (n + 1 of them: out[n] is the total).
template <class T> void exclusiveSum(DeviceContext& dc, const T* in, T* out, int n) {
    std::size_t bytes = 0;
    GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, n + 1, dc.stream()));
    DeviceBuffer<unsigned char> tmp(dc, std::max<std::size_t>(bytes, 1));
    GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp.get(), bytes, in, out, n + 1, dc.stream()));
}

__global__ void iotaKernel(int* v, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = i;
}

// Host working memory of detectObjects.
struct HostScratch {
    std::vector<std::int32_t> byCost;
    detail::ObjectPlan plan;
};

// What detectObjects keeps in the DeviceContext between frames (its scratch): host working memory and the
// pinned buffers of its downloads (taken before copies are queued into them: growing one synchronises).
struct ObjectsScratch {
    HostScratch host;
    std::shared_ptr<detail::CleanScratch> clean; // CLEAN's working memory, made on first use
    GrowingPinned rootStart, rootRuns;           // the roots' run offsets and runs (the device's labelling)
    GrowingPinned boxDet, boxRms;                // the multi-peak roots' boxes: filtered image, rms
    GrowingPinned rootIso, rootClean;            // the roots' sums
    GrowingPinned childIso, childClean;          // the deblended children's sums
};

// The roots' runs on the host (CSR, raster order inside each root): rr's, or the context's pinned memory.
struct HostRoots {
    const Run* runs = nullptr;
    const std::int64_t* start = nullptr;
    std::size_t n = 0; // roots
};

// core's detail::labelRoots on the device: the roots' runs (CSR, raster order inside each root) left in
// dRootRuns / dRootStart and downloaded into the scratch's pinned memory (hr; reused between frames, nothing
// zeroed). deviceRuns: the runs already on the device (the front's, deviceCount of them), else null
// (uploaded from `runs`).
void labelRootsOnDevice(DeviceContext& dc, const std::vector<Run>& runs, const Run* deviceRuns,
                        std::size_t deviceCount, int height, int minArea, HostRoots& hr,
                        DeviceBuffer<Run>& dRootRuns, DeviceBuffer<std::int64_t>& dRootStart) {
    const cudaStream_t stream = dc.stream();
    const int n = static_cast<int>(deviceRuns ? deviceCount : runs.size());
    hr = {};
    if (n == 0) return;
    const int t = 256, g = gridFor(n, t);
    DeviceBuffer<Run> uploaded;
    if (!deviceRuns) {
        uploaded = DeviceBuffer<Run>(dc, n);
        dc.uploadStaged(uploaded.get(), runs.data(), runs.size() * sizeof(Run));
    }
    const Run* const dRunsPtr = deviceRuns ? deviceRuns : uploaded.get();
    DeviceBuffer<int> rowBegin(dc, height), rowEnd(dc, height);
    rowBegin.zero();
    rowEnd.zero();
    rowRangesKernel<<<g, t, 0, stream>>>(dRunsPtr, n, rowBegin.get(), rowEnd.get());
    checkLaunch("the row ranges");
    DeviceBuffer<int> parent(dc, n), label(dc, n), isRoot(dc, n + 1), compOfRoot(dc, n + 1);
    iotaKernel<<<g, t, 0, stream>>>(parent.get(), n);
    checkLaunch("the union-find init");
    uniteRunsKernel<<<g, t, 0, stream>>>(dRunsPtr, n, rowBegin.get(), rowEnd.get(), parent.get());
    checkLaunch("the union-find");
    isRoot.zero(); // isRoot[n] = 0 for the scan
    flattenKernel<<<g, t, 0, stream>>>(parent.get(), n, label.get(), isRoot.get());
    checkLaunch("the union-find flattening");
    exclusiveSum(dc, isRoot.get(), compOfRoot.get(), n); // component of each root, in order of the roots
    // Sized for n components (at most one per run) so that the component count stays on the device.
    DeviceBuffer<unsigned long long> area(dc, n);
    DeviceBuffer<int> nRuns(dc, n), keep(dc, n + 1), rootOfComp(dc, n + 1);
    area.zero();
    nRuns.zero();
    keep.zero();
    componentSizesKernel<<<g, t, 0, stream>>>(dRunsPtr, n, label.get(), compOfRoot.get(), area.get(),
                                              nRuns.get());
    checkLaunch("the component sizes");
    keepKernel<<<g, t, 0, stream>>>(area.get(), compOfRoot.get() + n, n, minArea, keep.get());
    checkLaunch("the minimum area");
    exclusiveSum(dc, keep.get(), rootOfComp.get(), n);
    const int nKept = downloadOne(dc, rootOfComp.get() + n);
    if (nKept == 0) return;
    // Runs ordered by root, stably (raster order inside each root); the dropped components' runs last.
    DeviceBuffer<int> keys(dc, n), keysOut(dc, n), index(dc, n), order(dc, n);
    runKeysKernel<<<g, t, 0, stream>>>(label.get(), compOfRoot.get(), n, keep.get(), rootOfComp.get(), nKept,
                                       keys.get(), index.get());
    checkLaunch("the run keys");
    int bits = 1;
    while ((1 << bits) <= nKept)
        ++bits;
    std::size_t bytes = 0;
    GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys.get(), keysOut.get(), index.get(),
                                                       order.get(), n, 0, bits, stream));
    {
        DeviceBuffer<unsigned char> tmp(dc, std::max<std::size_t>(bytes, 1));
        GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp.get(), bytes, keys.get(), keysOut.get(),
                                                           index.get(), order.get(), n, 0, bits, stream));
    }
    DeviceBuffer<std::int64_t> counts(dc, nKept + 1);
    counts.zero();
    keptCountsKernel<<<g, t, 0, stream>>>(nRuns.get(), keep.get(), rootOfComp.get(), n, counts.get());
    checkLaunch("the root sizes");
    dRootStart = DeviceBuffer<std::int64_t>(dc, nKept + 1);
    exclusiveSum(dc, counts.get(), dRootStart.get(), nKept);
    ObjectsScratch& scratch = dc.scratch<ObjectsScratch>();
    auto* start = static_cast<std::int64_t*>(
        scratch.rootStart.get((static_cast<std::size_t>(nKept) + 1) * sizeof(std::int64_t)));
    dRootStart.download(start, static_cast<std::size_t>(nKept) + 1);
    dc.synchronize();
    const auto nRootRuns = static_cast<int>(start[nKept]);
    dRootRuns = DeviceBuffer<Run>(dc, nRootRuns);
    gatherRunsKernel<<<gridFor(nRootRuns, t), t, 0, stream>>>(dRunsPtr, order.get(), nRootRuns,
                                                              dRootRuns.get());
    checkLaunch("the root runs");
    auto* rootRuns =
        static_cast<Run*>(scratch.rootRuns.get(std::max<std::size_t>(1, nRootRuns) * sizeof(Run)));
    dRootRuns.download(rootRuns, static_cast<std::size_t>(nRootRuns));
    dc.synchronize();
    hr.runs = rootRuns;
    hr.start = start;
    hr.n = static_cast<std::size_t>(nKept);
}

} // namespace

namespace {
std::atomic<std::uint64_t> g_recycledStorages{0};

// The roots after the labelling and the minimum area: the host labelling's result (rr), the roots' runs on
// the host (hr: rr's, or the pinned download of the device's labelling) and on the device.
struct Roots {
    detail::RootRuns rr;
    HostRoots hr;
    DeviceBuffer<Run> dRuns;
    DeviceBuffer<std::int64_t> dStart;
};

// 2b. Labelling and the minimum area (host: the runs only), on the device (union-find); tuning
// detection.hostLabels: core's labelRoots on the host. The runs are freed.
void labelStep(DeviceContext& dc, std::vector<Run>& runs, const DeviceDetectionImages& im,
               const DetectionParams& p, bool hostLabels, Roots& roots) {
    // The front leaves the runs on the device only (runs empty, im.runCount of them) unless the host
    // labelling asked for a host copy.
    const bool onDeviceOnly = runs.empty() && im.runs && im.runCount > 0;
    if (hostLabels) {
        if (onDeviceOnly) {
            runs.resize(im.runCount);
            dc.downloadStaged(runs.data(), im.runs, im.runCount * sizeof(Run));
        }
        roots.rr = detail::labelRoots(runs, p.minArea);
        roots.hr = HostRoots{roots.rr.runs.data(), roots.rr.start.data(), roots.rr.size()};
    } else {
        const bool useDevice = im.runs && (onDeviceOnly || im.runCount == runs.size());
        labelRootsOnDevice(dc, runs, useDevice ? im.runs : nullptr, im.runCount, im.height, p.minArea,
                           roots.hr, roots.dRuns, roots.dStart);
    }
    runs = {};
}

// The result's storage (the kept objects and their measurements) made on a helper thread from here on,
// while the host mostly waits for the device and then deblends, the host loops leaving it a core while it
// works. Made: one element per root and one per 16 roots for the deblended children (a 151 MP / 134k
// frame has about one extra child per 50 roots); room for two per root (more: take() makes the storage
// afresh). The last frame's containers (their pages resident) when the finish step's release thread handed
// them back: no helper thread then.
void startStorage(DeviceContext& dc, detail::ObjectStorage& storage, std::size_t nRoots, int threads,
                  bool timing) {
    std::vector<detail::Object> ro;
    std::vector<detail::IsoMeasure> ri;
    takeRecycledObjects(dc, ro, ri);
    storage.start(nRoots + nRoots / 16, 2 * nRoots, threads, std::move(ro), std::move(ri));
    if (storage.recycled()) ++g_recycledStorages;
    if (timing)
        std::fprintf(stderr, "detection timing: result storage %s\n",
                     storage.recycled() ? "recycled (the last frame's)" : "made on a helper thread");
}

// 3. The single-peak test on the device of every root that deblendObject examines beyond its first tests
// (the host labelling's roots go up first): the roots with two or more peaks.
std::vector<std::int32_t> multiPeakRoots(DeviceContext& dc, Roots& roots, const DeviceDetectionImages& im,
                                         const DetectionParams& p, bool hostLabels) {
    const std::size_t nRoots = roots.hr.n;
    if (hostLabels) {
        roots.dRuns = DeviceBuffer<Run>(dc, roots.rr.runs.size());
        roots.dStart = DeviceBuffer<std::int64_t>(dc, roots.rr.start.size());
        dc.uploadStaged(roots.dRuns.get(), roots.rr.runs.data(), roots.rr.runs.size() * sizeof(Run));
        dc.uploadStaged(roots.dStart.get(), roots.rr.start.data(),
                        roots.rr.start.size() * sizeof(std::int64_t));
    }
    std::vector<std::int32_t> multi; // roots with two or more peaks
    if (p.deblendLevels >= 2) {
        DeviceBuffer<std::uint8_t> dPeaks(dc, nRoots);
        peakCountKernel<<<gridFor(nRoots, 128), 128, 0, dc.stream()>>>(
            im, roots.dRuns.get(), roots.dStart.get(), static_cast<int>(nRoots), p.minArea, dPeaks.get());
        checkLaunch("the peak count");
        std::vector<std::uint8_t> peaks(nRoots);
        dPeaks.download(peaks.data(), peaks.size());
        dc.synchronize();
        for (std::size_t k = 0; k < nRoots; ++k)
            if (peaks[k] >= 2) multi.push_back(static_cast<std::int32_t>(k));
    }
    return multi;
}

// The multi-peak roots' boxes (one-pixel border) and their filtered image and rms, in the scratch's
// pinned memory (null when there are none).
struct GatheredBoxes {
    std::vector<Box> boxes;
    const float* det = nullptr;
    const float* rms = nullptr;
};

// Gathers the boxes on the device and downloads them.
GatheredBoxes gatherBoxes(DeviceContext& dc, ObjectsScratch& scratch, const HostRoots& hr,
                          const std::vector<std::int32_t>& multi, const DeviceDetectionImages& im,
                          detail::StepTimer& timer) {
    GatheredBoxes g;
    std::vector<Box>& boxes = g.boxes;
    boxes.resize(multi.size());
    if (multi.empty()) return g;
    std::int64_t total = 0;
    for (std::size_t m = 0; m < multi.size(); ++m) {
        const std::int32_t k = multi[m];
        std::int32_t xMin = hr.runs[hr.start[k]].x0, xMax = hr.runs[hr.start[k]].x1;
        for (std::int64_t j = hr.start[k]; j < hr.start[k + 1]; ++j) {
            xMin = std::min(xMin, hr.runs[j].x0);
            xMax = std::max(xMax, hr.runs[j].x1);
        }
        const std::int32_t yMin = hr.runs[hr.start[k]].y, yMax = hr.runs[hr.start[k + 1] - 1].y;
        Box& b = boxes[m];
        b.x0 = std::max(0, xMin - 1);
        b.y0 = std::max(0, yMin - 1);
        b.w = std::min(im.width - 1, xMax + 1) - b.x0 + 1;
        b.h = std::min(im.height - 1, yMax + 1) - b.y0 + 1;
        b.off = total;
        total += static_cast<std::int64_t>(b.w) * b.h;
    }
    DeviceBuffer<Box> dBoxes(dc, boxes.size());
    dBoxes.upload(boxes.data(), boxes.size());
    DeviceBuffer<float> dDet(dc, static_cast<std::size_t>(total)), dRms(dc, static_cast<std::size_t>(total));
    gatherBoxesKernel<<<static_cast<int>(std::min<std::size_t>(boxes.size(), 65535)), 128, 0, dc.stream()>>>(
        im, dBoxes.get(), static_cast<int>(boxes.size()), dDet.get(), dRms.get());
    checkLaunch("the box gather");
    const auto nBoxPixels = static_cast<std::size_t>(total);
    auto* det = static_cast<float*>(scratch.boxDet.get(nBoxPixels * sizeof(float)));
    auto* rms = static_cast<float*>(scratch.boxRms.get(nBoxPixels * sizeof(float)));
    dDet.download(det, nBoxPixels);
    dRms.download(rms, nBoxPixels);
    g.det = det;
    g.rms = rms;
    dc.synchronize();
    timer.lap("box gather (device) + download");
    return g;
}

// Where the objects' sums come down (the scratch's pinned memory; clean: null without CLEAN).
struct SumsHost {
    detail::IsoSums* iso = nullptr;
    detail::CleanSums* clean = nullptr;
};

// 4. The isophotal and CLEAN sums of every root on the device (one thread per root and kind, the CPU's
// order), downloaded into the context's pinned memory (reused between frames) while the host deblends; a
// root that is not split is its own object, so these are its object's sums. The roots' device runs are
// freed (stream-ordered) behind them.
SumsHost launchRootSums(DeviceContext& dc, ObjectsScratch& scratch, Roots& roots,
                        const DeviceDetectionImages& im, const DetectionParams& p, bool cleanAny, int kTop) {
    const std::size_t nRoots = roots.hr.n;
    SumsHost h;
    h.iso = static_cast<detail::IsoSums*>(scratch.rootIso.get(nRoots * sizeof(detail::IsoSums)));
    h.clean = cleanAny
                  ? static_cast<detail::CleanSums*>(scratch.rootClean.get(nRoots * sizeof(detail::CleanSums)))
                  : nullptr;
    {
        DeviceBuffer<detail::IsoSums> dIso(dc, nRoots);
        DeviceBuffer<detail::CleanSums> dClean(dc, cleanAny ? nRoots : 0);
        objectSumsKernel<<<gridFor((cleanAny ? 2 : 1) * nRoots, 128), 128, 0, dc.stream()>>>(
            im, roots.dRuns.get(), roots.dStart.get(), static_cast<int>(nRoots), p.gain, kTop, cleanAny,
            p.sextractorClean, dIso.get(), dClean.get());
        checkLaunch("the root sums");
        dIso.download(h.iso, nRoots); // pinned: asynchronous
        if (cleanAny) dClean.download(h.clean, nRoots);
    } // freed in stream order
    roots.dRuns.reset();
    roots.dStart.reset();
    return h;
}

// GPUPHOT_DETECTION_TIMING: the blends' host times (their load balance).
void reportBlendTimes(const std::vector<double>& blendMs, const std::vector<Box>& boxes,
                      const std::vector<std::int32_t>& byCost, int deblendThreads) {
    double sum = 0.0, top = 0.0;
    std::size_t topAt = 0;
    for (std::size_t a = 0; a < blendMs.size(); ++a) {
        sum += blendMs[a];
        if (blendMs[a] > top) {
            top = blendMs[a];
            topAt = a;
        }
    }
    const Box& tb = boxes[byCost[topAt]];
    std::fprintf(stderr,
                 "detection timing: deblending: %zu blends on %d threads, %.3f ms of thread time "
                 "(%.3f ms each if even), longest %.3f ms (box %dx%d, %zu-th by box size)\n",
                 blendMs.size(), deblendThreads, sum, sum / std::max(1, deblendThreads), top, tb.w, tb.h,
                 topAt + 1);
}

// Deblending of the multi-peak roots on the host (core's deblendObject on the gathered boxes), while the
// device sums the roots: the largest boxes first, one at a time (the team's threads finish together),
// without deblendObject's peak test (the device's found two peaks or more).
std::vector<detail::DeblendOutput> deblendOnHost(HostScratch& hs, const GatheredBoxes& g,
                                                 const std::vector<std::int32_t>& multi, const HostRoots& hr,
                                                 const DeviceDetectionImages& im, const DetectionParams& p,
                                                 const detail::ObjectStorage& storage, int threads,
                                                 detail::StepTimer& timer) {
    const std::vector<Box>& boxes = g.boxes;
    std::vector<std::int32_t>& byCost = hs.byCost;
    byCost.resize(multi.size());
    for (std::size_t m = 0; m < multi.size(); ++m)
        byCost[m] = static_cast<std::int32_t>(m);
    std::sort(byCost.begin(), byCost.end(), [&](std::int32_t x, std::int32_t y) {
        const std::int64_t ax = static_cast<std::int64_t>(boxes[x].w) * boxes[x].h;
        const std::int64_t ay = static_cast<std::int64_t>(boxes[y].w) * boxes[y].h;
        return ax > ay || (ax == ay && x < y);
    });
    std::vector<detail::DeblendOutput> deblended(multi.size());
    // GPUPHOT_DETECTION_TIMING: each blend's host time (its load balance).
    std::vector<double> blendMs(timer.on() ? multi.size() : 0);
    const int deblendThreads = storage.teamThreads(threads);
    detail::parallelFor(multi.size(), deblendThreads, 1, [&](std::int64_t at) {
        using Clock = std::chrono::steady_clock;
        const Clock::time_point t0 = blendMs.empty() ? Clock::time_point{} : Clock::now();
        const std::int32_t m = byCost[at];
        const Box& b = boxes[m];
        const std::int32_t root = multi[m];
        detail::DetectionImages bim;
        bim.width = im.width;
        bim.height = im.height;
        bim.det = ImageView{g.det + b.off, b.w, b.h, b.w};
        bim.rms = ImageView{g.rms + b.off, b.w, b.h, b.w};
        bim.originX = b.x0;
        bim.originY = b.y0;
        bim.threshold = im.threshold;
        bim.absolute = im.absolute;
        const std::vector<Run> runsOfRoot(hr.runs + hr.start[root], hr.runs + hr.start[root + 1]);
        detail::deblendObject(runsOfRoot, bim, p, deblended[m], false);
        if (!blendMs.empty())
            blendMs[at] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    });
    timer.lap("deblending (host)");
    if (!blendMs.empty()) reportBlendTimes(blendMs, boxes, byCost, deblendThreads);
    return deblended;
}

// The children's sums on the device (after the roots' in stream order), then everything downloaded; returns
// with the stream synchronised.
void childSums(DeviceContext& dc, const detail::ObjectPlan& plan, const SumsHost& child,
               const DeviceDetectionImages& im, const DetectionParams& p, bool cleanAny, int kTop) {
    const std::size_t nChildren = plan.nChildren;
    if (nChildren == 0) {
        dc.synchronize();
        return;
    }
    const std::vector<Run>& childRuns = plan.childRuns;
    const std::vector<std::int64_t>& childStart = plan.childStart;
    DeviceBuffer<Run> dRuns(dc, childRuns.size());
    DeviceBuffer<std::int64_t> dStart(dc, childStart.size());
    DeviceBuffer<detail::IsoSums> dIso(dc, nChildren);
    DeviceBuffer<detail::CleanSums> dClean(dc, cleanAny ? nChildren : 0);
    dc.uploadStaged(dRuns.get(), childRuns.data(), childRuns.size() * sizeof(Run));
    dc.uploadStaged(dStart.get(), childStart.data(), childStart.size() * sizeof(std::int64_t));
    objectSumsKernel<<<gridFor((cleanAny ? 2 : 1) * nChildren, 128), 128, 0, dc.stream()>>>(
        im, dRuns.get(), dStart.get(), static_cast<int>(nChildren), p.gain, kTop, cleanAny, p.sextractorClean,
        dIso.get(), dClean.get());
    checkLaunch("the children's sums");
    dIso.download(child.iso, nChildren);
    if (cleanAny) dClean.download(child.clean, nChildren);
    dc.synchronize(); // before the host buffers are freed
}

} // namespace

std::uint64_t recycledStorages() {
    return g_recycledStorages.load();
}

bool detectObjectsOnDevice(const DetectionParams& p) {
    return p.minArea >= 1 && p.minArea <= kMaxMinArea;
}

detail::DetectedObjects detectObjects(DeviceContext& dc, std::vector<Run> runs,
                                      const DeviceDetectionImages& im, const DetectionParams& p,
                                      RunContext& ctx) {
    detail::StepTimer timer;
    const int threads = ctx.threadCount();
    detail::DetectedObjects result;

    Roots roots;
    const bool hostLabels = dc.tuning().detection.hostLabels;
    labelStep(dc, runs, im, p, hostLabels, roots);
    const std::size_t nRoots = roots.hr.n;
    result.nBeforeDeblend = nRoots;
    timer.lap("labelling + minimum area");
    ctx.report("detection", 0.35);
    ctx.checkCancelled();
    if (nRoots == 0) return result;
    detail::ObjectStorage storage;
    startStorage(dc, storage, nRoots, threads, timer.on());

    const std::vector<std::int32_t> multi = multiPeakRoots(dc, roots, im, p, hostLabels);
    timer.lap("peak count (device)");
    // Host working memory and pinned buffers kept in the context between frames (not faulted in afresh).
    ObjectsScratch& scratch = dc.scratch<ObjectsScratch>();
    HostScratch& hs = scratch.host;
    const GatheredBoxes boxes = gatherBoxes(dc, scratch, roots.hr, multi, im, timer);

    const bool cleanAny = p.clean && p.cleanParam > 0.0;
    const int kTop = std::max(1, p.minArea); // CLEAN's mthresh: the kTop-th largest pixel
    const SumsHost rootSums = launchRootSums(dc, scratch, roots, im, p, cleanAny, kTop);
    timer.lap("root sums launched");

    std::vector<detail::DeblendOutput> deblended =
        deblendOnHost(hs, boxes, multi, roots.hr, im, p, storage, threads, timer);
    // The objects in root order, children in deblending order (as core's detectObjects); the children of the
    // split roots numbered in that order for their sums. The roots' runs stay in the pinned download, the
    // children's in `deblended` (taken over by the kept objects).
    detail::ObjectPlan& plan = hs.plan;
    plan.plan(nRoots, multi, deblended);
    const std::size_t nChildren = plan.nChildren;
    SumsHost childHost;
    childHost.iso = static_cast<detail::IsoSums*>(
        scratch.childIso.get(std::max<std::size_t>(1, nChildren) * sizeof(detail::IsoSums)));
    childHost.clean = cleanAny ? static_cast<detail::CleanSums*>(scratch.childClean.get(
                                     std::max<std::size_t>(1, nChildren) * sizeof(detail::CleanSums)))
                               : nullptr;
    plan.fill(roots.hr.runs, roots.hr.start, deblended, rootSums.iso, rootSums.clean, childHost.iso,
              childHost.clean, storage.teamThreads(threads));
    const std::size_t nObj = plan.nObjects;
    result.nDeblended = nObj;
    timer.lap("objects (host)");
    ctx.report("detection", 0.6);
    ctx.checkCancelled();

    childSums(dc, plan, childHost, im, p, cleanAny, kTop);
    timer.lap("sums (device) + download");

    // The measurements, CLEAN and its merge on the host from the sums; CLEAN's working memory kept in the
    // context between frames.
    if (!scratch.clean) scratch.clean = detail::makeCleanScratch();
    const bool clean = cleanAny && nObj >= 2;
    detail::finishObjectsFromSums(nObj, plan.objects.data(), plan.isoOf.data(),
                                  clean ? plan.cleanOf.data() : nullptr, im.width, im.height, p, threads,
                                  result, scratch.clean.get(), &storage);
    return result;
}

} // namespace gpuphot::cuda
