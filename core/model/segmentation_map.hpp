#pragma once
// The detection stage's segmentation map (0 = no object, else the segmentId of the owning object),
// immutable and shared: a copy of a SegmentationMap (of a DetectionResult, a PipelineResult, a workbench
// snapshot) shares the pixels, so it costs O(1) instead of 4 B/px (0.45 s at 151 MP).
//
// Two kinds:
//   - host-backed: made from an Image (the CPU detection, the CUDA strips plan);
//   - deferred: only the size and a DeferredImageSource that can produce the pixels (the CUDA detection:
//     the map stays in device memory, kernels/detection/detection_finish.hpp). host() downloads it once, on first
//     use, from any thread; a backend that can use the source directly (the CUDA aperture stage reads the
//     device buffer) never materialises it.
// core/ knows nothing of the source's backend: kernels/ subclasses DeferredImageSource.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/model/image.hpp"

namespace gpuphot {

// Produces the pixels of a deferred map. download may be called from any thread, more than once (each
// SegmentationMap state calls it at most once per successful materialisation; a failed call may be
// retried); it throws on failure (the map's host() rethrows).
class DeferredImageSource {
public:
    virtual ~DeferredImageSource() = default;
    // Writes width * height pixels, row stride = width.
    virtual void download(std::int32_t* dst) const = 0;
};

class SegmentationMap {
public:
    SegmentationMap(); // empty (0 x 0), host-backed
    explicit SegmentationMap(Image<std::int32_t>&& host);
    // Deferred: width x height pixels that source produces on demand. Throws InvalidInput for a null
    // source with a non-empty size or negative sizes.
    SegmentationMap(int width, int height, std::shared_ptr<const DeferredImageSource> source);

    int width() const;
    int height() const;
    std::size_t pixelCount() const {
        return static_cast<std::size_t>(width()) * static_cast<std::size_t>(height());
    }
    bool empty() const { return pixelCount() == 0; }

    // The host pixels, materialised on the first call (thread-safe: concurrent first calls download once;
    // a failed download rethrows its exception and the next call tries again). The reference stays valid
    // as long as any copy of this map lives.
    const Image<std::int32_t>& host() const;
    ImageViewT<std::int32_t> view() const { return host().view(); }
    const std::int32_t* data() const { return host().data(); }
    const std::int32_t& operator()(int x, int y) const { return host()(x, y); }

    // True when host() returns without downloading (host-backed, or materialised already).
    bool isMaterialised() const;
    // The deferred map's source (null for a host-backed map), for a backend that reads it directly.
    const std::shared_ptr<const DeferredImageSource>& source() const;
    // Copies of one map share its state (tests: the copy is O(1)).
    bool sharesStateWith(const SegmentationMap& o) const { return m_state == o.m_state; }

private:
    struct State;
    std::shared_ptr<State> m_state;
};

} // namespace gpuphot
