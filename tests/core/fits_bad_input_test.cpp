// Bad FITS input: every case gives a typed error (IoError / InvalidInput) whose message names the file,
// nothing crashes, and absurd sizes are refused before anything is allocated.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fitsio.h>

#include "core/io/fits_image.hpp"
#include "core/util/errors.hpp"

#include "tests/test_support.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

struct TempDir : test::TempDir {
    TempDir() : test::TempDir("gpuphot_badfits") {}
};

void writeBytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A hand-made FITS file: the cards (without END), padded to 2880, then `dataBytes` zero bytes (padded).
std::string rawFits(const std::vector<std::string>& cards, std::size_t dataBytes) {
    std::string s;
    for (const auto& c : cards) {
        std::string card = c;
        card.resize(80, ' ');
        s += card;
    }
    std::string end = "END";
    end.resize(80, ' ');
    s += end;
    s.resize((s.size() + 2879) / 2880 * 2880, ' ');
    s.append((dataBytes + 2879) / 2880 * 2880, '\0'); // data padded to whole blocks
    return s;
}

std::string card(const std::string& key, const std::string& value) {
    std::string k = key;
    k.resize(8, ' ');
    std::string v = value;
    if (v.size() < 20) v.insert(0, 20 - v.size(), ' ');
    return k + "= " + v;
}

std::vector<std::string> imageCards(int bitpix, std::vector<std::string> axes) {
    std::vector<std::string> c = {card("SIMPLE", "T"), card("BITPIX", std::to_string(bitpix)),
                                  card("NAXIS", std::to_string(axes.size()))};
    for (std::size_t i = 0; i < axes.size(); ++i)
        c.push_back(card("NAXIS" + std::to_string(i + 1), axes[i]));
    return c;
}

// Runs `fn`, expects exception type E (or, when E2 differs, either) with the file name in the message
// and, when given, `fragment` too.
template <class E, class E2 = E, class Fn>
void expectError(const std::string& path, Fn fn, const std::string& fragment = {}) {
    try {
        fn();
        ADD_FAILURE() << "no exception for " << path;
    } catch (const Error& e) {
        const std::string msg = e.what();
        const bool first = dynamic_cast<const E*>(&e) != nullptr;
        EXPECT_TRUE(first || dynamic_cast<const E2*>(&e) != nullptr) << "wrong exception type: " << msg;
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        if (first && !fragment.empty()) {
            EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
        }
    } catch (const std::exception& e) {
        ADD_FAILURE() << "untyped exception for " << path << ": " << e.what();
    }
}

void writeSmallImage(const std::string& path, int w, int h) {
    fitsfile* f = nullptr;
    int status = 0;
    long naxes[2] = {w, h};
    std::vector<float> v(static_cast<std::size_t>(w) * static_cast<std::size_t>(h), 3.0f);
    for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>(i % 977);
    fits_create_file(&f, ("!" + path).c_str(), &status);
    fits_create_img(f, FLOAT_IMG, 2, naxes, &status);
    fits_write_img(f, TFLOAT, 1, static_cast<long long>(v.size()), v.data(), &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0);
}

void truncateTo(const std::string& path, std::uintmax_t size) {
    fs::resize_file(path, size);
}

} // namespace

TEST(FitsBadInput, MissingFileAndDirectoryAreIoErrors) {
    TempDir dir;
    const std::string missing = dir.file("nothere.fits");
    expectError<IoError>(
        missing, [&] { readFrame(missing); }, "no such file");
    expectError<IoError>(missing, [&] { listHdus(missing); });
    expectError<IoError>(missing, [&] { readHeader(missing); });
    const std::string d = dir.file("adir.fits");
    fs::create_directories(d);
    expectError<IoError>(d, [&] { readFrame(d); });
}

TEST(FitsBadInput, NotFitsIsInvalidInput) {
    TempDir dir;
    const std::string text = dir.file("notes.fits"), random = dir.file("random.fits"),
                      empty = dir.file("empty.fits"), fakeGz = dir.file("fake.fits.gz");
    writeBytes(text, "this is a text file\nnot a FITS image\n");
    std::string bytes(5000, '\0');
    std::mt19937 rng(1);
    for (auto& c : bytes)
        c = static_cast<char>(rng());
    writeBytes(random, bytes);
    writeBytes(empty, "");
    writeBytes(fakeGz, std::string("\x1f\x8b", 2) + bytes);
    expectError<InvalidInput>(
        text, [&] { readFrame(text); }, "not a FITS file");
    expectError<InvalidInput>(
        random, [&] { readFrame(random); }, "not a FITS file");
    expectError<InvalidInput>(
        empty, [&] { readFrame(empty); }, "empty");
    expectError<InvalidInput>(text, [&] { listHdus(text); });
    expectError<InvalidInput, IoError>(fakeGz, [&] { readFrame(fakeGz); });
    // A FITS-looking start with a broken header.
    const std::string broken = dir.file("broken.fits");
    writeBytes(broken, "SIMPLE  =                    T" + std::string(50, ' ') + "garbage garbage");
    expectError<InvalidInput, IoError>(broken, [&] { readFrame(broken); });
}

TEST(FitsBadInput, TruncatedDataIsReported) {
    TempDir dir;
    const std::string plain = dir.file("trunc.fits");
    writeSmallImage(plain, 100, 100); // 2880 header + 40000 data bytes (+ padding)
    truncateTo(plain, 2880 + 20000);
    expectError<IoError>(
        plain, [&] { readFrame(plain); }, "truncated");

    const std::string fz = dir.file("trunc.fits.fz");
    Image<float> img(200, 200);
    std::mt19937 rng(5);
    for (std::size_t i = 0; i < img.pixelCount(); ++i)
        img.data()[i] = static_cast<float>(rng() % 50000);
    writeFitsImage(fz, img.view(), Header{}, kBitpixUInt16);
    truncateTo(fz, fs::file_size(fz) / 2);
    expectError<IoError, InvalidInput>(fz, [&] { readFrame(fz); });

    const std::string headerOnly = dir.file("headtrunc.fits");
    writeSmallImage(headerOnly, 10, 10);
    truncateTo(headerOnly, 1000); // inside the header
    expectError<InvalidInput, IoError>(headerOnly, [&] { readFrame(headerOnly); });
}

