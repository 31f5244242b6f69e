// Steps 5-6 of the detection stage on the GPU, bitwise core's detail::finishDetection:
//   - the objects (found's order) go up once: runs as CSR, pixel offsets, the window inputs (one pinned
//     buffer packed by several host threads, one copy);
//   - final order: first pixel in raster order, a radix sort of the keys y * width + x0 (unique: the
//     objects are disjoint), its inverse gives each object's id;
//   - segmentation map: zeroed, then one warp per object writes its id over its runs;
//   - windowed positions: the growth curve needs each object's pixels in order of distance from the
//     barycentre with ties in raster order (the CPU's stable sort): (r^2, value) pairs written in raster
//     order, stably sorted per object (a rank sort, one warp per object; cub's segmented sort for objects of
//     more than 1024 pixels); then one warp per object walks its curve and iterates the window, the
//     arithmetic of core/stages/detection/detection_window.hpp (-fmad=false, doubles, the same exp);
//   - the order comes down first (pinned, behind an event) and the host fills the Sources columns but the
//     windowed position while the device works; then the windowed positions (pinned) and their columns;
//     the objects are freed by the context's release thread (idle priority) after the step; the map stays
//     on the device as a deferred SegmentationMap (downloaded only when a host consumer reads it; the
//     aperture stage reads the device copy).
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/detection/detection_window.hpp"
#include "kernels/detection/detection_device.cuh"
#include "kernels/detection/detection_finish.hpp"
#include "kernels/detection/detection_finish_pack.hpp"
#include "kernels/device_context.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/kernel_clock.cuh"

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

// The order of cub's radix sort of doubles (its bit twiddle), as an unsigned key: the growth curves come out
// the same whichever sorts them.
__device__ inline std::uint64_t orderedKey(double d) {
    const auto b = static_cast<std::uint64_t>(__double_as_longlong(d));
    return (b >> 63) ? ~b : (b | (std::uint64_t(1) << 63));
}

// Objects of at most kRankMax pixels (a smaller limit: testHooks.detectionRankMax): one warp per object stably sorts
// its (r^2, value) pairs by rank (the number of pixels with a smaller key, or the same key earlier in raster
// order), keys staged in shared memory; Sigma n^2 / 32 compares per warp instead of cub's segmented sort
// (1.5 ms at 59k objects, its large-segment kernel at 12 % occupancy). Larger objects: cub.
constexpr int kRankMax = 1024;
constexpr int kRankWarps = 4; // warps per block
__global__ void growthRankKernel(const std::int64_t* pixStart, std::int64_t n, int rankMax, const double* r2,
                                 const float* value, double* r2Sorted, float* valueSorted) {
    __shared__ std::uint64_t keys[kRankWarps][kRankMax];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(kRankWarps) + warp;
    if (i >= n) return; // the whole warp
    const std::int64_t p0 = pixStart[i];
    const std::int64_t m64 = pixStart[i + 1] - p0;
    if (m64 > rankMax) return; // the whole warp: cub's
    const int m = static_cast<int>(m64);
    std::uint64_t* kw = keys[warp];
    for (int e = lane; e < m; e += kWarp)
        kw[e] = orderedKey(r2[p0 + e]);
    __syncwarp();
    for (int e = lane; e < m; e += kWarp) {
        const std::uint64_t ke = kw[e];
        int rank = 0;
        for (int j = 0; j < m; ++j) {
            const std::uint64_t kj = kw[j];
            rank += kj < ke || (kj == ke && j < e);
        }
        r2Sorted[p0 + rank] = r2[p0 + e];
        valueSorted[p0 + rank] = value[p0 + e];
    }
}

// End offsets for cub's part: an object's own end when it has more than rankMax pixels, else its start
// (an empty segment: the rank kernel's).
__global__ void largeEndsKernel(const std::int64_t* pixStart, std::int64_t n, int rankMax,
                                std::int64_t* ends) {
    const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const std::int64_t a = pixStart[i], b = pixStart[i + 1];
    ends[i] = b - a > rankMax ? b : a;
}

// One warp per object in final order k. The sorted growth curve is read 32 entries at a time (one per lane,
// handed round by shuffles) and walked by every lane to the half-light radius (the same values: the window
// state is uniform). Each iteration's box is taken 32 pixels (raster order) at a time: every lane loads its
// pixel's five values together (state, frame, level, rms, map; the next chunk's while this one is summed),
// computes its terms (zero for a pixel that does not count) into shared memory (one row of 32 per sum, padded
// against bank conflicts), and lanes 0-4 each add one of the five sums over the 32 in lane order, unrolled
// (the loads ahead of the dependent adds). Every sum is the CPU's, pixel after pixel: the zeros change
// nothing (a sum that starts at +0 is never -0, and s + 0 = s for every other s).
constexpr int kWindowWarps = 4; // warps per block
constexpr int kTermStride = kWarp + 1;

// One lane's box pixel, loaded ahead of its terms.
struct WindowPixel {
    int x = 0, y = 0;
    bool in = false; // inside the box (else the lane's terms are zero)
    std::uint8_t state = 0;
    float frame = 0.0f, level = 0.0f, rms = 0.0f;
    std::int32_t seg = 0;
};
// The row accessors windowTerms reads, answered from the loaded values (subAt's value: 0 for a bad pixel,
// else frame - level in float).
struct LoadedWindowRow {
    WindowPixel p;
    __device__ float sub(int) const { return (p.state & detail::StateBad) ? 0.0f : p.frame - p.level; }
    __device__ float rms(int) const { return p.rms; }
    __device__ std::uint8_t state(int) const { return p.state; }
    __device__ std::int32_t seg(int) const { return p.seg; }
};

