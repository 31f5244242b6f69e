// Steps 5-6 of the detection stage on the GPU, bitwise core's detail::finishDetection:
//   - the objects (found's order) go up once: runs as CSR, pixel offsets, the window inputs (one pinned
//     buffer packed by several host threads, one copy);
//   - final order: first pixel in raster order, a radix sort of the keys y * width + x0 (unique: the
//     objects are disjoint), its inverse gives each object's id;
//   - segmentation map: zeroed, then one warp per object writes its id over its runs;
//   - windowed positions: the growth curve needs each object's pixels in order of distance from the
//     barycentre with ties in raster order (the CPU's stable sort): a stable segmented sort of (r^2, value)
//     pairs written in raster order; then one thread per object walks its curve and iterates the window,
//     the arithmetic of core/stages/detection_window.hpp (-fmad=false, doubles, the same exp);
//   - the order and the windowed positions come down; the host fills the Sources columns, and the
//     segmentation map is downloaded while the device copy stays cached for the aperture stage.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/detection_window.hpp"
#include "kernels/detection_device.cuh"
#include "kernels/detection_finish.hpp"
#include "kernels/detection_finish_pack.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {
namespace {

using detail::Run;
using detail::WindowObject;
using detail::WindowResult;

constexpr int kWarp = 32;

__global__ void firstPixelKernel(const Run* runs, const std::int64_t* runStart, std::int64_t n, int width,
                                 std::uint64_t* keys, std::int32_t* index) {
    const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const Run r = runs[runStart[i]];
    keys[i] = static_cast<std::uint64_t>(r.y) * static_cast<std::uint64_t>(width) + static_cast<std::uint64_t>(r.x0);
    index[i] = static_cast<std::int32_t>(i);
}

__global__ void rankKernel(const std::int32_t* order, std::int64_t n, std::int32_t* id) {
    const std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
    if (k < n) id[order[k]] = static_cast<std::int32_t>(k + 1);
}

// One warp per object: its id over its runs.
__global__ void segmentationKernel(const Run* runs, const std::int64_t* runStart, std::int64_t n,
                                   const std::int32_t* id, int width, std::int32_t* seg) {
    const std::int64_t i = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (i >= n) return;
    const std::int32_t v = id[i];
    for (std::int64_t q = runStart[i]; q < runStart[i + 1]; ++q) {
        const Run r = runs[q];
        std::int32_t* row = seg + static_cast<std::size_t>(r.y) * static_cast<std::size_t>(width);
        for (std::int32_t x = r.x0 + lane; x <= r.x1; x += kWarp)
            row[x] = v;
    }
}

// One warp per object: (r^2, value) of its pixels in raster order at its pixel offset.
__global__ void growthPixelsKernel(const Run* runs, const std::int64_t* runStart, const std::int64_t* pixStart,
                                   const WindowObject* obj, std::int64_t n, DeviceDetectionImages im,
                                   double* r2, float* value) {
    const std::int64_t i = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
    const int lane = threadIdx.x % kWarp;
    if (i >= n) return;
    const WindowObject m = obj[i];
    std::int64_t out = pixStart[i];
    for (std::int64_t q = runStart[i]; q < runStart[i + 1]; ++q) {
        const Run r = runs[q];
        for (std::int32_t x = r.x0 + lane; x <= r.x1; x += kWarp) {
            const std::int64_t o = out + (x - r.x0);
            r2[o] = detail::windowR2(m, x, r.y);
            value[o] = im.subAt(x, r.y);
        }
        out += r.x1 - r.x0 + 1;
    }
}

struct DeviceWindowRow {
    const DeviceDetectionImages* im;
    const std::int32_t* segRow;
    int y;
    __device__ float sub(int x) const { return im->subAt(x, y); }
    __device__ float rms(int x) const { return im->rmsAt(x, y); }
    __device__ std::uint8_t state(int x) const { return im->stateAt(x, y); }
    __device__ std::int32_t seg(int x) const { return segRow[x]; }
};
struct DeviceWindowImage {
    const DeviceDetectionImages* im;
    const std::int32_t* seg;
    __device__ DeviceWindowRow row(int y) const {
        return {im, seg + static_cast<std::size_t>(y) * static_cast<std::size_t>(im->width), y};
    }
};

// One warp per object in final order k. Every lane walks the sorted growth curve (the same loads: broadcast)
// to the half-light radius and keeps the window state (uniform); each iteration's box is taken 32 pixels
// (raster order) at a time, the lanes compute their pixel's terms and lane 0 adds them in lane order, so
// the sums are the CPU's, pixel after pixel.
constexpr int kWindowWarps = 4; // warps per block
__global__ void windowKernel(const std::int32_t* order, const std::int64_t* pixStart, const WindowObject* obj,
                             const double* r2, const float* value, std::int64_t n, DeviceDetectionImages im,
                             const std::int32_t* seg, detail::WindowConfig cfg, WindowResult* out) {
    // Raw storage: a __shared__ array of a class with member initialisers is not allowed.
    __shared__ alignas(alignof(detail::WindowSums)) unsigned char raw[sizeof(detail::WindowSums) * kWindowWarps * kWarp];
    auto* terms = reinterpret_cast<detail::WindowSums(*)[kWarp]>(raw);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const std::int64_t k = blockIdx.x * static_cast<std::int64_t>(kWindowWarps) + warp;
    if (k >= n) return; // the whole warp
    const std::int32_t i = order[k];
    const std::int32_t id = static_cast<std::int32_t>(k + 1);
    const WindowObject m = obj[i];
    const std::int64_t p0 = pixStart[i];
    const double* kr2 = r2 + p0;
    const float* kv = value + p0;
    const double half = detail::halfLightRadiusSorted(m, pixStart[i + 1] - p0,
                                                      [&](std::int64_t j, double& a, double& v) {
                                                          a = kr2[j];
                                                          v = kv[j];
                                                      });
    const DeviceWindowImage img{&im, seg};
    detail::WindowState s = detail::windowStart(m, half, cfg);
    const int iterations = detail::windowIterations(cfg);
    for (int it = 0; it < iterations; ++it) {
        int xa = 0, xb = -1, ya = 0, yb = -1;
        if (!detail::windowBox(s, cfg, xa, xb, ya, yb)) break;
        const int bw = xb - xa + 1, bh = yb - ya + 1;
        const std::int64_t count = bw > 0 && bh > 0 ? static_cast<std::int64_t>(bw) * bh : 0;
        detail::WindowSums q;
        for (std::int64_t base = 0; base < count; base += kWarp) {
            const std::int64_t j = base + lane;
            bool use = false;
            if (j < count) {
                const int yy = ya + static_cast<int>(j / bw), xx = xa + static_cast<int>(j % bw);
                use = detail::windowTerms(s, cfg, id, img.row(yy), xx, yy, terms[warp][lane]);
            }
            const unsigned used = __ballot_sync(0xffffffffu, use);
            __syncwarp();
            if (lane == 0)
                for (int b = 0; b < kWarp; ++b)
                    if (used & (1u << b)) detail::windowAdd(q, terms[warp][b]);
            __syncwarp();
        }
        q.sw = __shfl_sync(0xffffffffu, q.sw, 0);
        q.swx = __shfl_sync(0xffffffffu, q.swx, 0);
        q.swy = __shfl_sync(0xffffffffu, q.swy, 0);
        q.sex = __shfl_sync(0xffffffffu, q.sex, 0);
        q.sey = __shfl_sync(0xffffffffu, q.sey, 0);
        if (!detail::windowStep(s, q, cfg)) break;
    }
    if (lane == 0) out[k] = detail::windowFinish(m, s);
}

unsigned blocksFor(std::int64_t threads, int block) {
    return static_cast<unsigned>((threads + block - 1) / block);
}

// The device segmentation map kept after finishDetection, with the identity of its host download.
// The key alone could match another map of the same size later allocated at the same address (maps are
// mostly zeros, and the key samples a few thousand pixels), so each object's first pixel and id are kept
// too and checked on the host map before the device copy is used.
struct SegmentationCache {
    DeviceBuffer<std::int32_t> map;
    ViewKey key;
    std::vector<std::int64_t> firstPixel; // y * width + x0 of object k (final order), id k + 1
    void clear() {
        map = {};
        key = {};
        firstPixel.clear();
    }
};
SegmentationCache& segmentationCache(DeviceContext& dc) {
    std::shared_ptr<void>& s = dc.stageState("detection.segmentation");
    if (!s) s = std::make_shared<SegmentationCache>();
    return *static_cast<SegmentationCache*>(s.get());
}

} // namespace

