// Stage 1 on the GPU: the same numbers as cpu::estimateBackground (core/stages/background/background.hpp
// documents the operation order this file follows). Mesh statistics: one block per mesh (row partials per
// thread, added top down by one thread; histogram counts are integers, clipped by the whole block over their
// prefix sums: the CPU's integers). Bad-mesh fill, median filter and spline coefficients: on the host
// (a few thousand meshes). Full-resolution maps: one block per image row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/background/mesh_histogram.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"

namespace gpuphot::cuda {
namespace {

using bkgmath::kMaxLevels;

struct MeshOut {
    float level;
    float rms;
    int bad;
};

struct MeshShared {
    double sum, sum2, mean, sigma;
    long long n;
    float lcut, hcut;
    bkgmath::HistoScale q;
    int bad;
};

__device__ inline bool validPixel(float v, const std::uint8_t* mask, const std::int32_t* src, std::size_t i) {
    return isfinite(v) && (!mask || mask[i] == 0) && (!src || src[i] == 0);
}

// Per-row partial sums (left to right, in double) of the mesh's valid pixels, optionally within the cuts.
__device__ void rowSums(const float* img, const std::uint8_t* mask, const std::int32_t* src, int W, int x0,
                        int y0, int w, int h, bool clip, float lo, float hi, double* rs, double* rs2,
                        long long* rn) {
    for (int y = threadIdx.x; y < h; y += blockDim.x) {
        const std::size_t base = static_cast<std::size_t>(y0 + y) * W + x0;
        double s = 0.0, s2 = 0.0;
        long long n = 0;
        for (int x = 0; x < w; ++x) {
            const float v = img[base + x];
            if (!validPixel(v, mask, src, base + x)) continue;
            if (clip && !(v >= lo && v <= hi)) continue;
            const double d = v;
            s += d;
            s2 += d * d;
            ++n;
        }
        rs[y] = s;
        rs2[y] = s2;
        rn[y] = n;
    }
}

constexpr unsigned kFullWarp = 0xffffffffu;

// histo[0 .. n - 1] replaced by its exclusive prefix sums histo[0 .. n] (histo[k]: the bins below k), by
// the whole block (a multiple of 32 threads): a chunk per thread, the chunks' sums scanned by warps.
__device__ void exclusivePrefixInPlace(int* histo, int n, int* warpSums) {
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
    const int chunk = (n + blockDim.x - 1) / blockDim.x;
    const int b0 = min(n, t * chunk), b1 = min(n, b0 + chunk);
    int local = 0;
    for (int k = b0; k < b1; ++k)
        local += histo[k];
    int inclusive = local;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFullWarp, inclusive, o);
        if (lane >= o) inclusive += y;
    }
    if (lane == 31) warpSums[warp] = inclusive;
    __syncthreads();
    if (t == 0) {
        int run = 0;
        for (int w = 0; w < warps; ++w) {
            const int c = warpSums[w];
            warpSums[w] = run;
            run += c;
        }
        warpSums[warps] = run;
    }
    __syncthreads();
    int at = warpSums[warp] + inclusive - local;
    for (int k = b0; k < b1; ++k) {
        const int c = histo[k];
        histo[k] = at;
        at += c;
    }
    if (t == 0) histo[n] = warpSums[warps];
    __syncthreads();
}

// Sums of a and b over the block, in thread 0 (integers: the same in any order).
__device__ void blockSums(long long& a, long long& b, long long* sa, long long* sb) {
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(kFullWarp, a, o);
        b += __shfl_down_sync(kFullWarp, b, o);
    }
    if ((threadIdx.x & 31) == 0) {
        sa[threadIdx.x >> 5] = a;
        sb[threadIdx.x >> 5] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
            a += sa[w];
            b += sb[w];
        }
}

