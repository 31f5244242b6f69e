// Stage 4 on the GPU: the per-source loops of aperture photometry (core/stages/aperture/aperture_internal.hpp) as
// kernels behind detail::ApertureEngine, so that core's driver (validation, sky fallbacks, flags, errors,
// curve of growth, aperture correction: on the host) gives bitwise the CPU stage's numbers:
//   - local sky: one block per source (skyBlockKernel: the annulus keys gathered in shared memory, a bitonic
//     sort there, one thread's clipped statistics) when the annulus fits 8192 keys; otherwise, or with
//     GPUPHOT_APERTURE_SKY=split, per-source annulus counts, an exclusive scan (CUB), the annulus values as
//     order-preserving keys, a segmented sort of each source's keys (CUB DeviceSegmentedSort; with
//     GPUPHOT_APERTURE_HEAPSORT=1 one thread per source sorts instead), then one thread per source: the
//     clipped statistics. Any correct sort of these totally ordered integers gives the CPU's radix-sorted
//     array; the prefix sums that the CPU keeps in arrays are recomputed by the same running sums;
//   - circular apertures: one thread per (source, radius) summing the pixels that radius cuts (exact
//     overlap) and the pixels it is the first to hold wholly, in raster order in double (one warp each for
//     calls of few pairs, pass 2's, or always with GPUPHOT_APERTURE_CIRCLE=warp); a second kernel adds the
//     "whole pixel" parts over the radii as the CPU does;
//   - the S/N-optimal radius of pass 3: one thread per source over the curve-of-growth grid
//     (GPUPHOT_APERTURE_OPTIMAL=host: the driver's host loop);
//   - Kron: one warp per source (first moment, then the exact elliptical sum; lanes compute the pixels'
//     terms, every lane adds them in raster order), or one thread per source (GPUPHOT_APERTURE_KRON=thread).
// Inputs go up and results come down through the stage's reusable pinned buffers (its DeviceContext scratch).
// The pass-1 calls are queued (localSkiesAsync, sumCirclesAsync, kronAsync; results copied out in finish()),
// so that the driver's host work runs beside them; the driver's batch buffers stay in the DeviceContext for
// the next call (GPUPHOT_APERTURE_SYNC=1: every call done before it returns; GPUPHOT_APERTURE_KEEP=0: buffers
// per call). No atomics; every sum has one fixed order. Pixels and mask come from the DeviceContext's frame
// cache, the background maps from its background cache; the segmentation map is the detection's device copy
// when it is still cached (kernels/detection/detection_finish.hpp), else uploaded per call.
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/aperture/aperture_internal.hpp"
#include "core/stages/background/background.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/detection/detection_finish.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/kernel_clock.cuh"

namespace gpuphot::cuda {

// Test hook (tests/kernels/aperture_cuda_test.cpp declares it): the local sky's intermediate arrays.
// offsets (n + 1): source i's pixels are [offsets[i], offsets[i + 1]) of index (frame index y * width + x,
// enumeration order) and sorted (the values as sorted on the device; garbage when too few); est: the skies.
void debugLocalSkies(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
                     const double* cx, const double* cy, std::size_t n, double rin, double rout,
                     const detail::SkyParamsHD& p, double saturation, RunContext& ctx,
                     std::vector<int>& offsets, std::vector<int>& index, std::vector<float>& sorted,
                     std::vector<detail::SkyEstimate>& est);
// Test hook: pass 3's optimal grid index of n jobs on the device (grid's arrays on the host); -1 each when the
// engine declines (GPUPHOT_APERTURE_OPTIMAL=host).
void debugOptimalRadii(const detail::OptimalJob* jobs, std::size_t n, const detail::OptimalGrid& grid,
                       std::int32_t* index, RunContext& ctx);

namespace {

struct AnnulusDebug {
    std::vector<int> offsets, index;
    std::vector<float> sorted;
};

using detail::ApertureFlagDistances;
using detail::AperturePlanes;
using detail::ApertureSums;
using detail::CircleJob;
using detail::KronJob;
using detail::KronOut;
using detail::SkyEstimate;

void checkLaunch(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        throw CudaError(std::string("aperture: launching ") + what + ": " + cudaGetErrorString(e));
}

__global__ void annulusCountKernel(AperturePlanes in, const double* cx, const double* cy, std::size_t n,
                                   double rin, double rout, int* counts) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        int c = 0;
        detail::forAnnulus(in, cx[i], cy[i], rin, rout, [&](float) { ++c; });
        counts[i] = c;
    }
}

__global__ void annulusFillKernel(AperturePlanes in, const double* cx, const double* cy, std::size_t n,
                                  double rin, double rout, const int* offsets, std::uint32_t* keys) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        std::uint32_t* out = keys + offsets[i];
        detail::forAnnulus(in, cx[i], cy[i], rin, rout,
                           [&](float v) { *out++ = detail::floatKey(__float_as_uint(v)); });
    }
}

// Test hook: the frame index (y * width + x) of each annulus pixel, in enumeration order.
__global__ void annulusIndexKernel(AperturePlanes in, const double* cx, const double* cy, std::size_t n,
                                   double rin, double rout, const int* offsets, int* index) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        int* out = index + offsets[i];
        detail::forAnnulusAt(in, cx[i], cy[i], rin, rout,
                             [&](int x, int y, float) { *out++ = y * in.width + x; });
    }
}

// Tuning aperture.timing: the stage's phases on stderr when it ends (a KernelClock: CUDA events on the
// stream, summed by name over the batches; host clocks for the engine calls and the whole stage; the rest is
// the driver's host work). Off: no events, no output.

// Host wall clock of one engine call into the clock (when on).
class HostClock {
public:
    HostClock(KernelClock& t, const char* name)
        : m_t(t), m_name(name), m_t0(std::chrono::steady_clock::now()) {}
    ~HostClock() {
        m_t.addHost(
            m_name,
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - m_t0).count());
    }

private:
    KernelClock& m_t;
    const char* m_name;
    std::chrono::steady_clock::time_point m_t0;
};

// The sorted keys back to float values (every key; those of sources with too few pixels are not read).
__global__ void keysToValuesKernel(const std::uint32_t* keys, std::size_t total, float* values) {
    for (std::size_t q = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; q < total;
         q += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        values[q] = __uint_as_float(detail::keyBits(keys[q]));
}

// Per source: the clipped statistics of its sorted annulus values.
__global__ void skySortedStatsKernel(const float* values, const int* offsets, std::size_t n,
                                     detail::SkyParamsHD p, SkyEstimate* out) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t len = static_cast<std::size_t>(offsets[i + 1] - offsets[i]);
        out[i] = detail::skyStatistics(values + offsets[i], len, p, nullptr, nullptr);
    }
}

// Per source: its annulus keys sorted in place (heap sort), turned back into float values in a separate
// array (no type-punned reads of one buffer), then the clipped statistics.
__global__ void skyStatsKernel(std::uint32_t* keys, const int* offsets, std::size_t n, detail::SkyParamsHD p,
                               float* values, SkyEstimate* out) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t len = static_cast<std::size_t>(offsets[i + 1] - offsets[i]);
        std::uint32_t* k = keys + offsets[i];
        float* v = values + offsets[i];
        if (static_cast<long long>(len) >= static_cast<long long>(p.minPixels > 2 ? p.minPixels : 2)) {
            detail::heapSortKeys(k, len);
            for (std::size_t q = 0; q < len; ++q)
                v[q] = __uint_as_float(detail::keyBits(k[q]));
        }
        out[i] = detail::skyStatistics(v, len, p, nullptr, nullptr);
    }
}

// Block-per-source local sky (the default; GPUPHOT_APERTURE_SKY=split: the count/scan/fill/segmented-sort
// path above): the annulus pixels' keys gathered into shared memory (warps over rows, lanes over a row's
// span, a pixel's mask, segment and value read together; slots from a shared counter, one atomic per warp:
// the gathered order is arbitrary, and irrelevant, the keys being totally ordered integers that are sorted
// next), a bitonic sort there (padded with 0xFFFFFFFF, above the key of every finite value; fast = 2, the
// default: the short strides in registers, bitonicOwnBlocks, when the padded length is 4-32 keys per thread;
// fast = 1 (GPUPHOT_APERTURE_SKY_SORT=pairs) or other lengths: each thread one compare-exchange pair at a
// time), then thread 0's clipped statistics of the sorted keys read as values, its
// running sums restarted from checkpoints every kSkyCheckpoint values (in shared memory after the keys)
// rather than from 0 at every clipping iteration (fast = 0: the plain way, the sums from 0, one thread per
// pair index with half of them idle, the mask/segment/value reads one after the other). cap: the keys'
// length, a power of two >= annulusSideBound(rout)^2. est.n = -1: more pixels than cap (cannot happen; the
// host checks).
struct SortedKeyValues {
    const std::uint32_t* k;
    GPUPHOT_HD float operator[](std::size_t i) const {
        const std::uint32_t bits = detail::keyBits(k[i]);
        float v;
        std::memcpy(&v, &bits, sizeof v);
        return v;
    }
};

// Shared memory of skyBlockKernel: the keys, then (fast) the two checkpoint arrays.
inline std::size_t skyBlockShared(int cap) {
    return static_cast<std::size_t>(cap) * 4 +
           2 * 8 * (static_cast<std::size_t>(cap) / detail::kSkyCheckpoint + 1);
}

// The bitonic network's compare-exchange of the pair (a: the lower index t, b: t + j): ascending when t's bit
// k is clear (the pair loops' `((t & k) == 0) == (a > b)`: swap).
__device__ inline void compareExchange(std::uint32_t& a, std::uint32_t& b, bool asc) {
    const std::uint32_t lo = a < b ? a : b, hi = a < b ? b : a;
    a = asc ? lo : hi;
    b = asc ? hi : lo;
}
// One sub-stage (k, j) of the network pair by pair: pair q is the lower index t (bit j clear) and t + j.
__device__ inline void bitonicPairs(std::uint32_t* keys, int n2, int k, int j) {
    for (int q = threadIdx.x; q < (n2 >> 1); q += blockDim.x) {
        const int t = ((q & ~(j - 1)) << 1) | (q & (j - 1)), u = t + j;
        const std::uint32_t a = keys[t], b = keys[u];
        if (((t & k) == 0) == (a > b)) {
            keys[t] = b;
            keys[u] = a;
        }
    }
}
template <int S>
__device__ inline void loadOwnKeys(const std::uint32_t* keys, int base, std::uint32_t (&r)[S]) {
    const uint4* v = reinterpret_cast<const uint4*>(keys + base);
#pragma unroll
    for (int q = 0; q < S / 4; ++q) {
        const uint4 w = v[q];
        r[4 * q] = w.x;
        r[4 * q + 1] = w.y;
        r[4 * q + 2] = w.z;
        r[4 * q + 3] = w.w;
    }
}
template <int S>
__device__ inline void storeOwnKeys(std::uint32_t* keys, int base, const std::uint32_t (&r)[S]) {
    uint4* v = reinterpret_cast<uint4*>(keys + base);
#pragma unroll
    for (int q = 0; q < S / 4; ++q)
        v[q] = make_uint4(r[4 * q], r[4 * q + 1], r[4 * q + 2], r[4 * q + 3]);
}
// The bitonic sort of n2 keys (a power of two) in shared memory by a block whose thread b owns the S = n2 /
// blockDim.x keys [b S, (b + 1) S) (S a multiple of 4; the keys 16-byte aligned): the network's sub-stages of
// stride j < S touch one thread's keys only, so each run of them is done in registers (keys loaded and stored
// 16 bytes at a time) with no barrier; those of stride >= S pair by pair in shared memory, as before. The
// network's compare-exchanges, in an order that keeps each sub-stage after the one before for every key.
template <int S> __device__ void bitonicOwnBlocks(std::uint32_t* keys, int n2) {
    const int base = static_cast<int>(threadIdx.x) * S;
    std::uint32_t r[S];
    loadOwnKeys<S>(keys, base, r);
#pragma unroll
    for (int k = 2; k <= S; k <<= 1)
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1)
#pragma unroll
            for (int l = 0; l < S; ++l)
                if ((l & j) == 0) compareExchange(r[l], r[l | j], ((base + l) & k) == 0);
    storeOwnKeys<S>(keys, base, r);
    __syncthreads();
    for (int k = 2 * S; k <= n2; k <<= 1) {
        for (int j = k >> 1; j >= S; j >>= 1) {
            bitonicPairs(keys, n2, k, j);
            __syncthreads();
        }
        loadOwnKeys<S>(keys, base, r);
        const bool asc = (base & k) == 0;
#pragma unroll
        for (int j = S >> 1; j > 0; j >>= 1)
#pragma unroll
            for (int l = 0; l < S; ++l)
                if ((l & j) == 0) compareExchange(r[l], r[l | j], asc);
        storeOwnKeys<S>(keys, base, r);
        __syncthreads();
    }
}

