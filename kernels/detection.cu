// Stage 2 on the GPU, its per-pixel front: background subtraction and pixel states (as `prepare` in
// core/stages/detection.cpp), the matched filter in the summation order of core/stages/convolution.cpp,
// and the above-threshold runs in raster order (per-row counts, a scan, per-row block scans: no atomics,
// deterministic). In the whole plan the filtered image and the states stay on the device and the
// per-object half runs there too (detection_objects.cu, detection_finish.cu); the strips plan (and
// parameters the device half does not take) download sub/det/state and run core's per-object half on the
// host. Either way the catalog is bitwise the CPU one.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background.hpp"
#include "core/stages/convolution.hpp"
#include "core/stages/detection.hpp"
#include "core/stages/detection_internal.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/detection_device.cuh"
#include "kernels/detection_finish.hpp"
#include "kernels/detection_objects.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"

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

// Vertical pass for output rows [outY0, outY0 + outRows) of an H-row image: dst = 0; dst += k[j] * tmp(x,
// y + j - r), j ascending, rows inside the image only. in holds image rows from inY0 on (a strip with its
// halo), out the output rows.
__global__ void convolveColumnsKernel(const float* in, int W, int H, int inY0, int outY0, int outRows,
                                      const float* k, int n, float* out) {
    const int r = n / 2;
    for (int yl = blockIdx.y; yl < outRows; yl += gridDim.y) {
        const int y = outY0 + yl;
        const int j0 = max(0, r - y), j1 = min(n, H + r - y);
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < W; x += gridDim.x * blockDim.x) {
            float acc = 0.0f;
            for (int j = j0; j < j1; ++j)
                acc += k[j] * in[static_cast<std::size_t>(y + j - r - inY0) * W + x];
            out[static_cast<std::size_t>(yl) * W + x] = acc;
        }
    }
}

// 2-D kernel: dst = 0; kernel rows j ascending (rows outside skipped), taps i ascending (outside skipped).
// Strip layout as convolveColumnsKernel.
__global__ void convolve2dKernel(const float* in, int W, int H, int inY0, int outY0, int outRows, const float* k,
                                 int kw, int kh, float* out) {
    const int rx = kw / 2, ry = kh / 2;
    for (int yl = blockIdx.y; yl < outRows; yl += gridDim.y) {
        const int y = outY0 + yl;
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < W; x += gridDim.x * blockDim.x) {
            float acc = 0.0f;
            for (int j = 0; j < kh; ++j) {
                const int yy = y + j - ry;
                if (yy < 0 || yy >= H) continue;
                const float* src = in + static_cast<std::size_t>(yy - inY0) * W;
                const int i0 = max(0, rx - x), i1 = min(kw, W + rx - x);
                for (int i = i0; i < i1; ++i)
                    acc += k[j * kw + i] * src[x + i - rx];
            }
            out[static_cast<std::size_t>(yl) * W + x] = acc;
        }
    }
}

struct ThresholdArgs {
    const float* det;
    const float* rms;
    const std::uint8_t* state;
    int W, H; // H: rows of this strip (det, rms and state address its first row)
    double threshold;
    bool absolute;
    int yOff; // image row of the strip's first row
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
                r.y = y + a.yOff;
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
    if (bkg.hasFullMaps()) {
        if (bkg.level.width() != image.width || bkg.level.height() != image.height) return false;
        if (bkg.rms.width() != image.width || bkg.rms.height() != image.height) return false;
    } else { // lean maps: made on the device from the grid, the host half reads the sampler
        if (!bkg.level.empty() || !bkg.rms.empty() || !bkg.sampler) return false;
        if (bkg.sampler->width() != image.width || bkg.sampler->height() != image.height) return false;
        if (!hasBackgroundGrid(bkg, image.width, image.height)) return false;
    }
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
    if (total == 0) return;
    const std::size_t first = runs.size();
    runs.resize(first + static_cast<std::size_t>(total));
    DeviceBuffer<Run> dRuns(dc, total);
    rowRunsKernel<Threads><<<blocks, Threads, 0, stream>>>(a, offsets.get(), dRuns.get());
    checkLaunch("the run extraction");
    dRuns.download(runs.data() + first, static_cast<std::size_t>(total));
    dc.synchronize();
}