// The lane's pixel (x, y) of the box loaded when it lies in the box (y <= yb: the box's pixels in raster
// order, x in [xa, xb] always).
__device__ inline WindowPixel loadWindowPixel(const DeviceDetectionImages& im, const std::int32_t* seg, int x,
                                              int y, int yb) {
    WindowPixel q;
    q.x = x;
    q.y = y;
    if (y > yb) return q;
    q.in = true;
    const std::size_t at = im.at(x, y);
    q.state = __ldg(im.state + at);
    q.frame = __ldg(im.frame + at);
    q.level = __ldg(im.level + at);
    q.rms = __ldg(im.rms + at);
    q.seg = __ldg(seg + at);
    return q;
}

// Warp w takes object k = byWork[w] (the objects by decreasing pixel count: the long windows first, the
// short ones fill the tail), or k = w when byWork is null.
__global__ void __launch_bounds__(kWindowWarps * kWarp)
    windowKernel(const std::int32_t* order, const std::int32_t* byWork, const std::int64_t* pixStart,
                 const WindowObject* obj, const double* r2, const float* value, std::int64_t n,
                 DeviceDetectionImages im, const std::int32_t* seg, detail::WindowConfig cfg,
                 WindowResult* out, std::int64_t* work) {
    __shared__ double terms[kWindowWarps][5 * kTermStride];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const std::int64_t w = blockIdx.x * static_cast<std::int64_t>(kWindowWarps) + warp;
    if (w >= n) return; // the whole warp
    const std::int64_t k = byWork ? byWork[w] : w;
    const std::int32_t i = order[k];
    const std::int32_t id = static_cast<std::int32_t>(k + 1);
    const WindowObject m = obj[i];
    const std::int64_t p0 = pixStart[i];
    const std::int64_t curve = pixStart[i + 1] - p0;
    const double* kr2 = r2 + p0;
    const float* kv = value + p0;
    std::int64_t loaded = -1; // the first entry of the lanes' batch of the curve
    double batchR2 = 0.0;
    float batchV = 0.0f;
    const double half = detail::halfLightRadiusSorted(m, curve, [&](std::int64_t j, double& a, double& v) {
        const std::int64_t b = j & ~static_cast<std::int64_t>(kWarp - 1);
        if (b != loaded) { // uniform: every lane walks the same j
            loaded = b;
            const std::int64_t q = b + lane;
            batchR2 = q < curve ? kr2[q] : 0.0;
            batchV = q < curve ? kv[q] : 0.0f;
        }
        const int src = static_cast<int>(j & (kWarp - 1));
        a = __shfl_sync(0xffffffffu, batchR2, src);
        v = __shfl_sync(0xffffffffu, batchV, src);
    });
    double* tw = terms[warp];
    detail::WindowState s = detail::windowStart(m, half, cfg);
    const int iterations = detail::windowIterations(cfg);
    std::int64_t visited = 0; // box pixels over the iterations (work != null: GPUPHOT_DETECTION_TIMING)
    for (int it = 0; it < iterations; ++it) {
        int xa = 0, xb = -1, ya = 0, yb = -1;
        if (!detail::windowBox(s, cfg, xa, xb, ya, yb)) break;
        const int bw = xb - xa + 1, bh = yb - ya + 1;
        const std::int64_t count = bw > 0 && bh > 0 ? static_cast<std::int64_t>(bw) * bh : 0;
        visited += count;
        double sum = 0.0; // lane a < 5: sum a (sw, swx, swy, sex, sey)
        if (count == 0) {
            if (!detail::windowStep(s, detail::WindowSums{}, cfg)) break;
            continue;
        }
        // Box pixel j = base + lane at (x, y), stepped 32 pixels on per chunk: 32 = q32 rows + r32 pixels.
        const int q32 = kWarp / bw, r32 = kWarp % bw;
        int x = xa + lane % bw, y = ya + lane / bw;
        WindowPixel px = loadWindowPixel(im, seg, x, y, yb);
        for (std::int64_t base = 0; base < count; base += kWarp) {
            x += r32;
            y += q32;
            if (x > xb) {
                x -= bw;
                ++y;
            }
            const WindowPixel next = loadWindowPixel(im, seg, x, y, yb);
            detail::WindowSums t; // zeros
            if (px.in) {
                detail::WindowSums u;
                if (detail::windowTerms(s, cfg, id, LoadedWindowRow{px}, px.x, px.y,
                                        detail::WindowWeight{s.inv2s2}, u))
                    t = u;
            }
            tw[lane] = t.sw;
            tw[kTermStride + lane] = t.swx;
            tw[2 * kTermStride + lane] = t.swy;
            tw[3 * kTermStride + lane] = t.sex;
            tw[4 * kTermStride + lane] = t.sey;
            __syncwarp();
            if (lane < 5) {
                const double* row = tw + lane * kTermStride;
#pragma unroll
                for (int e = 0; e < kWarp; ++e)
                    sum += row[e];
            }
            __syncwarp();
            px = next;
        }
        detail::WindowSums q;
        q.sw = __shfl_sync(0xffffffffu, sum, 0);
        q.swx = __shfl_sync(0xffffffffu, sum, 1);
        q.swy = __shfl_sync(0xffffffffu, sum, 2);
        q.sex = __shfl_sync(0xffffffffu, sum, 3);
        q.sey = __shfl_sync(0xffffffffu, sum, 4);
        if (!detail::windowStep(s, q, cfg)) break;
    }
    if (lane == 0) out[k] = detail::windowFinish(obj[i], s); // read again: m is not held over the loop
    if (work && lane == 0) work[k] = visited;
}

