#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/catalog/reference_catalog.hpp"
#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class ReferenceCatalogTest : public ::testing::Test {
protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        m_dir =
            fs::temp_directory_path() / ("gpuphot_refcat_" + std::to_string(::getpid()) + "_" + info->name());
        fs::remove_all(m_dir);
        fs::create_directories(m_dir);
    }
    void TearDown() override { fs::remove_all(m_dir); }
    std::string path(const std::string& name) const { return (m_dir / name).string(); }
    fs::path m_dir;
};

// A Gaia-like table: two rows without a usable position/magnitude.
Table gaiaLike() {
    Table t;
    t.name = "GAIA";
    t.add("source_id", std::vector<std::int64_t>{101, 102, 103, 104, 105});
    t.add("ra", std::vector<double>{10.0, 10.1, kNaN, 10.3, 359.99}, "deg");
    t.add("dec", std::vector<double>{-5.0, -5.1, -5.2, -5.3, 89.5}, "deg");
    t.add("phot_g_mean_mag",
          std::vector<float>{12.5f, 13.25f, 14.0f, std::numeric_limits<float>::quiet_NaN(), 20.0f}, "mag");
    t.add("phot_g_mean_flux_over_error", std::vector<float>{100.f, 50.f, 10.f, 10.f, -1.f});
    t.add("phot_bp_mean_mag", std::vector<double>{13.0, 13.5, 14.5, 15.0, kNaN});
    t.add("phot_rp_mean_mag", std::vector<double>{12.0, 13.0, 13.5, 14.0, 19.0});
    t.add("pmra", std::vector<double>{1.0, 2.0, 3.0, 4.0, kNaN});
    t.add("pmdec", std::vector<double>{-1.0, -2.0, -3.0, -4.0, kNaN});
    t.add("ref_epoch", std::vector<double>{2015.5, 2015.5, 2015.5, 2015.5, 2015.5});
    return t;
}

void expectGaiaLike(const ReferenceCatalog& c) {
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c.rowsRead, 5u);
    EXPECT_EQ(c.skippedNonFinite, 2u);
    EXPECT_EQ(c.id, (std::vector<std::int64_t>{101, 102, 105}));
    EXPECT_EQ(c.ra, (std::vector<double>{10.0, 10.1, 359.99}));
    EXPECT_EQ(c.dec, (std::vector<double>{-5.0, -5.1, 89.5}));
    EXPECT_EQ(c.mag, (std::vector<double>{12.5, 13.25, 20.0}));
    EXPECT_DOUBLE_EQ(c.color[0], 1.0);
    EXPECT_DOUBLE_EQ(c.color[1], 0.5);
    EXPECT_TRUE(std::isnan(c.color[2]));
    EXPECT_EQ(c.pmRa[1], 2.0);
    EXPECT_EQ(c.pmDec[1], -2.0);
    EXPECT_TRUE(std::isnan(c.pmRa[2]));
    EXPECT_DOUBLE_EQ(c.epoch, 2015.5);
}

} // namespace

TEST(RefColumnMapParse, ParsesKeysAndRejectsUnknownOnes) {
    const RefColumnMap m = parseRefColumnMap(
        " ra=RA_ICRS, dec=DE_ICRS ,mag=phot_g_mean_mag,color=phot_bp_mean_mag-phot_rp_mean_mag,"
        "MagErr=e_G,pmra=pmRA,pmdec=pmDE,id=Source,hdu=2,epoch=J2016.0");
    EXPECT_EQ(m.ra, "RA_ICRS");
    EXPECT_EQ(m.dec, "DE_ICRS");
    EXPECT_EQ(m.mag, "phot_g_mean_mag");
    EXPECT_EQ(m.color, "phot_bp_mean_mag-phot_rp_mean_mag");
    EXPECT_EQ(m.magErr, "e_G");
    EXPECT_EQ(m.pmRa, "pmRA");
    EXPECT_EQ(m.pmDec, "pmDE");
    EXPECT_EQ(m.id, "Source");
    EXPECT_EQ(m.hdu, "2");
    EXPECT_DOUBLE_EQ(m.epoch, 2016.0);
    EXPECT_TRUE(m.epochExplicit);
    const RefColumnMap empty = parseRefColumnMap("");
    EXPECT_TRUE(empty.ra.empty());
    EXPECT_DOUBLE_EQ(empty.epoch, 2000.0);
    EXPECT_FALSE(empty.epochExplicit);
    try {
        parseRefColumnMap("ra=RA,magnitude=G");
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("magnitude"), std::string::npos) << e.what();
    }
    EXPECT_THROW(parseRefColumnMap("ra"), InvalidInput);
    EXPECT_THROW(parseRefColumnMap("epoch=soon"), InvalidInput);
}

