// Stage 2 on the GPU, its per-pixel front: background subtraction and pixel states (as `prepare` in
// core/stages/detection/detection.cpp), the matched filter in the summation order of
// core/stages/detection/convolution.cpp, the threshold test into a bit image (one bit per pixel) and the
// above-threshold runs in raster order (per-row counts, a scan, one warp per row writing its runs: no
// atomics, deterministic). The separable filters of 3-11 taps (FWHM 1-5 px) run as one kernel over tiles
// (frontTileKernel: subtraction, both passes and the threshold, no intermediate image), in one launch over
// the frame when the images stay on the device; other filters as two kernels (subtraction fused with the row
// pass, the column pass fused with the threshold; GPUPHOT_DETECTION_FRONT_UNFUSED=1 selects them for every
// filter); the chunks of the whole plan are queued without a host synchronisation and the runs come back in
// one download. In the whole plan the filtered image and the states stay on the device and the per-object
// half runs there too (detection_objects.cu, detection_finish.cu); the strips plan (and parameters the device
// half does not take) download sub/det/state and run core's per-object half on the host. Either way the
// catalog is bitwise the CPU one.
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/convolution.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/detection/detection_device.cuh"
#include "kernels/detection/detection_finish.hpp"
#include "kernels/detection/detection_front.hpp"
#include "kernels/detection/detection_objects.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"
#include "kernels/kernel_clock.cuh"