// bkgmath::clipHistogram by the whole block: the histogram (histo[0 .. nlevels], histo[nlevels] = 0) turned
// into its prefix sums, each round's median fill found by bisection (bkgmath::medianSplit, the same
// integers as the fill bin by bin) and its moments summed by every thread; the round's arithmetic on
// thread 0 (bkgmath::clipRound). The result in thread 0.
__device__ bkgmath::MeshMode clipHistogramBlock(int* histo, const bkgmath::HistoScale& q) {
    __shared__ int warpSums[33];
    __shared__ long long s1[32], s2[32];
    __shared__ bkgmath::ClipState cs;
    const int top = q.nlevels - 1;
    exclusivePrefixInPlace(histo, q.nlevels + 1, warpSums);
    const int* G = histo;
    if (threadIdx.x == 0) cs = bkgmath::clipStart(q);
    for (int round = 0; round < bkgmath::kMaxClipRounds; ++round) {
        __syncthreads(); // cs of the last round
        if (!bkgmath::clipGoesOn(cs, round)) break;
        const int lo = cs.lo, hi = cs.hi;
        long long m1 = 0, m2 = 0;
        for (int i = lo + static_cast<int>(threadIdx.x); i <= hi; i += blockDim.x) {
            const long long c = G[i + 1] - G[i];
            m1 += c * i;
            m2 += c * i * i;
        }
        blockSums(m1, m2, s1, s2);
        if (threadIdx.x == 0) {
            const long long total = hi >= lo ? G[hi + 1] - G[lo] : 0;
            const bkgmath::MedianSplit f = bkgmath::medianSplit(G, lo, hi);
            long long denom = 0;
            if (f.b >= 0) {
                const long long ca = G[f.a + 1] - G[f.a], cb = G[f.b + 1] - G[f.b];
                denom = ca < cb ? cb : ca;
            }
            bkgmath::clipRound(cs, top, f, denom, total, m1, m2);
        }
    }
    return bkgmath::clipMode(cs, q);
}

__global__ void meshStatsKernel(const float* img, const std::uint8_t* mask, const std::int32_t* src, int W,
                                int H, int bw, int bh, int nx, double minGood, MeshOut* out) {
    extern __shared__ double shm[];
    double* rs = shm;
    double* rs2 = rs + bh;
    auto* rn = reinterpret_cast<long long*>(rs2 + bh);
    auto* histo = reinterpret_cast<int*>(rn + bh);
    __shared__ MeshShared m;

    const int mi = blockIdx.x;
    const int mx = mi % nx, my = mi / nx;
    const int x0 = mx * bw, y0 = my * bh;
    const int w = min(bw, W - x0), h = min(bh, H - y0);

    // All valid pixels.
    rowSums(img, mask, src, W, x0, y0, w, h, false, 0.0f, 0.0f, rs, rs2, rn);
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0, sum2 = 0.0;
        long long n = 0;
        for (int y = 0; y < h; ++y) {
            sum += rs[y];
            sum2 += rs2[y];
            n += rn[y];
        }
        m.bad = (n == 0 || static_cast<double>(n) < minGood * static_cast<double>(w) * h) ? 1 : 0;
        m.n = n;
        if (!m.bad) {
            const double mean = sum / static_cast<double>(n);
            const double var = sum2 / static_cast<double>(n) - mean * mean;
            const double sigma = var > 0.0 ? sqrt(var) : 0.0;
            m.lcut = static_cast<float>(mean - 2.0 * sigma);
            m.hcut = static_cast<float>(mean + 2.0 * sigma);
        }
    }
    __syncthreads();
    if (m.bad) {
        if (threadIdx.x == 0) out[mi] = {0.0f, 0.0f, 1};
        return;
    }

    // Clip 1: within mean +- 2 sigma.
    rowSums(img, mask, src, W, x0, y0, w, h, true, m.lcut, m.hcut, rs, rs2, rn);
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0, sum2 = 0.0;
        long long n = 0;
        for (int y = 0; y < h; ++y) {
            sum += rs[y];
            sum2 += rs2[y];
            n += rn[y];
        }
        if (n == 0) {
            m.bad = 1;
        } else {
            const double mean = sum / static_cast<double>(n);
            const double var = sum2 / static_cast<double>(n) - mean * mean;
            const double sigma = var > 0.0 ? sqrt(var) : 0.0;
            m.q = bkgmath::histoScale(mean, sigma, n);
        }
    }
    __syncthreads();
    if (m.bad) {
        if (threadIdx.x == 0) out[mi] = {0.0f, 0.0f, 1};
        return;
    }

    // Histogram of all valid pixels (integer counts: order independent).
    const int nlevels = m.q.nlevels;
    for (int i = threadIdx.x; i <= nlevels; i += blockDim.x)
        histo[i] = 0;
    __syncthreads();
    const float qscale = m.q.qscale, cste = m.q.cste, flevels = static_cast<float>(nlevels);
    const int npix = w * h;
    for (int i = threadIdx.x; i < npix; i += blockDim.x) {
        const int y = i / w, x = i - y * w;
        const std::size_t p = static_cast<std::size_t>(y0 + y) * W + x0 + x;
        const float v = img[p];
        if (!validPixel(v, mask, src, p)) continue;
        const float t = v / qscale + cste;
        if (t > -1.0f && t < flevels) atomicAdd(&histo[static_cast<int>(t)], 1);
    }
    __syncthreads();

    // Clipping of the histogram and the mode, the CPU's numbers (clipHistogramBlock).
    const bkgmath::MeshMode mode = clipHistogramBlock(histo, m.q);
    if (threadIdx.x == 0) out[mi] = {mode.level, mode.rms, 0};
}

