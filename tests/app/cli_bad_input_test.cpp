// The bad-input matrix of `gpuphot reduce` (docs/RELIABILITY.md): every unusable frame or reference
// catalog ends in a non-zero exit, a message on stderr that names the file and the problem, and no file
// at all in the output directory (not even a temporary). What is usable but empty (pure noise) or partly
// usable (reference rows with NaN) reduces, with a warning or a count.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

std::size_t countEntries(const fs::path& dir) {
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        (void)e;
        ++n;
    }
    return n;
}

std::string fitsCard(const std::string& key, const std::string& value) {
    std::string k = key;
    k.resize(8, ' ');
    std::string v = value;
    if (v.size() < 20) v.insert(0, 20 - v.size(), ' ');
    std::string c = k + "= " + v;
    c.resize(80, ' ');
    return c;
}

// A hand-made FITS file: the cards, END, padding, then `data` (big-endian already) padded to 2880.
std::string rawFits(const std::vector<std::string>& cards, const std::string& data = {}, bool pad = true) {
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
    s += data;
    if (pad) s.resize((s.size() + 2879) / 2880 * 2880, '\0');
    return s;
}

void writeBytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Gaussian-ish noise around 1000 ADU, sigma 10 (sum of 12 uniforms), seeded.
Image<float> noise(int w, int h, std::uint32_t seed) {
    Image<float> img(w, h);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            double s = 0;
            for (int k = 0; k < 12; ++k) s += u(rng);
            img(x, y) = static_cast<float>(1000.0 + 10.0 * (s - 6.0));
        }
    return img;
}

// Big-endian float32 pixel bytes of `img`.
std::string floatData(const Image<float>& img) {
    std::string d;
    d.reserve(img.pixelCount() * 4);
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) {
            const std::uint32_t b = __builtin_bswap32(std::bit_cast<std::uint32_t>(img(x, y)));
            d.append(reinterpret_cast<const char*>(&b), 4);
        }
    return d;
}

struct BadCase {
    std::string file;     // in the input directory
    std::string fragment; // the problem, as the message must say it
    std::string args = {}; // more options of the reduce call
};

class CliBadInput : public ::testing::Test {
protected:
    TempDir in{"gpuphot_badin"};

    // Runs reduce on the case into a fresh output directory and checks the contract.
    void expectRefused(const BadCase& c) {
        TempDir out("gpuphot_badout");
        const std::string file = in / c.file;
        const CliResult r =
            runCli("reduce " + file + " -o " + out.str() + (c.args.empty() ? "" : " " + c.args));
        EXPECT_NE(r.exitCode, 0) << c.file << ": " << r.err;
        EXPECT_NE(r.exitCode, -1) << c.file << ": killed by a signal (a crash): " << r.err;
        EXPECT_NE(r.err.find(c.file), std::string::npos) << c.file << ": the message must name the file: " << r.err;
        EXPECT_NE(r.err.find(c.fragment), std::string::npos) << c.file << ": expected '" << c.fragment << "' in: " << r.err;
        EXPECT_EQ(r.err.find("AddressSanitizer"), std::string::npos) << r.err;
        EXPECT_EQ(r.err.find("runtime error"), std::string::npos) << r.err;
        EXPECT_EQ(countEntries(out.path), 0u) << c.file << " left files behind";
    }
};

} // namespace

TEST_F(CliBadInput, UnreadableFilesAreRefused) {
    writeBytes(in / "empty.fits", "");
    writeBytes(in / "text.fits", "RA DEC MAG\n10.0 20.0 12.5\nthis is a catalog, not an image\n");
    std::mt19937 rng(8);
    std::string random(20000, '\0');
    for (char& ch : random) ch = static_cast<char>(rng() & 0xff);
    writeBytes(in / "random.fits", random);
    // A valid first card, then garbage: gets past the SIMPLE check into CFITSIO.
    writeBytes(in / "random_after_simple.fits", fitsCard("SIMPLE", "T") + random.substr(0, 5680));
    // Header only: a primary HDU without data and no extension.
    writeBytes(in / "header_only.fits", rawFits({fitsCard("SIMPLE", "T"), fitsCard("BITPIX", "8"), fitsCard("NAXIS", "0")}));
    // Truncated: the header promises 128 x 128 float32 (64 KiB), the file holds 1 KiB of it.
    writeBytes(in / "truncated.fits",
               rawFits({fitsCard("SIMPLE", "T"), fitsCard("BITPIX", "-32"), fitsCard("NAXIS", "2"), fitsCard("NAXIS1", "128"),
                        fitsCard("NAXIS2", "128")},
                       std::string(1024, '\0'), false));
    for (const BadCase& c : {BadCase{"empty.fits", "empty file"}, BadCase{"text.fits", "not a FITS file"},
                             BadCase{"random.fits", "not a FITS file"}, BadCase{"random_after_simple.fits", "FITS"},
                             BadCase{"header_only.fits", "no image HDU with data"},
                             BadCase{"truncated.fits", "truncated file"}, BadCase{"missing.fits", "no such file"}}) {
        SCOPED_TRACE(c.file);
        expectRefused(c);
    }
}

