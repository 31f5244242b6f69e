// Frame preparation on the device: L.A.Cosmic and the salt-and-pepper prefilter, bitwise equal to
// core/stages/prepare/cosmic_rays.cpp (the algorithm is described in cosmic_rays.hpp). Every step is the CPU's
// per-pixel function of a fixed neighbourhood, one thread per pixel, with the same float / double
// operations in the same order (-fmad=false, IEEE division and square root):
//  - medians: each thread sorts its k x k window by columns, then by rows, and selects the median among
//    the entries of the doubly sorted window that can hold it, all in registers (Batcher's odd-even merge
//    networks, fully unrolled; the compiler drops the comparators whose outputs are not used). Any exact
//    selection returns the same order statistic; only the sign of a zero median could depend on the
//    network, and no result depends on it (a median only enters sums with a non-zero or +0 term,
//    comparisons and max(., 0.01f)), so masks and counts are bitwise those of the CPU;
//  - the frame medians (the background level of the non-finite pixels, the salt-and-pepper fill, centre
//    and MAD) are exact order statistics by a three-pass radix select (11/11/10-bit digits, block
//    histograms in shared memory, integer counts: no order dependence);
//  - counts are per-block __syncthreads_count sums added with integer atomics.
// The frame is uploaded into private buffers (not the frame cache: prepareFrame ORs the result into the
// host mask in place, which the cache's sampled fingerprint could miss).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/model/image.hpp"
#include "core/model/instrument.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/cosmic_rays.hpp"
#include "kernels/cpu_fallback.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

namespace {

constexpr std::uint8_t kBadBits = MaskBad | MaskNonFinite | MaskOutside;
constexpr int kBx = 32, kBy = 8;

// Of the calling thread's last call (RunContexts run on their own threads under --concurrent).
thread_local CosmicRayTimings g_cosmicTimings;

// ---- medians ------------------------------------------------------------------------------------------

__device__ __forceinline__ void cswap(float& a, float& b) {
    const float lo = fminf(a, b), hi = fmaxf(a, b);
    a = lo;
    b = hi;
}

// Batcher's odd-even merge sort network for N elements (the network of the CPU's batcherNetwork: the
// power-of-two network without the comparators that touch padding), built at compile time and applied to
// registers with compile-time indices.
template <int N> struct Network {
    int a[N * N] = {};
    int b[N * N] = {};
    int size = 0;
};
template <int N> constexpr Network<N> makeNetwork() {
    Network<N> net;
    for (int p = 1; p < N; p <<= 1)
        for (int k = p; k >= 1; k >>= 1)
            for (int j = k % p; j + k < N; j += 2 * k)
                for (int i = 0; i < k && i < N - j - k; ++i)
                    if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
                        net.a[net.size] = i + j;
                        net.b[net.size] = i + j + k;
                        ++net.size;
                    }
    return net;
}
template <int N> struct NetworkOf { static constexpr Network<N> value = makeNetwork<N>(); };
template <int X> struct Const { static constexpr int v = X; };

template <int N, int... C>
__device__ __forceinline__ void applyNetwork(float (&v)[N], std::integer_sequence<int, C...>) {
    (cswap(v[Const<NetworkOf<N>::value.a[C]>::v], v[Const<NetworkOf<N>::value.b[C]>::v]), ...);
}
template <int N> __device__ __forceinline__ void sortNet(float (&v)[N]) {
    applyNetwork<N>(v, std::make_integer_sequence<int, NetworkOf<N>::value.size>{});
}

