#include "core/model/segmentation_map.hpp"

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "core/util/errors.hpp"

namespace gpuphot {

// Double-checked materialisation (an atomic flag and a mutex) rather than std::call_once: the same
// "once, concurrent callers wait, a throwing attempt leaves it to the next call" semantics, without
// libstdc++'s history of call_once deadlocking after an exception on some targets (GCC PR 66146).
struct SegmentationMap::State {
    int width = 0, height = 0;
    std::shared_ptr<const DeferredImageSource> source;
    mutable std::mutex mutex;
    mutable std::atomic<bool> ready{false};
    mutable Image<std::int32_t> image;
};

SegmentationMap::SegmentationMap() : SegmentationMap(Image<std::int32_t>()) {}

SegmentationMap::SegmentationMap(Image<std::int32_t>&& host) : m_state(std::make_shared<State>()) {
    m_state->width = host.width();
    m_state->height = host.height();
    m_state->image = std::move(host);
    m_state->ready.store(true, std::memory_order_release);
}

SegmentationMap::SegmentationMap(int width, int height, std::shared_ptr<const DeferredImageSource> source)
    : m_state(std::make_shared<State>()) {
    if (width < 0 || height < 0)
        throw InvalidInput("segmentation map: negative size " + std::to_string(width) + "x" +
                           std::to_string(height));
    if (!source && width > 0 && height > 0)
        throw InvalidInput("segmentation map: a deferred map of " + std::to_string(width) + "x" +
                           std::to_string(height) + " px needs a source");
    m_state->width = width;
    m_state->height = height;
    m_state->source = std::move(source);
    if (width == 0 || height == 0) {
        m_state->image = Image<std::int32_t>(width, height, Image<std::int32_t>::NoInit{});
        m_state->ready.store(true, std::memory_order_release);
    }
}

int SegmentationMap::width() const {
    return m_state->width;
}
int SegmentationMap::height() const {
    return m_state->height;
}

const Image<std::int32_t>& SegmentationMap::host() const {
    State& s = *m_state;
    if (s.ready.load(std::memory_order_acquire)) return s.image;
    std::lock_guard lock(s.mutex);
    if (!s.ready.load(std::memory_order_relaxed)) {
        Image<std::int32_t> img(s.width, s.height, Image<std::int32_t>::NoInit{});
        s.source->download(img.data()); // throws: nothing changed, the next call tries again
        s.image = std::move(img);
        s.ready.store(true, std::memory_order_release);
    }
    return s.image;
}

bool SegmentationMap::isMaterialised() const {
    return m_state->ready.load(std::memory_order_acquire);
}

const std::shared_ptr<const DeferredImageSource>& SegmentationMap::source() const {
    return m_state->source;
}

} // namespace gpuphot