TEST_F(CliBadInput, FramesWithoutUsablePixelsAreRefused) {
    // Decision (docs/RELIABILITY.md): a frame that cannot hold a measurable source is an input error, not
    // an empty catalog: all NaN, all zero or constant (no variance: a bias/dark-subtracted blank or a
    // broken readout), saturated everywhere, or smaller than 8 x 8 pixels (a wrong HDU or a placeholder).
    writeFitsImage(in / "nan.fits", Image<float>(64, 64, std::nanf("")).view(), Header{});
    writeFitsImage(in / "zero.fits", Image<float>(64, 64, 0.0f).view(), Header{});
    writeFitsImage(in / "constant.fits", Image<float>(64, 64, 1234.5f).view(), Header{});
    Header sat;
    sat.set("SATURATE", 50000.0);
    writeFitsImage(in / "saturated.fits", Image<float>(64, 64, 65535.0f).view(), sat);
    writeFitsImage(in / "one_by_one.fits", noise(1, 1, 1).view(), Header{});
    writeFitsImage(in / "thin.fits", noise(200, 3, 2).view(), Header{});
    writeFitsImage(in / "good.fits", noise(64, 64, 3).view(), Header{});
    writeFitsImage(in / "all_bad.fits", Image<float>(64, 64, 1.0f).view(), Header{});
    for (const BadCase& c : {BadCase{"nan.fits", "no valid pixels"}, BadCase{"zero.fits", "constant"},
                             BadCase{"constant.fits", "constant"}, BadCase{"saturated.fits", "saturated"},
                             BadCase{"one_by_one.fits", "too small"}, BadCase{"thin.fits", "too small"},
                             // usable as read, every pixel masked by the preparation: the checks see the
                             // prepared frame, not the statistics the read made
                             BadCase{"good.fits", "no valid pixels", "--bpm " + (in / "all_bad.fits")}}) {
        SCOPED_TRACE(c.file);
        expectRefused(c);
    }
}

TEST_F(CliBadInput, WrongDimensionsAndAbsurdSizesAreRefusedWithoutAllocating) {
    const auto cards = [](int bitpix, std::vector<std::string> axes) {
        std::vector<std::string> c = {fitsCard("SIMPLE", "T"), fitsCard("BITPIX", std::to_string(bitpix)),
                                      fitsCard("NAXIS", std::to_string(axes.size()))};
        for (std::size_t i = 0; i < axes.size(); ++i) c.push_back(fitsCard("NAXIS" + std::to_string(i + 1), axes[i]));
        return c;
    };
    writeBytes(in / "oned.fits", rawFits(cards(-32, {"4096"}), std::string(4096 * 4, '\0')));
    writeBytes(in / "cube.fits", rawFits(cards(16, {"32", "32", "3"}), std::string(32 * 32 * 3 * 2, '\0')));
    // 10^9 x 10^9 pixels in a 5760-byte file: refused from the header alone.
    writeBytes(in / "absurd.fits", rawFits(cards(-32, {"1000000000", "1000000000"}), std::string(16, '\0')));
    // 60000 x 60000 float32 (14 GB) promised by a 5760-byte file: the size check against the file comes
    // before any allocation. (A 14 GB allocation would take the test machine down, not fail the test.)
    writeBytes(in / "huge_promise.fits", rawFits(cards(-32, {"60000", "60000"}), std::string(16, '\0')));
    writeBytes(in / "negative_axis.fits", rawFits(cards(-32, {"-5", "64"}), std::string(16, '\0')));
    // A negative NAXISn: CFITSIO refuses it while opening; the message names the file and the keyword.
    for (const BadCase& c : {BadCase{"oned.fits", "1-D"}, BadCase{"cube.fits", "cube"}, BadCase{"absurd.fits", "absurd"},
                             BadCase{"huge_promise.fits", "truncated"}, BadCase{"negative_axis.fits", "NAXIS"}}) {
        SCOPED_TRACE(c.file);
        expectRefused(c);
    }
}

