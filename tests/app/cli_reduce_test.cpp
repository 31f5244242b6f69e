// gpuphot reduce end to end through the binary: outputs, formats, bad inputs write nothing, an empty
// field gives an empty catalog and a warning, and the catalog does not depend on the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

// A small simulated frame shared by the tests of this file (simulated once).
const std::string& simulatedFrame() {
    static TempDir dir("gpuphot_reduce_sim");
    static std::string path = [] {
        const CliResult r = runCli("simulate --size 512x512 --stars 150 --seed 7 --set magFaint=18.5 -o " + dir.str() + " --name field -q");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        return dir / "field.fits";
    }();
    return path;
}

std::size_t countFiles(const fs::path& dir) {
    std::size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file();
    return n;
}

void writeImage(const std::string& path, const Image<float>& img, Header h = {}) { writeFitsImage(path, img.view(), h); }

} // namespace

TEST(CliReduce, WritesCatalogWithTheDesignColumnsAndAReport) {
    TempDir out("gpuphot_reduce_out");
    const CliResult r = runCli("reduce " + simulatedFrame() + " -o " + out.str() + " --formats ecsv,csv,reg --maps bkg,rms,seg,psf,resid");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    for (const char* f : {"field.cat.fits", "field.report.json", "field.cat.ecsv", "field.cat.csv", "field.reg",
                          "field.bkg.fits", "field.rms.fits", "field.seg.fits", "field.psf.fits", "field.resid.fits"})
        EXPECT_TRUE(fs::exists(out.path / f)) << f;
    const Table cat = readFitsTable(out / "field.cat.fits");
    const Table truth = readFitsTable(fs::path(simulatedFrame()).replace_filename("field.truth.fits").string());
    EXPECT_GT(cat.rows(), truth.rows() * 3 / 4) << "most of the 150 simulated stars (all brighter than S/N ~ 20) are detected";
    EXPECT_LT(cat.rows(), truth.rows() * 3 / 2);
    for (const char* c : {"id", "x", "y", "x_err", "y_err", "x_iso", "y_iso", "ra", "dec", "a", "b", "theta", "fwhm",
                          "ellipticity", "flux_iso", "area_iso", "flux_aper_1", "fluxerr_aper_1", "mag_aper_1",
                          "magerr_aper_1", "flux_auto", "fluxerr_auto", "mag_auto", "kron_radius", "flux_opt",
                          "fluxerr_opt", "flux_psf", "fluxerr_psf", "sky", "peak", "flags", "ref_id", "ref_sep",
                          "mag_cal", "magerr_cal"})
        EXPECT_NE(cat.find(c), nullptr) << "missing column " << c;
    EXPECT_TRUE(cat.meta.getDouble("APRAD1").has_value());
    // 1-based positions: every x lies in [0.5, 512.5].
    for (double x : cat.doubles("x")) {
        EXPECT_GE(x, 0.5);
        EXPECT_LE(x, 512.5);
    }
    // RA/Dec from the header WCS.
    EXPECT_TRUE(std::isfinite(cat.doubles("ra").front()));
    const auto report = nlohmann::json::parse(slurp(out.path / "field.report.json"));
    EXPECT_EQ(report["counts"]["sources"].get<std::size_t>(), cat.rows());
    EXPECT_GT(report["fwhm"].get<double>(), 1.0);
    EXPECT_FALSE(report["stages"].empty());
    EXPECT_EQ(report["outputs"]["catalog"].get<std::string>(), out / "field.cat.fits");
}

TEST(CliReduce, CatalogIsBitwiseIdenticalForOneAndTwoThreads) {
    TempDir a("gpuphot_reduce_t1"), b("gpuphot_reduce_t2");
    ASSERT_EQ(runCli("reduce " + simulatedFrame() + " --threads 1 -q -o " + a.str()).exitCode, 0);
    ASSERT_EQ(runCli("reduce " + simulatedFrame() + " --threads 2 -q -o " + b.str()).exitCode, 0);
    const Table ta = readFitsTable(a / "field.cat.fits"), tb = readFitsTable(b / "field.cat.fits");
    ASSERT_EQ(ta.rows(), tb.rows());
    ASSERT_EQ(ta.columns().size(), tb.columns().size());
    for (std::size_t c = 0; c < ta.columns().size(); ++c) {
        const auto da = ta.doubles(ta.columns()[c].name), db = tb.doubles(tb.columns()[c].name);
        for (std::size_t i = 0; i < da.size(); ++i) {
            const bool same = (std::isnan(da[i]) && std::isnan(db[i])) || da[i] == db[i];
            ASSERT_TRUE(same) << ta.columns()[c].name << " row " << i << ": " << da[i] << " vs " << db[i];
        }
    }
}

