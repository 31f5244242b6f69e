// Regression tests from the hardening work (docs/RELIABILITY.md): the frame checks that `reduce` runs
// before any output, the broken-WCS marker, the temporary-name contract of AtomicOutput, and every input
// the fuzzers (tests/fuzz) found that once crashed or misbehaved.
#include <gtest/gtest.h>

#include <zlib.h>

#include <fitsio.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/cfitsio_util.hpp"
#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/frame_checks.hpp"
#include "core/pipeline/frame_status.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/sextractor_config.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

Frame frameOf(int w, int h, float value = 0.0f, bool ramp = true) {
    Frame f;
    f.path = "tiny.fits";
    f.pixels = Image<float>(w, h, value);
    if (ramp)
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x)
                f.pixels(x, y) = static_cast<float>(x + 3 * y);
    f.mask = Image<std::uint8_t>(w, h, std::uint8_t{0});
    return f;
}

template <class Fn> std::string errorOf(Fn fn) {
    try {
        fn();
    } catch (const InvalidInput& e) {
        return e.what();
    }
    return {};
}

} // namespace

TEST(Reliability, FramesSmallerThanTheMinimumAreRefusedNamingTheFile) {
    for (auto [w, h] : {std::pair{1, 1}, {7, 64}, {64, 7}, {2, 2}}) {
        const std::string msg = errorOf([&] { validateForReduction(frameOf(w, h)); });
        EXPECT_NE(msg.find("tiny.fits"), std::string::npos) << w << "x" << h << ": " << msg;
        EXPECT_NE(msg.find("too small"), std::string::npos) << w << "x" << h << ": " << msg;
    }
    EXPECT_EQ(errorOf([&] { validateForReduction(frameOf(kMinFrameAxis, kMinFrameAxis)); }), "");
}

// The verdict of the early-stopping scan against a full pixel loop, on frames built to be defective or
// nearly so: pixels drawn from NaN, +-inf, one value and (rarely, possibly only in the last row) a second
// value; masks with saturated and other bits; with a mask and without.
static FrameVerdict plainVerdict(const Frame& f) {
    bool unsaturated = false, differs = false, valid = false;
    float first = 0.0f;
    for (int y = 0; y < f.height(); ++y)
        for (int x = 0; x < f.width(); ++x) {
            const std::uint8_t m = f.mask.empty() ? std::uint8_t{0} : f.mask(x, y);
            unsaturated = unsaturated || (m & MaskSaturated) == 0;
            const float v = f.pixels(x, y);
            if (m || !std::isfinite(v)) continue;
            differs = differs || (valid && v != first);
            first = valid ? first : v;
            valid = true;
        }
    if (differs) return {};
    if (!unsaturated) return {FrameDefect::AllSaturated, 0.0f};
    if (!valid) return {FrameDefect::NoValidPixels, 0.0f};
    return {FrameDefect::Constant, first};
}

TEST(Reliability, FrameVerdictMatchesAFullPixelLoop) {
    std::uint32_t state = 12345;
    auto next = [&state] { // the high bits: an LCG's low bits have short periods
        state = state * 1664525u + 1013904223u;
        return state >> 8;
    };
    int seen[4] = {0, 0, 0, 0};
    for (int trial = 0; trial < 400; ++trial) {
        Frame f = frameOf(37, 29);
        auto percent = [&] { return next() % 4 == 0 ? 100u : next() % 101; }; // whole frames often
        const std::uint32_t pNonFinite = percent(), pMasked = percent(), pSaturated = percent();
        const bool withMask = next() % 4 != 0, secondValue = next() % 3 == 0;
        const float value = static_cast<float>(static_cast<int>(next() % 2001) - 1000) * 0.37f;
        for (int y = 0; y < f.height(); ++y)
            for (int x = 0; x < f.width(); ++x) {
                const std::uint32_t r = next() % 100;
                f.pixels(x, y) = r < pNonFinite ? (r % 3 == 0   ? std::nanf("")
                                                   : r % 3 == 1 ? INFINITY
                                                                : -INFINITY)
                                                : value;
                const std::uint32_t k = next() % 100;
                f.mask(x, y) = k < pSaturated ? static_cast<std::uint8_t>(MaskSaturated)
                               : k < pMasked  ? std::uint8_t{1}
                                              : std::uint8_t{0};
            }
        if (secondValue) { // one differing pixel, anywhere (the last row included)
            const int x = static_cast<int>(next() % 37), y = next() % 2 ? 28 : static_cast<int>(next() % 29);
            f.pixels(x, y) = value + 1.0f;
        }
        if (!withMask) f.mask = Image<std::uint8_t>();
        const FrameVerdict want = plainVerdict(f), got = frameVerdict(f);
        ++seen[static_cast<int>(want.defect)];
        ASSERT_EQ(static_cast<int>(got.defect), static_cast<int>(want.defect)) << "trial " << trial;
        if (want.defect == FrameDefect::Constant) EXPECT_EQ(got.value, want.value) << "trial " << trial;
    }
    for (int d = 0; d < 4; ++d)
        EXPECT_GT(seen[d], 5) << "defect " << d << " too rarely drawn for the comparison to mean anything";
}

// A real frame is judged on its first valid pixels; the scan still finds a single differing pixel after a
// masked half of the frame, or in its last pixel.
TEST(Reliability, FrameVerdictFindsTheOneDifferingPixelWhereverItIs) {
    for (const bool last : {false, true}) {
        Frame f = frameOf(64, 64, 5.0f, false);
        for (int y = 0; y < 32; ++y)
            for (int x = 0; x < 64; ++x)
                f.mask(x, y) = 1;
        EXPECT_EQ(frameVerdict(f).defect, FrameDefect::Constant);
        f.pixels(last ? 63 : 10, last ? 63 : 40) = 6.0f;
        EXPECT_EQ(frameVerdict(f).defect, FrameDefect::None) << last;
        EXPECT_EQ(errorOf([&] { validateForReduction(f); }), "");
    }
}

TEST(Reliability, ABrokenHeaderWcsIsMarkedAndAMissingOneIsNot) {
    test::TempDir dir("gpuphot_reliab");
    Image<float> img(16, 16, 1.0f);
    Header h;
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC--TAN");
    for (auto [k, v] : {std::pair{"CRPIX1", 8.0},
                        {"CRPIX2", 8.0},
                        {"CRVAL1", 10.0},
                        {"CRVAL2", 20.0},
                        {"CD1_1", 1e-4},
                        {"CD1_2", 2e-4},
                        {"CD2_1", 1e-4},
                        {"CD2_2", 2e-4}}) // rows proportional: singular
        h.set(k, v);
    writeFitsImage(dir / "singular.fits", img.view(), h);
    writeFitsImage(dir / "none.fits", img.view(), Header{});
    const Frame broken = readFrame(dir / "singular.fits");
    EXPECT_FALSE(broken.wcs);
    EXPECT_TRUE(broken.wcsBroken);
    EXPECT_NE(broken.wcsProblem.find("singular"), std::string::npos) << broken.wcsProblem;
    const Frame none = readFrame(dir / "none.fits");
    EXPECT_FALSE(none.wcs);
    EXPECT_FALSE(none.wcsBroken);
}

TEST(Reliability, TemporaryNamesAreRecognisedOnlyInTheirDocumentedForm) {
    EXPECT_TRUE(isAtomicTemporaryName(".f.cat.fits.node-1.12345.0a1b2c3d.tmp"));
    EXPECT_TRUE(isAtomicTemporaryName(".f.report.json.h.1.ffffffff.tmp"));
    EXPECT_FALSE(isAtomicTemporaryName("f.cat.fits.node-1.12345.0a1b2c3d.tmp")) << "not hidden";
    EXPECT_FALSE(isAtomicTemporaryName(".f.cat.fits.node-1.12345.0a1b2c3.tmp")) << "7 hex digits";
    EXPECT_FALSE(isAtomicTemporaryName(".f.cat.fits.node_1.12345.0a1b2c3d.tmp")) << "'_' in the host";
    EXPECT_FALSE(isAtomicTemporaryName(".f.cat.fits.node.12x45.0a1b2c3d.tmp")) << "pid not a number";
    EXPECT_FALSE(isAtomicTemporaryName(".node.12345.0a1b2c3d.tmp")) << "no final name";
    EXPECT_FALSE(isAtomicTemporaryName(".tmp"));
    EXPECT_FALSE(isAtomicTemporaryName(""));
    // A failed write leaves nothing; a committed one only the final file.
    test::TempDir dir("gpuphot_reliab");
    {
        AtomicOutput out(dir / "a.txt");
        std::ofstream(out.tempPath()) << "half";
        EXPECT_TRUE(isAtomicTemporaryName(fs::path(out.tempPath()).filename().string())) << out.tempPath();
    }
    EXPECT_TRUE(fs::is_empty(dir.path));
    writeTextFileAtomic(dir / "b.txt", "whole\n");
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir.path))
        n += e.path().filename() == "b.txt" ? 1 : 100;
    EXPECT_EQ(n, 1u);
}

// ---- fuzzer findings (tests/fuzz), each once a crash or a sanitizer report ------------------------