// One block per image row: node values of the row in shared memory (double arithmetic rounded to float),
// then every pixel of the row in float, in the documented order.
struct SplineDev {
    const double* g[2][4]; // [level, rms][v, dyy, dxx, dxxyy], (ny + 1) x (nx + 1)
    const std::int32_t* rowLo;
    const double* rowW[4]; // wa, wb, wa3, wb3
    const std::int32_t* colLo;
    const float* colW[4];
};

__global__ void interpolateKernel(SplineDev sp, int W, int H, int nx, float* level, float* rms) {
    extern __shared__ float nodes[]; // [map][node, dnode][nx + 1]
    const int s = nx + 1;
    for (int y = blockIdx.x; y < H; y += gridDim.x) {
        const int lo = sp.rowLo[y];
        const double A = sp.rowW[0][y], B = sp.rowW[1][y], A3 = sp.rowW[2][y], B3 = sp.rowW[3][y];
        __syncthreads(); // the previous row's pixels are done with the nodes
        for (int i = threadIdx.x; i < s; i += blockDim.x) {
            const std::size_t r0 = static_cast<std::size_t>(lo) * s + i, r1 = r0 + s;
            for (int map = 0; map < 2; ++map) {
                const double* const* g = sp.g[map];
                nodes[(map * 2) * s + i] = static_cast<float>(((A * g[0][r0] + B * g[0][r1]) + A3 * g[1][r0]) +
                                                              B3 * g[1][r1]);
                nodes[(map * 2 + 1) * s + i] = static_cast<float>(
                    ((A * g[2][r0] + B * g[2][r1]) + A3 * g[3][r0]) + B3 * g[3][r1]);
            }
        }
        __syncthreads();
        const std::size_t row = static_cast<std::size_t>(y) * W;
        for (int x = threadIdx.x; x < W; x += blockDim.x) {
            const int j = sp.colLo[x];
            const float ca = sp.colW[0][x], cb = sp.colW[1][x], ca3 = sp.colW[2][x], cb3 = sp.colW[3][x];
            for (int map = 0; map < 2; ++map) {
                const float* n = nodes + (map * 2) * s;
                const float* d = n + s;
                const float v = ((ca * n[j] + cb * n[j + 1]) + ca3 * d[j]) + cb3 * d[j + 1];
                (map == 0 ? level : rms)[row + x] = v;
            }
        }
    }
}

void checkLaunch(const char* what) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw CudaError(std::string("background: launching ") + what + ": " + cudaGetErrorString(e));
}