// For a K x K window sorted by columns, then by rows: entry (i, j) (column rank i, row rank j) can be the
// median only when (K-i)(K-j) <= M+1 and (i+1)(j+1) <= M+1 (M = (K*K-1)/2); the entries with
// (K-i)(K-j) > M+1 lie below it, so the median is the candidate of rank M - (their count).
template <int K> struct Candidates {
    int i[K * K] = {};
    int j[K * K] = {};
    int size = 0;
    int target = 0;
};
template <int K> constexpr Candidates<K> makeCandidates() {
    Candidates<K> c;
    const int m = (K * K - 1) / 2;
    int low = 0;
    for (int i = 0; i < K; ++i)
        for (int j = 0; j < K; ++j) {
            if ((K - i) * (K - j) > m + 1)
                ++low;
            else if ((i + 1) * (j + 1) <= m + 1) {
                c.i[c.size] = i;
                c.j[c.size] = j;
                ++c.size;
            }
        }
    c.target = m - low;
    return c;
}
template <int K> struct CandidatesOf { static constexpr Candidates<K> value = makeCandidates<K>(); };

template <int K, int NC, int... C>
__device__ __forceinline__ void gatherCandidates(const float (&row)[K][K], float (&cand)[NC],
                                                 std::integer_sequence<int, C...>) {
    ((cand[C] = row[Const<CandidatesOf<K>::value.i[C]>::v][Const<CandidatesOf<K>::value.j[C]>::v]), ...);
}

// Exact K x K median at (x, y), edges replicated.
template <int K>
__device__ __forceinline__ float medianAt(const float* __restrict__ in, int w, int h, int x, int y) {
    constexpr int R = K / 2;
    float col[K][K]; // col[j][i]: column j (x offset), row i (y offset), sorted over i
    int xs[K];
#pragma unroll
    for (int j = 0; j < K; ++j)
        xs[j] = min(max(x - R + j, 0), w - 1);
#pragma unroll
    for (int i = 0; i < K; ++i) {
        const float* rowPtr = in + static_cast<std::size_t>(min(max(y - R + i, 0), h - 1)) * w;
#pragma unroll
        for (int j = 0; j < K; ++j)
            col[j][i] = __ldg(rowPtr + xs[j]);
    }
#pragma unroll
    for (int j = 0; j < K; ++j)
        sortNet<K>(col[j]);
    float row[K][K]; // row[i][j]: column rank i, sorted over j
#pragma unroll
    for (int i = 0; i < K; ++i) {
#pragma unroll
        for (int j = 0; j < K; ++j)
            row[i][j] = col[j][i];
        sortNet<K>(row[i]);
    }
    constexpr int NC = CandidatesOf<K>::value.size;
    float cand[NC];
    gatherCandidates<K, NC>(row, cand, std::make_integer_sequence<int, NC>{});
    sortNet<NC>(cand);
    return cand[CandidatesOf<K>::value.target];
}

// ---- small helpers --------------------------------------------------------------------------------------

// std::max(a, b) exactly: (a < b) ? b : a.
__device__ __forceinline__ float stdMax(float a, float b) {
    return (a < b) ? b : a;
}

dim3 gridOf(int w, int h) {
    return dim3((w + kBx - 1) / kBx, (h + kBy - 1) / kBy);
}
const dim3 kBlock(kBx, kBy);

#define PIXEL_XY                                                                                             \
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;          \
    const bool inside = x < w && y < h;                                                                      \
    const std::size_t i = inside ? static_cast<std::size_t>(y) * w + x : 0

// Adds the block's count of `pred` to *count (every thread of the block must call it).
__device__ __forceinline__ void blockCount(bool pred, unsigned long long* count) {
    const int n = __syncthreads_count(pred);
    if (n && threadIdx.x == 0 && threadIdx.y == 0) atomicAdd(count, static_cast<unsigned long long>(n));
}

// 3x3 square, or (radius 2, corners dropped) the 5x5 kernel without its corners.
template <int Radius, bool DropCorners>
__device__ __forceinline__ bool anySet(const std::uint8_t* __restrict__ m, int w, int h, int x, int y) {
#pragma unroll
    for (int dy = -Radius; dy <= Radius; ++dy) {
        const int yy = y + dy;
        if (yy < 0 || yy >= h) continue;
#pragma unroll
        for (int dx = -Radius; dx <= Radius; ++dx) {
            if (DropCorners && (dx == Radius || dx == -Radius) && (dy == Radius || dy == -Radius)) continue;
            const int xx = x + dx;
            if (xx < 0 || xx >= w) continue;
            if (m[static_cast<std::size_t>(yy) * w + xx]) return true;
        }
    }
    return false;
}