namespace gpuphot::cuda {
namespace {

using detail::Run;
static_assert(sizeof(Run) == 3 * sizeof(std::int32_t), "Run is downloaded as three int32");

constexpr std::uint8_t kInvalid = detail::StateInvalid;
constexpr std::uint8_t kBad = detail::StateBad;
constexpr std::uint8_t kSaturated = detail::StateSaturated;

// ---- per-pixel kernels ---------------------------------------------------------------------------------
// Layout: a strip of image rows [h0, h1) (the own rows [y0, y1) with the filter's halo); inputs address row
// h0, the own outputs (state, sub, det, bits) row y0. The above-threshold pixels go into a bit image: bit
// x % 32 of 32-bit word x / 32 of a row (wordsPerRow words, bits past the width 0), one warp ballot per
// word (block widths are multiples of 32, so a warp covers one aligned word of one row).

__host__ __device__ inline int wordsPerRow(int W) {
    return (W + 31) / 32;
}

struct PrepArgs {
    const float* px;        // pixels, row h0
    const std::uint8_t* mk; // mask (null: none), row h0
    const float* lv;        // background level, row h0
    const float* rm;        // background rms, row h0
    int W;
    int own0, own1; // own rows, relative to h0
    bool hasSat;
    float sat;
};

// core's prepareRow for one pixel from its loaded values (pixel, mask bits, level, rms): the state bits and
// the background-subtracted value.
__device__ inline float prepareValue(const PrepArgs& a, float v, std::uint8_t mb, float lv, float rm,
                                     std::uint8_t& state) {
    std::uint8_t s = 0;
    if (!isfinite(v) || !isfinite(lv) || !isfinite(rm) || (mb & (MaskNonFinite | MaskOutside)))
        s |= kInvalid | kBad;
    if (mb & (MaskBad | MaskCosmicRay)) s |= kBad;
    if ((mb & MaskSaturated) || (a.hasSat && v >= a.sat)) s |= kSaturated;
    state = s;
    return (s & kBad) ? 0.0f : v - lv;
}

// The same for pixel i of the strip.
__device__ inline float preparePixel(const PrepArgs& a, std::size_t i, std::uint8_t& state) {
    return prepareValue(a, a.px[i], a.mk ? a.mk[i] : std::uint8_t(0), a.lv[i], a.rm[i], state);
}

// The threshold test of core's rowRuns.
__device__ inline bool abovePixel(float det, float rms, std::uint8_t state, double threshold, bool absolute) {
    const double t = absolute ? threshold : threshold * static_cast<double>(rms);
    return !(state & kInvalid) && static_cast<double>(det) > t;
}

// Lane 0 of each warp stores the warp's ballot as the word of pixel x (warps entirely past the width store
// nothing). Every lane of the warp must call it.
__device__ inline void storeBits(bool above, int x, int W, std::uint32_t* rowBits) {
    const unsigned word = __ballot_sync(0xffffffffu, above);
    if ((threadIdx.x & 31) == 0 && x < W) rowBits[x >> 5] = word;
}

struct ThresholdArgs {
    double threshold;
    bool absolute;
};

// Subtraction and states of rows [0, rows) of the strip (states and sub stored for the own rows; sub also
// for the halo rows when subHalo is set: the 2-D filter's input); WithBits (no filter): the threshold
// test on sub, bits of the own rows. Grid: x blocks over the width, y over rows (strided).
template <bool WithBits>
__global__ void prepareKernel(PrepArgs a, int rows, float* sub, bool subHalo, std::uint8_t* state,
                              ThresholdArgs t, std::uint32_t* bits) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int wpr = wordsPerRow(a.W);
    for (int y = blockIdx.y; y < rows; y += gridDim.y) {
        const bool own = y >= a.own0 && y < a.own1;
        if (!own && !subHalo) continue; // uniform in the block
        bool up = false;
        if (x < a.W) {
            const std::size_t i = static_cast<std::size_t>(y) * a.W + x;
            std::uint8_t s;
            const float v = preparePixel(a, i, s);
            const std::size_t o = static_cast<std::size_t>(y - a.own0) * a.W + x; // own layout
            if (sub) sub[subHalo ? i : o] = v;
            if (own) state[o] = s;
            if (WithBits && own) up = abovePixel(v, a.rm[i], s, t.threshold, t.absolute);
        }
        if (WithBits && own) storeBits(up, x, a.W, bits + static_cast<std::size_t>(y - a.own0) * wpr);
    }
}

constexpr int kSegmentRows = 4; // rows per block of prepareRowsKernel

// Subtraction and states fused with the horizontal filter pass (rows [0, rows) of the strip, halo
// included): each block stages kSegmentRows row segments with r pixels either side in shared memory (the
// background-subtracted value, 0 outside the row; every thread's loads of its own pixels, and of the halo
// pixels, issued before any is used), then tmp(x) = 0; += k[j] * sub(x + j - r), j ascending, taps inside
// the row only (core's hconv). States (and sub, when set) stored for the own rows.
__global__ void prepareRowsKernel(PrepArgs a, int rows, const float* k, int n, float* tmp, float* sub,
                                  std::uint8_t* state) {
    extern __shared__ float seg[]; // kSegmentRows x (blockDim.x + 2r)
    const int r = n / 2;
    const int T = blockDim.x;
    const int xb = blockIdx.x * T;
    const int x = xb + threadIdx.x;
    const int span = T + 2 * r;
    for (int yb = blockIdx.y * kSegmentRows; yb < rows; yb += gridDim.y * kSegmentRows) {
        float pv[kSegmentRows], lv[kSegmentRows], rm[kSegmentRows];
        std::uint8_t mb[kSegmentRows];
#pragma unroll
        for (int q = 0; q < kSegmentRows; ++q) {
            pv[q] = lv[q] = rm[q] = 0.0f;
            mb[q] = 0;
            if (yb + q < rows && x < a.W) {
                const std::size_t i = static_cast<std::size_t>(yb + q) * a.W + x;
                pv[q] = a.px[i];
                mb[q] = a.mk ? a.mk[i] : std::uint8_t(0);
                lv[q] = a.lv[i];
                rm[q] = a.rm[i];
            }
        }
        // Halo pixels: segment positions [0, r) and [r + T, span), 2r of them per row.
        for (int h = threadIdx.x; h < 2 * r * kSegmentRows; h += T) {
            const int q = h / (2 * r), e = h - q * 2 * r;
            const int i = e < r ? e : T + e; // segment position
            const int xx = xb - r + i;
            float v = 0.0f;
            if (yb + q < rows && xx >= 0 && xx < a.W) {
                std::uint8_t s;
                v = preparePixel(a, static_cast<std::size_t>(yb + q) * a.W + xx, s);
            }
            seg[q * span + i] = v;
        }
#pragma unroll
        for (int q = 0; q < kSegmentRows; ++q) {
            const int y = yb + q;
            float v = 0.0f;
            if (y < rows && x < a.W) {
                std::uint8_t s;
                v = prepareValue(a, pv[q], mb[q], lv[q], rm[q], s);
                if (y >= a.own0 && y < a.own1) {
                    const std::size_t o = static_cast<std::size_t>(y - a.own0) * a.W + x;
                    state[o] = s;
                    if (sub) sub[o] = v;
                }
            }
            seg[q * span + r + threadIdx.x] = v;
        }
        __syncthreads();
        if (x < a.W) {
            const int j0 = max(0, r - x), j1 = min(n, a.W + r - x);
#pragma unroll
            for (int q = 0; q < kSegmentRows; ++q) {
                if (yb + q >= rows) break;
                float acc = 0.0f;
                for (int j = j0; j < j1; ++j)
                    acc += k[j] * seg[q * span + threadIdx.x + j];
                tmp[static_cast<std::size_t>(yb + q) * a.W + x] = acc;
            }
        }
        __syncthreads();
    }
}

// Horizontal pass without shared memory (filters too wide for prepareRowsKernel's segment): acc = 0;
// acc += k[j] * in(x + j - r), j ascending, taps inside the row only.
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

constexpr int kColumnRows = 16; // output rows per thread of columnThresholdKernel

struct ColumnArgs {
    const float* tmp;          // horizontally filtered rows from image row h0
    const float* rm;           // rms from image row y0
    const std::uint8_t* state; // states from image row y0
    float* det;                // filtered image from image row y0
    std::uint32_t* bits;       // bits from image row y0
    int W, H, h0, y0, rows;    // H: image height; rows: own rows
};

// Vertical pass fused with the threshold: det(x, y) = 0; += k[j] * tmp(x, y + j - r), j ascending, rows
// inside the image only (core's vertical pass); then the bit of (x, y). kColumnRows consecutive own rows
// per thread. N > 0 (N = n taps): blocks of kColumnRows rows whose taps are all inside the image read their
// kColumnRows + N - 1 input rows once into registers (all loads issued first), the same sums in the same
// order; other blocks, and N = 0, read each tap through L1.
template <int N> __global__ void columnThresholdKernel(ColumnArgs a, const float* k, int n, ThresholdArgs t) {
    const int r = n / 2;
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int wpr = wordsPerRow(a.W);
    for (int ya = blockIdx.y * kColumnRows; ya < a.rows; ya += gridDim.y * kColumnRows) {
        if constexpr (N > 0) {
            const int y = a.y0 + ya; // the block's first image row (uniform in the block)
            if (ya + kColumnRows <= a.rows && y - N / 2 >= 0 && y + kColumnRows - 1 + N / 2 < a.H) {
                float w[kColumnRows + N - 1], kk[N];
#pragma unroll
                for (int j = 0; j < N; ++j)
                    kk[j] = k[j];
                if (x < a.W) {
                    const float* src = a.tmp + static_cast<std::size_t>(y - N / 2 - a.h0) * a.W + x;
#pragma unroll
                    for (int i = 0; i < kColumnRows + N - 1; ++i)
                        w[i] = __ldg(src + static_cast<std::size_t>(i) * a.W);
                }
#pragma unroll
                for (int q = 0; q < kColumnRows; ++q) {
                    const int yl = ya + q;
                    bool up = false;
                    if (x < a.W) {
                        float acc = 0.0f;
#pragma unroll
                        for (int j = 0; j < N; ++j)
                            acc += kk[j] * w[q + j];
                        const std::size_t o = static_cast<std::size_t>(yl) * a.W + x;
                        a.det[o] = acc;
                        up = abovePixel(acc, a.rm[o], a.state[o], t.threshold, t.absolute);
                    }
                    storeBits(up, x, a.W, a.bits + static_cast<std::size_t>(yl) * wpr);
                }
                continue;
            }
        }
        for (int yl = ya, yb = min(a.rows, ya + kColumnRows); yl < yb; ++yl) {
            const int y = a.y0 + yl;
            bool up = false;
            if (x < a.W) {
                const int j0 = max(0, r - y), j1 = min(n, a.H + r - y);
                float acc = 0.0f;
                for (int j = j0; j < j1; ++j)
                    acc += k[j] * __ldg(a.tmp + static_cast<std::size_t>(y + j - r - a.h0) * a.W + x);
                const std::size_t o = static_cast<std::size_t>(yl) * a.W + x;
                a.det[o] = acc;
                up = abovePixel(acc, a.rm[o], a.state[o], t.threshold, t.absolute);
            }
            storeBits(up, x, a.W, a.bits + static_cast<std::size_t>(yl) * wpr);
        }
    }
}

// The whole separable front in one kernel (N taps, N in 3..11: the stage's default filters): subtraction and
// states, the row pass, the column pass and the threshold, without the row-filtered intermediate image (its
// write and re-read were ~25 % of the two-kernel front's traffic) and without re-reading rms and states.
// A block takes a tile of R own rows x T columns: (1) each thread loads its column of the tile's R + N - 1
// input rows (8 rows' loads in flight at a time; the 2r halo columns by the first threads) and stages the
// background-subtracted values in shared memory, the own rows' rms and states too; (2) one barrier; (3) each
// thread row-filters its column of every input row into registers and makes its own rows' column sums,
// filtered values and bits. The halo rows are read again by the tile below (mostly from L2). The arithmetic
// is core's, in core's order: tmp(x) = 0; += k[j] * sub(x + j - r), j ascending, taps inside the row only;
// det(x, y) = 0; += k[j] * tmp(x, y + j - r), j ascending, rows inside the image only; then the threshold
// test of rowRuns.
constexpr int kTileRows = 16;     // own rows per tile of frontTileKernel (R)
constexpr int kTileThreads = 256; // at most, per block of frontTileKernel (its register budget)
constexpr int kTileBatch = 8;     // input rows whose loads a thread issues together
constexpr int kTileHalo = 2;      // halo pixels per thread loaded ahead (2r(R + 2r) <= 2T for T >= 130)

struct TileArgs {
    PrepArgs a;          // strip inputs addressing image row h0
    int H, h0, h1;       // image height; the strip's input rows [h0, h1) (image rows)
    int y0, rows;        // own rows [y0, y0 + rows) (image rows)
    float* det;          // own rows
    std::uint8_t* state; // own rows
    float* sub;          // own rows (null: not stored)
    std::uint32_t* bits; // own rows
};

// Shared memory of frontTileKernel: sub of (R + N - 1) x (T + N - 1), rms of R x T, states of R x T.
std::size_t tileShared(int N, int R, int T) {
    return (static_cast<std::size_t>(R + N - 1) * (T + N - 1) + static_cast<std::size_t>(R) * T) *
               sizeof(float) +
           static_cast<std::size_t>(R) * T;
}

template <int N, int R>
__global__ void __launch_bounds__(kTileThreads, 3)
    frontTileKernel(TileArgs f, const float* k, ThresholdArgs t) {
    constexpr int r = N / 2;
    constexpr int M = R + N - 1; // input rows of a tile
    extern __shared__ float smem[];
    const PrepArgs& a = f.a;
    // Inputs read-only (and not aliasing the outputs) during the kernel: the next batch's loads may be issued
    // ahead of this batch's stores.
    const float* __restrict__ gpx = a.px;
    const float* __restrict__ glv = a.lv;
    const float* __restrict__ grm = a.rm;
    const std::uint8_t* __restrict__ gmk = a.mk;
    const int T = blockDim.x, S = T + 2 * r, W = a.W;
    float* sv = smem;                                         // M x S: sub (0 outside the image)
    float* rmS = sv + static_cast<std::size_t>(M) * S;        // R x T: rms of the own pixels
    auto* stS = reinterpret_cast<std::uint8_t*>(rmS + R * T); // R x T: states of the own pixels
    const int tx = threadIdx.x, xb = blockIdx.x * T, x = xb + tx;
    const int wpr = wordsPerRow(W);
    float kk[N];
#pragma unroll
    for (int j = 0; j < N; ++j)
        kk[j] = k[j];
    const int j0 = max(0, r - x), j1 = min(N, W + r - x); // the row pass's taps inside the row
    for (int ya = blockIdx.y * R; ya < f.rows; ya += gridDim.y * R) {
        const int top = f.y0 + ya - r;                                      // image row of input row 0
        auto inRow = [&](int i) { return top + i >= 0 && top + i < f.h1; }; // uniform in the block
        auto rowAt = [&](int i) { return static_cast<std::size_t>(top + i - f.h0) * W; };
        // (1a) the halo columns' loads first (their latency overlaps the own columns'): kTileHalo pixels per
        // thread; blocks too narrow for that (tests) stage the rest after the own columns.
        float hpx[kTileHalo], hlv[kTileHalo], hrm[kTileHalo];
        std::uint8_t hmk[kTileHalo];
        auto haloAt = [&](int h, int& i, int& pos, int& xx) {
            i = h / (2 * r);
            const int e = h - i * 2 * r;
            pos = e < r ? e : T + e; // position in the shared row
            xx = xb - r + pos;
        };
#pragma unroll
        for (int q = 0; q < kTileHalo; ++q) {
            hpx[q] = hlv[q] = hrm[q] = 0.0f;
            hmk[q] = 0;
            int i, pos, xx;
            haloAt(tx + q * T, i, pos, xx);
            if (tx + q * T < 2 * r * M && inRow(i) && xx >= 0 && xx < W) {
                const std::size_t o = rowAt(i) + xx;
                hpx[q] = __ldg(gpx + o);
                hmk[q] = gmk ? __ldg(gmk + o) : std::uint8_t(0);
                hlv[q] = __ldg(glv + o);
                hrm[q] = __ldg(grm + o);
            }
        }
        // (1b) own columns, kTileBatch rows at a time: all loads of a batch, then the values.
#pragma unroll
        for (int i0 = 0; i0 < M; i0 += kTileBatch) {
            float px[kTileBatch], lv[kTileBatch], rm[kTileBatch];
            std::uint8_t mk[kTileBatch];
#pragma unroll
            for (int q = 0; q < kTileBatch; ++q) {
                const int i = i0 + q;
                px[q] = lv[q] = rm[q] = 0.0f;
                mk[q] = 0;
                if (i < M && inRow(i) && x < W) {
                    const std::size_t o = rowAt(i) + x;
                    px[q] = __ldg(gpx + o);
                    mk[q] = gmk ? __ldg(gmk + o) : std::uint8_t(0);
                    lv[q] = __ldg(glv + o);
                    rm[q] = __ldg(grm + o);
                }
            }
#pragma unroll
            for (int q = 0; q < kTileBatch; ++q) {
                const int i = i0 + q;
                if (i >= M) break;
                float v = 0.0f;
                std::uint8_t s = 0;
                if (inRow(i) && x < W) v = prepareValue(a, px[q], mk[q], lv[q], rm[q], s);
                sv[i * S + r + tx] = v;
                const int o = i - r; // own row of this input row, if any
                if (o >= 0 && o < R) {
                    rmS[o * T + tx] = rm[q];
                    stS[o * T + tx] = s;
                    if (ya + o < f.rows && x < W) {
                        const std::size_t p = static_cast<std::size_t>(ya + o) * W + x;
                        f.state[p] = s;
                        if (f.sub) f.sub[p] = v;
                    }
                }
            }
        }
#pragma unroll
        for (int q = 0; q < kTileHalo; ++q) {
            int i, pos, xx;
            haloAt(tx + q * T, i, pos, xx);
            if (tx + q * T < 2 * r * M) {
                std::uint8_t s;
                const bool in = inRow(i) && xx >= 0 && xx < W;
                sv[i * S + pos] = in ? prepareValue(a, hpx[q], hmk[q], hlv[q], hrm[q], s) : 0.0f;
            }
        }
        for (int h = tx + kTileHalo * T; h < 2 * r * M; h += T) {
            int i, pos, xx;
            haloAt(h, i, pos, xx);
            float v = 0.0f;
            if (inRow(i) && xx >= 0 && xx < W) {
                std::uint8_t s;
                v = preparePixel(a, rowAt(i) + xx, s);
            }
            sv[i * S + pos] = v;
        }
        __syncthreads();
        // (3) the row pass of this column into registers, then the own rows.
        float w[M];
#pragma unroll
        for (int i = 0; i < M; ++i) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < N; ++j)
                if (j >= j0 && j < j1) acc += kk[j] * sv[i * S + tx + j];
            w[i] = acc;
        }
#pragma unroll
        for (int o = 0; o < R; ++o) {
            const int yl = ya + o;
            if (yl >= f.rows) break; // uniform in the block
            bool up = false;
            if (x < W) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < N; ++j)
                    if (top + o + j >= 0 && top + o + j < f.H) acc += kk[j] * w[o + j];
                const std::size_t p = static_cast<std::size_t>(yl) * W + x;
                f.det[p] = acc;
                up = abovePixel(acc, rmS[o * T + tx], stS[o * T + tx], t.threshold, t.absolute);
            }
            storeBits(up, x, W, f.bits + static_cast<std::size_t>(yl) * wpr);
        }
        __syncthreads(); // the tile's shared memory is the next tile's
    }
}

