// The PSF stage's ePSF cells on the device (ePSF stacking): cpu::buildPsfModel's EpsfCellBatch
// for the CUDA backend. All cells of the grid at once, every step a kernel over all cells (blockIdx.y: the
// cell), the arithmetic core/stages/psf/psf_epsf_math.hpp's, -fmad=false: each cell bitwise the host's
// buildEpsfCell (core/stages/psf/psf_epsf.cpp).
//
//  1. model: the base profile on every node (one thread a node).
//  2. items: one thread per (star, stamp pixel), item t = star * (2 radius + 1)^2 + pixel, the host's item
//     order; its node (-1: off the frame, masked or off the grid) and residual; the nodes' item counts
//     (atomics: integers, exact). A residual that is not finite marks the cell for the host (below).
//  3. scan: each node's first slot (one block a cell).
//  4. scatter: the item indices into their node's slots (atomics: in any order).
//  5. node means: per node (one thread) the indices sorted back into item order, the values gathered,
//     epsfmath::clippedMean (its median and MAD by epsfmath::sortAscending: any correct sort of finite
//     values gives the same result, see there) times the count.
//  6. assemble: the normalised binomial convolution plus the model (one thread a node).
//  7. re-centring: the centroid sums in the host's node order (one thread a cell, over the disc's box);
//     cells whose centroid moved run 2-6 again with the shift.
//  8. the native-sampling sum (one thread a cell), the float image (one thread a node), the effective
//     FWHM: the peak of the 1/16 px samples (the largest positive sample: its bits as an unsigned
//     integer, atomicMax, exact and order-free), the samples at or above half of it (counts), the FWHM
//     (one thread a cell).
// The reductions whose order matters (a node's clipped sum, the convolution, the centroid and native
// sums) run on one thread in the host's order; the others are exact (integer counts, a maximum).
//
// Falls back (every cell left to the host) when the background is of a kind the device path does not
// read (as kernels/psf/psf.cu's photometry: full maps, the mesh grid, or global values only) and when the
// device has no room; a cell with a residual that is not finite (a NaN pixel not masked: the host's
// std::sort places NaN as it does) is left to the host alone.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/psf/psf.hpp"
#include "core/stages/psf/psf_epsf.hpp"
#include "core/stages/psf/psf_epsf_math.hpp"
#include "core/stages/psf/psf_fit_math.hpp"
#include "core/stages/psf/psf_flux_math.hpp"
#include "core/util/hd_math.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"
#include "kernels/psf/psf_epsf.hpp"
#include "kernels/psf/psf_planes.hpp"