// ---- radix select ---------------------------------------------------------------------------------------

__device__ __forceinline__ unsigned orderKey(float f) {
    const unsigned u = static_cast<unsigned>(__float_as_int(f));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
inline float keyToFloat(unsigned k) {
    const unsigned u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

constexpr int kBins = 2048;

// Histogram of digit (key >> shift) & digitMask over the elements with (use[i] != 0) == want (use null:
// all) whose key agrees with `prefix` on the bits above the digit (prefixMask).
__global__ void digitHistogram(const float* __restrict__ v, const std::uint8_t* __restrict__ use,
                               std::uint8_t want, std::size_t n, int shift, unsigned digitMask,
                               unsigned prefixMask, unsigned prefix, unsigned* __restrict__ hist) {
    __shared__ unsigned local[kBins];
    for (int b = threadIdx.x; b < kBins; b += blockDim.x)
        local[b] = 0;
    __syncthreads();
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x) {
        if (use && (use[i] != 0) != (want != 0)) continue;
        const unsigned k = orderKey(v[i]);
        if ((k & prefixMask) != prefix) continue;
        atomicAdd(&local[(k >> shift) & digitMask], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += blockDim.x)
        if (local[b]) atomicAdd(&hist[b], local[b]);
}

// The order statistic of rank r (0-based) of v over the selected elements (count of them: `count`,
// r < count). Exact, as nth_element's value.
float selectRank(DeviceContext& dc, const float* v, const std::uint8_t* use, bool want, std::size_t n,
                 std::size_t r) {
    DeviceBuffer<unsigned> hist(dc, kBins);
    std::vector<unsigned> h(kBins);
    int sms = 0, dev = 0;
    GPUPHOT_CUDA_CHECK(cudaGetDevice(&dev));
    GPUPHOT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int grid =
        static_cast<int>(std::min<std::size_t>((n + 255) / 256, static_cast<std::size_t>(sms) * 8));
    unsigned prefix = 0, prefixMask = 0;
    const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    for (int pass = 0; pass < 3; ++pass) {
        const unsigned bins = 1u << widths[pass];
        hist.zero();
        digitHistogram<<<std::max(grid, 1), 256, 0, dc.stream()>>>(v, use, want ? 1 : 0, n, shifts[pass],
                                                                   bins - 1u, prefixMask, prefix, hist.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        hist.download(h.data(), kBins);
        dc.synchronize();
        unsigned digit = 0;
        for (; digit < bins; ++digit) {
            if (r < h[digit]) break;
            r -= h[digit];
        }
        if (digit == bins) throw CudaError("radix select: rank beyond the selected elements");
        const unsigned mask = (bins - 1u) << shifts[pass];
        prefix |= digit << shifts[pass];
        prefixMask |= mask;
    }
    return keyToFloat(prefix);
}

// ---- L.A.Cosmic kernels -----------------------------------------------------------------------------------

// Electrons and bad input pixels; counts the good ones.
__global__ void electronsKernel(const float* __restrict__ src, const std::uint8_t* __restrict__ mask, int w,
                                int h, double pedestal, double gain, float* __restrict__ e,
                                std::uint8_t* __restrict__ bad, unsigned long long* good) {
    PIXEL_XY;
    bool b = true;
    if (inside) {
        const float s = src[i];
        b = !isfinite(s) || (mask && (mask[i] & kBadBits));
        bad[i] = b;
        e[i] = b ? 0.0f : static_cast<float>((static_cast<double>(s) - pedestal) * gain);
    }
    blockCount(inside && !b, good);
}

__global__ void fillNonFiniteKernel(const float* __restrict__ src, int w, int h, float level,
                                    float* __restrict__ e) {
    PIXEL_XY;
    if (inside && !isfinite(src[i])) e[i] = level;
}

// notGood = the 3x3 dilation of bad.
__global__ void growBadKernel(const std::uint8_t* __restrict__ bad, int w, int h,
                              std::uint8_t* __restrict__ notGood) {
    PIXEL_XY;
    if (inside) notGood[i] = anySet<1, false>(bad, w, h, x, y);
}

__global__ void saturatedKernel(const float* __restrict__ e, int w, int h, float satE, float coreE,
                                std::uint8_t* __restrict__ sat) {
    PIXEL_XY;
    if (inside) sat[i] = e[i] >= satE && medianAt<5>(e, w, h, x, y) > coreE;
}

// out = the dilation by the 5x5 kernel without corners; with `count`, also notGood |= out and the count.
__global__ void dilate5Kernel(const std::uint8_t* __restrict__ in, int w, int h,
                              std::uint8_t* __restrict__ out, std::uint8_t* __restrict__ notGood,
                              unsigned long long* count) {
    PIXEL_XY;
    bool any = false;
    if (inside) {
        any = anySet<2, true>(in, w, h, x, y);
        out[i] = any;
        if (notGood && any) notGood[i] = 1;
    }
    if (count) blockCount(any, count);
}

// Noise model and S = L+ / (2 N).
__global__ void laplacianKernel(const float* __restrict__ e, int w, int h, float rn2,
                                float* __restrict__ noise, float* __restrict__ sp) {
    PIXEL_XY;
    if (!inside) return;
    const float* c = e + static_cast<std::size_t>(y) * w;
    const float* up = e + static_cast<std::size_t>(max(y - 1, 0)) * w;
    const float* dn = e + static_cast<std::size_t>(min(y + 1, h - 1)) * w;
    const float v2 = 2.0f * c[x];
    const float l = c[max(x - 1, 0)], r = c[min(x + 1, w - 1)];
    const float lplus = 0.25f * ((stdMax(0.0f, (v2 - l) - up[x]) + stdMax(0.0f, (v2 - r) - up[x])) +
                                 (stdMax(0.0f, (v2 - l) - dn[x]) + stdMax(0.0f, (v2 - r) - dn[x])));
    const float m5 = medianAt<5>(e, w, h, x, y);
    const float n = sqrtf(stdMax(m5 + rn2, 1e-5f));
    noise[i] = n;
    sp[i] = lplus / (2.0f * n);
}

// out = in - med5(in).
__global__ void subtractMedian5Kernel(const float* __restrict__ in, int w, int h, float* __restrict__ out) {
    PIXEL_XY;
    if (inside) out[i] = in[i] - medianAt<5>(in, w, h, x, y);
}

template <int K>
__global__ void medianKernel(const float* __restrict__ in, int w, int h, float* __restrict__ out) {
    PIXEL_XY;
    if (inside) out[i] = medianAt<K>(in, w, h, x, y);
}

// Fine structure F = max((med3 - med7(med3)) / N, 0.01) and the candidates.
__global__ void candidateKernel(const float* __restrict__ f3, const float* __restrict__ noise,
                                const float* __restrict__ sp, const std::uint8_t* __restrict__ notGood, int w,
                                int h, float sigclip, float objlim, std::uint8_t* __restrict__ cand) {
    PIXEL_XY;
    if (!inside) return;
    const float m7 = medianAt<7>(f3, w, h, x, y);
    const float f = stdMax((f3[i] - m7) / noise[i], 0.01f);
    const float s = sp[i];
    cand[i] = !notGood[i] && s > sigclip && s / f > objlim;
}

// Growth, first step: the 3x3 dilation of the candidates where S' > sigclip, good pixels only.
__global__ void growKernel(const std::uint8_t* __restrict__ cand, const float* __restrict__ sp,
                           const std::uint8_t* __restrict__ notGood, int w, int h, float limit,
                           std::uint8_t* __restrict__ out) {
    PIXEL_XY;
    if (inside) out[i] = anySet<1, false>(cand, w, h, x, y) && !notGood[i] && sp[i] > limit;
}

// Growth, second step, joined to the mask; counts the new pixels.
__global__ void joinKernel(const std::uint8_t* __restrict__ grown, const float* __restrict__ sp,
                           const std::uint8_t* __restrict__ notGood, int w, int h, float siglow,
                           std::uint8_t* __restrict__ cr, unsigned long long* fresh) {
    PIXEL_XY;
    bool isNew = false;
    if (inside) {
        const bool hit = anySet<1, false>(grown, w, h, x, y) && !notGood[i] && sp[i] > siglow;
        isNew = hit && !cr[i];
        if (isNew) cr[i] = 1;
    }
    blockCount(isNew, fresh);
}

// Cosmic-ray pixels := the mean of the good, unmasked pixels of their 5x5 neighbourhood (reads only
// pixels that are not written).
__global__ void replaceKernel(const std::uint8_t* __restrict__ cr, const std::uint8_t* __restrict__ notGood,
                              int w, int h, float level, float* __restrict__ e) {
    PIXEL_XY;
    if (!inside || !cr[i]) return;
    float s = 0.0f;
    int n = 0;
    for (int yy = max(y - 2, 0); yy <= min(y + 2, h - 1); ++yy)
        for (int xx = max(x - 2, 0); xx <= min(x + 2, w - 1); ++xx) {
            const std::size_t j = static_cast<std::size_t>(yy) * w + xx;
            if (!cr[j] && !notGood[j]) {
                s += e[j];
                ++n;
            }
        }
    e[i] = n > 0 ? s / static_cast<float>(n) : level;
}

__global__ void outputMaskKernel(const std::uint8_t* __restrict__ cr, std::size_t n,
                                 std::uint8_t* __restrict__ out) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x)
        out[i] = cr[i] ? MaskCosmicRay : 0;
}

// The display image: cosmic-ray pixels replaced by the median (lower middle) of the good, non-cosmic-ray
// pixels of their 5x5 neighbourhood.
__global__ void cleanKernel(const float* __restrict__ src, const std::uint8_t* __restrict__ cr,
                            const std::uint8_t* __restrict__ bad, int w, int h, float* __restrict__ out) {
    PIXEL_XY;
    if (!inside) return;
    float v = src[i];
    if (cr[i]) {
        float vals[25];
        int n = 0;
        for (int yy = max(y - 2, 0); yy <= min(y + 2, h - 1); ++yy)
            for (int xx = max(x - 2, 0); xx <= min(x + 2, w - 1); ++xx) {
                const std::size_t j = static_cast<std::size_t>(yy) * w + xx;
                if (!cr[j] && !bad[j]) vals[n++] = src[j];
            }
        if (n > 0) {
            const int r = (n - 1) / 2;
            for (int a = 0; a < n; ++a) {
                int less = 0, equal = 0;
                for (int b = 0; b < n; ++b) {
                    less += vals[b] < vals[a];
                    equal += vals[b] == vals[a];
                }
                if (less <= r && r < less + equal) {
                    v = vals[a];
                    break;
                }
            }
        }
    }
    out[i] = v;
}

// ---- salt and pepper
// ----------------------------------------------------------------------------------------

__global__ void validKernel(const float* __restrict__ px, const std::uint8_t* __restrict__ mask, int w, int h,
                            std::uint8_t* __restrict__ valid, unsigned long long* count) {
    PIXEL_XY;
    bool ok = false;
    if (inside) {
        ok = isfinite(px[i]) && !(mask && (mask[i] & kBadBits));
        valid[i] = ok;
    }
    blockCount(ok, count);
}

__global__ void fillKernel(float* __restrict__ px, int w, int h, float fill) {
    PIXEL_XY;
    if (inside && !isfinite(px[i])) px[i] = fill;
}

template <int K>
__global__ void residualKernel(const float* __restrict__ work, int w, int h, float* __restrict__ res) {
    PIXEL_XY;
    if (inside) res[i] = work[i] - medianAt<K>(work, w, h, x, y);
}

__global__ void absDevKernel(const float* __restrict__ res, std::size_t n, float centre,
                             float* __restrict__ out) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x)
        out[i] = fabsf(res[i] - centre);
}