// The spline's per-row and per-column tables on the device (a few MB), shared by both plans.
struct SplineTables {
    DeviceBuffer<double> grid, rowW;
    DeviceBuffer<std::int32_t> rowLo, colLo;
    DeviceBuffer<float> colW;
    std::size_t g = 0;

    SplineTables(DeviceContext& dc, const BackgroundSpline& sp, int W, int H, int nx, int ny) {
        g = static_cast<std::size_t>(nx + 1) * (ny + 1);
        grid = DeviceBuffer<double>(dc, 8 * g);
        const std::vector<double>* grids[8] = {&sp.level.v, &sp.level.dyy, &sp.level.dxx, &sp.level.dxxyy,
                                               &sp.rms.v,   &sp.rms.dyy,   &sp.rms.dxx,   &sp.rms.dxxyy};
        for (int k = 0; k < 8; ++k)
            grid.upload(grids[k]->data(), g, k * g);
        rowW = DeviceBuffer<double>(dc, 4 * static_cast<std::size_t>(H));
        rowLo = DeviceBuffer<std::int32_t>(dc, H);
        colLo = DeviceBuffer<std::int32_t>(dc, W);
        colW = DeviceBuffer<float>(dc, 4 * static_cast<std::size_t>(W));
        std::vector<float> cw(4 * static_cast<std::size_t>(W));
        for (int x = 0; x < W; ++x) {
            cw[x] = static_cast<float>(sp.columns.wa[x]);
            cw[W + x] = static_cast<float>(sp.columns.wb[x]);
            cw[2 * W + x] = static_cast<float>(sp.columns.wa3[x]);
            cw[3 * W + x] = static_cast<float>(sp.columns.wb3[x]);
        }
        rowLo.upload(sp.rows.lo.data(), H);
        rowW.upload(sp.rows.wa.data(), H, 0);
        rowW.upload(sp.rows.wb.data(), H, H);
        rowW.upload(sp.rows.wa3.data(), H, 2 * static_cast<std::size_t>(H));
        rowW.upload(sp.rows.wb3.data(), H, 3 * static_cast<std::size_t>(H));
        colLo.upload(sp.columns.lo.data(), W);
        colW.upload(cw.data(), cw.size());
        dc.synchronize(); // cw is a local
    }
    static std::size_t bytes(int W, int H, int nx, int ny) {
        return 8 * sizeof(double) * static_cast<std::size_t>(nx + 1) * (ny + 1) +
               static_cast<std::size_t>(H) * (4 * sizeof(double) + 4) + static_cast<std::size_t>(W) * (4 + 16) +
               4096;
    }
    // The tables for image rows [y0, ...).
    SplineDev dev(int H, int W, int y0) const {
        SplineDev sd{};
        for (int map = 0; map < 2; ++map)
            for (int k = 0; k < 4; ++k)
                sd.g[map][k] = grid.get() + (map * 4 + k) * g;
        sd.rowLo = rowLo.get() + y0;
        sd.colLo = colLo.get();
        for (int k = 0; k < 4; ++k) {
            sd.rowW[k] = rowW.get() + k * static_cast<std::size_t>(H) + y0;
            sd.colW[k] = colW.get() + k * static_cast<std::size_t>(W);
        }
        return sd;
    }
};

void launchInterpolate(DeviceContext& dc, const SplineDev& sd, int W, int rows, int nx, float* level, float* rms) {
    const int threads = dc.blockSize() > 0 ? std::min(dc.blockSize(), 1024) : 256;
    const int blocks = std::min(rows, 1 << 20);
    const std::size_t shmem = sizeof(float) * 4 * (nx + 1);
    if (shmem > 48 * 1024)
        GPUPHOT_CUDA_CHECK(cudaFuncSetAttribute(interpolateKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(shmem)));
    interpolateKernel<<<blocks, threads, shmem, dc.stream()>>>(sd, W, rows, nx, level, rms);
    checkLaunch("the spline interpolation");
}

