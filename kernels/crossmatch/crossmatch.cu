// GPU crossmatch: the candidate search of cpu::crossmatch (core/stages/crossmatch/crossmatch.cpp) on the
// device through a uniform grid hash, giving the same refIndex and separations bit for bit.
//
//  1-2. Cone preselection, WCS projection of the reference stars and the sources' world positions stay on
//       the host: detail::prepareCrossmatch (core/stages/crossmatch/crossmatch.cpp), the very function the CPU stage
//       calls, so the stars kept at the frame + margin edge and every unit vector are the CPU's.
//  3.   Device: the projected stars are binned into square cells of side >= radiusPx, sorted by cell with
//       CUB's (stable) radix sort, each cell's [begin, end) found in the sorted order; one thread per
//       source visits the cells its radius touches, keeps the stars with the k-d tree's pixel test
//       (dx*dx + dy*dy < radiusPx^2, the same doubles) and the great-circle separation
//       atan2(|a x b|, a.b) in double, with the same formula as the CPU, within radiusArcsec (plus 1e-9
//       relative: CUDA's atan2 is not correctly rounded, up to 2 ulp). Count pass, CUB exclusive scan,
//       fill pass.
//  4.   Host: the candidates' separations are re-evaluated with the CPU's function (a few per source) so
//       that the values and the <= radiusArcsec cut are bitwise the CPU's, then the CPU's assignment
//       (detail::sortCandidates, detail::assignMatches).
// cuda::crossmatch chooses between this and cpu::crossmatch by problem size (the crossover of
// docs/BENCHMARKS.md "GPU crossmatch crossover").
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