namespace gpuphot::cuda {

namespace {

// The frame as the kernels read it (row stride = width); level null: the global level.
// What every cell shares.
struct EpsfShape {
    psffit::Quadrature quad;
    int moffat = 1;
    int radius = 0, os = 1, n = 0, c = 0;
    int stampPixels = 0;  // (2 radius + 1)^2
    long long nNodes = 0; // n * n
};

struct EpsfCellIn {
    double base[psffit::kLmParams]; // the base's psffit vector
    double baseFwhm;
    long long itemOffset; // the cell's first item (nStars * stampPixels items)
    int nStars, starOffset;
    int fineHalf; // epsfmath::fwhmHalfSteps
    int pad;
};

struct EpsfStarIn {
    double x0, y0, background, flux;
};

struct EpsfCellState {
    double sx, sy; // the pass's centre shift
    double sum;    // native-sampling sum
    double fwhm;
    unsigned long long peakBits; // bits of the peak (>= +0)
    unsigned long long above;    // samples at or above half the peak
    int active;                  // the cell stacks in this pass
    int nonFinite;               // a residual was not finite: the host builds the cell
};

constexpr int kThreads = 256;

int blocksFor(long long work) {
    const long long b = (work + kThreads - 1) / kThreads;
    return static_cast<int>(b < 1 ? 1 : (b > 4096 ? 4096 : b));
}

__global__ void modelKernel(EpsfShape sh, const EpsfCellIn* __restrict__ cells, double* __restrict__ model) {
    const int cell = static_cast<int>(blockIdx.y);
    const double* base = cells[cell].base;
    for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < sh.nNodes;
         k += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int i = static_cast<int>(k % sh.n), j = static_cast<int>(k / sh.n);
        model[cell * sh.nNodes + k] = epsfmath::nodeModel(base, sh.moffat != 0, sh.quad, i, j, sh.c, sh.os);
    }
}

__global__ void itemKernel(EpsfShape sh, PsfPlanes f, const EpsfCellIn* __restrict__ cells,
                           const EpsfStarIn* __restrict__ stars, EpsfCellState* state,
                           int* __restrict__ itemNode, double* __restrict__ itemValue,
                           int* __restrict__ count) {
    const int cell = static_cast<int>(blockIdx.y);
    if (!state[cell].active) return;
    const EpsfCellIn& in = cells[cell];
    const double sx = state[cell].sx, sy = state[cell].sy;
    const long long nItems = static_cast<long long>(in.nStars) * sh.stampPixels;
    bool bad = false;
    for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; t < nItems;
         t += static_cast<long long>(gridDim.x) * blockDim.x) {
        const int s = static_cast<int>(t / sh.stampPixels), p = static_cast<int>(t % sh.stampPixels);
        const EpsfStarIn star = stars[in.starOffset + s];
        const epsfmath::StarStamp st = epsfmath::starStamp(star.x0, star.y0, sx, sy);
        int i, j;
        epsfmath::stampPixel(st, sh.radius, p, i, j);
        int node = -1;
        double value = 0.0;
        if (i >= 0 && j >= 0 && i < f.width && j < f.height) {
            const std::size_t at =
                static_cast<std::size_t>(j) * static_cast<std::size_t>(f.width) + static_cast<std::size_t>(i);
            if (f.mask == nullptr || f.mask[at] == 0) {
                double dx, dy;
                node = epsfmath::pixelNode(i, j, st, sh.os, sh.c, sh.n, dx, dy);
                if (node >= 0) {
                    const double level = f.level ? static_cast<double>(f.level[at]) : f.globalLevel;
                    value = epsfmath::residualValue(f.image[at], level, star.background, star.flux, in.base,
                                                    sh.moffat != 0, sh.quad, dx, dy);
                    if (!hdmath::isFinite(value)) bad = true;
                    atomicAdd(count + cell * sh.nNodes + node, 1);
                }
            }
        }
        itemNode[in.itemOffset + t] = node;
        itemValue[in.itemOffset + t] = value;
    }
    if (bad) atomicOr(&state[cell].nonFinite, 1);
}

// Each node's first slot: the cell's item offset plus the counts before it (one block a cell).
__global__ void scanKernel(EpsfShape sh, const EpsfCellIn* __restrict__ cells, const EpsfCellState* state,
                           const int* __restrict__ count, long long* __restrict__ start) {
    const int cell = static_cast<int>(blockIdx.x);
    if (!state[cell].active) return;
    __shared__ long long part[1024];
    const long long chunk = (sh.nNodes + blockDim.x - 1) / blockDim.x;
    const long long b = threadIdx.x * chunk;
    const long long e = b + chunk < sh.nNodes ? b + chunk : sh.nNodes;
    const int* c = count + cell * sh.nNodes;
    long long s = 0;
    for (long long k = b; k < e; ++k)
        s += c[k];
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long run = cells[cell].itemOffset;
        for (unsigned t = 0; t < blockDim.x; ++t) {
            const long long v = part[t];
            part[t] = run;
            run += v;
        }
    }
    __syncthreads();
    long long run = part[threadIdx.x];
    for (long long k = b; k < e; ++k) {
        start[cell * sh.nNodes + k] = run;
        run += c[k];
    }
}

