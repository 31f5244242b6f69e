// Stage 4 on the GPU: the per-source loops of aperture photometry (core/stages/aperture_internal.hpp) as
// kernels behind detail::ApertureEngine, so that core's driver (validation, sky fallbacks, flags, errors,
// curve of growth, aperture correction, optimal radius choice: all on the host) gives bitwise the CPU
// stage's numbers:
//   - local sky: per-source annulus counts, an exclusive scan (CUB), the annulus values as order-preserving
//     keys, then one thread per source: heap sort of its keys (the CPU's radix sort gives the same array),
//     and the clipped statistics (the prefix sums that the CPU keeps in arrays are recomputed by the same
//     running sums);
//   - circular apertures: one thread per (source, radius) summing the pixels that radius cuts (exact
//     overlap) and the pixels it is the first to hold wholly, in raster order in double; a second kernel
//     adds the "whole pixel" parts over the radii as the CPU does;
//   - Kron: one thread per source (first moment, then the exact elliptical sum).
// No atomics; every sum has one fixed order. Pixels and mask come from the DeviceContext's frame cache,
// the background maps from its background cache; the segmentation map is uploaded per call.
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture.hpp"
#include "core/stages/aperture_internal.hpp"
#include "core/stages/background.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

// Test hook (tests/kernels/aperture_cuda_test.cpp declares it): the local sky's intermediate arrays.
// offsets (n + 1): source i's pixels are [offsets[i], offsets[i + 1]) of index (frame index y * width + x,
// enumeration order) and sorted (the values as sorted on the device; garbage when too few); est: the skies.
void debugLocalSkies(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
                     const double* cx, const double* cy, std::size_t n, double rin, double rout,
                     const detail::SkyParamsHD& p, double saturation, RunContext& ctx,
                     std::vector<int>& offsets, std::vector<int>& index, std::vector<float>& sorted,
                     std::vector<detail::SkyEstimate>& est);

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

class CudaEngine final : public detail::ApertureEngine {
public:
    CudaEngine(DeviceContext& dc, const BackgroundResult& bkg) : m_dc(dc), m_bkg(bkg) {
        m_threads = dc.blockSize() > 0 ? std::min(dc.blockSize(), 1024) : 128;
    }
    std::size_t batchSize() const override { return 32768; }

    void begin(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
               const ImageView& level, const ImageView& rms, double saturation) override {
        const DeviceContext::DeviceFrame f = m_dc.frame(image, mask);
        m_in = AperturePlanes{};
        m_in.image = f.pixels;
        m_in.imageStride = f.width;
        m_in.mask = f.mask;
        m_in.maskStride = f.width;
        if (!seg.empty()) {
            m_seg = DeviceBuffer<std::int32_t>(m_dc, static_cast<std::size_t>(seg.width) * seg.height);
            GPUPHOT_CUDA_CHECK(cudaMemcpy2DAsync(
                m_seg.get(), sizeof(std::int32_t) * seg.width, seg.data, sizeof(std::int32_t) * seg.stride,
                sizeof(std::int32_t) * seg.width, seg.height, cudaMemcpyHostToDevice, m_dc.stream()));
            m_in.seg = m_seg.get();
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
    }

    void localSkies(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                    const detail::SkyParamsHD& p, SkyEstimate* out) override {
        localSkiesImpl(cx, cy, n, rin, rout, p, out, nullptr);
    }

    // localSkies, with the test hook's copies of the intermediate arrays when dbg is not null.
    void localSkiesImpl(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                        const detail::SkyParamsHD& p, SkyEstimate* out, AnnulusDebug* dbg) {
        if (n == 0) return;
        const cudaStream_t s = m_dc.stream();
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
        m_dc.synchronize();
        DeviceBuffer<std::uint32_t> keys(m_dc, std::max(total, 1));
        DeviceBuffer<float> values(m_dc, std::max(total, 1));
        if (total > 0) {
            const int tFill = threads(annulusFillKernel);
            annulusFillKernel<<<blocks(n, tFill), tFill, 0, s>>>(m_in, dcx.get(), dcy.get(), n, rin, rout,
                                                                 offsets.get(), keys.get());
            checkLaunch("the annulus values");
        }
        DeviceBuffer<SkyEstimate> dOut(m_dc, n);
        const int tStats = threads(skyStatsKernel);
        skyStatsKernel<<<blocks(n, tStats), tStats, 0, s>>>(keys.get(), offsets.get(), n, p, values.get(),
                                                            dOut.get());
        checkLaunch("the sky statistics");
        dOut.download(out, n);
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
        if (n == 0 || nr == 0) return;
        const cudaStream_t s = m_dc.stream();
        const std::size_t nRadii = radiiStride == 0 ? nr : n * radiiStride;
        std::vector<double> r2(nRadii);
        for (std::size_t k = 0; k < nRadii; ++k)
            r2[k] = radii[k] * radii[k];
        DeviceBuffer<CircleJob> dJobs(m_dc, n);
        DeviceBuffer<double> dR(m_dc, nRadii), dR2(m_dc, nRadii);
        dJobs.upload(jobs, n);
        dR.upload(radii, nRadii);
        dR2.upload(r2.data(), nRadii);
        DeviceBuffer<ApertureSums> partial(m_dc, n * nr), full(m_dc, n * nr), dOut(m_dc, n * nr);
        DeviceBuffer<ApertureFlagDistances> dFd(m_dc, n);
        const int tParts = threads(circlePartsKernel);
        circlePartsKernel<<<blocks(n * nr, tParts), tParts, 0, s>>>(
            m_in, dJobs.get(), n, dR.get(), dR2.get(), nr, radiiStride, partial.get(), full.get(), dFd.get());
        checkLaunch("the circle sums");
        const int tCombine = threads(circleCombineKernel);
        circleCombineKernel<<<blocks(n, tCombine), tCombine, 0, s>>>(partial.get(), full.get(), n, nr,
                                                                     dOut.get());
        checkLaunch("the circle totals");
        dOut.download(out, n * nr);
        dFd.download(fd, n);
        m_dc.synchronize();
    }

    void kron(const KronJob* jobs, std::size_t n, const detail::KronParamsHD& p, KronOut* out) override {
        if (n == 0) return;
        const cudaStream_t s = m_dc.stream();
        DeviceBuffer<KronJob> dJobs(m_dc, n);
        dJobs.upload(jobs, n);
        DeviceBuffer<KronOut> dOut(m_dc, n);
        const int tKron = threads(kronKernel);
        kronKernel<<<blocks(n, tKron), tKron, 0, s>>>(m_in, dJobs.get(), n, p, dOut.get());
        checkLaunch("the Kron apertures");
        dOut.download(out, n);
        m_dc.synchronize();
    }

private:
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
    int m_threads = 128;
    AperturePlanes m_in;
    DeviceBuffer<std::int32_t> m_seg;
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
    engine.begin(image, mask, seg, ImageView{}, ImageView{}, saturation);
    est.assign(n, detail::SkyEstimate{});
    AnnulusDebug dbg;
    engine.localSkiesImpl(cx, cy, n, rin, rout, p, est.data(), &dbg);
    offsets = std::move(dbg.offsets);
    index = std::move(dbg.index);
    sorted = std::move(dbg.sorted);
}

ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                double fwhm, double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx) {
    DeviceContext& dc = DeviceContext::of(ctx);
    CudaEngine engine(dc, bkg);
    return detail::measureAperturesWith(engine, image, mask, bkg, segmentation, sources, fwhm, gain,
                                        readNoise, params, ctx);
}

} // namespace gpuphot::cuda
