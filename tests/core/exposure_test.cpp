// Mosaic exposures (core/pipeline/exposure.hpp): which extensions an exposure takes, the output names of
// a chosen extension, the exposure's zero point, and a whole exposure against its CCDs reduced alone.
#include "core/pipeline/exposure.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <fitsio.h>
#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_mosaic.hpp"
#include "core/util/errors.hpp"
#include "tests/mosaic_support.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;

namespace {

// A multi-extension file: an empty primary, then one small float image per name ("" : no EXTNAME);
// a name starting with '#' is a binary table instead.
void writeMef(const std::string& path, const std::vector<std::string>& names) {
    fitsfile* f = nullptr;
    int status = 0;
    std::filesystem::remove(path);
    fits_create_file(&f, path.c_str(), &status);
    fits_create_img(f, BYTE_IMG, 0, nullptr, &status);
    for (const std::string& n : names) {
        if (!n.empty() && n[0] == '#') {
            char* ttype[] = {const_cast<char*>("A")};
            char* tform[] = {const_cast<char*>("1J")};
            fits_create_tbl(f, BINARY_TBL, 0, 1, ttype, tform, nullptr, n.substr(1).c_str(), &status);
            continue;
        }
        long axes[2] = {16, 8};
        fits_create_img(f, FLOAT_IMG, 2, axes, &status);
        std::vector<float> px(16 * 8, 1.0f);
        fits_write_img(f, TFLOAT, 1, px.size(), px.data(), &status);
        if (!n.empty())
            fits_update_key(f, TSTRING, "EXTNAME", const_cast<char*>(n.c_str()), nullptr, &status);
    }
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0);
}

std::vector<int> hdus(const std::vector<ExposureExtension>& e) {
    std::vector<int> out;
    for (const auto& x : e)
        out.push_back(x.hdu);
    return out;
}

} // namespace

TEST(Exposure, SelectionsThatAskForSeveralExtensions) {
    for (const char* s : {"all", "ALL", "1-60", "1,3,5", "1-4,7", "CCD01,CCD02", "2,3"})
        EXPECT_TRUE(isExposureSelection(s)) << s;
    for (const char* s : {"", "3", "CCD01", "SCI,2", "sci, 1"})
        EXPECT_FALSE(isExposureSelection(s)) << s;
}

TEST(Exposure, ExtensionsOfAMosaicAndOfSingleFrames) {
    test::TempDir dir("gpuphot_exposure");
    const std::string mef = dir / "mef.fits";
    writeMef(mef, {"CCD01", "CCD02", "#GUIDE", "CCD03"});
    EXPECT_EQ(hdus(exposureExtensions(mef, "")), (std::vector<int>{1, 2, 4})); // the table left out
    EXPECT_EQ(hdus(exposureExtensions(mef, "all")), (std::vector<int>{1, 2, 4}));
    EXPECT_EQ(hdus(exposureExtensions(mef, "2-4")), (std::vector<int>{2, 4}));
    EXPECT_EQ(hdus(exposureExtensions(mef, "2,ccd03,1")), (std::vector<int>{2, 4, 1}));
    EXPECT_TRUE(exposureExtensions(mef, "2").empty());            // one extension: a single frame
    EXPECT_TRUE(exposureExtensions(mef + "[CCD02]", "").empty()); // CFITSIO suffix: one HDU
    EXPECT_THROW(exposureExtensions(mef, "1,3"), InvalidInput);   // HDU 3 is the table
    EXPECT_THROW(exposureExtensions(mef, "1,CCD09"), InvalidInput);
    EXPECT_THROW(exposureExtensions(mef, "4-1"), InvalidInput);
    EXPECT_THROW(exposureExtensions(mef, "7-9"), InvalidInput);

    const std::string hst = dir / "hst.fits"; // one science image with its auxiliary planes
    writeMef(hst, {"SCI", "ERR", "DQ"});
    EXPECT_TRUE(exposureExtensions(hst, "").empty());
    EXPECT_EQ(hdus(exposureExtensions(hst, "all")), (std::vector<int>{1, 2, 3}));
}