TEST(Reliability, FuzzRefcatHeaderLineWithoutFinalNewline) {
    // fuzz_refcat: a CSV whose header is the last line, without '\n', read past the end of the text
    // (heap-buffer-overflow in the row-count estimate of reference_catalog.cpp).
    test::TempDir dir("gpuphot_reliab");
    std::ofstream(dir / "header_only.csv") << "alpha,delta,m,pmra,pm";
    RefColumnMap map;
    map.ra = "alpha";
    map.dec = "delta";
    map.mag = "m";
    try {
        (void)readReferenceCatalog(dir / "header_only.csv", map);
        ADD_FAILURE() << "a catalog without rows must be refused";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("header_only.csv"), std::string::npos) << e.what();
    }
}

TEST(Reliability, FuzzHeaderWcsMalformedCtypeIsRefusedWithoutLeaking) {
    // fuzz_header_wcs: CTYPE2 = 'DEC-2-TAN' made WCSLIB's celfix leak its error message (LeakSanitizer).
    Header h;
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC-2-TAN");
    for (auto [k, v] : {std::pair{"CRPIX1", 512.5},
                        {"CRPIX2", 512.5},
                        {"CRVAL1", 45.0},
                        {"CRVAL2", 89.9},
                        {"CD1_1", -5.5e-4},
                        {"CD1_2", 0.0},
                        {"CD2_1", 0.0},
                        {"CD2_2", 5.5e-4}})
        h.set(k, v);
    try {
        const auto w = Wcs::tryFromHeader(h);
        EXPECT_FALSE(w.has_value());
    } catch (const InvalidInput&) {
        // broken, as documented
    }
}

// The deep fuzz run: an AIPS NCP/GLS header that WCSLIB's wcsset refuses made celfix (which runs wcsset
// first) lose its error objects, and the second wcsset the linear transformation's arrays (LeakSanitizer;
// tests/fuzz/regressions/header_wcs/celfix_failed_wcsset_linset_leak.hdr, gls_unit_not_an_angle_leak.hdr).
TEST(Reliability, FuzzHeaderWcsAipsProjectionThatWcssetRefusesIsBrokenWithoutLeaking) {
    auto header = [](const char* proj, double crval2, const char* cunit1) {
        Header h;
        h.set("CTYPE1", std::string("RA---") + proj);
        h.set("CTYPE2", std::string("DEC--") + proj);
        h.set("CUNIT1", cunit1);
        for (auto [k, v] : {std::pair{"CRPIX1", 512.5},
                            {"CRPIX2", 512.5},
                            {"CRVAL1", 45.0},
                            {"CRVAL2", crval2},
                            {"CDELT1", -5.5e-4},
                            {"CDELT2", 5.5e-4}})
            h.set(k, v);
        return h;
    };
    auto brokenBecause = [](const Header& h) { // a broken celestial WCS throws; none is "why" empty
        std::string why;
        try {
            if (Wcs::tryFromHeader(h, &why)) return std::string("a valid WCS");
        } catch (const InvalidInput& e) {
            return std::string(e.what());
        }
        return why;
    };
    // NCP at the equator: wcsset refuses it ("NCP blows up on the equator").
    EXPECT_NE(brokenBecause(header("NCP", 0.0, "deg")).find("NCP blows up"), std::string::npos);
    EXPECT_NE(brokenBecause(header("GLS", 10.0, "d-TAB")).find("CUNIT1"), std::string::npos);
    std::string why;
    // Valid NCP and GLS headers are still translated (to SIN and SFL) and transform.
    for (const char* proj : {"NCP", "GLS"}) {
        why.clear();
        const auto w = Wcs::tryFromHeader(header(proj, 30.0, "deg"), &why);
        ASSERT_TRUE(w.has_value()) << proj << ": " << why;
        const auto [ra, dec] = w->pixelToWorld(511.5, 511.5); // CRPIX (FITS pixels count from 1)
        EXPECT_NEAR(ra, 45.0, 1e-6) << proj;
        EXPECT_NEAR(dec, 30.0, 1e-6) << proj;
    }
    for (const char* file : {"celfix_failed_wcsset_linset_leak.hdr", "gls_unit_not_an_angle_leak.hdr"}) {
        std::ifstream in(std::string(GPUPHOT_TEST_DATA) + "/../fuzz/regressions/header_wcs/" + file,
                         std::ios::binary);
        const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
        ASSERT_GT(text.size(), 80u) << file;
        EXPECT_NE(brokenBecause(Header::fromFitsString(text)), "a valid WCS") << file;
    }
}

TEST(Reliability, FuzzHeaderWcsDateObsWithoutMjdObsDoesNotLeak) {
    // fuzz_header_wcs: datfix's informative "Set MJD-OBS ... from DATE-OBS" error object was lost by
    // WCSLIB 7.12's unitfix (LeakSanitizer on any such header). The WCS itself is valid and must parse;
    // the leak itself is caught by LeakSanitizer in tests/sanitize/run.sh.
    Header h;
    h.set("DATE-OBS", "2024-03-21T02:57:41.760");
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC--TAN");
    h.set("CUNIT1", "deg");
    h.set("CUNIT2", "deg");
    for (auto [k, v] : {std::pair{"CRPIX1", 12.5},
                        {"CRPIX2", 10.5},
                        {"CRVAL1", 150.0},
                        {"CRVAL2", 20.0},
                        {"CD1_1", -2.7777777777777778e-4},
                        {"CD1_2", 0.0},
                        {"CD2_1", 0.0},
                        {"CD2_2", 2.7777777777777778e-4}})
        h.set(k, v);
    std::string why;
    const auto w = Wcs::tryFromHeader(h, &why);
    ASSERT_TRUE(w.has_value()) << why;
    const std::vector<double> x = {11.5}, y = {9.5};
    std::vector<double> ra(1), dec(1);
    w->pixelToWorld(x, y, ra, dec); // 0-based pixel (11.5, 9.5) is CRPIX (12.5, 10.5)
    EXPECT_NEAR(ra[0], 150.0, 1e-9);
    EXPECT_NEAR(dec[0], 20.0, 1e-9);
}

TEST(Reliability, FuzzConfigNumberBeyondDoubleRangeIsATypedError) {
    // fuzz_config: a number beyond double's range made nlohmann::json throw out_of_range (not a
    // parse_error), which escaped loadPipelineConfig untyped.
    test::TempDir dir("gpuphot_reliab");
    std::ofstream(dir / "huge.json") << R"({"detection": {"threshold": 7e6208}})";
    try {
        (void)loadPipelineConfig(dir / "huge.json");
        ADD_FAILURE() << "a number beyond double's range must be refused";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("huge.json"), std::string::npos) << e.what();
    }
}

namespace {

// Writes a small 32-bit integer image (tile-compressed with `compression`, CFITSIO's file-name syntax)
// with CFITSIO directly. Pixel i is 100 + i % 7.
void writeCfitsio(const std::string& path, const char* compression = "[compress R 16,1]") {
    int status = 0;
    fitsfile* f = nullptr;
    const std::string name = "!" + path + compression;
    fits_create_file(&f, name.c_str(), &status);
    long axes[2] = {16, 12};
    fits_create_img(f, LONG_IMG, 2, axes, &status);
    std::vector<int> px(16 * 12);
    for (std::size_t i = 0; i < px.size(); ++i)
        px[i] = static_cast<int>(100 + i % 7);
    fits_write_img(f, TINT, 1, static_cast<long>(px.size()), px.data(), &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0);
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
}

// bytes with the card of `key` (8 characters, padded) replaced by `name` (the key unless given) "= " value,
// padded to 80 characters; "" when there is no such card.
std::string withCard(std::string bytes, const std::string& key, const std::string& value,
                     std::string name = "") {
    const std::size_t at = bytes.find(key + "= ");
    if (at == std::string::npos) return std::string();
    std::string card = (name.empty() ? key : name) + "= " + value;
    card.resize(80, ' ');
    return bytes.replace(at, 80, card);
}

// A two-row binary table (ra, dec, mag, all D) written with CFITSIO directly, and its column map.
void writeSmallCatalog(const fs::path& path) {
    int status = 0;
    fitsfile* f = nullptr;
    fits_create_file(&f, ("!" + path.string()).c_str(), &status);
    char c1[] = "ra", c2[] = "dec", c3[] = "mag", d[] = "D";
    char* names[] = {c1, c2, c3};
    char* forms[] = {d, d, d};
    fits_create_tbl(f, BINARY_TBL, 0, 3, names, forms, nullptr, "CAT", &status);
    const double ra[2] = {10.0, 10.1}, dec[2] = {20.0, 20.1}, mag[2] = {12.0, 13.0};
    fits_write_col(f, TDOUBLE, 1, 1, 1, 2, const_cast<double*>(ra), &status);
    fits_write_col(f, TDOUBLE, 2, 1, 1, 2, const_cast<double*>(dec), &status);
    fits_write_col(f, TDOUBLE, 3, 1, 1, 2, const_cast<double*>(mag), &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0);
}

RefColumnMap smallCatalogMap() {
    RefColumnMap map;
    map.ra = "ra";
    map.dec = "dec";
    map.mag = "mag";
    return map;
}

} // namespace