__global__ void skyBlockKernel(AperturePlanes in, const double* cxs, const double* cys, std::size_t n,
                               double rin, double rout, int cap, detail::SkyParamsHD p, int fast,
                               SkyEstimate* out) {
    extern __shared__ __align__(16) std::uint32_t skyKeys[];
    __shared__ int count;
    double* ck1 = reinterpret_cast<double*>(skyKeys + cap); // cap is a power of two >= 2: 8-byte aligned
    double* ck2 = ck1 + (cap / detail::kSkyCheckpoint + 1);
    const double rin2 = rin * rin, rout2 = rout * rout;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nWarps = blockDim.x >> 5;
    const int minPixels = p.minPixels > 2 ? p.minPixels : 2;
    for (std::size_t i = blockIdx.x; i < n; i += gridDim.x) {
        const double cx = cxs[i], cy = cys[i];
        if (threadIdx.x == 0) count = 0;
        __syncthreads();
        int y0, y1;
        detail::annulusRows(in, cy, rout, y0, y1);
        for (int y = y0 + warp; y <= y1; y += nWarps) {
            double dy2;
            int xa, xb;
            if (!detail::annulusRowSpan(in, cx, cy, rout2, y, dy2, xa, xb)) continue;
            for (int x = xa + lane; x <= xb; x += 32) {
                float v = 0.0f;
                bool use;
                if (fast) {
                    // annulusPixel's tests with the three reads issued together
                    const double d2 = (x - cx) * (x - cx) + dy2;
                    use = !(d2 < rin2 || d2 > rout2);
                    if (use) {
                        const std::uint8_t m = in.maskAt(x, y);
                        const std::int32_t sg = in.segAt(x, y);
                        v = in.value(x, y);
                        use = m == 0 && sg == 0 && std::isfinite(v) && v < in.saturation;
                    }
                    const unsigned active = __activemask();
                    const unsigned take = __ballot_sync(active, use);
                    const int leader = __ffs(active) - 1;
                    int base = 0;
                    if (lane == leader && take) base = atomicAdd(&count, __popc(take));
                    base = __shfl_sync(active, base, leader);
                    if (use) {
                        const int slot = base + __popc(take & ((1u << lane) - 1u));
                        if (slot < cap) skyKeys[slot] = detail::floatKey(__float_as_uint(v));
                    }
                } else if (detail::annulusPixel(in, cx, rin2, rout2, x, y, dy2, v)) {
                    const int slot = atomicAdd(&count, 1);
                    if (slot < cap) skyKeys[slot] = detail::floatKey(__float_as_uint(v));
                }
            }
        }
        __syncthreads();
        const int c = count; // the same in every thread: the branches below are uniform
        if (c <= cap && c >= minPixels) {
            int n2 = 1;
            while (n2 < c)
                n2 <<= 1;
            for (int t = c + static_cast<int>(threadIdx.x); t < n2; t += blockDim.x)
                skyKeys[t] = 0xFFFFFFFFu;
            __syncthreads();
            const int own =
                fast == 2 && n2 % static_cast<int>(blockDim.x) == 0 ? n2 / static_cast<int>(blockDim.x) : 0;
            if (own == 4)
                bitonicOwnBlocks<4>(skyKeys, n2);
            else if (own == 8)
                bitonicOwnBlocks<8>(skyKeys, n2);
            else if (own == 16)
                bitonicOwnBlocks<16>(skyKeys, n2);
            else if (own == 32)
                bitonicOwnBlocks<32>(skyKeys, n2);
            else {
                for (int k = 2; k <= n2; k <<= 1)
                    for (int j = k >> 1; j > 0; j >>= 1) {
                        if (fast) {
                            bitonicPairs(skyKeys, n2, k, j);
                        } else {
                            for (int t = threadIdx.x; t < n2; t += blockDim.x) {
                                const int u = t ^ j;
                                if (u > t) {
                                    const std::uint32_t a = skyKeys[t], b = skyKeys[u];
                                    if (((t & k) == 0) == (a > b)) {
                                        skyKeys[t] = b;
                                        skyKeys[u] = a;
                                    }
                                }
                            }
                        }
                        __syncthreads();
                    }
            }
        }
        if (threadIdx.x == 0) {
            if (c > cap) {
                SkyEstimate e;
                e.n = -1;
                out[i] = e;
            } else {
                out[i] = detail::skyStatistics(SortedKeyValues{skyKeys}, static_cast<std::size_t>(c), p,
                                               nullptr, nullptr, fast ? ck1 : nullptr, fast ? ck2 : nullptr);
            }
        }
        __syncthreads(); // the keys and the counter serve the block's next source
    }
}

// The warp kernels below (Kron, circles of few pairs): a box's pixels in raster order, 32 at a time, each
// lane one pixel's terms; each sum adds the chunk's terms of the used lanes in lane order, so that it is the
// serial loop's, bitwise. The terms go through shared memory (one row of 32 per sum and warp) and lane c adds
// row c alone (the other lanes idle), rather than every lane adding every term through shuffles (32
// shuffles per sum and chunk, two instructions each for a double, on every lane: they bound the kernels'
// issue rate).
constexpr int kWarpSumWarps = 4; // warps per block of the warp kernels (kWarpKernelThreads / 32)

// Lane l's pixel of a box's chunks: (x, y) of raster index base + l, advanced by 32 without divisions.
struct WarpRaster {
    int x0, x1, w, x, y, dx, dy;
    long long q, total;
    __device__ WarpRaster(int bx0, int bx1, int by0, int by1, int lane)
        : x0(bx0), x1(bx1), w(bx1 - bx0 + 1), q(lane) {
        total = (bx1 >= bx0 && by1 >= by0) ? static_cast<long long>(w) * (by1 - by0 + 1) : 0;
        if (total == 0) {
            w = 1; // (no chunk is visited)
            x = y = dx = dy = 0;
            return;
        }
        x = bx0 + lane % w;
        y = by0 + lane / w;
        dx = 32 % w;
        dy = 32 / w;
    }
    __device__ bool inside() const { return q < total; }
    __device__ void next() {
        q += 32;
        x += dx;
        y += dy;
        if (x > x1) {
            x -= w;
            ++y;
        }
    }
};

// row[c][lane] = term c of this lane; lane c < nSums adds row c's used entries to acc in lane order.
template <int kRows>
__device__ inline void warpRowSums(double (&row)[kRows][32], int nSums, int lane, unsigned used,
                                   double& acc) {
    __syncwarp();
    if (lane < nSums) {
        const double* r = row[lane];
#pragma unroll
        for (int l = 0; l < 32; ++l)
            if (used & (1u << l)) acc += r[l];
    }
    __syncwarp();
}
// Circle chunks: rows 0-3 the terms; lanes 0-3 add the partial sums (lanes of mask up), 4-7 the full ones
// (uf).
// OR of a value over the full warp: __reduce_or_sync where the architecture has it (sm_80 on), a butterfly
// of shuffles before (an OR does not depend on the order).
__device__ inline std::uint32_t warpOr(std::uint32_t v) {
#if __CUDA_ARCH__ >= 800
    return __reduce_or_sync(0xFFFFFFFFu, v);
#else
    for (int off = 16; off > 0; off >>= 1)
        v |= __shfl_xor_sync(0xFFFFFFFFu, v, off);
    return v;
#endif
}

__device__ inline void warpCircleSums(double (&row)[4][32], int lane, unsigned up, unsigned uf, double& acc) {
    __syncwarp();
    if (lane < 8) {
        const double* r = row[lane & 3];
        const unsigned used = lane < 4 ? up : uf;
#pragma unroll
        for (int l = 0; l < 32; ++l)
            if (used & (1u << l)) acc += r[l];
    }
    __syncwarp();
}

// Warp-per-source Kron (the default; GPUPHOT_APERTURE_KRON=thread: kronKernel, one thread per source): the
// first moment's sums (rows 0-1), then the ellipse's (rows 0-3) as above; flags are ORed.
__global__ void __launch_bounds__(kWarpSumWarps * 32)
    kronWarpKernel(AperturePlanes in, const KronJob* jobs, std::size_t n, detail::KronParamsHD p,
                   KronOut* out) {
    __shared__ double rows[kWarpSumWarps][4][32];
    double(&row)[4][32] = rows[threadIdx.x >> 5];
    const int lane = threadIdx.x & 31;
    const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x >> 5);
    for (std::size_t i = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) >> 5; i < n;
         i += warps) {
        const KronJob j = jobs[i];
        KronOut o;
        const EllipseAperture iso(j.cx, j.cy, j.a, j.b, j.cosT, j.sinT);
        int x0, x1, y0, y1;
        detail::kronMomentBox(in, iso, j.cx, j.cy, p.maxRadius, x0, x1, y0, y1);
        const double rmax2 = p.maxRadius * p.maxRadius;
        double acc = 0.0; // lane 0: sumRI, lane 1: sumI
        for (WarpRaster px(x0, x1, y0, y1, lane); __any_sync(0xFFFFFFFFu, px.inside()); px.next()) {
            double ri = 0.0, v = 0.0;
            const bool use = px.inside() && detail::kronMomentPixel(in, j.sky, iso, j.cx, j.cy, rmax2,
                                                                    j.ownId, px.x, px.y, ri, v);
            const unsigned used = __ballot_sync(0xFFFFFFFFu, use);
            if (!used) continue;
            row[0][lane] = ri;
            row[1][lane] = v;
            warpRowSums(row, 2, lane, used, acc);
        }
        const double sumRI = __shfl_sync(0xFFFFFFFFu, acc, 0), sumI = __shfl_sync(0xFFFFFFFFu, acc, 1);
        const double kron = detail::kronRadiusOf(detail::kronMomentOf(sumRI, sumI), p, o.flags);
        o.kronRadius = kron;
        if (kron > 0.0) {
            const EllipseAperture e(j.cx, j.cy, j.a * kron, j.b * kron, j.cosT, j.sinT);
            std::uint32_t flags = 0;
            detail::ellipseBox(in, e, j.cx, j.cy, x0, x1, y0, y1, flags);
            acc = 0.0; // lanes 0-3: flux, area, varSky, poisson
            for (WarpRaster px(x0, x1, y0, y1, lane); __any_sync(0xFFFFFFFFu, px.inside()); px.next()) {
                ApertureSums t;
                const bool use = px.inside() && detail::ellipsePixel(in, j.sky, e, j.ownId, px.x, px.y,
                                                                     p.pixelCentres != 0, t, flags);
                const unsigned used = __ballot_sync(0xFFFFFFFFu, use);
                if (!used) continue;
                row[0][lane] = t.flux;
                row[1][lane] = t.area;
                row[2][lane] = t.varSky;
                row[3][lane] = t.poisson;
                warpRowSums(row, 4, lane, used, acc);
            }
            o.flags |= warpOr(flags);
            o.sums.flux = __shfl_sync(0xFFFFFFFFu, acc, 0);
            o.sums.area = __shfl_sync(0xFFFFFFFFu, acc, 1);
            o.sums.varSky = __shfl_sync(0xFFFFFFFFu, acc, 2);
            o.sums.poisson = __shfl_sync(0xFFFFFFFFu, acc, 3);
            o.measured = 1;
        }
        if (lane == 0) out[i] = o;
    }
}