TEST(Exposure, ChosenExtensionsWriteOutputsThatNeverCollide) {
    test::TempDir dir("gpuphot_exposure");
    const std::string mef = dir / "mef.fits";
    writeMef(mef, {"CCD01", "N 4/a", "", "SCI", "SCI"});
    EXPECT_EQ(outputStem(mef), "mef");
    EXPECT_EQ(outputStem(mef, "all"), "mef");
    EXPECT_EQ(outputStem(mef, "1"), "mef.CCD01");
    EXPECT_EQ(outputStem(mef, "ccd01"), "mef.CCD01");
    EXPECT_EQ(outputStem(mef + "[1]"), "mef.CCD01");
    EXPECT_EQ(outputStem(mef + "[CCD01]"), "mef.CCD01");
    EXPECT_EQ(outputStem(mef, "2"), "mef.N_4_a");
    EXPECT_EQ(outputStem(mef, "3"), "mef.hdu3");
    EXPECT_EQ(outputStem(mef, "4"), "mef.SCI_hdu4");
    EXPECT_EQ(outputStem(mef, "5"), "mef.SCI_hdu5");
    OutputOptions o;
    o.outdir = dir.str();
    EXPECT_EQ(reportPath(mef, o, "1"), dir / "mef.CCD01.report.json");
    EXPECT_EQ(catalogPath(mef + "[3]", o), dir / "mef.hdu3.cat.fits");
}

// The report's per-CCD entry, as reduceExposure writes it and the workbench reads it: NaN as null both
// ways, a failed CCD with its error and no numbers.
TEST(Exposure, CcdSummaryRoundTripsThroughTheReport) {
    ExposureCcdSummary c;
    c.hdu = 3;
    c.extname = "N4";
    c.token = "N4";
    c.width = 2048;
    c.height = 4096;
    c.status = "ok";
    c.sources = 1234;
    c.fwhm = 3.25;
    c.zp = 25.5;
    c.zpErr = 0.01;
    c.calibrators = 40;
    c.gpu = 2;
    c.zpOffset = -0.02;
    c.outlier = true;
    c.zpUsed = "own";
    c.astrometry = "exposure";
    c.warnings = {"a warning"};
    const nlohmann::json j = c;
    EXPECT_TRUE(j["astrometric_rms_arcsec"].is_null()); // NaN
    EXPECT_TRUE(j["zp_offset_err"].is_null());
    EXPECT_EQ(j["zp_outlier"], true);
    const auto back = j.get<ExposureCcdSummary>();
    EXPECT_EQ(back.hdu, 3);
    EXPECT_EQ(back.extname, "N4");
    EXPECT_EQ(back.sources, 1234);
    EXPECT_EQ(back.fwhm, 3.25);
    EXPECT_TRUE(std::isnan(back.rms));
    EXPECT_EQ(back.zpOffset, -0.02);
    EXPECT_TRUE(back.outlier);
    EXPECT_EQ(back.astrometry, "exposure");
    EXPECT_EQ(back.gpu, 2);
    EXPECT_EQ(back.warnings, c.warnings);
    EXPECT_FALSE(back.failed());
    ExposureCcdSummary bad;
    bad.hdu = 5;
    bad.error = "cannot read";
    const nlohmann::json jb = bad;
    EXPECT_EQ(jb["status"], "failed");
    EXPECT_FALSE(jb.contains("zp"));
    const auto badBack = jb.get<ExposureCcdSummary>();
    EXPECT_TRUE(badBack.failed());
    EXPECT_EQ(badBack.error, "cannot read");
    ExposureCcdSummary cpu = c; // the CPU backend: no GPU
    cpu.gpu = -1;
    const nlohmann::json jc = cpu;
    EXPECT_TRUE(jc.at("gpu").is_null());
    EXPECT_EQ(jc.get<ExposureCcdSummary>().gpu, -1);
}

