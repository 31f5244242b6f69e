// prepareFrame's steps 1-5 on the device, bitwise the CPU's (core/stages/prepare/prepare.cpp):
//  - bleed trails and saturation growth: the columns holding a saturated pixel are found in one pass over
//    the mask; one thread per such column streams down it (the rows of a warp are coalesced) with the
//    run-length scan of maskBleedTrails: runs of pixels >= level or saturated that hold a saturated pixel,
//    grown by `grow` rows;
//  - overscan (levels from the host), trim (the output section), bias, dark scaled by exposure, flat with
//    the minFlat guard, master / bad-pixel masks -> MaskBad: one pass per output pixel.
// The frame comes from the device frame cache (uploaded only when it is not resident there); the masters
// (and their masks and the bad-pixel mask) are uploaded once per DeviceContext and stay resident, keyed by
// their host view like the frame cache. The prepared frame becomes the frame cache for the stages, and its
// host copy (read by the host stages: PSF stamps, outputs) is downloaded through the pinned staging.
// Bitwise equal to the CPU: the same float / double operations in the same order, -fmad=false, IEEE
// division (no fast math), and NaN results given the host's bits (kernels/host_nan.cuh).
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "core/model/image.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "kernels/host_nan.cuh"

namespace gpuphot::cuda {

namespace {

template <class T> struct Resident {
    ViewKey key;
    DeviceBuffer<T> buf;
};

// The resident calibration, one slot per input: the stage's scratch in its DeviceContext.
struct MasterCache {
    Resident<float> bias, dark, flat;
    Resident<std::uint8_t> biasMask, darkMask, flatMask, bpm;
};

// Diagnostics of the calling thread's last call (several RunContexts run on their own threads under
// --concurrent; the tests read them from the thread that called).
thread_local std::uint64_t t_masterUploads = 0;
thread_local double t_kernelMs = 0.0;
thread_local PrepareTimings t_timings;

template <class T> const T* resident(DeviceContext& dc, Resident<T>& slot, const ImageViewT<T>& v) {
    if (v.empty()) {
        slot.buf.reset();
        slot.key = {};
        return nullptr;
    }
    const ViewKey k = viewKey(v);
    const std::size_t n = static_cast<std::size_t>(v.width) * v.height;
    if (!(k == slot.key) || slot.buf.size() != n) {
        slot.key = {};
        slot.buf.reset();
        slot.buf = DeviceBuffer<T>(dc, n);
        uploadRows(dc, slot.buf.get(), v, 0, v.height);
        slot.key = k;
        ++t_masterUploads;
    }
    return slot.buf.get();
}

// ---- step 1: bleed trails ----------------------------------------------------------------------------

// One thread per column x of a w x h frame (row stride w). Streams the column in batches of kRows rows
// (independent loads in flight); a run that ends holding a saturated pixel marks its rows and the `grow`
// rows above it at once (rows already read: the scan never reads them again) and the `grow` rows below it
// as the scan reaches them (growUntil), so every mask byte that decides a run is read before it changes.
// `added` counts the pixels newly MaskSaturated, as maskBleedTrails.
constexpr int kRows = 32;

// The columns that hold a saturated pixel (cols[x] != 0), one pass over the mask with every thread busy:
// only those columns are scanned (maskBleedTrails' row-wise pre-scan), so the latency-bound column scan
// runs on a few threads on a typical frame.
__global__ void saturatedColumnsKernel(const std::uint8_t* __restrict__ mask, int w, int h, unsigned* cols) {
    for (int y = blockIdx.y; y < h; y += gridDim.y) {
        const std::uint8_t* row = mask + static_cast<std::size_t>(y) * w;
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < w; x += gridDim.x * blockDim.x)
            if (row[x] & MaskSaturated) atomicOr(cols + x, 1u);
    }
}

__global__ void bleedKernel(const float* __restrict__ px, std::uint8_t* mask, int w, int h, float level, int grow,
                            const unsigned* __restrict__ cols, unsigned long long* added) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= w || !cols[x]) return;
    const std::size_t stride = static_cast<std::size_t>(w);
    unsigned long long local = 0;
    int runStart = -1, growUntil = -1;
    bool touched = false;
    auto mark = [&](int y) {
        std::uint8_t* p = mask + static_cast<std::size_t>(y) * stride + x;
        const std::uint8_t m = *p;
        if (!(m & MaskSaturated)) {
            *p = static_cast<std::uint8_t>(m | MaskSaturated);
            ++local;
        }
    };
    auto endRun = [&](int e) { // the run [runStart, e) holds a saturated pixel
        for (int y = max(0, runStart - grow); y < e; ++y) mark(y);
        growUntil = max(growUntil, e - 1 + grow);
    };
    for (int y0 = 0; y0 < h; y0 += kRows) {
        const int n = min(kRows, h - y0);
        float v[kRows];
        std::uint8_t m[kRows];
#pragma unroll
        for (int k = 0; k < kRows; ++k)
            if (k < n) {
                const std::size_t i = static_cast<std::size_t>(y0 + k) * stride + x;
                v[k] = px[i];
                m[k] = mask[i];
            }
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
            if (k >= n) break;
            const int y = y0 + k;
            const bool sat = (m[k] & MaskSaturated) != 0;
            if (v[k] >= level || sat) {
                if (runStart < 0) {
                    runStart = y;
                    touched = false;
                }
                touched |= sat;
            } else if (runStart >= 0) {
                if (touched) endRun(y);
                runStart = -1;
            }
            if (y <= growUntil) mark(y);
        }
    }
    if (runStart >= 0 && touched) endRun(h);
    if (local) atomicAdd(added, local);
}

