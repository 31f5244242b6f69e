// GPU crossmatch (issue 5): the candidate search of cpu::crossmatch (core/stages/crossmatch.cpp) on the
// device through a uniform grid hash, giving the same refIndex and separations bit for bit.
//
//  1-2. Cone preselection, WCS projection of the reference stars (WCSLIB, TAN+SIP) and the sources' world
//       positions stay on the host, computed exactly as the CPU stage does (the same code, the same libm):
//       the projection decides which stars are kept at the frame + margin edge and WCSLIB's iterative SIP
//       inverse has no bitwise device twin. The host loops run on ctx.threadCount() std::threads.
//  3.   Device: the projected stars are binned into square cells of side >= radiusPx, sorted by cell with
//       CUB's (stable) radix sort, each cell's [begin, end) found in the sorted order; one thread per
//       source visits the cells its radius touches, keeps the stars with the k-d tree's pixel test
//       (dx*dx + dy*dy < radiusPx^2, the same doubles) and the great-circle separation
//       atan2(|a x b|, a.b) in double, with the same formula as the CPU, within radiusArcsec (plus 1e-9
//       relative: CUDA's atan2 is not correctly rounded, up to 2 ulp). Count pass, CUB exclusive scan,
//       fill pass.
//  4.   Host: the candidates' separations are re-evaluated with the CPU's function (a few per source) so
//       that the values and the <= radiusArcsec cut are bitwise the CPU's, then the CPU's assignment:
//       per-source order (separation, ref), and for one-to-one the global greedy over
//       (separation, source, ref).
// cuda::crossmatch chooses between this and cpu::crossmatch by problem size (crossover measured on an
// H200, docs/BENCHMARKS.md "GPU crossmatch crossover").
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
#include "core/stages/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

