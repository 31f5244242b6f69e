#pragma once
// One image frame as every stage sees it: float32 pixels, a per-pixel mask, the header, the WCS (when
// the header has a usable one) and the instrument facts.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/model/header.hpp"
#include "core/model/image.hpp"
#include "core/model/instrument.hpp"

namespace gpuphot {

class Wcs;

struct Frame {
    Image<float> pixels;            // ADU after BSCALE/BZERO; masked pixels keep their value (NaN stays NaN)
    Image<std::uint8_t> mask;       // MaskBits; same size as pixels
    Header header;                  // the image HDU's header (with inherited primary cards when INHERIT = T)
    std::shared_ptr<const Wcs> wcs; // null when the header has no usable celestial WCS
    std::string wcsProblem;         // why wcs is null when the header tried to have one
    bool wcsBroken = false; // the header has celestial WCS keywords, but unusable ones (singular CD, ...)
    Instrument instrument;
    std::string path; // the file it came from ("" for in-memory frames)
    int hdu = 0;      // 0-based HDU number in the file
    std::string extname;
    int bitpix = -32;
    // Relative variance per pixel from an external weight map (frame preparation, step 9; +infinity where
    // unusable); the background stage takes its RMS from it. Null: none. weightRescale: scale it to the
    // measured background noise (map_var, map_weight with PrepareParams::rescaleWeights).
    std::shared_ptr<const Image<float>> weightVariance;
    bool weightRescale = false; // the file's BITPIX (16 for unsigned 16-bit camera frames written with BZERO)

    // Frees the pixels and mask once nothing reads them, keeping the frame's size (width(), height()), header
    // and WCS for what reads only those after the stages (the calibration, the catalog table, the report):
    // the read of the next frame in flight then takes their buffers from the host pool (host_pool.hpp)
    // instead of fresh pages. Any pixel access afterwards is a null dereference.
    void dropPixels() noexcept {
        pixels.dropPixels();
        mask.dropPixels();
    }
    bool hasPixels() const { return pixels.data() != nullptr; }

    int width() const { return pixels.width(); }
    int height() const { return pixels.height(); }
    ImageView view() const { return pixels.view(); }
    MaskView maskView() const { return mask.view(); }
};

} // namespace gpuphot
