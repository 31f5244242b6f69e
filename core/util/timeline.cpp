#include "core/util/timeline.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>

#include <unistd.h>

namespace gpuphot {
namespace {
std::atomic<bool> g_enabled{false};

double boottimeNow() {
    timespec ts{};
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The process's start in CLOCK_BOOTTIME seconds (/proc/self/stat field 22, in clock ticks); negative when
// it cannot be read.
double processStart() {
    std::ifstream in("/proc/self/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t close = text.rfind(')'); // the command name may hold spaces
    if (close == std::string::npos || close + 2 > text.size()) return -1.0;
    std::istringstream fields(text.substr(close + 2));
    double ticks = -1.0;
    std::string field;
    for (int i = 3; i <= 22 && fields >> field; ++i)
        if (i == 22) ticks = std::strtod(field.c_str(), nullptr);
    const long perSecond = sysconf(_SC_CLK_TCK);
    return ticks >= 0.0 && perSecond > 0 ? ticks / static_cast<double>(perSecond) : -1.0;
}

double origin() {
    static const double start = [] {
        const double s = processStart();
        return s >= 0.0 ? s : boottimeNow();
    }();
    return start;
}
} // namespace

void enableTimeline() {
    origin();
    g_enabled = true;
}

bool timelineEnabled() {
    return g_enabled;
}

void timelineMark(const char* what) {
    if (!g_enabled) return;
    static std::mutex order; // marks of several threads print in the order of their times
    std::lock_guard lock(order);
    std::fprintf(stderr, "timeline: +%.3f s %s\n", boottimeNow() - origin(), what);
}
} // namespace gpuphot