__global__ void flagKernel(const float* __restrict__ res, const std::uint8_t* __restrict__ valid, int w,
                           int h, float hi, float lo, std::uint8_t* __restrict__ out,
                           unsigned long long* counts) {
    PIXEL_XY;
    bool high = false, low = false;
    if (inside) {
        if (valid[i]) {
            const float r = res[i];
            high = r > hi;
            low = !high && r < -lo;
        }
        out[i] = (high || low) ? MaskBad : 0;
    }
    blockCount(high, counts);
    blockCount(low, counts + 1);
}

#undef PIXEL_XY

// ---- host side
// ------------------------------------------------------------------------------------------------

int linearGrid(std::size_t n) {
    int sms = 0, dev = 0;
    GPUPHOT_CUDA_CHECK(cudaGetDevice(&dev));
    GPUPHOT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return static_cast<int>(
        std::max<std::size_t>(1, std::min<std::size_t>((n + 255) / 256, std::size_t(sms) * 16)));
}

void checkLaunch() {
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
}

unsigned long long readCount(DeviceContext& dc, const DeviceBuffer<unsigned long long>& c, int index = 0) {
    unsigned long long v[2] = {0, 0};
    c.download(v, c.size());
    dc.synchronize();
    return v[index];
}

// Stream-ordered event timer.
struct Timer {
    cudaEvent_t a = nullptr, b = nullptr;
    explicit Timer(cudaStream_t s) {
        GPUPHOT_CUDA_CHECK(cudaEventCreate(&a));
        GPUPHOT_CUDA_CHECK(cudaEventCreate(&b));
        GPUPHOT_CUDA_CHECK(cudaEventRecord(a, s));
    }
    ~Timer() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    // Milliseconds since construction (or the last call); synchronises.
    double lap(cudaStream_t s) {
        GPUPHOT_CUDA_CHECK(cudaEventRecord(b, s));
        GPUPHOT_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0.0f;
        GPUPHOT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        std::swap(a, b);
        return ms;
    }
};