// Warp t = (job i, radius j) (GPUPHOT_APERTURE_CIRCLE=warp; the default is circlePartsKernel): the parts of
// radius j as circleRadiusParts sums them, the box's pixels 32 at a time in raster order, each lane one
// pixel's term (circleRadiusPixel), the partial and the full sums added as above; for j = 0 the flag
// distances (minima: any order) as well.
__device__ inline double warpMin(double v) {
    for (int off = 16; off > 0; off >>= 1) {
        const double o = __shfl_xor_sync(0xFFFFFFFFu, v, off);
        v = o < v ? o : v;
    }
    return v;
}

__global__ void __launch_bounds__(kWarpSumWarps * 32)
    circleWarpKernel(AperturePlanes in, const CircleJob* jobs, std::size_t n, const double* radii,
                     const double* radii2, std::size_t nr, std::size_t stride, ApertureSums* partial,
                     ApertureSums* full, ApertureFlagDistances* fd) {
    __shared__ double rows[kWarpSumWarps][4][32];
    double(&row)[4][32] = rows[threadIdx.x >> 5];
    const int lane = threadIdx.x & 31;
    const std::size_t total = n * nr, warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x >> 5);
    for (std::size_t t = (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x) >> 5; t < total;
         t += warps) {
        const std::size_t i = t / nr, j = t % nr;
        const CircleJob job = jobs[i];
        const double* r = radii + i * stride;
        const double* r2 = radii2 + i * stride;
        ApertureFlagDistances d;
        ApertureFlagDistances* dp = j == 0 ? &d : nullptr;
        int x0, x1, y0, y1;
        detail::circleBox(in, job.cx, job.cy, r[nr - 1], x0, x1, y0, y1);
        double acc =
            0.0; // lanes 0-3: the partial sums' flux, area, varSky, poisson; lanes 4-7: the full ones
        for (WarpRaster px(x0, x1, y0, y1, lane); __any_sync(0xFFFFFFFFu, px.inside()); px.next()) {
            ApertureSums term;
            const int kind = px.inside() ? detail::circleRadiusPixel(in, job.sky, job.cx, job.cy, job.ownId,
                                                                     r, r2, nr, j, px.x, px.y, term, dp)
                                         : 0;
            const unsigned up = __ballot_sync(0xFFFFFFFFu, kind == 1),
                           uf = __ballot_sync(0xFFFFFFFFu, kind == 2);
            if (!(up | uf)) continue;
            row[0][lane] = term.flux;
            row[1][lane] = term.area;
            row[2][lane] = term.varSky;
            row[3][lane] = term.poisson;
            warpCircleSums(row, lane, up, uf, acc);
        }
        ApertureSums ps, fs;
        ps.flux = __shfl_sync(0xFFFFFFFFu, acc, 0);
        ps.area = __shfl_sync(0xFFFFFFFFu, acc, 1);
        ps.varSky = __shfl_sync(0xFFFFFFFFu, acc, 2);
        ps.poisson = __shfl_sync(0xFFFFFFFFu, acc, 3);
        fs.flux = __shfl_sync(0xFFFFFFFFu, acc, 4);
        fs.area = __shfl_sync(0xFFFFFFFFu, acc, 5);
        fs.varSky = __shfl_sync(0xFFFFFFFFu, acc, 6);
        fs.poisson = __shfl_sync(0xFFFFFFFFu, acc, 7);
        if (j == 0) {
            d.masked = warpMin(d.masked);
            d.crowded = warpMin(d.crowded);
            d.saturated = warpMin(d.saturated);
            d.edge = detail::edgeDistance(in, job.cx, job.cy);
        }
        if (lane == 0) {
            partial[t] = ps;
            full[t] = fs;
            if (j == 0) fd[i] = d;
        }
    }
}

// Thread t = (job i, radius j): the parts of radius j (and, for j = 0, the job's flag distances).
__global__ void circlePartsKernel(AperturePlanes in, const CircleJob* jobs, std::size_t n,
                                  const double* radii, const double* radii2, std::size_t nr,
                                  std::size_t stride, ApertureSums* partial, ApertureSums* full,
                                  ApertureFlagDistances* fd) {
    const std::size_t total = n * nr;
    for (std::size_t t = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; t < total;
         t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const std::size_t i = t / nr, j = t % nr;
        const CircleJob job = jobs[i];
        ApertureFlagDistances d;
        ApertureSums ps, fs;
        detail::circleRadiusParts(in, job.sky, job.cx, job.cy, job.ownId, radii + i * stride,
                                  radii2 + i * stride, nr, j, ps, fs, j == 0 ? &d : nullptr);
        partial[t] = ps;
        full[t] = fs;
        if (j == 0) fd[i] = d;
    }
}

__global__ void circleCombineKernel(const ApertureSums* partial, const ApertureSums* full, std::size_t n,
                                    std::size_t nr, ApertureSums* out) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        detail::circleCombine(partial + i * nr, full + i * nr, nr, out + i * nr);
}

__global__ void kronKernel(AperturePlanes in, const KronJob* jobs, std::size_t n, detail::KronParamsHD p,
                           KronOut* out) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        out[i] = detail::kronAperture(in, jobs[i], p);
}

// Strips plan, Kron's first pass: r1 of each job (bounded by maxRadius), which fixes the rows its ellipse reads.
__global__ void kronFirstMomentKernel(AperturePlanes in, const KronJob* jobs, std::size_t n, double rmax,
                                      double* r1) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        const KronJob j = jobs[i];
        const EllipseAperture iso(j.cx, j.cy, j.a, j.b, j.cosT, j.sinT);
        r1[i] = detail::kronFirstMoment(in, j.sky, iso, j.cx, j.cy, rmax, j.ownId);
    }
}

// Pass 3 in one round trip: measured job c (slot[c] < slot[c + 1]) gets circle slot[c] of radius
// gridRadius[index[c]] (and its square, as the host squares the radii of sumCircles).
__global__ void optimalCircleRadiiKernel(const std::int32_t* index, const std::size_t* slot, std::size_t n,
                                         const double* gridRadius, double* r, double* r2) {
    for (std::size_t c = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; c < n;
         c += std::size_t(gridDim.x) * blockDim.x) {
        if (slot[c + 1] == slot[c]) continue;
        const double v = gridRadius[index[c]];
        r[slot[c]] = v;
        r2[slot[c]] = v * v;
    }
}

// Pass 3's optimal grid index, one thread per source; grid's arrays on the device. The variance at each grid
// radius is computed in place with optimalVariance (the host fills an array with the same expression).
__global__ void optimalRadiusKernel(const detail::OptimalJob* jobs, std::size_t n, detail::OptimalGrid grid,
                                    std::int32_t* index) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x) {
        const detail::OptimalJob j = jobs[i];
        const detail::OptimalGrid& g = grid;
        index[i] = static_cast<std::int32_t>(detail::optimalGridIndex(g.frac, g.num, g.n, [&](std::size_t k) {
            return detail::optimalVariance(g.poisson, j.F, g.frac[k], g.gain, g.area[k], j.var, g.kappaArea[k],
                                           j.nSky);
        }));
    }
}

// Chained pass 1: each job's sky from its source's local sky estimate (the driver's rule, skyOfEstimate).
template <class Job>
__global__ void applySkyKernel(Job* jobs, std::size_t n, const SkyEstimate* skies, detail::SkyJobRule rule) {
    for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
        jobs[i].sky = detail::skyOfEstimate(skies[i], rule);
}