void finishDetection(DeviceContext& dc, detail::DetectedObjects found, const DeviceDetectionImages& im,
                     const DetectionParams& p, RunContext& ctx, DetectionResult& result) {
    detail::StepTimer timer; // GPUPHOT_DETECTION_TIMING: host-observed step times on stderr
    const int threads = ctx.threadCount();
    const cudaStream_t st = dc.stream();
    const int w = im.width, h = im.height;
    const std::size_t npix = static_cast<std::size_t>(w) * static_cast<std::size_t>(h);
    result.nBeforeDeblend = found.nBeforeDeblend;
    result.nDeblended = found.nDeblended;
    result.nCleaned = found.nCleaned;
    ctx.report("detection", 0.75);
    ctx.checkCancelled();

    // The previous frame's map is not needed any more: its memory serves this one.
    SegmentationCache& cache = segmentationCache(dc);
    cache.clear();

    // Objects up as CSR.
    const auto n = static_cast<std::int64_t>(found.objects.size());
    std::vector<std::int64_t> pixStart(found.objects.size() + 1);
    const FinishLayout layout = finishLayout(found, pixStart.data(), threads);
    constexpr int kPinnedSlot = 23; // DeviceContext::pinned slot of this step
    auto* packed = static_cast<unsigned char*>(dc.pinned(kPinnedSlot, layout.bytes));
    packFinish(found, layout, pixStart.data(), packed, threads);
    DeviceBuffer<unsigned char> dPacked(dc, layout.bytes);
    if (layout.bytes)
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(dPacked.get(), packed, layout.bytes, cudaMemcpyHostToDevice, st));
    const auto* dRunStart = reinterpret_cast<const std::int64_t*>(dPacked.get() + layout.runStart);
    const auto* dPixStart = reinterpret_cast<const std::int64_t*>(dPacked.get() + layout.pixStart);
    const auto* dObj = reinterpret_cast<const WindowObject*>(dPacked.get() + layout.objects);
    const auto* dRuns = reinterpret_cast<const Run*>(dPacked.get() + layout.runs);
    timer.lap("finish: pack + upload objects (cuda)");

    // Final order.
    DeviceBuffer<std::uint64_t> keys(dc, n), keysSorted(dc, n);
    DeviceBuffer<std::int32_t> index(dc, n), order(dc, n), id(dc, n);
    constexpr int kBlock = 256;
    if (n > 0) {
        firstPixelKernel<<<blocksFor(n, kBlock), kBlock, 0, st>>>(dRuns, dRunStart, n, w, keys.get(), index.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        int endBit = 1;
        while (endBit < 64 && (std::uint64_t(1) << endBit) < npix)
            ++endBit;
        std::size_t tempBytes = 0;
        GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, tempBytes, keys.get(), keysSorted.get(),
                                                           index.get(), order.get(), n, 0, endBit, st));
        DeviceBuffer<unsigned char> temp(dc, tempBytes);
        GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), tempBytes, keys.get(), keysSorted.get(),
                                                           index.get(), order.get(), n, 0, endBit, st));
        rankKernel<<<blocksFor(n, kBlock), kBlock, 0, st>>>(order.get(), n, id.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
    }
    keys = {};
    keysSorted = {};
    index = {};
    const auto deviceLap = [&](const char* step) { // device step times (synchronised) when timing
        if (!timer.on()) return;
        dc.synchronize();
        timer.lap(step);
    };
    deviceLap("finish: order (cuda)");

    // Segmentation map.
    DeviceBuffer<std::int32_t> seg(dc, npix);
    GPUPHOT_CUDA_CHECK(cudaMemsetAsync(seg.get(), 0, npix * sizeof(std::int32_t), st));
    if (n > 0) {
        segmentationKernel<<<blocksFor(n * kWarp, kBlock), kBlock, 0, st>>>(dRuns, dRunStart, n, id.get(), w,
                                                                             seg.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
    }
    id = {};
    deviceLap("finish: segmentation (cuda)");

    // Growth curves: (r^2, value) in raster order, stably sorted by r^2 within each object.
    DeviceBuffer<WindowResult> win(dc, n);
    if (n > 0) {
        const auto nPix = layout.nPix;
        DeviceBuffer<double> r2(dc, nPix), r2Sorted(dc, nPix);
        DeviceBuffer<float> value(dc, nPix), valueSorted(dc, nPix);
        growthPixelsKernel<<<blocksFor(n * kWarp, kBlock), kBlock, 0, st>>>(dRuns, dRunStart, dPixStart, dObj, n,
                                                                             im, r2.get(), value.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        std::size_t tempBytes = 0;
        GPUPHOT_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(
            nullptr, tempBytes, r2.get(), r2Sorted.get(), value.get(), valueSorted.get(), nPix, n, dPixStart,
            dPixStart + 1, st));
        DeviceBuffer<unsigned char> temp(dc, tempBytes);
        GPUPHOT_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(
            temp.get(), tempBytes, r2.get(), r2Sorted.get(), value.get(), valueSorted.get(), nPix, n, dPixStart,
            dPixStart + 1, st));
        r2 = {};
        value = {};
        deviceLap("finish: growth curves sorted (cuda)");
        windowKernel<<<blocksFor(n, kWindowWarps), kWindowWarps * kWarp, 0, st>>>(
            order.get(), dPixStart, dObj, r2Sorted.get(), valueSorted.get(), n, im, seg.get(),
            detail::windowConfig(p, w, h), win.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
    }

    // Order and windowed positions down, the columns on the host.
    std::vector<std::int32_t> hOrder(found.objects.size());
    std::vector<WindowResult> hWin(found.objects.size());
    if (n > 0) {
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(hOrder.data(), order.get(), n * sizeof(std::int32_t),
                                           cudaMemcpyDeviceToHost, st));
        GPUPHOT_CUDA_CHECK(
            cudaMemcpyAsync(hWin.data(), win.get(), n * sizeof(WindowResult), cudaMemcpyDeviceToHost, st));
    }
    dc.synchronize();
    timer.lap("finish: windowed positions (cuda)");
    fillFinishSources(found, hOrder.data(), hWin.data(), result, threads);
    timer.lap("finish: columns (host)");

    // The segmentation map: downloaded for the host consumers, the device copy kept.
    result.segmentation = Image<std::int32_t>(w, h, Image<std::int32_t>::NoInit{});
    dc.downloadStaged(result.segmentation.data(), seg.get(), npix * sizeof(std::int32_t));
    // Kept only while the budget leaves as much again for the stages in between (PSF) and the aperture
    // stage, which finds it there instead of uploading the host map.
    if (dc.available() >= npix * sizeof(std::int32_t)) {
        cache.map = std::move(seg);
        cache.key = viewKey(result.segmentation.view());
        cache.firstPixel.resize(hOrder.size());
        for (std::size_t k = 0; k < hOrder.size(); ++k) {
            const Run& r = found.objects[hOrder[k]].runs.front();
            cache.firstPixel[k] = static_cast<std::int64_t>(r.y) * w + r.x0;
        }
    }
    timer.lap("finish: segmentation download (cuda)");
    ctx.report("detection", 1.0);
}