// Per final position k: its object's pixel count (the sort key of the window's work order) and k.
__global__ void workKeysKernel(const std::int32_t* order, const std::int64_t* pixStart, std::int64_t n,
                               std::uint32_t* keys, std::int32_t* index) {
    const std::int64_t k = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
    if (k >= n) return;
    const std::int32_t i = order[k];
    const std::int64_t a = pixStart[i + 1] - pixStart[i];
    keys[k] = static_cast<std::uint32_t>(a < 0xffffffffll ? a : 0xffffffffll);
    index[k] = static_cast<std::int32_t>(k);
}

unsigned blocksFor(std::int64_t threads, int block) {
    return static_cast<unsigned>((threads + block - 1) / block);
}

// ---- deferred segmentation maps ----------------------------------------------------------------------
// One pool per DeviceContext (in its scratch, SegmentationScratch, which closes the pool when the context
// dies: before its memory pool). The mutex guards the list of live sources, their buffers, the pending
// frees and the download stream.
class DeviceSegmentationSource;

std::atomic<std::uint64_t> g_downloads{0}, g_foreignDownloads{0};

struct SegmentationPool {
    std::mutex mutex;
    DeviceContext* dc = nullptr; // null once the context died
    int device = 0;
    std::thread::id stageThread; // the thread that runs dc's stages (the last finishDetection's)
    cudaStream_t stream = nullptr; // downloads on other threads and at the context's end
    PinnedBuffer<unsigned char> staging[2]; // their staging, made on the first large one
    cudaEvent_t done[2] = {nullptr, nullptr};
    std::vector<DeviceSegmentationSource*> live;
    DeferredRelease objectsRelease; // the finished objects freed after the step (joined by the next, close())
    std::vector<DeviceBuffer<std::int32_t>> pending; // dropped on another thread: freed on the stage thread

    bool onStageThread() const { return dc && std::this_thread::get_id() == stageThread; }
    // A download on any thread (the map was complete when finishDetection returned: it synchronised dc's
    // stream) on the pool's own stream, through the pool's own pinned staging (two chunks, the copies out of
    // them by several threads, overlapped with the DMA), as DeviceContext::downloadStaged does on dc's
    // stream: one pageable cudaMemcpy of 605 MB took 420-500 ms, staged 36 ms.
    void copyDown(void* dst, const void* src, std::size_t bytes) {
        int previous = 0;
        GPUPHOT_CUDA_CHECK(cudaGetDevice(&previous));
        if (previous != device) GPUPHOT_CUDA_CHECK(cudaSetDevice(device));
        struct Restore {
            int d, prev;
            ~Restore() {
                if (d != prev) cudaSetDevice(prev);
            }
        } restore{device, previous};
        if (!stream) GPUPHOT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        constexpr std::size_t kChunk = std::size_t(32) << 20;
        if (bytes < kChunk) {
            GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
            GPUPHOT_CUDA_CHECK(cudaStreamSynchronize(stream));
            return;
        }
        for (int b = 0; b < 2; ++b) {
            if (!staging[b].get()) staging[b] = PinnedBuffer<unsigned char>(kChunk);
            if (!done[b]) GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming));
        }
        unsigned char* const buffers[2] = {staging[0].get(), staging[1].get()};
        downloadThroughStaging(dst, src, bytes, kChunk, stream, buffers, done);
    }
    void close() noexcept;
    ~SegmentationPool() {
        for (cudaEvent_t e : done)
            if (e) cudaEventDestroy(e);
        if (stream) cudaStreamDestroy(stream);
    }
};

class DeviceSegmentationSource final : public DeferredImageSource {
public:
    DeviceSegmentationSource(std::shared_ptr<SegmentationPool> pool, DeviceBuffer<std::int32_t>&& buffer,
                             int w, int h)
        : m_pool(std::move(pool)), m_buffer(std::move(buffer)), m_width(w), m_height(h) {
        std::lock_guard lock(m_pool->mutex);
        m_pool->live.push_back(this);
    }
    ~DeviceSegmentationSource() override {
        SegmentationPool& pool = *m_pool;
        std::lock_guard lock(pool.mutex);
        pool.live.erase(std::find(pool.live.begin(), pool.live.end(), this));
        if (m_buffer.get() && !pool.onStageThread()) pool.pending.push_back(std::move(m_buffer));
        m_buffer.reset(); // the stage thread: at once
    }