class CudaEngine final : public detail::ApertureEngine {
public:
    // stripShrink 0: whole plan (frame and maps from the device caches); >= 1: strips plan, the planes'
    // rows uploaded per group of sources (sorted by y) from the host, band height divided by stripShrink.
    CudaEngine(DeviceContext& dc, const BackgroundResult& bkg, int stripShrink = 0)
        : m_dc(dc), m_bkg(bkg), m_times(dc.stream(), "aperture", dc.tuning().aperture.timing),
          m_shrink(stripShrink) {
        m_threads = dc.blockSize() > 0 ? std::min(dc.blockSize(), 1024) : 128;
        const BackendTuning::Aperture& t = dc.tuning().aperture;
        m_heapSort = t.heapSort;
        m_skySplit = t.skySplit;
        m_kronThread = t.kronThread;
        m_skyMode = t.skyMode;
        m_circleMode = t.circleMode;
        m_warpItems = t.warpItems;
        if (t.batch > 0) m_batch = t.batch;
        m_sync = t.sync;
        m_keep = t.keep;
        m_skyThreads = t.skyThreads;
        m_chain = t.chain;
        m_twoStreams = t.twoStreams;
        m_spatialOrder = t.spatialOrder;
        m_optimalOnHost = t.optimalOnHost;
    }
    ~CudaEngine() override {
        if (m_sideStream) {
            cudaStreamSynchronize(m_sideStream); // (before m_sideBuffers are released)
            cudaStreamDestroy(m_sideStream);
        }
        if (m_sideIn) cudaEventDestroy(m_sideIn);
        if (m_sideDone) cudaEventDestroy(m_sideDone);
        if (m_pending.empty()) return;
        cudaStreamSynchronize(m_dc.stream()); // an exception left work queued: let it end first
        for (Pending& q : m_pending)
            cudaEventDestroy(q.done);
    }
    CudaEngine(const CudaEngine&) = delete;
    CudaEngine& operator=(const CudaEngine&) = delete;
    // GPUPHOT_APERTURE_TIMING: the phases of the finished stage call (after the stream is synchronised).
    void report(double totalMs, std::size_t sources) {
        if (!m_times.on()) return;
        std::vector<KernelClock::Sum> dev = m_times.deviceSums();
        std::vector<std::pair<std::string, double>> host = m_times.hostSums();
        std::sort(dev.begin(), dev.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
        std::sort(host.begin(), host.end());
        double devSum = 0.0, engine = 0.0;
        for (const KernelClock::Sum& d : dev)
            devSum += d.ms;
        for (const auto& [name, ms] : host)
            if (name.rfind("engine ", 0) == 0) engine += ms;
        std::fprintf(
            stderr,
            "aperture timing: %zu sources, total %.2f ms, engine calls %.2f ms, driver host %.2f ms, "
            "device phases %.2f ms;%s\n",
            sources, totalMs, engine, totalMs - engine, devSum, m_notes.c_str());
        for (const KernelClock::Sum& d : dev)
            std::fprintf(stderr, "  device %-22s %8.3f ms (%d)\n", d.name.c_str(), d.ms, d.count);
        for (const auto& [name, ms] : host)
            std::fprintf(stderr, "  host   %-22s %8.3f ms\n", name.c_str(), ms);
    }
    void note(const std::string& text) {
        if (m_times.on()) m_notes += " " + text;
    }
    // One batch for up to 131072 sources (each batch costs its launches and synchronisations; the per-source
    // device buffers of one batch stay well within the 256 MB that wholeNeed() plans for them, except for the
    // split sky path's annulus values, which localSkies splits into chunks of kSplitChunk sources).
    std::size_t batchSize() const override { return m_batch; }
    // The driver's batch buffers, kept in the DeviceContext for the next call.
    // (GPUPHOT_APERTURE_KEEP=0: the driver's own, per call.)
    detail::ApertureScratch* scratch() override { return m_keep ? &persistent().scratch : nullptr; }
    int groups() const { return m_groups; }
    // The sources' own order (raster-like from the detection; the device's caches see no difference that
    // pays for the sort); GPUPHOT_APERTURE_ORDER=spatial: the driver's bands.
    bool spatialOrder() const override { return m_spatialOrder; }

    // Pass 1's circles and Kron behind the skies of the last skyBlockAsync call, whose estimates stay on the
    // device (m_skyOut): applySkyKernel sets the jobs' skies after their upload (GPUPHOT_APERTURE_CHAIN=0:
    // not chained).
    bool chainPass1(int skyTicket, const detail::SkyJobRule& rule, const CircleJob* jobs, std::size_t n,
                    const double* radii, std::size_t nr, ApertureSums* out, ApertureFlagDistances* fd,
                    const KronJob* kronJobs, const detail::KronParamsHD& kp, KronOut* kronOut,
                    int& circleTicket, int& kronTicket) override {
        if (!m_chain || m_shrink > 0 || m_sync || n == 0 || nr == 0 || skyTicket <= 0 ||
            skyTicket != m_skyTicket || n != m_skyN)
            return false;
        const HostClock clock(m_times, "engine chain");
        struct Unchain {
            CudaEngine& e;
            ~Unchain() { e.m_chainSky = nullptr; }
        } unchain{*this};
        m_chainSky = m_skyOut.get();
        m_chainRule = rule;
        // the circles, then Kron (GPUPHOT_APERTURE_STREAMS=2: the circles on the side stream, Kron beside
        // them)
        circleTicket = sumCirclesQueued(jobs, n, radii, nr, 0, out, fd, m_twoStreams);
        kronTicket = kronQueued(kronJobs, n, kp, kronOut);
        sideJoin();
        return true;
    }

    void begin(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
               const ImageView& level, const ImageView& rms, double saturation,
               NeighbourPixels neighbours) override {
        const HostClock clock(m_times, "engine begin");
        const std::uint64_t uploadsBefore = m_dc.uploads();
        struct NoteUpload {
            CudaEngine& e;
            std::uint64_t before;
            ~NoteUpload() {
                if (e.m_dc.uploads() != before) e.note("frame: uploaded");
            }
        } noteUpload{*this, uploadsBefore};
        if (m_shrink > 0) {
            m_hImage = image;
            m_hMask = mask;
            m_hSeg = seg;
            m_hLevel = level.empty() || rms.empty() ? ImageView{} : level;
            m_hRms = level.empty() || rms.empty() ? ImageView{} : rms;
            m_in = AperturePlanes{};
            m_in.width = image.width;
            m_in.height = image.height;
            m_in.saturation = saturation;
            m_in.neighbours = neighbours;
            const std::size_t perRow =
                static_cast<std::size_t>(image.width) * (4 + (mask.empty() ? 0 : 1) + (seg.empty() ? 0 : 4) +
                                                         (m_hLevel.empty() ? 0 : 8));
            // Half of what is left for the band, half for the per-source buffers.
            m_maxRows = stripRowsFor(m_dc.available() / 2, perRow, 0, image.height) / m_shrink;
            if (m_maxRows < 1) throw DeviceOutOfMemory("aperture: one band row needs " + bytesText(2 * perRow));
            return;
        }
        const DeviceContext::DeviceFrame f = m_dc.frame(image, mask);
        m_in = AperturePlanes{};
        m_in.image = f.pixels;
        m_in.imageStride = f.width;
        m_in.mask = f.mask;
        m_in.maskStride = f.width;
        if (!seg.empty()) {
            // A view of a deferred map's device buffer (measureApertures with a SegmentationMap,
            // kernels/detection/detection_finish.hpp) is read where it lies; a host map is uploaded.
            const HostClock clock(m_times, "segmentation map");
            if (const std::int32_t* resident = residentSegmentation(m_dc, seg)) {
                m_in.seg = resident;
                note("segmentation: the detection's device copy");
            } else {
                m_seg = DeviceBuffer<std::int32_t>(m_dc, static_cast<std::size_t>(seg.width) * seg.height);
                uploadRows(m_dc, m_seg.get(), seg, 0, seg.height); // pinned staging when contiguous
                m_in.seg = m_seg.get();
                note("segmentation: uploaded");
            }
            m_in.segStride = seg.width;
        }
        if (!level.empty() && !rms.empty()) {
            const auto maps = m_dc.background(m_bkg.level, m_bkg.rms);
            m_in.level = maps.first;
            m_in.rms = maps.second;
            m_in.mapStride = m_bkg.level.width();
        }
        m_in.width = image.width;
        m_in.height = image.height;
        m_in.saturation = saturation;
        m_in.neighbours = neighbours;
    }

    // Lean background (no full host maps, core's sampler): the maps on the device from the mesh grid,
    // resident (whole plan) or interpolated band by band (strips plan).
    bool setMapSampler(const BackgroundSampler* sampler) override {
        const HostClock clock(m_times, "engine map sampler");
        if (!sampler || !hasBackgroundGrid(m_bkg, m_in.width, m_in.height)) return false;
        if (m_shrink == 0) {
            const auto maps = deviceBackgroundMaps(m_dc, m_bkg);
            m_in.level = maps.first;
            m_in.rms = maps.second;
            m_in.mapStride = m_in.width;
            return true;
        }
        m_rows = std::make_unique<DeviceBackgroundRows>(m_dc, m_bkg);
        const std::size_t perRow = static_cast<std::size_t>(m_in.width) *
                                   (4 + (m_hMask.empty() ? 0 : 1) + (m_hSeg.empty() ? 0 : 4) + 8);
        m_maxRows = stripRowsFor(m_dc.available() / 2, perRow, 0, m_in.height) / m_shrink;
        if (m_maxRows < 1) throw DeviceOutOfMemory("aperture: one band row needs " + bytesText(2 * perRow));
        return true;
    }

    int localSkiesAsync(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                        const detail::SkyParamsHD& p, SkyEstimate* out) override {
        if (m_shrink == 0 && !m_sync && skyBlockCap(rout) > 0 && n > 0) {
            const HostClock clock(m_times, "engine local skies");
            return skyBlockAsync(cx, cy, n, rin, rout, p, out);
        }
        localSkies(cx, cy, n, rin, rout, p, out);
        return 0;
    }

    void localSkies(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                    const detail::SkyParamsHD& p, SkyEstimate* out) override {
        const HostClock clock(m_times, "engine local skies");
        if (m_shrink == 0) return skiesNow(cx, cy, n, rin, rout, p, out);
        const std::vector<double> ext(n, rout);
        // The annulus reads pixels, mask and segmentation only: no maps.
        forGroups(cy, ext.data(), n, [](std::size_t) { return false; }, [&](const std::vector<std::size_t>& idx) {
            const std::size_t m = idx.size();
            std::vector<double> gx(m), gy(m);
            std::vector<SkyEstimate> o(m);
            for (std::size_t k = 0; k < m; ++k) {
                gx[k] = cx[idx[k]];
                gy[k] = cy[idx[k]];
            }
            skiesNow(gx.data(), gy.data(), m, rin, rout, p, o.data());
            for (std::size_t k = 0; k < m; ++k)
                out[idx[k]] = o[k];
        });
    }

    // The local skies of n sources on the bound planes, done when it returns: the block-per-source kernel, or
    // the split path in chunks of kSplitChunk sources.
    void skiesNow(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                  const detail::SkyParamsHD& p, SkyEstimate* out) {
        if (n == 0) return;
        if (skyBlockCap(rout) > 0) return finish(skyBlockAsync(cx, cy, n, rin, rout, p, out));
        for (std::size_t c0 = 0; c0 < n; c0 += kSplitChunk) {
            const std::size_t m = std::min(kSplitChunk, n - c0);
            localSkiesImpl(cx + c0, cy + c0, m, rin, rout, p, out + c0, nullptr);
        }
    }

    // skyBlockKernel's key capacity for annuli of outer radius rout, 0 when the split path (or the heap sort)
    // measures them.
    int skyBlockCap(double rout) const {
        const long long side = detail::annulusSideBound(std::min(rout, 1e6));
        int cap = 1;
        while (cap < side * side && cap <= kSkyBlockCap)
            cap <<= 1;
        return (!m_heapSort && !m_skySplit && cap <= kSkyBlockCap) ? cap : 0;
    }

    // Block-per-source local skies (skyBlockKernel), queued: the results in out after finish(ticket).
    int skyBlockAsync(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                      const detail::SkyParamsHD& p, SkyEstimate* out) {
        const cudaStream_t s = m_dc.stream();
        const int cap = skyBlockCap(rout);
        m_times.start("sky block");
        DeviceBuffer<double> dxy(m_dc, 2 * n);
        double* xy = static_cast<double*>(pinnedBuffer(&Persistent::skyIn, 2 * n * sizeof(double)));
        parallelCopy(xy, cx, n * sizeof(double));
        parallelCopy(xy + n, cy, n * sizeof(double));
        dxy.upload(xy, 2 * n);
        m_skyOut = DeviceBuffer<SkyEstimate>(m_dc, n); // kept for chainPass1
        DeviceBuffer<SkyEstimate>& dOut = m_skyOut;
        const int t = std::max(32, std::min(m_skyThreads, threads(skyBlockKernel) / 32 * 32));
        const std::size_t shared = m_skyMode > 0 ? skyBlockShared(cap) : static_cast<std::size_t>(cap) * 4;
        skyBlockKernel<<<blocks(n, 1), t, shared, s>>>(m_in, dxy.get(), dxy.get() + n, n, rin, rout, cap, p,
                                                       m_skyMode, dOut.get());
        checkLaunch("the local skies");
        SkyEstimate* staged = stage(dOut, n, &Persistent::sky);
        m_times.stop();
        m_skyN = n;
        m_skyTicket = enqueue({{out, staged, n * sizeof(SkyEstimate)}}, out, n);
        return m_skyTicket;
    }

    // ---- queued work (whole plan): results downloaded into pinned buffers, copied out by finish() --------
    struct PendingCopy {
        void* dst;
        const void* src;
        std::size_t bytes;
    };
    struct Pending {
        int ticket = 0;
        cudaEvent_t done = nullptr;
        std::vector<PendingCopy> copies;
        unsigned pinned = 0;            // pinned buffers (pinnedBit) in use until done
        SkyEstimate* skies = nullptr;   // local skies to check (n < 0: an annulus exceeded its bound)
        std::size_t nSkies = 0;
    };
    // Marks the end of the work queued since the last enqueue: its copies happen in finish().
    // (stream: where the entry's end is recorded; null: the main stream)
    int enqueue(std::vector<PendingCopy> copies, SkyEstimate* skies = nullptr, std::size_t nSkies = 0,
                cudaStream_t stream = nullptr) {
        Pending q;
        q.ticket = ++m_ticket;
        q.copies = std::move(copies);
        q.pinned = m_buildPinned;
        q.skies = skies;
        q.nSkies = nSkies;
        m_buildPinned = 0;
        GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&q.done, cudaEventDisableTiming));
        m_pending.push_back(q);
        GPUPHOT_CUDA_CHECK(cudaEventRecord(q.done, stream ? stream : m_dc.stream()));
        return q.ticket;
    }

    void finish(int ticket = -1) override {
        if (m_pending.empty()) {
            m_busyPinned = m_buildPinned;
            return;
        }
        const HostClock clock(m_times, "engine wait");
        std::size_t k = 0;
        struct Drop { // the finished entries leave the list, also when a check throws
            CudaEngine& e;
            std::size_t& k;
            ~Drop() {
                for (std::size_t q = 0; q < k; ++q)
                    cudaEventDestroy(e.m_pending[q].done);
                e.m_pending.erase(e.m_pending.begin(), e.m_pending.begin() + static_cast<std::ptrdiff_t>(k));
                e.m_busyPinned = e.m_buildPinned;
                for (const Pending& q : e.m_pending)
                    e.m_busyPinned |= q.pinned;
            }
        } drop{*this, k};
        for (; k < m_pending.size() && (ticket < 0 || m_pending[k].ticket <= ticket); ++k) {
            const Pending& q = m_pending[k];
            GPUPHOT_CUDA_CHECK(cudaEventSynchronize(q.done));
            for (const PendingCopy& c : q.copies)
                parallelCopy(c.dst, c.src, c.bytes);
            for (std::size_t i = 0; i < q.nSkies; ++i)
                if (q.skies[i].n < 0) {
                    ++k;
                    throw CudaError("aperture: an annulus exceeded its bound (internal error)");
                }
        }
    }

    // localSkies, with the test hook's copies of the intermediate arrays when dbg is not null.
    void localSkiesImpl(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                        const detail::SkyParamsHD& p, SkyEstimate* out, AnnulusDebug* dbg) {
        if (n == 0) return;
        const cudaStream_t s = m_dc.stream();
        m_times.start("sky count");
        DeviceBuffer<double> dcx(m_dc, n), dcy(m_dc, n);
        dcx.upload(cx, n);
        dcy.upload(cy, n);
        DeviceBuffer<int> counts(m_dc, n + 1), offsets(m_dc, n + 1);
        counts.zero();
        const int tCount = threads(annulusCountKernel);
        annulusCountKernel<<<blocks(n, tCount), tCount, 0, s>>>(m_in, dcx.get(), dcy.get(), n, rin, rout,
                                                                counts.get());
        checkLaunch("the annulus count");
        std::size_t tmpBytes = 0;
        GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, tmpBytes, counts.get(), offsets.get(),
                                                         static_cast<int>(n + 1), s));
        DeviceBuffer<unsigned char> tmp(m_dc, std::max<std::size_t>(tmpBytes, 1));
        GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp.get(), tmpBytes, counts.get(), offsets.get(),
                                                         static_cast<int>(n + 1), s));
        int total = 0;
        offsets.download(&total, 1, n);
        m_times.stop();
        m_dc.synchronize();
        DeviceBuffer<std::uint32_t> keys(m_dc, std::max(total, 1));
        DeviceBuffer<float> values(m_dc, std::max(total, 1));
        DeviceBuffer<SkyEstimate> dOut(m_dc, n);
        if (total > 0) {
            m_times.start("sky fill");
            const int tFill = threads(annulusFillKernel);
            annulusFillKernel<<<blocks(n, tFill), tFill, 0, s>>>(m_in, dcx.get(), dcy.get(), n, rin, rout,
                                                                 offsets.get(), keys.get());
            checkLaunch("the annulus values");
            m_times.stop();
        }
        if (m_heapSort || total == 0) {
            m_times.start("sky heap sort + stats");
            const int tStats = threads(skyStatsKernel);
            skyStatsKernel<<<blocks(n, tStats), tStats, 0, s>>>(keys.get(), offsets.get(), n, p, values.get(),
                                                                dOut.get());
            checkLaunch("the sky statistics");
            m_times.stop();
        } else {
            // Each source's keys sorted by CUB into a second buffer, turned into values, then the statistics.
            m_times.start("sky segmented sort");
            DeviceBuffer<std::uint32_t> sortedKeys(m_dc, static_cast<std::size_t>(total));
            std::size_t sortBytes = 0;
            GPUPHOT_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeys(
                nullptr, sortBytes, keys.get(), sortedKeys.get(), total, static_cast<std::int64_t>(n),
                offsets.get(), offsets.get() + 1, s));
            DeviceBuffer<unsigned char> sortTmp(m_dc, std::max<std::size_t>(sortBytes, 1));
            GPUPHOT_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeys(
                sortTmp.get(), sortBytes, keys.get(), sortedKeys.get(), total, static_cast<std::int64_t>(n),
                offsets.get(), offsets.get() + 1, s));
            const int tValues = threads(keysToValuesKernel);
            keysToValuesKernel<<<blocks(static_cast<std::size_t>(total), tValues), tValues, 0, s>>>(
                sortedKeys.get(), static_cast<std::size_t>(total), values.get());
            checkLaunch("the sorted annulus values");
            m_times.stop();
            m_times.start("sky stats");
            const int tStats = threads(skySortedStatsKernel);
            skySortedStatsKernel<<<blocks(n, tStats), tStats, 0, s>>>(values.get(), offsets.get(), n, p,
                                                                      dOut.get());
            checkLaunch("the sky statistics");
            m_times.stop();
        }
        m_times.start("sky download");
        dOut.download(out, n);
        m_times.stop();
        if (dbg) {
            dbg->offsets.resize(n + 1);
            offsets.download(dbg->offsets.data(), n + 1);
            dbg->sorted.resize(static_cast<std::size_t>(total));
            dbg->index.resize(static_cast<std::size_t>(total));
            DeviceBuffer<int> index(m_dc, std::max(total, 1));
            if (total > 0) {
                const int tIndex = threads(annulusIndexKernel);
                annulusIndexKernel<<<blocks(n, tIndex), tIndex, 0, s>>>(m_in, dcx.get(), dcy.get(), n, rin,
                                                                        rout, offsets.get(), index.get());
                checkLaunch("the annulus indices");
                index.download(dbg->index.data(), static_cast<std::size_t>(total));
                values.download(dbg->sorted.data(), static_cast<std::size_t>(total));
            }
            m_dc.synchronize();
        }
        m_dc.synchronize();
    }

    void sumCircles(const CircleJob* jobs, std::size_t n, const double* radii, std::size_t nr,
                    std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd) override {
        const HostClock clock(m_times, "engine circles");
        if (m_shrink == 0 || n == 0 || nr == 0) return sumCirclesImpl(jobs, n, radii, nr, radiiStride, out, fd);
        std::vector<double> ext(n), cy(n);
        for (std::size_t i = 0; i < n; ++i) {
            ext[i] = radii[i * radiiStride + nr - 1];
            cy[i] = jobs[i].cy;
        }
        forGroups(cy.data(), ext.data(), n, [&](std::size_t i) { return jobs[i].sky.perPixel != 0; },
                  [&](const std::vector<std::size_t>& idx) {
            const std::size_t m = idx.size();
            std::vector<CircleJob> gj(m);
            std::vector<double> gr(radiiStride == 0 ? nr : m * radiiStride);
            std::vector<ApertureSums> o(m * nr);
            std::vector<ApertureFlagDistances> ofd(m);
            if (radiiStride == 0) std::copy(radii, radii + nr, gr.begin());
            for (std::size_t k = 0; k < m; ++k) {
                gj[k] = jobs[idx[k]];
                if (radiiStride)
                    std::copy(radii + idx[k] * radiiStride, radii + (idx[k] + 1) * radiiStride,
                              gr.begin() + k * radiiStride);
            }
            sumCirclesImpl(gj.data(), m, gr.data(), nr, radiiStride, o.data(), ofd.data());
            for (std::size_t k = 0; k < m; ++k) {
                std::copy(o.begin() + k * nr, o.begin() + (k + 1) * nr, out + idx[k] * nr);
                fd[idx[k]] = ofd[k];
            }
        });
    }

    void sumCirclesImpl(const CircleJob* jobs, std::size_t n, const double* radii, std::size_t nr,
                        std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd) {
        if (n == 0 || nr == 0) return;
        finish(sumCirclesQueued(jobs, n, radii, nr, radiiStride, out, fd));
    }

    int sumCirclesAsync(const CircleJob* jobs, std::size_t n, const double* radii, std::size_t nr,
                        std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd) override {
        if (m_shrink > 0 || m_sync || n == 0 || nr == 0) {
            sumCircles(jobs, n, radii, nr, radiiStride, out, fd);
            return 0;
        }
        const HostClock clock(m_times, "engine circles");
        return sumCirclesQueued(jobs, n, radii, nr, radiiStride, out, fd);
    }

    // The circle sums queued (inputs through pinned buffers); the results in out and fd after finish(ticket).
    // Kernel: circlePartsKernel (one thread per source and radius) for large calls, circleWarpKernel (one
    // warp each) for at most m_warpItems (source, radius) pairs, where one thread each would leave the device
    // mostly idle (pass 2's few stars); GPUPHOT_APERTURE_CIRCLE=thread|warp: always that one.
    // side: the kernels on the side stream (circleKernels), the job and radius buffers kept until sideJoin().
    int sumCirclesQueued(const CircleJob* jobs, std::size_t n, const double* radii, std::size_t nr,
                         std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd,
                         bool side = false) {
        const cudaStream_t s = m_dc.stream();
        const std::size_t nRadii = radiiStride == 0 ? nr : n * radiiStride;
        m_times.start("circle upload");
        auto* hJobs = static_cast<CircleJob*>(pinnedBuffer(&Persistent::circleIn, n * sizeof(CircleJob)));
        parallelCopy(hJobs, jobs, n * sizeof(CircleJob));
        auto* hR = static_cast<double*>(pinnedBuffer(&Persistent::radii, 2 * nRadii * sizeof(double)));
        std::copy(radii, radii + nRadii, hR);
        for (std::size_t k = 0; k < nRadii; ++k)
            hR[nRadii + k] = radii[k] * radii[k];
        DeviceBuffer<CircleJob> dJobs(m_dc, n);
        DeviceBuffer<double> dR(m_dc, 2 * nRadii);
        dJobs.upload(hJobs, n);
        dR.upload(hR, 2 * nRadii);
        const double* dR2 = dR.get() + nRadii;
        applyChainedSkies(dJobs.get(), n);
        m_times.stop();
        const int ticket = circleKernels(dJobs.get(), n, dR.get(), dR2, nr, radiiStride, out, fd, side);
        if (side) {
            m_sideJobs = std::move(dJobs);
            m_sideRadii = std::move(dR);
        }
        return ticket;
    }

    // The circle kernels on jobs and radii on the device, their results staged: in out and fd after
    // finish(ticket). side (chainPass1): the kernels and the download on the side stream, which waits for the
    // work queued so far on the main stream; their buffers stay in m_sideBuffers until sideJoin().
    int circleKernels(const CircleJob* dJobs, std::size_t n, const double* dR, const double* dR2,
                      std::size_t nr, std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd,
                      bool side = false) {
        SideBuffers local;
        SideBuffers& b = side ? m_sideBuffers : local;
        b.partial = DeviceBuffer<ApertureSums>(m_dc, n * nr);
        b.full = DeviceBuffer<ApertureSums>(m_dc, n * nr);
        b.out = DeviceBuffer<ApertureSums>(m_dc, n * nr);
        b.fd = DeviceBuffer<ApertureFlagDistances>(m_dc, n);
        ApertureSums* stagedOut = static_cast<ApertureSums*>(
            pinnedBuffer(&Persistent::circle, std::max<std::size_t>(n * nr, 1) * sizeof(ApertureSums)));
        ApertureFlagDistances* stagedFd = static_cast<ApertureFlagDistances*>(
            pinnedBuffer(&Persistent::flag, std::max<std::size_t>(n, 1) * sizeof(ApertureFlagDistances)));
        const cudaStream_t s = side ? sideStream() : m_dc.stream();
        if (side) {
            GPUPHOT_CUDA_CHECK(cudaEventRecord(m_sideIn, m_dc.stream()));
            GPUPHOT_CUDA_CHECK(cudaStreamWaitEvent(s, m_sideIn, 0));
        }
        const bool warp = m_circleMode == 2 || (m_circleMode == 0 && n * nr <= m_warpItems);
        m_times.start(warp ? "circle sums (warp)" : "circle sums", s);
        if (!warp) {
            const int tParts = threads(circlePartsKernel);
            circlePartsKernel<<<blocks(n * nr, tParts), tParts, 0, s>>>(
                m_in, dJobs, n, dR, dR2, nr, radiiStride, b.partial.get(), b.full.get(), b.fd.get());
        } else {
            const int t = std::max(32, std::min(kWarpKernelThreads, threads(circleWarpKernel) / 32 * 32));
            circleWarpKernel<<<blocks(n * nr * 32, t), t, 0, s>>>(m_in, dJobs, n, dR, dR2, nr, radiiStride,
                                                                  b.partial.get(), b.full.get(), b.fd.get());
        }
        checkLaunch("the circle sums");
        const int tCombine = threads(circleCombineKernel);
        circleCombineKernel<<<blocks(n, tCombine), tCombine, 0, s>>>(b.partial.get(), b.full.get(), n, nr,
                                                                     b.out.get());
        checkLaunch("the circle totals");
        m_times.stop();
        m_times.start("circle download", s);
        if (n * nr > 0)
            GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(stagedOut, b.out.get(), n * nr * sizeof(ApertureSums),
                                               cudaMemcpyDeviceToHost, s));
        if (n > 0)
            GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(stagedFd, b.fd.get(), n * sizeof(ApertureFlagDistances),
                                               cudaMemcpyDeviceToHost, s));
        m_times.stop();
        const int ticket = enqueue({{out, stagedOut, n * nr * sizeof(ApertureSums)},
                                    {fd, stagedFd, n * sizeof(ApertureFlagDistances)}},
                                   nullptr, 0, s);
        if (side) GPUPHOT_CUDA_CHECK(cudaEventRecord(m_sideDone, s));
        return ticket;
    }
    // The main stream waits for the side stream's circles; their buffers are then released in its order.
    void sideJoin() {
        if (!m_sideStream) return;
        GPUPHOT_CUDA_CHECK(cudaStreamWaitEvent(m_dc.stream(), m_sideDone, 0));
        m_sideBuffers = SideBuffers{};
        m_sideJobs.reset();
        m_sideRadii.reset();
    }
    // The side stream (whole plan, queued calls), of the greatest priority, so that chainPass1's circles,
    // which the driver waits for first, take the device's blocks before Kron's on the main stream; made at
    // first use with its two events.
    cudaStream_t sideStream() {
        if (!m_sideStream) {
            GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&m_sideIn, cudaEventDisableTiming));
            GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&m_sideDone, cudaEventDisableTiming));
            int least = 0, greatest = 0;
            GPUPHOT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
            GPUPHOT_CUDA_CHECK(cudaStreamCreateWithPriority(&m_sideStream, cudaStreamNonBlocking, greatest));
        }
        return m_sideStream;
    }

    void kron(const KronJob* jobs, std::size_t n, const detail::KronParamsHD& p, KronOut* out) override {
        const HostClock clock(m_times, "engine kron");
        if (m_shrink == 0 || n == 0) return kronImpl(jobs, n, p, out);
        // Pass 1: r1 (rows within maxRadius of the isophotal ellipse); then each ellipse's rows are known.
        std::vector<double> ext(n), cy(n), r1(n);
        for (std::size_t i = 0; i < n; ++i) {
            const KronJob& j = jobs[i];
            cy[i] = j.cy;
            ext[i] = p.maxRadius * EllipseAperture(j.cx, j.cy, j.a, j.b, j.cosT, j.sinT).halfWidthY();
        }
        forGroups(cy.data(), ext.data(), n, [&](std::size_t i) { return jobs[i].sky.perPixel != 0; },
                  [&](const std::vector<std::size_t>& idx) {
            const std::size_t m = idx.size();
            std::vector<KronJob> gj(m);
            std::vector<double> o(m);
            for (std::size_t k = 0; k < m; ++k)
                gj[k] = jobs[idx[k]];
            DeviceBuffer<KronJob> dJobs(m_dc, m);
            dJobs.upload(gj.data(), m);
            DeviceBuffer<double> dR1(m_dc, m);
            const int t = threads(kronFirstMomentKernel);
            kronFirstMomentKernel<<<blocks(m, t), t, 0, m_dc.stream()>>>(m_in, dJobs.get(), m, p.maxRadius,
                                                                         dR1.get());
            checkLaunch("the Kron first moments");
            dR1.download(o.data(), m);
            m_dc.synchronize();
            for (std::size_t k = 0; k < m; ++k)
                r1[idx[k]] = o[k];
        });
        // Pass 2: the whole measurement (kronAperture: r1 again, then the ellipse) over rows covering both.
        for (std::size_t i = 0; i < n; ++i) {
            const KronJob& j = jobs[i];
            double kron = p.factor * r1[i];
            if (!std::isfinite(r1[i])) kron = p.minRadius;
            kron = std::max(kron, p.minRadius);
            if (kron > 0.0 && std::isfinite(kron))
                ext[i] = std::max(ext[i], EllipseAperture(j.cx, j.cy, j.a * kron, j.b * kron, j.cosT,
                                                                  j.sinT).halfWidthY());
        }
        forGroups(cy.data(), ext.data(), n, [&](std::size_t i) { return jobs[i].sky.perPixel != 0; },
                  [&](const std::vector<std::size_t>& idx) {
            const std::size_t m = idx.size();
            std::vector<KronJob> gj(m);
            std::vector<KronOut> o(m);
            for (std::size_t k = 0; k < m; ++k)
                gj[k] = jobs[idx[k]];
            kronImpl(gj.data(), m, p, o.data());
            for (std::size_t k = 0; k < m; ++k)
                out[idx[k]] = o[k];
        });
    }

    void kronImpl(const KronJob* jobs, std::size_t n, const detail::KronParamsHD& p, KronOut* out) {
        if (n == 0) return;
        finish(kronQueued(jobs, n, p, out));
    }

    int kronAsync(const KronJob* jobs, std::size_t n, const detail::KronParamsHD& p, KronOut* out) override {
        if (m_shrink > 0 || m_sync || n == 0) {
            kron(jobs, n, p, out);
            return 0;
        }
        const HostClock clock(m_times, "engine kron");
        return kronQueued(jobs, n, p, out);
    }

    // The Kron measurements queued (jobs through a pinned buffer); the results in out after finish(ticket).
    int kronQueued(const KronJob* jobs, std::size_t n, const detail::KronParamsHD& p, KronOut* out) {
        const cudaStream_t s = m_dc.stream();
        m_times.start("kron upload");
        auto* hJobs = static_cast<KronJob*>(pinnedBuffer(&Persistent::kronIn, n * sizeof(KronJob)));
        parallelCopy(hJobs, jobs, n * sizeof(KronJob));
        DeviceBuffer<KronJob> dJobs(m_dc, n);
        dJobs.upload(hJobs, n);
        applyChainedSkies(dJobs.get(), n);
        m_times.stop();
        DeviceBuffer<KronOut> dOut(m_dc, n);
        m_times.start("kron");
        if (m_kronThread) {
            const int tKron = threads(kronKernel);
            kronKernel<<<blocks(n, tKron), tKron, 0, s>>>(m_in, dJobs.get(), n, p, dOut.get());
        } else {
            const int t = std::max(32, std::min(kWarpKernelThreads, threads(kronWarpKernel) / 32 * 32));
            kronWarpKernel<<<blocks(n * 32, t), t, 0, s>>>(m_in, dJobs.get(), n, p, dOut.get());
        }
        checkLaunch("the Kron apertures");
        m_times.stop();
        m_times.start("kron download");
        KronOut* staged = stage(dOut, n, &Persistent::kron);
        m_times.stop();
        return enqueue({{out, staged, n * sizeof(KronOut)}});
    }

    // Pass 3 in one round trip (whole plan, queued calls): the grid index of the n jobs
    // (optimalRadiusKernel), each measured job's radius from it (slot[c] < slot[c + 1]: job c is circle
    // slot[c]), then the circles. GPUPHOT_APERTURE_CHAIN=0: optimalRadii, then sumCircles.
    bool optimalCircles(const detail::OptimalJob* jobs, std::size_t n, const detail::OptimalGrid& grid,
                        const double* gridRadius, const std::size_t* slot, const CircleJob* circles,
                        std::size_t m, std::int32_t* index, ApertureSums* out,
                        ApertureFlagDistances* fd) override {
        if (m_optimalOnHost || !m_chain || m_shrink > 0 || m_sync || n == 0 || m == 0 ||
            grid.n == 0)
            return false;
        const HostClock clock(m_times, "engine optimal circles");
        const cudaStream_t s = m_dc.stream();
        const std::size_t ng = grid.n;
        m_times.start("optimal upload");
        // one pinned block: the jobs, the slots, the grid (frac, num, area, kappaArea, radius)
        const std::size_t jobBytes = n * sizeof(detail::OptimalJob),
                          slotBytes = (n + 1) * sizeof(std::size_t);
        auto* hIn = static_cast<unsigned char*>(
            pinnedBuffer(&Persistent::optimalIn, jobBytes + slotBytes + 5 * ng * sizeof(double)));
        parallelCopy(hIn, jobs, jobBytes);
        std::memcpy(hIn + jobBytes, slot, slotBytes);
        auto* hGrid = reinterpret_cast<double*>(hIn + jobBytes + slotBytes);
        const double* parts[5] = {grid.frac, grid.num, grid.area, grid.kappaArea, gridRadius};
        for (int q = 0; q < 5; ++q)
            std::copy(parts[q], parts[q] + ng, hGrid + q * ng);
        auto* hCircles = static_cast<CircleJob*>(pinnedBuffer(&Persistent::circleIn, m * sizeof(CircleJob)));
        parallelCopy(hCircles, circles, m * sizeof(CircleJob));
        DeviceBuffer<unsigned char> dIn(m_dc, jobBytes + slotBytes + 5 * ng * sizeof(double));
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(dIn.get(), hIn, dIn.bytes(), cudaMemcpyHostToDevice, s));
        DeviceBuffer<CircleJob> dCircles(m_dc, m);
        dCircles.upload(hCircles, m);
        m_times.stop();
        m_times.start("optimal");
        const auto* dJobs = reinterpret_cast<const detail::OptimalJob*>(dIn.get());
        const auto* dSlot = reinterpret_cast<const std::size_t*>(dIn.get() + jobBytes);
        const auto* dGrid = reinterpret_cast<const double*>(dIn.get() + jobBytes + slotBytes);
        detail::OptimalGrid dg = grid;
        dg.frac = dGrid;
        dg.num = dGrid + ng;
        dg.area = dGrid + 2 * ng;
        dg.kappaArea = dGrid + 3 * ng;
        DeviceBuffer<std::int32_t> dIndex(m_dc, n);
        DeviceBuffer<double> dR(m_dc, 2 * m);
        const int t = threads(optimalRadiusKernel);
        optimalRadiusKernel<<<blocks(n, t), t, 0, s>>>(dJobs, n, dg, dIndex.get());
        checkLaunch("the optimal radii");
        const int tr = threads(optimalCircleRadiiKernel);
        optimalCircleRadiiKernel<<<blocks(n, tr), tr, 0, s>>>(dIndex.get(), dSlot, n, dGrid + 4 * ng,
                                                              dR.get(), dR.get() + m);
        checkLaunch("the optimal circles' radii");
        std::int32_t* stagedIndex = stage(dIndex, n, &Persistent::optimal);
        m_times.stop();
        enqueue({{index, stagedIndex, n * sizeof(std::int32_t)}});
        finish(circleKernels(dCircles.get(), m, dR.get(), dR.get() + m, 1, 1, out, fd));
        return true;
    }

    // Reads no pixels: the same for the whole and the strips plans.
    bool optimalRadii(const detail::OptimalJob* jobs, std::size_t n, const detail::OptimalGrid& grid,
                      std::int32_t* index) override {
        if (m_optimalOnHost) return false;
        const HostClock clock(m_times, "engine optimal");
        if (n == 0 || grid.n == 0) return false;
        const cudaStream_t s = m_dc.stream();
        m_times.start("optimal");
        const std::size_t ng = grid.n;
        DeviceBuffer<double> dGrid(m_dc, 4 * ng);
        DeviceBuffer<detail::OptimalJob> dJobs(m_dc, n);
        DeviceBuffer<std::int32_t> dIndex(m_dc, n);
        std::vector<double> g(4 * ng);
        std::copy(grid.frac, grid.frac + ng, g.begin());
        std::copy(grid.num, grid.num + ng, g.begin() + ng);
        std::copy(grid.area, grid.area + ng, g.begin() + 2 * ng);
        std::copy(grid.kappaArea, grid.kappaArea + ng, g.begin() + 3 * ng);
        dGrid.upload(g.data(), 4 * ng);
        dJobs.upload(jobs, n);
        detail::OptimalGrid dg = grid;
        dg.frac = dGrid.get();
        dg.num = dGrid.get() + ng;
        dg.area = dGrid.get() + 2 * ng;
        dg.kappaArea = dGrid.get() + 3 * ng;
        const int t = threads(optimalRadiusKernel);
        optimalRadiusKernel<<<blocks(n, t), t, 0, s>>>(dJobs.get(), n, dg, dIndex.get());
        checkLaunch("the optimal radii");
        std::int32_t* staged = stage(dIndex, n, &Persistent::optimal);
        m_times.stop();
        finish(enqueue({{index, staged, n * sizeof(std::int32_t)}}));
        return true;
    }

