// The fast raw read of uncompressed images (core/io/fits_raw_read) against CFITSIO's own conversion,
// bitwise: every BITPIX it handles, with and without BSCALE/BZERO, with BLANK (also outside the type's
// range), float specials (NaN payloads, +-Inf, +-0, subnormals, FLT_MAX) and -64 values beyond the float
// range; many small chunks on several threads; readFrame's pixels and mask with and without it; the
// cases it leaves to CFITSIO (tile compression, gzip).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fitsio.h>

#include "core/io/fits_image.hpp"
#include "core/io/fits_raw_read.hpp"
#include "core/pipeline/backend_tuning.hpp"

#include "tests/test_support.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

constexpr int kW = 37, kH = 23; // 851 pixels

struct Keys {
    bool scaled = false;
    double bscale = 1.0, bzero = 0.0;
    bool blank = false;
    long long blankValue = 0;
};

std::string cfitsioError(int status) {
    char text[FLEN_STATUS] = {};
    fits_get_errstatus(status, text);
    fits_clear_errmsg();
    return std::to_string(status) + " " + text;
}

// Writes a 2-D image of raw values (the on-disk numbers, no scaling applied on write).
template <class T>
void writeRaw(const std::string& path, int bitpix, int datatype, std::vector<T> raw, const Keys& k,
              bool compress = false) {
    fitsfile* f = nullptr;
    int status = 0;
    const std::string name = "!" + path;
    fits_create_file(&f, name.c_str(), &status);
    ASSERT_EQ(status, 0) << cfitsioError(status);
    if (compress) fits_set_compression_type(f, RICE_1, &status);
    long naxes[2] = {kW, kH};
    fits_create_img(f, bitpix, 2, naxes, &status);
    if (k.scaled) {
        double s = k.bscale, z = k.bzero;
        fits_write_key(f, TDOUBLE, "BSCALE", &s, "", &status);
        fits_write_key(f, TDOUBLE, "BZERO", &z, "", &status);
    }
    if (k.blank) {
        LONGLONG b = k.blankValue;
        fits_write_key(f, TLONGLONG, "BLANK", &b, "", &status);
    }
    fits_set_bscale(f, 1.0, 0.0, &status); // write the raw numbers
    fits_write_img(f, datatype, 1, static_cast<LONGLONG>(raw.size()), raw.data(), &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0) << cfitsioError(status);
}

// CFITSIO's floats (fits_read_img, TFLOAT, nulval NaN; NUM_OVERFLOW accepted as readFrame does).
std::vector<float> readCfitsio(const std::string& path) {
    fitsfile* f = nullptr;
    int status = 0;
    fits_open_diskfile(&f, path.c_str(), READONLY, &status);
    EXPECT_EQ(status, 0) << cfitsioError(status);
    std::vector<float> out(kW * kH);
    float nulval = std::numeric_limits<float>::quiet_NaN();
    int anynul = 0;
    fits_read_img(f, TFLOAT, 1, static_cast<LONGLONG>(out.size()), &nulval, out.data(), &anynul, &status);
    if (status == NUM_OVERFLOW) status = 0;
    EXPECT_EQ(status, 0) << cfitsioError(status);
    fits_clear_errmsg();
    int st = 0;
    fits_close_file(f, &st);
    return out;
}

// rawImageLayout of HDU hdu1 (1-based) of path, opened as a plain disk file or through CFITSIO's
// general opener (which decompresses gzip).
std::optional<RawImageLayout> layoutOf(const std::string& path, int hdu1 = 1, bool generalOpen = false) {
    fitsfile* f = nullptr;
    int status = 0, type = 0;
    if (generalOpen)
        fits_open_file(&f, path.c_str(), READONLY, &status);
    else
        fits_open_diskfile(&f, path.c_str(), READONLY, &status);
    if (hdu1 > 1) fits_movabs_hdu(f, hdu1, &type, &status);
    EXPECT_EQ(status, 0) << cfitsioError(status);
    if (status) return std::nullopt;
    auto l = rawImageLayout(f, path, static_cast<long long>(kW) * kH);
    int st = 0;
    fits_close_file(f, &st);
    return l;
}

// readFrame with the switch that turns the fast path off (FrameReadOptions::cfitsioOnly, which the front
// ends set from BackendTuning::cfitsioRead, GPUPHOT_CFITSIO_READ=1).
Frame readThroughCfitsio(const std::string& path) {
    ::setenv("GPUPHOT_CFITSIO_READ", "1", 1);
    FrameReadOptions o;
    o.cfitsioOnly = BackendTuning::fromEnvironment().cfitsioRead;
    ::unsetenv("GPUPHOT_CFITSIO_READ");
    EXPECT_TRUE(o.cfitsioOnly);
    return readFrame(path, o);
}