struct DetSetup {
    const ImageView& image;
    const MaskView& mask;
    const BackgroundResult& bkg;
    const DetectionParams& p;
    int W, H;
    std::vector<float> k; // filter taps (empty: no filter)
    int kw = 0, kh = 0;   // kh = 0: separable (k both ways)
    int halo = 0;         // filter half-height
    int threads = 256;
};

// The host copies of sub, det and state for the per-object half (uninitialised until filled).
struct HostImages {
    std::unique_ptr<float[]> sub, det;
    std::unique_ptr<std::uint8_t[]> state;
    std::size_t n = 0, nDet = 0;
    void reserve(std::size_t npix, bool withDet) {
        if (n < npix) {
            sub.reset();
            state.reset();
            sub.reset(new float[npix]);
            state.reset(new std::uint8_t[npix]);
            n = npix;
        }
        if (withDet && nDet < npix) {
            det.reset();
            det.reset(new float[npix]);
            nDet = npix;
        }
    }
};

// Device inputs addressing image row y0: pixels, mask (or null), background level and rms.
struct DetInputs {
    const float* px;
    const std::uint8_t* mk;
    const float* lv;
    const float* rm;
    int y0;
};

// Where processStrip leaves the strip's images: host images (null: not downloaded) and full-frame device
// images kept for the per-object kernels (null: not kept; det only with a filter).
struct StripOutputs {
    float* hSub = nullptr;
    float* hDet = nullptr;
    std::uint8_t* hState = nullptr;
    float* dDet = nullptr;
    std::uint8_t* dState = nullptr;
};

// Rows [y0, y1): subtraction and states over the rows with the filter's halo, the filter, the downloads
// of the strip's rows of sub, det and state into the host images (or their copies into the resident device
// images), and the strip's runs appended.
void processStrip(DeviceContext& dc, const DetSetup& s, const DetInputs& in, const float* dK, int y0, int y1,
                  const StripOutputs& o, std::vector<Run>& runs) {
    const cudaStream_t stream = dc.stream();
    const int W = s.W, H = s.H;
    const int h0 = std::max(0, y0 - s.halo), h1 = std::min(H, y1 + s.halo), hr = h1 - h0, rows = y1 - y0;
    const std::size_t off = static_cast<std::size_t>(h0 - in.y0) * W;
    const std::size_t nHalo = static_cast<std::size_t>(hr) * W, nRows = static_cast<std::size_t>(rows) * W;
    const std::size_t inner = static_cast<std::size_t>(y0 - h0) * W; // the strip's first row in sub/state
    DeviceBuffer<float> dSub(dc, nHalo);
    DeviceBuffer<std::uint8_t> dState(dc, nHalo);
    {
        const int t = s.threads;
        const int blocks = static_cast<int>(std::min<std::size_t>((nHalo + t - 1) / t, 1 << 20));
        prepareKernel<<<blocks, t, 0, stream>>>(in.px + off, in.mk ? in.mk + off : nullptr, in.lv + off, in.rm + off,
                                                nHalo, std::isfinite(s.p.saturationLevel),
                                                static_cast<float>(s.p.saturationLevel), dSub.get(), dState.get());
        checkLaunch("the background subtraction");
    }
    const std::size_t hostOff = static_cast<std::size_t>(y0) * W;
    if (o.hSub) {
        dc.downloadStaged(o.hSub + hostOff, dSub.get() + inner, nRows * sizeof(float));
        dc.downloadStaged(o.hState + hostOff, dState.get() + inner, nRows);
    }
    if (o.dState)
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(o.dState + hostOff, dState.get() + inner, nRows, cudaMemcpyDeviceToDevice,
                                           stream));

    DeviceBuffer<float> dDetOwn;
    const float* det = dSub.get() + inner;
    if (!s.k.empty()) {
        float* dDet = o.dDet ? o.dDet + hostOff : nullptr;
        if (!dDet) {
            dDetOwn = DeviceBuffer<float>(dc, nRows);
            dDet = dDetOwn.get();
        }
        const dim3 block(s.threads, 1);
        const auto gx = static_cast<unsigned>((W + s.threads - 1) / s.threads);
        if (s.kh > 0) {
            const dim3 grid(gx, static_cast<unsigned>(std::min(rows, 65535)));
            convolve2dKernel<<<grid, block, 0, stream>>>(dSub.get(), W, H, h0, y0, rows, dK, s.kw, s.kh, dDet);
            checkLaunch("the 2-D filter");
        } else {
            DeviceBuffer<float> dTmp(dc, nHalo);
            const dim3 gridRows(gx, static_cast<unsigned>(std::min(hr, 65535)));
            convolveRowsKernel<<<gridRows, block, 0, stream>>>(dSub.get(), W, hr, dK, s.kw, dTmp.get());
            checkLaunch("the row filter");
            const dim3 grid(gx, static_cast<unsigned>(std::min(rows, 65535)));
            convolveColumnsKernel<<<grid, block, 0, stream>>>(dTmp.get(), W, H, h0, y0, rows, dK, s.kw, dDet);
            checkLaunch("the column filter");
        }
        if (o.hDet) dc.downloadStaged(o.hDet + hostOff, dDet, nRows * sizeof(float));
        det = dDet;
    }
    const ThresholdArgs a{det, in.rm + static_cast<std::size_t>(y0 - in.y0) * W, dState.get() + inner, W, rows,
                          s.p.threshold, s.p.thresholdIsAbsolute, y0};
    if (dc.blockSize() > 0 && dc.blockSize() <= 128)
        thresholdRuns<128>(dc, a, runs);
    else
        thresholdRuns<256>(dc, a, runs);
    dc.synchronize();
}

