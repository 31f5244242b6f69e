// SegmentationMap (core/model/segmentation_map.hpp): host-backed and deferred maps, one download however
// many threads ask at once, a failed download rethrown and retried, copies sharing the pixels (the
// DetectionResult and PipelineResult copies of the workbench).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/model/segmentation_map.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

// An independent pattern: pixel (x, y) = (x * 7 + y * 13) % 5, 0 for a quarter of the pixels or so.
std::int32_t pattern(int x, int y) {
    return (x * 7 + y * 13) % 5;
}

Image<std::int32_t> patternImage(int w, int h) {
    Image<std::int32_t> img(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img(x, y) = pattern(x, y);
    return img;
}

// Writes the pattern, counting calls; fails the first `failures` calls; waits `delayMs` inside (so that
// concurrent callers overlap).
class CountingSource final : public DeferredImageSource {
public:
    CountingSource(int w, int h, int failures = 0, int delayMs = 0)
        : m_w(w), m_h(h), m_failures(failures), m_delayMs(delayMs) {}
    void download(std::int32_t* dst) const override {
        const int call = m_calls.fetch_add(1) + 1;
        if (m_delayMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(m_delayMs));
        if (call <= m_failures) throw IoError("counting source: download " + std::to_string(call) + " fails");
        for (int y = 0; y < m_h; ++y)
            for (int x = 0; x < m_w; ++x)
                dst[static_cast<std::size_t>(y) * m_w + x] = pattern(x, y);
    }
    int calls() const { return m_calls.load(); }

private:
    int m_w, m_h, m_failures, m_delayMs;
    mutable std::atomic<int> m_calls{0};
};

void expectPattern(const SegmentationMap& m, int w, int h) {
    ASSERT_EQ(m.width(), w);
    ASSERT_EQ(m.height(), h);
    const ImageViewT<std::int32_t> v = m.view();
    ASSERT_EQ(v.width, w);
    ASSERT_EQ(v.height, h);
    int bad = 0;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            bad += v(x, y) != pattern(x, y) || m(x, y) != pattern(x, y);
    EXPECT_EQ(bad, 0);
}

TEST(SegmentationMap, DefaultIsEmptyAndMaterialised) {
    const SegmentationMap m;
    EXPECT_TRUE(m.empty());
    EXPECT_EQ(m.pixelCount(), 0u);
    EXPECT_TRUE(m.isMaterialised());
    EXPECT_EQ(m.source(), nullptr);
    EXPECT_TRUE(m.view().empty());
}

TEST(SegmentationMap, HostBackedKeepsTheImagesPixels) {
    Image<std::int32_t> img = patternImage(37, 23);
    const std::int32_t* pixels = img.data();
    const SegmentationMap m(std::move(img));
    EXPECT_TRUE(m.isMaterialised());
    EXPECT_EQ(m.source(), nullptr);
    EXPECT_EQ(m.data(), pixels); // moved, not copied
    EXPECT_EQ(m.pixelCount(), 37u * 23u);
    expectPattern(m, 37, 23);
}

TEST(SegmentationMap, DeferredDownloadsOnFirstUseOnly) {
    auto src = std::make_shared<CountingSource>(41, 19);
    const SegmentationMap m(41, 19, src);
    EXPECT_FALSE(m.isMaterialised());
    EXPECT_EQ(m.width(), 41); // the size needs no download
    EXPECT_EQ(m.height(), 19);
    EXPECT_FALSE(m.empty());
    EXPECT_EQ(m.source().get(), src.get());
    EXPECT_EQ(src->calls(), 0);
    expectPattern(m, 41, 19);
    EXPECT_TRUE(m.isMaterialised());
    EXPECT_EQ(src->calls(), 1);
    const std::int32_t* first = m.data();
    expectPattern(m, 41, 19);
    EXPECT_EQ(m.data(), first);
    EXPECT_EQ(src->calls(), 1);
}

TEST(SegmentationMap, CopiesShareOneState) {
    auto src = std::make_shared<CountingSource>(16, 9);
    const SegmentationMap a(16, 9, src);
    const SegmentationMap b = a; // before materialisation
    SegmentationMap c;
    c = b;
    EXPECT_TRUE(a.sharesStateWith(b));
    EXPECT_TRUE(a.sharesStateWith(c));
    EXPECT_EQ(&c.host(), &a.host()); // one image
    EXPECT_TRUE(b.isMaterialised());
    EXPECT_EQ(src->calls(), 1);
    const SegmentationMap d = a; // after
    EXPECT_EQ(d.data(), a.data());
    EXPECT_FALSE(a.sharesStateWith(SegmentationMap(16, 9, src)));
}

TEST(SegmentationMap, ConcurrentFirstCallsDownloadOnce) {
    for (int round = 0; round < 3; ++round) {
        auto src = std::make_shared<CountingSource>(64, 48, 0, 20);
        const SegmentationMap m(64, 48, src);
        constexpr int kThreads = 8;
        std::atomic<int> ready{0};
        std::vector<const Image<std::int32_t>*> seen(kThreads, nullptr);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t)
            threads.emplace_back([&, t, copy = m] {
                ready.fetch_add(1);
                while (ready.load() < kThreads)
                    std::this_thread::yield();
                seen[t] = &copy.host();
            });
        for (auto& t : threads)
            t.join();
        EXPECT_EQ(src->calls(), 1);
        for (const auto* p : seen)
            EXPECT_EQ(p, &m.host());
        expectPattern(m, 64, 48);
    }
}