// 2-D kernel: dst = 0; kernel rows j ascending (rows outside skipped), taps i ascending (outside skipped).
// in holds image rows from inY0 on (a strip with its halo), out the output rows [outY0, outY0 + outRows).
__global__ void convolve2dKernel(const float* in, int W, int H, int inY0, int outY0, int outRows,
                                 const float* k, int kw, int kh, float* out) {
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

// The threshold test of a filtered strip (the 2-D filter's output): bits of the own rows.
__global__ void thresholdBitsKernel(ColumnArgs a, ThresholdArgs t) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int wpr = wordsPerRow(a.W);
    for (int yl = blockIdx.y; yl < a.rows; yl += gridDim.y) {
        bool up = false;
        if (x < a.W) {
            const std::size_t o = static_cast<std::size_t>(yl) * a.W + x;
            up = abovePixel(a.det[o], a.rm[o], a.state[o], t.threshold, t.absolute);
        }
        storeBits(up, x, a.W, a.bits + static_cast<std::size_t>(yl) * wpr);
    }
}

// Run starts and ends of bit word w of a row (prev: the word before it, next: the word after it, 0 at
// the row's ends): a start is a set bit whose left neighbour is clear, an end one whose right neighbour is.
__device__ inline std::uint32_t runStarts(std::uint32_t w, std::uint32_t prev) {
    return w & ~((w << 1) | (prev >> 31));
}
__device__ inline std::uint32_t runEnds(std::uint32_t w, std::uint32_t next) {
    return w & ~((w >> 1) | (next << 31));
}