    void download(std::int32_t* dst) const override {
        SegmentationPool& pool = *m_pool;
        std::lock_guard lock(pool.mutex);
        const std::size_t bytes = this->bytes();
        if (m_buffer.get()) {
            if (pool.onStageThread()) {
                pool.dc->downloadStaged(dst, m_buffer.get(), bytes);
            } else {
                pool.copyDown(dst, m_buffer.get(), bytes);
                ++g_foreignDownloads;
            }
        } else if (!m_evicted.empty()) {
            parallelCopy(dst, m_evicted.data(), bytes);
        } else {
            throw CudaError("segmentation map: " + m_lost);
        }
        ++g_downloads;
    }

    // With the pool's mutex held. Downloads into m_evicted (staged: the stage thread; else pageable) and
    // frees the device buffer; returns the bytes freed.
    std::size_t evictLocked(bool staged) {
        if (!m_buffer.get()) return 0;
        Image<std::int32_t> host(m_width, m_height, Image<std::int32_t>::NoInit{});
        if (staged)
            m_pool->dc->downloadStaged(host.data(), m_buffer.get(), bytes());
        else
            m_pool->copyDown(host.data(), m_buffer.get(), bytes());
        m_evicted = std::move(host);
        return releaseLocked();
    }
    // With the pool's mutex held: frees the device buffer without a copy (the map is materialised).
    std::size_t releaseLocked() {
        const std::size_t b = m_buffer.bytes();
        m_buffer.reset();
        if (m_evicted.empty()) m_lost = "the device copy was freed after its download";
        return b;
    }
    void loseLocked(const std::string& why) noexcept {
        m_buffer.reset();
        m_lost = why;
    }
    const std::int32_t* devicePointer() const { return m_buffer.get(); }
    std::size_t deviceBytes() const { return m_buffer.bytes(); }
    const SegmentationPool* pool() const { return m_pool.get(); }
    int width() const { return m_width; }
    int height() const { return m_height; }

private:
    std::size_t bytes() const {
        return static_cast<std::size_t>(m_width) * static_cast<std::size_t>(m_height) * sizeof(std::int32_t);
    }
    std::shared_ptr<SegmentationPool> m_pool;
    DeviceBuffer<std::int32_t> m_buffer;
    Image<std::int32_t> m_evicted; // after evictLocked
    std::string m_lost;            // why neither is there
    int m_width = 0, m_height = 0;
};

void SegmentationPool::close() noexcept {
    std::lock_guard lock(mutex);
    for (DeviceSegmentationSource* s : live) {
        try {
            s->evictLocked(false); // any thread may destroy the context: the pool's own stream
        } catch (const std::exception& e) {
            s->loseLocked(std::string("its device context ended and the download failed: ") + e.what());
        }
    }
    pending.clear();
    objectsRelease.wait();
    dc = nullptr;
}

// The context's deferred maps (its scratch): the pool closes when the context ends, before its memory pool.
struct SegmentationScratch {
    std::shared_ptr<SegmentationPool> pool;
    SegmentationScratch() = default;
    SegmentationScratch(const SegmentationScratch&) = delete;
    SegmentationScratch& operator=(const SegmentationScratch&) = delete;
    ~SegmentationScratch() {
        if (pool) pool->close();
    }
};

SegmentationPool& segmentationPool(DeviceContext& dc, std::shared_ptr<SegmentationPool>* shared = nullptr) {
    std::shared_ptr<SegmentationPool>& pool = dc.scratch<SegmentationScratch>().pool;
    if (!pool) {
        pool = std::make_shared<SegmentationPool>();
        pool->dc = &dc;
        pool->device = dc.device();
        pool->stageThread = std::this_thread::get_id();
    }
    if (shared) *shared = pool;
    return *pool;
}

// The live source of map on dc's device, else null (call with the pool's mutex held).
DeviceSegmentationSource* residentSource(SegmentationPool& pool, const SegmentationMap& map) {
    const auto* src = dynamic_cast<const DeviceSegmentationSource*>(map.source().get());
    if (!src || src->pool() != &pool || !src->devicePointer()) return nullptr;
    return const_cast<DeviceSegmentationSource*>(src); // the pool's own (non-const) entry
}

// Earlier maps of this context still held by their results (the workbench keeps the previous one) stay on
// the device while the budget leaves room for this step, this map and the aperture stage's use of it; else
// they are downloaded into their sources and freed. The step claims the pool for this thread and frees the
// maps dropped on other threads.
std::shared_ptr<SegmentationPool> claimSegmentationPool(DeviceContext& dc) {
    std::shared_ptr<SegmentationPool> pool;
    SegmentationPool& sp = segmentationPool(dc, &pool);
    std::lock_guard lock(sp.mutex);
    sp.stageThread = std::this_thread::get_id();
    sp.pending.clear();
    return pool;
}

// The step's host memory, kept in the context between frames (not faulted in or pinned afresh).
struct FinishScratch {
    std::vector<std::int64_t> pixStart; // the objects' pixel offsets (finishLayout)
    GrowingPinned packed;               // the objects, packed for their upload
    GrowingPinned order;                // the final order's download
    GrowingPinned window;               // the windowed positions' download
};