namespace {

constexpr double kDeg = 3.14159265358979323846 / 180.0;

// Device: the same formula (unit vectors from the host).
__device__ double deviceSeparationArcsec(const double* a, const double* b) {
    const double cx = a[1] * b[2] - a[2] * b[1];
    const double cy = a[2] * b[0] - a[0] * b[2];
    const double cz = a[0] * b[1] - a[1] * b[0];
    const double dot = a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    return atan2(sqrt(cx * cx + cy * cy + cz * cz), dot) / kDeg * 3600.0;
}

// fn(begin, end) over [0, n) in fixed chunks on up to `threads` threads.
template <class Fn> void parallelChunks(std::size_t n, int threads, std::size_t chunk, Fn&& fn) {
    const std::size_t chunks = (n + chunk - 1) / chunk;
    if (chunks <= 1 || threads <= 1) {
        if (n > 0) fn(std::size_t{0}, n, 0);
        return;
    }
    const int t = static_cast<int>(std::min<std::size_t>(chunks, static_cast<std::size_t>(threads)));
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> pool;
    auto work = [&](int id) {
        for (std::size_t c; (c = next.fetch_add(1)) < chunks;) {
            const std::size_t b = c * chunk;
            fn(b, std::min(n, b + chunk), id);
        }
    };
    for (int i = 1; i < t; ++i) pool.emplace_back(work, i);
    work(0);
    for (auto& th : pool) th.join();
}

struct Grid {
    double x0 = 0.0, y0 = 0.0, cell = 1.0;
    long long nx = 1, ny = 1;
};

__global__ void cellOfRefs(const double* rx, const double* ry, std::size_t n, Grid g, std::uint32_t* cell,
                           std::uint32_t* index) {
    const std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (k >= n) return;
    long long cx = static_cast<long long>(floor((rx[k] - g.x0) / g.cell));
    long long cy = static_cast<long long>(floor((ry[k] - g.y0) / g.cell));
    cx = cx < 0 ? 0 : (cx >= g.nx ? g.nx - 1 : cx);
    cy = cy < 0 ? 0 : (cy >= g.ny ? g.ny - 1 : cy);
    cell[k] = static_cast<std::uint32_t>(cy * g.nx + cx);
    index[k] = static_cast<std::uint32_t>(k);
}

__global__ void cellRanges(const std::uint32_t* key, std::size_t n, std::uint32_t* begin, std::uint32_t* end) {
    const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (i >= n) return;
    const std::uint32_t c = key[i];
    if (i == 0 || key[i - 1] != c) begin[c] = static_cast<std::uint32_t>(i);
    if (i + 1 == n || key[i + 1] != c) end[c] = static_cast<std::uint32_t>(i + 1);
}

struct SearchArgs {
    const double *sx, *sy, *su; // sources: pixels, unit vectors (3 per source)
    const std::uint8_t* valid;
    std::size_t nSrc;
    const double *rx, *ry, *ru; // selected stars
    const std::uint32_t* sorted; // star index by cell
    const std::uint32_t *cellBegin, *cellEnd;
    Grid g;
    double r2, reach, sepLimit;
    std::uint32_t* count;         // count pass
    const std::uint32_t* offset;  // fill pass
    std::uint32_t* outRef;
    double* outSep;
};

template <bool Fill> __global__ void searchKernel(SearchArgs a) {
    const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (i >= a.nSrc) return;
    std::uint32_t n = 0;
    if (a.valid[i]) {
        const double xs = a.sx[i], ys = a.sy[i];
        // cell ranges clamped in double first (a source far outside the grid visits no cell)
        auto cellIndex = [](double v, long long n) {
            const double f = floor(v);
            return static_cast<long long>(f < -1.0 ? -1.0 : (f > double(n) ? double(n) : f));
        };
        long long cx0 = cellIndex((xs - a.reach - a.g.x0) / a.g.cell, a.g.nx);
        long long cx1 = cellIndex((xs + a.reach - a.g.x0) / a.g.cell, a.g.nx);
        long long cy0 = cellIndex((ys - a.reach - a.g.y0) / a.g.cell, a.g.ny);
        long long cy1 = cellIndex((ys + a.reach - a.g.y0) / a.g.cell, a.g.ny);
        cx0 = cx0 < 0 ? 0 : cx0;
        cy0 = cy0 < 0 ? 0 : cy0;
        cx1 = cx1 >= a.g.nx ? a.g.nx - 1 : cx1;
        cy1 = cy1 >= a.g.ny ? a.g.ny - 1 : cy1;
        const double* su = a.su + 3 * i;
        std::uint32_t o = Fill ? a.offset[i] : 0;
        for (long long cy = cy0; cy <= cy1; ++cy)
            for (long long cx = cx0; cx <= cx1; ++cx) {
                const std::size_t c = static_cast<std::size_t>(cy * a.g.nx + cx);
                const std::uint32_t e = a.cellEnd[c];
                for (std::uint32_t j = a.cellBegin[c]; j < e; ++j) {
                    const std::uint32_t k = a.sorted[j];
                    // nanoflann's L2_Simple: (q - p)^2 summed from 0, compared with < radius^2
                    const double dx = xs - a.rx[k], dy = ys - a.ry[k];
                    double d2 = 0.0;
                    d2 += dx * dx;
                    d2 += dy * dy;
                    if (!(d2 < a.r2)) continue;
                    const double sep = deviceSeparationArcsec(su, a.ru + 3 * std::size_t(k));
                    if (!(sep <= a.sepLimit)) continue;
                    if (Fill) {
                        a.outRef[o] = k;
                        a.outSep[o] = sep;
                        ++o;
                    }
                    ++n;
                }
            }
    }
    if (!Fill) a.count[i] = n;
}

int blocksFor(std::size_t n, int block) { return static_cast<int>((n + block - 1) / block); }

CrossmatchCrossover g_crossover;
// Diagnostics of the calling thread's last crossmatchGpu call (RunContexts run on their own threads under
// --concurrent).
thread_local std::size_t g_lastSepMismatch = 0;
thread_local std::size_t g_lastCandidates = 0;

constexpr int kBlock = 256;

// The uniform grid hash of the projected stars: square cells of side >= radiusPx from (lo, lo) to (hiX, hiY),
// at most ~16M cells (and several stars per cell on average when there are fewer stars).
Grid hashGrid(double radiusPx, double lo, double hiX, double hiY, std::size_t nSel) {
    Grid g;
    g.x0 = lo;
    g.y0 = lo;
    g.cell = radiusPx * (1.0 + 1e-9);
    auto cellsOf = [&](double cell, long long& nx, long long& ny) {
        nx = static_cast<long long>((hiX - lo) / cell) + 1;
        ny = static_cast<long long>((hiY - lo) / cell) + 1;
    };
    cellsOf(g.cell, g.nx, g.ny);
    const double maxCells = std::min(16.0e6, std::max(1024.0, 0.5 * static_cast<double>(nSel)));
    while (static_cast<double>(g.nx) * static_cast<double>(g.ny) > maxCells) {
        g.cell *= 2.0;
        cellsOf(g.cell, g.nx, g.ny);
    }
    return g;
}

// The stars on the device (positions, unit vectors), their indices sorted by cell and each cell's
// [begin, end) in that order.
struct StarCells {
    DeviceBuffer<double> rx, ry, ru;
    DeviceBuffer<std::uint32_t> sorted, cellBegin, cellEnd;
};

// Bins the selected stars into g's cells: uploaded, sorted by cell with CUB's (stable) radix sort of endBit
// bits, then the cells' ranges.
void binStars(DeviceContext& dc, const CrossmatchResult& res, const double* refUnit, const Grid& g,
              std::size_t nCells, int endBit, StarCells& c) {
    const std::size_t nSel = res.refSelected.size();
    const cudaStream_t s = dc.stream();
    c.rx = DeviceBuffer<double>(dc, nSel);
    c.ry = DeviceBuffer<double>(dc, nSel);
    c.ru = DeviceBuffer<double>(dc, 3 * nSel);
    c.rx.upload(res.refX.data(), nSel);
    c.ry.upload(res.refY.data(), nSel);
    c.ru.upload(refUnit, 3 * nSel);
    DeviceBuffer<std::uint32_t> keyIn(dc, nSel), keyOut(dc, nSel), idxIn(dc, nSel);
    c.sorted = DeviceBuffer<std::uint32_t>(dc, nSel);
    cellOfRefs<<<blocksFor(nSel, kBlock), kBlock, 0, s>>>(c.rx.get(), c.ry.get(), nSel, g, keyIn.get(),
                                                          idxIn.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    std::size_t sortBytes = 0;
    GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sortBytes, keyIn.get(), keyOut.get(),
                                                       idxIn.get(), c.sorted.get(), nSel, 0, endBit, s));
    DeviceBuffer<unsigned char> sortTemp(dc, std::max<std::size_t>(sortBytes, 1));
    GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sortTemp.get(), sortBytes, keyIn.get(), keyOut.get(),
                                                       idxIn.get(), c.sorted.get(), nSel, 0, endBit, s));
    sortTemp.reset();
    keyIn.reset();
    idxIn.reset();
    c.cellBegin = DeviceBuffer<std::uint32_t>(dc, nCells);
    c.cellEnd = DeviceBuffer<std::uint32_t>(dc, nCells);
    c.cellBegin.zero();
    c.cellEnd.zero();
    cellRanges<<<blocksFor(nSel, kBlock), kBlock, 0, s>>>(keyOut.get(), nSel, c.cellBegin.get(),
                                                          c.cellEnd.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    keyOut.reset();
}

