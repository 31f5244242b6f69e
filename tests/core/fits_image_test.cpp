// FITS image I/O: round trips for every BITPIX (CFITSIO-written files read by readFrame, readFrame of files
// written by writeFitsImage), BZERO/BSCALE, tile compression, gzip, multi-extension selection, INHERIT,
// masks, header cards, atomic writes, and the real frames in tests/data/real compared with astropy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fitsio.h>

#include "core/io/fits_image.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"

#include "tests/test_support.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

struct TempDir : test::TempDir {
    TempDir() : test::TempDir("gpuphot_fits_test") {}
};

void check(int status) {
    if (status) {
        char text[FLEN_STATUS];
        fits_get_errstatus(status, text);
        fits_clear_errmsg();
        FAIL() << "CFITSIO status " << status << ": " << text;
    }
}

// A CFITSIO file being written by a test (independent of writeFitsImage).
struct Writer {
    fitsfile* f = nullptr;
    int status = 0;
    explicit Writer(const std::string& name) { fits_create_file(&f, ("!" + name).c_str(), &status); }
    ~Writer() {
        if (f) fits_close_file(f, &status);
        check(status);
    }
    void image(int bitpix, std::vector<long> axes) {
        fits_create_img(f, bitpix, static_cast<int>(axes.size()), axes.data(), &status);
    }
    template <class T> void pixels(int datatype, std::vector<T> v) {
        fits_write_img(f, datatype, 1, static_cast<long long>(v.size()), v.data(), &status);
    }
    void key(const char* k, double v) { fits_update_key(f, TDOUBLE, k, &v, nullptr, &status); }
    void key(const char* k, long v) { fits_update_key(f, TLONG, k, &v, nullptr, &status); }
    void key(const char* k, const char* v) {
        fits_update_key(f, TSTRING, k, const_cast<char*>(v), nullptr, &status);
    }
    void logical(const char* k, bool v) {
        int b = v;
        fits_update_key(f, TLOGICAL, k, &b, nullptr, &status);
    }
    void table(const char* extname) {
        char* ttype[] = {const_cast<char*>("MAG")};
        char* tform[] = {const_cast<char*>("1E")};
        fits_create_tbl(f, BINARY_TBL, 3, 1, ttype, tform, nullptr, extname, &status);
        float mags[3] = {10, 11, 12};
        fits_write_col(f, TFLOAT, 1, 1, 1, 3, mags, &status);
    }
};

std::vector<double> iota(int n, double start, double step) {
    std::vector<double> v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
        v[static_cast<std::size_t>(i)] = start + step * i;
    return v;
}

Image<float> ramp(int w, int h, float start, float step) {
    Image<float> img(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img(x, y) = start + step * static_cast<float>(y * w + x);
    return img;
}

bool startsWithGzipMagic(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    unsigned char b[2] = {};
    in.read(reinterpret_cast<char*>(b), 2);
    return b[0] == 0x1f && b[1] == 0x8b;
}

} // namespace

// ---- reading files written by CFITSIO directly --------------------------------------------------------

TEST(FitsImage, ReadsEveryBitpixExactly) {
    TempDir dir;
    const int w = 6, h = 4;
    struct Case {
        int bitpix;
        double start, step;
    } cases[] = {{8, 0, 10},
                 {16, -30000, 2500},
                 {32, -2000000000, 170000000},
                 {64, -16777216, 1398101},
                 {-32, -1.5e20, 1.37e19},
                 {-64, -3.25, 0.125}};
    for (const auto& c : cases) {
        SCOPED_TRACE("BITPIX " + std::to_string(c.bitpix));
        const std::string name = dir.file("b" + std::to_string(c.bitpix + 100) + ".fits");
        const std::vector<double> values = iota(w * h, c.start, c.step);
        {
            Writer wr(name);
            wr.image(c.bitpix, {w, h});
            wr.pixels(TDOUBLE, values); // CFITSIO converts to the file's type exactly (values fit)
        }
        const Frame fr = readFrame(name);
        EXPECT_EQ(fr.width(), w);
        EXPECT_EQ(fr.height(), h);
        EXPECT_EQ(fr.bitpix, c.bitpix);
        EXPECT_EQ(fr.hdu, 0);
        EXPECT_EQ(fr.path, name);
        for (int i = 0; i < w * h; ++i) {
            EXPECT_EQ(fr.pixels.data()[i], static_cast<float>(values[static_cast<std::size_t>(i)]))
                << "pixel " << i;
            EXPECT_EQ(fr.mask.data()[i], 0);
        }
        EXPECT_EQ(fr.pixels(5, 0), static_cast<float>(values[5])) << "x runs along NAXIS1";
        EXPECT_EQ(fr.pixels(0, 1), static_cast<float>(values[6]));
    }
}

