#pragma once
// x % d for 64-bit x and a fixed divisor d >= 1 by two multiplications instead of a division: Lemire,
// Kaser and Kurz, "Faster remainder by direct computation" (2019), with a 128-bit M = floor((2^128 - 1) / d)
// + 1, exact for every 64-bit x (the same value as x % d, so a loop that draws x % d gives the same draws).
#include <cstdint>

namespace gpuphot {

class FastMod {
public:
    explicit FastMod(std::uint64_t d) : m_m(~static_cast<unsigned __int128>(0) / d + 1), m_d(d) {}
    std::uint64_t of(std::uint64_t x) const {
        const unsigned __int128 low = m_m * x; // modulo 2^128
        // The top 64 bits of the 192-bit product low * d.
        const unsigned __int128 bottom =
            (static_cast<unsigned __int128>(static_cast<std::uint64_t>(low)) * m_d) >> 64;
        const unsigned __int128 top = (low >> 64) * m_d;
        return static_cast<std::uint64_t>((bottom + top) >> 64);
    }
    std::uint64_t divisor() const { return m_d; }

private:
    unsigned __int128 m_m;
    std::uint64_t m_d;
};

} // namespace gpuphot