CosmicRayResult cosmicsOnDevice(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                const CosmicRayParams& p, RunContext& ctx) {
    CosmicRayResult res;
    res.gain = p.gain > 0 ? p.gain : instrument.gain;
    res.readnoise = p.readnoise >= 0 ? p.readnoise : instrument.readNoise;
    res.satlevel = p.satlevel > 0 ? p.satlevel : instrument.saturation;
    DeviceContext& dc = DeviceContext::of(ctx);
    const int w = pixels.width, h = pixels.height;
    const std::size_t n = pixels.pixelCount();
    const float rn2 = static_cast<float>(res.readnoise * res.readnoise);
    const float sigclip = static_cast<float>(p.sigclip), siglow = static_cast<float>(p.sigfrac * p.sigclip);
    const float objlim = static_cast<float>(p.objlim);
    const cudaStream_t s = dc.stream();
    const dim3 grid = gridOf(w, h);
    CosmicRayTimings t;
    try {
        Timer timer(s);
        DeviceBuffer<float> src(dc, n), e(dc, n), noise(dc, n), spA(dc, n), spB(dc, n), f3(dc, n);
        DeviceBuffer<std::uint8_t> bad(dc, n), notGood(dc, n), cand(dc, n), grown(dc, n), cr(dc, n), inMask;
        DeviceBuffer<unsigned long long> count(dc, 1);
        uploadRows(dc, src.get(), pixels, 0, h);
        if (!mask.empty()) {
            inMask = DeviceBuffer<std::uint8_t>(dc, n);
            uploadRows(dc, inMask.get(), mask, 0, h);
        }
        count.zero();
        electronsKernel<<<grid, kBlock, 0, s>>>(src.get(), inMask.get(), w, h, p.pedestal, res.gain, e.get(),
                                                bad.get(), count.get());
        checkLaunch();
        const std::size_t good = readCount(dc, count);
        const float level = good ? selectRank(dc, e.get(), bad.get(), false, n, (good - 1) / 2) : 0.0f;
        fillNonFiniteKernel<<<grid, kBlock, 0, s>>>(src.get(), w, h, level, e.get());
        checkLaunch();
        ctx.checkCancelled();

        growBadKernel<<<grid, kBlock, 0, s>>>(bad.get(), w, h, notGood.get());
        checkLaunch();
        if (std::isfinite(res.satlevel)) {
            const float satE = static_cast<float>((res.satlevel - p.pedestal) * res.gain);
            const float coreE = static_cast<float>((res.satlevel / 10.0 - p.pedestal) * res.gain);
            saturatedKernel<<<grid, kBlock, 0, s>>>(e.get(), w, h, satE, coreE, cand.get());
            checkLaunch();
            dilate5Kernel<<<grid, kBlock, 0, s>>>(cand.get(), w, h, grown.get(), nullptr, nullptr);
            checkLaunch();
            count.zero();
            dilate5Kernel<<<grid, kBlock, 0, s>>>(grown.get(), w, h, cand.get(), notGood.get(), count.get());
            checkLaunch();
            res.saturatedStarPixels = readCount(dc, count);
        }
        ctx.checkCancelled();
        GPUPHOT_CUDA_CHECK(cudaMemsetAsync(cr.get(), 0, n, s));
        t.setupMs = timer.lap(s);

        for (int it = 0; it < p.niter; ++it) {
            laplacianKernel<<<grid, kBlock, 0, s>>>(e.get(), w, h, rn2, noise.get(), spA.get());
            checkLaunch();
            subtractMedian5Kernel<<<grid, kBlock, 0, s>>>(spA.get(), w, h, spB.get());
            checkLaunch();
            medianKernel<3><<<grid, kBlock, 0, s>>>(e.get(), w, h, f3.get());
            checkLaunch();
            candidateKernel<<<grid, kBlock, 0, s>>>(f3.get(), noise.get(), spB.get(), notGood.get(), w, h,
                                                    sigclip, objlim, cand.get());
            checkLaunch();
            growKernel<<<grid, kBlock, 0, s>>>(cand.get(), spB.get(), notGood.get(), w, h, sigclip,
                                               grown.get());
            checkLaunch();
            count.zero();
            joinKernel<<<grid, kBlock, 0, s>>>(grown.get(), spB.get(), notGood.get(), w, h, siglow, cr.get(),
                                               count.get());
            checkLaunch();
            const std::size_t fresh = readCount(dc, count);
            res.perIteration.push_back(fresh);
            ctx.report("cosmic_rays", static_cast<double>(it + 1) / p.niter);
            const bool last = fresh == 0 || it + 1 == p.niter;
            if (!last) {
                replaceKernel<<<grid, kBlock, 0, s>>>(cr.get(), notGood.get(), w, h, level, e.get());
                checkLaunch();
            }
            t.iterationMs.push_back(timer.lap(s));
            if (last) break;
            ctx.checkCancelled();
        }

        res.mask = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
        outputMaskKernel<<<linearGrid(n), 256, 0, s>>>(cr.get(), n, grown.get());
        checkLaunch();
        grown.download(res.mask.data(), n);
        if (p.clean) {
            cleanKernel<<<grid, kBlock, 0, s>>>(src.get(), cr.get(), bad.get(), w, h, noise.get());
            checkLaunch();
            res.cleaned = Image<float>(w, h, Image<float>::NoInit{});
            noise.download(res.cleaned.data(), n);
        }
        dc.synchronize();
        std::size_t total = 0;
        for (std::size_t v : res.perIteration)
            total += v;
        res.crPixels = total;
        t.outputMs = timer.lap(s);
        dc.notePlan("whole", 1);
    } catch (...) {
        dc.drain();
        throw;
    }
    g_cosmicTimings = t;
    return res;
}

