#pragma once
// Fast read of an uncompressed FITS image HDU: the data bytes read straight from the file (large pread
// calls) and converted (byte swap, BSCALE/BZERO, BLANK -> NaN) by several threads, giving exactly the
// float32 values of CFITSIO's fits_read_img(TFLOAT, nulval = NaN):
//   - integer BITPIX (8, 16, 32): BLANK (when the header has one) -> NaN; else (float) v without scaling,
//     (float) (v * BSCALE + BZERO) in double with it;
//   - BITPIX -32 / -64: exponent all ones (NaN, +-Inf) -> NaN; exponent zero (+-0, subnormals) -> +0
//     without scaling, (float) BZERO with it (CFITSIO's "underflow"); else (float) v, or
//     (float) (v * BSCALE + BZERO) in double; -64 beyond the float range -> +-Inf (CFITSIO 4.2 converts as
//     C does, and reports NUM_OVERFLOW, which readFrame ignores).
// Tile-compressed images, gzip-compressed files, BITPIX 64, image sections and files CFITSIO opened from
// extended file-name syntax keep the CFITSIO path (rawImageLayout says which).
#include <fitsio.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpuphot {

struct RawImageLayout {
    long long dataOffset = 0; // bytes from the start of the file
    long long count = 0;      // pixels
    int bitpix = 0;           // 8, 16, 32, -32, -64
    double scale = 1.0;       // BSCALE
    double zero = 0.0;        // BZERO
    bool hasBlank = false;    // integer images: BLANK given
    long long blank = 0;
};

// The layout of the current HDU of `f` (opened from the plain file `path`) when the fast path can read
// it: an uncompressed image of one of the BITPIX above whose data (count pixels) lies inside the file,
// which starts with a SIMPLE card (not gzip), and finite BSCALE != 0 and BZERO. nullopt otherwise, and
// when the environment variable GPUPHOT_CFITSIO_READ is set to 1 (benchmarks: CFITSIO's own path).
std::optional<RawImageLayout> rawImageLayout(fitsfile* f, const std::string& path, long long count);

// How readFrame masks a pixel v of the frame it read: !isfinite(v) -> nullBits, else
// (double) v >= saturation -> saturatedBits, else 0.
struct RawMaskRule {
    double saturation = 0.0;
    std::uint8_t nullBits = 0, saturatedBits = 0;
};

// Receives the raw bytes of an uncompressed image while readRawImage converts them on the host: the CUDA
// backend uploads each chunk as it is read and converts it on the device (kernels/frame_upload.hpp).
// begin/finish are called by readFrame's thread, start/reuse/chunk by readRawImage's readers.
class RawChunkSink {
public:
    virtual ~RawChunkSink() = default;
    // The image about to be read (width x height pixels of this layout, masked by this rule); false:
    // declined (nothing else is called).
    virtual bool begin(const RawImageLayout& layout, int width, int height, const RawMaskRule& rule) = 0;
    // Raw bytes per chunk the sink wants (0: readRawImage's default).
    virtual std::size_t chunkBytes() const { return 0; }
    // Once, before any chunk: `threads` readers (omp_get_thread_num() 0..threads-1), chunks of at most
    // chunkBytes raw bytes. One buffer of chunkBytes per reader, which the readers read into.
    virtual std::vector<unsigned char*> start(int threads, std::size_t chunkBytes) = 0;
    // Before reader `thread` refills its buffer: returns when the previous chunk's bytes are free.
    virtual void reuse(int thread) = 0;
    // Reader `thread` has read pixels [first, first + n) into its buffer (it converts them afterwards).
    virtual void chunk(int thread, std::size_t first, std::size_t n) = 0;
    // Every chunk was read (not called when the read failed).
    virtual void finish() = 0;
};

// Reads and converts the layout's pixels into out (count floats). threads: 0 = OpenMP's default.
// chunkBytes: raw bytes per read (0: the sink's choice, else 8 MiB; tests use small chunks). sink (may be
// null, already begun): also receives every chunk's raw bytes. mask (may be null): count bytes, each
// pixel's bits by `rule` (maskPixels), made while the chunk's floats are still in cache. Throws IoError
// naming the file when the data cannot be read.
void readRawImage(const std::string& path, const RawImageLayout& layout, float* out, int threads = 0,
                  std::size_t chunkBytes = 0, RawChunkSink* sink = nullptr, std::uint8_t* mask = nullptr,
                  const RawMaskRule& rule = {});

// The mask of n converted pixels by `rule`.
void maskPixels(const float* px, std::size_t n, const RawMaskRule& rule, std::uint8_t* mask);

// The conversion alone: n pixels of big-endian raw data in src (n * |bitpix| / 8 bytes) into out.
void convertRawPixels(const unsigned char* src, std::size_t n, const RawImageLayout& layout, float* out);

} // namespace gpuphot