// Runs per row (one warp per row): counts[y] for rows [0, rows) of the bit image.
__global__ void runCountKernel(const std::uint32_t* bits, int wpr, int rows, int* counts) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int y = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; y < rows; y += warps) {
        const std::uint32_t* b = bits + static_cast<std::size_t>(y) * wpr;
        int c = 0;
        for (int w = lane; w < wpr; w += 32)
            c += __popc(runStarts(b[w], w > 0 ? b[w - 1] : 0u));
        for (int d = 16; d > 0; d >>= 1)
            c += __shfl_xor_sync(0xffffffffu, c, d);
        if (lane == 0) counts[y] = c;
    }
}

// The runs of each row at its offset, in order of x (one warp per row; a warp-wide scan of the start and
// end counts per 32 words): the k-th start and the k-th end of a row form run k.
__global__ void runWriteKernel(const std::uint32_t* bits, int wpr, int rows, int yOff, const int* offsets,
                               Run* runs) {
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int y = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; y < rows; y += warps) {
        const std::uint32_t* b = bits + static_cast<std::size_t>(y) * wpr;
        Run* out = runs + offsets[y];
        int starts = 0, ends = 0; // runs begun / ended in the words before this pass
        for (int w0 = 0; w0 < wpr; w0 += 32) {
            const int w = w0 + lane;
            std::uint32_t s = 0, e = 0;
            if (w < wpr) {
                const std::uint32_t cur = b[w];
                s = runStarts(cur, w > 0 ? b[w - 1] : 0u);
                e = runEnds(cur, w + 1 < wpr ? b[w + 1] : 0u);
            }
            int cs = __popc(s), ce = __popc(e);
            for (int d = 1; d < 32; d <<= 1) { // inclusive scans
                const int us = __shfl_up_sync(0xffffffffu, cs, d), ue = __shfl_up_sync(0xffffffffu, ce, d);
                if (lane >= d) {
                    cs += us;
                    ce += ue;
                }
            }
            int is = starts + cs - __popc(s), ie = ends + ce - __popc(e);
            for (; s; s &= s - 1, ++is) {
                Run& rr = out[is];
                rr.y = y + yOff;
                rr.x0 = w * 32 + __ffs(s) - 1;
            }
            for (; e; e &= e - 1, ++ie)
                out[ie].x1 = w * 32 + __ffs(e) - 1;
            starts += __shfl_sync(0xffffffffu, cs, 31);
            ends += __shfl_sync(0xffffffffu, ce, 31);
        }
    }
}

void checkLaunch(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        throw CudaError(std::string("detection: launching ") + what + ": " + cudaGetErrorString(e));
}

// The stage's own input check (detail::inputProblem: whatever fails it is handed to the CPU stage, which
// throws the message), plus what only the device engine needs: lean background maps made on the device
// from the mesh grid, and a filter kernel of odd width and height.
bool acceptable(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                const DetectionParams& p) {
    if (!detail::inputProblem(image, mask, bkg, p).empty()) return false;
    if (!bkg.hasFullMaps()) { // lean maps: made on the device from the grid, the host half reads the sampler
        if (!bkg.level.empty() || !bkg.rms.empty() || !bkg.sampler) return false;
        if (!hasBackgroundGrid(bkg, image.width, image.height)) return false;
    }
    if (p.filter && !p.filterKernel.empty()) {
        const int kw = p.filterKernelWidth;
        const int kh = static_cast<int>(p.filterKernel.size()) / kw;
        if (kw % 2 == 0 || kh % 2 == 0) return false;
    }
    return true;
}

// Threads per block of the per-pixel kernels: the context's knob rounded up to whole warps (the bit
// ballots need warps aligned on 32 pixels of one row).
int blockThreads(const DeviceContext& dc) {
    const int t = dc.blockSize() > 0 ? std::min(dc.blockSize(), 1024) : 256;
    return (t + 31) / 32 * 32;
}

constexpr std::size_t kSegmentSharedMax = 48 << 10; // prepareRowsKernel's shared segment, at most

struct DetSetup {
    const ImageView& image;
    const MaskView& mask;
    const BackgroundResult& bkg;
    const DetectionParams& p;
    int W, H;
    std::vector<float> k;      // filter taps (empty: no filter)
    int kw = 0, kh = 0;        // kh = 0: separable (k both ways)
    int halo = 0;              // filter half-height
    int threads = 256;         // a multiple of 32
    bool fused = false;        // frontTileKernel (a separable filter of 3..11 taps)
    int fusedRows = kTileRows; // frontTileKernel's tile rows (GPUPHOT_DETECTION_TILE_ROWS=32: experiments)
    KernelClock* clock = nullptr;
};