namespace {

constexpr double kDeg = 3.14159265358979323846 / 180.0;

using Vec3 = std::array<double, 3>;

// Host: the CPU stage's functions, verbatim.
Vec3 unitVector(double raDeg, double decDeg) {
    const double ra = raDeg * kDeg, dec = decDeg * kDeg;
    return {std::cos(dec) * std::cos(ra), std::cos(dec) * std::sin(ra), std::sin(dec)};
}

double separationArcsec(const Vec3& a, const Vec3& b) {
    const double cx = a[1] * b[2] - a[2] * b[1];
    const double cy = a[2] * b[0] - a[0] * b[2];
    const double cz = a[0] * b[1] - a[1] * b[0];
    const double dot = a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    return std::atan2(std::sqrt(cx * cx + cy * cy + cz * cz), dot) / kDeg * 3600.0;
}

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

// Batched Wcs transform in fixed chunks, one Wcs copy per thread (the Wcs serialises calls).
template <class Fn> void transformChunked(const Wcs& wcs, std::size_t n, int threads, Fn&& fn) {
    constexpr std::size_t kChunk = 16384;
    if (n <= kChunk || threads <= 1) {
        if (n > 0) fn(wcs, std::size_t{0}, n);
        return;
    }
    const int t = static_cast<int>(std::min<std::size_t>((n + kChunk - 1) / kChunk, std::size_t(threads)));
    std::vector<Wcs> copies;
    copies.reserve(t);
    for (int i = 0; i < t; ++i) copies.emplace_back(wcs);
    parallelChunks(n, t, kChunk, [&](std::size_t b, std::size_t e, int id) { fn(copies[id], b, e - b); });
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
std::size_t g_lastSepMismatch = 0;
std::size_t g_lastCandidates = 0;

} // namespace

CrossmatchCrossover crossmatchCrossover() { return g_crossover; }
void setCrossmatchCrossover(const CrossmatchCrossover& c) { g_crossover = c; }
bool crossmatchUsesDevice(std::size_t nSources, std::size_t nRefs) {
    const CrossmatchCrossover& c = g_crossover;
    return nRefs >= c.minRefsAlone || (nRefs >= c.minRefs && nSources >= c.minSources);
}
std::size_t crossmatchLastSeparationMismatches() { return g_lastSepMismatch; }
std::size_t crossmatchLastCandidates() { return g_lastCandidates; }

CrossmatchResult crossmatchGpu(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                               const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                               RunContext& ctx) {
    if (x.size() != y.size())
        throw InvalidInput("crossmatch: x has " + std::to_string(x.size()) + " entries, y " +
                           std::to_string(y.size()));
    if (width <= 0 || height <= 0)
        throw InvalidInput("crossmatch: frame size must be positive (got " + std::to_string(width) + "x" +
                           std::to_string(height) + ")");
    if (!(params.radiusArcsec > 0.0) || !std::isfinite(params.radiusArcsec))
        throw InvalidInput("crossmatch: radiusArcsec must be positive (got " +
                           std::to_string(params.radiusArcsec) + ")");
    if (!(params.marginPx >= 0.0) || !std::isfinite(params.marginPx))
        throw InvalidInput("crossmatch: marginPx must be >= 0 (got " + std::to_string(params.marginPx) + ")");
    if (ref.size() > static_cast<std::size_t>(INT32_MAX))
        throw InvalidInput("crossmatch: reference catalog " + ref.path + " has too many rows");
    if (ref.dec.size() != ref.size() || ref.mag.size() != ref.size())
        throw InvalidInput("crossmatch: reference catalog " + ref.path + " has columns of different lengths");
    if (x.size() > static_cast<std::size_t>(INT32_MAX))
        throw InvalidInput("crossmatch: too many sources");

    DeviceContext& dc = DeviceContext::of(ctx);
    const int threads = ctx.threadCount();
    const std::size_t nSrc = x.size();
    CrossmatchResult res;
    res.refIndex.assign(nSrc, -1);
    res.separationArcsec.assign(nSrc, std::numeric_limits<double>::quiet_NaN());

    // --- 1. cone around the frame centre (host, as the CPU) ----------------------------------------------
    const double cx = 0.5 * (width - 1), cy = 0.5 * (height - 1);
    const auto [ra0, dec0] = wcs.pixelToWorld(cx, cy);
    if (!std::isfinite(ra0) || !std::isfinite(dec0))
        throw InvalidInput("crossmatch: the frame centre does not transform with the WCS");
    const Vec3 centre = unitVector(ra0, dec0);
    const double lo = -0.5 - params.marginPx;
    const double hiX = width - 0.5 + params.marginPx, hiY = height - 0.5 + params.marginPx;
    double coneArcsec = 0.0;
    double minScale = std::numeric_limits<double>::infinity();
    for (int iy = 0; iy <= 4; ++iy)
        for (int ix = 0; ix <= 4; ++ix) {
            const double px = lo + (hiX - lo) * ix / 4.0, py = lo + (hiY - lo) * iy / 4.0;
            const auto [ra, dec] = wcs.pixelToWorld(px, py);
            if (std::isfinite(ra) && std::isfinite(dec))
                coneArcsec = std::max(coneArcsec, separationArcsec(centre, unitVector(ra, dec)));
            const double s =
                wcs.pixelScaleArcsec(std::clamp(px, 0.0, width - 1.0), std::clamp(py, 0.0, height - 1.0));
            if (std::isfinite(s) && s > 0.0) minScale = std::min(minScale, s);
        }
    if (!std::isfinite(minScale))
        throw InvalidInput("crossmatch: the WCS gives no finite pixel scale on the frame");
    coneArcsec = coneArcsec * 1.01 + 10.0 * minScale;
    const double cosCone = std::cos(std::min(coneArcsec / 3600.0, 180.0) * kDeg);

    const bool cutBright = std::isfinite(params.refMagBright), cutFaint = std::isfinite(params.refMagFaint);
    const std::size_t nRef = ref.size();
    std::vector<std::uint8_t> inCone(nRef, 0);
    parallelChunks(nRef, threads, 65536, [&](std::size_t b, std::size_t e, int) {
        for (std::size_t i = b; i < e; ++i) {
            const double m = ref.mag[i];
            if (cutBright && !(m >= params.refMagBright)) continue;
            if (cutFaint && !(m <= params.refMagFaint)) continue;
            const Vec3 u = unitVector(ref.ra[i], ref.dec[i]);
            inCone[i] = (u[0] * centre[0] + u[1] * centre[1] + u[2] * centre[2]) >= cosCone;
        }
    });
    std::vector<std::int32_t> coneRows;
    for (std::size_t i = 0; i < nRef; ++i)
        if (inCone[i]) coneRows.push_back(static_cast<std::int32_t>(i));
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.2);

