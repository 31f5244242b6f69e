// CUDA PSF stage: the stars' profile fits (Levenberg–Marquardt, one block per star), the ePSF
// cells (kernels/psf/psf_epsf.cu) and the PSF photometry (one weighted linear flux fit per source on the local
// ePSF) on the device; the rest of the stage (selection, stamps, clipping, spatial polynomial, per-source
// shape: a few ms) is the host's cpu::buildPsfModel, which hands the fits and the cells to the device
// through its ProfileFitBatch and EpsfCellBatch hooks.
//
// Profile fits: core/stages/psf/psf_fit_math.hpp's psffit::lmFit, run by all 128 threads of a block with the
// same inputs (the 8 x 8 solve included); its sums over the star's samples are made in the fixed order the
// host uses (core/stages/psf/psf_moffat.cpp LaneSums): thread l is lane l and adds the samples l, l + 128, ...
// in order, then the lanes are added as a tree in shared memory. exp/log are core/util/hd_math.hpp's, so
// the fits are bitwise the host's (the host may stop a pass early when it is certainly rejected; the
// device finishes it, with the same decision). Stars with too few samples get the start on the host, as
// fitProfile does.
//
// PSF photometry: one thread per source runs core/stages/psf/psf_flux_math.hpp, the arithmetic
// of the host's fitPsfFlux, in the same order (disc rows j then columns i, the cells' bicubic, the three
// passes); the host stores the pixel terms after its first walk, the kernel walks the disc again in every
// pass and recomputes them (the same values). Only + - * / and sqrt, -fmad=false: fluxPsf, fluxPsfErr and
// FlagPsfFitFailed bitwise the CPU stage's.
//
// Pixels and mask come from the DeviceContext's frame cache and the background maps from the device maps
// (kernels/device_maps.hpp: the background stage's resident maps, or interpolated from the mesh grid);
// a result with no maps and no grid uses its global level and rms, as the host does. The ePSF cells (a few
// hundred kB) and the per-source centres and radii go up, the fluxes come down. Falls back to the host
// loop (measurePsfFluxes) when the device has no room, when the background is of a kind the device path
// does not read, and with GPUPHOT_PSF_DEVICE=0 (the whole host stage: the comparison switch).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/model/flags.hpp"
#include "core/model/sources.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/psf/psf.hpp"
#include "core/stages/psf/psf_epsf.hpp"
#include "core/stages/psf/psf_fit_math.hpp"
#include "core/stages/psf/psf_flux_math.hpp"
#include "core/stages/psf/psf_moffat.hpp"
#include "core/util/step_timer.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"
#include "kernels/psf/psf_epsf.hpp"
#include "kernels/psf/psf_planes.hpp"

namespace gpuphot::cuda {

namespace {

// ---- profile fits ------------------------------------------------------------------------------------

struct FitJobDevice {
    int first = 0, count = 0; // the star's samples in the batch's array
    double start[psffit::kLmParams] = {};
    double startX = 0.0, startY = 0.0;
};

// psffit::LmOutcome as the kernel writes it: every byte set (LmOutcome's bools leave padding, which
// compute-sanitizer's initcheck reports when it is copied to the host).
struct FitOutDevice {
    double p[psffit::kLmParams];
    double chi2;
    int iterations;
    int flags; // 1: converged, 2: started
};
static_assert(sizeof(FitOutDevice) == (psffit::kLmParams + 1) * sizeof(double) + 2 * sizeof(int));

// lmFit's evaluator on the device: lane = thread, then the tree (LaneSums' order, without its early stop).
struct DeviceLaneSums {
    const psffit::LmSetup& s;
    const FitSample* samples;
    int n;
    double (*lanes)[psffit::kLmSums];

