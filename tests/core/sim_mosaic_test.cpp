// The mosaic simulator (core/sim/sim_mosaic.hpp): file layout, per-CCD geometry and truth, equality with
// the single-frame simulator, the reference union, thread-count invariance and parameter checks.
#include "core/sim/sim_mosaic.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "tests/mosaic_support.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;

namespace {

// 4 CCDs of 256 x 512 in 2 x 2, CCD 3 bad, CCD 2 compressed, a guide-star table.
MosaicSimParams smallMosaic() {
    return test::smallMosaic(256, 512, 60, 7, 40.0);
}

std::string slurp(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

nlohmann::json readJson(const std::filesystem::path& p) {
    return nlohmann::json::parse(slurp(p));
}

MosaicTruth writeWithThreads(const MosaicSimParams& m, const std::filesystem::path& dir, int bitpix,
                             int threads) {
    RunContext ctx;
    ctx.threads = threads;
    return writeSimulatedMosaic(m, dir.string(), "mos", bitpix, &ctx);
}

// Focal-plane pixels (from the pointing) of a sky position, for rotation 0 and the default parity
// (east to the left): x = -xi / scale, y = eta / scale.
void focal(const SimParams& p, double ra, double dec, double& fx, double& fy) {
    double xi = 0.0, eta = 0.0;
    ASSERT_TRUE(tanProject(p.ra, p.dec, ra, dec, xi, eta));
    fx = -xi * 3600.0 / p.pixelScale;
    fy = eta * 3600.0 / p.pixelScale;
}

} // namespace

TEST(SimMosaic, FileHasEmptyPrimaryNamedCcdExtensionsCompressionAndTable) {
    test::TempDir dir("gpuphot_mosaic");
    const MosaicSimParams m = smallMosaic();
    const MosaicTruth t = writeWithThreads(m, dir.path, 16, 2);
    const std::string path = (dir.path / "mos.fits").string();
    const auto hdus = listHdus(path);
    ASSERT_EQ(hdus.size(), 6u);
    EXPECT_TRUE(hdus[0].axes.empty()) << "primary must have NAXIS = 0";
    for (int k = 1; k <= 4; ++k) {
        EXPECT_EQ(hdus[k].type, "IMAGE");
        EXPECT_EQ(hdus[k].extname, "CCD0" + std::to_string(k));
        EXPECT_EQ(hdus[k].axes, (std::vector<long long>{256, 512}));
        EXPECT_EQ(hdus[k].bitpix, 20) << "unsigned 16-bit (USHORT_IMG)";
        EXPECT_EQ(hdus[k].compressed, k == 2) << k;
    }
    EXPECT_EQ(hdus[5].type, "BINTABLE");
    EXPECT_EQ(hdus[5].extname, "GUIDESTARS");

    const Header primary = readHeader(path, "0");
    EXPECT_EQ(primary.getInt("NEXTEND"), 5);
    EXPECT_EQ(primary.getString("FILTER"), m.ccd.filter);
    EXPECT_NEAR(*primary.getDouble("RA"), m.ccd.ra, 1e-9);
    EXPECT_TRUE(primary.has("DATE-OBS") && primary.has("MJD-OBS") && primary.has("EXPTIME") &&
                primary.has("AIRMASS"));
    for (const MosaicCcd& c : t.ccds) {
        const Header h = readHeader(path, c.extname);
        EXPECT_EQ(h.getInt("CCDNUM"), c.number);
        EXPECT_NEAR(*h.getDouble("GAIN"), c.gain, 1e-9);
        EXPECT_NEAR(*h.getDouble("SIMZP"), m.ccd.zeroPoint + c.zpOffset, 1e-9);
        EXPECT_TRUE(h.has("SATURATE") && h.has("RDNOISE") && h.has("DETPOS") && h.has("DETSEC"));
    }
    // Gains differ between CCDs (gainSpread 0.1).
    EXPECT_NE(t.ccds[0].gain, t.ccds[1].gain);
    // The compressed CCD reads back as the plain ones do (lossless Rice on 16-bit integers).
    FrameReadOptions o;
    o.hdu = "CCD02";
    const Frame f = readFrame(path, o);
    EXPECT_EQ(f.pixels.width(), 256);
    EXPECT_EQ(f.extname, "CCD02");
}

TEST(SimMosaic, CcdWcsPlacesCentresAndCornersWhereTheLayoutSays) {
    test::TempDir dir("gpuphot_mosaic");
    MosaicSimParams m = smallMosaic();
    m.ccd.dec = 60.0; // meridian convergence matters here: CCDs must follow the focal plane, not north
    m.ccd.pixelScale = 5.0;
    m.compressed.clear();
    const std::string path = (dir.path / "mos.fits").string();
    // Centres with the default per-CCD rotations and SIP; then corners without them.
    for (const bool exact : {false, true}) {
        if (exact) {
            m.rotationSpreadDeg = 0.0;
            m.ccd.sipOrder = 0;
        }
        const MosaicTruth t = writeWithThreads(m, dir.path, 16, 2);
        std::set<double> crval1;
        for (const MosaicCcd& c : t.ccds) {
            const auto w = tanSipFromHeaderExact(readHeader(path, c.extname));
            ASSERT_TRUE(w.has_value());
            crval1.insert(w->crval[0]);
            const double ex = (c.column == 0 ? -0.5 : 0.5) * (256 + 40),
                         ey = (c.row == 0 ? 0.5 : -0.5) * (512 + 40);
            EXPECT_EQ(c.row, (c.number - 1) / 2);
            double ra, dec, fx, fy;
            w->pixelToWorld(127.5, 255.5, ra, dec);
            focal(m.ccd, ra, dec, fx, fy);
            EXPECT_NEAR(fx, ex, 1.0) << c.extname;
            EXPECT_NEAR(fy, ey, 1.0) << c.extname;
            if (!exact) continue;
            w->pixelToWorld(0.0, 0.0, ra, dec); // lower left corner
            focal(m.ccd, ra, dec, fx, fy);
            EXPECT_NEAR(fx, ex - 127.5, 0.5) << c.extname;
            EXPECT_NEAR(fy, ey - 255.5, 0.5) << c.extname;
            w->pixelToWorld(255.0, 511.0, ra, dec); // upper right corner
            focal(m.ccd, ra, dec, fx, fy);
            EXPECT_NEAR(fx, ex + 127.5, 0.5) << c.extname;
            EXPECT_NEAR(fy, ey + 255.5, 0.5) << c.extname;
        }
        EXPECT_EQ(crval1.size(), 4u) << "every CCD has its own WCS";
    }
}

TEST(SimMosaic, ZeroPointOffsetsHaveMedianZeroAndTheBadCcdStandsOut) {
    test::TempDir dir("gpuphot_mosaic");
    MosaicSimParams m = smallMosaic();
    m.ccds = 7;
    m.columns = 0;
    m.badCcd = 5;
    const MosaicTruth t = writeWithThreads(m, dir.path, 16, 2);
    const nlohmann::json j = readJson(dir.path / "mos.mosaic.json");
    ASSERT_EQ(j["ccds"].size(), 7u);
    EXPECT_DOUBLE_EQ(j["exposure"]["zero_point"].get<double>(), m.ccd.zeroPoint);
    std::vector<double> off;
    for (const auto& c : j["ccds"]) {
        off.push_back(c["zp_offset"].get<double>());
        EXPECT_EQ(c["bad"].get<bool>(), c["number"].get<int>() == 5);
        EXPECT_EQ(c["extname"].get<std::string>(), "CCD0" + std::to_string(c["number"].get<int>()));
    }
    std::vector<double> sorted = off;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_NEAR(sorted[3], 0.0, 1e-12);
    for (int i = 0; i < 7; ++i) {
        if (i == 4)
            EXPECT_NEAR(off[i], m.badCcdOffset, 5.0 * m.zpSpread);
        else
            EXPECT_LT(std::fabs(off[i]), 5.0 * m.zpSpread) << i;
    }
    EXPECT_EQ(t.columns * t.rows >= 7, true);
    // The truth's fluxes follow each CCD's own zero point: flux_ADU = 10^(-0.4 (mag - zp_i)) (no colour
    // term).
    const Table truth = readFitsTable((dir.path / "mos.truth.fits").string());
    const auto ccd = truth.doubles("ccd"), mag = truth.doubles("mag"), flux = truth.doubles("flux");
    std::set<int> seen;
    for (std::size_t i = 0; i < ccd.size(); ++i) {
        const int k = static_cast<int>(ccd[i]);
        seen.insert(k);
        EXPECT_NEAR(flux[i] / std::pow(10.0, -0.4 * (mag[i] - (m.ccd.zeroPoint + off[k - 1]))), 1.0, 1e-9);
    }
    EXPECT_EQ(seen.size(), 7u);
    EXPECT_EQ(truth.at("extname").as<std::string>().front(), "CCD01");
}

TEST(SimMosaic, CcdPixelsAreSimulateFieldsWithThatCcdsParameters) {
    test::TempDir dir("gpuphot_mosaic");
    const MosaicSimParams m = smallMosaic();
    const MosaicTruth t = writeWithThreads(m, dir.path, -32, 2);
    for (int k : {1, 2}) { // CCD 2 is stored compressed (lossless for floats too)
        const SimResult r = simulateField(t.ccds[k].params);
        FrameReadOptions o;
        o.hdu = t.ccds[k].extname;
        const Frame f = readFrame((dir.path / "mos.fits").string(), o);
        ASSERT_EQ(f.pixels.width(), r.image.width());
        ASSERT_EQ(f.pixels.height(), r.image.height());
        long differ = 0;
        for (int y = 0; y < r.image.height(); ++y)
            for (int x = 0; x < r.image.width(); ++x)
                differ += f.pixels(x, y) != r.image(x, y);
        EXPECT_EQ(differ, 0) << t.ccds[k].extname;
    }
    // Different CCDs are different fields.
    EXPECT_NE(t.ccds[0].params.fieldSeed, t.ccds[1].params.fieldSeed);
    EXPECT_NE(t.ccds[0].params.seed, t.ccds[1].params.seed);
}

TEST(SimMosaic, ReferenceIsOneCatalogWithUniqueIdsAndNoDuplicates) {
    test::TempDir dir("gpuphot_mosaic");
    MosaicSimParams m = smallMosaic();
    m.gapPx = 0.0; // touching CCDs
    const MosaicTruth t = writeWithThreads(m, dir.path, 16, 2);
    const Table ref = readFitsTable((dir.path / "mos.ref.fits").string());
    ASSERT_EQ(ref.rows(), t.referenceRows);
    ASSERT_GT(ref.rows(), 50u);
    const auto id = ref.doubles("id"), ra = ref.doubles("ra"), dec = ref.doubles("dec"),
               ccd = ref.doubles("ccd");
    const auto tid = ref.doubles("truth_id");
    EXPECT_EQ(std::set<double>(id.begin(), id.end()).size(), id.size());
    std::size_t close = 0;
    for (std::size_t i = 0; i < ra.size(); ++i)
        for (std::size_t j = i + 1; j < ra.size(); ++j)
            close += angularSeparationDeg(ra[i], dec[i], ra[j], dec[j]) * 3600.0 < 0.5;
    EXPECT_EQ(close, 0u);
    // No star of the reference lies on a CCD that does not have it in its truth.
    std::vector<TanSip> wcs;
    for (const MosaicCcd& c : t.ccds)
        wcs.push_back(makeTrueWcs(c.params));
    std::size_t stray = 0, onCcd = 0;
    for (std::size_t i = 0; i < ra.size(); ++i)
        for (std::size_t k = 0; k < wcs.size(); ++k) {
            double x, y;
            if (!wcs[k].worldToPixel(ra[i], dec[i], x, y) || x < 2 || y < 2 || x > 253 || y > 509) continue;
            ++onCcd;
            stray += !(static_cast<std::size_t>(ccd[i]) == k + 1 && tid[i] > 0);
        }
    EXPECT_EQ(stray, 0u);
    EXPECT_GT(onCcd, 20u);
    // The truth's ref_id points at the reference row of the same star.
    const Table truth = readFitsTable((dir.path / "mos.truth.fits").string());
    const auto refId = truth.doubles("ref_id"), tccd = truth.doubles("ccd"), tIdCol = truth.doubles("id");
    std::size_t linked = 0;
    for (std::size_t i = 0; i < refId.size(); ++i) {
        if (refId[i] <= 0) continue;
        const std::size_t row = static_cast<std::size_t>(refId[i]) - 1;
        ASSERT_LT(row, id.size());
        EXPECT_EQ(ccd[row], tccd[i]);
        EXPECT_EQ(tid[row], tIdCol[i]);
        ++linked;
    }
    EXPECT_GT(linked, 20u);
}

TEST(SimMosaic, FilesAreIdenticalForAnyThreadCount) {
    test::TempDir a("gpuphot_mosaic"), b("gpuphot_mosaic");
    MosaicSimParams m = smallMosaic();
    m.ccds = 5;
    m.columns = 0;
    writeWithThreads(m, a.path, 16, 1);
    writeWithThreads(m, b.path, 16, 3);
    for (const char* f : {"mos.fits", "mos.ref.fits", "mos.truth.fits", "mos.mosaic.json"}) {
        const std::string x = slurp(a.path / f), y = slurp(b.path / f);
        EXPECT_GT(x.size(), 0u) << f;
        EXPECT_TRUE(x == y) << f << " differs between 1 and 3 threads";
    }
}

TEST(SimMosaic, BadParametersThrowInvalidInput) {
    test::TempDir dir("gpuphot_mosaic");
    auto throwsFor = [&](auto change) {
        MosaicSimParams m = smallMosaic();
        change(m);
        EXPECT_THROW(validate(m), InvalidInput);
        EXPECT_THROW(writeSimulatedMosaic(m, dir.path.string(), "bad", 16), InvalidInput);
    };
    throwsFor([](MosaicSimParams& m) { m.ccds = 0; });
    throwsFor([](MosaicSimParams& m) { m.gapPx = -1.0; });
    throwsFor([](MosaicSimParams& m) { m.badCcd = 5; });
    throwsFor([](MosaicSimParams& m) { m.compressed = {9}; });
    throwsFor([](MosaicSimParams& m) { m.gainSpread = -0.1; });
    throwsFor([](MosaicSimParams& m) { m.ccd.width = 0; });
    EXPECT_FALSE(std::filesystem::exists(dir.path / "bad.fits"));
    EXPECT_THROW(writeSimulatedMosaic(smallMosaic(), dir.path.string(), "mos", 8), InvalidInput);
    MosaicSimParams m;
    EXPECT_THROW(nlohmann::json({{"gapPX", 3}}).get_to(m), InvalidInput);
    EXPECT_THROW(nlohmann::json({{"ccds", "four"}}).get_to(m), InvalidInput);
    nlohmann::json({{"ccds", 12}, {"compressed", {1, 3}}}).get_to(m);
    EXPECT_EQ(m.ccds, 12);
    EXPECT_EQ(m.compressed, (std::vector<int>{1, 3}));
}
