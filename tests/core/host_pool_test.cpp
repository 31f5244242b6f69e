// core/util/host_pool: large buffers given back are handed to the next request of the same size, within
// the capacity (oldest evicted first); small ones are never kept; a Recycled Image<T> allocates through it
// (a reused buffer still a new image: a new serial), other images do not; readFrame's pixels and mask are
// recycled; Image<T>::takeOver moves a buffer between element types and gives it back as it came.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/io/fits_image.hpp"
#include "core/model/header.hpp"
#include "core/model/image.hpp"
#include "core/util/host_pool.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;

namespace {

constexpr std::size_t kBig = hostpool::kMinPooledBytes;

struct Tmp : test::TempDir {
    Tmp() : test::TempDir("gpuphot_host_pool_test") {}
    std::string file(const std::string& n) const { return (path / n).string(); }
};

// A float frame whose pixel (x, y) is x + y * w.
void writeFloatFrame(const std::string& path, int w, int h) {
    Image<float> im(w, h, Image<float>::NoInit{});
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            im(x, y) = static_cast<float>(x + y * w);
    writeFitsImage(path, im.view(), Header{});
}

// Restores the capacity and empties the pool around each test.
class HostPool : public ::testing::Test {
protected:
    void SetUp() override {
        m_capacity = hostpool::stats().capacity;
        if (m_capacity == 0) GTEST_SKIP() << "the pool keeps nothing here (AddressSanitizer)";
        hostpool::trim();
    }
    void TearDown() override {
        hostpool::setCapacity(m_capacity);
        hostpool::trim();
    }
    std::size_t m_capacity = 0;
};

} // namespace

TEST_F(HostPool, SameSizeIsReusedOtherSizesAreNot) {
    hostpool::setCapacity(8 * kBig);
    void* a = hostpool::allocate(kBig);
    std::memset(a, 1, kBig);
    hostpool::release(a, kBig);
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u);
    EXPECT_EQ(hostpool::stats().keptBytes, kBig);

    const std::size_t reused = hostpool::stats().reused;
    void* other = hostpool::allocate(kBig + 4096); // another size: a fresh buffer, the kept one stays
    EXPECT_NE(other, a);
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u);
    void* b = hostpool::allocate(kBig);
    EXPECT_EQ(b, a);
    EXPECT_EQ(hostpool::stats().reused, reused + 1);
    EXPECT_EQ(hostpool::stats().keptBuffers, 0u);
    hostpool::release(b, kBig);
    hostpool::release(other, kBig + 4096);
    EXPECT_EQ(hostpool::stats().keptBuffers, 2u);
}

TEST_F(HostPool, SmallBuffersAreNeverKept) {
    void* p = hostpool::allocate(kBig - 1);
    hostpool::release(p, kBig - 1);
    EXPECT_EQ(hostpool::stats().keptBuffers, 0u);
}

TEST_F(HostPool, CapacityEvictsTheOldestFirst) {
    hostpool::setCapacity(2 * kBig + kBig / 2); // room for two
    void* first = hostpool::allocate(kBig);
    void* second = hostpool::allocate(kBig);
    void* third = hostpool::allocate(kBig);
    hostpool::release(first, kBig);
    hostpool::release(second, kBig);
    hostpool::release(third, kBig);
    EXPECT_EQ(hostpool::stats().keptBuffers, 2u);
    EXPECT_LE(hostpool::stats().keptBytes, hostpool::stats().capacity);
    // The most recently given back first; `first` was evicted.
    void* x = hostpool::allocate(kBig);
    void* y = hostpool::allocate(kBig);
    EXPECT_EQ(x, third);
    EXPECT_EQ(y, second);
    hostpool::release(x, kBig);
    hostpool::release(y, kBig);

    hostpool::setCapacity(kBig); // lowering it frees what is over
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u);
    hostpool::setCapacity(0);
    EXPECT_EQ(hostpool::stats().keptBuffers, 0u);
    void* z = hostpool::allocate(kBig);
    hostpool::release(z, kBig); // nothing fits a zero capacity
    EXPECT_EQ(hostpool::stats().keptBuffers, 0u);
}