const std::int32_t* cachedSegmentation(DeviceContext& dc, const ImageViewT<std::int32_t>& host) {
    SegmentationCache& cache = segmentationCache(dc);
    if (!cache.map.get() || host.empty() || !(viewKey(host) == cache.key)) return nullptr;
    for (std::size_t k = 0; k < cache.firstPixel.size(); ++k) {
        const std::int64_t q = cache.firstPixel[k];
        const int y = static_cast<int>(q / host.width), x = static_cast<int>(q % host.width);
        if (host.row(y)[x] != static_cast<std::int32_t>(k + 1)) return nullptr;
    }
    return cache.map.get();
}

void dropCachedSegmentation(DeviceContext& dc) { segmentationCache(dc).clear(); }

struct DeviceDetectionUpload::Impl {
    DeviceBuffer<float> frame, level, rms, det;
    DeviceBuffer<std::uint8_t> state;
    DeviceDetectionImages im;
};

namespace {
template <class T> DeviceBuffer<T> upload(DeviceContext& dc, const ImageViewT<T>& v) {
    DeviceBuffer<T> b(dc, static_cast<std::size_t>(v.width) * v.height);
    for (int y = 0; y < v.height; ++y)
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(b.get() + static_cast<std::size_t>(y) * v.width, v.row(y),
                                           sizeof(T) * v.width, cudaMemcpyHostToDevice, dc.stream()));
    dc.synchronize();
    return b;
}
} // namespace

DeviceDetectionUpload::DeviceDetectionUpload(DeviceContext& dc, const ImageView& frame, const ImageView& level,
                                             const ImageView& rms, const ImageView& det,
                                             const ImageViewT<std::uint8_t>& state, double threshold, bool absolute)
    : m_impl(std::make_unique<Impl>()) {
    m_impl->frame = upload(dc, frame);
    m_impl->level = upload(dc, level);
    m_impl->rms = upload(dc, rms);
    if (!det.empty()) m_impl->det = upload(dc, det);
    m_impl->state = upload(dc, state);
    DeviceDetectionImages& im = m_impl->im;
    im.width = frame.width;
    im.height = frame.height;
    im.frame = m_impl->frame.get();
    im.level = m_impl->level.get();
    im.rms = m_impl->rms.get();
    im.det = det.empty() ? nullptr : m_impl->det.get();
    im.state = m_impl->state.get();
    im.threshold = threshold;
    im.absolute = absolute;
}

DeviceDetectionUpload::~DeviceDetectionUpload() = default;

const DeviceDetectionImages& DeviceDetectionUpload::images() const { return m_impl->im; }

} // namespace gpuphot::cuda
