#pragma once
// The device copies a DeviceContext keeps between stages and between runs (docs/ARCHITECTURE.md, GPU memory
// model): the frame (pixels, mask) and the background maps, each keyed by the ViewKey of the host views they
// hold, allocated from the context's pool (they count in its budget).
#include <cstdint>
#include <utility>
#include <vector>

#include "core/model/image.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

class FrameCache {
public:
    explicit FrameCache(DeviceContext& dc) : m_dc(dc) {}
    FrameCache(const FrameCache&) = delete;
    FrameCache& operator=(const FrameCache&) = delete;

    // ---- the frame -----------------------------------------------------------------------------------
    // The frame's pixels (and mask, null when the view is empty) on the device, row stride = width,
    // uploaded only when (host pointer, size, stride, generation, a sampled fingerprint) changed.
    DeviceFrame frame(const ImageView& image, const MaskView& mask);
    // Takes device copies that already hold these host views' values as the cached frame.
    void adopt(const ImageView& image, const MaskView& mask, DeviceBuffer<float>&& pixels,
               DeviceBuffer<std::uint8_t>&& maskBuffer);
    // The cached copies of these host views, moved out (uploaded first when they are not the cached ones;
    // mask: null when the view is empty). The cache holds no frame until the next adopt or frame.
    std::pair<DeviceBuffer<float>, DeviceBuffer<std::uint8_t>> take(const ImageView& image,
                                                                    const MaskView& mask);
    // The cached frame was adopted from the read phase's raw upload and nothing replaced or re-uploaded it
    // since: settleRead drops what the host changed in place.
    void markRead() { m_readFrame = true; }
    bool holdsRead() const { return m_readFrame; }
    void settleRead(bool pixelsChanged, bool maskChanged);
    void drop(); // pixels and mask
    // After a frame's pixels changed in place (same buffer): the next frame() re-uploads.
    void bumpGeneration() { ++m_generation; }
    std::uint64_t uploads() const { return m_uploads; } // frame uploads so far
    std::size_t frameBytes() const { return m_pixels.bytes() + m_mask.bytes(); }

    // ---- the background maps -------------------------------------------------------------------------
    // Maps stored with the host maps they hold (the CUDA background stage's result).
    void storeBackground(const Image<float>& level, const Image<float>& rms, DeviceBuffer<float>&& dLevel,
                         DeviceBuffer<float>&& dRms);
    // Device maps for these host maps (uploaded when they are not the stored ones).
    std::pair<const float*, const float*> background(const Image<float>& level, const Image<float>& rms);
    // Maps kept on the device only, stored under a signature of what determines them; findBackground gives
    // {nullptr, nullptr} when the stored maps have another signature.
    void storeBackground(std::vector<std::uint8_t> signature, DeviceBuffer<float>&& dLevel,
                         DeviceBuffer<float>&& dRms);
    std::pair<const float*, const float*> findBackground(const std::vector<std::uint8_t>& signature) const;
    void dropBackground();
    std::size_t backgroundBytes() const { return m_level.bytes() + m_rms.bytes(); }

private:
    DeviceContext& m_dc;
    ViewKey m_pixelsKey, m_maskKey;
    DeviceBuffer<float> m_pixels;
    DeviceBuffer<std::uint8_t> m_mask;
    ViewKey m_levelKey, m_rmsKey;
    std::vector<std::uint8_t> m_gridSignature; // maps kept on the device only (empty: keyed by host maps)
    DeviceBuffer<float> m_level, m_rms;
    std::uint64_t m_generation = 0;
    std::uint64_t m_uploads = 0;
    bool m_readFrame = false;
};

} // namespace gpuphot::cuda