// One fast read (3 threads; chunk raw bytes per read, 0: the default) against CFITSIO's floats and the
// expected mask (checked when chunk != 0: the default-chunk read runs without a mask).
void expectReadMatches(const std::string& path, const RawImageLayout& l, const std::vector<float>& ref,
                       const std::vector<std::uint8_t>& wantMask, std::size_t chunk, const RawMaskRule& rule,
                       const char* what) {
    std::vector<float> fast(ref.size(), 12345.0f);
    std::vector<std::uint8_t> mask(ref.size(), 77);
    readRawImage(path, l, fast.data(), 3, chunk, nullptr, chunk ? mask.data() : nullptr, rule);
    if (chunk) {
        EXPECT_EQ(mask, wantMask) << what << ": the mask made beside the conversion, saturation "
                                  << rule.saturation;
    }
    int shown = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        std::uint32_t a, b;
        std::memcpy(&a, &ref[i], 4);
        std::memcpy(&b, &fast[i], 4);
        if (a != b && shown++ < 8)
            ADD_FAILURE() << what << ": pixel " << i << " CFITSIO " << ref[i] << " (0x" << std::hex << a
                          << ") fast " << fast[i] << " (0x" << b << std::dec << "), chunk " << chunk;
    }
}

// Fast read with tiny chunks (many reads) on 3 threads, and with the defaults.
void expectBitwiseEqual(const std::string& path, const char* what) {
    const std::vector<float> ref = readCfitsio(path);
    const auto l = layoutOf(path);
    ASSERT_TRUE(l.has_value()) << what;
    // The mask made beside the conversion: non-finite -> 3, at or above the saturation -> 4 (compared in
    // double: levels between two floats, beyond 2^24, negative).
    for (const double saturation : {100.0, 100.3, 16777217.0, -0.5})
        for (const std::size_t chunk : {std::size_t(24), std::size_t(0)}) {
            const RawMaskRule rule{saturation, 3, 4};
            std::vector<std::uint8_t> wantMask(ref.size());
            for (std::size_t i = 0; i < ref.size(); ++i)
                wantMask[i] =
                    !std::isfinite(ref[i]) ? 3 : (static_cast<double>(ref[i]) >= saturation ? 4 : 0);
            expectReadMatches(path, *l, ref, wantMask, chunk, rule, what);
        }
}

template <class T> std::vector<T> randomInts(std::mt19937_64& rng, std::vector<T> specials) {
    std::uniform_int_distribution<long long> d(std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
    std::vector<T> v(kW * kH);
    for (auto& x : v)
        x = static_cast<T>(d(rng));
    for (std::size_t i = 0; i < specials.size(); ++i)
        v[(i * 131) % v.size()] = specials[i];
    return v;
}

struct Tmp : test::TempDir {
    Tmp() : test::TempDir("gpuphot_raw_read_test") {}
    std::string file(const std::string& n) const { return (path / n).string(); }
};

const std::vector<Keys> kIntKeys = {
    {},                                     // raw numbers
    {true, 1.0, 32768.0},                   // unsigned 16-bit convention
    {true, 0.37, -12.5},                    // fractional scale
    {true, 1e-3, 1e5},                      //
    {false, 1.0, 0.0, true, 7},             // BLANK
    {true, 2.5, -1.0, true, -32768},        // BLANK with scaling
    {false, 1.0, 0.0, true, 99999999999LL}, // BLANK outside every type's range
    {true, 1.0, 2147483648.0},              // unsigned 32-bit convention (rounded to float)
    {true, 1.0, -1e12},                     // integral offset beyond 32 bits
    {true, 1.0, 3e15},                      // integral offset beyond 2^40 (the general path)
    {true, 1.0, 32768.0, true, 5},          // BLANK with an integral offset
    {true, 1.0, -3.0, true, -32768},        //
};

} // namespace

namespace {
// Every key set of kIntKeys on random raw values of T with the given specials.
template <class T>
void checkIntegerType(int bitpix, int imgType, int datatype, std::uint64_t seed,
                      const std::vector<T>& specials) {
    Tmp t;
    std::mt19937_64 rng(seed);
    int n = 0;
    for (const Keys& k : kIntKeys) {
        const std::string p = t.file("b" + std::to_string(bitpix) + "_" + std::to_string(n++) + ".fits");
        writeRaw<T>(p, imgType, datatype, randomInts<T>(rng, specials), k);
        expectBitwiseEqual(p, p.c_str());
    }
}
} // namespace

TEST(FitsRawRead, Bitpix8MatchesCfitsio) {
    checkIntegerType<unsigned char>(8, BYTE_IMG, TBYTE, 8, {0, 255, 7, 7, 128});
}

TEST(FitsRawRead, Bitpix16MatchesCfitsio) {
    checkIntegerType<short>(16, SHORT_IMG, TSHORT, 16, {-32768, 32767, 0, 7, -1, 7});
}

TEST(FitsRawRead, Bitpix32MatchesCfitsio) {
    // Large values round when converted to float: the rounding must be CFITSIO's.
    checkIntegerType<int>(32, LONG_IMG, TINT, 32, {INT32_MIN, INT32_MAX, 16777217, -16777217, 7, -32768, 0});
}