// One thread per source over the cells its radius touches: a count pass, the offsets (CSR over the sources,
// a CUB exclusive scan, downloaded), a fill pass of the candidates' stars and device separations.
void searchCandidates(DeviceContext& dc, const StarCells& c, const Grid& g, const std::vector<double>& x,
                      const std::vector<double>& y, const double* srcUnit,
                      const std::vector<std::uint8_t>& valid, double radiusPx, double radiusArcsec,
                      std::vector<std::uint32_t>& offsets, std::vector<std::uint32_t>& candRef,
                      std::vector<double>& candSep) {
    const std::size_t nSrc = x.size();
    const cudaStream_t s = dc.stream();
    DeviceBuffer<double> dSx(dc, nSrc), dSy(dc, nSrc), dSu(dc, 3 * nSrc);
    DeviceBuffer<std::uint8_t> dValid(dc, nSrc);
    dSx.upload(x.data(), nSrc);
    dSy.upload(y.data(), nSrc);
    dSu.upload(srcUnit, 3 * nSrc);
    dValid.upload(valid.data(), nSrc);
    DeviceBuffer<std::uint32_t> dCount(dc, nSrc + 1), dOffset(dc, nSrc + 1);
    dCount.zero();
    SearchArgs a{};
    a.sx = dSx.get();
    a.sy = dSy.get();
    a.su = dSu.get();
    a.valid = dValid.get();
    a.nSrc = nSrc;
    a.rx = c.rx.get();
    a.ry = c.ry.get();
    a.ru = c.ru.get();
    a.sorted = c.sorted.get();
    a.cellBegin = c.cellBegin.get();
    a.cellEnd = c.cellEnd.get();
    a.g = g;
    a.r2 = radiusPx * radiusPx;
    a.reach = radiusPx * (1.0 + 1e-6) + 1e-6;
    a.sepLimit = radiusArcsec * (1.0 + 1e-9);
    a.count = dCount.get();
    searchKernel<false><<<blocksFor(nSrc, kBlock), kBlock, 0, s>>>(a);
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    std::size_t scanBytes = 0;
    GPUPHOT_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(nullptr, scanBytes, dCount.get(), dOffset.get(), nSrc + 1, s));
    DeviceBuffer<unsigned char> scanTemp(dc, std::max<std::size_t>(scanBytes, 1));
    GPUPHOT_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(scanTemp.get(), scanBytes, dCount.get(), dOffset.get(), nSrc + 1, s));
    dOffset.download(offsets.data(), nSrc + 1);
    dc.synchronize();
    const std::size_t total = offsets[nSrc];
    candRef.resize(total);
    candSep.resize(total);
    if (total > 0) {
        DeviceBuffer<std::uint32_t> dRef(dc, total);
        DeviceBuffer<double> dSep(dc, total);
        a.offset = dOffset.get();
        a.outRef = dRef.get();
        a.outSep = dSep.get();
        searchKernel<true><<<blocksFor(nSrc, kBlock), kBlock, 0, s>>>(a);
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        dRef.download(candRef.data(), total);
        dSep.download(candSep.data(), total);
        dc.synchronize();
    }
}