TEST(Reliability, FuzzFitsReaderZeroTileSizeIsRefusedBeforeCfitsioDividesByIt) {
    // fuzz_fits_reader (a CI fuzz finding): ZTILE2 = 0 in a Rice-compressed image made CFITSIO
    // 4.2.0 divide by zero (SIGFPE, the process died) as soon as it moved to the HDU.
    const std::string repro =
        std::string(GPUPHOT_TEST_DATA) + "/../fuzz/regressions/fits_reader/ztile_zero_sigfpe.fits";
    for (const auto& call : std::vector<std::function<void()>>{[&] { (void)readFrame(repro, {}); },
                                                               [&] { (void)listHdus(repro); },
                                                               [&] { (void)readHeader(repro); }}) {
        const std::string msg = errorOf(call);
        EXPECT_NE(msg.find("ZTILE2 = 0"), std::string::npos) << msg;
    }
    // A valid Rice file reads; with its ZTILE2 card set to 0 or -3 (or 0.5) it is refused the same way.
    test::TempDir dir("gpuphot_reliab");
    const fs::path path = dir / "rice.fits";
    writeCfitsio(path.string());
    ASSERT_NO_THROW((void)readFrame(path.string(), {})) << "the unmodified file must read";
    std::string bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const std::size_t card = bytes.find("ZTILE2  =");
    ASSERT_NE(card, std::string::npos);
    for (const char* v : {"0", "-3", "0.5"}) {
        std::string changed = bytes;
        std::string value(20, ' ');
        value.replace(20 - std::strlen(v), std::strlen(v), v);
        changed.replace(card + 10, 20, value);
        const fs::path bad = dir / "rice_bad.fits";
        std::ofstream(bad, std::ios::binary) << changed;
        const std::string msg = errorOf([&] { (void)readFrame(bad.string(), {}); });
        EXPECT_NE(msg.find("ZTILE2 = " + std::string(v)), std::string::npos) << v << ": " << msg;
    }
    // (a CI fuzz finding) a ZTILEn or ZNAXISn that is no integer at all: SIGFPE too.
    const std::string repro2 = std::string(GPUPHOT_TEST_DATA) +
                               "/../fuzz/regressions/fits_reader/ztile1_not_an_integer_repeated.fits";
    EXPECT_NE(errorOf([&] { (void)readFrame(repro2, {}); }).find("ZTILE1 = "), std::string::npos);
    for (const char* key : {"ZTILE1  =", "ZNAXIS1 ="})
        for (const char* v : {"x", "1.5", "0"}) {
            std::string changed = bytes;
            const std::size_t at = changed.find(key);
            ASSERT_NE(at, std::string::npos) << key;
            std::string value(20, ' ');
            value.replace(20 - std::strlen(v), std::strlen(v), v);
            changed.replace(at + 10, 20, value);
            const fs::path bad = dir / "rice_bad2.fits";
            std::ofstream(bad, std::ios::binary) << changed;
            const std::string msg = errorOf([&] { (void)readFrame(bad.string(), {}); });
            EXPECT_NE(msg.find(std::string(key).substr(0, 6)), std::string::npos) << key << v << ": " << msg;
            EXPECT_NE(msg.find("malformed tile-compressed image"), std::string::npos)
                << key << v << ": " << msg;
        }
}

TEST(Reliability, FuzzFitsReaderTileDescriptorBeyondTheHeapIsRefusedBeforeAllocating) {
    // fuzz_fits_reader: a tile descriptor (element count) of ~1.9e9 in a 9 kB file made CFITSIO allocate
    // 1.9 GB for the compressed tile before reading it. Refused from the descriptors.
    test::TempDir dir("gpuphot_reliab");
    const fs::path path = dir / "rice.fits";
    writeCfitsio(path.string());
    ASSERT_NO_THROW((void)readFrame(path.string(), {})) << "the unmodified file must read";
    // The descriptor of tile 1 (1PB: count, offset as big-endian int32) opens the table's data.
    long long dataStart = 0;
    {
        int status = 0, type = 0;
        fitsfile* f = nullptr;
        fits_open_diskfile(&f, path.c_str(), READONLY, &status);
        fits_movabs_hdu(f, 2, &type, &status);
        long long head = 0, end = 0;
        fits_get_hduaddrll(f, &head, &dataStart, &end, &status);
        fits_close_file(f, &status);
        ASSERT_EQ(status, 0);
    }
    std::string bytes = slurp(path);
    const unsigned char huge[4] = {0x70, 0x00, 0x00, 0x00};
    std::memcpy(&bytes[static_cast<std::size_t>(dataStart)], huge, 4);
    spit(path, bytes);
    try {
        (void)readFrame(path.string(), {});
        ADD_FAILURE() << "a tile pointing outside the heap must be refused";
    } catch (const InvalidInput& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("rice.fits"), std::string::npos) << msg;
        EXPECT_NE(msg.find("outside the heap"), std::string::npos) << msg;
    }
}

TEST(Reliability, FuzzFitsReaderZeroTileSizeInATruncatedHeaderBlockIsRefused) {
    // fuzz_fits_reader (a CI fuzz finding): a ZTILE2 = 0 guard must also see a header whose last 2880-byte
    // block is cut short (the file ends 143 bytes before the block does). CFITSIO reads such a header and
    // divides by zero (SIGFPE); the raw scan reads the partial block too.
    const std::string repro = std::string(GPUPHOT_TEST_DATA) +
                              "/../fuzz/regressions/fits_reader/ztile_zero_in_truncated_header_block.fits";
    ASSERT_NE(fs::file_size(repro) % 2880, 0u) << "the reproducer must end inside a block";
    for (const auto& call : std::vector<std::function<void()>>{[&] { (void)readFrame(repro, {}); },
                                                               [&] { (void)listHdus(repro); },
                                                               [&] { (void)readHeader(repro); }}) {
        const std::string msg = errorOf(call);
        EXPECT_NE(msg.find("ZTILE2 = 0"), std::string::npos) << msg;
    }
}

TEST(Reliability, FuzzRefcatLongUnquotedColumnNameIsRefusedBeforeCfitsioParsesIt) {
    // fuzz_refcat: an unquoted TTYPEn value of 70 characters overflowed CFITSIO 4.2.0's 70-byte column
    // name (its fortified strcpy aborted the process). Refused, naming the file and the card.
    test::TempDir dir("gpuphot_reliab");
    const fs::path path = dir / "cat.fits";
    ASSERT_NO_FATAL_FAILURE(writeSmallCatalog(path));
    const RefColumnMap map = smallCatalogMap();
    ASSERT_EQ(readReferenceCatalog(path.string(), map).size(), 2u) << "the unmodified file must read";
    std::string bytes = slurp(path);
    const auto at = bytes.find("TTYPE3  = 'mag");
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(at % 80, 0u);
    bytes.replace(at, 80, "TTYPE3  = " + std::string(70, 'm'));
    spit(path, bytes);
    for (int reader = 0; reader < 2; ++reader) {
        try {
            if (reader == 0)
                (void)readReferenceCatalog(path.string(), map);
            else
                (void)readFrame(path.string(), {});
            ADD_FAILURE() << "reader " << reader << ": the broken card must be refused";
        } catch (const InvalidInput& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("cat.fits"), std::string::npos) << msg;
            EXPECT_NE(msg.find("TTYPE3"), std::string::npos) << msg;
        }
    }
}

TEST(Reliability, FuzzRefcatStructuralKeywordThatIsNotAnIntegerIsRefusedBeforeCfitsioParsesIt) {
    // fuzz_refcat (a CI fuzz finding): "NAXIS2 = $ 3" in a table HDU. CFITSIO 4.2.0 answers NOT_POS_INT
    // and leaves state behind: the NEXT open of the same file in the process asks calloc for gigabytes (the
    // fuzzer's second execution of the input). Our raw header scan refuses it.
    const std::string repro =
        std::string(GPUPHOT_TEST_DATA) + "/../fuzz/regressions/refcat/naxis2_not_an_integer_reopen_oom.bin";
    const std::string fuzzInput = slurp(repro);
    ASSERT_GT(fuzzInput.size(), 2880u);
    test::TempDir dir("gpuphot_reliab");
    const fs::path fromFuzz = dir / "fuzz.fits";
    spit(fromFuzz, fuzzInput.substr(1)); // the first byte is the target's mode (0: a .fits file, no map)
    for (int twice = 0; twice < 2; ++twice) {
        const std::string msg =
            errorOf([&] { (void)readReferenceCatalog(fromFuzz.string(), RefColumnMap{}); });
        EXPECT_NE(msg.find("NAXIS2 = $"), std::string::npos) << msg;
        EXPECT_NE(msg.find("not an integer"), std::string::npos) << msg;
    }
    // A valid table reads; each structural keyword spoilt in turn is refused by both readers, naming it.
    const fs::path path = dir / "cat.fits";
    ASSERT_NO_FATAL_FAILURE(writeSmallCatalog(path));
    const RefColumnMap map = smallCatalogMap();
    ASSERT_EQ(readReferenceCatalog(path.string(), map).size(), 2u) << "the unmodified file must read";
    const std::string good = slurp(path);
    for (const char* key : {"NAXIS2  =", "TFIELDS =", "PCOUNT  =", "BITPIX  ="}) {
        std::string bad = good;
        const auto at = bad.find(key, 2880); // in the table's header
        ASSERT_NE(at, std::string::npos) << key;
        bad.replace(at + 10, 20, "               $   3");
        spit(path, bad);
        for (int reader = 0; reader < 2; ++reader) {
            const std::string msg = errorOf([&] {
                if (reader == 0)
                    (void)readReferenceCatalog(path.string(), map);
                else
                    (void)readFrame(path.string(), {});
            });
            EXPECT_NE(msg.find(std::string(key).substr(0, std::string(key).find(' '))), std::string::npos)
                << msg;
            EXPECT_NE(msg.find("not an integer"), std::string::npos) << msg;
        }
    }
    spit(path, good);
    EXPECT_EQ(readReferenceCatalog(path.string(), map).size(), 2u);
}