namespace {
// Normal random values of F (sigma) with the specials (given as bit patterns U) written with each key set.
template <class F, class U>
void checkIeeeType(int imgType, int datatype, std::uint64_t seed, F sigma, const std::vector<U>& specialBits,
                   const std::vector<Keys>& keys) {
    Tmp t;
    std::mt19937_64 rng(seed);
    std::normal_distribution<F> d(F(100), sigma);
    std::vector<F> v(kW * kH);
    for (auto& x : v)
        x = d(rng);
    for (std::size_t i = 0; i < specialBits.size(); ++i)
        std::memcpy(&v[i * 41], &specialBits[i], sizeof(F));
    int n = 0;
    for (const Keys& k : keys) {
        const std::string p =
            t.file("ieee" + std::to_string(sizeof(F)) + "_" + std::to_string(n++) + ".fits");
        writeRaw<F>(p, imgType, datatype, v, k);
        expectBitwiseEqual(p, p.c_str());
    }
}
template <class U, class F> U bitsOf(F f) {
    U u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
} // namespace

TEST(FitsRawRead, FloatSpecialsMatchCfitsio) {
    // NaNs (quiet, negative, signalling payloads), +-Inf, +-0, subnormals, the float range's ends.
    const std::vector<std::uint32_t> specials = {0x7fc00000u,
                                                 0xffc00000u,
                                                 0x7f800001u,
                                                 0x7fbfffffu,
                                                 0x7f800000u,
                                                 0xff800000u,
                                                 0u,
                                                 0x80000000u,
                                                 1u,
                                                 0x807fffffu,
                                                 bitsOf<std::uint32_t>(FLT_MIN),
                                                 bitsOf<std::uint32_t>(-FLT_MIN),
                                                 bitsOf<std::uint32_t>(FLT_MAX),
                                                 bitsOf<std::uint32_t>(-FLT_MAX),
                                                 bitsOf<std::uint32_t>(1e-30f)};
    checkIeeeType<float>(FLOAT_IMG, TFLOAT, 32, 1000.0f, specials,
                         {Keys{}, Keys{true, 2.5, -3.0}, Keys{true, 1.0, 1e-3}});
}

TEST(FitsRawRead, DoubleSpecialsAndOverflowMatchCfitsio) {
    // As for floats, and doubles beyond the float range (+-Inf, as C converts), scaled beyond it too.
    std::vector<std::uint64_t> specials = {0x7ff8000000000000ull,
                                           0xfff8000000000000ull,
                                           0x7ff0000000000000ull,
                                           0xfff0000000000000ull,
                                           0ull,
                                           0x8000000000000000ull,
                                           1ull,
                                           0x800fffffffffffffull};
    for (const double x : {1e300, -1e300, 1e-300, -1e-300, 3.4028236e38, -3.4028236e38,
                           static_cast<double>(FLT_MAX), 1e-40, 0.1})
        specials.push_back(bitsOf<std::uint64_t>(x));
    checkIeeeType<double>(DOUBLE_IMG, TDOUBLE, 64, 1e4, specials,
                          {Keys{}, Keys{true, 3.0, 7.0}, Keys{true, 1e30, 0.0}});
}

TEST(FitsRawRead, ReadFrameSameWithAndWithoutTheFastPath) {
    Tmp t;
    std::mt19937_64 rng(5);
    const std::string p = t.file("frame16.fits");
    writeRaw<short>(p, SHORT_IMG, TSHORT, randomInts<short>(rng, {-32768, 32767, -32768}),
                    Keys{true, 1.0, 32768.0, true, -32768});
    const Frame fast = readFrame(p);
    const Frame slow = readThroughCfitsio(p);
    EXPECT_TRUE(layoutOf(p).has_value());
    ASSERT_EQ(fast.width(), slow.width());
    ASSERT_EQ(fast.height(), slow.height());
    EXPECT_EQ(std::memcmp(fast.pixels.data(), slow.pixels.data(), sizeof(float) * kW * kH), 0);
    EXPECT_EQ(std::memcmp(fast.mask.data(), slow.mask.data(), static_cast<std::size_t>(kW) * kH), 0);
    int nan = 0;
    for (int i = 0; i < kW * kH; ++i)
        nan += std::isnan(fast.pixels.data()[i]) ? 1 : 0;
    EXPECT_GE(nan, 2); // the BLANK pixels
}

TEST(FitsRawRead, CompressedAndGzipKeepCfitsio) {
    Tmp t;
    std::mt19937_64 rng(9);
    const std::string fz = t.file("c.fits.fz");
    writeRaw<short>(fz, SHORT_IMG, TSHORT, randomInts<short>(rng, {}), Keys{}, true);
    EXPECT_FALSE(layoutOf(fz, 2).has_value()) << "tile-compressed";
    const std::string plain = t.file("g.fits");
    writeRaw<short>(plain, SHORT_IMG, TSHORT, randomInts<short>(rng, {}), Keys{});
    const std::string gz = plain + ".gz";
    ASSERT_EQ(std::system(("gzip -c " + plain + " > " + gz).c_str()), 0);
    EXPECT_FALSE(layoutOf(gz, 1, true).has_value()) << "gzip";
    // Both still read (through CFITSIO) to the same pixels as the plain file.
    const Frame a = readFrame(plain), b = readFrame(gz);
    EXPECT_EQ(std::memcmp(a.pixels.data(), b.pixels.data(), sizeof(float) * kW * kH), 0);
}