SaltPepperResult saltPepperOnDevice(const ImageView& pixels, const MaskView& mask, const SaltPepperParams& p,
                                    RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    const int w = pixels.width, h = pixels.height;
    const std::size_t n = pixels.pixelCount();
    const cudaStream_t s = dc.stream();
    const dim3 grid = gridOf(w, h);
    SaltPepperResult res;
    try {
        DeviceBuffer<float> work(dc, n), resid(dc, n), dev(dc, n);
        DeviceBuffer<std::uint8_t> valid(dc, n), out(dc, n), inMask;
        DeviceBuffer<unsigned long long> count(dc, 2);
        uploadRows(dc, work.get(), pixels, 0, h);
        if (!mask.empty()) {
            inMask = DeviceBuffer<std::uint8_t>(dc, n);
            uploadRows(dc, inMask.get(), mask, 0, h);
        }
        count.zero();
        validKernel<<<grid, kBlock, 0, s>>>(work.get(), inMask.get(), w, h, valid.get(), count.get());
        checkLaunch();
        const std::size_t nv = readCount(dc, count);
        const float fill = nv ? selectRank(dc, work.get(), valid.get(), true, n, (nv - 1) / 2) : 0.0f;
        fillKernel<<<grid, kBlock, 0, s>>>(work.get(), w, h, fill);
        checkLaunch();
        if (p.window == 3)
            residualKernel<3><<<grid, kBlock, 0, s>>>(work.get(), w, h, resid.get());
        else
            residualKernel<5><<<grid, kBlock, 0, s>>>(work.get(), w, h, resid.get());
        checkLaunch();
        ctx.checkCancelled();
        const float centre = nv ? selectRank(dc, resid.get(), valid.get(), true, n, (nv - 1) / 2) : 0.0f;
        absDevKernel<<<linearGrid(n), 256, 0, s>>>(resid.get(), n, centre, dev.get());
        checkLaunch();
        const float mad = nv ? selectRank(dc, dev.get(), valid.get(), true, n, (nv - 1) / 2) : 0.0f;
        res.sigma = 1.4826 * static_cast<double>(mad);
        const float hi = static_cast<float>(p.highSigma * res.sigma),
                    lo = static_cast<float>(p.lowSigma * res.sigma);
        count.zero();
        flagKernel<<<grid, kBlock, 0, s>>>(resid.get(), valid.get(), w, h, hi, lo, out.get(), count.get());
        checkLaunch();
        res.mask = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
        out.download(res.mask.data(), n);
        unsigned long long c[2] = {0, 0};
        count.download(c, 2);
        dc.synchronize();
        res.high = c[0];
        res.low = c[1];
        dc.notePlan("whole", 1);
    } catch (...) {
        dc.drain();
        throw;
    }
    return res;
}

} // namespace

CosmicRayTimings cosmicRaysLastTimings() {
    return g_cosmicTimings;
}

// The inputs were checked by the CPU entries (core/stages/prepare/cosmic_rays.cpp), which dispatch here. Peak
// device memory: 6 float and 6 byte images (30 bytes per pixel, 4.5 GB at 151 MP) for L.A.Cosmic, 3 float
// and 3 byte images for the prefilter; without room, the CPU runs the step (plan "cpu").
CosmicRayResult detectCosmicRays(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                 const CosmicRayParams& p, RunContext& ctx) {
    return withCpuFallback(
        ctx, "cosmic_rays", [&] { return cosmicsOnDevice(pixels, mask, instrument, p, ctx); },
        [&] { return gpuphot::detectCosmicRays(pixels, mask, instrument, p, ctx); });
}

SaltPepperResult saltPepperMask(const ImageView& pixels, const MaskView& mask, const SaltPepperParams& p,
                                RunContext& ctx) {
    return withCpuFallback(
        ctx, "salt_pepper", [&] { return saltPepperOnDevice(pixels, mask, p, ctx); },
        [&] { return gpuphot::saltPepperMask(pixels, mask, p, ctx); });
}

} // namespace gpuphot::cuda
