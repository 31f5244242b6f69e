// `gpuphot info`: runs the real binary (GPUPHOT_CLI) on files written by the test and checks its text and
// JSON output and its exit codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "core/io/fits_image.hpp"

#include "tests/test_support.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

struct TempDir : test::TempDir {
    TempDir() : test::TempDir("gpuphot_cli_info") {}
};

struct Result {
    int rc = -1;
    std::string out, err;
};

std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s)
        q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

Result runCli(const std::string& args, const TempDir& dir) {
    const std::string errFile = dir.file("stderr.txt");
    const std::string cmd = quote(GPUPHOT_CLI) + " " + args + " 2>" + quote(errFile);
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    std::size_t n = 0;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0)
        r.out.append(buf, n);
    const int status = pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream e(errFile);
    std::stringstream ss;
    ss << e.rdbuf();
    r.err = ss.str();
    return r;
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// A 7 x 5 frame with values 1..35 (one NaN in place of 35 when `withNan`), GAIN and EXPTIME keywords.
std::string writeFrame(const TempDir& dir, const std::string& name, int bitpix, bool withNan) {
    Image<float> img(7, 5);
    for (int i = 0; i < 35; ++i)
        img.data()[i] = static_cast<float>(i + 1);
    if (withNan) img.data()[34] = std::nanf("");
    Header h;
    h.set("GAIN", 2.5, "e-/ADU");
    h.set("EXPTIME", 30.0);
    h.set("FILTER", "V");
    h.set("SATURATE", 34.0);
    const std::string path = dir.file(name);
    writeFitsImage(path, img.view(), h, bitpix);
    return path;
}

} // namespace

TEST(CliInfo, PrintsHdusStatisticsAndInstrument) {
    TempDir dir;
    const std::string path = writeFrame(dir, "frame.fits", -32, false);
    const Result r = runCli("info " + quote(path), dir);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(contains(r.out, path)) << r.out;
    EXPECT_TRUE(contains(r.out, "7 x 5 pixels")) << r.out;
    // values 1..35: min 1, max 35, median 18, mean 18
    EXPECT_TRUE(contains(r.out, "min 1  max 35  median 18  mean 18")) << r.out;
    EXPECT_TRUE(contains(r.out, "2 saturated")) << "34 and 35 are at or above SATURATE = 34\n" << r.out;
    EXPECT_TRUE(contains(r.out, "2.5 e-/ADU")) << r.out;
    EXPECT_TRUE(contains(r.out, "[GAIN]")) << r.out;
    EXPECT_TRUE(contains(r.out, "[EXPTIME]")) << r.out;
    EXPECT_TRUE(contains(r.out, "wcs        none")) << r.out;
}

// A tile-compressed float frame: its empty primary HDU shows no pixel type (a BITPIX 16 there read as the
// file's), the image row and the summary its own -32.
TEST(CliInfo, CompressedFloatFrameShowsItsOwnBitpixOnly) {
    TempDir dir;
    const std::string path = writeFrame(dir, "float.fits.fz", -32, false);
    const Result r = runCli("info " + quote(path), dir);
    ASSERT_EQ(r.rc, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line, primary, image;
    while (std::getline(lines, line)) {
        if (line.rfind("  0 ", 0) == 0) primary = line;
        if (line.rfind("  1 ", 0) == 0) image = line;
    }
    EXPECT_TRUE(contains(primary, "no data")) << r.out;
    EXPECT_FALSE(contains(primary, "16")) << r.out;
    EXPECT_TRUE(contains(image, "-32")) << r.out;
    EXPECT_TRUE(contains(r.out, "7 x 5 pixels, BITPIX -32")) << r.out;
    EXPECT_FALSE(contains(r.out, "BITPIX 16")) << r.out;
}

TEST(CliInfo, JsonOutputIsMachineReadable) {
    TempDir dir;
    const std::string path = writeFrame(dir, "frame.fits.fz", kBitpixUInt16, true);
    const Result r = runCli("info --json --gain 4 " + quote(path), dir);
    ASSERT_EQ(r.rc, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["file"], path);
    ASSERT_EQ(j["hdus"].size(), 2u);
    EXPECT_EQ(j["hdus"][1]["compressed"], true);
    EXPECT_EQ(j["hdus"][1]["bitpix"], kBitpixUInt16);
    const auto& img = j["image"];
    EXPECT_EQ(img["hdu"], 1);
    EXPECT_EQ(img["width"], 7);
    EXPECT_EQ(img["height"], 5);
    EXPECT_EQ(img["bitpix"], 16);
    // values 1..34 (35 became NaN -> BLANK): median of an even count is the mean of the middle two
    EXPECT_EQ(img["stats"]["finite"], 34);
    EXPECT_EQ(img["stats"]["nonFinite"], 1);
    EXPECT_EQ(img["stats"]["blank"], 1);
    EXPECT_EQ(img["stats"]["min"], 1.0);
    EXPECT_EQ(img["stats"]["max"], 34.0);
    EXPECT_EQ(img["stats"]["median"], 17.5);
    EXPECT_EQ(img["stats"]["mean"], 17.5);
    EXPECT_EQ(img["stats"]["saturated"], 1);
    EXPECT_EQ(img["instrument"]["gain"]["value"], 4.0);
    EXPECT_EQ(img["instrument"]["gain"]["source"], "override");
    EXPECT_EQ(img["instrument"]["exptime"]["value"], 30.0);
    EXPECT_EQ(img["instrument"]["filter"], "V");
    EXPECT_TRUE(img["wcs"].contains("problem"));

    const Result byHdu = runCli("info --json --hdu 1 " + quote(path), dir);
    ASSERT_EQ(byHdu.rc, 0) << byHdu.err;
    EXPECT_EQ(nlohmann::json::parse(byHdu.out)["image"]["hdu"], 1);
}

TEST(CliInfo, QuietPrintsOneLine) {
    TempDir dir;
    const std::string path = writeFrame(dir, "q.fits", 16, false);
    const Result r = runCli("info -q " + quote(path), dir);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_TRUE(contains(r.out, "7 x 5 BITPIX 16")) << r.out;
}

TEST(CliInfo, BadFilesFailWithTheFileNameOnStderr) {
    TempDir dir;
    const std::string text = dir.file("notes.fits");
    std::ofstream(text) << "not a FITS file\n";
    const std::string missing = dir.file("missing.fits");
    const std::string good = writeFrame(dir, "good.fits", -32, false);
    for (const auto& [args, file] :
         {std::pair{"info " + quote(text), text}, std::pair{"info " + quote(missing), missing},
          std::pair{"info --hdu 3 " + quote(good), good}, std::pair{"info --json " + quote(text), text}}) {
        SCOPED_TRACE(args);
        const Result r = runCli(args, dir);
        EXPECT_NE(r.rc, 0);
        EXPECT_TRUE(contains(r.err, file)) << r.err;
        EXPECT_TRUE(contains(r.err, "error")) << r.err;
    }
    EXPECT_NE(runCli("info", dir).rc, 0) << "the file argument is required";
}
