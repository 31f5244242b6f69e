#pragma once
// FITS images through CFITSIO: read a Frame (any BITPIX, BZERO/BSCALE, tile-compressed, gzip,
// multi-extension, INHERIT), list HDUs, and write images atomically.
#include <string>
#include <vector>

#include "core/model/frame.hpp"

namespace gpuphot {

struct FrameReadOptions {
    // Which HDU: "" = the first image HDU with data; a number = 0-based HDU index; else EXTNAME
    // (optionally "NAME,VER"). Also accepted as CFITSIO's "file.fits[2]" / "file.fits[SCI]" suffix.
    std::string hdu;
    InstrumentKeywords keywords;
    InstrumentOverrides overrides;
    // Pixels read through CFITSIO even where the direct raw read applies (BackendTuning::cfitsioRead).
    bool cfitsioOnly = false;
};

struct HduSummary {
    int index = 0;            // 0-based
    std::string type;         // "IMAGE", "BINTABLE", "TABLE"
    std::string extname;
    int bitpix = 0;           // images: the equivalent BITPIX (16 with BZERO=32768 reads as unsigned 16)
    std::vector<long long> axes; // NAXIS1, NAXIS2, ... (tables: columns, rows)
    bool compressed = false;  // tile-compressed image
};

// Reads one 2-D image HDU into a Frame: float32 pixels (BSCALE/BZERO applied; BLANK and NaN masked;
// values at or above the saturation level masked), the header (with the primary header inherited when
// INHERIT = T), the WCS when the header has a usable one, and the instrument facts.
// Throws IoError (missing/unreadable file, truncated data) or InvalidInput (not FITS, no image HDU,
// 1-D or 3-D data, zero-size or absurd axes, unusable instrument keywords), naming the file.
Frame readFrame(const std::string& path, const FrameReadOptions& options = {});
// The same, and when the fast raw read applies (fits_raw_read.hpp) and sink->begin accepts, the raw chunks
// also go to the sink as they are read (the CUDA backend's upload); finished when this returns.
class RawChunkSink;
Frame readFrame(const std::string& path, const FrameReadOptions& options, RawChunkSink* sink);

std::vector<HduSummary> listHdus(const std::string& path);
Header readHeader(const std::string& path, const std::string& hdu = {});

// Writes a 2-D image with the given header cards (structural keywords are CFITSIO's). bitpix: -32
// (float), -64, 8, 16, 32, 64, or 20 for unsigned 16-bit (BITPIX 16 with BZERO 32768; values rounded
// and clipped to 0..65535). Written to a temporary name and renamed.
void writeFitsImage(const std::string& path, const ImageView& image, const Header& header, int bitpix = -32);
void writeFitsImage(const std::string& path, const ImageViewT<std::int32_t>& image, const Header& header);
void writeFitsImage(const std::string& path, const ImageViewT<std::uint8_t>& image, const Header& header);

// Writes a header-only FITS file (NAXIS = 0) with these cards, e.g. STEM.wcs with a fitted WCS, as
// astrometry.net writes it. Atomic like the image writers.
void writeFitsHeader(const std::string& path, const Header& header);

constexpr int kBitpixUInt16 = 20; // pseudo-BITPIX for writeFitsImage: unsigned 16-bit with BZERO

} // namespace gpuphot