TEST_F(CliBadInput, UnusableInstrumentAndWcsKeywordsAreRefused) {
    const Image<float> img = noise(64, 64, 3);
    Header neg;
    neg.set("GAIN", -1.5);
    writeFitsImage(in / "negative_gain.fits", img.view(), neg);
    Header zero;
    zero.set("GAIN", 0.0);
    writeFitsImage(in / "zero_gain.fits", img.view(), zero);
    Header wcs;
    for (auto [k, v] : {std::pair{"CRPIX1", 32.0}, {"CRPIX2", 32.0}, {"CRVAL1", 150.0}, {"CRVAL2", 2.0},
                        // second row = first row: det(CD) = 0
                        {"CD1_1", -2.8e-4}, {"CD1_2", 1.0e-5}, {"CD2_1", -2.8e-4}, {"CD2_2", 1.0e-5}})
        wcs.set(k, v);
    wcs.set("CTYPE1", "RA---TAN");
    wcs.set("CTYPE2", "DEC--TAN");
    writeFitsImage(in / "singular_cd.fits", img.view(), wcs);
    for (const BadCase& c : {BadCase{"negative_gain.fits", "GAIN"}, BadCase{"zero_gain.fits", "GAIN"},
                             BadCase{"singular_cd.fits", "singular"}}) {
        SCOPED_TRACE(c.file);
        expectRefused(c);
    }
    // The documented ways out of a broken header WCS: a pixel-only catalog on request.
    TempDir out("gpuphot_badout");
    const CliResult r = runCli("reduce " + (in / "singular_cd.fits") + " --ignore-header-wcs -q -o " + out.str());
    EXPECT_EQ(r.exitCode, 0) << r.err;
    EXPECT_TRUE(fs::exists(out.path / "singular_cd.cat.fits"));
}

TEST_F(CliBadInput, HugeHeaderIsReadInLinearTime) {
    // 100 000 cards (8 MB of header) in front of a 64 x 64 noise frame with one star: either reduces or
    // fails clearly; it must not crash or take quadratic time (the ctest timeout would catch that; no
    // timing assertion here).
    Image<float> img = noise(64, 64, 4);
    for (int y = 28; y < 37; ++y)
        for (int x = 28; x < 37; ++x) img(x, y) += static_cast<float>(5000.0 * std::exp(-((x - 32) * (x - 32) + (y - 32) * (y - 32)) / 4.5));
    std::vector<std::string> cards = {fitsCard("SIMPLE", "T"), fitsCard("BITPIX", "-32"), fitsCard("NAXIS", "2"),
                                      fitsCard("NAXIS1", "64"), fitsCard("NAXIS2", "64")};
    for (int i = 0; i < 100000; ++i) cards.push_back(fitsCard("K" + std::to_string(i), std::to_string(i)));
    writeBytes(in / "huge_header.fits", rawFits(cards, floatData(img)));
    TempDir out("gpuphot_badout");
    const CliResult r = runCli("reduce " + (in / "huge_header.fits") + " -o " + out.str());
    EXPECT_NE(r.exitCode, -1) << r.err;
    if (r.exitCode == 0) {
        const Table cat = readFitsTable(out / "huge_header.cat.fits");
        const auto x = cat.doubles("x"), y = cat.doubles("y");
        bool star = false; // the one star, at 0-based (32, 32) = 1-based (33, 33)
        for (std::size_t i = 0; i < x.size(); ++i) star = star || std::hypot(x[i] - 33.0, y[i] - 33.0) < 1.0;
        EXPECT_TRUE(star) << cat.rows() << " sources, none at the star";
    } else {
        EXPECT_NE(r.err.find("huge_header.fits"), std::string::npos) << r.err;
        EXPECT_EQ(countEntries(out.path), 0u);
    }
}

