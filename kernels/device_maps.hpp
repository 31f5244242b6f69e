#pragma once
// Background maps that stay on the device: the CUDA background stage with
// BackgroundParams::fullMaps = false (the pipeline's lean maps, both backends) interpolates the
// full-resolution level and rms maps on the device and keeps them in the DeviceContext, keyed by what
// determines them (frame size, mesh grid, spline kind), without downloading them; the host result keeps
// the mesh grid and its exact sampler (core/stages/background/background.hpp). The detection and aperture kernels
// find the maps here; when they are gone (another run, a budget that dropped them) they are interpolated
// again from the mesh grid: the same kernel on the same grid, so the same bits as the host maps.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace gpuphot {
struct BackgroundResult;
}

namespace gpuphot::cuda {

class DeviceContext;

// What determines the maps of a result without full host maps (empty when it has no mesh grid).
std::vector<std::uint8_t> backgroundSignature(const BackgroundResult& bkg);

// True when the maps can be made on the device from bkg's mesh grid (it has one, of the frame's size).
bool hasBackgroundGrid(const BackgroundResult& bkg, int width, int height);

// Full-resolution device maps (row stride = width) for bkg: its host maps when it has them (uploaded
// once, DeviceContext::background), else the stored device maps of its grid, else interpolated now from
// the grid and stored. Throws DeviceOutOfMemory when they do not fit.
std::pair<const float*, const float*> deviceBackgroundMaps(DeviceContext& dc, const BackgroundResult& bkg);

// Rows of the maps interpolated on the device into caller buffers (strip plans: a few rows at a time);
// the spline tables (a few MB) are uploaded once per object.
class DeviceBackgroundRows {
public:
    DeviceBackgroundRows(DeviceContext& dc, const BackgroundResult& bkg);
    ~DeviceBackgroundRows();
    DeviceBackgroundRows(const DeviceBackgroundRows&) = delete;
    DeviceBackgroundRows& operator=(const DeviceBackgroundRows&) = delete;
    // Rows [y0, y0 + rows) into level / rms (rows x width floats each), stream-ordered.
    void rows(int y0, int rows, float* level, float* rms);
    // Device bytes of the tables for a frame and mesh grid (planning).
    static std::size_t tableBytes(const BackgroundResult& bkg);

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

} // namespace gpuphot::cuda