// FinishScratch's pinned buffers at this frame's sizes, taken before any copy is queued (growing one frees
// the old buffer, which synchronises the device).
struct FinishHost {
    unsigned char* packed = nullptr;
    std::int32_t* order = nullptr;
    WindowResult* win = nullptr;
};
FinishHost finishHostBuffers(FinishScratch& s, const FinishLayout& layout, std::size_t nObjects) {
    FinishHost h;
    h.packed = static_cast<unsigned char*>(s.packed.get(layout.bytes));
    h.order =
        static_cast<std::int32_t*>(s.order.get(std::max<std::size_t>(nObjects, 1) * sizeof(std::int32_t)));
    h.win =
        static_cast<WindowResult*>(s.window.get(std::max<std::size_t>(nObjects, 1) * sizeof(WindowResult)));
    return h;
}

// The objects on the device: views into their packed upload (finishLayout's offsets), n of them.
struct DeviceObjects {
    const std::int64_t* runStart = nullptr;
    const std::int64_t* pixStart = nullptr;
    const WindowObject* obj = nullptr;
    const Run* runs = nullptr;
    std::int64_t n = 0;
};

constexpr int kBlock = 256; // threads per block of the one-thread-per-item and one-warp-per-object kernels

// The final order's device buffers: keys, keysSorted and index while it is sorted, id (rank + 1 of each
// object) until the map holds the ids, order (the objects in final order) to the end of the step.
struct FinalOrder {
    DeviceBuffer<std::uint64_t> keys, keysSorted;
    DeviceBuffer<std::int32_t> index, order, id;
};

// Final order: the first pixel of each object in raster order (a radix sort of y * width + x0), and the ids.
void sortFinalOrder(DeviceContext& dc, KernelClock& kc, const DeviceObjects& d, int w, std::size_t npix,
                    FinalOrder& fo) {
    const cudaStream_t st = dc.stream();
    const std::int64_t n = d.n;
    fo.keys = DeviceBuffer<std::uint64_t>(dc, n);
    fo.keysSorted = DeviceBuffer<std::uint64_t>(dc, n);
    fo.index = DeviceBuffer<std::int32_t>(dc, n);
    fo.order = DeviceBuffer<std::int32_t>(dc, n);
    fo.id = DeviceBuffer<std::int32_t>(dc, n);
    if (n > 0)
        kc.time("finish: order (first pixels, radix sort, ranks)", [&] {
            firstPixelKernel<<<blocksFor(n, kBlock), kBlock, 0, st>>>(d.runs, d.runStart, n, w, fo.keys.get(),
                                                                      fo.index.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            int endBit = 1;
            while (endBit < 64 && (std::uint64_t(1) << endBit) < npix)
                ++endBit;
            std::size_t tempBytes = 0;
            GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, tempBytes, fo.keys.get(),
                                                               fo.keysSorted.get(), fo.index.get(),
                                                               fo.order.get(), n, 0, endBit, st));
            DeviceBuffer<unsigned char> temp(dc, tempBytes);
            GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), tempBytes, fo.keys.get(),
                                                               fo.keysSorted.get(), fo.index.get(),
                                                               fo.order.get(), n, 0, endBit, st));
            rankKernel<<<blocksFor(n, kBlock), kBlock, 0, st>>>(fo.order.get(), n, fo.id.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
        });
    fo.keys = {};
    fo.keysSorted = {};
    fo.index = {};
}

// A CUDA event destroyed with its owner.
struct OwnedEvent {
    cudaEvent_t e = nullptr;
    OwnedEvent() = default;
    OwnedEvent(const OwnedEvent&) = delete;
    OwnedEvent& operator=(const OwnedEvent&) = delete;
    ~OwnedEvent() {
        if (e) cudaEventDestroy(e);
    }
};

// Segmentation map: zeroed, then each object's id over its runs.
void writeSegmentation(DeviceContext& dc, KernelClock& kc, const DeviceObjects& d, const std::int32_t* id,
                       int w, std::size_t npix, DeviceBuffer<std::int32_t>& seg) {
    const cudaStream_t st = dc.stream();
    const std::int64_t n = d.n;
    kc.time("finish: map zeroed", [&] {
        GPUPHOT_CUDA_CHECK(cudaMemsetAsync(seg.get(), 0, npix * sizeof(std::int32_t), st));
    });
    if (n > 0)
        kc.time("finish: map ids", [&] {
            segmentationKernel<<<blocksFor(n * kWarp, kBlock), kBlock, 0, st>>>(d.runs, d.runStart, n, id, w,
                                                                                seg.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
        });
}

// The growth curves: (r^2, value) of each object's pixels in raster order, then stably sorted by r^2 within
// each object into r2Sorted and valueSorted.
struct GrowthCurves {
    DeviceBuffer<double> r2, r2Sorted;
    DeviceBuffer<float> value, valueSorted;
    GrowthCurves(DeviceContext& dc, std::int64_t nPix)
        : r2(dc, nPix), r2Sorted(dc, nPix), value(dc, nPix), valueSorted(dc, nPix) {}
};

// Objects of more than rankMax pixels (none in most frames) by cub's stable segmented sort (the others'
// segments empty), first; then the rest by rank (which rewrites what cub might have left elsewhere). The
// unsorted curves are freed.
void sortGrowthCurves(DeviceContext& dc, KernelClock& kc, const DeviceObjects& d, std::int64_t nPix,
                      int rankMax, std::int64_t largest, GrowthCurves& c) {
    const cudaStream_t st = dc.stream();
    const std::int64_t n = d.n;
    if (largest > rankMax) {
        DeviceBuffer<std::int64_t> ends(dc, n);
        largeEndsKernel<<<blocksFor(n, kBlock), kBlock, 0, st>>>(d.pixStart, n, rankMax, ends.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        std::size_t tempBytes = 0;
        GPUPHOT_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(
            nullptr, tempBytes, c.r2.get(), c.r2Sorted.get(), c.value.get(), c.valueSorted.get(), nPix, n,
            d.pixStart, ends.get(), st));
        DeviceBuffer<unsigned char> temp(dc, tempBytes);
        kc.time("finish: growth curve sort (cub, large objects)", [&] {
            GPUPHOT_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(
                temp.get(), tempBytes, c.r2.get(), c.r2Sorted.get(), c.value.get(), c.valueSorted.get(), nPix,
                n, d.pixStart, ends.get(), st));
        });
    }
    kc.time("finish: growth curve sort (rank)", [&] {
        growthRankKernel<<<blocksFor(n, kRankWarps), kRankWarps * kWarp, 0, st>>>(
            d.pixStart, n, rankMax, c.r2.get(), c.value.get(), c.r2Sorted.get(), c.valueSorted.get());
    });
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    c.r2 = {};
    c.value = {};
}