TEST(Exposure, CcdContextsSpreadRoundRobinOverTheGpusAsked) {
    // Every visible GPU (0, or more than are visible): context k on GPU k mod visible.
    for (int gpus : {0, 4, 9})
        for (std::size_t k = 0; k < 12; ++k)
            EXPECT_EQ(ccdContextDevice(k, gpus, 4), static_cast<int>(k % 4)) << gpus << " " << k;
    // Fewer than are visible: only the first `gpus`.
    for (std::size_t k = 0; k < 12; ++k) {
        EXPECT_EQ(ccdContextDevice(k, 1, 8), 0);
        EXPECT_EQ(ccdContextDevice(k, 3, 8), static_cast<int>(k % 3));
    }
    // No GPU: none.
    EXPECT_EQ(ccdContextDevice(0, 0, 0), -1);
    EXPECT_EQ(ccdContextDevice(5, 2, 0), -1);
    // 16 contexts over 8 GPUs: two on each.
    std::map<int, int> perGpu;
    for (std::size_t k = 0; k < 16; ++k)
        ++perGpu[ccdContextDevice(k, 0, 8)];
    ASSERT_EQ(perGpu.size(), 8u);
    for (const auto& [gpu, n] : perGpu)
        EXPECT_EQ(n, 2) << gpu;
}

TEST(Exposure, ZeroPointIsTheMedianAndABadCcdStandsOut) {
    std::vector<CcdZeroPoint> ccds;
    const double truth = 25.0;
    const double offsets[] = {0.01, -0.02, 0.0, 0.015, -0.005, 0.30, 0.02, -0.01};
    for (double o : offsets)
        ccds.push_back({true, truth + o, 0.003, 40});
    ccds.push_back({false, std::nan(""), std::nan(""), 2}); // too few calibrators
    const ExposureCalibration cal = calibrateExposure(ccds, {});
    ASSERT_TRUE(cal.ok);
    EXPECT_NEAR(cal.zp, truth + 0.005, 1e-12); // the median of the eight, the bad one among them
    EXPECT_EQ(cal.ccdsUsed, 8);
    EXPECT_TRUE(cal.outlier[5]);
    EXPECT_EQ(std::count(cal.outlier.begin(), cal.outlier.end(), true), 1);
    EXPECT_NEAR(cal.offset[5], 0.295, 1e-12);
    EXPECT_TRUE(std::isnan(cal.offset[8]));
    EXPECT_GT(cal.zpErr, 0.0);
    EXPECT_LT(cal.zpErr, 0.02);

    std::vector<CcdZeroPoint> none(3);
    EXPECT_FALSE(calibrateExposure(none, {}).ok);
}

namespace {

struct MosaicRun {
    MosaicTruth truth;
    ReferenceCatalog reference;
    ReduceOptions options;
};

// Reduces a small simulated mosaic (4 CCDs; CCD 2 tile-compressed, CCD 3 a bad one, a table extension).
void simulateSmallMosaic(const test::TempDir& dir, MosaicRun& run, double wcsOffsetArcmin = 0.0) {
    MosaicSimParams m = test::smallMosaic(384, 768, 450, 11, 60.0);
    m.ccd.wcsOffset = wcsOffsetArcmin;
    run.truth = writeSimulatedMosaic(m, dir.str(), "mos", 16);
    run.reference = readReferenceCatalog(dir / "mos.ref.fits");
    run.options.reference = &run.reference;
    run.options.output.outdir = dir / "out";
    run.options.output.formats = {"ldac", "csv"};
    run.options.output.maps = {"bkg"};
}

} // namespace

