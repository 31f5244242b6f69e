#pragma once
// Counts and range of a frame's usable pixels, for the checks before a reduction (frame_checks.hpp): the
// read computes them beside its conversion (fits_raw_read.hpp) so that an unprepared frame is not scanned
// again.
#include <cstddef>
#include <cstdint>
#include <limits>

namespace gpuphot {

struct PixelStats {
    std::size_t pixels = 0;
    std::size_t valid = 0;     // finite and unmasked
    std::size_t saturated = 0; // mask has the saturated bits
    float lo = std::numeric_limits<float>::infinity(),
          hi = -std::numeric_limits<float>::infinity(); // of valid
    // The Image serials of the pixels and mask described (Frame::readStats; 0: not recorded).
    std::uint64_t pixelsSerial = 0, maskSerial = 0;

    void merge(const PixelStats& o) {
        pixels += o.pixels;
        valid += o.valid;
        saturated += o.saturated;
        lo = o.lo < lo ? o.lo : lo;
        hi = o.hi > hi ? o.hi : hi;
    }
};

// The statistics of n pixels and their mask bytes (mask null: every pixel unmasked, none saturated).
PixelStats pixelStats(const float* px, const std::uint8_t* mask, std::size_t n, std::uint8_t saturatedBits);

} // namespace gpuphot