__global__ void scatterKernel(EpsfShape sh, const EpsfCellIn* __restrict__ cells, const EpsfCellState* state,
                              const int* __restrict__ itemNode, const long long* __restrict__ start,
                              int* __restrict__ fill, int* __restrict__ idx) {
    const int cell = static_cast<int>(blockIdx.y);
    if (!state[cell].active) return;
    const EpsfCellIn& in = cells[cell];
    const long long nItems = static_cast<long long>(in.nStars) * sh.stampPixels;
    for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; t < nItems;
         t += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long g = in.itemOffset + t;
        const int node = itemNode[g];
        if (node < 0) continue;
        const long long q = cell * sh.nNodes + node;
        idx[start[q] + atomicAdd(fill + q, 1)] = static_cast<int>(g);
    }
}

__global__ void nodeMeanKernel(EpsfShape sh, const EpsfCellState* state, const int* __restrict__ count,
                               const long long* __restrict__ start, int* __restrict__ idx,
                               const double* __restrict__ itemValue, double* __restrict__ vals,
                               double* __restrict__ work, double* __restrict__ mean,
                               double* __restrict__ cnt) {
    const int cell = static_cast<int>(blockIdx.y);
    if (!state[cell].active) return;
    for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < sh.nNodes;
         k += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long q = cell * sh.nNodes + k;
        const int m = count[q];
        if (m == 0) {
            mean[q] = 0.0;
            cnt[q] = 0.0;
            continue;
        }
        const long long s0 = start[q];
        mean[q] = epsfmath::nodeMeanOfItems(idx + s0, m, itemValue, vals + s0, work + s0);
        cnt[q] = static_cast<double>(m);
    }
}

// e = model + smoothed residual (the cells that stack in this pass); in pass 0 a cell without stars: the
// model.
__global__ void assembleKernel(EpsfShape sh, const EpsfCellState* state, int pass,
                               const double* __restrict__ model, const double* __restrict__ mean,
                               const double* __restrict__ cnt, double* __restrict__ e) {
    const int cell = static_cast<int>(blockIdx.y);
    const bool active = state[cell].active != 0;
    if (!active && pass > 0) return;
    const double* cm = mean + cell * sh.nNodes;
    const double* cc = cnt + cell * sh.nNodes;
    for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < sh.nNodes;
         k += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long q = cell * sh.nNodes + k;
        const int i = static_cast<int>(k % sh.n), j = static_cast<int>(k / sh.n);
        e[q] = active ? model[q] + epsfmath::smoothNode(cm, cc, sh.n, i, j) : model[q];
    }
}

// After pass 0: the re-centring shift; active afterwards: the cell stacks again.
__global__ void recentreKernel(EpsfShape sh, const EpsfCellIn* __restrict__ cells, EpsfCellState* state,
                               int nCells, const double* __restrict__ e) {
    const int cell = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (cell >= nCells) return;
    EpsfCellState& st = state[cell];
    if (!st.active || st.nonFinite) {
        st.active = 0;
        return;
    }
    const epsfmath::CentroidSums sums = epsfmath::centroidSums(
        e + cell * sh.nNodes, sh.n, sh.c, sh.os, epsfmath::recentreRadius(cells[cell].baseFwhm));
    double cx = 0.0, cy = 0.0;
    if (epsfmath::recentreShift(sums, cx, cy)) {
        st.sx = cx;
        st.sy = cy;
        st.active = 1;
    } else {
        st.active = 0;
    }
}

__global__ void nativeSumKernel(EpsfShape sh, EpsfCellState* state, int nCells,
                                const double* __restrict__ e) {
    const int cell = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (cell >= nCells) return;
    state[cell].sum = epsfmath::nativeSum(e + cell * sh.nNodes, sh.n, sh.os);
}

__global__ void imageKernel(EpsfShape sh, const EpsfCellState* state, const double* __restrict__ e,
                            float* __restrict__ image) {
    const int cell = static_cast<int>(blockIdx.y);
    const double sum = state[cell].sum;
    for (long long k = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; k < sh.nNodes;
         k += static_cast<long long>(gridDim.x) * blockDim.x) {
        const long long q = cell * sh.nNodes + k;
        image[q] = epsfmath::nodeImage(e[q], sum);
    }
}