// The stage's filter taps, computed on the host as the CPU stage does.
DetSetup makeSetup(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                   const DetectionParams& p, const DeviceContext& dc, KernelClock& clock) {
    DetSetup s{image, mask, bkg, p, image.width, image.height};
    s.threads = blockThreads(dc);
    s.clock = &clock;
    if (p.filter) {
        if (!p.filterKernel.empty()) {
            s.k = normalisedKernel(p.filterKernel);
            s.kw = p.filterKernelWidth;
            s.kh = static_cast<int>(s.k.size()) / s.kw;
            s.halo = s.kh / 2;
        } else {
            s.k = gaussianKernel1d(p.filterFwhm);
            s.kw = static_cast<int>(s.k.size());
            s.halo = s.kw / 2;
            // tuning detection.frontUnfused: the two-kernel front (comparisons and benchmarks); else the tile
            // front.
            const auto& t = dc.tuning().detection;
            s.fused = s.kw >= 3 && s.kw <= 11 && !t.frontUnfused;
            if (t.tileRows32 && s.kw == 7) s.fusedRows = 32;
        }
    }
    return s;
}

// Rows per chunk of the whole plan: the whole frame in one launch when the fused front writes straight into
// the kept device images (no per-chunk intermediate), else an eighth of the frame (at least 64 rows).
int wholeChunkRows(const DetSetup& s, bool deviceImages) {
    if (s.fused && deviceImages) return s.H;
    return std::min(s.H, std::max(64, (s.H + 7) / 8));
}

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

// What the detection front keeps in the DeviceContext between frames (its scratch).
struct FrontScratch {
    std::size_t lastRunCount = 0; // the runs of the last whole-frame extraction
    HostImages hostImages;        // the host per-object half's images
    GrowingPinned total, runs;    // the run extraction's downloads: the run count, the runs
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

dim3 gridFor(int W, int threads, int rows) {
    return dim3(static_cast<unsigned>((W + threads - 1) / threads),
                static_cast<unsigned>(std::clamp(rows, 1, 65535)));
}

// One strip's rows and kernel arguments, shared by processStrip's filter steps.
struct StripWork {
    DeviceContext& dc;
    const DetSetup& s;
    const float* dK;
    int h0, h1, hr, rows, y0; // input rows [h0, h1) (hr of them), own rows [y0, y0 + rows)
    std::size_t nHalo, nRows; // pixels of the halo rows, of the own rows
    std::size_t inner;        // the strip's first row in halo layout
    PrepArgs pa;
    ThresholdArgs t;
    float* dSub;          // the own rows' sub (the host plans), else null
    std::uint8_t* dState; // the own rows' states
    ColumnArgs ca;        // ca.det: the own rows' filtered image
};

// Subtraction into a halo-layout image (the 2-D filter's input, or a filter too wide for the fused row
// pass); the host plans' sub is its own rows.
void subtractHalo(const StripWork& w, DeviceBuffer<float>& subHalo) {
    const DetSetup& s = w.s;
    const int T = s.threads;
    const cudaStream_t stream = w.dc.stream();
    subHalo = DeviceBuffer<float>(w.dc, w.nHalo);
    s.clock->time("subtraction", [&] {
        prepareKernel<false><<<gridFor(s.W, T, w.hr), T, 0, stream>>>(w.pa, w.hr, subHalo.get(), true,
                                                                      w.dState, w.t, nullptr);
    });
    checkLaunch("the background subtraction");
    if (w.dSub)
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(w.dSub, subHalo.get() + w.inner, w.nRows * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream));
}

// A 2-D filter kernel: the subtraction into the halo layout, the filter, the threshold.
void filter2d(const StripWork& w) {
    const DetSetup& s = w.s;
    const int W = s.W, T = s.threads;
    const cudaStream_t stream = w.dc.stream();
    DeviceBuffer<float> subHalo;
    subtractHalo(w, subHalo);
    s.clock->time("2-D filter", [&] {
        convolve2dKernel<<<gridFor(W, T, w.rows), T, 0, stream>>>(subHalo.get(), W, s.H, w.h0, w.y0, w.rows,
                                                                  w.dK, s.kw, s.kh, w.ca.det);
    });
    checkLaunch("the 2-D filter");
    s.clock->time("threshold",
                  [&] { thresholdBitsKernel<<<gridFor(W, T, w.rows), T, 0, stream>>>(w.ca, w.t); });
    checkLaunch("the threshold");
}

// A separable filter of 3..11 taps: subtraction, filter and threshold in one tile kernel.
void fusedFront(const StripWork& w) {
    const DetSetup& s = w.s;
    const cudaStream_t stream = w.dc.stream();
    const float* dK = w.dK;
    const ThresholdArgs t = w.t;
    const TileArgs fa{w.pa, s.H, w.h0, w.h1, w.y0, w.rows, w.ca.det, w.dState, w.dSub, w.ca.bits};
    const int TF = std::min(s.threads, kTileThreads), R = s.fusedRows;
    const dim3 grid = gridFor(s.W, TF, (w.rows + R - 1) / R);
    const std::size_t shared = tileShared(s.kw, R, TF);
    s.clock->time("fused front (subtraction, filter, threshold)", [&] {
        // The kernels' dynamic shared memory above the default 48 kB needs the opt-in attribute.
        auto launch = [&](auto kernel) {
            if (shared > (48u << 10))
                GPUPHOT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        static_cast<int>(shared)));
            kernel<<<grid, TF, shared, stream>>>(fa, dK, t);
        };
        switch (s.kw) {
        case 3:
            launch(frontTileKernel<3, kTileRows>);
            break;
        case 5:
            launch(frontTileKernel<5, kTileRows>);
            break;
        case 7: // the default filter (FWHM 3); 32-row tiles only for experiments
            if (R == 32)
                launch(frontTileKernel<7, 32>);
            else
                launch(frontTileKernel<7, kTileRows>);
            break;
        case 9:
            launch(frontTileKernel<9, kTileRows>);
            break;
        default:
            launch(frontTileKernel<11, kTileRows>);
        }
    });
    checkLaunch("the fused front");
}

// The column pass of a separable filter fused with the threshold, on the row-filtered halo rows `ca.tmp`.
void columnThreshold(const StripWork& w, const ColumnArgs& ca) {
    const DetSetup& s = w.s;
    const int T = s.threads;
    const cudaStream_t stream = w.dc.stream();
    const float* dK = w.dK;
    const ThresholdArgs t = w.t;
    s.clock->time("column filter + threshold", [&] {
        const dim3 grid = gridFor(s.W, T, (w.rows + kColumnRows - 1) / kColumnRows);
        switch (s.kw) { // the default filters (FWHM 1-5 px: 3 to 11 taps) with a register window
        case 3:
            columnThresholdKernel<3><<<grid, T, 0, stream>>>(ca, dK, s.kw, t);
            break;
        case 5:
            columnThresholdKernel<5><<<grid, T, 0, stream>>>(ca, dK, s.kw, t);
            break;
        case 7:
            columnThresholdKernel<7><<<grid, T, 0, stream>>>(ca, dK, s.kw, t);
            break;
        case 9:
            columnThresholdKernel<9><<<grid, T, 0, stream>>>(ca, dK, s.kw, t);
            break;
        case 11:
            columnThresholdKernel<11><<<grid, T, 0, stream>>>(ca, dK, s.kw, t);
            break;
        default:
            columnThresholdKernel<0><<<grid, T, 0, stream>>>(ca, dK, s.kw, t);
        }
    });
    checkLaunch("the column filter and threshold");
}

