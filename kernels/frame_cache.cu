// FrameCache: the frame and the background maps kept on the device, keyed by their host views.
#include "kernels/frame_cache.hpp"

#include <algorithm>

namespace gpuphot::cuda {
namespace {

template <class T>
void uploadView(DeviceContext& dc, DeviceBuffer<T>& dst, const ImageViewT<T>& v, cudaStream_t s) {
    if (v.stride == v.width) {
        dc.uploadStaged(dst.get(), v.data, sizeof(T) * static_cast<std::size_t>(v.width) * v.height);
    } else {
        GPUPHOT_CUDA_CHECK(cudaMemcpy2DAsync(dst.get(), sizeof(T) * v.width, v.data, sizeof(T) * v.stride,
                                             sizeof(T) * v.width, v.height, cudaMemcpyHostToDevice, s));
    }
}

} // namespace

template <class T> ViewKey viewKey(const ImageViewT<T>& v, std::uint64_t generation) {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&h](const void* p, std::size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (std::size_t i = 0; i < n; ++i) {
            h ^= b[i];
            h *= 1099511628211ull;
        }
    };
    if (!v.empty()) {
        const int sy = std::max(1, v.height / 64), sx = std::max(1, v.width / 64);
        for (int y = 0; y < v.height; y += sy)
            for (int x = (y * 7) % sx; x < v.width; x += sx)
                mix(&v(x, y), sizeof(T));
        mix(&v(v.width - 1, v.height - 1), sizeof(T));
        mix(&v(0, v.height - 1), sizeof(T));
        mix(&v(v.width - 1, 0), sizeof(T));
    }
    return {v.data, v.width, v.height, v.stride, generation, h, v.serial};
}
template ViewKey viewKey<float>(const ImageViewT<float>&, std::uint64_t);
template ViewKey viewKey<std::uint8_t>(const ImageViewT<std::uint8_t>&, std::uint64_t);
template ViewKey viewKey<std::int32_t>(const ImageViewT<std::int32_t>&, std::uint64_t);

DeviceFrame FrameCache::frame(const ImageView& image, const MaskView& mask) {
    const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
    const ViewKey pk = viewKey(image, m_generation);
    if (!(pk == m_pixelsKey) || m_pixels.size() != n) {
        m_readFrame = false;
        m_pixelsKey = {};
        m_pixels.reset();
        m_mask.reset();
        m_maskKey = {};
        m_pixels = DeviceBuffer<float>(m_dc, n);
        uploadView(m_dc, m_pixels, image, m_dc.stream());
        m_pixelsKey = pk;
        ++m_uploads;
    }
    if (mask.empty()) {
        m_mask.reset();
        m_maskKey = {};
    } else {
        const ViewKey mk = viewKey(mask, m_generation);
        if (!(mk == m_maskKey) || m_mask.size() != n) {
            m_readFrame = false;
            m_maskKey = {};
            m_mask.reset();
            m_mask = DeviceBuffer<std::uint8_t>(m_dc, n);
            uploadView(m_dc, m_mask, mask, m_dc.stream());
            m_maskKey = mk;
        }
    }
    return {m_pixels.get(), mask.empty() ? nullptr : m_mask.get(), image.width, image.height};
}

void FrameCache::adopt(const ImageView& image, const MaskView& mask, DeviceBuffer<float>&& pixels,
                       DeviceBuffer<std::uint8_t>&& maskBuffer) {
    m_readFrame = false;
    m_pixels = std::move(pixels);
    m_pixelsKey = viewKey(image, m_generation);
    if (mask.empty()) {
        m_mask.reset();
        m_maskKey = {};
    } else {
        m_mask = std::move(maskBuffer);
        m_maskKey = viewKey(mask, m_generation);
    }
}

std::pair<DeviceBuffer<float>, DeviceBuffer<std::uint8_t>> FrameCache::take(const ImageView& image,
                                                                            const MaskView& mask) {
    frame(image, mask);
    std::pair<DeviceBuffer<float>, DeviceBuffer<std::uint8_t>> out(std::move(m_pixels), std::move(m_mask));
    m_pixelsKey = {};
    m_maskKey = {};
    return out;
}

void FrameCache::settleRead(bool pixelsChanged, bool maskChanged) {
    if (!m_readFrame) return;
    if (pixelsChanged) {
        drop();
    } else if (maskChanged) {
        m_mask.reset();
        m_maskKey = {};
    }
}

void FrameCache::drop() {
    m_readFrame = false;
    m_pixels.reset();
    m_mask.reset();
    m_pixelsKey = {};
    m_maskKey = {};
}

void FrameCache::storeBackground(const Image<float>& level, const Image<float>& rms,
                                 DeviceBuffer<float>&& dLevel, DeviceBuffer<float>&& dRms) {
    m_level = std::move(dLevel);
    m_rms = std::move(dRms);
    m_levelKey = viewKey(level.view(), 0);
    m_rmsKey = viewKey(rms.view(), 0);
    m_gridSignature.clear();
}

void FrameCache::storeBackground(std::vector<std::uint8_t> signature, DeviceBuffer<float>&& dLevel,
                                 DeviceBuffer<float>&& dRms) {
    m_level = std::move(dLevel);
    m_rms = std::move(dRms);
    m_levelKey = {};
    m_rmsKey = {};
    m_gridSignature = std::move(signature);
}

std::pair<const float*, const float*>
FrameCache::findBackground(const std::vector<std::uint8_t>& signature) const {
    if (signature.empty() || m_gridSignature != signature || !m_level.get() || !m_rms.get())
        return {nullptr, nullptr};
    return {m_level.get(), m_rms.get()};
}

std::pair<const float*, const float*> FrameCache::background(const Image<float>& level,
                                                             const Image<float>& rms) {
    const std::size_t n = static_cast<std::size_t>(level.width()) * level.height();
    const ViewKey lk = viewKey(level.view(), 0), rk = viewKey(rms.view(), 0);
    if (!(lk == m_levelKey) || m_level.size() != n || !m_gridSignature.empty()) {
        m_gridSignature.clear();
        m_rmsKey = {};
        m_rms.reset();
        m_levelKey = {};
        m_level.reset();
        m_level = DeviceBuffer<float>(m_dc, n);
        m_dc.uploadStaged(m_level.get(), level.data(), n * sizeof(float));
        m_levelKey = lk;
    }
    if (!(rk == m_rmsKey) || m_rms.size() != n) {
        m_rmsKey = {};
        m_rms.reset();
        m_rms = DeviceBuffer<float>(m_dc, n);
        m_dc.uploadStaged(m_rms.get(), rms.data(), n * sizeof(float));
        m_rmsKey = rk;
    }
    return {m_level.get(), m_rms.get()};
}

void FrameCache::dropBackground() {
    m_level.reset();
    m_rms.reset();
    m_levelKey = {};
    m_rmsKey = {};
    m_gridSignature.clear();
}

} // namespace gpuphot::cuda