// The window's work order: the objects by decreasing pixel count (a stable radix sort); tuning
// detection.rasterWindows: none (empty: final order, for comparisons).
DeviceBuffer<std::int32_t> windowWorkOrder(DeviceContext& dc, KernelClock& kc, const DeviceObjects& d,
                                           const std::int32_t* order, std::int64_t largest) {
    const cudaStream_t st = dc.stream();
    const std::int64_t n = d.n;
    DeviceBuffer<std::int32_t> byWork;
    if (dc.tuning().detection.rasterWindows) return byWork;
    DeviceBuffer<std::uint32_t> wKeys(dc, n), wKeysSorted(dc, n);
    DeviceBuffer<std::int32_t> wIndex(dc, n);
    byWork = DeviceBuffer<std::int32_t>(dc, n);
    int keyBits = 1;
    while (keyBits < 32 && (std::int64_t(1) << keyBits) <= largest)
        ++keyBits;
    std::size_t sortBytes = 0;
    GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        nullptr, sortBytes, wKeys.get(), wKeysSorted.get(), wIndex.get(), byWork.get(), n, 0, keyBits, st));
    DeviceBuffer<unsigned char> sortTemp(dc, sortBytes);
    kc.time("finish: window work order (sort by pixel count)", [&] {
        workKeysKernel<<<blocksFor(n, kBlock), kBlock, 0, st>>>(order, d.pixStart, n, wKeys.get(),
                                                                wIndex.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(sortTemp.get(), sortBytes, wKeys.get(),
                                                                     wKeysSorted.get(), wIndex.get(),
                                                                     byWork.get(), n, 0, keyBits, st));
    });
    return byWork;
}

// Growth curves, then the windowed positions (one warp per object), which come down into hWin (pinned).
// workCount (GPUPHOT_DETECTION_TIMING): the window's box pixels per object.
void windowedPositions(DeviceContext& dc, KernelClock& kc, const DeviceObjects& d, std::int64_t nPix,
                       const std::vector<std::int64_t>& pixStart, const std::int32_t* order,
                       const std::int32_t* seg, const DeviceDetectionImages& im, const DetectionParams& p,
                       WindowResult* hWin, DeviceBuffer<std::int64_t>& workCount) {
    const cudaStream_t st = dc.stream();
    const std::int64_t n = d.n;
    DeviceBuffer<WindowResult> win(dc, n);
    GrowthCurves c(dc, nPix);
    kc.time("finish: growth pixels", [&] {
        growthPixelsKernel<<<blocksFor(n * kWarp, kBlock), kBlock, 0, st>>>(
            d.runs, d.runStart, d.pixStart, d.obj, n, im, c.r2.get(), c.value.get());
    });
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    const int rankMax = [&] { // tests: both paths on small objects
        const int h = dc.testHooks().detectionRankMax;
        return h >= 0 ? std::min(h, kRankMax) : kRankMax;
    }();
    std::int64_t largest = 0;
    for (std::int64_t o = 0; o < n; ++o)
        largest = std::max(largest, pixStart[o + 1] - pixStart[o]);
    sortGrowthCurves(dc, kc, d, nPix, rankMax, largest, c);
    DeviceBuffer<std::int32_t> byWork = windowWorkOrder(dc, kc, d, order, largest);
    if (kc.on()) workCount = DeviceBuffer<std::int64_t>(dc, n);
    kc.time("finish: windowed positions", [&] {
        windowKernel<<<blocksFor(n, kWindowWarps), kWindowWarps * kWarp, 0, st>>>(
            order, byWork.get(), d.pixStart, d.obj, c.r2Sorted.get(), c.valueSorted.get(), n, im, seg,
            detail::windowConfig(p, im.width, im.height), win.get(), workCount.get());
    });
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    kc.time("finish: windowed positions download", [&] {
        GPUPHOT_CUDA_CHECK(
            cudaMemcpyAsync(hWin, win.get(), n * sizeof(WindowResult), cudaMemcpyDeviceToHost, st));
    });
}