TEST(FitsImage, AppliesBscaleBzeroAndUnsigned16) {
    TempDir dir;
    const std::string scaled = dir.file("scaled.fits"), u16 = dir.file("u16.fits");
    {
        Writer wr(scaled);
        wr.image(SHORT_IMG, {3, 2});
        wr.key("BSCALE", 0.5);
        wr.key("BZERO", 100.0);
        fits_set_bscale(wr.f, 1.0, 0.0, &wr.status); // write raw integers
        wr.pixels<short>(TSHORT, {-4, -2, 0, 1, 3, 32767});
    }
    const Frame s = readFrame(scaled);
    const float expect[] = {98.0f, 99.0f, 100.0f, 100.5f, 101.5f, 100.0f + 32767 * 0.5f};
    for (int i = 0; i < 6; ++i)
        EXPECT_EQ(s.pixels.data()[i], expect[i]);
    EXPECT_EQ(s.bitpix, 16);

    {
        Writer wr(u16);
        wr.image(USHORT_IMG, {5, 1});
        wr.pixels<unsigned short>(TUSHORT, {0, 1, 32767, 32768, 65535});
    }
    const Frame u = readFrame(u16);
    const float ue[] = {0, 1, 32767, 32768, 65535};
    for (int i = 0; i < 5; ++i)
        EXPECT_EQ(u.pixels.data()[i], ue[i]);
    EXPECT_EQ(u.bitpix, 16) << "the file's BITPIX";
    const auto hdus = listHdus(u16);
    ASSERT_EQ(hdus.size(), 1u);
    EXPECT_EQ(hdus[0].bitpix, kBitpixUInt16) << "the equivalent BITPIX says unsigned 16";
}

TEST(FitsImage, BlankNanAndSaturationGoToTheMask) {
    TempDir dir;
    const std::string ints = dir.file("blank.fits"), floats = dir.file("nan.fits");
    {
        Writer wr(ints);
        wr.image(SHORT_IMG, {4, 1});
        wr.key("BLANK", -999L);
        wr.key("SATURATE", 1000.0);
        wr.pixels<short>(TSHORT, {5, -999, 1000, 999});
    }
    const Frame a = readFrame(ints);
    EXPECT_EQ(a.pixels(0, 0), 5.0f);
    EXPECT_TRUE(std::isnan(a.pixels(1, 0))) << "BLANK reads as NaN";
    EXPECT_EQ(a.mask(0, 0), 0);
    EXPECT_EQ(a.mask(1, 0), MaskBad | MaskNonFinite);
    EXPECT_EQ(a.mask(2, 0), MaskSaturated) << "at the saturation level";
    EXPECT_EQ(a.mask(3, 0), 0);
    EXPECT_EQ(a.instrument.saturation, 1000.0);
    EXPECT_EQ(a.instrument.saturationSource, "SATURATE");

    {
        Writer wr(floats);
        wr.image(FLOAT_IMG, {3, 1});
        wr.pixels<float>(TFLOAT, {1.5f, std::numeric_limits<float>::quiet_NaN(), 2e6f});
    }
    FrameReadOptions opts;
    opts.overrides.saturation = 1e6;
    const Frame b = readFrame(floats, opts);
    EXPECT_TRUE(std::isnan(b.pixels(1, 0)));
    EXPECT_EQ(b.mask(0, 0), 0);
    EXPECT_EQ(b.mask(1, 0), MaskNonFinite) << "NaN in float data is not a BLANK";
    EXPECT_EQ(b.mask(2, 0), MaskSaturated) << "the override's level";
    EXPECT_EQ(b.instrument.saturationSource, "override");
}

