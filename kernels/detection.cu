// Stage 2 on the GPU, its per-pixel front: background subtraction and pixel states (as `prepare` in
// core/stages/detection.cpp), the matched filter in the summation order of core/stages/convolution.cpp,
// and the above-threshold runs in raster order (per-row counts, a scan, per-row block scans: no atomics,
// deterministic). The per-object half (labelling, deblending, cleaning, measurement) runs on the host in
// core's detail::detectFromRuns on the downloaded sub/det/state images, so the catalog is bitwise the
// CPU one.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background.hpp"
#include "core/stages/convolution.hpp"
#include "core/stages/detection.hpp"
#include "core/stages/detection_internal.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {
namespace {

using detail::Run;
static_assert(sizeof(Run) == 3 * sizeof(std::int32_t), "Run is downloaded as three int32");

constexpr std::uint8_t kInvalid = detail::StateInvalid;
constexpr std::uint8_t kBad = detail::StateBad;
constexpr std::uint8_t kSaturated = detail::StateSaturated;

__global__ void prepareKernel(const float* in, const std::uint8_t* mask, const float* lv, const float* rm,
                              std::size_t n, bool hasSat, float sat, float* sub, std::uint8_t* state) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const float v = in[i];
        const std::uint8_t mb = mask ? mask[i] : 0;
        std::uint8_t s = 0;
        if (!isfinite(v) || !isfinite(lv[i]) || !isfinite(rm[i]) || (mb & (MaskNonFinite | MaskOutside)))
            s |= kInvalid | kBad;
        if (mb & (MaskBad | MaskCosmicRay)) s |= kBad;
        if ((mb & MaskSaturated) || (hasSat && v >= sat)) s |= kSaturated;
        sub[i] = (s & kBad) ? 0.0f : v - lv[i];
        state[i] = s;
    }
}

// Horizontal pass: acc = 0; acc += k[j] * in(x + j - r), j ascending, taps inside the row only.
__global__ void convolveRowsKernel(const float* in, int W, int H, const float* k, int n, float* out) {
    const int r = n / 2;
    for (int y = blockIdx.y; y < H; y += gridDim.y) {
        const float* src = in + static_cast<std::size_t>(y) * W;
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < W; x += gridDim.x * blockDim.x) {
            float acc = 0.0f;
            const int j0 = max(0, r - x), j1 = min(n, W + r - x);
            for (int j = j0; j < j1; ++j)
                acc += k[j] * src[x + j - r];
            out[static_cast<std::size_t>(y) * W + x] = acc;
        }
    }
}

// Vertical pass: dst = 0; dst += k[j] * tmp(x, y + j - r), j ascending, rows inside the image only.
__global__ void convolveColumnsKernel(const float* in, int W, int H, const float* k, int n, float* out) {
    const int r = n / 2;
    for (int y = blockIdx.y; y < H; y += gridDim.y) {
        const int j0 = max(0, r - y), j1 = min(n, H + r - y);
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < W; x += gridDim.x * blockDim.x) {
            float acc = 0.0f;
            for (int j = j0; j < j1; ++j)
                acc += k[j] * in[static_cast<std::size_t>(y + j - r) * W + x];
            out[static_cast<std::size_t>(y) * W + x] = acc;
        }
    }
}

// 2-D kernel: dst = 0; kernel rows j ascending (rows outside skipped), taps i ascending (outside skipped).
__global__ void convolve2dKernel(const float* in, int W, int H, const float* k, int kw, int kh, float* out) {
    const int rx = kw / 2, ry = kh / 2;
    for (int y = blockIdx.y; y < H; y += gridDim.y) {
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < W; x += gridDim.x * blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < kh; ++j) {
                const int yy = y + j - ry;
                if (yy < 0 || yy >= H) continue;
                const float* src = in + static_cast<std::size_t>(yy) * W;
                const int i0 = max(0, rx - x), i1 = min(kw, W + rx - x);
                for (int i = i0; i < i1; ++i)
                    acc += k[j * kw + i] * src[x + i - rx];
            }
            out[static_cast<std::size_t>(y) * W + x] = acc;
        }
    }
}

struct ThresholdArgs {
    const float* det;
    const float* rms;
    const std::uint8_t* state;
    int W, H;
    double threshold;
    bool absolute;
};

__device__ inline bool above(const ThresholdArgs& a, std::size_t i) {
    const double t = a.absolute ? a.threshold : a.threshold * static_cast<double>(a.rms[i]);
    return !(a.state[i] & kInvalid) && static_cast<double>(a.det[i]) > t;
}