TEST(Exposure, WholeExposureEqualsItsCcdsReducedAlone) {
    test::TempDir dir("gpuphot_exposure");
    MosaicRun run;
    simulateSmallMosaic(dir, run);
    const std::string path = dir / "mos.fits";
    const std::vector<ExposureExtension> exts = exposureExtensions(path, "");
    ASSERT_EQ(exts.size(), 4u);
    EXPECT_TRUE(exts[1].compressed);

    RunContext a, b;
    a.threads = b.threads = 1;
    const ReduceSummary s = reduceExposure(path, exts, run.options, {&a, &b});
    const Table whole = readFitsTable(dir / "out/mos.cat.fits");
    const auto ccd = whole.doubles("ccd");
    ASSERT_EQ(whole.rows(), s.sources);

    std::size_t rows = 0;
    for (const ExposureExtension& e : exts) {
        ReduceOptions one = run.options;
        one.read.hdu = std::to_string(e.hdu);
        one.output.outdir = dir / "alone";
        RunContext ctx;
        reduceFrame(path, one, ctx);
        const Table alone = readFitsTable(dir / ("alone/mos." + e.token + ".cat.fits"));
        ASSERT_GT(alone.rows(), 100u) << e.token;
        rows += alone.rows();
        for (const Column& c : alone.columns()) {
            const Column* w = whole.find(c.name);
            ASSERT_NE(w, nullptr) << c.name;
            std::size_t k = 0;
            for (std::size_t i = 0; i < whole.rows(); ++i) {
                if (static_cast<int>(ccd[i]) != e.hdu) continue;
                const double x = c.asDouble(k++), y = w->asDouble(i);
                ASSERT_TRUE(x == y || (std::isnan(x) && std::isnan(y)))
                    << e.token << " " << c.name << " row " << k;
            }
            EXPECT_EQ(k, alone.rows());
        }
        EXPECT_TRUE(std::filesystem::exists(dir / ("out/mos." + e.token + ".bkg.fits")));
    }
    EXPECT_EQ(rows, whole.rows());

    const auto report = nlohmann::json::parse(std::ifstream(dir / "out/mos.report.json"));
    const auto& exposure = report.at("exposure");
    ASSERT_EQ(exposure.at("extensions").size(), 4u);
    EXPECT_EQ(exposure.at("params").at("gpus"), 0); // the CPU backend
    for (const auto& e : exposure.at("extensions"))
        EXPECT_TRUE(e.at("gpu").is_null());
    // CCD 3 (HDU 3) is the bad one; the others' offsets come back from their true ones.
    EXPECT_EQ(exposure.at("zp_outliers"), nlohmann::json::array({"CCD03"}));
    EXPECT_NEAR(exposure.at("zp").get<double>(), run.truth.zeroPoint, 0.02);
    for (std::size_t k = 0; k < 4; ++k) {
        const auto& e = exposure.at("extensions")[k];
        const double truthOffset = run.truth.ccds[k].zpOffset;
        EXPECT_NEAR(e.at("zp_offset").get<double>(),
                    truthOffset - (exposure.at("zp").get<double>() - run.truth.zeroPoint), 0.02)
            << k;
    }
    int pairs = 0, status = 0;
    fitsfile* f = nullptr;
    fits_open_file(&f, (dir / "out/mos.ldac").c_str(), READONLY, &status);
    int n = 0;
    fits_get_num_hdus(f, &n, &status);
    for (int i = 2; i <= n; ++i) {
        char name[FLEN_VALUE] = {};
        fits_movabs_hdu(f, i, nullptr, &status);
        fits_read_key(f, TSTRING, "EXTNAME", name, nullptr, &status);
        pairs += std::string(name) == "LDAC_OBJECTS";
    }
    fits_close_file(f, &status);
    EXPECT_EQ(pairs, 4);
}

TEST(Exposure, WrongHeadersCostOneBlindSolveForTheWholeExposure) {
    test::TempDir dir("gpuphot_exposure");
    MosaicRun run;
    simulateSmallMosaic(dir, run, 4.0); // every CCD's header 4' off, as a telescope's pointing error
    const std::string path = dir / "mos.fits";
    RunContext ctx;
    reduceExposure(path, exposureExtensions(path, ""), run.options, {&ctx});
    const auto report = nlohmann::json::parse(std::ifstream(dir / "out/mos.report.json"));
    const auto& exposure = report.at("exposure");
    int blind = 0, moved = 0;
    for (const auto& e : exposure.at("extensions")) {
        const auto& a = e.at("report").at("astrometry");
        ASSERT_TRUE(a.at("ok").get<bool>()) << e.at("extname");
        EXPECT_LT(e.at("astrometric_rms_arcsec").get<double>(), 0.5);
        blind += a.at("method") == "blind";
        moved += e.at("astrometry") == "exposure";
    }
    EXPECT_EQ(blind, 1);
    EXPECT_EQ(moved, 3);
    const auto& shift = exposure.at("pointing_shift_arcsec");
    EXPECT_NEAR(std::hypot(shift.at("east").get<double>(), shift.at("north").get<double>()), 240.0, 5.0);
}
