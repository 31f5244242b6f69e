// Tycho-2 from Debian's astrometry.net index files (astrometry-data-tycho2): the stars read for the
// PANOPTES field agree with an independent dump of index-07 (tests/data/real/tycho2_panoptes_field.fits,
// a 3 deg cone around the frame centre, VT magnitudes); stars present in several index files come back
// once; bad regions and files that are not star indexes are clear errors. Skips when no index files
// are installed (or the shared data is absent).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <string>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/catalog/tycho2_index.hpp"
#include "core/io/fits_image.hpp"
#include "core/model/header.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"

using namespace gpuphot;

namespace {

constexpr double kDeg = std::numbers::pi / 180.0;

std::string realData(const std::string& name) {
    return std::string(GPUPHOT_TEST_DATA) + "/real/" + name;
}

// Great-circle distance (arcsec), haversine: independent of the reader's unit-vector arithmetic.
double sepArcsec(double ra1, double dec1, double ra2, double dec2) {
    const double s1 = std::sin(0.5 * (dec2 - dec1) * kDeg), s2 = std::sin(0.5 * (ra2 - ra1) * kDeg);
    const double h = s1 * s1 + std::cos(dec1 * kDeg) * std::cos(dec2 * kDeg) * s2 * s2;
    return 2.0 * std::asin(std::min(1.0, std::sqrt(h))) / kDeg * 3600.0;
}

// Index of the nearest star of `cat` to (ra, dec) and its distance (arcsec); brute force.
std::pair<std::size_t, double> nearest(const ReferenceCatalog& cat, double ra, double dec) {
    std::size_t best = 0;
    double bestSep = 1e30;
    for (std::size_t i = 0; i < cat.size(); ++i) {
        if (std::fabs(cat.dec[i] - dec) * 3600.0 > bestSep) continue;
        const double s = sepArcsec(ra, dec, cat.ra[i], cat.dec[i]);
        if (s < bestSep) {
            bestSep = s;
            best = i;
        }
    }
    return {best, bestSep};
}

struct Fixture {
    std::vector<std::string> all;
    std::string index07;
    ReferenceCatalog dump;
    double ra = 0, dec = 0;
};

// The installed files, the dump and the PANOPTES frame centre (header WCS); false (with a reason) when
// something is missing.
bool setUp(Fixture& f, std::string& why) {
    f.all = findTycho2IndexFiles();
    if (f.all.empty()) {
        why = "no astrometry.net Tycho-2 index files installed (astrometry-data-tycho2)";
        return false;
    }
    for (const auto& p : f.all)
        if (std::filesystem::path(p).filename().string().rfind("index-tycho2-07", 0) == 0) f.index07 = p;
    if (f.index07.empty()) {
        why = "index-tycho2-07 not installed";
        return false;
    }
    const std::string frame = realData("panoptes_solved.fits.fz"), dump = realData("tycho2_panoptes_field.fits");
    if (!std::filesystem::exists(frame) || !std::filesystem::exists(dump)) {
        why = "shared data absent";
        return false;
    }
    f.dump = readReferenceCatalog(dump);
    const Wcs wcs = Wcs::fromHeader(readHeader(frame, "1"));
    std::tie(f.ra, f.dec) = wcs.pixelToWorld(349.5, 349.5); // centre of the 700 x 700 frame (0-based)
    return true;
}

} // namespace

TEST(Tycho2Index, FindsInstalledFiles) {
    const auto files = findTycho2IndexFiles();
    if (files.empty()) GTEST_SKIP() << "no astrometry.net Tycho-2 index files installed";
    for (const auto& p : files) {
        EXPECT_TRUE(std::filesystem::is_regular_file(p)) << p;
        const std::string name = std::filesystem::path(p).filename().string();
        EXPECT_EQ(name.rfind("index-", 0), 0u) << p;
    }
    // No scale listed twice (byte-order twins collapse to one).
    std::vector<std::string> stems;
    for (const auto& p : files) {
        std::string n = std::filesystem::path(p).filename().string();
        n = n.substr(0, n.find('.'));
        stems.push_back(n);
    }
    std::sort(stems.begin(), stems.end());
    EXPECT_EQ(std::adjacent_find(stems.begin(), stems.end()), stems.end());
}