    // --- 2. projection (host, WCSLIB) ------------------------------------------------------------------
    const std::size_t nCone = coneRows.size();
    std::vector<double> cRa(nCone), cDec(nCone), cX(nCone), cY(nCone);
    for (std::size_t k = 0; k < nCone; ++k) {
        cRa[k] = ref.ra[coneRows[k]];
        cDec[k] = ref.dec[coneRows[k]];
    }
    transformChunked(wcs, nCone, threads, [&](const Wcs& w, std::size_t b, std::size_t n) {
        w.worldToPixel(std::span<const double>(cRa).subspan(b, n), std::span<const double>(cDec).subspan(b, n),
                       std::span<double>(cX).subspan(b, n), std::span<double>(cY).subspan(b, n));
    });
    std::vector<std::size_t> selectedCone;
    for (std::size_t k = 0; k < nCone; ++k) {
        const double px = cX[k], py = cY[k];
        if (!(px >= lo && px <= hiX && py >= lo && py <= hiY)) continue;
        if (px >= -0.5 && px <= width - 0.5 && py >= -0.5 && py <= height - 0.5) ++res.nRefInFrame;
        res.refSelected.push_back(coneRows[k]);
        res.refX.push_back(px);
        res.refY.push_back(py);
        selectedCone.push_back(k);
    }
    const std::size_t nSel = selectedCone.size();
    std::vector<double> refUnit(3 * nSel);
    parallelChunks(nSel, threads, 16384, [&](std::size_t b, std::size_t e, int) {
        for (std::size_t k = b; k < e; ++k) {
            const Vec3 u = unitVector(cRa[selectedCone[k]], cDec[selectedCone[k]]);
            std::memcpy(&refUnit[3 * k], u.data(), sizeof u);
        }
    });
    ctx.checkCancelled();
    ctx.report("crossmatch", 0.5);

    // --- 3. candidates per source (device) ---------------------------------------------------------------
    res.radiusPx = params.radiusArcsec / minScale * 1.05 + 0.5;
    std::vector<double> srcRa(nSrc), srcDec(nSrc);
    transformChunked(wcs, nSrc, threads, [&](const Wcs& w, std::size_t b, std::size_t n) {
        w.pixelToWorld(std::span<const double>(x).subspan(b, n), std::span<const double>(y).subspan(b, n),
                       std::span<double>(srcRa).subspan(b, n), std::span<double>(srcDec).subspan(b, n));
    });
    std::vector<double> srcUnit(3 * nSrc, 0.0);
    std::vector<std::uint8_t> valid(nSrc, 0);
    parallelChunks(nSrc, threads, 16384, [&](std::size_t b, std::size_t e, int) {
        for (std::size_t i = b; i < e; ++i) {
            if (!std::isfinite(x[i]) || !std::isfinite(y[i]) || !std::isfinite(srcRa[i]) ||
                !std::isfinite(srcDec[i]))
                continue;
            valid[i] = 1;
            const Vec3 u = unitVector(srcRa[i], srcDec[i]);
            std::memcpy(&srcUnit[3 * i], u.data(), sizeof u);
        }
    });

