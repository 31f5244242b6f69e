// Host wall-clock laps of a stage's steps, printed to stderr when that stage's timing is on
// (BackendTuning's detection.timing, psfTiming; set once per process by setStepTimings):
// "<label> timing: <step> <ms> ms". Off, a lap costs one branch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

namespace gpuphot {

enum class StepTiming : unsigned { Detection = 1, Psf = 2 };

inline std::atomic<unsigned>& stepTimings() {
    static std::atomic<unsigned> bits{0};
    return bits;
}
inline void setStepTimings(bool detection, bool psf) {
    stepTimings() = (detection ? 1u : 0u) | (psf ? 2u : 0u);
}

class StepLaps {
public:
    StepLaps(StepTiming which, const char* label)
        : m_label(label), m_on((stepTimings().load() & static_cast<unsigned>(which)) != 0), m_t(Clock::now()) {}
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