private:
    // Chained pass 1 (chainPass1): the uploaded jobs' skies from the device's estimates.
    template <class Job> void applyChainedSkies(Job* dJobs, std::size_t n) {
        if (!m_chainSky) return;
        const int t = threads(applySkyKernel<Job>);
        applySkyKernel<Job><<<blocks(n, t), t, 0, m_dc.stream()>>>(dJobs, n, m_chainSky, m_chainRule);
        checkLaunch("the chained skies");
    }
    // Strips plan: items grouped in order of their first row (y - ext), each group's rows [r0, r1) (all
    // that its items read, ext + 2 rows of margin) at most m_maxRows; the planes' rows uploaded into band
    // buffers that m_in addresses as if they were the whole frame (row r0 at band row 0); run(indices).
    // needsMaps(i): item i reads the background maps (a per-pixel sky); a group uploads them only then.
    template <class P, class F>
    void forGroups(const double* cy, const double* ext, std::size_t n, P&& needsMaps, F&& run) {
        if (n == 0) return;
        const int H = m_in.height;
        std::vector<int> lo(n), hi(n);
        for (std::size_t i = 0; i < n; ++i) {
            const double e = std::isfinite(ext[i]) ? ext[i] : double(H);
            if (!std::isfinite(cy[i])) { // reads nothing (the driver passes finite centres)
                lo[i] = 0;
                hi[i] = 1;
                continue;
            }
            lo[i] = static_cast<int>(std::clamp(std::floor(cy[i] - e) - 2.0, 0.0, double(H - 1)));
            hi[i] = static_cast<int>(std::clamp(std::ceil(cy[i] + e) + 2.0, 0.0, double(H - 1))) + 1;
        }
        std::vector<std::size_t> order(n);
        for (std::size_t i = 0; i < n; ++i)
            order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return lo[a] < lo[b]; });
        std::size_t k = 0;
        std::vector<std::size_t> idx;
        while (k < n) {
            const int r0 = lo[order[k]];
            int r1 = hi[order[k]];
            if (r1 - r0 > m_maxRows)
                throw DeviceOutOfMemory("aperture: one source's rows (" + std::to_string(r1 - r0) +
                                        ") exceed a band of " + std::to_string(m_maxRows) + " rows");
            idx.clear();
            while (k < n && std::max(r1, hi[order[k]]) - r0 <= m_maxRows) {
                r1 = std::max(r1, hi[order[k]]);
                idx.push_back(order[k++]);
            }
            bool maps = false;
            for (const std::size_t i : idx)
                maps = maps || needsMaps(i);
            bindBand(r0, r1, maps);
            run(idx);
            m_dc.synchronize();
            ++m_groups;
        }
    }

    void bindBand(int r0, int r1, bool maps) {
        const int W = m_in.width;
        const std::size_t np = static_cast<std::size_t>(r1 - r0) * W;
        const std::ptrdiff_t shift = static_cast<std::ptrdiff_t>(r0) * W;
        m_bImage.reset();
        m_bMask.reset();
        m_bSeg.reset();
        m_bLevel.reset();
        m_bRms.reset();
        m_bImage = DeviceBuffer<float>(m_dc, np);
        uploadRows(m_dc, m_bImage.get(), m_hImage, r0, r1);
        m_in.image = m_bImage.get() - shift;
        m_in.imageStride = W;
        if (!m_hMask.empty()) {
            m_bMask = DeviceBuffer<std::uint8_t>(m_dc, np);
            uploadRows(m_dc, m_bMask.get(), m_hMask, r0, r1);
            m_in.mask = m_bMask.get() - shift;
            m_in.maskStride = W;
        }
        if (!m_hSeg.empty()) {
            m_bSeg = DeviceBuffer<std::int32_t>(m_dc, np);
            uploadRows(m_dc, m_bSeg.get(), m_hSeg, r0, r1);
            m_in.seg = m_bSeg.get() - shift;
            m_in.segStride = W;
        }
        m_in.level = m_in.rms = nullptr;
        if (maps && m_rows) {
            m_bLevel = DeviceBuffer<float>(m_dc, np);
            m_bRms = DeviceBuffer<float>(m_dc, np);
            m_rows->rows(r0, r1 - r0, m_bLevel.get(), m_bRms.get());
            m_in.level = m_bLevel.get() - shift;
            m_in.rms = m_bRms.get() - shift;
            m_in.mapStride = W;
        } else if (maps && !m_hLevel.empty()) {
            m_bLevel = DeviceBuffer<float>(m_dc, np);
            m_bRms = DeviceBuffer<float>(m_dc, np);
            uploadRows(m_dc, m_bLevel.get(), m_hLevel, r0, r1);
            uploadRows(m_dc, m_bRms.get(), m_hRms, r0, r1);
            m_in.level = m_bLevel.get() - shift;
            m_in.rms = m_bRms.get() - shift;
            m_in.mapStride = W;
        }
    }

    // One of the stage's pinned download or upload buffers and the size the stage asks of it (a quarter more
    // than the largest request, so that a re-run with a few more sources does not pin memory again).
    struct StagePinned {
        GrowingPinned buffer;
        std::size_t asked = 0;
    };
    // What the stage keeps in its DeviceContext between calls (its scratch): the driver's batch buffers and
    // its pinned buffers.
    struct Persistent {
        detail::ApertureScratch scratch;
        StagePinned sky, circle, flag, kron, optimal;          // downloads
        StagePinned skyIn, circleIn, radii, kronIn, optimalIn; // uploads
    };
    Persistent& persistent() { return m_dc.scratch<Persistent>(); }
    using PinnedMember = StagePinned Persistent::*;
    // The queue's bit of each buffer (m_busyPinned, m_buildPinned, Pending::pinned): its place in this list.
    static constexpr PinnedMember kPinnedBuffers[] = {
        &Persistent::sky,     &Persistent::circle,   &Persistent::flag,     &Persistent::kron,
        &Persistent::optimal, &Persistent::skyIn,    &Persistent::circleIn, &Persistent::radii,
        &Persistent::kronIn,  &Persistent::optimalIn};
    static unsigned pinnedBit(PinnedMember which) {
        unsigned bit = 1;
        for (const PinnedMember m : kPinnedBuffers) {
            if (m == which) return bit;
            bit <<= 1;
        }
        return 0;
    }
    // Enqueues the download of d[0, count) into the stage's reusable pinned buffer `which` (read it after the
    // stream is synchronised; pinned copies run at tens of GB/s, pageable ones at a few).
    template <class T> T* stage(const DeviceBuffer<T>& d, std::size_t count, PinnedMember which) {
        T* p = static_cast<T*>(pinnedBuffer(which, std::max<std::size_t>(count, 1) * sizeof(T)));
        d.download(p, count);
        return p;
    }
    // Pinned memory of at least `bytes` in the stage's buffer `which`; first finishes the queued work that
    // still uses it.
    void* pinnedBuffer(PinnedMember which, std::size_t bytes) {
        const unsigned bit = pinnedBit(which);
        if (m_busyPinned & bit) finish();
        m_buildPinned |= bit;
        m_busyPinned |= bit;
        StagePinned& b = persistent().*which;
        if (b.asked < bytes) b.asked = bytes + bytes / 4;
        return b.buffer.get(b.asked);
    }

    // Threads per block for kernel k: the configured count, at most what k's registers allow (the results
    // do not depend on the launch configuration: one thread per item, grid-stride loops).
    template <class K> int threads(K* k) const {
        cudaFuncAttributes a{};
        GPUPHOT_CUDA_CHECK(cudaFuncGetAttributes(&a, k));
        int t = std::min(m_threads, a.maxThreadsPerBlock);
        if (t >= 32) t -= t % 32;
        return std::max(t, 1);
    }
    static unsigned blocks(std::size_t items, int threadsPerBlock) {
        const std::size_t t = static_cast<std::size_t>(threadsPerBlock);
        return static_cast<unsigned>(
            std::max<std::size_t>(1, std::min<std::size_t>((items + t - 1) / t, 1u << 20)));
    }
    DeviceContext& m_dc;
    const BackgroundResult& m_bkg;
    KernelClock m_times; // GPUPHOT_APERTURE_TIMING
    std::string m_notes;
    bool m_heapSort = false; // tuning aperture.heapSort: one thread sorts each source's annulus
    bool m_skySplit = false;   // tuning aperture.skySplit: count, scan, fill, segmented sort, statistics
    bool m_kronThread = false; // tuning aperture.kronThread: one thread per source
    // skyBlockKernel's mode (its `fast`): 2 the sort's short strides in registers (bitonicOwnBlocks), 1 every
    // stride pair by pair in shared memory (GPUPHOT_APERTURE_SKY_SORT=pairs), 0 the plain way, the sums from
    // 0 (GPUPHOT_APERTURE_SKY=block0).
    int m_skyMode = 2;
    // Circle kernel: 0 by size (circleWarpKernel up to m_warpItems source-radius pairs, else
    // circlePartsKernel: one warp per pair measured slower at 151 MP for the first pass, 6.7
    // against 5.0 ms at 54k sources), 1 circlePartsKernel, 2 circleWarpKernel (GPUPHOT_APERTURE_CIRCLE).
    int m_circleMode = 0;
    // GPUPHOT_APERTURE_WARP_ITEMS: pass 2's reference and curve-of-growth calls (at most apCorrMaxStars x
    // 10 sources, or stars x grid radii: 100 x 186 by default) get one warp per pair; pass 1 (sources x
    // radii) and pass 3 from 32k sources keep one thread per pair.
    std::size_t m_warpItems = 32768;
    std::size_t m_batch = 131072;    // tuning aperture.batch (tests: several batches)
    bool m_optimalOnHost = false;    // tuning aperture.optimalOnHost
    bool m_sync = false;             // tuning aperture.sync: each call done before it returns
    bool m_keep = true;              // tuning aperture.keep off: the driver's batch buffers per call
    bool m_chain = true;             // tuning aperture.chain off: pass 1's circles and Kron wait for the host
    bool m_spatialOrder = false;     // tuning aperture.spatialOrder: the driver's spatial order
    // The last skyBlockAsync call's estimates on the device (its ticket, its sources) for chainPass1, and
    // while a chained call uploads its jobs: those estimates and the rule.
    DeviceBuffer<SkyEstimate> m_skyOut;
    std::size_t m_skyN = 0;
    int m_skyTicket = -1;
    const SkyEstimate* m_chainSky = nullptr;
    detail::SkyJobRule m_chainRule;
    // GPUPHOT_APERTURE_STREAMS=2: chainPass1's circles on a side stream of the greatest priority, Kron beside
    // them on the main one (measured slower at 151 MP, 13.8-14.3 against 12.4-12.9 ms for the
    // stage: the two kernels share the SMs, the circles end later, and the host has little to do meanwhile);
    // their buffers until sideJoin(); the stream and its events.
    bool m_twoStreams = false;
    struct SideBuffers {
        DeviceBuffer<ApertureSums> partial, full, out;
        DeviceBuffer<ApertureFlagDistances> fd;
    };
    SideBuffers m_sideBuffers;
    DeviceBuffer<CircleJob> m_sideJobs;
    DeviceBuffer<double> m_sideRadii;
    cudaStream_t m_sideStream = nullptr;
    cudaEvent_t m_sideIn = nullptr, m_sideDone = nullptr;
    // skyBlockKernel: at most this many annulus keys in shared memory (32 KB), threads per block.
    static constexpr int kSkyBlockCap = 8192;
    int m_skyThreads = 64; // GPUPHOT_APERTURE_SKY_THREADS
    // The split sky path's sources per chunk (its annulus values of a chunk on the device at once).
    static constexpr std::size_t kSplitChunk = 32768;
    // Queued work.
    std::vector<Pending> m_pending;
    int m_ticket = 0;
    unsigned m_busyPinned = 0, m_buildPinned = 0;
    static constexpr int kWarpKernelThreads = kWarpSumWarps * 32; // warp-per-source kernels
    int m_threads = 128;
    AperturePlanes m_in;
    DeviceBuffer<std::int32_t> m_seg;
    // Strips plan.
    int m_shrink = 0, m_maxRows = 0, m_groups = 0;
    ImageView m_hImage, m_hLevel, m_hRms;
    MaskView m_hMask;
    ImageViewT<std::int32_t> m_hSeg;
    DeviceBuffer<float> m_bImage, m_bLevel, m_bRms;
    std::unique_ptr<DeviceBackgroundRows> m_rows; // strips plan, lean background
    DeviceBuffer<std::uint8_t> m_bMask;
    DeviceBuffer<std::int32_t> m_bSeg;
};

} // namespace