TEST(SegmentationMap, FailedDownloadRethrowsAndRetries) {
    auto src = std::make_shared<CountingSource>(12, 10, 2);
    const SegmentationMap m(12, 10, src);
    EXPECT_THROW(m.host(), IoError);
    EXPECT_FALSE(m.isMaterialised());
    EXPECT_THROW((void)m.view(), IoError);
    EXPECT_EQ(src->calls(), 2);
    expectPattern(m, 12, 10); // the third call succeeds
    EXPECT_EQ(src->calls(), 3);
    EXPECT_TRUE(m.isMaterialised());
}

TEST(SegmentationMap, ConcurrentCallersAllSeeTheFailureThenOneSuccess) {
    auto src = std::make_shared<CountingSource>(20, 20, 1, 10);
    const SegmentationMap m(20, 20, src);
    std::atomic<int> failed{0}, ok{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] {
            try {
                (void)m.host();
                ++ok;
            } catch (const IoError&) {
                ++failed;
            }
        });
    for (auto& t : threads)
        t.join();
    // The first download fails for the thread that made it; the next caller downloads again, the rest wait.
    EXPECT_EQ(failed.load(), 1);
    EXPECT_EQ(ok.load(), 3);
    EXPECT_EQ(src->calls(), 2);
}

TEST(SegmentationMap, DeferredOfZeroSizeNeedsNoSource) {
    const SegmentationMap m(0, 5, nullptr);
    EXPECT_TRUE(m.empty());
    EXPECT_TRUE(m.isMaterialised());
    EXPECT_TRUE(m.view().empty());
    EXPECT_THROW(SegmentationMap(3, 4, nullptr), InvalidInput);
    EXPECT_THROW(SegmentationMap(-1, 4, std::make_shared<CountingSource>(1, 1)), InvalidInput);
}

TEST(SegmentationMap, DetectionResultCopySharesTheMap) {
    SimParams sp;
    sp.width = 96;
    sp.height = 80;
    sp.stars = 25;
    sp.seed = 5;
    const SimResult sim = simulateField(sp);
    RunContext ctx;
    ctx.threads = 2;
    const BackgroundResult bkg =
        cpu::estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, ctx, nullptr);
    const DetectionResult det = cpu::detectSources(sim.image.view(), sim.defects.view(), bkg, {}, ctx);
    ASSERT_GT(det.sources.size(), 5u);
    EXPECT_TRUE(det.segmentation.isMaterialised()); // the CPU stage's map is host-backed
    EXPECT_EQ(det.segmentation.source(), nullptr);
    const DetectionResult copy = det;
    EXPECT_TRUE(copy.segmentation.sharesStateWith(det.segmentation));
    EXPECT_EQ(copy.segmentation.data(), det.segmentation.data());
    // segmentId = the map's value under each source's first pixel region: every id appears in the map.
    std::vector<char> seen(det.sources.size() + 1, 0);
    for (std::size_t i = 0; i < det.segmentation.pixelCount(); ++i) {
        const std::int32_t v = det.segmentation.data()[i];
        ASSERT_GE(v, 0);
        ASSERT_LE(static_cast<std::size_t>(v), det.sources.size());
        seen[v] = 1;
    }
    for (std::size_t k = 1; k < seen.size(); ++k)
        EXPECT_TRUE(seen[k]) << "id " << k;
}

} // namespace
} // namespace gpuphot