TEST_F(ReferenceCatalogTest, FitsWithAutoDetectedGaiaColumns) {
    const std::string p = path("gaia.fits");
    writeFitsTable(p, gaiaLike());
    const ReferenceCatalog c =
        readReferenceCatalog(p, parseRefColumnMap("color=phot_bp_mean_mag-phot_rp_mean_mag"));
    expectGaiaLike(c);
    EXPECT_EQ(c.columns.ra, "ra");
    EXPECT_EQ(c.columns.mag, "phot_g_mean_mag");
    EXPECT_EQ(c.columns.color, "phot_bp_mean_mag-phot_rp_mean_mag");
    // Gaia has no magnitude error column: 2.5/ln(10) / (flux over error); negative -> NaN.
    EXPECT_DOUBLE_EQ(c.magErr[0], 2.5 / std::log(10.0) / 100.0);
    EXPECT_DOUBLE_EQ(c.magErr[1], 2.5 / std::log(10.0) / 50.0);
    EXPECT_TRUE(std::isnan(c.magErr[2]));
    EXPECT_EQ(c.path, p);

    // Without a colour map there is no bp_rp column: colour is NaN, and "none" switches things off.
    const ReferenceCatalog d =
        readReferenceCatalog(p, parseRefColumnMap("pmra=none,pmdec=none,id=none,epoch=2000"));
    EXPECT_TRUE(std::isnan(d.color[0]));
    EXPECT_TRUE(std::isnan(d.pmRa[0]));
    EXPECT_EQ(d.id, (std::vector<std::int64_t>{1, 2, 5})) << "1-based row numbers without an id column";
    EXPECT_DOUBLE_EQ(d.epoch, 2000.0) << "an explicit epoch wins over ref_epoch";
}

TEST_F(ReferenceCatalogTest, CsvRoundTripWithColourDifferenceAndNaNRowsSkipped) {
    const std::string p = path("gaia.csv");
    writeCsv(p, gaiaLike());
    const ReferenceCatalog c = readReferenceCatalog(
        p, parseRefColumnMap("ra=RA,dec=DEC,mag=phot_g_mean_mag,color=phot_bp_mean_mag-phot_rp_mean_mag"));
    expectGaiaLike(c);
    // And the same file in ECSV (blank-separated, '#' header) reads the same.
    writeEcsv(path("gaia.ecsv"), gaiaLike());
    expectGaiaLike(readReferenceCatalog(path("gaia.ecsv"),
                                        parseRefColumnMap("color=phot_bp_mean_mag-phot_rp_mean_mag")));
}

TEST_F(ReferenceCatalogTest, CsvWithCommentsEmptyFieldsAndSexagesimalPositions) {
    const std::string p = path("stars.csv");
    std::ofstream(p) << "# exported by hand\n"
                        "RAJ2000,DEJ2000,Vmag,e_Vmag,B-V\n"
                        "12:30:00.0,-05:30:00,10.5,0.01,0.65\n"
                        "187.5,+45 15 36,11.0,,\n"
                        ",10,12.0,0.02,0.1\n"
                        "# a comment in between\n"
                        "1h00m00s,-00d30m00s,null,0.03,0.2\n"
                        "\"15:00:00\",0.5,9.0,0.04,0.3\n";
    const ReferenceCatalog c = readReferenceCatalog(p, parseRefColumnMap("color=B-V"));
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c.skippedNonFinite, 2u);
    EXPECT_DOUBLE_EQ(c.ra[0], 12.5 * 15.0);
    EXPECT_DOUBLE_EQ(c.dec[0], -5.5);
    EXPECT_DOUBLE_EQ(c.ra[1], 187.5);
    EXPECT_DOUBLE_EQ(c.dec[1], 45.26);
    EXPECT_DOUBLE_EQ(c.ra[2], 225.0);
    EXPECT_EQ(c.mag, (std::vector<double>{10.5, 11.0, 9.0}));
    EXPECT_DOUBLE_EQ(c.magErr[0], 0.01) << "e_<mag> is the magnitude error";
    EXPECT_TRUE(std::isnan(c.magErr[1]));
    EXPECT_DOUBLE_EQ(c.color[0], 0.65) << "a column named B-V wins over a difference";
    EXPECT_TRUE(std::isnan(c.color[1]));
    EXPECT_EQ(c.id, (std::vector<std::int64_t>{1, 2, 5})) << "1-based data-row numbers";
    EXPECT_EQ(c.columns.ra, "RAJ2000");
    EXPECT_EQ(c.columns.magErr, "e_Vmag");
}