// Beside the device: the columns but the windowed positions (from the order, once it is down); then the
// objects go to the context's release thread; then, the device done, the windowed position columns.
void finishOnHost(DeviceContext& dc, detail::DetectedObjects& found, cudaEvent_t orderDown,
                  const FinishHost& host, SegmentationPool& pool, int threads, DetectionResult& result,
                  detail::StepTimer& timer) {
    GPUPHOT_CUDA_CHECK(cudaEventSynchronize(orderDown));
    timer.lap("finish: order (cuda)");
    fillFinishColumns(found, host.order, result, threads);
    timer.lap("finish: columns (host, beside the device)");
    // The objects' frees (3.9 ms on one thread at 59k objects) go to the context's release thread, at idle
    // scheduling priority (it runs beside the next stages, whose parallel loops keep every core busy).
    // tuning detection.release "thread": at normal priority; "now": freed here by the step's threads while
    // the device works (comparisons).
    const std::string& release = dc.tuning().detection.release;
    const ReleaseMode mode = release == "thread" ? ReleaseMode::Thread
                             : release == "now"  ? ReleaseMode::Now
                                                 : ReleaseMode::IdleThread;
    if (mode == ReleaseMode::Now) {
        releaseNow(std::move(found), threads);
        timer.lap("finish: objects freed (host, beside the device)");
    } else {
        std::lock_guard lock(pool.mutex);
        pool.objectsRelease.release(std::move(found), threads, mode == ReleaseMode::IdleThread);
        timer.lap("finish: objects handed to the release thread (host)");
    }
    dc.synchronize();
    timer.lap("finish: segmentation + windowed positions (cuda, the rest)");
    fillFinishWindow(host.win, result.sources, threads);
    timer.lap("finish: windowed position columns (host)");
}

// GPUPHOT_DETECTION_TIMING: the step's objects and pixels, the window's work per object, the device times.
void reportFinishTiming(DeviceContext& dc, KernelClock& kc, const std::vector<std::int64_t>& pixStart,
                        std::int64_t n, std::int64_t nPix, const DeviceBuffer<std::int64_t>& workCount) {
    std::int64_t largest = 0, over1k = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        largest = std::max(largest, pixStart[i + 1] - pixStart[i]);
        over1k += pixStart[i + 1] - pixStart[i] > 1000;
    }
    std::fprintf(stderr,
                 "detection timing: finish: %lld objects, %lld pixels, largest %lld, %lld over 1000\n",
                 static_cast<long long>(n), static_cast<long long>(nPix), static_cast<long long>(largest),
                 static_cast<long long>(over1k));
    if (workCount.size() > 0) {
        std::vector<std::int64_t> wk(workCount.size());
        dc.downloadStaged(wk.data(), workCount.get(), wk.size() * sizeof(std::int64_t));
        std::sort(wk.begin(), wk.end());
        std::int64_t total = 0;
        for (const std::int64_t v : wk)
            total += v;
        const auto at = [&](double q) {
            const auto i = static_cast<std::size_t>(q * static_cast<double>(wk.size() - 1));
            return static_cast<long long>(wk[i]);
        };
        std::fprintf(stderr,
                     "detection timing: finish: window box pixels total %lld, median %lld, p99 %lld, "
                     "p99.9 %lld, max %lld\n",
                     static_cast<long long>(total), at(0.5), at(0.99), at(0.999), at(1.0));
    }
    kc.report();
}