// Mesh statistics of a band of whole mesh rows: px/mk/src address the band's first image row, rows its
// height; out gets the band's nx * (mesh rows) entries.
void launchMeshStats(DeviceContext& dc, const float* px, const std::uint8_t* mk, const std::int32_t* src, int W,
                     int rows, int bw, int bh, int nx, double minGood, MeshOut* out) {
    const int nMesh = nx * ((rows - 1) / bh + 1);
    // Whole warps (the histogram's block-wide scans and sums shuffle across full warps).
    const int threads = dc.blockSize() > 0 ? std::clamp((dc.blockSize() + 31) / 32 * 32, 32, 1024) : 128;
    const std::size_t shmem = static_cast<std::size_t>(bh) * (2 * sizeof(double) + sizeof(long long)) +
                              sizeof(int) * (kMaxLevels + 2);
    if (shmem > 48 * 1024)
        GPUPHOT_CUDA_CHECK(cudaFuncSetAttribute(meshStatsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(shmem)));
    meshStatsKernel<<<nMesh, threads, shmem, dc.stream()>>>(px, mk, src, W, rows, bw, bh, nx, minGood, out);
    checkLaunch("the mesh statistics");
}

struct Setup {
    const ImageView& image;
    const MaskView& mask;
    const BackgroundParams& params;
    const ImageViewT<std::int32_t>* sourceMask;
    int W, H, bw, bh, nx, ny;
    bool deviceMaps = false; // !params.fullMaps: interpolate the maps on the device and keep them there
};

// The full-resolution maps of res's mesh grid interpolated on the device and stored in the context
// under the grid's signature (no download).
std::pair<const float*, const float*> interpolateAndStore(DeviceContext& dc, const BackgroundResult& res) {
    const int W = res.width, H = res.height, nx = res.meshLevel.width(), ny = res.meshLevel.height();
    const std::size_t npix = static_cast<std::size_t>(W) * H;
    std::vector<std::uint8_t> sig = backgroundSignature(res);
    dc.dropBackground();
    const BackgroundSpline sp = makeBackgroundSpline(res);
    DeviceBuffer<float> dLevel, dRms;
    {
        const SplineTables t(dc, sp, W, H, nx, ny);
        dLevel = DeviceBuffer<float>(dc, npix);
        dRms = DeviceBuffer<float>(dc, npix);
        launchInterpolate(dc, t.dev(H, W, 0), W, H, nx, dLevel.get(), dRms.get());
    }
    dc.storeBackground(sig, std::move(dLevel), std::move(dRms));
    return dc.findBackground(sig);
}

// Bad meshes, median filter, global values: core's host code, shared with the CPU stage.
void finishGrid(const Setup& s, const std::vector<MeshOut>& meshes, BackgroundResult& res, int threads) {
    std::vector<detail::MeshStat> grid(meshes.size());
    for (std::size_t i = 0; i < meshes.size(); ++i)
        grid[i] = {meshes[i].level, meshes[i].rms, meshes[i].bad != 0};
    detail::finishMeshGrid(grid, s.nx, s.ny, s.params, res, threads);
}

BackgroundResult emptyResult(const Setup& s) {
    BackgroundResult res;
    res.width = s.W;
    res.height = s.H;
    res.meshWidth = s.bw;
    res.meshHeight = s.bh;
    res.sextractorSpline = s.params.sextractorSpline;
    return res;
}