TEST_F(ReferenceCatalogTest, MissingColumnErrorsNameTheFileAndListColumns) {
    const std::string p = path("cat.fits");
    writeFitsTable(p, gaiaLike());
    try {
        readReferenceCatalog(p, parseRefColumnMap("mag=Gmag"));
        FAIL();
    } catch (const InvalidInput& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(p), std::string::npos) << m;
        EXPECT_NE(m.find("'Gmag'"), std::string::npos) << m;
        EXPECT_NE(m.find("phot_bp_mean_mag"), std::string::npos) << "lists the available columns: " << m;
    }
    try {
        readReferenceCatalog(p, parseRefColumnMap("color=u-g"));
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("u-g"), std::string::npos) << e.what();
    }
    const std::string csv = path("nomag.csv");
    std::ofstream(csv) << "ra,dec,flux\n1,2,3\n";
    try {
        readReferenceCatalog(csv);
        FAIL();
    } catch (const InvalidInput& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(csv), std::string::npos) << m;
        EXPECT_NE(m.find("magnitude"), std::string::npos) << m;
        EXPECT_NE(m.find("flux"), std::string::npos) << m;
    }
}

TEST_F(ReferenceCatalogTest, BadFilesGiveClearErrors) {
    const std::string missing = path("missing.fits");
    try {
        readReferenceCatalog(missing);
        FAIL();
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find(missing), std::string::npos);
    }
    const std::string empty = path("empty.csv");
    std::ofstream(empty).close();
    EXPECT_THROW(readReferenceCatalog(empty), InvalidInput);

    const std::string binary = path("junk.bin");
    std::ofstream(binary, std::ios::binary) << std::string("\x01\x02\x00\x03garbage", 11);
    try {
        readReferenceCatalog(binary);
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find(binary), std::string::npos);
    }

    const std::string allNaN = path("nan.csv");
    std::ofstream(allNaN) << "ra,dec,mag\n1,2,nan\n,3,4\n";
    try {
        readReferenceCatalog(allNaN);
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("no usable rows"), std::string::npos) << e.what();
    }

    const std::string junk = path("junk.csv");
    std::ofstream(junk) << "ra,dec,mag\n1,2,bright\n";
    try {
        readReferenceCatalog(junk);
        FAIL();
    } catch (const InvalidInput& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("line 2"), std::string::npos) << m;
        EXPECT_NE(m.find("bright"), std::string::npos) << m;
    }

    const std::string range = path("radians.csv");
    std::ofstream(range) << "ra,dec,mag\n1,200,3\n";
    EXPECT_THROW(readReferenceCatalog(range), InvalidInput);

    // A FITS file with only an image: not a table.
    Table t; // write a table, then point at the image HDU 0
    t.add("ra", std::vector<double>{1});
    writeFitsTable(path("t.fits"), t);
    RefColumnMap map;
    map.hdu = "0";
    try {
        readReferenceCatalog(path("t.fits"), map);
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("not a table"), std::string::npos) << e.what();
    }
}

TEST_F(ReferenceCatalogTest, ApplyProperMotionMovesPositions) {
    ReferenceCatalog c;
    c.ra = {10.0, 20.0};
    c.dec = {60.0, 0.0};
    c.mag = {1, 2};
    c.magErr = c.color = {kNaN, kNaN};
    c.pmRa = {3.6e6, kNaN}; // 1 deg/yr on the sky
    c.pmDec = {-3.6e6, 1.0};
    c.id = {1, 2};
    c.epoch = 2015.5;
    applyProperMotion(c, 2016.0);
    EXPECT_NEAR(c.ra[0], 10.0 + 0.5 / 0.5, 1e-12) << "divided by cos(60 deg)";
    EXPECT_NEAR(c.dec[0], 59.5, 1e-12);
    EXPECT_EQ(c.ra[1], 20.0) << "no proper motion: unchanged";
    EXPECT_DOUBLE_EQ(c.epoch, 2016.0);
}