void debugLocalSkies(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
                     const double* cx, const double* cy, std::size_t n, double rin, double rout,
                     const detail::SkyParamsHD& p, double saturation, RunContext& ctx,
                     std::vector<int>& offsets, std::vector<int>& index, std::vector<float>& sorted,
                     std::vector<detail::SkyEstimate>& est) {
    DeviceContext& dc = DeviceContext::of(ctx);
    const BackgroundResult none;
    CudaEngine engine(dc, none);
    engine.begin(image, mask, seg, ImageView{}, ImageView{}, saturation, NeighbourPixels::Sum);
    est.assign(n, detail::SkyEstimate{});
    AnnulusDebug dbg;
    engine.localSkiesImpl(cx, cy, n, rin, rout, p, est.data(), &dbg);
    offsets = std::move(dbg.offsets);
    index = std::move(dbg.index);
    sorted = std::move(dbg.sorted);
}

void debugOptimalRadii(const detail::OptimalJob* jobs, std::size_t n, const detail::OptimalGrid& grid,
                       std::int32_t* index, RunContext& ctx) {
    const BackgroundResult none;
    CudaEngine engine(DeviceContext::of(ctx), none);
    if (!engine.optimalRadii(jobs, n, grid, index))
        for (std::size_t i = 0; i < n; ++i)
            index[i] = -1;
}