// Number of runs (run starts) per row.
template <int Threads> __global__ void rowCountKernel(ThresholdArgs a, int* counts) {
    using Reduce = cub::BlockReduce<int, Threads>;
    __shared__ typename Reduce::TempStorage tmp;
    for (int y = blockIdx.x; y < a.H; y += gridDim.x) {
        const std::size_t row = static_cast<std::size_t>(y) * a.W;
        int c = 0;
        for (int x = threadIdx.x; x < a.W; x += Threads)
            c += (above(a, row + x) && (x == 0 || !above(a, row + x - 1))) ? 1 : 0;
        const int total = Reduce(tmp).Sum(c);
        if (threadIdx.x == 0) counts[y] = total;
        __syncthreads();
    }
}

// Runs of each row at its offset, in order of x: the k-th start and the k-th end of a row form run k.
template <int Threads> __global__ void rowRunsKernel(ThresholdArgs a, const int* offsets, Run* runs) {
    using Scan = cub::BlockScan<unsigned, Threads>;
    __shared__ typename Scan::TempStorage tmp;
    for (int y = blockIdx.x; y < a.H; y += gridDim.x) {
        const std::size_t row = static_cast<std::size_t>(y) * a.W;
        Run* out = runs + offsets[y];
        int starts = 0, ends = 0;
        for (int x0 = 0; x0 < a.W; x0 += Threads) {
            const int x = x0 + threadIdx.x;
            unsigned s = 0, e = 0;
            if (x < a.W && above(a, row + x)) {
                s = (x == 0 || !above(a, row + x - 1)) ? 1u : 0u;
                e = (x == a.W - 1 || !above(a, row + x + 1)) ? 1u : 0u;
            }
            unsigned prefix = 0, total = 0;
            Scan(tmp).ExclusiveSum(s | (e << 16), prefix, total); // <= Threads of each: no carry
            if (s) {
                Run& r = out[starts + (prefix & 0xffffu)];
                r.y = y;
                r.x0 = x;
            }
            if (e) out[ends + (prefix >> 16)].x1 = x;
            starts += total & 0xffffu;
            ends += total >> 16;
            __syncthreads();
        }
    }
}

void checkLaunch(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw CudaError(std::string("detection: launching ") + what + ": " + cudaGetErrorString(e));
}

// The CPU stage's parameter checks; anything it would reject is handed to it (it throws the message).
bool acceptable(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                const DetectionParams& p) {
    if (image.empty()) return false;
    if (bkg.level.width() != image.width || bkg.level.height() != image.height) return false;
    if (bkg.rms.width() != image.width || bkg.rms.height() != image.height) return false;
    if (!mask.empty() && (mask.width != image.width || mask.height != image.height)) return false;
    if (!(p.threshold > 0.0) || !std::isfinite(p.threshold)) return false;
    if (p.minArea < 1 || p.deblendLevels < 1 || p.deblendLevels > 1024) return false;
    if (!(p.deblendContrast >= 0.0) || p.deblendContrast > 1.0 || p.deblendMaxChildren < 2) return false;
    if (p.clean && !(p.cleanParam > 0.0)) return false;
    if (!(p.gain >= 0.0)) return false;
    if (p.filter && !p.filterKernel.empty()) {
        const int kw = p.filterKernelWidth;
        if (kw <= 0 || p.filterKernel.size() % kw != 0) return false;
        const int kh = static_cast<int>(p.filterKernel.size()) / kw;
        if (kw % 2 == 0 || kh % 2 == 0) return false;
    }
    return true;
}

template <int Threads>
void thresholdRuns(DeviceContext& dc, const ThresholdArgs& a, std::vector<Run>& runs) {
    const cudaStream_t stream = dc.stream();
    const int blocks = std::min(a.H, 65535);
    DeviceBuffer<int> counts(dc, static_cast<std::size_t>(a.H) + 1);
    counts.zero();
    rowCountKernel<Threads><<<blocks, Threads, 0, stream>>>(a, counts.get());
    checkLaunch("the run count");
    DeviceBuffer<int> offsets(dc, static_cast<std::size_t>(a.H) + 1);
    std::size_t tmpBytes = 0;
    GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, tmpBytes, counts.get(), offsets.get(), a.H + 1,
                                                     stream));
    DeviceBuffer<unsigned char> tmp(dc, std::max<std::size_t>(tmpBytes, 1));
    GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp.get(), tmpBytes, counts.get(), offsets.get(), a.H + 1,
                                                     stream));
    int total = 0;
    offsets.download(&total, 1, a.H);
    dc.synchronize();
    runs.resize(static_cast<std::size_t>(total));
    if (total == 0) return;
    DeviceBuffer<Run> dRuns(dc, total);
    rowRunsKernel<Threads><<<blocks, Threads, 0, stream>>>(a, offsets.get(), dRuns.get());
    checkLaunch("the run extraction");
    dRuns.download(runs.data(), runs.size());
}

} // namespace