TEST(FitsImage, ReadsTileCompressedRiceGzipHcompress) {
    TempDir dir;
    const int w = 70, h = 45;
    std::vector<int> values(static_cast<std::size_t>(w * h));
    std::mt19937 rng(7);
    for (auto& v : values)
        v = static_cast<int>(rng() % 60000);
    struct Case {
        const char* name;
        int type;
    } cases[] = {{"rice", RICE_1}, {"gzip", GZIP_1}, {"hcomp", HCOMPRESS_1}};
    for (const auto& c : cases) {
        SCOPED_TRACE(c.name);
        const std::string name = dir.file(std::string(c.name) + ".fits.fz");
        {
            Writer wr(name);
            fits_set_compression_type(wr.f, c.type, &wr.status);
            long tile[2] = {w, 16}; // HCOMPRESS fails on tiles of 8 rows (CFITSIO status 413)
            fits_set_tile_dim(wr.f, 2, tile, &wr.status);
            wr.image(USHORT_IMG, {w, h});
            wr.key("EXTNAME", "SCI");
            wr.key("GAIN", 1.6);
            std::vector<unsigned short> u(values.begin(), values.end());
            wr.pixels(TUSHORT, u);
        }
        const auto hdus = listHdus(name);
        ASSERT_EQ(hdus.size(), 2u);
        EXPECT_FALSE(hdus[0].compressed);
        EXPECT_TRUE(hdus[1].compressed);
        EXPECT_EQ(hdus[1].type, "IMAGE");
        EXPECT_EQ(hdus[1].extname, "SCI");
        EXPECT_EQ(hdus[1].bitpix, kBitpixUInt16);
        EXPECT_EQ(hdus[1].axes, (std::vector<long long>{w, h}));

        const Frame fr = readFrame(name);
        EXPECT_EQ(fr.hdu, 1) << "the first image HDU with data";
        EXPECT_EQ(fr.extname, "SCI");
        ASSERT_EQ(fr.width(), w);
        ASSERT_EQ(fr.height(), h);
        for (int i = 0; i < w * h; ++i)
            ASSERT_EQ(fr.pixels.data()[i], static_cast<float>(values[static_cast<std::size_t>(i)])) << i;
        EXPECT_EQ(fr.instrument.gain, 1.6);
        // The header is the image's, not the binary table's.
        EXPECT_EQ(fr.header.getInt("NAXIS1"), w);
        EXPECT_FALSE(fr.header.has("ZIMAGE"));
        EXPECT_FALSE(fr.header.has("TTYPE1"));
    }
}

// tests/data/fits/astropy_rice_u16.fits.fz: written by astropy (see the README there), pixel i in FITS
// order = (i * 40503) % 65536. Its header (BSCALE/BZERO before ZIMAGE) defeats CFITSIO's own
// compressed-header conversion.
TEST(FitsImage, ReadsAstropyWrittenTileCompressedFile) {
    const std::string path = std::string(GPUPHOT_TEST_DATA) + "/fits/astropy_rice_u16.fits.fz";
    const Frame fr = readFrame(path);
    EXPECT_EQ(fr.hdu, 1);
    ASSERT_EQ(fr.width(), 24);
    ASSERT_EQ(fr.height(), 20);
    EXPECT_EQ(fr.bitpix, 16);
    for (long long i = 0; i < 480; ++i)
        ASSERT_EQ(fr.pixels.data()[i], static_cast<float>((i * 40503) % 65536)) << i;
    EXPECT_EQ(fr.header.getString("XTENSION"), "IMAGE");
    EXPECT_EQ(fr.header.getInt("NAXIS2"), 20);
    EXPECT_EQ(fr.header.getDouble("BZERO"), 32768.0);
    EXPECT_FALSE(fr.header.has("TFIELDS"));
    EXPECT_FALSE(fr.header.has("ZNAXIS1"));
}

TEST(FitsImage, CompressedHeaderMatchesCfitsiosConversion) {
    TempDir dir;
    const std::string name = dir.file("conv.fits.fz");
    {
        Writer wr(name);
        fits_set_compression_type(wr.f, RICE_1, &wr.status);
        wr.image(SHORT_IMG, {30, 20});
        wr.key("EXTNAME", "SCI");
        wr.key("GAIN", 1.5);
        wr.key("OBJECT", "NGC 1");
        wr.pixels<short>(TSHORT, std::vector<short>(600, 3));
    }
    fitsfile* f = nullptr;
    int status = 0, type = 0, nkeys = 0;
    char* text = nullptr;
    fits_open_file(&f, name.c_str(), READONLY, &status);
    fits_movabs_hdu(f, 2, &type, &status);
    fits_convert_hdr2str(f, 0, nullptr, 0, &text, &nkeys, &status);
    check(status);
    const Header expect = Header::fromFitsString(text);
    fits_free_memory(text, &status);
    fits_close_file(f, &status);
    const Header got = readHeader(name);
    for (const auto& c : expect.cards()) {
        if (c.key == "COMMENT" || c.key == "HISTORY" || c.key.empty()) continue;
        ASSERT_TRUE(got.has(c.key)) << c.key;
        EXPECT_EQ(got.find(c.key)->value, c.value) << c.key;
    }
    for (const auto& c : got.cards()) {
        if (c.key != "COMMENT" && c.key != "HISTORY" && !c.key.empty()) {
            EXPECT_TRUE(expect.has(c.key)) << c.key;
        }
    }
}