// A separable filter in two passes: the subtraction and the row filter (fused while a row segment fits in
// shared memory), then the column filter with the threshold.
void separableFilter(const StripWork& w) {
    const DetSetup& s = w.s;
    const int W = s.W, T = s.threads;
    const cudaStream_t stream = w.dc.stream();
    DeviceBuffer<float> tmp(w.dc, w.nHalo);
    const std::size_t segment = static_cast<std::size_t>(kSegmentRows) * (T + 2 * s.halo) * sizeof(float);
    if (segment <= kSegmentSharedMax) {
        s.clock->time("subtraction + row filter", [&] {
            prepareRowsKernel<<<gridFor(W, T, (w.hr + kSegmentRows - 1) / kSegmentRows), T, segment,
                                stream>>>(w.pa, w.hr, w.dK, s.kw, tmp.get(), w.dSub, w.dState);
        });
        checkLaunch("the subtraction and row filter");
    } else {
        DeviceBuffer<float> subHalo;
        subtractHalo(w, subHalo);
        s.clock->time("row filter", [&] {
            convolveRowsKernel<<<gridFor(W, T, w.hr), T, 0, stream>>>(subHalo.get(), W, w.hr, w.dK, s.kw,
                                                                      tmp.get());
        });
        checkLaunch("the row filter");
    }
    ColumnArgs ca = w.ca;
    ca.tmp = tmp.get();
    columnThreshold(w, ca);
}

// Rows [y0, y1): subtraction and states (with the filter's halo rows), the filter and the threshold test
// into `bits` (the strip's rows of the bit image), stream-ordered without a host synchronisation; then the
// downloads of the strip's rows of sub, det and state into the host images, if any. States and the filtered
// image are written straight into the kept device images when `o` has them.
void processStrip(DeviceContext& dc, const DetSetup& s, const DetInputs& in, const float* dK, int y0, int y1,
                  const StripOutputs& o, std::uint32_t* bits) {
    const cudaStream_t stream = dc.stream();
    const int W = s.W, H = s.H, T = s.threads;
    const int h0 = std::max(0, y0 - s.halo), h1 = std::min(H, y1 + s.halo), hr = h1 - h0, rows = y1 - y0;
    const std::size_t off = static_cast<std::size_t>(h0 - in.y0) * W;
    const std::size_t nHalo = static_cast<std::size_t>(hr) * W, nRows = static_cast<std::size_t>(rows) * W;
    const std::size_t inner = static_cast<std::size_t>(y0 - h0) * W; // the strip's first row in halo layout
    const std::size_t hostOff = static_cast<std::size_t>(y0) * W;
    const PrepArgs pa{in.px + off,
                      in.mk ? in.mk + off : nullptr,
                      in.lv + off,
                      in.rm + off,
                      W,
                      y0 - h0,
                      y1 - h0,
                      std::isfinite(s.p.saturationLevel),
                      static_cast<float>(s.p.saturationLevel)};
    const ThresholdArgs t{s.p.threshold, s.p.thresholdIsAbsolute};

    DeviceBuffer<std::uint8_t> stateOwn;
    std::uint8_t* dState = o.dState ? o.dState + hostOff : nullptr;
    if (!dState) {
        stateOwn = DeviceBuffer<std::uint8_t>(dc, nRows);
        dState = stateOwn.get();
    }
    DeviceBuffer<float> subOwn, detOwn;
    float* dSub = nullptr;
    if (o.hSub) {
        subOwn = DeviceBuffer<float>(dc, nRows);
        dSub = subOwn.get();
    }
    ColumnArgs ca{
        nullptr, in.rm + static_cast<std::size_t>(y0 - in.y0) * W, dState, nullptr, bits, W, H, h0, y0, rows};
    if (s.k.empty()) {
        s.clock->time("subtraction + threshold", [&] {
            prepareKernel<true><<<gridFor(W, T, rows), T, 0, stream>>>(pa, hr, dSub, false, dState, t, bits);
        });
        checkLaunch("the background subtraction");
    } else {
        ca.det = o.dDet ? o.dDet + hostOff : nullptr;
        if (!ca.det) {
            detOwn = DeviceBuffer<float>(dc, nRows);
            ca.det = detOwn.get();
        }
        const StripWork w{dc, s, dK, h0, h1, hr, rows, y0, nHalo, nRows, inner, pa, t, dSub, dState, ca};
        if (s.kh > 0)
            filter2d(w);
        else if (s.fused)
            fusedFront(w);
        else
            separableFilter(w);
    }
    if (o.hSub) {
        dc.downloadStaged(o.hSub + hostOff, dSub, nRows * sizeof(float));
        dc.downloadStaged(o.hState + hostOff, dState, nRows);
        if (!s.k.empty()) dc.downloadStaged(o.hDet + hostOff, ca.det, nRows * sizeof(float));
    }
}