DetectionResult detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& p, RunContext& ctx) {
    if (!acceptable(image, mask, bkg, p)) return cpu::detectSources(image, mask, bkg, p, ctx); // throws

    DeviceContext& dc = DeviceContext::of(ctx);
    const cudaStream_t stream = dc.stream();
    const int W = image.width, H = image.height;
    const std::size_t npix = static_cast<std::size_t>(W) * H;
    const int threads = dc.blockSize() > 0 ? std::min(dc.blockSize(), 1024) : 256;

    // 1. Subtraction and pixel states.
    const DeviceContext::DeviceFrame f = dc.frame(image, mask);
    const auto [dLevel, dRms] = dc.background(bkg.level, bkg.rms);
    DeviceBuffer<float> dSub(dc, npix);
    DeviceBuffer<std::uint8_t> dState(dc, npix);
    {
        const int blocks = static_cast<int>(std::min<std::size_t>((npix + threads - 1) / threads, 1 << 20));
        prepareKernel<<<blocks, threads, 0, stream>>>(f.pixels, f.mask, dLevel, dRms, npix,
                                                      std::isfinite(p.saturationLevel),
                                                      static_cast<float>(p.saturationLevel), dSub.get(),
                                                      dState.get());
        checkLaunch("the background subtraction");
    }
    auto* hSub = static_cast<float*>(dc.pinned(0, npix * sizeof(float)));
    auto* hState = static_cast<std::uint8_t*>(dc.pinned(2, npix));
    dSub.download(hSub, npix);
    dState.download(hState, npix);

    // 2. Matched filter (kernel taps computed on the host, as the CPU stage).
    DeviceBuffer<float> dDet;
    if (p.filter) {
        std::vector<float> k;
        int kw = 0, kh = 0;
        if (!p.filterKernel.empty()) {
            k = p.filterKernel;
            double sum = 0.0;
            for (float v : k)
                sum += v;
            if (sum != 0.0)
                for (float& v : k)
                    v = static_cast<float>(v / sum);
            kw = p.filterKernelWidth;
            kh = static_cast<int>(k.size()) / kw;
        } else {
            k = gaussianKernel1d(p.filterFwhm);
            kw = static_cast<int>(k.size());
        }
        DeviceBuffer<float> dK(dc, k.size());
        dK.upload(k.data(), k.size());
        dDet = DeviceBuffer<float>(dc, npix);
        const dim3 block(threads, 1);
        const dim3 grid(static_cast<unsigned>((W + threads - 1) / threads), static_cast<unsigned>(std::min(H, 65535)));
        if (kh > 0) {
            convolve2dKernel<<<grid, block, 0, stream>>>(dSub.get(), W, H, dK.get(), kw, kh, dDet.get());
            checkLaunch("the 2-D filter");
        } else {
            DeviceBuffer<float> dTmp(dc, npix);
            convolveRowsKernel<<<grid, block, 0, stream>>>(dSub.get(), W, H, dK.get(), kw, dTmp.get());
            checkLaunch("the row filter");
            convolveColumnsKernel<<<grid, block, 0, stream>>>(dTmp.get(), W, H, dK.get(), kw, dDet.get());
            checkLaunch("the column filter");
        }
        dSub.reset();
    }
    const float* det = p.filter ? dDet.get() : dSub.get();
    float* hDet = hSub;
    if (p.filter) {
        hDet = static_cast<float*>(dc.pinned(1, npix * sizeof(float)));
        dDet.download(hDet, npix);
    }

    // 3. Threshold runs in raster order.
    ThresholdArgs a{det, dRms, dState.get(), W, H, p.threshold, p.thresholdIsAbsolute};
    std::vector<Run> runs;
    if (dc.blockSize() > 0 && dc.blockSize() <= 128)
        thresholdRuns<128>(dc, a, runs);
    else
        thresholdRuns<256>(dc, a, runs);
    dc.synchronize();
    ctx.report("detection", 0.2);
    ctx.checkCancelled();

    // 4. The per-object half on the host, on the downloaded images.
    detail::DetectionImages im;
    im.width = W;
    im.height = H;
    im.sub = ImageView{hSub, W, H, W};
    im.det = ImageView{hDet, W, H, W};
    im.rms = bkg.rms.view();
    im.state = ImageViewT<std::uint8_t>{hState, W, H, W};
    im.threshold = p.threshold;
    im.absolute = p.thresholdIsAbsolute;
    dState.reset();
    dDet.reset();
    dSub.reset();
    return detail::detectFromRuns(std::move(runs), im, p, ctx);
}

} // namespace gpuphot::cuda