// Bytes per strip row of processStrip (sub, state, tmp over the halo rows; det), the strip inputs when
// they are uploaded, and a share for the runs.
std::size_t workPerRow(const DetSetup& s) { return static_cast<std::size_t>(s.W) * (4 + 1 + 4 + 4 + 2); }
std::size_t inputsPerRow(const DetSetup& s) {
    return static_cast<std::size_t>(s.W) * (4 + (s.mask.empty() ? 0 : 1) + 8);
}

// Whole plan: the frame and the maps resident (device caches); the per-pixel work in chunks of rows. With
// `o`'s device images the filtered image and the states stay on the device: dim gets the views of all.
int runWhole(DeviceContext& dc, const DetSetup& s, const float* dK, const StripOutputs& o, std::vector<Run>& runs,
             int chunkRows, RunContext& ctx, DeviceDetectionImages& dim) {
    const DeviceContext::DeviceFrame f = dc.frame(s.image, s.mask);
    const auto [dLevel, dRms] = deviceBackgroundMaps(dc, s.bkg);
    const DetInputs in{f.pixels, f.mask, dLevel, dRms, 0};
    int n = 0;
    for (int y0 = 0; y0 < s.H; y0 += chunkRows, ++n) {
        processStrip(dc, s, in, dK, y0, std::min(s.H, y0 + chunkRows), o, runs);
        ctx.checkCancelled();
    }
    dim.width = s.W;
    dim.height = s.H;
    dim.frame = f.pixels;
    dim.level = dLevel;
    dim.rms = dRms;
    dim.det = s.k.empty() ? nullptr : o.dDet;
    dim.state = o.dState;
    dim.threshold = s.p.threshold;
    dim.absolute = s.p.thresholdIsAbsolute;
    return n;
}

// Strips plan: no device cache; each strip's rows (with the halo) uploaded from the host.
int runStrips(DeviceContext& dc, const DetSetup& s, const float* dK, float* hSub, float* hDet,
              std::uint8_t* hState, std::vector<Run>& runs, int shrink, RunContext& ctx) {
    const std::size_t perRow = workPerRow(s) + inputsPerRow(s);
    // The halo rows, and the scan's scratch (a few kB; counts and offsets are in the per-row share).
    const std::size_t margin = (std::size_t(64) << 10) + 2 * static_cast<std::size_t>(s.halo) * perRow;
    // Lean maps: the strip's rows interpolated on the device from the mesh grid (tables once).
    std::unique_ptr<DeviceBackgroundRows> maps;
    if (!s.bkg.hasFullMaps()) maps = std::make_unique<DeviceBackgroundRows>(dc, s.bkg);
    const int rows = stripRowsFor(dc.available(), perRow, margin, s.H) / shrink;
    if (rows < 1)
        throw DeviceOutOfMemory("detection: one strip row needs " + bytesText(perRow + margin));
    int n = 0;
    for (int y0 = 0; y0 < s.H; y0 += rows, ++n) {
        const int y1 = std::min(s.H, y0 + rows);
        const int h0 = std::max(0, y0 - s.halo), h1 = std::min(s.H, y1 + s.halo);
        const std::size_t np = static_cast<std::size_t>(h1 - h0) * s.W;
        DeviceBuffer<float> px(dc, np), lv(dc, np), rm(dc, np);
        DeviceBuffer<std::uint8_t> mk;
        uploadRows(dc, px.get(), s.image, h0, h1);
        if (maps) {
            maps->rows(h0, h1 - h0, lv.get(), rm.get());
        } else {
            uploadRows(dc, lv.get(), s.bkg.level.view(), h0, h1);
            uploadRows(dc, rm.get(), s.bkg.rms.view(), h0, h1);
        }
        if (!s.mask.empty()) {
            mk = DeviceBuffer<std::uint8_t>(dc, np);
            uploadRows(dc, mk.get(), s.mask, h0, h1);
        }
        processStrip(dc, s, DetInputs{px.get(), mk.get(), lv.get(), rm.get(), h0}, dK, y0, y1,
                     StripOutputs{hSub, hDet, hState, nullptr, nullptr}, runs);
        ctx.checkCancelled();
    }
    return n;
}