TEST(FitsImage, QuantizedCompressedFloatsKeepNan) {
    TempDir dir;
    const std::string name = dir.file("quant.fits.fz");
    std::vector<float> v(400);
    for (int i = 0; i < 400; ++i)
        v[static_cast<std::size_t>(i)] = 100.0f + static_cast<float>(i % 17);
    v[123] = std::numeric_limits<float>::quiet_NaN();
    {
        Writer wr(name); // Rice with CFITSIO's default lossy quantisation of floats (q = 4), as fpack does
        fits_set_compression_type(wr.f, RICE_1, &wr.status);
        wr.image(FLOAT_IMG, {20, 20});
        wr.pixels(TFLOAT, v);
    }
    const Frame fr = readFrame(name);
    EXPECT_TRUE(std::isnan(fr.pixels.data()[123]));
    EXPECT_EQ(fr.mask.data()[123], MaskNonFinite);
    for (int i = 0; i < 400; ++i)
        if (i != 123) {
            EXPECT_NEAR(fr.pixels.data()[i], v[static_cast<std::size_t>(i)], 2.0) << i; // quantised
            EXPECT_EQ(fr.mask.data()[i], 0) << i;
        }
}

TEST(FitsImage, ReadsGzipFiles) {
    TempDir dir;
    const std::string name = dir.file("frame.fits.gz");
    {
        Writer wr(name); // CFITSIO gzips a new file whose name ends in .gz when it closes it
        wr.image(FLOAT_IMG, {5, 3});
        std::vector<float> v(15);
        for (int i = 0; i < 15; ++i)
            v[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(i) - 1.0f;
        wr.pixels(TFLOAT, v);
    }
    ASSERT_TRUE(startsWithGzipMagic(name));
    const Frame fr = readFrame(name);
    ASSERT_EQ(fr.width(), 5);
    ASSERT_EQ(fr.height(), 3);
    for (int i = 0; i < 15; ++i)
        EXPECT_EQ(fr.pixels.data()[i], 0.25f * static_cast<float>(i) - 1.0f);
}

TEST(FitsImage, SelectsMultiExtensionHdusByNumberAndExtname) {
    TempDir dir;
    const std::string name = dir.file("mef.fits");
    {
        Writer wr(name);
        wr.image(8, {}); // empty primary
        wr.key("TELESCOP", "test");
        wr.table("CAT");
        wr.image(FLOAT_IMG, {4, 3});
        wr.key("EXTNAME", "SCI");
        wr.pixels<float>(TFLOAT, std::vector<float>(12, 1.0f));
        wr.image(FLOAT_IMG, {2, 2});
        wr.key("EXTNAME", "ERR");
        wr.key("EXTVER", 2L);
        wr.pixels<float>(TFLOAT, std::vector<float>(4, 2.0f));
    }
    const auto hdus = listHdus(name);
    ASSERT_EQ(hdus.size(), 4u);
    EXPECT_EQ(hdus[0].type, "IMAGE");
    EXPECT_TRUE(hdus[0].axes.empty());
    EXPECT_EQ(hdus[1].type, "BINTABLE");
    EXPECT_EQ(hdus[1].extname, "CAT");
    EXPECT_EQ(hdus[1].axes, (std::vector<long long>{1, 3})) << "columns, rows";
    EXPECT_EQ(hdus[2].extname, "SCI");
    EXPECT_EQ(hdus[3].index, 3);

    Frame def = readFrame(name);
    EXPECT_EQ(def.hdu, 2) << "default: the first image HDU with data, skipping the table";
    EXPECT_EQ(def.extname, "SCI");
    EXPECT_EQ(def.width(), 4);

    FrameReadOptions byNumber;
    byNumber.hdu = "3";
    EXPECT_EQ(readFrame(name, byNumber).pixels(0, 0), 2.0f);
    FrameReadOptions byName;
    byName.hdu = "err";
    EXPECT_EQ(readFrame(name, byName).hdu, 3) << "EXTNAME match is case-insensitive";
    byName.hdu = "ERR,2";
    EXPECT_EQ(readFrame(name, byName).hdu, 3);
    EXPECT_EQ(readFrame(name + "[SCI]").hdu, 2) << "CFITSIO's suffix syntax";
    EXPECT_EQ(readFrame(name + "[3]").width(), 2);

    for (const char* bad : {"CAT", "1", "0", "7", "NOPE", "ERR,5"}) {
        SCOPED_TRACE(bad);
        FrameReadOptions o;
        o.hdu = bad;
        try {
            readFrame(name, o);
            ADD_FAILURE() << "no exception";
        } catch (const InvalidInput& e) {
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
    }
    EXPECT_EQ(readHeader(name, "CAT").getString("EXTNAME"), "CAT");
}

TEST(FitsImage, InheritsPrimaryKeywordsWhenInheritIsTrue) {
    TempDir dir;
    for (bool inherit : {true, false}) {
        SCOPED_TRACE(inherit);
        const std::string name = dir.file(inherit ? "inh.fits" : "noinh.fits");
        {
            Writer wr(name);
            wr.image(8, {});
            wr.key("GAIN", 2.5);
            wr.key("EXPTIME", 30.0);
            wr.key("FILTER", "r");
            wr.image(FLOAT_IMG, {2, 2});
            wr.logical("INHERIT", inherit);
            wr.key("EXPTIME", 60.0);
            wr.pixels<float>(TFLOAT, {1, 2, 3, 4});
        }
        const Frame fr = readFrame(name);
        EXPECT_EQ(fr.hdu, 1);
        EXPECT_EQ(fr.instrument.exptime, 60.0) << "the extension's own value wins";
        if (inherit) {
            EXPECT_EQ(fr.instrument.gain, 2.5);
            EXPECT_EQ(fr.instrument.gainSource, "GAIN");
            EXPECT_EQ(fr.instrument.filter, "r");
            EXPECT_EQ(fr.header.getDouble("EXPTIME"), 60.0);
            EXPECT_EQ(fr.header.getInt("NAXIS1"), 2) << "structural keys are the extension's";
        } else {
            EXPECT_EQ(fr.instrument.gainSource, "default");
            EXPECT_FALSE(fr.header.has("FILTER"));
        }
        EXPECT_EQ(readHeader(name).has("FILTER"), inherit);
    }
}

TEST(FitsImage, ReadHeaderFallsBackToThePrimaryOfHeaderOnlyFiles) {
    TempDir dir;
    const std::string name = dir.file("only.wcs");
    {
        Writer wr(name);
        wr.image(8, {});
        wr.key("CRVAL1", 10.5);
    }
    EXPECT_EQ(readHeader(name).getDouble("CRVAL1"), 10.5);
    EXPECT_THROW(readFrame(name), InvalidInput);
}

// ---- writeFitsImage ------------------------------------------------------------------------------------

TEST(FitsImage, WriterRoundTripsEveryBitpix) {
    TempDir dir;
    Image<float> img(5, 2);
    const float values[10] = {0.0f, 1.25f, -2.5f, 2.5f, 254.6f, 1000.4f, -70000.0f, 70000.0f, 3.0e9f, -7.75f};
    for (int i = 0; i < 10; ++i)
        img.data()[i] = values[i];
    struct Case {
        int bitpix;
        double lo, hi;
    } cases[] = {{-32, 0, 0},
                 {-64, 0, 0},
                 {8, 0, 255},
                 {16, -32768, 32767},
                 {32, -2147483648.0, 2147483647.0},
                 {64, -9.2e18, 9.2e18},
                 {kBitpixUInt16, 0, 65535}};
    for (const auto& c : cases) {
        SCOPED_TRACE("bitpix " + std::to_string(c.bitpix));
        const std::string name = dir.file("w" + std::to_string(c.bitpix + 100) + ".fits");
        writeFitsImage(name, img.view(), Header{}, c.bitpix);
        const Frame fr = readFrame(name);
        EXPECT_EQ(fr.bitpix, c.bitpix == kBitpixUInt16 ? 16 : c.bitpix);
        EXPECT_EQ(listHdus(name)[0].bitpix, c.bitpix);
        for (int i = 0; i < 10; ++i) {
            float expect = values[i];
            if (c.bitpix > 0) { // rounded half away from zero, clipped to the type's range
                expect =
                    static_cast<float>(std::clamp(std::round(static_cast<double>(values[i])), c.lo, c.hi));
            }
            EXPECT_EQ(fr.pixels.data()[i], expect) << "pixel " << i << " written " << values[i];
        }
    }
}

TEST(FitsImage, WriterMarksNanAsBlankInIntegerImages) {
    TempDir dir;
    Image<float> img(3, 1);
    img(0, 0) = std::nanf("");
    img(1, 0) = 0.0f;
    img(2, 0) = 7.0f;
    for (int bitpix : {16, 32, kBitpixUInt16, 8}) {
        SCOPED_TRACE(bitpix);
        const std::string name = dir.file("nan" + std::to_string(bitpix) + ".fits");
        writeFitsImage(name, img.view(), Header{}, bitpix);
        const Frame fr = readFrame(name);
        EXPECT_TRUE(std::isnan(fr.pixels(0, 0)));
        EXPECT_EQ(fr.mask(0, 0), MaskBad | MaskNonFinite);
        EXPECT_EQ(fr.pixels(2, 0), 7.0f);
        EXPECT_EQ(fr.mask(1, 0), 0);
        EXPECT_TRUE(fr.header.has("BLANK"));
    }
}

TEST(FitsImage, WriterKeepsHeaderCardsAndSkipsStructuralOnes) {
    TempDir dir;
    Header h;
    h.set("SIMPLE", true);
    h.set("BITPIX", 8);
    h.set("NAXIS", 3);
    h.set("NAXIS1", 99);
    h.set("BZERO", 5.0);
    h.set("BSCALE", 3.0);
    h.set("GAIN", 1.75, "e-/ADU");
    h.set("OBJECT", "M 42 'Orion'");
    h.set("LONGSTR", std::string(150, 'x') + "END");
    h.set("NCOMBINE", 7);
    h.set("FLAG", true);
    h.setRaw("ESO DET CHIP", "'CCD-44'"); // a HIERARCH card, as Header stores it
    h.addComment("a comment card");
    h.addHistory("reduced by the test");
    Image<float> img = ramp(4, 3, 1.0f, 1.0f);
    const std::string name = dir.file("cards.fits");
    writeFitsImage(name, img.view(), h);
    const Frame fr = readFrame(name);
    EXPECT_EQ(fr.pixels(3, 2), 12.0f) << "BZERO/BSCALE of the given header were not applied";
    EXPECT_EQ(fr.header.getInt("BITPIX"), -32);
    EXPECT_EQ(fr.header.getInt("NAXIS"), 2);
    EXPECT_EQ(fr.header.getInt("NAXIS1"), 4);
    EXPECT_FALSE(fr.header.has("BZERO"));
    EXPECT_EQ(fr.header.getDouble("GAIN"), 1.75);
    EXPECT_EQ(fr.header.find("GAIN")->comment, "e-/ADU");
    EXPECT_EQ(fr.header.getString("OBJECT"), "M 42 'Orion'");
    EXPECT_EQ(fr.header.getInt("NCOMBINE"), 7);
    EXPECT_EQ(fr.header.getBool("FLAG"), true);
    EXPECT_EQ(fr.instrument.object, "M 42 'Orion'");
    // The long string went out with CONTINUE cards: read it back with CFITSIO's long-string reader.
    fitsfile* f = nullptr;
    int status = 0;
    char* longValue = nullptr;
    fits_open_file(&f, name.c_str(), READONLY, &status);
    fits_read_key_longstr(f, "LONGSTR", &longValue, nullptr, &status);
    check(status);
    EXPECT_EQ(std::string(longValue), std::string(150, 'x') + "END");
    fits_free_memory(longValue, &status);
    char chip[FLEN_VALUE] = {};
    fits_read_key(f, TSTRING, "ESO DET CHIP", chip, nullptr, &status);
    check(status);
    EXPECT_STREQ(chip, "CCD-44");
    fits_close_file(f, &status);
    bool comment = false, history = false;
    for (const auto& c : fr.header.cards()) {
        comment = comment || (c.key == "COMMENT" && c.comment.find("a comment card") != std::string::npos);
        history =
            history || (c.key == "HISTORY" && c.comment.find("reduced by the test") != std::string::npos);
    }
    EXPECT_TRUE(comment);
    EXPECT_TRUE(history);
}

TEST(FitsImage, WritesInt32SegmentationAndUint8Masks) {
    TempDir dir;
    Image<std::int32_t> seg(3, 2);
    Image<std::uint8_t> mask(3, 2);
    const std::int32_t segValues[6] = {0, 1, 2, 2147483647, -5, 40000};
    for (int i = 0; i < 6; ++i) {
        seg.data()[i] = segValues[i];
        mask.data()[i] = static_cast<std::uint8_t>(i * 50);
    }
    const std::string segName = dir.file("seg.fits"), maskName = dir.file("mask.fits");
    Header h;
    h.set("STAGE", "detection");
    writeFitsImage(segName, seg.view(), h);
    writeFitsImage(maskName, mask.view(), h);
    EXPECT_EQ(listHdus(segName)[0].bitpix, 32);
    EXPECT_EQ(listHdus(maskName)[0].bitpix, 8);
    fitsfile* f = nullptr;
    int status = 0, anynul = 0;
    std::int32_t back[6] = {};
    fits_open_file(&f, segName.c_str(), READONLY, &status);
    fits_read_img(f, TINT, 1, 6, nullptr, back, &anynul, &status);
    fits_close_file(f, &status);
    check(status);
    for (int i = 0; i < 6; ++i)
        EXPECT_EQ(back[i], segValues[i]);
    const Frame m = readFrame(maskName);
    for (int i = 0; i < 6; ++i)
        EXPECT_EQ(m.pixels.data()[i], static_cast<float>(i * 50));
    EXPECT_EQ(m.header.getString("STAGE"), "detection");
}

TEST(FitsImage, WriterHonoursStridedViews) {
    TempDir dir;
    Image<float> big = ramp(8, 6, 0.0f, 1.0f);
    ImageView sub{big.data() + 8 * 2 + 3, 4, 3, big.stride()}; // x 3..6, y 2..4
    const std::string name = dir.file("sub.fits");
    writeFitsImage(name, sub, Header{});
    const Frame fr = readFrame(name);
    ASSERT_EQ(fr.width(), 4);
    ASSERT_EQ(fr.height(), 3);
    for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 4; ++x)
            EXPECT_EQ(fr.pixels(x, y), big(x + 3, y + 2));
}

TEST(FitsImage, WritesTileCompressedFzLosslessly) {
    TempDir dir;
    Image<float> img(40, 30);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(100.0f, 15.0f);
    for (std::size_t i = 0; i < img.pixelCount(); ++i)
        img.data()[i] = nd(rng);
    const std::string f32 = dir.file("float.fits.fz"), u16 = dir.file("u16.fits.fz");
    writeFitsImage(f32, img.view(), Header{}, -32);
    writeFitsImage(u16, img.view(), Header{}, kBitpixUInt16);
    for (const auto& name : {f32, u16}) {
        const auto hdus = listHdus(name);
        ASSERT_EQ(hdus.size(), 2u) << name;
        EXPECT_TRUE(hdus[1].compressed) << name;
    }
    const Frame a = readFrame(f32), b = readFrame(u16);
    for (std::size_t i = 0; i < img.pixelCount(); ++i) {
        ASSERT_EQ(a.pixels.data()[i], img.data()[i]) << "float .fz must be lossless, pixel " << i;
        ASSERT_EQ(b.pixels.data()[i], std::round(img.data()[i]));
    }
}

TEST(FitsImage, AtomicWriteLeavesOnlyTheFinalFile) {
    TempDir dir;
    Image<float> img = ramp(3, 3, 0.0f, 1.0f);
    writeFitsImage(dir.file("a.fits"), img.view(), Header{});
    writeFitsImage(dir.file("a.fits"), img.view(), Header{}, 16); // overwrite
    writeFitsImage(dir.file("b.fits.fz"), img.view(), Header{}, 16);
    EXPECT_THROW(writeFitsImage(dir.file("c.fits"), img.view(), Header{}, 12), InvalidInput);
    EXPECT_THROW(writeFitsImage(dir.file("d.fits"), ImageView{}, Header{}), InvalidInput);
    EXPECT_THROW(writeFitsImage(dir.file("missing/e.fits"), img.view(), Header{}), IoError);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"a.fits", "b.fits.fz"}));
    EXPECT_EQ(readFrame(dir.file("a.fits")).bitpix, 16);
}

