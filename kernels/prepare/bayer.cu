// CFA (Bayer) 2x2 super-pixels on the device, bitwise equal to cfaSuperPixels in
// core/stages/prepare/bayer.cpp: one thread per super-pixel, the same float sums in the same order, -fmad=false,
// and NaN results given the host's bits (kernels/host_nan.cuh). The mask (the OR of the used pixels) stays
// on the host (cfaSuperPixelMask: bytes, no arithmetic).
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/bayer.hpp"
#include "kernels/cpu_fallback.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "kernels/host_nan.cuh"

namespace gpuphot::cuda {

namespace {

// Diagnostics of the calling thread's last call (RunContexts run on their own threads under --concurrent).
thread_local double g_kernelMs = 0.0, g_totalMs = 0.0;

__device__ __forceinline__ float add(float a, float b) {
    return hostNanF(a + b, a, b);
}
__device__ __forceinline__ float mul(float a, float b) {
    return hostNanF(a * b, a, b);
}

// mode 0: luminance (sum, or * 0.25f when mean); 1: green, 0.5f * (a + b); 2: one pixel (a).
// (da, ra), (db, rb): column offset and row (0: file row 2Y, 1: 2Y + 1) of the used pixels, lower row first.
__global__ void superPixelKernel(const float* __restrict__ in, int inW, int w, int h, int mode, bool mean,
                                 int da, int ra, int db, int rb, float* __restrict__ out) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h) return;
    const float* r0 = in + static_cast<std::size_t>(2 * y) * inW;
    const float* r1 = r0 + inW;
    float o;
    if (mode == 0) {
        const float s = add(add(r0[2 * x], r0[2 * x + 1]), add(r1[2 * x], r1[2 * x + 1]));
        o = mean ? mul(0.25f, s) : s;
    } else if (mode == 1) {
        o = mul(0.5f, add((ra ? r1 : r0)[2 * x + da], (rb ? r1 : r0)[2 * x + db]));
    } else {
        o = (ra ? r1 : r0)[2 * x + da];
    }
    out[static_cast<std::size_t>(y) * w + x] = o;
}

} // namespace

double cfaKernelMilliseconds() {
    return g_kernelMs;
}
double cfaTotalMilliseconds() {
    return g_totalMs;
}

namespace {

Image<float> superPixelsOnDevice(const ImageView& pixels, const CfaLayout& layout, CfaOutput output,
                                 bool luminanceMean, RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    const int w = pixels.width / 2, h = pixels.height / 2;
    // The pixels of one cell that the output uses, lower file row first (as bayer.cpp's cellPixels).
    std::vector<std::pair<int, int>> use;
    for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx) {
            const CfaColour c = layout.colourAt(dx, dy, pixels.height);
            if ((output == CfaOutput::Red && c == CfaColour::Red) ||
                (output == CfaOutput::Green && c == CfaColour::Green) ||
                (output == CfaOutput::Blue && c == CfaColour::Blue))
                use.emplace_back(dx, dy);
        }
    const int mode = output == CfaOutput::Luminance ? 0 : (output == CfaOutput::Green ? 1 : 2);
    if ((mode == 1 && use.size() != 2) || (mode == 2 && use.size() != 1))
        throw InvalidInput("colour-filter array: pattern " + layout.pattern + " has no valid 2x2 cell");
    const int da = mode ? use[0].first : 0, ra = mode ? use[0].second : 0;
    const int db = mode == 1 ? use[1].first : 0, rb = mode == 1 ? use[1].second : 0;
    Image<float> out(w, h, Image<float>::NoInit{});
    const cudaStream_t s = dc.stream();
    try {
        // Only the 2h rows that the super-pixels use travel.
        const int rows = 2 * h;
        DeviceBuffer<float> in(dc, static_cast<std::size_t>(pixels.width) * rows);
        DeviceBuffer<float> dOut(dc, static_cast<std::size_t>(w) * h);
        cudaEvent_t e[4];
        for (auto& ev : e)
            GPUPHOT_CUDA_CHECK(cudaEventCreate(&ev));
        GPUPHOT_CUDA_CHECK(cudaEventRecord(e[0], s));
        uploadRows(dc, in.get(), pixels, 0, rows);
        GPUPHOT_CUDA_CHECK(cudaEventRecord(e[1], s));
        const dim3 block(32, 8), grid((w + 31) / 32, (h + 7) / 8);
        superPixelKernel<<<grid, block, 0, s>>>(in.get(), pixels.width, w, h, mode, luminanceMean, da, ra, db,
                                                rb, dOut.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        GPUPHOT_CUDA_CHECK(cudaEventRecord(e[2], s));
        dOut.download(out.data(), static_cast<std::size_t>(w) * h);
        GPUPHOT_CUDA_CHECK(cudaEventRecord(e[3], s));
        dc.synchronize();
        float k = 0.0f, t = 0.0f;
        GPUPHOT_CUDA_CHECK(cudaEventElapsedTime(&k, e[1], e[2]));
        GPUPHOT_CUDA_CHECK(cudaEventElapsedTime(&t, e[0], e[3]));
        for (auto& ev : e)
            cudaEventDestroy(ev);
        g_kernelMs = k;
        g_totalMs = t;
        dc.notePlan("whole", 1);
    } catch (...) {
        dc.drain();
        throw;
    }
    return out;
}

} // namespace

// The size was checked by the CPU entry (core/stages/prepare/bayer.cpp), which dispatches here. Without device
// room for the frame and the result, the CPU bins it (plan "cpu").
Image<float> cfaSuperPixels(const ImageView& pixels, const CfaLayout& layout, CfaOutput output,
                            bool luminanceMean, RunContext& ctx) {
    return withCpuFallback(
        ctx, "bayer", [&] { return superPixelsOnDevice(pixels, layout, output, luminanceMean, ctx); },
        [&] { return gpuphot::cfaSuperPixels(pixels, layout, output, luminanceMean, ctx); });
}

} // namespace gpuphot::cuda
