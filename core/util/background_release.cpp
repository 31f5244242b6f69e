#include "core/util/background_release.hpp"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace gpuphot {
namespace {
constexpr std::size_t kMaxWaiting = 1; // besides the one being freed: at most two frames' memory in flight

struct ReleaseQueue {
    std::mutex mu;
    std::condition_variable ready;
    std::deque<std::function<void()>> waiting;
    bool running = false; // false: the thread could not be started (e.g. under `ulimit -v`): callers free

    ReleaseQueue() {
        try {
            start();
            running = true;
        } catch (const std::exception&) {
        }
    }
    void start() {
        std::thread([this] {
            for (;;) {
                std::function<void()> next;
                {
                    std::unique_lock lock(mu);
                    ready.wait(lock, [this] { return !waiting.empty(); });
                    next = std::move(waiting.front());
                    waiting.pop_front();
                }
                next();
            }
        }).detach();
    }
};

// Never destroyed: the detached thread may still wait on it while the process exits.
ReleaseQueue& queue() {
    static ReleaseQueue* q = new ReleaseQueue;
    return *q;
}
} // namespace

bool postRelease(std::function<void()> release) {
    ReleaseQueue& q = queue();
    if (q.running) {
        std::lock_guard lock(q.mu);
        if (q.waiting.size() < kMaxWaiting) {
            q.waiting.push_back(std::move(release));
            q.ready.notify_one();
            return true;
        }
    }
    release();
    return false;
}

} // namespace gpuphot