TEST(FitsImage, AttachesTheHeaderWcs) {
    TempDir dir;
    Header h;
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC--TAN");
    h.set("CRVAL1", 150.0);
    h.set("CRVAL2", 2.0);
    h.set("CRPIX1", 5.0);
    h.set("CRPIX2", 4.0);
    h.set("CD1_1", -1.0 / 3600);
    h.set("CD1_2", 0.0);
    h.set("CD2_1", 0.0);
    h.set("CD2_2", 1.0 / 3600);
    Image<float> img = ramp(10, 8, 0.0f, 1.0f);
    writeFitsImage(dir.file("wcs.fits"), img.view(), h);
    writeFitsImage(dir.file("nowcs.fits"), img.view(), Header{});
    const Frame a = readFrame(dir.file("wcs.fits"));
    ASSERT_TRUE(a.wcs) << a.wcsProblem;
    const auto [ra, dec] = a.wcs->pixelToWorld(4.0, 3.0); // 0-based pixel of CRPIX (5, 4)
    EXPECT_NEAR(ra, 150.0, 1e-9);
    EXPECT_NEAR(dec, 2.0, 1e-9);
    const Frame b = readFrame(dir.file("nowcs.fits"));
    EXPECT_FALSE(b.wcs);
}

// ---- real frames (tests/data/real), expected values from astropy ------------------------------------