TEST(Tycho2Index, Index07AgreesWithPanoptesDump) {
    Fixture f;
    std::string why;
    if (!setUp(f, why)) GTEST_SKIP() << why;
    const ReferenceCatalog cat = loadTycho2Region(f.ra, f.dec, 3.0, {f.index07});
    std::printf("index-07, 3 deg around (%.5f, %.5f): %zu stars; dump %zu\n", f.ra, f.dec, cat.size(), f.dump.size());
    EXPECT_EQ(cat.columns.mag, "MAG_VT");
    EXPECT_EQ(cat.epoch, 2000.0);
    // Count consistent: the same cone up to a star or two on its rim.
    EXPECT_NEAR(static_cast<double>(cat.size()), static_cast<double>(f.dump.size()), 3.0);
    // Every dump star is there, at the same position (0.01") with the same VT magnitude.
    double worst = 0.0;
    int missing = 0;
    for (std::size_t i = 0; i < f.dump.size(); ++i) {
        const auto [k, s] = nearest(cat, f.dump.ra[i], f.dump.dec[i]);
        if (s > 0.01) {
            // Allowed only on the cone's rim.
            EXPECT_GT(sepArcsec(f.ra, f.dec, f.dump.ra[i], f.dump.dec[i]), 3.0 * 3600.0 - 5.0) << i;
            ++missing;
            continue;
        }
        worst = std::max(worst, s);
        EXPECT_NEAR(cat.mag[k], f.dump.mag[i], 1e-4) << i;
    }
    EXPECT_LE(missing, 3);
    std::printf("worst position difference %.2e arcsec, %d dump stars not found\n", worst, missing);
    // Every returned star is inside the cone; columns are complete.
    for (std::size_t i = 0; i < cat.size(); ++i)
        ASSERT_LE(sepArcsec(f.ra, f.dec, cat.ra[i], cat.dec[i]), 3.0 * 3600.0 + 1e-3) << i;
    EXPECT_EQ(cat.magErr.size(), cat.size());
    EXPECT_EQ(cat.color.size(), cat.size());
    EXPECT_EQ(cat.pmRa.size(), cat.size());
    EXPECT_EQ(cat.id.size(), cat.size());
    // Ids are unique.
    auto ids = cat.id;
    std::sort(ids.begin(), ids.end());
    EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());
}

TEST(Tycho2Index, DeduplicatesAcrossFiles) {
    Fixture f;
    std::string why;
    if (!setUp(f, why)) GTEST_SKIP() << why;
    const ReferenceCatalog one = loadTycho2Region(f.ra, f.dec, 1.5, {f.index07});
    // The same file twice: every star once.
    const ReferenceCatalog twice = loadTycho2Region(f.ra, f.dec, 1.5, {f.index07, f.index07});
    EXPECT_EQ(twice.size(), one.size());
    EXPECT_EQ(twice.rowsRead, 2 * one.rowsRead);
    EXPECT_EQ(twice.ra, one.ra);
    EXPECT_EQ(twice.id, one.id);
    // All scales: at least index-07's stars, no two closer than 1" (astrometry.net dedups each index at
    // 1"; a closer pair would be a star counted twice).
    const ReferenceCatalog all = loadTycho2Region(f.ra, f.dec, 1.5, f.all);
    std::printf("1.5 deg cone: index-07 %zu stars, all %zu files %zu stars (%zu before dedup)\n", one.size(),
                f.all.size(), all.size(), all.rowsRead);
    EXPECT_GE(all.size(), one.size());
    EXPECT_LT(all.size(), all.rowsRead); // the coarser scales repeat index-07's stars
    for (std::size_t i = 0; i < one.size(); ++i)
        EXPECT_LT(nearest(all, one.ra[i], one.dec[i]).second, 0.01) << i;
    std::size_t close = 0;
    for (std::size_t i = 0; i < all.size(); ++i)
        for (std::size_t j = i + 1; j < all.size(); ++j)
            if (std::fabs(all.dec[i] - all.dec[j]) < 1.0 / 3600.0 &&
                sepArcsec(all.ra[i], all.dec[i], all.ra[j], all.dec[j]) < 1.0)
                ++close;
    EXPECT_EQ(close, 0u);
}

TEST(Tycho2Index, SmallerConeIsSubset) {
    Fixture f;
    std::string why;
    if (!setUp(f, why)) GTEST_SKIP() << why;
    const ReferenceCatalog big = loadTycho2Region(f.ra, f.dec, 2.0, {f.index07});
    const ReferenceCatalog small = loadTycho2Region(f.ra + 0.5, f.dec - 0.3, 0.7, {f.index07});
    std::size_t expected = 0;
    for (std::size_t i = 0; i < big.size(); ++i)
        expected += sepArcsec(f.ra + 0.5, f.dec - 0.3, big.ra[i], big.dec[i]) < 0.7 * 3600.0 - 1e-3;
    EXPECT_NEAR(static_cast<double>(small.size()), static_cast<double>(expected), 1.0);
    for (std::size_t i = 0; i < small.size(); ++i)
        EXPECT_LT(nearest(big, small.ra[i], small.dec[i]).second, 1e-6);
}

TEST(Tycho2Index, RejectsBadInput) {
    const std::string dump = realData("tycho2_panoptes_field.fits");
    EXPECT_THROW(loadTycho2Region(10.0, 20.0, 0.0, {dump}), InvalidInput);
    EXPECT_THROW(loadTycho2Region(10.0, 95.0, 1.0, {dump}), InvalidInput);
    EXPECT_THROW(loadTycho2Region(NAN, 20.0, 1.0, {dump}), InvalidInput);
    EXPECT_THROW(loadTycho2Region(10.0, 20.0, 1.0, {}), InvalidInput);
    EXPECT_THROW(loadTycho2Region(10.0, 20.0, 1.0, {"/nonexistent/index-tycho2-07.fits"}), IoError);
    if (!std::filesystem::exists(dump)) FAIL() << "test data missing: " << dump;
    // A FITS table that is not a star index: named in the message.
    try {
        loadTycho2Region(10.0, 20.0, 1.0, {dump});
        FAIL() << "no exception";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("tycho2_panoptes_field.fits"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("k-d tree"), std::string::npos) << e.what();
    }
}