// Whole plan: the frame from the device cache, full-resolution maps kept on the device for detection.
BackgroundResult runWhole(DeviceContext& dc, const Setup& s, RunContext& ctx) {
    const std::size_t npix = static_cast<std::size_t>(s.W) * s.H;
    BackgroundResult res = emptyResult(s);
    const DeviceContext::DeviceFrame f = dc.frame(s.image, s.mask);
    const int nMesh = s.nx * s.ny;
    std::vector<MeshOut> meshes(nMesh);
    {
        DeviceBuffer<std::int32_t> dSource;
        if (s.sourceMask) {
            dSource = DeviceBuffer<std::int32_t>(dc, npix);
            uploadRows(dc, dSource.get(), *s.sourceMask, 0, s.H);
        }
        DeviceBuffer<MeshOut> dMesh(dc, nMesh);
        launchMeshStats(dc, f.pixels, f.mask, dSource.get(), s.W, s.H, s.bw, s.bh, s.nx, s.params.minGoodFraction,
                        dMesh.get());
        dMesh.download(meshes.data(), nMesh);
        dc.synchronize();
    }
    ctx.report("background", 0.45);
    ctx.checkCancelled();
    finishGrid(s, meshes, res, ctx.threadCount());
    ctx.report("background", 0.5);
    if (!s.params.fullMaps) {
        // Lean result: the maps stay on the device for detection and apertures (device_maps.hpp); the
        // host stages use the result's sampler. Without room for them they are made later, or in strips.
        if (s.deviceMaps) {
            try {
                interpolateAndStore(dc, res);
            } catch (const DeviceOutOfMemory&) {
                dc.drain();
                dc.dropBackground();
            }
        }
        ctx.report("background", 1.0);
        return res;
    }

    const BackgroundSpline sp = makeBackgroundSpline(res);
    DeviceBuffer<float> dLevel, dRms;
    {
        const SplineTables t(dc, sp, s.W, s.H, s.nx, s.ny);
        dLevel = DeviceBuffer<float>(dc, npix);
        dRms = DeviceBuffer<float>(dc, npix);
        launchInterpolate(dc, t.dev(s.H, s.W, 0), s.W, s.H, s.nx, dLevel.get(), dRms.get());
        res.level = Image<float>(s.W, s.H, Image<float>::NoInit{});
        res.rms = Image<float>(s.W, s.H, Image<float>::NoInit{});
        dc.downloadStaged(res.level.data(), dLevel.get(), npix * sizeof(float));
        dc.downloadStaged(res.rms.data(), dRms.get(), npix * sizeof(float));
    }
    dc.storeBackground(res.level, res.rms, std::move(dLevel), std::move(dRms));
    ctx.report("background", 1.0);
    return res;
}