TEST(FitsBadInput, NoImageHduAndWrongDimensions) {
    TempDir dir;
    const std::string tableOnly = dir.file("table.fits");
    {
        fitsfile* f = nullptr;
        int status = 0;
        char* ttype[] = {const_cast<char*>("X")};
        char* tform[] = {const_cast<char*>("1D")};
        fits_create_file(&f, ("!" + tableOnly).c_str(), &status);
        fits_create_img(f, 8, 0, nullptr, &status);
        fits_create_tbl(f, BINARY_TBL, 0, 1, ttype, tform, nullptr, "CAT", &status);
        fits_close_file(f, &status);
        ASSERT_EQ(status, 0);
    }
    expectError<InvalidInput>(
        tableOnly, [&] { readFrame(tableOnly); }, "no image HDU");
    FrameReadOptions o;
    o.hdu = "0";
    expectError<InvalidInput>(
        tableOnly, [&] { readFrame(tableOnly, o); }, "no data");
    EXPECT_EQ(listHdus(tableOnly).size(), 2u) << "listing still works";

    const std::string oneD = dir.file("oned.fits");
    writeBytes(oneD, rawFits(imageCards(-32, {"100"}), 400));
    expectError<InvalidInput>(
        oneD, [&] { readFrame(oneD); }, "1-D");

    const std::string cube = dir.file("cube.fits");
    writeBytes(cube, rawFits(imageCards(16, {"10", "10", "3"}), 600));
    expectError<InvalidInput>(
        cube, [&] { readFrame(cube); }, "3-D data");
    expectError<InvalidInput>(
        cube, [&] { readFrame(cube); }, "plane");
    EXPECT_EQ(readFrame(cube + "[0][*,*,2:2]").width(), 10) << "the plane syntax the message suggests";
    expectError<InvalidInput>(
        cube + "[0][*,*,2]", [&] { readFrame(cube + "[0][*,*,2]"); }, "brackets");

    const std::string flatCube = dir.file("flatcube.fits");
    writeBytes(flatCube, rawFits(imageCards(16, {"10", "10", "1"}), 200));
    EXPECT_EQ(readFrame(flatCube).width(), 10) << "NAXIS3 = 1 is a plain image";

    const std::string zero = dir.file("zero.fits");
    writeBytes(zero, rawFits(imageCards(-32, {"0", "10"}), 0));
    expectError<InvalidInput>(zero, [&] { readFrame(zero); }); // no image HDU with data
    expectError<InvalidInput>(
        zero, [&] { readFrame(zero, o); }, "zero-size axis");
}

TEST(FitsBadInput, AbsurdSizesAreRefusedWithoutAllocating) {
    TempDir dir;
    // 2e6 x 2e6 float32 = 16 TB promised, 2880 bytes present.
    const std::string huge = dir.file("huge.fits");
    writeBytes(huge, rawFits(imageCards(-32, {"2000000", "2000000"}), 2880));
    expectError<InvalidInput, IoError>(huge, [&] { readFrame(huge); });
    // Within the pixel limit but far beyond the file: refused as truncated before allocating 3.6 GB.
    const std::string big = dir.file("big.fits");
    writeBytes(big, rawFits(imageCards(-32, {"30000", "30000"}), 2880));
    expectError<IoError>(
        big, [&] { readFrame(big); }, "truncated");
    // Wider than an int.
    const std::string wide = dir.file("wide.fits");
    writeBytes(wide, rawFits(imageCards(8, {"99999999999", "1"}), 2880));
    expectError<InvalidInput, IoError>(wide, [&] { readFrame(wide); });
    const std::string negative = dir.file("negative.fits");
    writeBytes(negative, rawFits(imageCards(8, {"-5", "10"}), 2880));
    expectError<InvalidInput, IoError>(negative, [&] { readFrame(negative); });

    // A tile-compressed image whose ZNAXIS was edited to an absurd size: its tile table does not match.
    const std::string fz = dir.file("absurd.fits.fz");
    Image<float> img(64, 64, 5.0f);
    writeFitsImage(fz, img.view(), Header{}, 16);
    { // patch the cards in place (CFITSIO refuses to edit them through its compressed-image layer)
        std::ifstream in(fz, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        in.close();
        for (const char* key : {"ZNAXIS1 =", "ZNAXIS2 ="}) {
            const auto pos = bytes.find(key);
            ASSERT_NE(pos, std::string::npos);
            bytes.replace(pos + 10, 20, "          2000000000");
        }
        writeBytes(fz, bytes);
    }
    expectError<InvalidInput, IoError>(fz, [&] { readFrame(fz); });
}

TEST(FitsBadInput, UnusableInstrumentKeywordNamesFileAndKeyword) {
    TempDir dir;
    const std::string path = dir.file("badgain.fits");
    Header h;
    h.set("GAIN", -2.0);
    Image<float> img(4, 4, 1.0f);
    writeFitsImage(path, img.view(), h);
    expectError<InvalidInput>(
        path, [&] { readFrame(path); }, "GAIN");
    FrameReadOptions o;
    o.overrides.gain = 1.0;
    EXPECT_EQ(readFrame(path, o).instrument.gain, 1.0) << "an override replaces the bad value";
}