// ---- steps 2-5: overscan, trim, calibration ------------------------------------------------------------

struct CalArgs {
    const float* in;           // the raw frame (row stride inStride)
    const std::uint8_t* inMask;
    std::size_t inStride;
    int x0, y0;                // the output section's offset in the raw frame
    float* out;                // w x h (may alias in when untrimmed)
    std::uint8_t* outMask;
    int w, h;
    const double* overscan;    // per raw row: the level subtracted; null: none
    const float *bias, *dark, *flat; // w x h, aligned with the output
    const std::uint8_t *bm, *dm, *fm, *bp;
    double ds;
    float minFlat;
    unsigned long long* bad;
};

__global__ void calibrateKernel(CalArgs a) {
    unsigned long long local = 0;
    for (int y = blockIdx.y; y < a.h; y += gridDim.y) {
        const std::size_t inRow = static_cast<std::size_t>(y + a.y0) * a.inStride + a.x0;
        const std::size_t outRow = static_cast<std::size_t>(y) * a.w;
        const double sub = a.overscan ? a.overscan[y + a.y0] : 0.0;
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < a.w; x += gridDim.x * blockDim.x) {
            const std::size_t i = outRow + x;
            float v = a.in[inRow + x];
            const std::uint8_t m = a.inMask[inRow + x];
            if (a.overscan) { // float(p - sub), the difference in double
                const double vd = hostToDouble(v);
                v = hostToFloat(hostNanD(vd - sub, vd, sub));
            }
            bool isBad = (a.bp && a.bp[i]) || (a.bm && a.bm[i]) || (a.dm && a.dm[i]) || (a.fm && a.fm[i]);
            if (a.bias) {
                const float b = a.bias[i];
                v = hostNanF(v - b, v, b);
            }
            if (a.dark) { // float(v - ds * d), the product and the difference in double
                const double d = hostToDouble(a.dark[i]), vd = hostToDouble(v);
                const double t = hostNanD(a.ds * d, a.ds, d);
                v = hostToFloat(hostNanD(vd - t, vd, t));
            }
            if (a.flat) {
                const float f = a.flat[i];
                if (isfinite(f) && f > a.minFlat) v = hostNanF(v / f, v, f);
                else isBad = true;
            }
            a.out[i] = v;
            std::uint8_t o = m;
            if (isBad && !(m & MaskBad)) {
                o = static_cast<std::uint8_t>(m | MaskBad);
                ++local;
            }
            a.outMask[i] = o;
        }
    }
    if (local) atomicAdd(a.bad, local); // integer: order-independent
}