namespace {
std::string realFrame(const char* name) {
    const std::string p = std::string(GPUPHOT_TEST_DATA) + "/real/" + name;
    return fs::exists(p) ? p : std::string();
}
} // namespace

// Expected numbers from astropy 5 (Debian's /usr/bin/python3):
//   d = fits.open('panoptes_solved.fits.fz')[1].data   # uint16, shape (700, 700)
//   d[0,0], d[10,20], d[-1,-1], d[350,123], d.min(), d.max() -> 2215 2219 2204 2191 2033 13863
//   Time(h[1].header['DATE-OBS'], scale='utc').mjd -> 57640.34344907408
//   WCS(h[1].header).all_pix2world(100, 200, 0) -> 302.604898992150 45.295662155908 (same for the DECam
//   cutout's TPV header: 121.027191049252 5.116433827223; its d[0,0], d[10,20], d[-1,-1] are
//   162.07498 172.65703 154.84134 (float32); primary EXPTIME 45.0, MJD-OBS 58070.25254673)
TEST(FitsImage, ReadsThePanoptesFrameLikeAstropy) {
    const std::string path = realFrame("panoptes_solved.fits.fz");
    if (path.empty()) FAIL() << "test data missing (tests/data/real)";
    const auto hdus = listHdus(path);
    ASSERT_EQ(hdus.size(), 2u);
    EXPECT_TRUE(hdus[1].compressed);
    EXPECT_EQ(hdus[1].bitpix, kBitpixUInt16);
    const Frame fr = readFrame(path);
    EXPECT_EQ(fr.hdu, 1);
    ASSERT_EQ(fr.width(), 700);
    ASSERT_EQ(fr.height(), 700);
    EXPECT_EQ(fr.bitpix, 16);
    // numpy index [row, col] = [y, x]
    EXPECT_EQ(fr.pixels(0, 0), 2215.0f);
    EXPECT_EQ(fr.pixels(20, 10), 2219.0f);
    EXPECT_EQ(fr.pixels(699, 699), 2204.0f);
    EXPECT_EQ(fr.pixels(123, 350), 2191.0f);
    float lo = INFINITY, hi = -INFINITY;
    for (std::size_t i = 0; i < fr.pixels.pixelCount(); ++i) {
        lo = std::min(lo, fr.pixels.data()[i]);
        hi = std::max(hi, fr.pixels.data()[i]);
    }
    EXPECT_EQ(lo, 2033.0f);
    EXPECT_EQ(hi, 13863.0f);
    EXPECT_EQ(fr.instrument.exptime, 120.4);
    EXPECT_NEAR(fr.instrument.airmass, 1.133153126390357, 1e-12);
    EXPECT_EQ(fr.instrument.filter, "RGGB");
    // DATE-OBS = '2016-09-09T08:14:34' -> astropy Time(...).mjd
    EXPECT_NEAR(fr.instrument.mjdStart, 57640.34344907408, 1e-9);
    ASSERT_TRUE(fr.wcs) << fr.wcsProblem;
    EXPECT_EQ(fr.wcs->projectionCode(), "TAN-SIP");
    // astropy WCS(header).all_pix2world(100, 200, 0)
    const auto [ra, dec] = fr.wcs->pixelToWorld(100.0, 200.0);
    EXPECT_NEAR(ra, 302.604898992150, 1e-7);
    EXPECT_NEAR(dec, 45.295662155908, 1e-7);
}

