#include "core/pipeline/prepare_inputs.hpp"

#include <cmath>
#include <cstdint>

#include "core/io/fits_image.hpp"

namespace gpuphot {

namespace {

CalibrationImage loadCalibration(const std::string& path) {
    Frame f = readFrame(path);
    CalibrationImage c;
    c.pixels = std::move(f.pixels);
    c.mask = std::move(f.mask);
    // Saturation means nothing in a master; only non-finite / BLANK pixels are bad.
    for (std::size_t i = 0; i < c.mask.pixelCount(); ++i)
        c.mask.data()[i] &= static_cast<std::uint8_t>(~MaskSaturated);
    c.header = std::move(f.header);
    c.path = path;
    return c;
}

// A bad-pixel mask file: any non-zero or non-finite pixel is bad.
Image<std::uint8_t> loadBadPixels(const std::string& path) {
    const Frame f = readFrame(path);
    Image<std::uint8_t> bad(f.width(), f.height(), 0);
    for (std::size_t i = 0; i < f.pixels.pixelCount(); ++i) {
        const float v = f.pixels.data()[i];
        bad.data()[i] = (v != 0.0f || !std::isfinite(v)) ? 1 : 0;
    }
    return bad;
}

} // namespace

PrepareInputs loadPrepareInputs(const std::string& bias, const std::string& dark, const std::string& flat,
                                const std::string& bpm, const PrepareParams& params) {
    PrepareInputs in;
    if (!bias.empty()) in.bias = loadCalibration(bias);
    if (!dark.empty()) in.dark = loadCalibration(dark);
    if (!flat.empty()) in.flat = loadCalibration(flat);
    if (!bpm.empty()) {
        in.badPixels = loadBadPixels(bpm);
        in.badPixelPath = bpm;
    }
    completePrepareInputs(in, params);
    return in;
}

void loadWeightMap(PrepareInputs& in, const std::string& path) {
    Frame f = readFrame(path);
    in.weight = std::move(f.pixels);
    in.weightPath = path;
}

} // namespace gpuphot