// ---- fuzzer findings inside WCSLIB and CFITSIO, guarded in our code ------------------------------

namespace {

const std::string kRegressions = std::string(GPUPHOT_TEST_DATA) + "/../fuzz/regressions";

Header tanHeader() {
    Header h;
    h.set("NAXIS", 2);
    h.set("NAXIS1", 64);
    h.set("NAXIS2", 48);
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC--TAN");
    h.set("CUNIT1", "deg");
    h.set("CUNIT2", "deg");
    for (auto [k, v] : {std::pair{"CRPIX1", 32.5},
                        {"CRPIX2", 24.5},
                        {"CRVAL1", 210.0},
                        {"CRVAL2", -35.0},
                        {"CD1_1", -1e-4},
                        {"CD1_2", 0.0},
                        {"CD2_1", 0.0},
                        {"CD2_2", 1e-4}})
        h.set(k, v);
    return h;
}

// The world coordinates of 0-based pixel (31.5, 23.5), i.e. CRPIX: (CRVAL1, CRVAL2) for a valid WCS.
std::pair<double, double> worldAtCrpix(const Wcs& w) {
    const std::vector<double> x = {31.5}, y = {23.5};
    std::vector<double> ra(1), dec(1);
    w.pixelToWorld(x, y, ra, dec);
    return {ra[0], dec[0]};
}

} // namespace

TEST(Reliability, FuzzHeaderWcsUnterminatedStringIsABrokenWcsNotAnAbort) {
    // fuzz_header_wcs: CUNIT1 = 'deg ... without its closing quote ran into the next cards; WCSLIB 7.12's
    // wcspih read the string across them and its fortified strcpy aborted the process. The reproducer
    // itself, then the same damage on a header whose WCS is otherwise valid.
    std::ifstream in(kRegressions + "/header_wcs/wcspih_unterminated_cunit1.hdr", std::ios::binary);
    ASSERT_TRUE(in) << "reproducer missing";
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const std::string msg = errorOf([&] { (void)Wcs::tryFromHeader(Header::fromFitsString(text)); });
    EXPECT_NE(msg.find("CUNIT1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unterminated"), std::string::npos) << msg;

    const auto good = Wcs::tryFromHeader(tanHeader());
    ASSERT_TRUE(good.has_value());
    EXPECT_NEAR(worldAtCrpix(*good).first, 210.0, 1e-9);
    EXPECT_NEAR(worldAtCrpix(*good).second, -35.0, 1e-9);
    Header h = tanHeader();
    h.setRaw("CUNIT1", "'deg    NAXIS   =                    2");
    const std::string why = errorOf([&] { (void)Wcs::tryFromHeader(h); });
    EXPECT_NE(why.find("CUNIT1"), std::string::npos) << why;
    EXPECT_NE(why.find("unterminated"), std::string::npos) << why;
    // A string longer than a card can hold (formatting would cut its closing quote): the same damage.
    h = tanHeader();
    h.set("CTYPE2", "DEC--TAN" + std::string(90, 'X'));
    const std::string tooLong = errorOf([&] { (void)Wcs::tryFromHeader(h); });
    EXPECT_NE(tooLong.find("CTYPE2"), std::string::npos) << tooLong;
    EXPECT_NE(tooLong.find("more than a card holds"), std::string::npos) << tooLong;
}

TEST(Reliability, FuzzHeaderWcsCelestialUnitThatIsNotAnAngleIsRefusedWithoutLeaking) {
    // fuzz_header_wcs (the 5-minute run): CUNIT1 = 'deg    0' (unitfix makes it 'deg0') made WCSLIB 7.12's
    // wcsset free the unit parser's error object without its message (LeakSanitizer, 42 bytes). Refused
    // before wcsset; the leak itself is LeakSanitizer's to see in tests/sanitize/run.sh.
    std::ifstream in(kRegressions + "/header_wcs/wcsset_cunit1_not_an_angle.hdr", std::ios::binary);
    ASSERT_TRUE(in) << "reproducer missing";
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::string msg = errorOf([&] { (void)Wcs::tryFromHeader(Header::fromFitsString(text)); });
    EXPECT_NE(msg.find("CUNIT1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not an angle"), std::string::npos) << msg;
    for (const char* unit : {"deg    0", "m", "Hz"}) {
        Header h = tanHeader();
        h.set("CUNIT2", unit);
        msg = errorOf([&] { (void)Wcs::tryFromHeader(h); });
        EXPECT_NE(msg.find("CUNIT2"), std::string::npos) << unit << ": " << msg;
    }
    // An angle in other units is still an angle: 'arcsec' scales CD (1e-4 arcsec/px here).
    Header h = tanHeader();
    h.set("CUNIT1", "arcsec");
    h.set("CUNIT2", "arcsec");
    std::string why;
    const auto w = Wcs::tryFromHeader(h, &why);
    ASSERT_TRUE(w.has_value()) << why;
    EXPECT_NEAR(w->pixelScaleArcsec(31.5, 23.5), 1e-4, 1e-9);
}

TEST(Reliability, FuzzHeaderWcsAbsurdAxisCountIsRefusedBeforeWcslibAllocates) {
    // fuzz_header_wcs (the 5-minute run): NAXIS = 950970851 made WCSLIB 7.12's wcspih calloc 7.6 GB.
    std::ifstream in(kRegressions + "/header_wcs/wcspih_absurd_naxis.hdr", std::ios::binary);
    ASSERT_TRUE(in) << "reproducer missing";
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::string msg = errorOf([&] { (void)Wcs::tryFromHeader(Header::fromFitsString(text)); });
    EXPECT_NE(msg.find("NAXIS = 950970851"), std::string::npos) << msg;
    Header h = tanHeader();
    h.set("WCSAXES", 100000);
    msg = errorOf([&] { (void)Wcs::tryFromHeader(h); });
    EXPECT_NE(msg.find("WCSAXES"), std::string::npos) << msg;
    h.set("WCSAXES", 2);
    EXPECT_TRUE(Wcs::tryFromHeader(h).has_value());
}