// The segmentation map stays on the device (a deferred map: downloaded when a host consumer reads it)
// while the budget leaves as much again for the stages in between (PSF) and the aperture stage, which
// reads it there; else it comes down now and the device copy is freed.
void placeSegmentation(DeviceContext& dc, const std::shared_ptr<SegmentationPool>& pool,
                       DeviceBuffer<std::int32_t>& seg, int w, int h, std::size_t mapBytes,
                       DetectionResult& result, detail::StepTimer& timer) {
    if (mapBytes == 0) {
        result.segmentation = SegmentationMap(Image<std::int32_t>(w, h));
    } else if (dc.available() >= mapBytes) {
        result.segmentation =
            SegmentationMap(w, h, std::make_shared<DeviceSegmentationSource>(pool, std::move(seg), w, h));
        timer.lap("finish: segmentation kept on the device (cuda)");
    } else {
        Image<std::int32_t> host(w, h, Image<std::int32_t>::NoInit{});
        dc.downloadStaged(host.data(), seg.get(), mapBytes);
        seg = {};
        result.segmentation = SegmentationMap(std::move(host));
        timer.lap("finish: segmentation download (cuda, budget)");
    }
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
    const std::shared_ptr<SegmentationPool> pool = claimSegmentationPool(dc);

    // Objects up as CSR, through pinned memory kept in the context.
    const auto n = static_cast<std::int64_t>(found.objects.size());
    FinishScratch& scratch = dc.scratch<FinishScratch>();
    std::vector<std::int64_t>& pixStart = scratch.pixStart;
    pixStart.resize(found.objects.size() + 1); // every entry written by finishLayout
    const FinishLayout layout = finishLayout(found, pixStart.data(), threads);
    const std::size_t mapBytes = npix * sizeof(std::int32_t);
    const std::size_t stepBytes =
        layout.bytes + static_cast<std::size_t>(n) * 40 + static_cast<std::size_t>(layout.nPix) * 48;
    if (dc.available() < 2 * mapBytes + stepBytes) evictSegmentations(dc);
    const FinishHost host = finishHostBuffers(scratch, layout, found.objects.size());
    packFinish(found, layout, pixStart.data(), host.packed, threads);
    DeviceBuffer<unsigned char> dPacked(dc, layout.bytes);
    KernelClock kc(st, "finish", dc.tuning().detection.timing); // device times of the steps below
    if (layout.bytes)
        kc.time("finish: upload", [&] {
            GPUPHOT_CUDA_CHECK(
                cudaMemcpyAsync(dPacked.get(), host.packed, layout.bytes, cudaMemcpyHostToDevice, st));
        });
    const DeviceObjects d{reinterpret_cast<const std::int64_t*>(dPacked.get() + layout.runStart),
                          reinterpret_cast<const std::int64_t*>(dPacked.get() + layout.pixStart),
                          reinterpret_cast<const WindowObject*>(dPacked.get() + layout.objects),
                          reinterpret_cast<const Run*>(dPacked.get() + layout.runs), n};
    timer.lap("finish: pack + upload objects (cuda)");

    FinalOrder fo;
    sortFinalOrder(dc, kc, d, w, npix, fo);
    // The order comes down (pinned) ahead of the rest: the host fills the columns from it while the device
    // makes the map and the windowed positions.
    OwnedEvent orderDown;
    GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&orderDown.e, cudaEventDisableTiming));
    if (n > 0)
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(host.order, fo.order.get(), n * sizeof(std::int32_t),
                                           cudaMemcpyDeviceToHost, st));
    GPUPHOT_CUDA_CHECK(cudaEventRecord(orderDown.e, st));

    DeviceBuffer<std::int32_t> seg(dc, npix);
    writeSegmentation(dc, kc, d, fo.id.get(), w, npix, seg);
    fo.id = {};

    DeviceBuffer<std::int64_t> workCount; // GPUPHOT_DETECTION_TIMING: window box pixels per object
    if (n > 0)
        windowedPositions(dc, kc, d, layout.nPix, pixStart, fo.order.get(), seg.get(), im, p, host.win,
                          workCount);
    timer.lap("finish: device steps queued (cuda)");

    finishOnHost(dc, found, orderDown.e, host, *pool, threads, result, timer);
    if (kc.on()) reportFinishTiming(dc, kc, pixStart, n, layout.nPix, workCount);
    placeSegmentation(dc, pool, seg, w, h, mapBytes, result, timer);
    ctx.report("detection", 1.0);
}

bool takeRecycledObjects(DeviceContext& dc, std::vector<detail::Object>& objects,
                         std::vector<detail::IsoMeasure>& iso) {
    if (!dc.tuning().detection.recycle) return false;
    SegmentationPool& pool = segmentationPool(dc);
    std::lock_guard lock(pool.mutex);
    return pool.objectsRelease.takeRecycled(objects, iso);
}

const std::int32_t* deviceSegmentation(DeviceContext& dc, const SegmentationMap& map) {
    if (!map.source()) return nullptr;
    SegmentationPool& pool = segmentationPool(dc);
    std::lock_guard lock(pool.mutex);
    const DeviceSegmentationSource* s = residentSource(pool, map);
    return s ? s->devicePointer() : nullptr;
}

const std::int32_t* residentSegmentation(DeviceContext& dc, const ImageViewT<std::int32_t>& view) {
    if (view.empty() || view.stride != view.width) return nullptr;
    SegmentationPool& pool = segmentationPool(dc);
    std::lock_guard lock(pool.mutex);
    for (const DeviceSegmentationSource* s : pool.live)
        if (s->devicePointer() == view.data && s->width() == view.width && s->height() == view.height)
            return view.data;
    return nullptr;
}

std::size_t evictSegmentations(DeviceContext& dc, const SegmentationMap* keep) {
    SegmentationPool& pool = segmentationPool(dc);
    std::lock_guard lock(pool.mutex);
    const DeviceSegmentationSource* kept = keep ? residentSource(pool, *keep) : nullptr;
    std::size_t freed = 0;
    for (const auto& b : pool.pending)
        freed += b.bytes();
    pool.pending.clear();
    const bool staged = pool.onStageThread();
    for (DeviceSegmentationSource* s : pool.live)
        if (s != kept) freed += s->evictLocked(staged);
    return freed;
}

void releaseSegmentationDevice(DeviceContext& dc, const SegmentationMap& map) {
    if (!map.source() || !map.isMaterialised()) return;
    SegmentationPool& pool = segmentationPool(dc);
    std::lock_guard lock(pool.mutex);
    if (DeviceSegmentationSource* s = residentSource(pool, map)) s->releaseLocked();
}

std::size_t segmentationBytes(DeviceContext& dc) {
    SegmentationPool& pool = segmentationPool(dc);
    std::lock_guard lock(pool.mutex);
    std::size_t bytes = 0;
    for (const DeviceSegmentationSource* s : pool.live)
        bytes += s->deviceBytes();
    for (const auto& b : pool.pending)
        bytes += b.bytes();
    return bytes;
}

std::uint64_t segmentationDownloads() { return g_downloads.load(); }
std::uint64_t segmentationForeignDownloads() { return g_foreignDownloads.load(); }

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
