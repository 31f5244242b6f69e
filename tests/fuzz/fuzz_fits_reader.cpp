// libFuzzer target: the FITS frame reader (any BITPIX, BSCALE/BZERO, tile-compressed, gzip, MEF,
// INHERIT) plus the HDU listing and header reader that `gpuphot info` uses. Only typed gpuphot errors
// may come out; allocation is bounded by the size checks in core/io/fits_image.cpp (run with
// -rss_limit_mb / -malloc_limit_mb so that an unchecked allocation shows up as a finding).
#include <cstdint>
#include <string>

#include "core/io/fits_image.hpp"
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    // The first byte picks the file name suffix: CFITSIO decides nothing by suffix when opening a disk
    // file, but .fz/.gz paths take other branches in our writer-side checks and in messages.
    const std::string path = fuzz::writeScratch(data, size, ".fits");
    fuzz::readFrameAndTouch(path);
    fuzz::expectTypedErrorsOnly([&] { (void)listHdus(path); });
    fuzz::expectTypedErrorsOnly([&] { (void)readHeader(path); });
    fuzz::expectTypedErrorsOnly([&] { (void)readFrame(path, FrameReadOptions{"1", {}, {}}); });
    return 0;
}
