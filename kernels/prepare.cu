// prepareFrame's per-pixel calibration on the device (issue 9): bias, dark scaled by exposure, flat with
// the minFlat guard, master / bad-pixel masks -> MaskBad. The masters (and their masks and the bad-pixel
// mask) are uploaded once per DeviceContext and stay resident, keyed by their host view (pointer, size,
// stride, a sampled fingerprint) like the frame cache; the calibrated frame is downloaded into the host
// Frame and, unless a later prepare step changes it in place, kept as the frame cache for the stages.
// Saturation is already in the mask (readFrame), bleed trails, overscan and trim run before on the CPU
// (prepare.cpp, applyOverscanAndTrim): run-length scans along columns, not per-pixel work.
// Bitwise equal to the CPU loop: the same float / double operations in the same order, -fmad=false, IEEE
// division (no fast math), and NaN results given the host's bits (the device makes canonical NaNs).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "core/model/image.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

namespace {

// The resident masters are keyed like the frame cache (DeviceContext's viewKey).
template <class T> ViewKey keyOf(const ImageViewT<T>& v) {
    if (v.empty()) return {};
    return viewKey(v);
}

template <class T> struct Resident {
    ViewKey key;
    DeviceBuffer<T> buf;
};

// The resident calibration, one slot per input.
struct MasterCache {
    Resident<float> bias, dark, flat;
    Resident<std::uint8_t> biasMask, darkMask, flatMask, bpm;
    std::uint64_t uploads = 0;
};

std::uint64_t g_masterUploads = 0;
double g_kernelMs = 0.0;

template <class T> const T* resident(DeviceContext& dc, Resident<T>& slot, const ImageViewT<T>& v) {
    if (v.empty()) {
        slot.buf.reset();
        slot.key = {};
        return nullptr;
    }
    const ViewKey k = keyOf(v);
    const std::size_t n = static_cast<std::size_t>(v.width) * v.height;
    if (!(k == slot.key) || slot.buf.size() != n) {
        slot.key = {};
        slot.buf.reset();
        slot.buf = DeviceBuffer<T>(dc, n);
        uploadRows(dc, slot.buf.get(), v, 0, v.height);
        slot.key = k;
        ++g_masterUploads;
    }
    return slot.buf.get();
}

struct KernelArgs {
    float* px;
    std::uint8_t* mask;
    const float *bias, *dark, *flat;
    const std::uint8_t *bm, *dm, *fm, *bp;
    double ds;
    float minFlat;
    std::size_t n;
    unsigned long long* bad;
};

// The host's (x86-64 SSE) NaN results, so that NaN pixels keep the CPU's bits too: an operation with a
// NaN operand returns the first NaN operand, quieted; an invalid one (inf - inf, 0/0) the default NaN,
// negative; a conversion keeps the sign and the top payload bits. The device's arithmetic returns a
// canonical NaN instead.
__device__ __forceinline__ float quietF(float x) { return __int_as_float(__float_as_int(x) | 0x00400000); }
__device__ __forceinline__ double quietD(double x) {
    return __longlong_as_double(__double_as_longlong(x) | 0x0008000000000000ll);
}
__device__ __forceinline__ float nanF(float r, float a, float b) {
    if (!isnan(r)) return r;
    if (isnan(a)) return quietF(a);
    if (isnan(b)) return quietF(b);
    return __int_as_float(static_cast<int>(0xffc00000u));
}
__device__ __forceinline__ double nanD(double r, double a, double b) {
    if (!isnan(r)) return r;
    if (isnan(a)) return quietD(a);
    if (isnan(b)) return quietD(b);
    return __longlong_as_double(static_cast<long long>(0xfff8000000000000ull));
}
__device__ __forceinline__ double toDouble(float x) {
    if (!isnan(x)) return static_cast<double>(x);
    const unsigned u = static_cast<unsigned>(__float_as_int(x)) | 0x00400000u;
    const unsigned long long d = (static_cast<unsigned long long>(u >> 31) << 63) | 0x7ff0000000000000ull |
                                 (static_cast<unsigned long long>(u & 0x007fffffu) << 29);
    return __longlong_as_double(static_cast<long long>(d));
}
__device__ __forceinline__ float toFloat(double x) {
    if (!isnan(x)) return static_cast<float>(x);
    const unsigned long long d = static_cast<unsigned long long>(__double_as_longlong(x)) | 0x0008000000000000ull;
    const unsigned u = (static_cast<unsigned>(d >> 63) << 31) | 0x7f800000u |
                       static_cast<unsigned>((d >> 29) & 0x007fffffu);
    return __int_as_float(static_cast<int>(u));
}

__global__ void calibrateKernel(KernelArgs a) {
    unsigned int local = 0;
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < a.n;
         i += std::size_t(gridDim.x) * blockDim.x) {
        bool isBad = (a.bp && a.bp[i]) || (a.bm && a.bm[i]) || (a.dm && a.dm[i]) || (a.fm && a.fm[i]);
        float v = a.px[i];
        if (a.bias) {
            const float b = a.bias[i];
            v = nanF(v - b, v, b);
        }
        if (a.dark) {
            // float(v - ds * d), the product and the difference in double
            const double d = toDouble(a.dark[i]), vd = toDouble(v);
            const double t = nanD(a.ds * d, a.ds, d);
            v = toFloat(nanD(vd - t, vd, t));
        }
        if (a.flat) {
            const float f = a.flat[i];
            if (isfinite(f) && f > a.minFlat) v = nanF(v / f, v, f);
            else isBad = true;
        }
        a.px[i] = v;
        const std::uint8_t m = a.mask[i];
        if (isBad && !(m & MaskBad)) {
            a.mask[i] = static_cast<std::uint8_t>(m | MaskBad);
            ++local;
        }
    }
    // one atomic per thread that found any (grid-stride: a few hundred thousand threads at most)
    if (local) atomicAdd(a.bad, static_cast<unsigned long long>(local));
}

} // namespace