// 3. The candidates per source on the device: offsets (CSR, nSrc + 1 entries, zeros on entry), the
// candidates' stars (indices into res's selection) and their device separations.
void deviceCandidates(DeviceContext& dc, const std::vector<double>& x, const std::vector<double>& y,
                      const CrossmatchParams& params, const detail::CrossmatchSetup& setup,
                      const CrossmatchResult& res, std::vector<std::uint32_t>& offsets,
                      std::vector<std::uint32_t>& candRef, std::vector<double>& candSep) {
    static_assert(sizeof(detail::UnitVector) == 3 * sizeof(double), "unit vectors must be packed doubles");
    const double* refUnit = setup.refUnit.empty() ? nullptr : setup.refUnit.data()->data();
    const double* srcUnit = setup.srcUnit.empty() ? nullptr : setup.srcUnit.data()->data();
    const Grid g = hashGrid(res.radiusPx, setup.lo, setup.hiX, setup.hiY, res.refSelected.size());
    const std::size_t nCells = static_cast<std::size_t>(g.nx * g.ny);
    int endBit = 1;
    while (endBit < 32 && (std::size_t(1) << endBit) < nCells)
        ++endBit;
    try {
        StarCells c;
        binStars(dc, res, refUnit, g, nCells, endBit, c);
        searchCandidates(dc, c, g, x, y, srcUnit, setup.srcValid, res.radiusPx, params.radiusArcsec, offsets,
                         candRef, candSep);
    } catch (...) {
        dc.drain();
        throw;
    }
    dc.notePlan("whole", 1);
}