namespace {

// A simulated frame and its reference catalog, shared by the reference tests.
struct SimField {
    TempDir dir{"gpuphot_badref_sim"};
    std::string frame, ref;
    SimField() {
        const CliResult r = runCli("simulate --size 256x256 --stars 80 --seed 21 -q -o " + dir.str() + " --name f");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        frame = dir / "f.fits";
        ref = dir / "f.ref.fits";
    }
};
const SimField& simField() {
    static SimField f;
    return f;
}

// The reference catalog as CSV, optionally with extra rows.
std::string refCsv(const std::string& refFits, const std::vector<std::string>& extraRows, bool dropGoodRows = false) {
    const Table t = readFitsTable(refFits);
    const auto ra = t.doubles("ra"), dec = t.doubles("dec"), mag = t.doubles("mag");
    std::string s = "ra,dec,mag\n";
    char line[128];
    if (!dropGoodRows)
        for (std::size_t i = 0; i < ra.size(); ++i) {
            std::snprintf(line, sizeof line, "%.10f,%.10f,%.5f\n", ra[i], dec[i], mag[i]);
            s += line;
        }
    for (const auto& r : extraRows) s += r + "\n";
    return s;
}

} // namespace

TEST_F(CliBadInput, ReferenceCatalogWithoutUsableRowsIsRefusedBeforeAnyOutput) {
    const SimField& sim = simField();
    writeBytes(in / "nan_ref.csv", refCsv(sim.ref, {"nan,10.0,12.0", "150.0,nan,12.5", "150.0,2.0,nan", "150.0,2.0,"}, true));
    writeBytes(in / "header_ref.csv", "ra,dec,mag\n");
    for (const std::string name : {"nan_ref.csv", "header_ref.csv"}) {
        SCOPED_TRACE(name);
        TempDir out("gpuphot_badout");
        const CliResult r = runCli("reduce " + sim.frame + " --ref " + (in / name) + " -o " + out.str());
        EXPECT_NE(r.exitCode, 0) << r.err;
        EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("no usable rows"), std::string::npos) << r.err;
        EXPECT_EQ(countEntries(out.path), 0u);
    }
}

TEST_F(CliBadInput, ReferenceRowsWithNaNAreSkippedAndCounted) {
    const SimField& sim = simField();
    writeBytes(in / "some_nan.csv", refCsv(sim.ref, {"nan,2.0,12.0", "150.0,nan,12.5", "150.0,2.0,nan"}));
    TempDir out("gpuphot_badout");
    const CliResult r = runCli("reduce " + sim.frame + " --ref " + (in / "some_nan.csv") + " -o " + out.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(out.path / "f.report.json"));
    const Table refTable = readFitsTable(sim.ref);
    const auto ra = refTable.doubles("ra"), dec = refTable.doubles("dec"), mag = refTable.doubles("mag");
    std::size_t good = 0, all = refTable.rows();
    for (std::size_t i = 0; i < ra.size(); ++i) good += std::isfinite(ra[i]) && std::isfinite(dec[i]) && std::isfinite(mag[i]);
    EXPECT_EQ(report["reference"]["skipped_nonfinite"].get<std::size_t>(), all - good + 3);
    EXPECT_EQ(report["reference"]["usable"].get<std::size_t>(), good);
    EXPECT_EQ(report["reference"]["rows"].get<std::size_t>(), all + 3);
    EXPECT_TRUE(report["zp"].is_number()) << "the usable rows still calibrate";
}

TEST_F(CliBadInput, ReferenceCatalogOfAnotherFieldFailsCalibrationWithADistinctStatus) {
    // Decision (docs/RELIABILITY.md): no overlap is found only after the photometry ran, and the
    // instrumental catalog is still worth having: exit status 4 ("uncalibrated"), the problem on stderr,
    // the catalog and report written (complete), no WCS file, ZP NaN. Not exit 0, never silently.
    const SimField& sim = simField();
    TempDir other("gpuphot_badref_other");
    ASSERT_EQ(runCli("simulate --size 256x256 --stars 80 --seed 22 --set ra=30.0 --set dec=-40.0 -q -o " + other.str() +
                     " --name away")
                  .exitCode,
              0);
    TempDir out("gpuphot_badout");
    const CliResult r = runCli("reduce " + sim.frame + " --ref " + (other / "away.ref.fits") + " -o " + out.str());
    EXPECT_EQ(r.exitCode, 4) << r.err;
    EXPECT_NE(r.err.find("f.fits"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("calibration failed"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out.path / "f.wcs"));
    const Table cat = readFitsTable(out / "f.cat.fits");
    EXPECT_FALSE(std::isfinite(*cat.meta.getDouble("ZP")));
}