    std::vector<std::uint32_t> offsets(nSrc + 1, 0);
    std::vector<std::uint32_t> candRef;
    std::vector<double> candSep;
    if (nSel > 0 && nSrc > 0) {
        Grid g;
        g.x0 = lo;
        g.y0 = lo;
        g.cell = res.radiusPx * (1.0 + 1e-9);
        auto cellsOf = [&](double cell, long long& nx, long long& ny) {
            nx = static_cast<long long>((hiX - lo) / cell) + 1;
            ny = static_cast<long long>((hiY - lo) / cell) + 1;
        };
        cellsOf(g.cell, g.nx, g.ny);
        // At most ~16M cells (and several stars per cell on average when there are fewer stars).
        const double maxCells = std::min(16.0e6, std::max(1024.0, 0.5 * static_cast<double>(nSel)));
        while (static_cast<double>(g.nx) * static_cast<double>(g.ny) > maxCells) {
            g.cell *= 2.0;
            cellsOf(g.cell, g.nx, g.ny);
        }
        const std::size_t nCells = static_cast<std::size_t>(g.nx * g.ny);
        int endBit = 1;
        while (endBit < 32 && (std::size_t(1) << endBit) < nCells) ++endBit;

        const cudaStream_t s = dc.stream();
        constexpr int kBlock = 256;
        try {
            DeviceBuffer<double> dRx(dc, nSel), dRy(dc, nSel), dRu(dc, 3 * nSel);
            dRx.upload(res.refX.data(), nSel);
            dRy.upload(res.refY.data(), nSel);
            dRu.upload(refUnit.data(), 3 * nSel);
            DeviceBuffer<std::uint32_t> keyIn(dc, nSel), keyOut(dc, nSel), idxIn(dc, nSel), idxOut(dc, nSel);
            cellOfRefs<<<blocksFor(nSel, kBlock), kBlock, 0, s>>>(dRx.get(), dRy.get(), nSel, g, keyIn.get(),
                                                                   idxIn.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            std::size_t sortBytes = 0;
            GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sortBytes, keyIn.get(), keyOut.get(),
                                                               idxIn.get(), idxOut.get(), nSel, 0, endBit, s));
            DeviceBuffer<unsigned char> sortTemp(dc, std::max<std::size_t>(sortBytes, 1));
            GPUPHOT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sortTemp.get(), sortBytes, keyIn.get(),
                                                               keyOut.get(), idxIn.get(), idxOut.get(), nSel, 0,
                                                               endBit, s));
            sortTemp.reset();
            keyIn.reset();
            idxIn.reset();
            DeviceBuffer<std::uint32_t> cellBegin(dc, nCells), cellEnd(dc, nCells);
            cellBegin.zero();
            cellEnd.zero();
            cellRanges<<<blocksFor(nSel, kBlock), kBlock, 0, s>>>(keyOut.get(), nSel, cellBegin.get(),
                                                                   cellEnd.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            keyOut.reset();

            DeviceBuffer<double> dSx(dc, nSrc), dSy(dc, nSrc), dSu(dc, 3 * nSrc);
            DeviceBuffer<std::uint8_t> dValid(dc, nSrc);
            dSx.upload(x.data(), nSrc);
            dSy.upload(y.data(), nSrc);
            dSu.upload(srcUnit.data(), 3 * nSrc);
            dValid.upload(valid.data(), nSrc);
            DeviceBuffer<std::uint32_t> dCount(dc, nSrc + 1), dOffset(dc, nSrc + 1);
            dCount.zero();
            SearchArgs a{};
            a.sx = dSx.get();
            a.sy = dSy.get();
            a.su = dSu.get();
            a.valid = dValid.get();
            a.nSrc = nSrc;
            a.rx = dRx.get();
            a.ry = dRy.get();
            a.ru = dRu.get();
            a.sorted = idxOut.get();
            a.cellBegin = cellBegin.get();
            a.cellEnd = cellEnd.get();
            a.g = g;
            a.r2 = res.radiusPx * res.radiusPx;
            a.reach = res.radiusPx * (1.0 + 1e-6) + 1e-6;
            a.sepLimit = params.radiusArcsec * (1.0 + 1e-9);
            a.count = dCount.get();
            searchKernel<false><<<blocksFor(nSrc, kBlock), kBlock, 0, s>>>(a);
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            std::size_t scanBytes = 0;
            GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scanBytes, dCount.get(), dOffset.get(),
                                                             nSrc + 1, s));
            DeviceBuffer<unsigned char> scanTemp(dc, std::max<std::size_t>(scanBytes, 1));
            GPUPHOT_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(scanTemp.get(), scanBytes, dCount.get(),
                                                             dOffset.get(), nSrc + 1, s));
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
        } catch (...) {
            dc.drain();
            throw;
        }
        dc.notePlan("whole", 1);
    }
    ctx.checkCancelled();

    // --- exact separations (host, the CPU's function) ----------------------------------------------------
    struct Candidate {
        double sep;
        std::int32_t src, ref; // ref: row in the catalog
    };
    std::vector<std::vector<Candidate>> cands(nSrc);
    std::vector<std::size_t> mismatchPerThread(std::max(threads, 1) + 1, 0);
    parallelChunks(nSrc, threads, 4096, [&](std::size_t b, std::size_t e, int id) {
        std::size_t mism = 0;
        for (std::size_t i = b; i < e; ++i) {
            const std::uint32_t o0 = offsets[i], o1 = offsets[i + 1];
            if (o0 == o1) continue;
            Vec3 su;
            std::memcpy(su.data(), &srcUnit[3 * i], sizeof su);
            auto& c = cands[i];
            for (std::uint32_t o = o0; o < o1; ++o) {
                const std::uint32_t k = candRef[o];
                Vec3 ru;
                std::memcpy(ru.data(), &refUnit[3 * std::size_t(k)], sizeof ru);
                const double sep = separationArcsec(su, ru);
                if (std::memcmp(&sep, &candSep[o], sizeof sep) != 0) ++mism;
                if (sep <= params.radiusArcsec)
                    c.push_back({sep, static_cast<std::int32_t>(i), res.refSelected[k]});
            }
            std::sort(c.begin(), c.end(), [](const Candidate& p, const Candidate& q) {
                return std::tie(p.sep, p.ref) < std::tie(q.sep, q.ref);
            });
        }
        mismatchPerThread[id] += mism;
    });
    g_lastSepMismatch = 0;
    for (auto m : mismatchPerThread) g_lastSepMismatch += m;
    g_lastCandidates = offsets[nSrc];
    ctx.report("crossmatch", 0.8);

    // --- 4. assignment (as the CPU) ----------------------------------------------------------------------
    if (!params.oneToOne) {
        for (std::size_t i = 0; i < nSrc; ++i)
            if (!cands[i].empty()) {
                res.refIndex[i] = cands[i].front().ref;
                res.separationArcsec[i] = cands[i].front().sep;
            }
    } else {
        std::vector<Candidate> all;
        for (const auto& c : cands) all.insert(all.end(), c.begin(), c.end());
        std::sort(all.begin(), all.end(), [](const Candidate& p, const Candidate& q) {
            return std::tie(p.sep, p.src, p.ref) < std::tie(q.sep, q.src, q.ref);
        });
        std::vector<std::uint8_t> refTaken(nRef, 0);
        for (const Candidate& c : all) {
            if (res.refIndex[c.src] >= 0 || refTaken[c.ref]) continue;
            res.refIndex[c.src] = c.ref;
            res.separationArcsec[c.src] = c.sep;
            refTaken[c.ref] = 1;
        }
    }
    for (std::size_t i = 0; i < nSrc; ++i) res.nMatched += res.refIndex[i] >= 0;
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
