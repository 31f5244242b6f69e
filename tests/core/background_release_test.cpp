// Objects handed to the release thread are destroyed, in order, off the caller's thread; with one already
// waiting the caller destroys its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "core/util/background_release.hpp"

namespace gpuphot {
namespace {

struct Tracked {
    std::vector<int>* log = nullptr;
    std::mutex* mu = nullptr;
    std::thread::id* where = nullptr;
    int id = 0;
    Tracked(std::vector<int>* l, std::mutex* m, std::thread::id* w, int i) : log(l), mu(m), where(w), id(i) {}
    Tracked(Tracked&& o) noexcept : log(o.log), mu(o.mu), where(o.where), id(o.id) { o.log = nullptr; }
    ~Tracked() {
        if (!log) return; // moved from
        std::lock_guard lock(*mu);
        log->push_back(id);
        if (where) *where = std::this_thread::get_id();
    }
};

TEST(BackgroundRelease, ObjectsAreDestroyedOffTheCallersThreadAndTheQueueIsBounded) {
    std::vector<int> log;
    std::mutex mu;
    std::thread::id where;
    // Hold the release thread so that the queue fills: the third object is destroyed here.
    std::mutex gate;
    std::unique_lock hold(gate);
    std::atomic<bool> blocked{false};
    ASSERT_TRUE(postRelease([&] {
        blocked = true;
        std::lock_guard wait(gate);
    }));
    while (!blocked)
        std::this_thread::yield();
    releaseInBackground(Tracked(&log, &mu, &where, 1));
    releaseInBackground(Tracked(&log, &mu, nullptr, 2)); // one waiting already: destroyed here, now
    {
        std::lock_guard lock(mu);
        EXPECT_EQ(log, std::vector<int>{2});
    }
    releaseInBackground(Tracked(&log, &mu, nullptr, 3));
    {
        std::lock_guard lock(mu);
        EXPECT_EQ(log, (std::vector<int>{2, 3}));
    }
    hold.unlock();
    for (int i = 0; i < 2000; ++i) {
        {
            std::lock_guard lock(mu);
            if (log.size() == 3) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::lock_guard lock(mu);
    EXPECT_EQ(log, (std::vector<int>{2, 3, 1}));
    EXPECT_NE(where, std::this_thread::get_id());
}

} // namespace
} // namespace gpuphot
