#pragma once
// Random numbers for the simulator, defined here bit for bit (no std:: distributions, whose output
// differs between standard libraries), so a seed gives the same field everywhere.
//  - SimRng: a sequential xoshiro256** stream for the serial parts (star list, defects, reference).
//  - CounterRng: a counter-based generator keyed by (seed, stream, pixel index): the k-th number of a
//    pixel is a pure function of those, so the noise does not depend on the thread count or order.
#include <cmath>
#include <cstdint>
#include <numbers>

namespace gpuphot::sim {

inline std::uint64_t splitMix64(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Uniform in (0, 1): never 0 or 1, so log() and 1/u are safe.
inline double toUnitOpen(std::uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

class SimRng {
public:
    SimRng(std::uint64_t seed, std::uint64_t stream) {
        std::uint64_t x = splitMix64(seed) ^ splitMix64(stream + 0x5851F42D4C957F2Dull);
        for (auto& s : m_s) {
            x = splitMix64(x);
            s = x;
        }
    }
    std::uint64_t next() {
        const std::uint64_t result = rotl(m_s[1] * 5, 7) * 9;
        const std::uint64_t t = m_s[1] << 17;
        m_s[2] ^= m_s[0];
        m_s[3] ^= m_s[1];
        m_s[1] ^= m_s[2];
        m_s[0] ^= m_s[3];
        m_s[2] ^= t;
        m_s[3] = rotl(m_s[3], 45);
        return result;
    }
    double uniform() { return toUnitOpen(next()); }                       // (0, 1)
    double uniform(double a, double b) { return a + (b - a) * uniform(); }
    int uniformInt(int n) { return static_cast<int>(uniform() * n) % n; } // [0, n)
    double normal() {                                                     // Box-Muller, one of the pair
        const double u1 = uniform(), u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    }
    double exponential() { return -std::log(uniform()); }

private:
    static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::uint64_t m_s[4];
};

// Numbers for one pixel: key = hash(seed, stream, pixel index); the k-th draw is mix(key + k * golden).
class CounterRng {
public:
    CounterRng(std::uint64_t seed, std::uint64_t stream, std::uint64_t index)
        : m_key(splitMix64(splitMix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) + index)) {}
    // A SplitMix64 sequence starting at the pixel's pseudo-random key.
    std::uint64_t next() { return splitMix64(m_key + (++m_counter) * 0x9E3779B97F4A7C15ull); }
    double uniform() { return toUnitOpen(next()); }
    double normal() {
        const double u1 = uniform(), u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    }
    // Poisson deviate of mean mu (>= 0): multiplication method below 10, Hoermann's PTRS above.
    double poisson(double mu);

private:
    std::uint64_t m_key;
    std::uint64_t m_counter = 0;
};

} // namespace gpuphot::sim