    __device__ double operator()(const double* p, double /*limit*/, double* h, double* g) {
        const int l = static_cast<int>(threadIdx.x);
        double sums[psffit::kLmSums];
        for (int v = 0; v < psffit::kLmSums; ++v)
            sums[v] = 0.0;
        for (int k = l; k < n; k += psffit::kLmLanes) {
            const FitSample q = samples[k];
            psffit::accumulateSample(s, p, q.x, q.y, q.value, q.weight, sums);
        }
        const int nSums = 1 + psffit::kLmNormal + s.nActive;
        __syncthreads(); // every thread has read the previous total
        for (int v = 0; v < nSums; ++v)
            lanes[l][v] = sums[v];
        __syncthreads();
        for (int step = psffit::kLmLanes / 2; step > 0; step /= 2) {
            if (l < step)
                for (int v = 0; v < nSums; ++v)
                    lanes[l][v] += lanes[l + step][v];
            __syncthreads();
        }
        for (int k = 0; k < psffit::kLmNormal; ++k)
            h[k] = lanes[0][1 + k];
        for (int k = 0; k < s.nActive; ++k)
            g[k] = lanes[0][1 + psffit::kLmNormal + k];
        return lanes[0][0];
    }
};

__global__ void __launch_bounds__(psffit::kLmLanes)
    profileFitKernel(psffit::LmSetup base, const FitSample* __restrict__ samples,
                     const FitJobDevice* __restrict__ jobs, FitOutDevice* __restrict__ out) {
    __shared__ double lanes[psffit::kLmLanes][psffit::kLmSums];
    const FitJobDevice& job = jobs[blockIdx.x];
    psffit::LmSetup s = base;
    s.startX = job.startX;
    s.startY = job.startY;
    DeviceLaneSums eval{s, samples + job.first, job.count, lanes};
    const psffit::LmOutcome o = psffit::lmFit(s, job.start, eval);
    if (threadIdx.x == 0) {
        FitOutDevice r;
        for (int k = 0; k < psffit::kLmParams; ++k)
            r.p[k] = o.p[k];
        r.chi2 = o.chi2;
        r.iterations = o.iterations;
        r.flags = (o.converged ? 1 : 0) | (o.started ? 2 : 0);
        out[blockIdx.x] = r;
    }
}

thread_local std::size_t lastDeviceProfileFits = 0; // the calling thread's last stage (test hook)

// The batch on the device: results[i] bitwise fitProfile(*jobs[i].samples, kind, jobs[i].start, options).
void fitProfilesOnDevice(DeviceContext& dc, const std::vector<ProfileFitJob>& jobs, PsfModelKind kind,
                         const LmOptions& options, std::vector<ProfileFitResult>& results) {
    std::vector<FitJobDevice> dev;
    std::vector<std::size_t> which; // dev[t] is jobs[which[t]]
    std::vector<psffit::LmSetup> setups(jobs.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        setups[i] = profileFitSetup(kind, jobs[i].start, options);
        const std::size_t n = jobs[i].samples->size();
        if (static_cast<int>(n) <= setups[i].nActive) { // fitProfile's answer without a fit
            results[i] = ProfileFitResult{};
            results[i].params = jobs[i].start;
            continue;
        }
        FitJobDevice d;
        d.first = static_cast<int>(total);
        d.count = static_cast<int>(n);
        profileFitStart(jobs[i].start, options, d.start);
        d.startX = setups[i].startX;
        d.startY = setups[i].startY;
        dev.push_back(d);
        which.push_back(i);
        total += n;
    }
    if (dev.empty()) return;
    std::vector<FitSample> all(total);
    for (std::size_t t = 0; t < dev.size(); ++t) {
        const std::vector<FitSample>& v = *jobs[which[t]].samples;
        std::copy(v.begin(), v.end(), all.begin() + dev[t].first);
    }
    DeviceBuffer<FitSample> dSamples(dc, total);
    DeviceBuffer<FitJobDevice> dJobs(dc, dev.size());
    DeviceBuffer<FitOutDevice> dOut(dc, dev.size());
    dSamples.upload(all.data(), total);
    dJobs.upload(dev.data(), dev.size());
    // Every field of the setup but the start centre is the same for all stars of the batch.
    profileFitKernel<<<static_cast<unsigned>(dev.size()), psffit::kLmLanes, 0, dc.stream()>>>(
        setups[which[0]], dSamples.get(), dJobs.get(), dOut.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    std::vector<FitOutDevice> out(dev.size());
    dOut.download(out.data(), dev.size());
    dc.synchronize();
    for (std::size_t t = 0; t < dev.size(); ++t) {
        const std::size_t i = which[t];
        psffit::LmOutcome o;
        for (int k = 0; k < psffit::kLmParams; ++k)
            o.p[k] = out[t].p[k];
        o.chi2 = out[t].chi2;
        o.iterations = out[t].iterations;
        o.converged = (out[t].flags & 1) != 0;
        o.started = (out[t].flags & 2) != 0;
        results[i] = profileFitResult(jobs[i].start, o, dev[t].count, setups[i].nActive);
    }
    lastDeviceProfileFits += dev.size();
}

// ---- PSF photometry ----------------------------------------------------------------------------------

struct PsfGrid {
    const psfmath::EpsfCellView* cells = nullptr;
    int width = 0, height = 0, gridNx = 0, gridNy = 0;
};

struct PsfJob {
    double x, y, radius;
};

struct PsfOut {
    double flux, fluxErr;
    int ok, pad;
};

// The frame accessor of psfmath::fitFluxRewalk.
struct DeviceFrameAccess {
    const PsfPlanes& f;
    __device__ std::size_t at(int i, int j) const {
        return static_cast<std::size_t>(j) * static_cast<std::size_t>(f.width) + static_cast<std::size_t>(i);
    }
    __device__ bool inside(int i, int j) const { return i >= 0 && j >= 0 && i < f.width && j < f.height; }
    __device__ bool masked(int i, int j) const { return f.mask != nullptr && f.mask[at(i, j)] != 0; }
    __device__ double data(int i, int j) const { return f.image[at(i, j)]; }
    __device__ double level(int i, int j) const {
        return f.level ? static_cast<double>(f.level[at(i, j)]) : f.globalLevel;
    }
    __device__ double rms(int i, int j) const {
        return f.rms ? static_cast<double>(f.rms[at(i, j)]) : f.globalRms;
    }
};

__global__ void psfFluxKernel(PsfPlanes f, PsfGrid g, const PsfJob* __restrict__ jobs, int n,
                              bool fitBackground, double maxMaskedWeight, double gain,
                              PsfOut* __restrict__ out) {
    const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (k >= n) return;
    const PsfJob job = jobs[k];
    PsfOut o{0.0, 0.0, 0, 0};
    const psfmath::EpsfCellView* cells = g.cells;
    auto cellValue = [cells](int c, double dx, double dy) { return psfmath::cellValue(cells[c], dx, dy); };
    const bool ok =
        psfmath::fitFluxRewalk(DeviceFrameAccess{f}, cellValue, g.width, g.height, g.gridNx, g.gridNy, job.x,
                               job.y, job.radius, fitBackground, maxMaskedWeight, gain, o.flux, o.fluxErr);
    o.ok = ok ? 1 : 0;
    out[k] = o;
}

thread_local std::size_t lastDeviceFits = 0; // the calling thread's last call (test hook)


// The PSF photometry of res on the device; false (res unchanged) when the background is of a kind the
// kernel does not read.
bool measureOnDevice(PsfResult& res, const ImageView& image, const MaskView& mask,
                     const BackgroundResult& bkg, const Sources& sources, double gain,
                     const PsfParams& params, RunContext& ctx) {
    if (!psfReadsBackground(bkg, image.width, image.height)) return false;

    DeviceContext& dc = DeviceContext::of(ctx);
    StepLaps laps(StepTiming::Psf, "psf");
    const cudaStream_t s = dc.stream();
    const PsfPlanes f = psfPlanes(dc, image, mask, bkg);

    // ePSF cells: the images one after the other, their views pointing into the device copy.
    const int nCells = static_cast<int>(res.epsf.size());
    std::vector<std::size_t> offset(nCells + 1, 0);
    for (int c = 0; c < nCells; ++c)
        offset[c + 1] = offset[c] + static_cast<std::size_t>(res.epsf[c].image.pixelCount());
    std::vector<float> hostImages(offset[nCells]);
    for (int c = 0; c < nCells; ++c)
        if (res.epsf[c].image.pixelCount() > 0)
            std::memcpy(hostImages.data() + offset[c], res.epsf[c].image.data(),
                        sizeof(float) * res.epsf[c].image.pixelCount());
    DeviceBuffer<float> dImages(dc, hostImages.size());
    std::vector<psfmath::EpsfCellView> views(nCells);
    for (int c = 0; c < nCells; ++c) {
        const EpsfCell& e = res.epsf[c];
        views[c] = {dImages.get() + offset[c],
                    e.image.width(),
                    e.image.height(),
                    e.centreX,
                    e.centreY,
                    e.oversampling};
    }
    DeviceBuffer<psfmath::EpsfCellView> dViews(dc, views.size());
    dImages.upload(hostImages.data(), hostImages.size());
    dViews.upload(views.data(), views.size());
    PsfGrid g;
    g.cells = dViews.get();
    g.width = res.width;
    g.height = res.height;
    g.gridNx = nCells > 0 ? res.gridNx : 0;
    g.gridNy = nCells > 0 ? res.gridNy : 0;

    const std::size_t n = sources.size();
    std::vector<PsfJob> jobs(n);
    for (std::size_t k = 0; k < n; ++k)
        jobs[k] = {sources.x[k], sources.y[k], psfmath::fitRadius(params.psfFitRadius, res.fwhm[k])};
    DeviceBuffer<PsfJob> dJobs(dc, n);
    DeviceBuffer<PsfOut> dOut(dc, n);
    dJobs.upload(jobs.data(), n);
    laps.lap("PSF photometry: device inputs");

    const int threads = 128;
    const int blocks = static_cast<int>((n + threads - 1) / threads);
    psfFluxKernel<<<blocks, threads, 0, s>>>(f, g, dJobs.get(), static_cast<int>(n), params.psfFitBackground,
                                             params.maxMaskedPsfWeight, gain, dOut.get());
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
    std::vector<PsfOut> out(n);
    dOut.download(out.data(), n);
    dc.synchronize();
    laps.lap("PSF photometry: device fits");

    for (std::size_t k = 0; k < n; ++k) {
        if (out[k].ok) {
            res.fluxPsf[k] = out[k].flux;
            res.fluxPsfErr[k] = out[k].fluxErr;
        } else {
            res.flags[k] |= FlagPsfFitFailed;
        }
    }
    laps.lap("PSF photometry: results");
    lastDeviceFits = n;
    return true;
}

} // namespace

bool psfReadsBackground(const BackgroundResult& bkg, int width, int height) {
    const bool noMaps = bkg.level.empty() && bkg.rms.empty();
    const bool fromGrid = noMaps && bkg.sampler && hasBackgroundGrid(bkg, width, height);
    const bool globals = noMaps && !bkg.sampler;
    return bkg.hasFullMaps() || fromGrid || globals;
}

PsfPlanes psfPlanes(DeviceContext& dc, const ImageView& image, const MaskView& mask,
                    const BackgroundResult& bkg) {
    PsfPlanes f;
    const DeviceContext::DeviceFrame df = dc.frame(image, mask);
    f.image = df.pixels;
    f.mask = df.mask;
    f.width = image.width;
    f.height = image.height;
    f.globalLevel = bkg.globalLevel;
    f.globalRms = bkg.globalRms;
    const bool globals = bkg.level.empty() && bkg.rms.empty() && !bkg.sampler;
    if (!globals) {
        const auto maps = deviceBackgroundMaps(dc, bkg);
        f.level = maps.first;
        f.rms = maps.second;
    }
    return f;
}

PsfResult buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                        const Sources& sources, double gain, const PsfParams& params, RunContext& ctx) {
    lastDeviceFits = 0;
    lastDeviceProfileFits = 0;
    if (!ctx.tuning.psfOnDevice) return cpu::buildPsfModel(image, mask, bkg, sources, gain, params, ctx);
    DeviceContext& dc = DeviceContext::of(ctx);
    const ProfileFitBatch fitBatch = [&dc](const std::vector<ProfileFitJob>& jobs, PsfModelKind kind,
                                           const LmOptions& options, std::vector<ProfileFitResult>& results) {
        try {
            fitProfilesOnDevice(dc, jobs, kind, options, results);
        } catch (const DeviceOutOfMemory&) { // no room: the host's fits, the same bits
            dc.drain();
            for (std::size_t i = 0; i < jobs.size(); ++i)
                results[i] = fitProfile(*jobs[i].samples, kind, jobs[i].start, options);
        }
    };
    PsfParams hostParams = params;
    hostParams.psfPhotometry = false;
    const EpsfCellBatch epsfBatch = deviceEpsfCellBatch(ctx, image, mask, bkg);
    PsfResult res =
        cpu::buildPsfModel(image, mask, bkg, sources, gain, hostParams, ctx, nullptr, &fitBatch, &epsfBatch);
    if (!params.psfPhotometry) {
        ctx.checkCancelled();
        return res;
    }
    bool done = false;
    // Without a model every fit fails at once: the host loop only sets the flags.
    if (res.hasModel() && sources.size() > 0) {
        try {
            done = measureOnDevice(res, image, mask, bkg, sources, gain, params, ctx);
        } catch (const DeviceOutOfMemory&) {
            DeviceContext::of(ctx).drain();
            done = false;
        }
    }
    if (!done) {
        const PsfFrame frame{image, mask, &bkg, gain};
        measurePsfFluxes(res, frame, sources, params, ctx);
    }
    ctx.checkCancelled();
    return res;
}

std::size_t psfLastDeviceFits() {
    return lastDeviceFits;
}

std::size_t psfLastDeviceProfileFits() {
    return lastDeviceProfileFits;
}

} // namespace gpuphot::cuda