__device__ double fineSample(const EpsfShape& sh, const float* image, int m, long long t) {
    const psfmath::EpsfCellView view{image, sh.n, sh.n, static_cast<double>(sh.c), static_cast<double>(sh.c),
                                     sh.os};
    const int side = 2 * m + 1;
    const int i = static_cast<int>(t % side) - m, j = static_cast<int>(t / side) - m;
    return psfmath::cellValue(view, epsfmath::fwhmSampleOffset(i), epsfmath::fwhmSampleOffset(j));
}

// The peak: the largest positive sample (the host's max from +0; a NaN sample is never taken), as the bits of
// a non-negative double, which order as the values.
__global__ void peakKernel(EpsfShape sh, const EpsfCellIn* __restrict__ cells, EpsfCellState* state,
                           const float* __restrict__ image) {
    const int cell = static_cast<int>(blockIdx.y);
    const int m = cells[cell].fineHalf;
    const long long total = static_cast<long long>(2 * m + 1) * (2 * m + 1);
    const float* img = image + cell * sh.nNodes;
    unsigned long long best = 0;
    for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; t < total;
         t += static_cast<long long>(gridDim.x) * blockDim.x) {
        const double v = fineSample(sh, img, m, t);
        if (v > 0.0) {
            const unsigned long long b = hdmath::bitsOf(v);
            if (b > best) best = b;
        }
    }
    if (best > 0) atomicMax(&state[cell].peakBits, best);
}

__global__ void countKernel(EpsfShape sh, const EpsfCellIn* __restrict__ cells, EpsfCellState* state,
                            const float* __restrict__ image) {
    const int cell = static_cast<int>(blockIdx.y);
    const int m = cells[cell].fineHalf;
    const long long total = static_cast<long long>(2 * m + 1) * (2 * m + 1);
    const float* img = image + cell * sh.nNodes;
    const double peak = hdmath::fromBits(state[cell].peakBits);
    unsigned long long above = 0;
    for (long long t = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; t < total;
         t += static_cast<long long>(gridDim.x) * blockDim.x)
        if (fineSample(sh, img, m, t) >= 0.5 * peak) ++above;
    if (above > 0) atomicAdd(&state[cell].above, above);
}

__global__ void fwhmKernel(EpsfCellState* state, int nCells) {
    const int cell = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (cell >= nCells) return;
    state[cell].fwhm = epsfmath::fwhmFromCount(state[cell].above, hdmath::fromBits(state[cell].peakBits));
}

thread_local std::size_t lastDeviceCells = 0; // the calling thread's last batch (test hook)
thread_local bool keepNodes = false;          // test hook: download the double nodes too
thread_local std::vector<std::vector<double>> lastNodes;