std::uint64_t prepareMasterUploads() { return g_masterUploads; }
double prepareKernelMilliseconds() { return g_kernelMs; }

std::size_t prepareCalibrate(Image<float>& pixels, Image<std::uint8_t>& mask, const PrepareCalibration& cal,
                             RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    const int w = pixels.width(), h = pixels.height();
    if (mask.width() != w || mask.height() != h)
        throw InvalidInput("prepare (CUDA): the mask is " + std::to_string(mask.width()) + "x" +
                           std::to_string(mask.height()) + " but the frame " + std::to_string(w) + "x" +
                           std::to_string(h));
    const std::size_t n = static_cast<std::size_t>(w) * h;
    if (n == 0) return 0;
    auto& state = dc.stageState("prepare");
    if (!state) state = std::make_shared<MasterCache>();
    auto& mc = *static_cast<MasterCache*>(state.get());
    try {
        KernelArgs a{};
        a.bias = resident(dc, mc.bias, cal.bias);
        a.dark = resident(dc, mc.dark, cal.dark);
        a.flat = resident(dc, mc.flat, cal.flat);
        a.bm = resident(dc, mc.biasMask, cal.biasMask);
        a.dm = resident(dc, mc.darkMask, cal.darkMask);
        a.fm = resident(dc, mc.flatMask, cal.flatMask);
        a.bp = resident(dc, mc.bpm, cal.badPixels);
        DeviceBuffer<float> dPix(dc, n);
        DeviceBuffer<std::uint8_t> dMask(dc, n);
        DeviceBuffer<unsigned long long> dBad(dc, 1);
        dc.uploadStaged(dPix.get(), pixels.data(), n * sizeof(float)); // pinned staging
        dc.uploadStaged(dMask.get(), mask.data(), n);
        dBad.zero();
        a.px = dPix.get();
        a.mask = dMask.get();
        a.ds = cal.darkScale;
        a.minFlat = cal.minFlat;
        a.n = n;
        a.bad = dBad.get();
        const int block = dc.blockSize() > 0 ? dc.blockSize() : 256;
        int sms = 0, dev = 0;
        GPUPHOT_CUDA_CHECK(cudaGetDevice(&dev));
        GPUPHOT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        const std::size_t want = (n + block - 1) / block;
        const int grid = static_cast<int>(std::min<std::size_t>(want, static_cast<std::size_t>(sms) * 16));
        cudaEvent_t e0 = nullptr, e1 = nullptr;
        GPUPHOT_CUDA_CHECK(cudaEventCreate(&e0));
        GPUPHOT_CUDA_CHECK(cudaEventCreate(&e1));
        GPUPHOT_CUDA_CHECK(cudaEventRecord(e0, dc.stream()));
        calibrateKernel<<<grid, block, 0, dc.stream()>>>(a);
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        GPUPHOT_CUDA_CHECK(cudaEventRecord(e1, dc.stream()));
        // The host Frame is still read by the host stages (PSF stamps, outputs): downloaded through the
        // pinned staging buffers; the device copy becomes the frame cache below.
        unsigned long long bad = 0;
        dc.downloadStaged(pixels.data(), dPix.get(), n * sizeof(float));
        dc.downloadStaged(mask.data(), dMask.get(), n);
        dBad.download(&bad, 1);
        dc.synchronize();
        float ms = 0.0f;
        GPUPHOT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        g_kernelMs = ms;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        if (cal.keepOnDevice)
            dc.adoptFrame(pixels.view(), mask.view(), std::move(dPix), std::move(dMask));
        dc.notePlan("whole", 1);
        return static_cast<std::size_t>(bad);
    } catch (...) {
        dc.drain();
        throw;
    }
}

} // namespace gpuphot::cuda
