// libFuzzer target: gzip-compressed FITS files (frame.fits.gz), which CFITSIO inflates into memory as it
// opens them. The first byte picks what the rest is: (even) the .gz file itself, so that the fuzzer
// reaches CFITSIO's gzip reader with damaged streams; (odd) a FITS file that the harness gzips, so that
// the fuzzer mutates the FITS content behind a valid gzip stream.
#include <cstdint>
#include <string>

#include <zlib.h>

#include "core/io/fits_image.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace {
std::string gzip(const std::uint8_t* data, std::size_t size) {
    z_stream z{};
    // windowBits 15 + 16: a gzip header and trailer around the deflate stream.
    if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return {};
    std::string out(deflateBound(&z, size) + 32, '\0');
    z.next_in = const_cast<Bytef*>(data);
    z.avail_in = static_cast<uInt>(size);
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    const int rc = deflate(&z, Z_FINISH);
    out.resize(z.total_out);
    deflateEnd(&z);
    return rc == Z_STREAM_END ? out : std::string{};
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    if (size < 1) return 0;
    const bool wrap = data[0] & 1;
    const std::string bytes =
        wrap ? gzip(data + 1, size - 1) : std::string(reinterpret_cast<const char*>(data + 1), size - 1);
    const std::string path =
        fuzz::writeScratch(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), ".fits.gz");
    fuzz::readFrameAndTouch(path);
    fuzz::expectTypedErrorsOnly([&] { (void)listHdus(path); });
    return 0;
}
