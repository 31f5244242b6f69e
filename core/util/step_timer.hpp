// Host wall-clock laps of a stage's steps, printed to stderr when an environment variable is set
// (GPUPHOT_PSF_TIMING=1, ...): "<label> timing: <step> <ms> ms". Off, a lap costs one branch.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gpuphot {

class StepLaps {
public:
    StepLaps(const char* envVar, const char* label) : m_label(label), m_t(Clock::now()) {
        const char* e = std::getenv(envVar);
        m_on = e && *e && std::string(e) != "0";
    }
    void lap(const char* step) {
        if (!m_on) return;
        const auto now = Clock::now();
        std::fprintf(stderr, "%s timing: %s %.3f ms\n", m_label,
                     step, std::chrono::duration<double, std::milli>(now - m_t).count());
        m_t = now;
    }
    bool on() const { return m_on; }

private:
    using Clock = std::chrono::steady_clock;
    const char* m_label;
    bool m_on = false;
    Clock::time_point m_t;
};

} // namespace gpuphot