TEST(CliReduce, PureNoiseGivesAnEmptyCatalogAndAWarning) {
    TempDir dir("gpuphot_reduce_noise");
    Image<float> img(256, 256);
    std::uint32_t state = 12345;
    for (int y = 0; y < 256; ++y)
        for (int x = 0; x < 256; ++x) {
            // sum of uniforms: approximately Gaussian noise, sigma 10 around 1000
            double s = 0;
            for (int k = 0; k < 12; ++k) {
                state = state * 1664525u + 1013904223u;
                s += state / 4294967296.0;
            }
            img(x, y) = static_cast<float>(1000.0 + 10.0 * (s - 6.0));
        }
    writeImage(dir / "noise.fits", img);
    const CliResult r = runCli("reduce " + (dir / "noise.fits") + " --threshold 6 -o " + dir.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
    EXPECT_EQ(readFitsTable(dir / "noise.cat.fits").rows(), 0u);
}

TEST(CliReduce, BadFramesGiveAClearErrorAndWriteNothing) {
    TempDir in("gpuphot_reduce_bad_in"), out("gpuphot_reduce_bad_out");
    {
        std::ofstream(in / "text.fits") << "this is not a FITS file\n";
    }
    Image<float> nan(64, 64, std::nanf("")), constant(64, 64, 7.0f), zero(64, 64, 0.0f), sat(64, 64, 60000.0f);
    writeImage(in / "nan.fits", nan);
    writeImage(in / "constant.fits", constant);
    writeImage(in / "zero.fits", zero);
    Header satHeader;
    satHeader.set("SATURATE", 50000.0);
    writeImage(in / "saturated.fits", sat, satHeader);
    for (const char* name : {"text.fits", "nan.fits", "constant.fits", "zero.fits", "saturated.fits", "missing.fits"}) {
        const CliResult r = runCli("reduce " + (in / name) + " -o " + out.str());
        EXPECT_NE(r.exitCode, 0) << name;
        EXPECT_NE(r.err.find(name), std::string::npos) << name << ": " << r.err;
        EXPECT_EQ(countFiles(out.path), 0u) << name << " left files behind";
    }
}

TEST(CliReduce, ConfigErrorsAreReported) {
    TempDir dir("gpuphot_reduce_cfg");
    std::ofstream(dir / "typo.json") << R"({"detection": {"treshold": 3}})";
    const CliResult r = runCli("reduce " + simulatedFrame() + " --config " + (dir / "typo.json") + " -o " + dir.str());
    EXPECT_NE(r.exitCode, 0);
    EXPECT_NE(r.err.find("detection.treshold"), std::string::npos) << r.err;
    const CliResult dump = runCli("reduce --dump-config");
    ASSERT_EQ(dump.exitCode, 0);
    const auto j = nlohmann::json::parse(dump.out);
    EXPECT_TRUE(j.contains("detection"));
    EXPECT_TRUE(j["aperture"].contains("radii"));
}

TEST(CliReduce, UnknownFormatIsRefusedBeforeAnyWork) {
    const CliResult r = runCli("reduce " + simulatedFrame() + " --formats votable -o /tmp");
    EXPECT_NE(r.exitCode, 0);
    EXPECT_NE(r.err.find("votable"), std::string::npos);
}

TEST(CliReduce, ReferenceCatalogGivesAZeroPointAndCalibratedMagnitudes) {
    TempDir out("gpuphot_reduce_ref");
    const std::string ref = fs::path(simulatedFrame()).replace_filename("field.ref.fits").string();
    const CliResult r = runCli("reduce " + simulatedFrame() + " --ref " + ref + " -o " + out.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const Table cat = readFitsTable(out / "field.cat.fits");
    const double simZp = *readHeader(simulatedFrame()).getDouble("SIMZP");
    ASSERT_TRUE(cat.meta.getDouble("ZP").has_value());
    EXPECT_NEAR(*cat.meta.getDouble("ZP"), simZp, 0.01) << "small field: the tight bar is in zeropoint_test";
    std::size_t matched = 0, calibrated = 0;
    const auto refId = cat.doubles("ref_id"), magCal = cat.doubles("mag_cal");
    for (std::size_t i = 0; i < cat.rows(); ++i) {
        matched += refId[i] >= 0;
        calibrated += std::isfinite(magCal[i]);
    }
    EXPECT_GT(matched, cat.rows() / 2);
    EXPECT_EQ(calibrated, cat.rows());
    const auto report = nlohmann::json::parse(slurp(out.path / "field.report.json"));
    EXPECT_NEAR(report["zp"].get<double>(), *cat.meta.getDouble("ZP"), 1e-12);
    EXPECT_GT(report["calibration"]["calibrators"].get<int>(), 10);
}

TEST(CliReduce, CalibrationFailureStillWritesTheCatalogAndSaysWhy) {
    // A reference catalog of another part of the sky: no WCS can be verified, no zero point comes out.
    TempDir dir("gpuphot_reduce_nocal");
    ASSERT_EQ(runCli("simulate --size 256x256 --stars 80 --seed 3 -q -o " + dir.str() + " --name here").exitCode, 0);
    ASSERT_EQ(runCli("simulate --size 256x256 --stars 80 --seed 4 --set ra=30.0 --set dec=-40.0 -q -o " + dir.str() +
                     " --name elsewhere")
                  .exitCode,
              0);
    const CliResult r = runCli("reduce " + (dir / "here.fits") + " --ref " + (dir / "elsewhere.ref.fits") + " -o " + dir.str());
    EXPECT_EQ(r.exitCode, 4) << "distinct status for an uncalibrated catalog: " << r.err;
    EXPECT_NE(r.err.find("calibration failed"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("astrometry failed"), std::string::npos) << r.err;
    ASSERT_TRUE(fs::exists(dir.path / "here.cat.fits"));
    EXPECT_FALSE(fs::exists(dir.path / "here.wcs")) << "a WCS that failed verification is never written";
    const Table cat = readFitsTable(dir / "here.cat.fits");
    EXPECT_FALSE(std::isfinite(*cat.meta.getDouble("ZP")));
    EXPECT_EQ(*cat.meta.getString("WCSSRC"), "header");
    const auto report = nlohmann::json::parse(slurp(dir.path / "here.report.json"));
    EXPECT_TRUE(report["zp"].is_null());
    EXPECT_FALSE(report["astrometry"]["ok"].get<bool>());
    EXPECT_FALSE(report["calibration"]["problem"].get<std::string>().empty());
}

TEST(CliReduce, WrongHeaderWcsIsSolvedAndTheFittedWcsIsWritten) {
    TempDir dir("gpuphot_reduce_astrom");
    ASSERT_EQ(runCli("simulate --size 1024x1024 --stars 1500 --seed 11 --wcs-offset 30 --wcs-rotation 5 -q -o " +
                     dir.str() + " --name off")
                  .exitCode,
              0);
    const CliResult r = runCli("reduce " + (dir / "off.fits") + " --ref " + (dir / "off.ref.fits") + " -o " + dir.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    ASSERT_TRUE(fs::exists(dir.path / "off.wcs"));
    const Table cat = readFitsTable(dir / "off.cat.fits");
    EXPECT_EQ(*cat.meta.getString("WCSSRC"), "fitted (blind)");
    EXPECT_LT(*cat.meta.getDouble("ASTRMS"), 0.2) << "arcsec at 1 arcsec/px";
    // RA/Dec of the catalog against the truth: every matched truth star within 0.1 arcsec.
    const Table truth = readFitsTable(dir / "off.truth.fits");
    const auto tx = truth.doubles("x"), ty = truth.doubles("y"), tra = truth.doubles("ra"), tdec = truth.doubles("dec");
    const auto cx = cat.doubles("x"), cy = cat.doubles("y"), cra = cat.doubles("ra"), cdec = cat.doubles("dec");
    std::size_t checked = 0;
    double worst = 0.0;
    for (std::size_t k = 0; k < tx.size(); ++k)
        for (std::size_t i = 0; i < cx.size(); ++i)
            if (std::hypot(cx[i] - tx[k], cy[i] - ty[k]) < 0.05) { // essentially exact positions: bright stars
                const double d = std::hypot((cra[i] - tra[k]) * std::cos(tdec[k] * M_PI / 180), cdec[i] - tdec[k]) * 3600;
                worst = std::max(worst, d);
                ++checked;
            }
    EXPECT_GT(checked, 50u);
    EXPECT_LT(worst, 0.1);
}

// `reduce -v` of one frame prints the process's timeline on stderr: every step once, in order, with times
// that never go back; without -v, none of it.
TEST(CliReduce, VerboseReducePrintsTheTimelineInOrder) {
    TempDir out("gpuphot_reduce_timeline");
    const std::string ref = fs::path(simulatedFrame()).replace_filename("field.ref.fits").string();
    const CliResult r = runCli("reduce " + simulatedFrame() + " --ref " + ref + " -v -o " + out.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    std::vector<std::pair<double, std::string>> marks;
    std::istringstream lines(r.err);
    for (std::string line; std::getline(lines, line);) {
        double t = 0.0;
        char what[128] = {};
        if (std::sscanf(line.c_str(), "timeline: +%lf s %127[^\n]", &t, what) == 2)
            marks.emplace_back(t, what);
    }
    const std::vector<std::string> expected = {
        "reduce starts", "reference catalog read", "device warm-up started", "frame read",
        "prepare done",  "detection done",         "astrometry done",        "zeropoint done",
        "frame reduced", "outputs written",        "frame released",         "command returned"};
    std::size_t at = 0;
    for (const auto& [t, what] : marks)
        if (at < expected.size() && what == expected[at]) ++at;
    EXPECT_EQ(at, expected.size()) << "missing or out of order: "
                                   << (at < expected.size() ? expected[at] : "") << "\n"
                                   << r.err;
    for (std::size_t i = 1; i < marks.size(); ++i)
        EXPECT_GE(marks[i].first, marks[i - 1].first) << marks[i].second;
    const CliResult quiet = runCli("reduce " + simulatedFrame() + " -o " + out.str());
    ASSERT_EQ(quiet.exitCode, 0) << quiet.err;
    EXPECT_EQ(quiet.err.find("timeline:"), std::string::npos);
}