// The candidates' separations again with the CPU's function and its <= radiusArcsec cut (the device's
// atan2 is not correctly rounded), each source's candidates sorted (detail::sortCandidates) and the
// groups compacted; groups: their offsets (CSR over the sources). Records the thread's diagnostics.
std::vector<detail::MatchCandidate>
exactCandidates(const detail::CrossmatchSetup& setup, const CrossmatchResult& res,
                const CrossmatchParams& params, std::size_t nSrc, const std::vector<std::uint32_t>& offsets,
                const std::vector<std::uint32_t>& candRef, const std::vector<double>& candSep, int threads,
                std::vector<std::uint32_t>& groups) {
    std::vector<std::uint32_t> count(nSrc, 0);
    std::vector<detail::MatchCandidate> cands(offsets[nSrc]);
    std::vector<std::size_t> mismatchPerThread(threads + 1, 0);
    parallelChunks(nSrc, threads, 4096, [&](std::size_t b, std::size_t e, int id) {
        std::size_t mism = 0;
        for (std::size_t i = b; i < e; ++i) {
            const std::uint32_t o0 = offsets[i], o1 = offsets[i + 1];
            std::uint32_t n = o0;
            for (std::uint32_t o = o0; o < o1; ++o) {
                const std::uint32_t k = candRef[o];
                const double sep = detail::separationArcsec(setup.srcUnit[i], setup.refUnit[k]);
                if (std::memcmp(&sep, &candSep[o], sizeof sep) != 0) ++mism;
                if (sep <= params.radiusArcsec)
                    cands[n++] = {sep, static_cast<std::int32_t>(i), res.refSelected[k]};
            }
            detail::sortCandidates(cands.data() + o0, cands.data() + n);
            count[i] = n - o0;
        }
        mismatchPerThread[id] += mism;
    });
    g_lastSepMismatch = 0;
    for (auto m : mismatchPerThread) g_lastSepMismatch += m;
    g_lastCandidates = offsets[nSrc];
    // Compact the groups (a few device candidates may fail the exact cut).
    groups.assign(nSrc + 1, 0);
    for (std::size_t i = 0; i < nSrc; ++i) {
        groups[i + 1] = groups[i] + count[i];
        if (groups[i] != offsets[i])
            std::copy(cands.begin() + offsets[i], cands.begin() + offsets[i] + count[i],
                      cands.begin() + groups[i]);
    }
    cands.resize(groups[nSrc]);
    return cands;
}

} // namespace

CrossmatchCrossover crossmatchCrossover() {
    return g_crossover;
}
void setCrossmatchCrossover(const CrossmatchCrossover& c) {
    g_crossover = c;
}
bool crossmatchUsesDevice(std::size_t nSources, std::size_t nRefs) {
    const CrossmatchCrossover& c = g_crossover;
    return nRefs >= c.minRefsAlone || (nRefs >= c.minRefs && nSources >= c.minSources);
}
std::size_t crossmatchLastSeparationMismatches() {
    return g_lastSepMismatch;
}
std::size_t crossmatchLastCandidates() {
    return g_lastCandidates;
}

CrossmatchResult crossmatchGpu(const std::vector<double>& x, const std::vector<double>& y, int width,
                               int height, const ReferenceCatalog& ref, const Wcs& wcs,
                               const CrossmatchParams& params, RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    const int threads = std::max(1, ctx.threadCount());
    CrossmatchResult res;
    // --- 1-2. cone, projection, the sources' unit vectors (host, the CPU stage's own code) --------------
    const detail::CrossmatchSetup setup =
        detail::prepareCrossmatch(x, y, width, height, ref, wcs, params, threads, res);
    const std::size_t nSrc = x.size();
    const std::size_t nSel = res.refSelected.size();
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.5);

    // --- 3. candidates per source (device) ---------------------------------------------------------------
    std::vector<std::uint32_t> offsets(nSrc + 1, 0);
    std::vector<std::uint32_t> candRef;
    std::vector<double> candSep;
    if (nSel > 0 && nSrc > 0) deviceCandidates(dc, x, y, params, setup, res, offsets, candRef, candSep);
    ctx.checkCancelled();

    // --- exact separations (host, the CPU's function) ----------------------------------------------------
    std::vector<std::uint32_t> groups;
    std::vector<detail::MatchCandidate> cands =
        exactCandidates(setup, res, params, nSrc, offsets, candRef, candSep, threads, groups);
    ctx.report("crossmatch", 0.8);

    // --- 4. assignment (the CPU's) -----------------------------------------------------------------------
    detail::assignMatches(cands, groups, ref.size(), params.oneToOne, res);
    ctx.report("crossmatch", 1.0);
    return res;
}

CrossmatchResult crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                            const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                            RunContext& ctx) {
    if (!crossmatchUsesDevice(x.size(), ref.size()))
        return cpu::crossmatch(x, y, width, height, ref, wcs, params, ctx);
    try {
        return crossmatchGpu(x, y, width, height, ref, wcs, params, ctx);
    } catch (const DeviceOutOfMemory& e) {
        DeviceContext::of(ctx).notePlan("cpu", 0, std::string("gpu: stage crossmatch ran on the CPU: ") + e.what());
        return cpu::crossmatch(x, y, width, height, ref, wcs, params, ctx);
    }
}

} // namespace gpuphot::cuda
