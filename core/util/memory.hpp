#pragma once
// Host memory: what an allocation failure says. The program's operator new (replaced in memory.cpp)
// throws AllocationFailed, a std::bad_alloc that remembers the size asked for, so the error that reaches
// the user can say how much the step needed; outOfMemory() turns any std::bad_alloc into the typed
// OutOfMemory error with the process's use and limit and what to change.
#include <cstddef>
#include <new>
#include <string>

#include "core/util/errors.hpp"

namespace gpuphot {

// An allocation failed (host memory, or the address-space limit of `ulimit -v`); the message says how
// much the step asked for, how much was in use, and what to change.
class OutOfMemory : public Error {
public:
    using Error::Error;
};

// The CLI's exit status for it (the one table: docs/CLI.md).
inline constexpr int kExitOutOfMemory = 10;

class AllocationFailed : public std::bad_alloc {
public:
    explicit AllocationFailed(std::size_t bytes) noexcept : m_bytes(bytes) {}
    const char* what() const noexcept override { return "out of memory"; }
    std::size_t bytes() const noexcept { return m_bytes; }

private:
    std::size_t m_bytes;
};

struct HostMemoryUse {
    std::size_t addressSpace = 0;      // VmSize: what `ulimit -v` limits
    std::size_t resident = 0;          // VmRSS
    std::size_t addressSpaceLimit = 0; // RLIMIT_AS soft limit; 0: unlimited
};
HostMemoryUse hostMemoryUse();

// "1.5 GiB", "512 MiB", "12 KiB".
std::string formatBytes(std::size_t bytes);

// The OutOfMemory error for `e` caught while doing `step` (e.g. "detection of m31.fits"): the size the
// failed allocation asked for when known, the memory in use and the limit, and the advice (fewer
// --threads, fewer --maps, --prefetch 0 / --concurrent 1, a higher limit).
OutOfMemory outOfMemory(const std::bad_alloc& e, const std::string& step);

// Starts the calling thread's OpenMP team of `threads` threads now: libgomp ends the process ("Thread
// creation failed", exit 1) when it cannot create a team's thread, so the threads are first tried as
// plain threads, which fail with an error instead. Throws OutOfMemory naming the count (each thread
// reserves its stack, `ulimit -s`, of address space). threads <= 1: nothing to start.
void startThreadTeam(int threads);

// The innermost stage (RunContext::StageTimer) an exception left on this thread since the last
// takeFailedStage(); "" when none. For the error message of the phase that catches it.
void noteFailedStage(const std::string& stage) noexcept;
std::string takeFailedStage();

} // namespace gpuphot