TEST_F(HostPool, RecycledImagesReuseAFreedImagesPixelsUnderANewSerial) {
    hostpool::setCapacity(8 * kBig);
    const int w = 2048, h = static_cast<int>(kBig / sizeof(float) / 2048); // exactly kBig bytes
    const float* pixels = nullptr;
    std::uint64_t serial = 0;
    {
        Image<float> a(w, h, Image<float>::Recycled{});
        pixels = a.data();
        serial = a.serial();
        a(3, 4) = 7.0f;
    }
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u);
    {
        Image<float> plain(w, h, 0.5f); // not recycled: the kept buffer stays
        EXPECT_NE(plain.data(), pixels);
        EXPECT_EQ(hostpool::stats().keptBuffers, 1u);
    }
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u); // nor is it kept when freed
    Image<float> b(w, h, Image<float>::Recycled{});
    EXPECT_EQ(b.data(), pixels);
    EXPECT_NE(b.serial(), serial);
    Image<float> c = b; // a copy is its own buffer, not from the pool
    EXPECT_NE(c.data(), b.data());
    Image<float> moved = std::move(b);
    EXPECT_EQ(moved.data(), pixels);
}

TEST_F(HostPool, TakeOverMovesThePixelsToAnotherTypeAndGivesThemBackAsTheyCame) {
    hostpool::setCapacity(8 * kBig);
    const int w = 2048, h = static_cast<int>(kBig / sizeof(float) / 2048); // exactly kBig bytes
    Image<float> plain(w, h, 1.0f);
    const void* plainPixels = plain.data();
    const std::uint64_t plainSerial = plain.serial();
    Image<std::int32_t> labels = Image<std::int32_t>::takeOver(std::move(plain));
    EXPECT_EQ(static_cast<const void*>(labels.data()), plainPixels);
    EXPECT_EQ(labels.width(), w);
    EXPECT_EQ(labels.height(), h);
    EXPECT_NE(labels.serial(), plainSerial);
    EXPECT_TRUE(plain.empty());
    EXPECT_EQ(plain.data(), nullptr);
    labels(w - 1, h - 1) = 42;
    EXPECT_EQ(labels(w - 1, h - 1), 42);
    labels = Image<std::int32_t>(); // an operator new buffer: freed, not kept
    EXPECT_EQ(hostpool::stats().keptBuffers, 0u);

    Image<float> recycled(w, h, Image<float>::Recycled{});
    const void* recycledPixels = recycled.data();
    {
        Image<std::uint32_t> taken = Image<std::uint32_t>::takeOver(std::move(recycled));
        EXPECT_EQ(static_cast<const void*>(taken.data()), recycledPixels);
    }
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u); // back in the pool, as a Recycled image's would be
    Image<float> again(w, h, Image<float>::Recycled{});
    EXPECT_EQ(static_cast<const void*>(again.data()), recycledPixels);
}

// A frame whose pixels were dropped after its stages gives them back to the pool at once (the next frame's
// read takes them) and keeps its size; a copy of it is a dropped frame of that size too.
TEST_F(HostPool, DroppedPixelsGoBackToThePoolAndTheSizeStays) {
    hostpool::setCapacity(8 * kBig);
    Tmp t;
    const std::string p = t.file("big.fits");
    const int w = 2048, h = 2048;
    writeFloatFrame(p, w, h);
    Frame f = readFrame(p);
    const float* pixels = f.pixels.data();
    ASSERT_TRUE(f.hasPixels());
    f.dropPixels();
    EXPECT_FALSE(f.hasPixels());
    EXPECT_EQ(f.mask.data(), nullptr);
    EXPECT_EQ(f.width(), w);
    EXPECT_EQ(f.height(), h);
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u);
    const Frame copy = f;
    EXPECT_FALSE(copy.hasPixels());
    EXPECT_EQ(copy.width(), w);
    EXPECT_EQ(copy.height(), h);
    const Frame next = readFrame(p);
    EXPECT_EQ(next.pixels.data(), pixels);
    EXPECT_EQ(next.pixels(5, 7), 5.0f + 7.0f * w);
}

TEST_F(HostPool, AFramesPixelsAndMaskAreRecycled) {
    hostpool::setCapacity(8 * kBig);
    Tmp t;
    const std::string p = t.file("big.fits");
    const int w = 2048, h = 2048; // pixels 16 MiB, mask 4 MiB (not pooled: under kMinPooledBytes)
    writeFloatFrame(p, w, h);
    const float* pixels = nullptr;
    {
        const Frame f = readFrame(p);
        pixels = f.pixels.data();
    }
    EXPECT_EQ(hostpool::stats().keptBuffers, 1u);
    const Frame again = readFrame(p);
    EXPECT_EQ(again.pixels.data(), pixels);
    EXPECT_EQ(again.pixels(5, 7), 5.0f + 7.0f * w);
}