// The per-object half on the device images: core's steps 2b-4 (detection_objects.cu), then steps 5-6
// (detection_finish.cu). The filtered image is released in between (the finish step does not read it).
DetectionResult detectOnDevice(DeviceContext& dc, std::vector<Run> runs, DeviceDetectionImages& dim,
                               DeviceBuffer<float>& keptDet, const DetectionParams& p, RunContext& ctx) {
    detail::StepTimer timer;
    detail::DetectedObjects found = detectObjects(dc, std::move(runs), dim, p, ctx);
    timer.lap("detectObjects (device)");
    keptDet.reset();
    dim.det = nullptr;
    DetectionResult result;
    finishDetection(dc, std::move(found), dim, p, ctx, result);
    timer.lap("finishDetection (device)");
    return result;
}

} // namespace

DetectionResult detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& p, RunContext& ctx) {
    if (!acceptable(image, mask, bkg, p)) return cpu::detectSources(image, mask, bkg, p, ctx); // throws

    DeviceContext& dc = DeviceContext::of(ctx);
    detail::StepTimer timer;
    const int W = image.width, H = image.height;
    const std::size_t npix = static_cast<std::size_t>(W) * H;
    DetSetup s{image, mask, bkg, p, W, H};
    s.threads = dc.blockSize() > 0 ? std::min(dc.blockSize(), 1024) : 256;
    if (p.filter) { // kernel taps computed on the host, as the CPU stage
        if (!p.filterKernel.empty()) {
            s.k = p.filterKernel;
            double sum = 0.0;
            for (float v : s.k)
                sum += v;
            if (sum != 0.0)
                for (float& v : s.k)
                    v = static_cast<float>(v / sum);
            s.kw = p.filterKernelWidth;
            s.kh = static_cast<int>(s.k.size()) / s.kw;
            s.halo = s.kh / 2;
        } else {
            s.k = gaussianKernel1d(p.filterFwhm);
            s.kw = static_cast<int>(s.k.size());
            s.halo = s.kw / 2;
        }
    }

    // Host images that the strips fill row by row (the host per-object half), reused between runs:
    // pageable, filled through the context's pinned staging (pinning 1.4 GB at 151 MP cost the first run of a
    // process 0.6 s). Not made in the whole plan when the per-object half runs on the device.
    float* hSub = nullptr;
    float* hDet = nullptr;
    std::uint8_t* hState = nullptr;
    auto hostImages = [&]() {
        auto& state = dc.stageState("detection host images");
        if (!state) state = std::make_shared<HostImages>();
        auto& hi = *static_cast<HostImages*>(state.get());
        hi.reserve(npix, !s.k.empty());
        hSub = hi.sub.get();
        hState = hi.state.get();
        hDet = s.k.empty() ? hSub : hi.det.get();
        return StripOutputs{hSub, hDet, hState, nullptr, nullptr};
    };
    // GPUPHOT_DETECTION_HOST_OBJECTS=1 keeps the host per-object half (comparisons and benchmarks).
    const bool deviceObjects = detectObjectsOnDevice(p) && !std::getenv("GPUPHOT_DETECTION_HOST_OBJECTS");

    // Plan. Whole: frame, mask and both maps resident + one chunk's work (an eighth of the frame, at
    // least 64 rows), + the filtered image and the states kept for the device's per-object half. Strips: as
    // many rows as the budget allows with everything uploaded per strip.
    const int chunkRows = std::min(H, std::max(64, (H + 7) / 8));
    const std::size_t kept = deviceObjects ? npix * (1 + (s.k.empty() ? 0 : sizeof(float))) : 0;
    const std::size_t resident = inputsPerRow(s) * H + kept;
    const std::size_t cached = dc.cachedFrameBytes() + dc.cachedBackgroundBytes();
    const std::size_t others = dc.inUse() - std::min(dc.inUse(), cached);
    const std::size_t wholeNeed = resident + workPerRow(s) * (chunkRows + 2 * s.halo) + (std::size_t(2) << 20);
    std::string why = "whole frame needs " + bytesText(wholeNeed);
    std::vector<Run> runs;
    bool done = false, whole = false;
    DeviceBuffer<float> keptDet;
    DeviceBuffer<std::uint8_t> keptState;
    DeviceDetectionImages dim;
    const std::size_t kBytes = s.k.size() * sizeof(float);
    if (others + wholeNeed + kBytes <= dc.budget()) {
        try {
            DeviceBuffer<float> dK(dc, s.k.size());
            dK.upload(s.k.data(), s.k.size());
            StripOutputs o;
            if (deviceObjects) {
                keptState = DeviceBuffer<std::uint8_t>(dc, npix);
                if (!s.k.empty()) keptDet = DeviceBuffer<float>(dc, npix);
                o.dDet = keptDet.get();
                o.dState = keptState.get();
            } else {
                o = hostImages();
            }
            runWhole(dc, s, dK.get(), o, runs, chunkRows, ctx, dim);
            dc.notePlan("whole", 1);
            done = whole = true;
        } catch (const DeviceOutOfMemory& e) {
            why = e.what();
            dc.drain();
            runs.clear();
            keptDet.reset();
            keptState.reset();
        }
    }
    // Strips plan (also the answer to an allocation failure in the device's per-object half): the host
    // per-object half on images downloaded strip by strip.
    auto stripsPlan = [&]() {
        for (const int shrink : {1, 4}) {
            try {
                dc.dropFrame();
                dc.dropBackground();
                DeviceBuffer<float> dK(dc, s.k.size());
                dK.upload(s.k.data(), s.k.size());
                hostImages();
                const int n = runStrips(dc, s, dK.get(), hSub, hDet, hState, runs, shrink, ctx);
                dc.notePlan("strips", n);
                return true;
            } catch (const DeviceOutOfMemory& e) {
                why = e.what();
                dc.drain();
                runs.clear();
            }
        }
        return false;
    };
    auto cpuPlan = [&]() {
        dc.dropFrame();
        dc.dropBackground();
        dc.notePlan("cpu", 0, cpuFallbackNote("detection", dc.budget(), why));
        return cpu::detectSources(image, mask, bkg, p, ctx);
    };
    if (!done) done = stripsPlan();
    if (!done) return cpuPlan();
    timer.lap(whole && deviceObjects ? "GPU front (images kept on the device)" : "GPU front + sub/det/state downloads");
    ctx.report("detection", 0.2);
    ctx.checkCancelled();

    if (whole && deviceObjects) {
        try {
            return detectOnDevice(dc, std::move(runs), dim, keptDet, p, ctx);
        } catch (const DeviceOutOfMemory& e) {
            // Re-planned as strips (the host per-object half), as an allocation failure in the front is.
            why = e.what();
            dc.drain();
            keptDet.reset();
            keptState.reset();
            runs.clear();
            if (!stripsPlan()) return cpuPlan();
            ctx.checkCancelled();
        }
    }

    // The per-object half on the host, on the downloaded images.
    detail::DetectionImages im;
    im.width = W;
    im.height = H;
    im.sub = ImageView{hSub, W, H, W};
    im.det = ImageView{hDet, W, H, W};
    if (bkg.hasFullMaps())
        im.rms = bkg.rms.view();
    else
        im.rmsSampler = bkg.sampler.get();
    im.state = ImageViewT<std::uint8_t>{hState, W, H, W};
    im.threshold = p.threshold;
    im.absolute = p.thresholdIsAbsolute;
    DetectionResult result;
    detail::DetectedObjects found = detail::detectObjects(std::move(runs), im, p, ctx);
    timer.lap("detectObjects");
    detail::finishDetection(std::move(found), im, p, ctx, result);
    timer.lap("finishDetection");
    return result;
}

} // namespace gpuphot::cuda
