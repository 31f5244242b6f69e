#pragma once
// Exceptions and OpenMP. An exception that leaves an OpenMP parallel region ends the program
// (std::terminate: "terminate called after throwing ..."), so every region whose body can throw (an
// allocation, a typed error from a helper) runs its body through a ParallelErrors: the first exception is
// kept, the remaining iterations are skipped, and the calling thread rethrows it after the region.
//
//     ParallelErrors errors;
//     #pragma omp parallel for
//     for (long i = 0; i < n; ++i)
//         errors.run([&] { body(i); });
//     errors.rethrow();
#include <atomic>
#include <exception>
#include <mutex>
#include <utility>

namespace gpuphot {

class ParallelErrors {
public:
    // Runs f unless an earlier call failed; keeps the first exception instead of letting it escape.
    template <class F> void run(F&& f) noexcept {
        if (m_failed.load(std::memory_order_relaxed)) return;
        try {
            std::forward<F>(f)();
        } catch (...) {
            std::lock_guard lock(m_mu);
            if (!m_error) m_error = std::current_exception();
            m_failed.store(true, std::memory_order_relaxed);
        }
    }
    bool failed() const { return m_failed.load(std::memory_order_relaxed); }
    // On the thread that opened the region, after it: throws the kept exception, if any.
    void rethrow() {
        if (m_error) std::rethrow_exception(std::exchange(m_error, nullptr));
    }

private:
    std::mutex m_mu;
    std::exception_ptr m_error;
    std::atomic<bool> m_failed{false};
};

} // namespace gpuphot