// Strips plan: bands of whole mesh rows uploaded from the host, then the maps interpolated in row strips
// and downloaded (no device cache). shrink divides the strip heights (a retry after a failure). Returns
// the number of strips (the larger of the band and interpolation counts).
BackgroundResult runStrips(DeviceContext& dc, const Setup& s, RunContext& ctx, int shrink, int& strips) {
    dc.dropFrame();
    dc.dropBackground();
    const std::size_t margin = std::size_t(64) << 10; // CUB-free stage: launch scratch only
    BackgroundResult res = emptyResult(s);
    const int nMesh = s.nx * s.ny;
    std::vector<MeshOut> meshes(nMesh);
    const std::size_t perMeshRow = static_cast<std::size_t>(s.bh) * s.W *
                                   (sizeof(float) + (s.mask.empty() ? 0 : 1) + (s.sourceMask ? 4 : 0));
    const int meshRows =
        stripRowsFor(dc.available(), perMeshRow, margin + sizeof(MeshOut) * s.nx * s.ny, s.ny) / shrink;
    if (meshRows < 1)
        throw DeviceOutOfMemory("background: one band of mesh rows needs " + bytesText(perMeshRow + margin));
    const int bands = (s.ny + meshRows - 1) / meshRows;
    {
        const std::size_t bandPix = static_cast<std::size_t>(meshRows) * s.bh * s.W;
        DeviceBuffer<float> px(dc, bandPix);
        DeviceBuffer<std::uint8_t> mk;
        if (!s.mask.empty()) mk = DeviceBuffer<std::uint8_t>(dc, bandPix);
        DeviceBuffer<std::int32_t> src;
        if (s.sourceMask) src = DeviceBuffer<std::int32_t>(dc, bandPix);
        DeviceBuffer<MeshOut> dMesh(dc, nMesh);
        for (int b = 0; b < bands; ++b) {
            const int y0 = b * meshRows * s.bh, y1 = std::min(s.H, (b + 1) * meshRows * s.bh);
            uploadRows(dc, px.get(), s.image, y0, y1);
            if (!s.mask.empty()) uploadRows(dc, mk.get(), s.mask, y0, y1);
            if (s.sourceMask) uploadRows(dc, src.get(), *s.sourceMask, y0, y1);
            launchMeshStats(dc, px.get(), mk.get(), src.get(), s.W, y1 - y0, s.bw, s.bh, s.nx,
                            s.params.minGoodFraction, dMesh.get() + static_cast<std::size_t>(b) * meshRows * s.nx);
            ctx.checkCancelled();
        }
        dMesh.download(meshes.data(), nMesh);
        dc.synchronize();
    }
    ctx.report("background", 0.45);
    finishGrid(s, meshes, res, ctx.threadCount());
    ctx.report("background", 0.5);
    strips = bands;
    if (!s.params.fullMaps) return res;

    const BackgroundSpline sp = makeBackgroundSpline(res);
    const SplineTables t(dc, sp, s.W, s.H, s.nx, s.ny);
    const int rows = stripRowsFor(dc.available(), 2 * sizeof(float) * s.W, margin, s.H) / shrink;
    if (rows < 1) throw DeviceOutOfMemory("background: one row of the maps needs " + bytesText(8 * s.W + margin));
    const int n = (s.H + rows - 1) / rows;
    res.level = Image<float>(s.W, s.H, Image<float>::NoInit{});
    res.rms = Image<float>(s.W, s.H, Image<float>::NoInit{});
    DeviceBuffer<float> dLevel(dc, static_cast<std::size_t>(rows) * s.W), dRms(dc, static_cast<std::size_t>(rows) * s.W);
    for (int k = 0; k < n; ++k) {
        const int y0 = k * rows, y1 = std::min(s.H, y0 + rows);
        const std::size_t cnt = static_cast<std::size_t>(y1 - y0) * s.W;
        launchInterpolate(dc, t.dev(s.H, s.W, y0), s.W, y1 - y0, s.nx, dLevel.get(), dRms.get());
        const std::size_t at = static_cast<std::size_t>(y0) * s.W;
        dc.downloadStaged(res.level.data() + at, dLevel.get(), cnt * sizeof(float));
        dc.downloadStaged(res.rms.data() + at, dRms.get(), cnt * sizeof(float));
        dc.synchronize(); // the strip buffers are reused
        ctx.checkCancelled();
    }
    strips = std::max(strips, n);
    ctx.report("background", 1.0);
    return res;
}

} // namespace

std::vector<std::uint8_t> backgroundSignature(const BackgroundResult& bkg) {
    if (bkg.meshLevel.empty() || bkg.meshRms.empty()) return {};
    const int head[] = {bkg.width,
                        bkg.height,
                        bkg.meshWidth,
                        bkg.meshHeight,
                        bkg.sextractorSpline ? 1 : 0,
                        bkg.meshLevel.width(),
                        bkg.meshLevel.height(),
                        bkg.meshRms.width(),
                        bkg.meshRms.height()};
    const std::size_t rowL = sizeof(float) * bkg.meshLevel.width();
    const std::size_t rowR = sizeof(float) * bkg.meshRms.width();
    std::vector<std::uint8_t> sig(sizeof head + rowL * bkg.meshLevel.height() + rowR * bkg.meshRms.height());
    std::memcpy(sig.data(), head, sizeof head);
    std::size_t o = sizeof head;
    for (int y = 0; y < bkg.meshLevel.height(); ++y, o += rowL)
        std::memcpy(sig.data() + o, bkg.meshLevel.view().row(y), rowL);
    for (int y = 0; y < bkg.meshRms.height(); ++y, o += rowR)
        std::memcpy(sig.data() + o, bkg.meshRms.view().row(y), rowR);
    return sig;
}

bool hasBackgroundGrid(const BackgroundResult& bkg, int width, int height) {
    return !bkg.meshLevel.empty() && !bkg.meshRms.empty() && bkg.width == width && bkg.height == height &&
           bkg.meshWidth > 0 && bkg.meshHeight > 0;
}