// Appends the runs of rows [0, rows) of a bit image (image rows from yOff on) in raster order: per-row
// counts, a scan, one host synchronisation for the total, the runs written at their rows' offsets and
// downloaded through pinned memory (the host vector grows meanwhile). keep: the device copy of the runs
// (null: freed). expected: runs to make room for in the host vector while the device is still busy (the
// previous frame's count: growing the vector faults its pages in, ~1 ms per 5 MB), 0: none. hostCopy
// false (needs keep): the runs stay on the device only (the device per-object half reads them there; the
// host vector, its page faults and the download cost ~3.5 ms at 151 MP).
void extractRuns(DeviceContext& dc, const DetSetup& s, const std::uint32_t* bits, int rows, int yOff,
                 std::vector<Run>& runs, DeviceBuffer<Run>* keep, std::size_t expected = 0,
                 bool hostCopy = true) {
    if (!keep) hostCopy = true;
    const cudaStream_t stream = dc.stream();
    const int wpr = wordsPerRow(s.W);
    KernelClock& kc = *s.clock;
    constexpr int kThreads = 256; // 8 rows per block, one per warp
    const int blocks = std::max(1, std::min((rows + 7) / 8, 1 << 16));
    DeviceBuffer<int> counts(dc, static_cast<std::size_t>(rows) + 1);
    GPUPHOT_CUDA_CHECK(cudaMemsetAsync(counts.get() + rows, 0, sizeof(int), stream));
    kc.time("run count",
            [&] { runCountKernel<<<blocks, kThreads, 0, stream>>>(bits, wpr, rows, counts.get()); });
    checkLaunch("the run count");
    DeviceBuffer<int> offsets(dc, static_cast<std::size_t>(rows) + 1);
    std::size_t tmpBytes = 0;
    GPUPHOT_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(nullptr, tmpBytes, counts.get(), offsets.get(), rows + 1, stream));
    DeviceBuffer<unsigned char> tmp(dc, std::max<std::size_t>(tmpBytes, 1));
    kc.time("scan", [&] {
        GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(tmp.get(), tmpBytes, counts.get(), offsets.get(),
                                                         rows + 1, stream));
    });
    FrontScratch& scratch = dc.scratch<FrontScratch>();
    auto* total = static_cast<int*>(scratch.total.get(sizeof(int)));
    GPUPHOT_CUDA_CHECK(
        cudaMemcpyAsync(total, offsets.get() + rows, sizeof(int), cudaMemcpyDeviceToHost, stream));
    kc.lap("run count queued");
    const std::size_t first = runs.size();
    if (expected > 0 && hostCopy) runs.resize(first + expected); // overwritten or cut below
    kc.lap("run vector pre-grown");
    dc.synchronize();
    kc.lap("wait for the count");
    const std::size_t n = static_cast<std::size_t>(*total);
    if (n == 0) {
        runs.resize(first);
        return;
    }
    DeviceBuffer<Run> dRuns(dc, n);
    kc.time("run extraction", [&] {
        runWriteKernel<<<blocks, kThreads, 0, stream>>>(bits, wpr, rows, yOff, offsets.get(), dRuns.get());
    });
    checkLaunch("the run extraction");
    if (!hostCopy) {
        *keep = std::move(dRuns); // read on the same stream after the extraction
        return;
    }
    auto* pinned = static_cast<Run*>(scratch.runs.get(n * sizeof(Run)));
    kc.time("run download", [&] {
        GPUPHOT_CUDA_CHECK(
            cudaMemcpyAsync(pinned, dRuns.get(), n * sizeof(Run), cudaMemcpyDeviceToHost, stream));
    });
    runs.resize(first + n);
    kc.lap("runs queued, vector resized");
    dc.synchronize();
    kc.lap("wait for the runs");
    std::memcpy(runs.data() + first, pinned, n * sizeof(Run));
    kc.lap("copy out of pinned memory");
    if (keep) *keep = std::move(dRuns);
}

// Bytes per strip row of processStrip (at most: sub, state, tmp over the halo rows; det; bits), the strip
// inputs when they are uploaded, and a share for the runs.
std::size_t workPerRow(const DetSetup& s) {
    return static_cast<std::size_t>(s.W) * (4 + 1 + 4 + 4 + 2);
}
std::size_t inputsPerRow(const DetSetup& s) {
    return static_cast<std::size_t>(s.W) * (4 + (s.mask.empty() ? 0 : 1) + 8);
}

// Whole plan: the frame and the maps resident (device caches); the per-pixel work in chunks of rows,
// queued without a host synchronisation (unless host images are downloaded), into one bit image of the
// frame; then the runs in one extraction. With `o`'s device images the filtered image and the states stay
// on the device: dim gets the views of all (and keptRuns the device copy of the runs).
int runWhole(DeviceContext& dc, const DetSetup& s, const float* dK, const StripOutputs& o,
             std::vector<Run>& runs, int chunkRows, RunContext& ctx, DeviceDetectionImages& dim,
             DeviceBuffer<Run>& keptRuns) {
    const DeviceContext::DeviceFrame f = dc.frame(s.image, s.mask);
    const auto [dLevel, dRms] = deviceBackgroundMaps(dc, s.bkg);
    const DetInputs in{f.pixels, f.mask, dLevel, dRms, 0};
    const std::size_t wpr = static_cast<std::size_t>(wordsPerRow(s.W));
    DeviceBuffer<std::uint32_t> bits(dc, wpr * s.H);
    s.clock->lap("frame, maps, bit image");
    int n = 0;
    for (int y0 = 0; y0 < s.H; y0 += chunkRows, ++n) {
        processStrip(dc, s, in, dK, y0, std::min(s.H, y0 + chunkRows), o, bits.get() + wpr * y0);
        ctx.checkCancelled();
    }
    s.clock->lap("chunks queued");
    // The previous count on this context, a little more (a re-run at another threshold, the next frame).
    std::size_t& lastCount = dc.scratch<FrontScratch>().lastRunCount;
    const std::size_t expected = lastCount > 0 ? lastCount + lastCount / 16 + 1024 : 0;
    const std::size_t first = runs.size();
    // The device per-object half labels the runs on the device: no host copy unless the host labelling
    // (tuning detection.hostLabels) needs it.
    const bool hostCopy = !o.dState || dc.tuning().detection.hostLabels;
    extractRuns(dc, s, bits.get(), s.H, 0, runs, o.dState ? &keptRuns : nullptr, expected, hostCopy);
    lastCount = hostCopy ? runs.size() - first : keptRuns.size();
    dim.width = s.W;
    dim.height = s.H;
    dim.frame = f.pixels;
    dim.level = dLevel;
    dim.rms = dRms;
    dim.det = s.k.empty() ? nullptr : o.dDet;
    dim.state = o.dState;
    dim.threshold = s.p.threshold;
    dim.absolute = s.p.thresholdIsAbsolute;
    dim.runs = keptRuns.get();
    dim.runCount = keptRuns.size();
    return n;
}

// Strips plan: no device cache; each strip's rows (with the halo) uploaded from the host, its runs
// extracted after it. forcedRows > 0: that many rows per strip (tests).
int runStrips(DeviceContext& dc, const DetSetup& s, const float* dK, float* hSub, float* hDet,
              std::uint8_t* hState, std::vector<Run>& runs, int shrink, RunContext& ctx, int forcedRows = 0) {
    const std::size_t perRow = workPerRow(s) + inputsPerRow(s);
    // The halo rows, and the scan's scratch (a few kB; counts and offsets are in the per-row share).
    const std::size_t margin = (std::size_t(64) << 10) + 2 * static_cast<std::size_t>(s.halo) * perRow;
    // Lean maps: the strip's rows interpolated on the device from the mesh grid (tables once).
    std::unique_ptr<DeviceBackgroundRows> maps;
    if (!s.bkg.hasFullMaps()) maps = std::make_unique<DeviceBackgroundRows>(dc, s.bkg);
    const int rows = forcedRows > 0 ? forcedRows : stripRowsFor(dc.available(), perRow, margin, s.H) / shrink;
    if (rows < 1) throw DeviceOutOfMemory("detection: one strip row needs " + bytesText(perRow + margin));
    const std::size_t wpr = static_cast<std::size_t>(wordsPerRow(s.W));
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
        DeviceBuffer<std::uint32_t> bits(dc, wpr * (y1 - y0));
        processStrip(dc, s, DetInputs{px.get(), mk.get(), lv.get(), rm.get(), h0}, dK, y0, y1,
                     StripOutputs{hSub, hDet, hState, nullptr, nullptr}, bits.get());
        extractRuns(dc, s, bits.get(), y1 - y0, y0, runs, nullptr);
        ctx.checkCancelled();
    }
    return n;
}