// Fixture numbers from astropy (Debian's /usr/bin/python3):
//   python3 -c "from astropy.table import Table; import numpy as np;
//     t = Table.read('tycho2_panoptes_field.fits'); print(len(t), t['ra'][0], t['dec'][0], t['mag'][0])
//     g = Table.read('gaia_dr2_chunk_for_decam_cutout.fits'); c = g['phot_bp_mean_mag'] -
//     g['phot_rp_mean_mag'] print(len(g), np.isfinite(c).sum(), np.isfinite(g['pmra']).sum(),
//     set(g['ref_epoch']), g['source_id'][0],
//           g['phot_g_mean_flux_over_error'][0])"
//   -> 1961 299.50106810332426 47.58016966691604 10.562
//   -> 884 832 775 {2015.5} 3095663447428055168 114.7303   (every row has finite ra, dec, mag)
TEST(ReferenceCatalogReal, Tycho2PanoptesFieldLoadsWithAutoDetection) {
    const std::string p = std::string(GPUPHOT_TEST_DATA) + "/real/tycho2_panoptes_field.fits";
    if (!fs::exists(p)) FAIL() << "test data missing: " << p;
    const ReferenceCatalog c = readReferenceCatalog(p);
    EXPECT_EQ(c.size(), 1961u);
    EXPECT_EQ(c.skippedNonFinite, 0u);
    EXPECT_EQ(c.columns.mag, "mag");
    EXPECT_DOUBLE_EQ(c.ra[0], 299.50106810332426);
    EXPECT_DOUBLE_EQ(c.dec[0], 47.58016966691604);
    EXPECT_FLOAT_EQ(static_cast<float>(c.mag[0]), 10.562f);
    EXPECT_EQ(c.id.front(), 1);
    EXPECT_EQ(c.id.back(), 1961);
    EXPECT_DOUBLE_EQ(c.epoch, 2000.0);
}

TEST(ReferenceCatalogReal, GaiaDr2ChunkLoadsWithExplicitMap) {
    const std::string p = std::string(GPUPHOT_TEST_DATA) + "/real/gaia_dr2_chunk_for_decam_cutout.fits";
    if (!fs::exists(p)) FAIL() << "test data missing: " << p;
    const ReferenceCatalog c = readReferenceCatalog(
        p, parseRefColumnMap("ra=ra,dec=dec,mag=phot_g_mean_mag,color=phot_bp_mean_mag-phot_rp_mean_mag"));
    EXPECT_EQ(c.size(), 884u);
    EXPECT_EQ(c.skippedNonFinite, 0u);
    std::size_t finiteColour = 0, finitePm = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
        finiteColour += std::isfinite(c.color[i]);
        finitePm += std::isfinite(c.pmRa[i]);
    }
    EXPECT_EQ(finiteColour, 832u);
    EXPECT_EQ(finitePm, 775u);
    EXPECT_EQ(c.id[0], 3095663447428055168LL);
    EXPECT_DOUBLE_EQ(c.epoch, 2015.5);
    EXPECT_NEAR(c.magErr[0], 2.5 / std::log(10.0) / 114.7303, 1e-7);
    // Auto-detection finds the same columns.
    const ReferenceCatalog a = readReferenceCatalog(p);
    EXPECT_EQ(a.size(), 884u);
    EXPECT_EQ(a.mag, c.mag);
    EXPECT_EQ(a.columns.mag, "phot_g_mean_mag");
}

TEST_F(ReferenceCatalogTest, ManyRowCsvAndFits) {
    const std::size_t n = 200000;
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<double> ra(n), dec(n), g(n);
    for (std::size_t i = 0; i < n; ++i) {
        ra[i] = 360 * u(rng);
        dec[i] = 180 * u(rng) - 90;
        g[i] = (i % 1000 == 0) ? kNaN : 10 + 10 * u(rng);
    }
    Table t;
    t.add("RA_ICRS", ra);
    t.add("DE_ICRS", dec);
    t.add("Gmag", g);
    writeCsv(path("big.csv"), t);
    writeFitsTable(path("big.fits"), t);
    const auto t0 = std::chrono::steady_clock::now();
    const ReferenceCatalog c = readReferenceCatalog(path("big.csv"));
    const auto t1 = std::chrono::steady_clock::now();
    const ReferenceCatalog f = readReferenceCatalog(path("big.fits"));
    const auto t2 = std::chrono::steady_clock::now();
    EXPECT_EQ(c.size(), n - n / 1000);
    EXPECT_EQ(c.skippedNonFinite, n / 1000);
    EXPECT_EQ(c.ra, f.ra) << "CSV and FITS give the same numbers";
    EXPECT_EQ(c.mag, f.mag);
    EXPECT_EQ(c.id, f.id);
    std::printf("[ info ] %zu rows: CSV %.3f s, FITS %.3f s\n", n,
                std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
}