TEST(Reliability, FuzzHeaderWcsAxisCountThatIsNotAPlainIntegerIsRefusedBeforeWcslibAllocates) {
    // fuzz_header_wcs (a CI fuzz finding): NAXIS = 361665E-05 is 3.6 as a number, but WCSLIB 7.12's
    // wcspih reads its leading digits and calloc's 15.6 GB (418 MB leaked in the CI run).
    std::ifstream in(kRegressions + "/header_wcs/wcspih_naxis_not_an_integer.hdr", std::ios::binary);
    ASSERT_TRUE(in) << "reproducer missing";
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::string msg = errorOf([&] { (void)Wcs::tryFromHeader(Header::fromFitsString(text)); });
    EXPECT_NE(msg.find("NAXIS = 361665E-05"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not an axis count"), std::string::npos) << msg;
    for (const char* value : {"2.5", "2E0", "0x2", "2 2", "'2'", "361665E-05"}) {
        Header h = tanHeader();
        h.setRaw("WCSAXES", value);
        msg = errorOf([&] { (void)Wcs::tryFromHeader(h); });
        EXPECT_NE(msg.find("WCSAXES"), std::string::npos) << "WCSAXES = '" << value << "': " << msg;
    }
    Header h = tanHeader();
    h.setRaw("WCSAXES", "+2");
    EXPECT_TRUE(Wcs::tryFromHeader(h).has_value());
}

TEST(Reliability, FuzzHeaderWcsAipsSpectralTypeIsTranslatedWithoutLeaking) {
    // fuzz_header_wcs (a CI fuzz finding): WCSLIB 7.12's spcfix loses a message translating
    // CTYPE2 = 'FELO-OBS...'; the header WCS translates AIPS spectral types through spcaips itself. Under
    // LeakSanitizer (the sanitizer run, and the fuzz gate's replay) a leak fails this.
    std::ifstream in(kRegressions + "/header_wcs/spcfix_felo_obs_leak.hdr", std::ios::binary);
    ASSERT_TRUE(in) << "reproducer missing";
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    // CTYPE2 becomes 'VOPT-F2W': RA without Dec, a broken header WCS (a typed error)
    const std::string msg = errorOf([&] { (void)Wcs::tryFromHeader(Header::fromFitsString(text)); });
    EXPECT_NE(msg.find("Unmatched celestial axes"), std::string::npos) << msg;
    std::string why;
    // A cube with an AIPS 'FELO-HEL' axis keeps its celestial WCS: without the translation wcsset refuses it.
    Header h = tanHeader();
    h.set("NAXIS", 3);
    h.set("NAXIS3", 8);
    h.set("WCSAXES", 3);
    h.set("CTYPE3", "FELO-HEL");
    h.set("CRPIX3", 1.0);
    h.set("CRVAL3", 1.5e6);
    h.set("CDELT3", 1.0e4);
    h.set("VELREF", 2);
    h.set("RESTFRQ", 1.420405752e9);
    h.set("CD3_3", 1.0e4);
    const auto w = Wcs::tryFromHeader(h, &why);
    ASSERT_TRUE(w.has_value()) << why;
    const auto [ra, dec] = worldAtCrpix(*w);
    EXPECT_NEAR(ra, 210.0, 1e-9);
    EXPECT_NEAR(dec, -35.0, 1e-9);
    EXPECT_EQ(w->toHeader().getString("SPECSYS").value_or(""), "BARYCENT"); // VELREF 2: barycentric
}

TEST(Reliability, FuzzHeaderWcsDamagedNonWcsCardsDoNotAffectTheWcs) {
    // Damaged cards that are not WCS keywords are left out of what WCSLIB sees: the WCS is unchanged.
    Header h = tanHeader();
    h.setRaw("OBJECT", "'M 83 field, no closing quote");
    h.setRaw("OBSERVER", "'A. B.' 'C. D.'");
    h.setRaw("FILTER", std::string(1, '\'') + std::string(80, 'r') + "'");
    h.setRaw("HIERARCH ESO INS FILT1 NAME", "'" + std::string(90, 'x'));
    h.addComment("a comment with a stray quote ' and a slash /");
    std::string why;
    const auto w = Wcs::tryFromHeader(h, &why);
    ASSERT_TRUE(w.has_value()) << why;
    EXPECT_NEAR(worldAtCrpix(*w).first, 210.0, 1e-9);
    EXPECT_NEAR(worldAtCrpix(*w).second, -35.0, 1e-9);
    EXPECT_NEAR(w->pixelScaleArcsec(31.5, 23.5), 0.36, 1e-6);
}

TEST(Reliability, FuzzHeaderWcsDamagedWcsCardLeavesTheFrameReadableWithABrokenWcs) {
    // As for any other unusable header WCS: the frame reads, the WCS is marked broken with the reason
    // (reduce then refuses it unless --ref or --ignore-header-wcs; tests/app/cli_bad_input_test.cpp).
    test::TempDir dir("gpuphot_reliab");
    const fs::path path = dir / "cunit.fits";
    Image<float> img(16, 16, 1.0f);
    Header h = tanHeader();
    h.remove("NAXIS");
    h.remove("NAXIS1");
    h.remove("NAXIS2");
    writeFitsImage(path.string(), img.view(), h);
    ASSERT_TRUE(readFrame(path.string()).wcs) << "the unmodified file must have a WCS";
    std::string bytes = slurp(path);
    const auto at = bytes.find("CUNIT1  = 'deg");
    ASSERT_NE(at, std::string::npos);
    ASSERT_EQ(at % 80, 0u);
    std::string card = "CUNIT1  = 'deg    ";
    card.resize(80, ' ');
    bytes.replace(at, 80, card);
    spit(path, bytes);
    const Frame f = readFrame(path.string());
    EXPECT_FALSE(f.wcs);
    EXPECT_TRUE(f.wcsBroken);
    EXPECT_NE(f.wcsProblem.find("CUNIT1"), std::string::npos) << f.wcsProblem;
    EXPECT_EQ(f.pixels.width(), 16);
    EXPECT_FLOAT_EQ(f.pixels(3, 4), 1.0f);
}

namespace {

std::string gzipped(const std::string& data) {
    z_stream z{};
    EXPECT_EQ(deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&z, data.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = static_cast<uInt>(data.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

std::string gzipProblem(const std::string& bytes, std::size_t maxOut) {
    return gzipTileProblem(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), maxOut);
}

} // namespace

TEST(Reliability, GzipTileCheckAcceptsCompleteStreamsOnly) {
    std::string pixels;
    for (int i = 0; i < 4000; ++i)
        pixels += static_cast<char>(i * 7 % 251);
    const std::string gz = gzipped(pixels);
    ASSERT_GT(gz.size(), 20u);
    EXPECT_EQ(gzipProblem(gz, pixels.size()), "");
    EXPECT_EQ(gzipProblem(gz + "trailing bytes", pixels.size()), "") << "CFITSIO ignores them too";
    EXPECT_NE(gzipProblem(gz.substr(0, gz.size() - 9), pixels.size()).find("truncated"), std::string::npos);
    EXPECT_NE(gzipProblem(gz.substr(0, gz.size() / 2), pixels.size()).find("truncated"), std::string::npos);
    EXPECT_NE(gzipProblem(gz, pixels.size() - 1).find("expands beyond"), std::string::npos);
    std::string bad = gz;
    bad[1] = 'x'; // not the gzip magic
    EXPECT_NE(gzipProblem(bad, pixels.size()).find("corrupt"), std::string::npos);
    // A highly compressible tile: 1 MB of zeros in ~1 kB must not be mistaken for a bomb within its size.
    const std::string zeros(1 << 20, '\0');
    EXPECT_EQ(gzipProblem(gzipped(zeros), zeros.size()), "");
    EXPECT_NE(gzipProblem(gzipped(zeros), zeros.size() / 2).find("expands beyond"), std::string::npos);
}

TEST(Reliability, FuzzFitsReaderTruncatedGzipTileIsRefusedBeforeCfitsioInflatesIt) {
    // fuzz_fits_reader: a GZIP_2 tile whose gzip stream ends early made CFITSIO 4.2.0 grow its output
    // buffer by 28 800 bytes forever (it takes zlib's Z_BUF_ERROR for "need more space"); a 12 kB file
    // ran until memory ran out. The reproducer, then the same damage made to a valid GZIP_1 file.
    const std::string repro = kRegressions + "/fits_reader/gzip_tile_truncated_stream.fits";
    ASSERT_TRUE(fs::exists(repro));
    std::string msg = errorOf([&] { (void)readFrame(repro); });
    EXPECT_NE(msg.find("gzip_tile_truncated_stream.fits"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tile 11"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

    test::TempDir dir("gpuphot_reliab");
    const fs::path path = dir / "gzip.fits";
    writeCfitsio(path.string(), "[compress G 16,1]");
    const Frame ok = readFrame(path.string());
    ASSERT_EQ(ok.pixels.width(), 16);
    ASSERT_EQ(ok.pixels.height(), 12);
    for (int i = 0; i < 16 * 12; ++i)
        ASSERT_EQ(ok.pixels(i % 16, i / 16), static_cast<float>(100 + i % 7)) << "pixel " << i;
    // Shorten tile 3's stream by 6 bytes (its descriptor: count, offset as big-endian int32, row 3).
    long long dataStart = 0, rowBytes = 0;
    {
        int status = 0, type = 0;
        fitsfile* f = nullptr;
        fits_open_diskfile(&f, path.c_str(), READONLY, &status);
        fits_movabs_hdu(f, 2, &type, &status);
        char cmp[FLEN_VALUE] = {};
        fits_read_key(f, TSTRING, "ZCMPTYPE", cmp, nullptr, &status);
        EXPECT_STREQ(cmp, "GZIP_1");
        fits_read_key(f, TLONGLONG, "NAXIS1", &rowBytes, nullptr, &status); // the tile table's row size
        long long head = 0, end = 0;
        fits_get_hduaddrll(f, &head, &dataStart, &end, &status);
        fits_close_file(f, &status);
        ASSERT_EQ(status, 0);
    }
    std::string bytes = slurp(path);
    const std::size_t desc = static_cast<std::size_t>(dataStart + 2 * rowBytes); // row 3, first column
    auto be32 = [&](std::size_t at) {
        unsigned v = 0;
        for (int k = 0; k < 4; ++k)
            v = (v << 8) | static_cast<unsigned char>(bytes[at + k]);
        return v;
    };
    const unsigned count = be32(desc);
    ASSERT_GT(count, 10u);
    const unsigned shorter = count - 6;
    for (int k = 0; k < 4; ++k)
        bytes[desc + k] = static_cast<char>((shorter >> (24 - 8 * k)) & 0xff);
    spit(path, bytes);
    msg = errorOf([&] { (void)readFrame(path.string()); });
    EXPECT_NE(msg.find("gzip.fits"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tile 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

// CFITSIO's Rice codec (exported by libcfitsio, declared in fitsio2.h without C linkage).
extern "C" {
int fits_rcomp(int a[], int nx, unsigned char* c, int clen, int nblock);
int fits_rcomp_short(short a[], int nx, unsigned char* c, int clen, int nblock);
int fits_rcomp_byte(signed char a[], int nx, unsigned char* c, int clen, int nblock);
int fits_rdecomp(unsigned char* c, int clen, unsigned int array[], int nx, int nblock);
int fits_rdecomp_short(unsigned char* c, int clen, unsigned short array[], int nx, int nblock);
int fits_rdecomp_byte(unsigned char* c, int clen, unsigned char array[], int nx, int nblock);
}

namespace {

// CFITSIO's own Rice encoder for `bytePix`-byte pixels (the same one that writes RICE_1 tiles).
std::vector<unsigned char> riceEncoded(const std::vector<int>& px, int bytePix, int blockSize) {
    std::vector<unsigned char> out(px.size() * 8 + 64);
    const int n = static_cast<int>(px.size()), cap = static_cast<int>(out.size());
    int used = -1;
    if (bytePix == 1) {
        std::vector<signed char> a(px.begin(), px.end());
        used = fits_rcomp_byte(a.data(), n, out.data(), cap, blockSize);
    } else if (bytePix == 2) {
        std::vector<short> a(px.begin(), px.end());
        used = fits_rcomp_short(a.data(), n, out.data(), cap, blockSize);
    } else {
        std::vector<int> a = px;
        used = fits_rcomp(a.data(), n, out.data(), cap, blockSize);
    }
    EXPECT_GT(used, 0);
    out.resize(static_cast<std::size_t>(std::max(used, 0)));
    return out;
}

// CFITSIO's decoder on a copy padded with zeros (so that it cannot crash): 0 when it decoded.
int riceDecodedByCfitsio(std::vector<unsigned char> bytes, int pixels, int bytePix, int blockSize) {
    const int clen = static_cast<int>(bytes.size());
    bytes.resize(bytes.size() + 4096, 0);
    std::vector<unsigned int> out(static_cast<std::size_t>(pixels) + 1);
    if (bytePix == 1)
        return fits_rdecomp_byte(bytes.data(), clen, reinterpret_cast<unsigned char*>(out.data()), pixels,
                                 blockSize);
    if (bytePix == 2)
        return fits_rdecomp_short(bytes.data(), clen, reinterpret_cast<unsigned short*>(out.data()), pixels,
                                  blockSize);
    return fits_rdecomp(bytes.data(), clen, out.data(), pixels, blockSize);
}

std::string riceProblem(const std::vector<unsigned char>& bytes, long long pixels, int bytePix,
                        int blockSize) {
    return riceTileProblem(bytes.data(), bytes.size(), pixels, bytePix, blockSize);
}

} // namespace

TEST(Reliability, RiceTileCheckAcceptsCompleteStreamsOnly) {
    // Smooth pixels (Rice codes), flat runs (no bits) and noise (direct coding) in one tile, for every
    // pixel size and two block sizes; every shortened stream must be refused, the whole one accepted.
    std::vector<int> px;
    for (int i = 0; i < 300; ++i)
        px.push_back(i < 100 ? 40 + i % 5 : i < 180 ? 7 : (i * 2654435761u >> 25) - 60);
    for (int bytePix : {1, 2, 4})
        for (int block : {16, 32}) {
            SCOPED_TRACE("bytepix " + std::to_string(bytePix) + ", block " + std::to_string(block));
            const auto enc = riceEncoded(px, bytePix, block);
            ASSERT_GT(enc.size(), 20u);
            EXPECT_EQ(riceProblem(enc, 300, bytePix, block), "");
            for (std::size_t keep = 0; keep < enc.size(); ++keep) {
                const std::vector<unsigned char> cut(enc.begin(), enc.begin() + keep);
                EXPECT_NE(riceProblem(cut, 300, bytePix, block).find("truncated"), std::string::npos)
                    << keep << " of " << enc.size() << " bytes";
            }
            EXPECT_NE(riceProblem(enc, 301, bytePix, block), "") << "one pixel more than was coded";
            EXPECT_EQ(riceProblem(enc, 0, bytePix, block), "");
        }
    EXPECT_NE(riceProblem({1, 2, 3, 4, 5}, 10, 4, 0).find("BLOCKSIZE"), std::string::npos);
    // The fuzzer's pattern: a long run of zero bytes sends CFITSIO's decoder reading without bound.
    std::vector<unsigned char> zeros(64, 0);
    zeros[4] = 0x10; // FS of the first block: a Rice-coded block
    EXPECT_NE(riceProblem(zeros, 16, 4, 32), "");
}

TEST(Reliability, RiceTileCheckAgreesWithCfitsioOnDamagedStreams) {
    // Random damage to valid tiles: whatever the check lets through, CFITSIO decodes without error.
    std::vector<int> px;
    for (int i = 0; i < 200; ++i)
        px.push_back(1000 + (i * 37) % 23 - (i % 50 == 0 ? 900 : 0));
    std::uint32_t seed = 12345;
    auto rnd = [&] { return seed = seed * 1664525u + 1013904223u; };
    int accepted = 0, refused = 0;
    for (int bytePix : {1, 2, 4}) {
        const auto enc = riceEncoded(px, bytePix, 32);
        for (int trial = 0; trial < 400; ++trial) {
            auto bad = enc;
            for (int k = 0; k < 1 + static_cast<int>(rnd() % 3); ++k)
                bad[rnd() % bad.size()] = static_cast<unsigned char>(rnd() >> 24);
            if (rnd() % 2) bad.resize(rnd() % bad.size());
            if (riceProblem(bad, 200, bytePix, 32).empty()) {
                ++accepted;
                EXPECT_EQ(riceDecodedByCfitsio(bad, 200, bytePix, 32), 0) << "bytepix " << bytePix;
            } else {
                ++refused;
            }
        }
    }
    EXPECT_GT(accepted, 50);
    EXPECT_GT(refused, 50);
}

TEST(Reliability, FuzzFitsReaderRiceTileThatRunsOffItsBytesIsRefusedBeforeCfitsioDecodesIt) {
    // fuzz_fits_reader (CI gate): tile 9 of a RICE_1 image holds zero bytes where CFITSIO 4.2.0's
    // decoder looks for the end of a unary code; it read past the heap until it crashed.
    const std::string repro = kRegressions + "/fits_reader/rice_tile_zero_run_segv.fits";
    ASSERT_TRUE(fs::exists(repro));
    std::string msg = errorOf([&] { (void)readFrame(repro); });
    EXPECT_NE(msg.find("rice_tile_zero_run_segv.fits"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tile 9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Rice data ends"), std::string::npos) << msg;

    // Valid Rice frames of every pixel size, with tiles cut by the image's edges, read unchanged.
    test::TempDir dir("gpuphot_reliab");
    for (int bitpix : {BYTE_IMG, SHORT_IMG, LONG_IMG}) {
        SCOPED_TRACE("BITPIX " + std::to_string(bitpix));
        const fs::path path = dir / ("rice" + std::to_string(bitpix) + ".fits");
        int status = 0;
        fitsfile* f = nullptr;
        fits_create_file(&f, ("!" + path.string() + "[compress R 5,5]").c_str(), &status);
        long axes[2] = {16, 12};
        fits_create_img(f, bitpix, 2, axes, &status);
        std::vector<int> px(16 * 12);
        for (std::size_t i = 0; i < px.size(); ++i)
            px[i] = static_cast<int>((i * 2654435761u >> 26) % 60 + (i % 16 > 8 ? 3 : 40));
        // CFITSIO writes compressed images only from arrays of their own type.
        std::vector<unsigned char> px8(px.begin(), px.end());
        std::vector<short> px16(px.begin(), px.end());
        if (bitpix == BYTE_IMG)
            fits_write_img(f, TBYTE, 1, static_cast<long>(px.size()), px8.data(), &status);
        else if (bitpix == SHORT_IMG)
            fits_write_img(f, TSHORT, 1, static_cast<long>(px.size()), px16.data(), &status);
        else
            fits_write_img(f, TINT, 1, static_cast<long>(px.size()), px.data(), &status);
        fits_close_file(f, &status);
        ASSERT_EQ(status, 0);
        const Frame ok = readFrame(path.string());
        ASSERT_EQ(ok.pixels.width(), 16);
        for (int i = 0; i < 16 * 12; ++i)
            ASSERT_EQ(ok.pixels(i % 16, i / 16), static_cast<float>(px[i])) << "pixel " << i;
    }

    // Shorten tile 2's stream of a valid RICE_1 file by 3 bytes: refused, naming the tile.
    const fs::path path = dir / "rice.fits";
    writeCfitsio(path.string(), "[compress R 16,1]");
    long long dataStart = 0, rowBytes = 0;
    {
        int status = 0, type = 0;
        fitsfile* f = nullptr;
        fits_open_diskfile(&f, path.c_str(), READONLY, &status);
        fits_movabs_hdu(f, 2, &type, &status);
        fits_read_key(f, TLONGLONG, "NAXIS1", &rowBytes, nullptr, &status);
        long long head = 0, end = 0;
        fits_get_hduaddrll(f, &head, &dataStart, &end, &status);
        fits_close_file(f, &status);
        ASSERT_EQ(status, 0);
    }
    std::string bytes = slurp(path);
    const std::size_t desc = static_cast<std::size_t>(dataStart + rowBytes); // row 2, first column
    unsigned count = 0;
    for (int k = 0; k < 4; ++k)
        count = (count << 8) | static_cast<unsigned char>(bytes[desc + k]);
    ASSERT_GT(count, 5u);
    for (int k = 0; k < 4; ++k)
        bytes[desc + k] = static_cast<char>(((count - 3) >> (24 - 8 * k)) & 0xff);
    spit(path, bytes);
    msg = errorOf([&] { (void)readFrame(path.string()); });
    EXPECT_NE(msg.find("tile 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

// fuzz_header_wcs (a CI fuzz finding): a value of many nested quotes must not make parseFitsNumber recurse
// once per level until the stack overflows. Reproducer:
// tests/fuzz/regressions/header_wcs/nested_quotes_stack_overflow.hdr.
TEST(Reliability, FuzzHeaderWcsNestedQuotesAreNotANumberAndDoNotRecurse) {
    EXPECT_FALSE(parseFitsNumber(std::string(400000, '\'')).has_value());
    EXPECT_FALSE(parseFitsNumber("''''1.5''''").has_value());
    const auto quoted = parseFitsNumber("'1.5'"); // one level of quotes is still read
    ASSERT_TRUE(quoted.has_value());
    EXPECT_EQ(*quoted, 1.5);
    EXPECT_EQ(parseFitsNumber("2.5D1").value_or(0.0), 25.0);
}

// fuzz_fits_reader (deep run): a RICE_1 image whose block size (ZNAME1 = 'BLOCKSIZE', ZVAL1) reads as 0
// made CFITSIO 4.2.0 divide by zero (SIGFPE in imcomp_calc_max_elem) as soon as it reached the HDU. The
// header walk refuses it first, through every reader.
TEST(Reliability, FuzzFitsReaderZeroRiceBlockSizeIsRefusedBeforeCfitsioDividesByIt) {
    const std::string repro = kRegressions + "/fits_reader/rice_blocksize_zero_sigfpe.fits";
    const std::string msg = errorOf([&] { (void)readFrame(repro); });
    // "ZVAL1 =0   32": not a number CFITSIO can convert, refused before its block size is checked
    EXPECT_NE(msg.find("ZVAL1 = 0"), std::string::npos) << msg;
    EXPECT_THROW((void)listHdus(repro), InvalidInput);
    EXPECT_THROW((void)readHeader(repro), InvalidInput);
    // A plain 0 is refused as the block size it is.
    test::TempDir dir("gpuphot_reliab");
    writeCfitsio(dir / "rice.fits");
    const std::string zeroBlock = withCard(slurp(dir / "rice.fits"), "ZVAL1   ", "                   0");
    ASSERT_FALSE(zeroBlock.empty());
    spit(dir / "zero.fits", zeroBlock);
    const std::string zero = errorOf([&] { (void)readFrame(dir / "zero.fits"); });
    EXPECT_NE(zero.find("ZVAL1 = 0 (the Rice block size)"), std::string::npos) << zero;
}

// fuzz_fits_reader (deep run): the header walk read names and values other than as CFITSIO does. CFITSIO's
// name ends at the first blank or '=' ("END  =" ends a header), its lookup ignores the card's case, and an
// unquoted value runs to the comment's slash; a walk that missed the END ran off the file and checked
// nothing (ZTILE2 = 0: SIGFPE), and one that took a value's first word let a long one through to ffc2j
// (an abort in a fortified build).
TEST(Reliability, FuzzFitsReaderHeaderIsReadAsCfitsioReadsIt) {
    for (const char* name :
         {"ztile2_zero_header_end_with_equals.fits", "ztile2_zero_header_end_with_backquote.fits"}) {
        const std::string repro = kRegressions + "/fits_reader/" + name;
        const std::string msg = errorOf([&] { (void)readFrame(repro); });
        EXPECT_NE(msg.find("ZTILE2 = 0"), std::string::npos) << name << ": " << msg;
        EXPECT_THROW((void)listHdus(repro), InvalidInput) << name;
        EXPECT_THROW((void)readHeader(repro), InvalidInput) << name;
    }
    const std::string words = kRegressions + "/fits_reader/zval2_unquoted_words_ffc2_overflow.fits";
    const std::string msg = errorOf([&] { (void)readFrame(words); });
    EXPECT_NE(msg.find("ZVAL2 = ("), std::string::npos) << msg;
    EXPECT_THROW((void)listHdus(words), InvalidInput);

    // A lower-case name is the keyword CFITSIO finds; a RICE image with zTILE2 = 0 is refused.
    test::TempDir dir("gpuphot_reliab");
    writeCfitsio(dir / "rice.fits");
    const std::string lower =
        withCard(slurp(dir / "rice.fits"), "ZTILE2  ", "                   0", "zTILE2  ");
    ASSERT_FALSE(lower.empty());
    spit(dir / "lower.fits", lower);
    EXPECT_NE(errorOf([&] { (void)readFrame(dir / "lower.fits"); }).find("ZTILE2 = 0"), std::string::npos);
}

// CFITSIO 4.2.0's integer conversions (ffc2j, ffc2ii, ffc2jj, ffc2ujj) write a value they cannot read into an
// 81-byte message (heasarc/cfitsio #132): ZBITPIX, BLANK, ZVALn, ZNAXIS, ... given as a long string aborted
// the process (Debian's fortified build). Such a value is refused before CFITSIO reads the header.
TEST(Reliability, LongStringWhereCfitsioReadsAnIntegerIsRefusedBeforeItsMessageOverflows) {
    for (const char* name :
         {"zbitpix_long_string_ffc2_overflow.fits", "blank_long_string_ffc2_overflow.fits"}) {
        const std::string repro = kRegressions + "/fits_reader/" + name;
        const std::string msg = errorOf([&] { (void)readFrame(repro); });
        EXPECT_NE(msg.find("is not a number (40 characters"), std::string::npos) << name << ": " << msg;
        EXPECT_THROW((void)listHdus(repro), InvalidInput) << name;
        EXPECT_THROW((void)readHeader(repro), InvalidInput) << name;
    }
    // Every keyword CFITSIO converts so, in a tile-compressed image: a short value still reaches the
    // reader's own checks, a long one is refused.
    test::TempDir dir("gpuphot_reliab");
    // The regression file with a valid ZBITPIX again reads as the float image it is.
    const std::string rice =
        withCard(slurp(kRegressions + "/fits_reader/zbitpix_long_string_ffc2_overflow.fits"), "ZBITPIX ",
                 "                 -32");
    ASSERT_FALSE(rice.empty());
    spit(dir / "ok.fits", rice);
    EXPECT_EQ(readFrame(dir / "ok.fits").pixels.width(), 64);
    for (const std::string key : {"ZNAXIS  ", "ZVAL1   ", "ZTILE1  ", "ZNAXIS2 "}) {
        const std::string bytes = withCard(rice, key, "'" + std::string(30, 'x') + "'");
        ASSERT_FALSE(bytes.empty()) << key;
        spit(dir / "k.fits", bytes);
        const std::string msg = errorOf([&] { (void)readFrame(dir / "k.fits"); });
        EXPECT_NE(msg.find(key.substr(0, key.find(' ')) + " = '"), std::string::npos) << msg;
        EXPECT_NE(msg.find("is not a number"), std::string::npos) << key << ": " << msg;
    }
}

// fuzz_gzip_fits (deep run): a file starting with "PK" went to CFITSIO's zip decoder, which sized its buffer
// from the zip header (malloc of 4 GB). The compressed formats CFITSIO would decode itself, other than
// gzip, are refused before CFITSIO opens the file, by every reader; a FITS file never starts so.
TEST(Reliability, FuzzGzipFitsZipHeaderIsRefusedBeforeCfitsioAllocates) {
    test::TempDir dir("gpuphot_reliab");
    const std::string repro = kRegressions + "/gzip_fits/zip_header_4_gb.bin";
    spit(dir / "repro.fits.gz", slurp(repro).substr(1)); // the harness's first byte picks the mode
    std::string msg = errorOf([&] { (void)readFrame(dir / "repro.fits.gz"); });
    EXPECT_NE(msg.find("zip-compressed file"), std::string::npos) << msg;
    for (const std::string& magic :
         {std::string("PK"), std::string("\x1f\x9d"), std::string("\x1f\x1e"), std::string("\x1f\xa0")}) {
        spit(dir / "c.fits", magic + std::string(2878, '\0'));
        EXPECT_THROW((void)readFrame(dir / "c.fits"), InvalidInput);
        EXPECT_THROW((void)listHdus(dir / "c.fits"), InvalidInput);
        EXPECT_THROW((void)readHeader(dir / "c.fits"), InvalidInput);
    }
    // Plain and gzip files are still read.
    const fs::path plain = dir / "frame.fits";
    writeCfitsio(plain.string(), "");
    EXPECT_EQ(readFrame(plain.string()).pixels.width(), 16);
    spit(dir / "frame.fits.gz", gzipped(slurp(plain)));
    EXPECT_EQ(readFrame(dir / "frame.fits.gz").pixels.width(), 16);
}

// fuzz_gzip_fits: CFITSIO 4.2.0 sized its buffer for a .fits.gz from the gzip trailer's size field (a 6 kB
// file asked malloc for 1.9 GB), and a header that crashes CFITSIO crashed it behind gzip too, since the
// header checks could not read gzip. Gzip files are now inflated with zlib and checked like plain ones.
TEST(Reliability, FuzzGzipFitsIsInflatedByZlibAndItsHeadersChecked) {
    test::TempDir dir("gpuphot_reliab");
    const fs::path plain = dir / "frame.fits";
    writeCfitsio(plain.string(), "");
    const std::string bytes = slurp(plain);

    // A whole file, and one of two gzip members (as `cat a.gz b.gz` makes), read as the plain file.
    const fs::path gz = dir / "frame.fits.gz", twoMembers = dir / "two.fits.gz";
    spit(gz, gzipped(bytes));
    spit(twoMembers, gzipped(bytes.substr(0, 5000)) + gzipped(bytes.substr(5000)));
    for (const fs::path& p : {gz, twoMembers}) {
        const Frame f = readFrame(p.string());
        ASSERT_EQ(f.pixels.width(), 16) << p;
        for (int i = 0; i < 16 * 12; ++i)
            ASSERT_EQ(f.pixels(i % 16, i / 16), static_cast<float>(100 + i % 7)) << p << " pixel " << i;
        EXPECT_TRUE(fitsFileComplete(p.string())) << p;
    }

    // The trailer's size field says 1.9 GB: zlib's length check refuses it before anything is allocated.
    std::string forged = gzipped(bytes);
    const std::uint32_t huge = 1869619301u;
    for (int k = 0; k < 4; ++k)
        forged[forged.size() - 4 + k] = static_cast<char>((huge >> (8 * k)) & 0xff);
    spit(dir / "forged.fits.gz", forged);
    std::string msg = errorOf([&] { (void)readFrame(dir / "forged.fits.gz"); });
    EXPECT_NE(msg.find("corrupt gzip data"), std::string::npos) << msg;
    const std::string repro = kRegressions + "/gzip_fits/trailer_size_1_9_gb.bin";
    spit(dir / "repro.fits.gz", slurp(repro).substr(1)); // the harness's first byte picks the mode
    EXPECT_THROW((void)readFrame(dir / "repro.fits.gz"), Error);

    // Cut short: a truncated file (IoError; watch waits for the rest), not complete.
    const std::string whole = gzipped(bytes);
    spit(dir / "cut.fits.gz", whole.substr(0, whole.size() / 2));
    EXPECT_THROW((void)readFrame(dir / "cut.fits.gz"), IoError);
    std::string why;
    EXPECT_FALSE(fitsFileComplete(dir / "cut.fits.gz", &why));
    EXPECT_NE(why.find("truncated"), std::string::npos) << why;

    // ZTILE2 = 0 behind gzip: refused by the header checks, not CFITSIO's SIGFPE.
    const std::string sigfpe = slurp(kRegressions + "/fits_reader/ztile_zero_sigfpe.fits");
    spit(dir / "ztile.fits.gz", gzipped(sigfpe));
    msg = errorOf([&] { (void)readFrame(dir / "ztile.fits.gz"); });
    EXPECT_NE(msg.find("ZTILE"), std::string::npos) << msg;
    EXPECT_TRUE(fitsFileComplete(dir / "ztile.fits.gz")) << "complete; the reduction reports it";
    EXPECT_TRUE(fitsFileComplete(kRegressions + "/fits_reader/ztile_zero_sigfpe.fits"));
}

// fuzz_gzip_fits (deep run): a truncated FITS file, gzipped, is opened from memory, and CFITSIO 4.2.0's
// memory driver copied past the inflated bytes (ASan: READ of 15 MB beyond a 1 MiB buffer) where a disk
// file gives END_OF_FILE. The headers' claim is compared with the inflated size first, by every reader.
TEST(Reliability, FuzzGzipFitsTruncatedDataIsATruncatedFileNotAnOverRead) {
    const auto errorOf = [](auto fn) -> std::string {
        try {
            fn();
        } catch (const Error& e) {
            return e.what();
        }
        return {};
    };
    test::TempDir dir("gpuphot_reliab");
    const fs::path repro = dir / "repro.fits.gz";
    spit(repro, slurp(kRegressions + "/gzip_fits/truncated_data_overread.bin").substr(1));
    const std::string msg = errorOf([&] { (void)readFrame(repro.string()); });
    EXPECT_NE(msg.find("truncated file: its headers size it at 16002880 bytes, the inflated gzip stream "
                       "holds 28800"),
              std::string::npos)
        << msg;
    EXPECT_THROW((void)readFrame(repro.string()), IoError);
    EXPECT_THROW((void)listHdus(repro.string()), IoError);
    EXPECT_THROW((void)readHeader(repro.string()), IoError);
    std::string why;
    EXPECT_FALSE(fitsFileComplete(repro, &why));
    EXPECT_NE(why.find("truncated"), std::string::npos) << why;

    // 16 x 12 floats: one header block, 768 bytes of data, padded to a block.
    writeCfitsio(dir / "frame.fits", "");
    const std::string bytes = slurp(dir / "frame.fits");
    ASSERT_EQ(bytes.size(), 2u * 2880);
    const auto readsCut = [&](std::size_t n) {
        spit(dir / "cut.fits.gz", gzipped(bytes.substr(0, n)));
        return errorOf([&] { (void)readFrame(dir / "cut.fits.gz"); });
    };
    EXPECT_EQ(readsCut(2880 + 768), "") << "the data whole, the last block's padding missing";
    EXPECT_NE(readsCut(2880 + 767).find("size it at 3648 bytes, the inflated gzip stream holds 3647"),
              std::string::npos);
    EXPECT_NE(readsCut(2000).find("size it at 3648 bytes"), std::string::npos) << readsCut(2000);
    EXPECT_NE(readsCut(400).find("size it at 2880 bytes"), std::string::npos) << readsCut(400);
    // Bytes after the last HDU that are no header claim nothing.
    spit(dir / "tail.fits.gz", gzipped(bytes + std::string(100, '\0')));
    EXPECT_EQ(readFrame(dir / "tail.fits.gz").pixels.width(), 16);
    // A header sizing its data beyond 2^50 bytes.
    const std::string huge = withCard(bytes, "NAXIS2  ", "     999999999999999");
    ASSERT_FALSE(huge.empty());
    spit(dir / "huge.fits.gz", gzipped(huge));
    EXPECT_NE(errorOf([&] { (void)readFrame(dir / "huge.fits.gz"); }).find("more than 2^50 bytes"),
              std::string::npos);
}

// The readers and watch's completeness check decide what a file is by its first bytes, not by its name.
TEST(Reliability, FilesAreKnownByTheirBytesNotTheirNames) {
    test::TempDir dir("gpuphot_reliab");
    writeCfitsio(dir / "frame.fits", "");
    const std::string bytes = slurp(dir / "frame.fits");
    spit(dir / "gzip_named_plain.fits", gzipped(bytes)); // gzip without the suffix
    EXPECT_EQ(readFrame(dir / "gzip_named_plain.fits").pixels.width(), 16);
    EXPECT_TRUE(fitsFileComplete(dir / "gzip_named_plain.fits"));
    const std::string whole = gzipped(bytes);
    spit(dir / "cut_gzip.fits", whole.substr(0, whole.size() / 2));
    std::string why;
    EXPECT_FALSE(fitsFileComplete(dir / "cut_gzip.fits", &why));
    EXPECT_NE(why.find("truncated"), std::string::npos) << why;
    spit(dir / "short_plain.fits.gz", bytes.substr(0, 1000)); // plain FITS with a .gz name, cut short
    EXPECT_FALSE(fitsFileComplete(dir / "short_plain.fits.gz", &why));
    EXPECT_NE(why.find("shorter than one FITS block"), std::string::npos) << why;
    spit(dir / "b.fits", "BZh91AY&SY" + std::string(2000, '\x01'));
    const std::string msg = errorOf([&] { (void)readFrame(dir / "b.fits"); });
    EXPECT_NE(msg.find("bzip2-compressed file"), std::string::npos) << msg;
    EXPECT_THROW((void)listHdus(dir / "b.fits"), InvalidInput);
}

// File names that cannot be looked up (longer than the system allows) give the typed error of the file
// that cannot be read, not a filesystem exception (fuzz_sextractor's finding: std::filesystem::exists threw;
// tests/fuzz/regressions/sextractor/filter_name_too_long_to_look_up.bin).
TEST(Reliability, FuzzSextractorFileNamesThatCannotBeLookedUpGiveTypedErrors) {
    test::TempDir dir("gpuphot_sex_long");
    const std::string longName(5000, 'f');
    for (const char* key : {"FILTER_NAME", "PARAMETERS_NAME", "WEIGHT_IMAGE", "FLAG_IMAGE"}) {
        PipelineConfig c;
        const std::string text =
            std::string("FILTER Y\nWEIGHT_TYPE MAP_WEIGHT\nPARAMETERS_NAME default.param\n") + key + " " +
            longName + "\n";
        const std::string path = dir / "long.sex";
        std::ofstream(path) << text;
        try {
            (void)applySextractorSettings(readSextractorSettings(path), c);
        } catch (const InvalidInput&) {
        } catch (const IoError&) {
        } catch (const std::exception& e) {
            ADD_FAILURE() << key << ": untyped " << std::string(e.what()).substr(0, 120);
        }
    }
}