// The cells of jobs on the device; done[k] = 1 for those built. False: nothing done (the background is of
// a kind the kernels do not read, or the sizes are out of the kernels' range).
bool buildOnDevice(RunContext& ctx, const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                   const std::vector<EpsfCellJob>& jobs, PsfModelKind kind, int radius, int oversampling,
                   int nQuad, std::vector<char>& done) {
    if (!psfReadsBackground(bkg, image.width, image.height)) return false;

    const int nCells = static_cast<int>(jobs.size());
    EpsfShape sh;
    sh.quad = psffit::quadrature(nQuad);
    sh.moffat = kind == PsfModelKind::Moffat ? 1 : 0;
    sh.radius = radius;
    sh.os = oversampling;
    sh.n = epsfmath::nodesPerSide(radius, oversampling);
    sh.c = epsfmath::centreNode(radius, oversampling);
    sh.stampPixels = (2 * radius + 1) * (2 * radius + 1);
    sh.nNodes = static_cast<long long>(sh.n) * sh.n;

    std::vector<EpsfCellIn> cells(nCells);
    std::vector<EpsfStarIn> stars;
    long long nItems = 0;
    for (int k = 0; k < nCells; ++k) {
        const EpsfCellJob& job = jobs[k];
        EpsfCellIn& in = cells[k];
        std::memset(&in, 0, sizeof in);
        profileVector(job.base, in.base);
        in.baseFwhm = profileShape(job.base, kind).fwhm;
        in.fineHalf = epsfmath::fwhmHalfSteps(in.baseFwhm, radius);
        in.nStars = static_cast<int>(job.stars->size());
        in.starOffset = static_cast<int>(stars.size());
        in.itemOffset = nItems;
        for (const PsfStar* s : *job.stars)
            stars.push_back({s->fit.x0, s->fit.y0, s->fit.background, s->flux});
        nItems += static_cast<long long>(in.nStars) * sh.stampPixels;
    }
    if (nItems > INT_MAX || sh.nNodes > INT_MAX) return false; // item indices and nodes are ints
    std::vector<EpsfCellState> state(nCells);
    for (int k = 0; k < nCells; ++k) {
        std::memset(&state[k], 0, sizeof(EpsfCellState));
        state[k].active = cells[k].nStars > 0 ? 1 : 0;
    }

    DeviceContext& dc = DeviceContext::of(ctx);
    const cudaStream_t s = dc.stream();
    const PsfPlanes f = psfPlanes(dc, image, mask, bkg);

    const std::size_t nodesAll = static_cast<std::size_t>(nCells) * static_cast<std::size_t>(sh.nNodes);
    const std::size_t items = static_cast<std::size_t>(nItems);
    DeviceBuffer<EpsfCellIn> dCells(dc, cells.size());
    DeviceBuffer<EpsfStarIn> dStars(dc, stars.size());
    DeviceBuffer<EpsfCellState> dState(dc, state.size());
    DeviceBuffer<double> dModel(dc, nodesAll), dE(dc, nodesAll), dMean(dc, nodesAll), dCnt(dc, nodesAll);
    DeviceBuffer<int> dCount(dc, nodesAll), dFill(dc, nodesAll);
    DeviceBuffer<long long> dStart(dc, nodesAll);
    DeviceBuffer<float> dImage(dc, nodesAll);
    DeviceBuffer<int> dItemNode(dc, items), dIdx(dc, items);
    DeviceBuffer<double> dItemValue(dc, items), dVals(dc, items), dWork(dc, items);
    dCells.upload(cells.data(), cells.size());
    dStars.upload(stars.data(), stars.size());
    dState.upload(state.data(), state.size());

    const dim3 nodeGrid(blocksFor(sh.nNodes), nCells);
    long long maxItems = 0;
    for (const EpsfCellIn& in : cells)
        maxItems = std::max(maxItems, static_cast<long long>(in.nStars) * sh.stampPixels);
    const dim3 itemGrid(blocksFor(maxItems), nCells);
    const int cellBlocks = (nCells + 63) / 64;

    modelKernel<<<nodeGrid, kThreads, 0, s>>>(sh, dCells.get(), dModel.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    for (int pass = 0; pass < 2; ++pass) {
        if (nItems > 0) {
            dCount.zero();
            dFill.zero();
            itemKernel<<<itemGrid, kThreads, 0, s>>>(sh, f, dCells.get(), dStars.get(), dState.get(),
                                                     dItemNode.get(), dItemValue.get(), dCount.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            scanKernel<<<nCells, 1024, 0, s>>>(sh, dCells.get(), dState.get(), dCount.get(), dStart.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            scatterKernel<<<itemGrid, kThreads, 0, s>>>(sh, dCells.get(), dState.get(), dItemNode.get(),
                                                        dStart.get(), dFill.get(), dIdx.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
            nodeMeanKernel<<<nodeGrid, kThreads, 0, s>>>(sh, dState.get(), dCount.get(), dStart.get(),
                                                         dIdx.get(), dItemValue.get(), dVals.get(),
                                                         dWork.get(), dMean.get(), dCnt.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
        }
        assembleKernel<<<nodeGrid, kThreads, 0, s>>>(sh, dState.get(), pass, dModel.get(), dMean.get(),
                                                     dCnt.get(), dE.get());
        GPUPHOT_CUDA_CHECK(cudaGetLastError());
        if (pass == 0) {
            recentreKernel<<<cellBlocks, 64, 0, s>>>(sh, dCells.get(), dState.get(), nCells, dE.get());
            GPUPHOT_CUDA_CHECK(cudaGetLastError());
        }
    }
    nativeSumKernel<<<cellBlocks, 64, 0, s>>>(sh, dState.get(), nCells, dE.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    imageKernel<<<nodeGrid, kThreads, 0, s>>>(sh, dState.get(), dE.get(), dImage.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    int maxHalf = 0;
    for (const EpsfCellIn& in : cells)
        maxHalf = std::max(maxHalf, in.fineHalf);
    const dim3 fineGrid(blocksFor(static_cast<long long>(2 * maxHalf + 1) * (2 * maxHalf + 1)), nCells);
    peakKernel<<<fineGrid, kThreads, 0, s>>>(sh, dCells.get(), dState.get(), dImage.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    countKernel<<<fineGrid, kThreads, 0, s>>>(sh, dCells.get(), dState.get(), dImage.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    fwhmKernel<<<cellBlocks, 64, 0, s>>>(dState.get(), nCells);
    GPUPHOT_CUDA_CHECK(cudaGetLastError());

    std::vector<float> images(nodesAll);
    dImage.download(images.data(), nodesAll);
    dState.download(state.data(), state.size());
    std::vector<double> nodes(keepNodes ? nodesAll : 0);
    if (keepNodes) dE.download(nodes.data(), nodesAll);
    dc.synchronize();

    std::size_t built = 0;
    for (int k = 0; k < nCells; ++k) {
        if (state[k].nonFinite) continue; // the host's
        EpsfCell& cell = *jobs[k].cell;
        cell.oversampling = sh.os;
        cell.centreX = cell.centreY = sh.c;
        cell.nStars = cells[k].nStars;
        cell.image = Image<float>(sh.n, sh.n);
        std::memcpy(cell.image.data(), images.data() + static_cast<std::size_t>(k) * sh.nNodes,
                    sizeof(float) * static_cast<std::size_t>(sh.nNodes));
        cell.fwhm = state[k].fwhm;
        if (keepNodes) {
            lastNodes.resize(jobs.size());
            const double* first = nodes.data() + static_cast<std::size_t>(k) * sh.nNodes;
            lastNodes[k].assign(first, first + sh.nNodes);
        }
        done[k] = 1;
        ++built;
    }
    lastDeviceCells = built;
    return true;
}

} // namespace

EpsfCellBatch deviceEpsfCellBatch(RunContext& ctx, const ImageView& image, const MaskView& mask,
                                  const BackgroundResult& bkg) {
    lastDeviceCells = 0;
    const BackgroundResult* b = &bkg;
    RunContext* c = &ctx;
    return [c, image, mask, b](const std::vector<EpsfCellJob>& jobs, PsfModelKind kind, int radius,
                               int oversampling, int nQuad, std::vector<char>& done) {
        lastDeviceCells = 0;
        lastNodes.clear();
        if (jobs.empty()) return;
        try {
            if (!buildOnDevice(*c, image, mask, *b, jobs, kind, radius, oversampling, nQuad, done))
                std::fill(done.begin(), done.end(), 0);
        } catch (const DeviceOutOfMemory&) {
            DeviceContext::of(*c).drain();
            std::fill(done.begin(), done.end(), 0);
            lastDeviceCells = 0;
            lastNodes.clear();
        }
    };
}

std::size_t psfLastDeviceEpsfCells() {
    return lastDeviceCells;
}

void psfKeepDeviceEpsfNodes(bool keep) {
    keepNodes = keep;
}

const std::vector<std::vector<double>>& psfLastDeviceEpsfNodes() {
    return lastNodes;
}

} // namespace gpuphot::cuda
