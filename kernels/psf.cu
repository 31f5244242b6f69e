// CUDA PSF stage (issue 5): the PSF photometry (one weighted linear flux fit per source on the local ePSF)
// on the device; the rest of the stage (selection, profile fits, spatial model, ePSF cells) is the host's
// cpu::buildPsfModel, unchanged. One thread per source runs core/stages/psf_flux_math.hpp, the arithmetic
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
#include "core/stages/background.hpp"
#include "core/stages/psf.hpp"
#include "core/stages/psf_epsf.hpp"
#include "core/stages/psf_flux_math.hpp"
#include "core/util/step_timer.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"

namespace gpuphot::cuda {

namespace {

// The frame as the kernel reads it (row stride = width for every plane); level / rms null: the globals.
struct PsfPlanes {
    const float* image = nullptr;
    const std::uint8_t* mask = nullptr; // null: no mask
    const float* level = nullptr;
    const float* rms = nullptr;
    double globalLevel = 0.0, globalRms = 0.0;
    int width = 0, height = 0;
};

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

bool deviceSwitchOn() {
    const char* e = std::getenv("GPUPHOT_PSF_DEVICE");
    return !(e && std::strcmp(e, "0") == 0);
}

// The PSF photometry of res on the device; false (res unchanged) when the background is of a kind the
// kernel does not read.
bool measureOnDevice(PsfResult& res, const ImageView& image, const MaskView& mask,
                     const BackgroundResult& bkg, const Sources& sources, double gain,
                     const PsfParams& params, RunContext& ctx) {
    const bool noMaps = bkg.level.empty() && bkg.rms.empty();
    const bool fromGrid = noMaps && bkg.sampler && hasBackgroundGrid(bkg, image.width, image.height);
    const bool globals = noMaps && !bkg.sampler;
    if (!bkg.hasFullMaps() && !fromGrid && !globals) return false;

    DeviceContext& dc = DeviceContext::of(ctx);
    StepLaps laps("GPUPHOT_PSF_TIMING", "psf");
    const cudaStream_t s = dc.stream();
    PsfPlanes f;
    const DeviceContext::DeviceFrame df = dc.frame(image, mask);
    f.image = df.pixels;
    f.mask = df.mask;
    f.width = image.width;
    f.height = image.height;
    f.globalLevel = bkg.globalLevel;
    f.globalRms = bkg.globalRms;
    if (!globals) {
        const auto maps = deviceBackgroundMaps(dc, bkg);
        f.level = maps.first;
        f.rms = maps.second;
    }

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

PsfResult buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                        const Sources& sources, double gain, const PsfParams& params, RunContext& ctx) {
    lastDeviceFits = 0;
    if (!params.psfPhotometry || !deviceSwitchOn())
        return cpu::buildPsfModel(image, mask, bkg, sources, gain, params, ctx);
    PsfParams hostParams = params;
    hostParams.psfPhotometry = false;
    PsfResult res = cpu::buildPsfModel(image, mask, bkg, sources, gain, hostParams, ctx);
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

} // namespace gpuphot::cuda