namespace {
// The whole plan: need (frame + mask + both maps resident, the segmentation map unless it is resident
// already, and up to 256 MB for one batch's per-source buffers: annulus values of 32768 sources, circle
// sums) beside what the context holds (its frame and background caches count as free). Empty (why says
// why) when it does not fit or an allocation failed.
std::optional<ApertureResult> wholePlan(DeviceContext& dc, std::size_t need, const ImageView& image,
                                        const MaskView& mask, const BackgroundResult& bkg,
                                        const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                        double fwhm, double gain, double readNoise, const ApertureParams& params,
                                        RunContext& ctx, std::string& why) {
    const std::size_t cached = dc.cachedFrameBytes() + dc.cachedBackgroundBytes();
    const std::size_t others = dc.inUse() - std::min(dc.inUse(), cached);
    why = "whole frame needs " + bytesText(need);
    if (others + need > dc.budget()) return std::nullopt;
    try {
        const auto t0 = std::chrono::steady_clock::now();
        CudaEngine engine(dc, bkg);
        ApertureResult r = detail::measureAperturesWith(engine, image, mask, bkg, segmentation, sources, fwhm, gain,
                                                        readNoise, params, ctx);
        dc.notePlan("whole", 1);
        engine.report(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                      sources.size());
        return std::optional<ApertureResult>(std::move(r));
    } catch (const DeviceOutOfMemory& e) {
        why = e.what();
        dc.drain();
    }
    return std::nullopt;
}

std::size_t wholeNeed(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg, bool seg) {
    const std::size_t npix = static_cast<std::size_t>(image.width) * image.height;
    const bool maps = bkg.hasFullMaps() || (bkg.sampler && hasBackgroundGrid(bkg, image.width, image.height));
    return npix * (4 + (mask.empty() ? 0 : 1) + (seg ? 4 : 0) + (maps ? 8 : 0)) + (std::size_t(256) << 20);
}
} // namespace

ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                double fwhm, double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    std::string why;
    if (auto r = wholePlan(dc, wholeNeed(image, mask, bkg, !segmentation.empty()), image, mask, bkg, segmentation,
                           sources, fwhm, gain, readNoise, params, ctx, why))
        return std::move(*r);
    for (const int shrink : {1, 4}) {
        try {
            dc.dropFrame();
            dc.dropBackground();
            CudaEngine engine(dc, bkg, shrink);
            ApertureResult r = detail::measureAperturesWith(engine, image, mask, bkg, segmentation, sources, fwhm,
                                                            gain, readNoise, params, ctx);
            dc.notePlan("strips", engine.groups());
            return r;
        } catch (const DeviceOutOfMemory& e) {
            why = e.what();
            dc.drain();
        }
    }
    dc.notePlan("cpu", 0, cpuFallbackNote("aperture", dc.budget(), why));
    return cpu::measureApertures(image, mask, bkg, segmentation, sources, fwhm, gain, readNoise, params, ctx);
}

ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const SegmentationMap& segmentation, const Sources& sources, double fwhm,
                                double gain, double readNoise, const ApertureParams& params, RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    if (segmentation.empty())
        return cuda::measureApertures(image, mask, bkg, ImageViewT<std::int32_t>{}, sources, fwhm, gain, readNoise,
                                      params, ctx);
    // A deferred map of this context on its device: the whole plan reads it there. The driver gets a view of
    // the device buffer: it checks its size and passes it to the engine (residentSegmentation), and reads
    // pixels on the host only for sources without segmentId (then the map is materialised instead).
    const std::int32_t* dSeg = deviceSegmentation(dc, segmentation);
    bool tight = false;
    if (dSeg && sources.segmentId.size() >= sources.x.size()) {
        const int w = segmentation.width(), h = segmentation.height();
        const ImageViewT<std::int32_t> onDevice{dSeg, w, h, w, 0};
        const std::size_t need = wholeNeed(image, mask, bkg, false); // the map is in dc.inUse() already
        std::string why;
        auto r = wholePlan(dc, need, image, mask, bkg, onDevice, sources, fwhm, gain, readNoise, params, ctx, why);
        // Other results' maps of this context down to their hosts, and once more.
        if (!r && evictSegmentations(dc, &segmentation) > 0)
            r = wholePlan(dc, need, image, mask, bkg, onDevice, sources, fwhm, gain, readNoise, params, ctx, why);
        if (r) return std::move(*r);
        tight = true;
    }
    // The host map (materialised now): another context's map, sources without segmentId, or the strips and
    // CPU plans, which also get the device copy's memory when the whole plan did not fit.
    const ImageViewT<std::int32_t> host = segmentation.view();
    if (tight) releaseSegmentationDevice(dc, segmentation);
    return cuda::measureApertures(image, mask, bkg, host, sources, fwhm, gain, readNoise, params, ctx);
}

} // namespace gpuphot::cuda