TEST(FitsImage, ReadsTheDecamCutoutLikeAstropy) {
    const std::string path = realFrame("decam_ls9_N6_cutout.fits");
    if (path.empty()) FAIL() << "test data missing (tests/data/real)";
    FrameReadOptions opts;
    opts.hdu = "N6";
    const Frame fr = readFrame(path, opts);
    EXPECT_EQ(fr.hdu, 1);
    ASSERT_EQ(fr.width(), 280);
    ASSERT_EQ(fr.height(), 375);
    EXPECT_EQ(fr.bitpix, -32);
    EXPECT_EQ(fr.pixels(0, 0), 162.07498f);
    EXPECT_EQ(fr.pixels(20, 10), 172.65703f);
    EXPECT_EQ(fr.pixels(279, 374), 154.84134f);
    // INHERIT = T: EXPTIME and MJD-OBS live in the primary header; the gains per amplifier in the extension.
    EXPECT_EQ(fr.instrument.exptime, 45.0);
    EXPECT_NEAR(fr.instrument.mjdStart, 58070.25254673, 1e-9);
    EXPECT_NEAR(fr.instrument.gain, (3.7121032941793 + 3.71897213815899) / 2, 1e-12);
    EXPECT_EQ(fr.instrument.gainSource, "mean(GAINA,GAINB)");
    EXPECT_EQ(fr.instrument.saturation, 49912.809886117);
    ASSERT_TRUE(fr.wcs) << fr.wcsProblem;
    const auto [ra, dec] = fr.wcs->pixelToWorld(100.0, 200.0);
    EXPECT_NEAR(ra, 121.027191049252, 1e-7);
    EXPECT_NEAR(dec, 5.116433827223, 1e-7);
}