double elapsedMs(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    GPUPHOT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

struct Events {
    cudaEvent_t e[5] = {};
    Events() {
        for (auto& x : e) GPUPHOT_CUDA_CHECK(cudaEventCreate(&x));
    }
    ~Events() {
        for (auto& x : e)
            if (x) cudaEventDestroy(x);
    }
    Events(const Events&) = delete;
    Events& operator=(const Events&) = delete;
};

// The whole job; throws DeviceOutOfMemory when the device has no room (the host frame is unchanged then:
// it is written only by the final downloads).
PrepareDeviceResult runJob(Image<float>& pixels, Image<std::uint8_t>& mask, const PrepareDeviceJob& job,
                           RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    const auto wall0 = std::chrono::steady_clock::now();
    const int rw = pixels.width(), rh = pixels.height();
    if (mask.width() != rw || mask.height() != rh)
        throw InvalidInput("prepare (CUDA): the mask is " + std::to_string(mask.width()) + "x" +
                           std::to_string(mask.height()) + " but the frame " + std::to_string(rw) + "x" +
                           std::to_string(rh));
    const int w = job.outWidth, h = job.outHeight;
    if (w <= 0 || h <= 0 || job.outX0 < 0 || job.outY0 < 0 || job.outX0 + w > rw || job.outY0 + h > rh)
        throw InvalidInput("prepare (CUDA): the output section lies outside the frame");
    if (job.overscan && job.overscanRows.size() != static_cast<std::size_t>(rh))
        throw InvalidInput("prepare (CUDA): one overscan level per row expected");
    const bool trimmed = w != rw || h != rh;
    const bool pass = job.overscan || job.calibrate || trimmed; // the per-pixel pass runs
    PrepareDeviceResult res;
    PrepareTimings tm;
    const std::size_t rawN = static_cast<std::size_t>(rw) * rh, n = static_cast<std::size_t>(w) * h;
    if (rawN == 0) {
        res.done = true;
        t_timings = tm;
        return res;
    }
    MasterCache& mc = dc.scratch<MasterCache>();
    Events ev;
    const cudaStream_t s = dc.stream();
    try {
        GPUPHOT_CUDA_CHECK(cudaEventRecord(ev.e[0], s));
        const std::uint64_t uploadsBefore = dc.uploads();
        auto [dPix, dMask] = dc.takeFrame(pixels.view(), mask.view());
        tm.frameUploaded = dc.uploads() != uploadsBefore;
        CalArgs a{};
        if (job.calibrate) {
            const PrepareCalibration& cal = job.cal;
            a.bias = resident(dc, mc.bias, cal.bias);
            a.dark = resident(dc, mc.dark, cal.dark);
            a.flat = resident(dc, mc.flat, cal.flat);
            a.bm = resident(dc, mc.biasMask, cal.biasMask);
            a.dm = resident(dc, mc.darkMask, cal.darkMask);
            a.fm = resident(dc, mc.flatMask, cal.flatMask);
            a.bp = resident(dc, mc.bpm, cal.badPixels);
            a.ds = cal.darkScale;
            a.minFlat = cal.minFlat;
        }
        DeviceBuffer<double> dRows;
        if (job.overscan) {
            dRows = DeviceBuffer<double>(dc, job.overscanRows.size());
            dRows.upload(job.overscanRows.data(), job.overscanRows.size());
        }
        DeviceBuffer<unsigned long long> dCount(dc, 2);
        dCount.zero();
        DeviceBuffer<unsigned> dCols;
        if (job.bleed) {
            dCols = DeviceBuffer<unsigned>(dc, static_cast<std::size_t>(rw));
            dCols.zero();
        }
        DeviceBuffer<float> outPix;
        DeviceBuffer<std::uint8_t> outMask;
        if (trimmed) {
            outPix = DeviceBuffer<float>(dc, n);
            outMask = DeviceBuffer<std::uint8_t>(dc, n);
        }
        GPUPHOT_CUDA_CHECK(cudaEventRecord(ev.e[1], s)); // the frame and the masters are resident
        if (job.bleed) {
            const int block = 64;
            saturatedColumnsKernel<<<dim3(std::min((rw + 255) / 256, 8), std::min(rh, 65535)), 256, 0, s>>>(
                dMask.get(), rw, rh, dCols.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            bleedKernel<<<(rw + block - 1) / block, block, 0, s>>>(dPix.get(), dMask.get(), rw, rh, job.bleedLevel,
                                                                   job.bleedGrow, dCols.get(), dCount.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
        }
        GPUPHOT_CUDA_CHECK(cudaEventRecord(ev.e[2], s));
        if (pass) {
            a.in = dPix.get();
            a.inMask = dMask.get();
            a.inStride = static_cast<std::size_t>(rw);
            a.x0 = job.outX0;
            a.y0 = job.outY0;
            a.out = trimmed ? outPix.get() : dPix.get();
            a.outMask = trimmed ? outMask.get() : dMask.get();
            a.w = w;
            a.h = h;
            a.overscan = job.overscan ? dRows.get() : nullptr;
            a.bad = dCount.get() + 1;
            const int block = dc.blockSize() > 0 ? dc.blockSize() : 256;
            const int gx = static_cast<int>(std::min<long long>((w + block - 1) / block, 8));
            const int gy = std::min(h, 65535);
            calibrateKernel<<<dim3(gx, gy), block, 0, s>>>(a);
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
        }
        GPUPHOT_CUDA_CHECK(cudaEventRecord(ev.e[3], s));
        if (trimmed) { // the raw frame is no longer needed on the device
            dPix = std::move(outPix);
            dMask = std::move(outMask);
        }
        unsigned long long counts[2] = {0, 0};
        dCount.download(counts, 2);
        GPUPHOT_CUDA_CHECK(cudaEventRecord(ev.e[4], s));
        // The host copy: the pixels when a pass changed them, the mask when anything ran.
        const auto d0 = std::chrono::steady_clock::now();
        Image<float> hostPix;
        Image<std::uint8_t> hostMask;
        if (trimmed) {
            hostPix = Image<float>(w, h, Image<float>::NoInit{});
            hostMask = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
        }
        Image<float>& px = trimmed ? hostPix : pixels;
        Image<std::uint8_t>& mk = trimmed ? hostMask : mask;
        try {
            if (pass) dc.downloadStaged(px.data(), dPix.get(), n * sizeof(float));
            dc.downloadStaged(mk.data(), dMask.get(), n); // synchronises the stream
        } catch (const DeviceOutOfMemory& e) { // no pinned staging: the host frame may be half written
            throw CudaError(std::string("prepare (CUDA): the download of the prepared frame failed: ") + e.what());
        }
        tm.downloadMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
        if (trimmed) {
            pixels = std::move(hostPix);
            mask = std::move(hostMask);
        }
        tm.uploadMs = elapsedMs(ev.e[0], ev.e[1]);
        tm.bleedMs = elapsedMs(ev.e[1], ev.e[2]);
        tm.calibrateMs = elapsedMs(ev.e[2], ev.e[3]);
        tm.deviceMs = elapsedMs(ev.e[1], ev.e[3]);
        t_kernelMs = tm.calibrateMs;
        res.bleedPixels = static_cast<std::size_t>(counts[0]);
        res.badPixels = static_cast<std::size_t>(counts[1]);
        if (job.cal.keepOnDevice)
            dc.adoptFrame(pixels.view(), mask.view(), std::move(dPix), std::move(dMask));
        dc.notePlan("whole", 1);
        res.done = true;
        tm.wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
        t_timings = tm;
        return res;
    } catch (...) {
        dc.drain();
        throw;
    }
}

} // namespace

std::uint64_t prepareMasterUploads() { return t_masterUploads; }
double prepareKernelMilliseconds() { return t_kernelMs; }
PrepareTimings prepareLastTimings() { return t_timings; }

PrepareDeviceResult prepareFrameOnDevice(Image<float>& pixels, Image<std::uint8_t>& mask,
                                         const PrepareDeviceJob& job, RunContext& ctx) {
    try {
        return runJob(pixels, mask, job, ctx);
    } catch (const DeviceOutOfMemory& e) {
        // No room: the CPU prepares the frame (prepareFrame's own path); the frame cache is released.
        DeviceContext& dc = DeviceContext::of(ctx);
        dc.drain();
        dc.dropFrame();
        dc.notePlan("cpu", 0, cpuFallbackNote("prepare", dc.budget(), e.what()));
        return {};
    }
}

std::size_t prepareCalibrate(Image<float>& pixels, Image<std::uint8_t>& mask, const PrepareCalibration& cal,
                             RunContext& ctx) {
    PrepareDeviceJob job;
    job.outWidth = pixels.width();
    job.outHeight = pixels.height();
    job.calibrate = true;
    job.cal = cal;
    return runJob(pixels, mask, job, ctx).badPixels;
}

} // namespace gpuphot::cuda