// The per-object half on the device images: core's steps 2b-4 (detection_objects.cu), then steps 5-6
// (detection_finish.cu). The filtered image is released in between (the finish step does not read it).
DetectionResult detectOnDevice(DeviceContext& dc, std::vector<Run> runs, DeviceDetectionImages& dim,
                               DeviceBuffer<float>& keptDet, DeviceBuffer<Run>& keptRuns,
                               const DetectionParams& p, RunContext& ctx) {
    detail::StepTimer timer;
    detail::DetectedObjects found = detectObjects(dc, std::move(runs), dim, p, ctx);
    timer.lap("detectObjects (device)");
    keptDet.reset();
    keptRuns.reset();
    dim.det = nullptr;
    dim.runs = nullptr;
    dim.runCount = 0;
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
    KernelClock clock(dc.stream(), "front", dc.tuning().detection.timing);
    DetSetup s = makeSetup(image, mask, bkg, p, dc, clock);

    // Host images that the strips fill row by row (the host per-object half), reused between runs:
    // pageable, filled through the context's pinned staging (pinning 1.4 GB at 151 MP cost the first run of a
    // process 0.6 s). Not made in the whole plan when the per-object half runs on the device.
    float* hSub = nullptr;
    float* hDet = nullptr;
    std::uint8_t* hState = nullptr;
    auto hostImages = [&]() {
        HostImages& hi = dc.scratch<FrontScratch>().hostImages;
        hi.reserve(npix, !s.k.empty());
        hSub = hi.sub.get();
        hState = hi.state.get();
        hDet = s.k.empty() ? hSub : hi.det.get();
        return StripOutputs{hSub, hDet, hState, nullptr, nullptr};
    };
    // Tuning detection.hostObjects keeps the host per-object half (comparisons and benchmarks).
    const bool deviceObjects = detectObjectsOnDevice(p) && !dc.tuning().detection.hostObjects;

    // Plan. Whole: frame, mask and both maps resident + one chunk's work (an eighth of the frame, at
    // least 64 rows), + the filtered image and the states kept for the device's per-object half. Strips: as
    // many rows as the budget allows with everything uploaded per strip.
    const int chunkRows = std::min(H, std::max(64, (H + 7) / 8));
    const std::size_t kept = deviceObjects ? npix * (1 + (s.k.empty() ? 0 : sizeof(float))) : 0;
    const std::size_t resident = inputsPerRow(s) * H + kept;
    const std::size_t cached = dc.cachedFrameBytes() + dc.cachedBackgroundBytes();
    const std::size_t others = dc.inUse() - std::min(dc.inUse(), cached);
    const std::size_t wholeNeed =
        resident + workPerRow(s) * (chunkRows + 2 * s.halo) + (std::size_t(2) << 20);
    std::string why = "whole frame needs " + bytesText(wholeNeed);
    std::vector<Run> runs;
    bool done = false, whole = false;
    DeviceBuffer<float> keptDet;
    DeviceBuffer<std::uint8_t> keptState;
    DeviceBuffer<Run> keptRuns;
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
            clock.lap("setup, plan, kept images");
            runWhole(dc, s, dK.get(), o, runs, wholeChunkRows(s, deviceObjects), ctx, dim, keptRuns);
            dc.notePlan("whole", 1);
            done = whole = true;
        } catch (const DeviceOutOfMemory& e) {
            why = e.what();
            dc.drain();
            runs.clear();
            keptDet.reset();
            keptState.reset();
            keptRuns.reset();
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
    clock.report();
    timer.lap(whole && deviceObjects ? "GPU front (images kept on the device)"
                                     : "GPU front + sub/det/state downloads");
    ctx.report("detection", 0.2);
    ctx.checkCancelled();

    if (whole && deviceObjects) {
        try {
            return detectOnDevice(dc, std::move(runs), dim, keptDet, keptRuns, p, ctx);
        } catch (const DeviceOutOfMemory& e) {
            // Re-planned as strips (the host per-object half), as an allocation failure in the front is.
            why = e.what();
            dc.drain();
            keptDet.reset();
            keptState.reset();
            keptRuns.reset();
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

DetectionFrontResult detectionFront(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                    const DetectionParams& p, RunContext& ctx, FrontPlan plan, int rows) {
    if (!acceptable(image, mask, bkg, p))
        throw InvalidInput("detectionFront: parameters the stage does not take");
    DeviceContext& dc = DeviceContext::of(ctx);
    KernelClock clock(dc.stream(), "front", dc.tuning().detection.timing);
    const DetSetup s = makeSetup(image, mask, bkg, p, dc, clock);
    const int W = s.W, H = s.H;
    const std::size_t npix = static_cast<std::size_t>(W) * H;
    DetectionFrontResult r;
    const bool filtered = !s.k.empty();
    DeviceBuffer<float> dK(dc, s.k.size());
    dK.upload(s.k.data(), s.k.size());
    if (plan == FrontPlan::WholeDevice) {
        DeviceBuffer<std::uint8_t> state(dc, npix);
        DeviceBuffer<float> det(dc, filtered ? npix : 0);
        DeviceBuffer<Run> keptRuns;
        DeviceDetectionImages dim;
        const int chunk = rows > 0 ? rows : wholeChunkRows(s, true);
        runWhole(dc, s, dK.get(), StripOutputs{nullptr, nullptr, nullptr, det.get(), state.get()}, r.runs,
                 chunk, ctx, dim, keptRuns);
        r.state = Image<std::uint8_t>(W, H);
        dc.downloadStaged(r.state.data(), state.get(), npix);
        if (filtered) {
            r.det = Image<float>(W, H);
            dc.downloadStaged(r.det.data(), det.get(), npix * sizeof(float));
        }
        std::vector<Run> back(keptRuns.size());
        if (!back.empty()) dc.downloadStaged(back.data(), keptRuns.get(), back.size() * sizeof(Run));
        if (r.runs.empty()) r.runs = back; // the runs stayed on the device only (no host labelling)
        r.deviceRuns =
            dim.runs == keptRuns.get() && dim.runCount == r.runs.size() &&
            (back.empty() || std::memcmp(back.data(), r.runs.data(), back.size() * sizeof(Run)) == 0);
        return r;
    }
    r.sub = Image<float>(W, H);
    r.state = Image<std::uint8_t>(W, H);
    if (filtered) r.det = Image<float>(W, H);
    float* hDet = filtered ? r.det.data() : r.sub.data();
    if (plan == FrontPlan::WholeHost) {
        DeviceBuffer<Run> unused;
        DeviceDetectionImages dim;
        const int chunk = rows > 0 ? rows : wholeChunkRows(s, false);
        runWhole(dc, s, dK.get(), StripOutputs{r.sub.data(), hDet, r.state.data(), nullptr, nullptr}, r.runs,
                 chunk, ctx, dim, unused);
    } else {
        dc.dropFrame();
        dc.dropBackground();
        runStrips(dc, s, dK.get(), r.sub.data(), hDet, r.state.data(), r.runs, 1, ctx, rows);
    }
    return r;
}

} // namespace gpuphot::cuda
