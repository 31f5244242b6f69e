#include "core/util/memory.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <sys/resource.h>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace gpuphot {

namespace {
std::size_t statusKb(const char* text, const char* name) {
    const char* at = std::strstr(text, name);
    return at ? std::strtoull(at + std::strlen(name), nullptr, 10) * 1024 : 0;
}
} // namespace

namespace {
thread_local std::string t_failedStage;
}

void noteFailedStage(const std::string& stage) noexcept {
    if (!t_failedStage.empty()) return;
    try {
        t_failedStage = stage;
    } catch (...) { // no memory even for the name: the message names the phase instead
    }
}

std::string takeFailedStage() {
    return std::exchange(t_failedStage, std::string());
}

void startThreadTeam(int threads) {
    if (threads <= 1) return;
    std::vector<std::thread> probe;
    try {
        for (int k = 1; k < threads; ++k)
            probe.emplace_back([] {});
    } catch (const std::system_error& e) {
        for (std::thread& t : probe)
            t.join();
        rlimit stack{};
        ::getrlimit(RLIMIT_STACK, &stack);
        const HostMemoryUse u = hostMemoryUse();
        std::ostringstream m;
        m << "out of memory: cannot start " << threads << " threads (" << e.code().message()
          << "; each reserves "
          << (stack.rlim_cur == RLIM_INFINITY ? std::string("its stack") : formatBytes(stack.rlim_cur))
          << " of address space, " << formatBytes(u.addressSpace) << " in use";
        if (u.addressSpaceLimit) m << ", limit " << formatBytes(u.addressSpaceLimit) << ", ulimit -v";
        m << "). Use fewer --threads, or more memory";
        throw OutOfMemory(m.str());
    }
    for (std::thread& t : probe)
        t.join();
#pragma omp parallel num_threads(threads)
    {}
}

HostMemoryUse hostMemoryUse() {
    HostMemoryUse u;
    char buf[4096];
    if (std::FILE* f = std::fopen("/proc/self/status", "r")) { // no allocation: this runs out of memory
        const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
        std::fclose(f);
        buf[n] = '\0';
        u.addressSpace = statusKb(buf, "VmSize:");
        u.resident = statusKb(buf, "VmRSS:");
    }
    rlimit r{};
    if (::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY) u.addressSpaceLimit = r.rlim_cur;
    return u;
}

std::string formatBytes(std::size_t bytes) {
    char buf[32];
    const double b = static_cast<double>(bytes);
    if (b >= 1024.0 * 1024 * 1024)
        std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024)
        std::snprintf(buf, sizeof buf, "%.0f MiB", b / (1024.0 * 1024));
    else
        std::snprintf(buf, sizeof buf, "%.0f KiB", b / 1024.0);
    return buf;
}

OutOfMemory outOfMemory(const std::bad_alloc& e, const std::string& step) {
    const HostMemoryUse u = hostMemoryUse();
    const auto* sized = dynamic_cast<const AllocationFailed*>(&e);
    std::ostringstream m;
    m << "out of memory in " << step << ": ";
    if (sized)
        m << "an allocation of " << formatBytes(sized->bytes()) << " failed";
    else
        m << "an allocation failed";
    m << " with " << formatBytes(u.addressSpace) << " of address space in use";
    if (u.addressSpaceLimit) {
        m << " (limit " << formatBytes(u.addressSpaceLimit) << ", ulimit -v)";
        if (sized) m << "; the step needs at least " << formatBytes(u.addressSpace + sized->bytes());
    }
    m << ". Use fewer --threads, fewer --maps, --prefetch 0 and --concurrent 1, or more memory";
    return OutOfMemory(m.str());
}

} // namespace gpuphot

// The program's allocation functions (replaceable, [new.delete]): malloc as the standard library's, but a
// failure throws AllocationFailed with the size. The standard library's array and nothrow forms call
// this one. Not under a sanitizer, whose own operator new reports mismatched frees.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define GPUPHOT_SANITIZED_NEW 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GPUPHOT_SANITIZED_NEW 1
#endif
#ifndef GPUPHOT_SANITIZED_NEW
void* operator new(std::size_t bytes) {
    const std::size_t n = bytes ? bytes : 1;
    for (;;) {
        if (void* p = std::malloc(n)) return p;
        std::new_handler handler = std::get_new_handler();
        if (!handler) throw gpuphot::AllocationFailed(bytes);
        handler();
    }
}
#endif
