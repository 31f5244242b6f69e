#pragma once
// Row-major 2-D images with an explicit stride. Image<T> owns its pixels (allocated without
// zero-filling when asked, so a 151-megapixel read is one pass; a frame's pixels and mask recycled
// through core/util/host_pool.hpp), ImageViewT<T> is a non-owning view (strips, tiles, stage inputs).
// Coordinates inside the code are 0-based, pixel centres at integers.
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "core/util/host_pool.hpp"

namespace gpuphot {

template <class T> struct ImageViewT {
    const T* data = nullptr;
    int width = 0;
    int height = 0;
    std::ptrdiff_t stride = 0; // elements between the starts of two rows
    // Allocation serial of the owning Image (Image::view() sets it; 0: unknown, e.g. a view of foreign
    // memory). The device caches key on it, so a new image that reuses a freed one's address and differs
    // from it in a few pixels is never taken for it.
    std::uint64_t serial = 0;

    const T& operator()(int x, int y) const { return data[static_cast<std::ptrdiff_t>(y) * stride + x]; }
    const T* row(int y) const { return data + static_cast<std::ptrdiff_t>(y) * stride; }
    std::size_t pixelCount() const { return static_cast<std::size_t>(width) * static_cast<std::size_t>(height); }
    bool empty() const { return width <= 0 || height <= 0 || data == nullptr; }
    // Rows [y0, y0+h) as a view of the same pixels.
    ImageViewT strip(int y0, int h) const { return {row(y0), width, h, stride, serial}; }
};

using ImageView = ImageViewT<float>;
using MaskView = ImageViewT<std::uint8_t>;

// Bits of the per-pixel mask carried by Frame.
enum MaskBits : std::uint8_t {
    MaskBad = 1,        // bad-pixel map, BLANK, user mask
    MaskNonFinite = 2,  // NaN or Inf in the data
    MaskSaturated = 4,  // at or above the saturation level
    MaskCosmicRay = 8,  // cosmic-ray hit (frame preparation)
    MaskOutside = 16,   // outside the valid data section
};

// A process-wide serial for every allocation of image pixels (never 0).
inline std::uint64_t nextImageSerial() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

template <class T> class Image {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

public:
    struct NoInit {};
    // Pixels from the pool of large buffers, and given back to it (core/util/host_pool.hpp): for the
    // images made again and again at one size and kept to the end of a frame's reduction (its pixels and
    // mask), whose next allocation then finds its pages resident. Not for a stage's working images: a
    // kept buffer that is not asked for again would add to the peak of the frame that freed it.
    struct Recycled {};

    Image() = default;
    Image(int width, int height, T fill = T{}) : Image(width, height, NoInit{}) {
        std::fill(m_data.get(), m_data.get() + pixelCount(), fill);
    }
    // Allocates without initialising: the caller overwrites every pixel.
    Image(int width, int height, NoInit) : Image(width, height, Source{false}) {}
    // As NoInit, the pixels from the pool.
    Image(int width, int height, Recycled) : Image(width, height, Source{true}) {}
    // A copy of an image without pixels (empty, or dropped: dropPixels) has none either, only the size.
    Image(const Image& o) : m_width(o.m_width), m_height(o.m_height) {
        if (!o.m_data) return;
        m_data = allocate(pixelCount(), false);
        m_serial = nextImageSerial();
        std::copy(o.m_data.get(), o.m_data.get() + pixelCount(), m_data.get());
    }
    Image& operator=(const Image& o) {
        if (this != &o) *this = Image(o);
        return *this;
    }
    Image(Image&&) noexcept = default;
    Image& operator=(Image&&) noexcept = default;

    int width() const { return m_width; }
    int height() const { return m_height; }
    std::ptrdiff_t stride() const { return m_width; }
    std::size_t pixelCount() const { return static_cast<std::size_t>(m_width) * static_cast<std::size_t>(m_height); }
    bool empty() const { return pixelCount() == 0; }

    T* data() { return m_data.get(); }
    const T* data() const { return m_data.get(); }
    T* row(int y) { return m_data.get() + static_cast<std::ptrdiff_t>(y) * m_width; }
    const T* row(int y) const { return m_data.get() + static_cast<std::ptrdiff_t>(y) * m_width; }
    T& operator()(int x, int y) { return row(y)[x]; }
    const T& operator()(int x, int y) const { return row(y)[x]; }

    ImageViewT<T> view() const { return {m_data.get(), m_width, m_height, m_width, m_serial}; }
    // Frees the pixels but keeps the size (Frame::dropPixels): data() is null afterwards. Only for an image
    // whose later readers take its size alone; the size itself is not written, so a thread reading it
    // meanwhile is not disturbed.
    void dropPixels() noexcept { m_data.reset(); }
    std::uint64_t serial() const { return m_serial; } // changes with every allocation, not with writes

    // An image of the size of `from` over its pixels (elements of T's size), `from` left empty: a working
    // image's resident pages taken over by the next one instead of being freed and faulted in again. The
    // pixels are left as they are (as NoInit).
    template <class U> static Image takeOver(Image<U>&& from) {
        static_assert(sizeof(U) == sizeof(T) && alignof(U) == alignof(T));
        Image out;
        const std::size_t bytes = from.m_data.get_deleter().bytes;
        out.m_data = Pixels(reinterpret_cast<T*>(from.m_data.release()), Release{bytes});
        out.m_width = std::exchange(from.m_width, 0);
        out.m_height = std::exchange(from.m_height, 0);
        out.m_serial = nextImageSerial();
        return out;
    }

private:
    template <class> friend class Image;

    struct Release {
        std::size_t bytes = 0; // pooled pixels: their size; 0: from operator new[]
        void operator()(T* p) const noexcept {
            if (bytes)
                hostpool::release(p, bytes);
            else
                ::operator delete[](p);
        }
    };
    using Pixels = std::unique_ptr<T[], Release>;

    struct Source {
        bool pooled;
    };
    Image(int width, int height, Source from)
        : m_data(allocate(static_cast<std::size_t>(width) * static_cast<std::size_t>(height), from.pooled)),
          m_width(width), m_height(height), m_serial(nextImageSerial()) {
        assert(width >= 0 && height >= 0);
    }
    static Pixels allocate(std::size_t n, bool pooled) {
        const std::size_t bytes = std::max<std::size_t>(n * sizeof(T), 1);
        if (pooled) return Pixels(static_cast<T*>(hostpool::allocate(bytes)), Release{bytes});
        return Pixels(static_cast<T*>(::operator new[](bytes)), Release{0});
    }

    Pixels m_data;
    int m_width = 0;
    int m_height = 0;
    std::uint64_t m_serial = 0;
};

} // namespace gpuphot