std::pair<const float*, const float*> deviceBackgroundMaps(DeviceContext& dc, const BackgroundResult& bkg) {
    if (bkg.hasFullMaps()) return dc.background(bkg.level, bkg.rms);
    const auto stored = dc.findBackground(backgroundSignature(bkg));
    if (stored.first) return stored;
    return interpolateAndStore(dc, bkg);
}

struct DeviceBackgroundRows::Impl {
    SplineTables tables;
    int width, height, nx;
    Impl(DeviceContext& dc, const BackgroundSpline& sp, const BackgroundResult& b)
        : tables(dc, sp, b.width, b.height, b.meshLevel.width(), b.meshLevel.height()), width(b.width),
          height(b.height), nx(b.meshLevel.width()) {}
    DeviceContext* dc = nullptr;
};

DeviceBackgroundRows::DeviceBackgroundRows(DeviceContext& dc, const BackgroundResult& bkg)
    : m_impl(std::make_unique<Impl>(dc, makeBackgroundSpline(bkg), bkg)) {
    m_impl->dc = &dc;
}

DeviceBackgroundRows::~DeviceBackgroundRows() = default;

void DeviceBackgroundRows::rows(int y0, int rows, float* level, float* rms) {
    Impl& m = *m_impl;
    if (rows <= 0) return;
    launchInterpolate(*m.dc, m.tables.dev(m.height, m.width, y0), m.width, rows, m.nx, level, rms);
}

std::size_t DeviceBackgroundRows::tableBytes(const BackgroundResult& bkg) {
    return SplineTables::bytes(bkg.width, bkg.height, bkg.meshLevel.width(), bkg.meshLevel.height());
}

BackgroundResult estimateBackground(const ImageView& image, const MaskView& mask, const BackgroundParams& params,
                                    RunContext& ctx, const ImageViewT<std::int32_t>* sourceMask) {
    sourceMask = detail::validateBackgroundInputs(image, mask, params, sourceMask);
    DeviceContext& dc = DeviceContext::of(ctx);
    const Setup s{image, mask, params, sourceMask, image.width, image.height, params.meshW(), params.meshH(),
                  (image.width - 1) / params.meshW() + 1, (image.height - 1) / params.meshH() + 1};
    const std::size_t npix = static_cast<std::size_t>(s.W) * s.H;
    // The maps of an earlier run are stale: their memory goes to this one.
    dc.dropBackground();

    // Plan: peak of the whole-frame plan = frame + mask (cached) + max(source mask, the two maps) + tables.
    const std::size_t frameBytes = npix * (sizeof(float) + (mask.empty() ? 0 : 1));
    const std::size_t work = std::max(sourceMask ? npix * 4 : 0, params.fullMaps ? npix * 8 : 0) +
                             SplineTables::bytes(s.W, s.H, s.nx, s.ny) + sizeof(MeshOut) * s.nx * s.ny +
                             (std::size_t(1) << 20);
    const std::size_t others = dc.inUse() - std::min(dc.inUse(), dc.cachedFrameBytes());
    std::string why = "whole frame needs " + bytesText(frameBytes + work);
    if (others + frameBytes + work <= dc.budget()) {
        try {
            Setup whole = s;
            whole.deviceMaps = !params.fullMaps && others + frameBytes + work + npix * 8 <= dc.budget();
            BackgroundResult r = runWhole(dc, whole, ctx);
            dc.notePlan("whole", 1);
            return r;
        } catch (const DeviceOutOfMemory& e) {
            why = e.what();
            dc.drain();
        }
    }
    for (const int shrink : {1, 4}) {
        try {
            int strips = 0;
            BackgroundResult r = runStrips(dc, s, ctx, shrink, strips);
            dc.notePlan("strips", strips);
            return r;
        } catch (const DeviceOutOfMemory& e) {
            why = e.what();
            dc.drain();
        }
    }
    dc.dropFrame();
    dc.dropBackground();
    dc.notePlan("cpu", 0, cpuFallbackNote("background", dc.budget(), why));
    return cpu::estimateBackground(image, mask, params, ctx, sourceMask);
}

} // namespace gpuphot::cuda
