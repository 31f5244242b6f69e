// DS9 region files (core/io/ds9_regions.hpp) and statistics inside a region
// (core/stages/aperture/region_stats.hpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/io/ds9_regions.hpp"
#include "core/model/flags.hpp"
#include "core/model/header.hpp"
#include "core/stages/aperture/region_stats.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/wcs_support.hpp"

using namespace gpuphot;

namespace {

// North up, east left, 0.5"/px, CRPIX 100,100 at RA 150, Dec 2.
Wcs testWcs() {
    return Wcs::fromHeader(test::tanHeader(150.0, 2.0, 100.0, 100.0, 0.5));
}

const char* kSample = R"(# Region file format: DS9 version 4.1
# made by hand
global color=green dashlist=8 3 width=1 font="helvetica 10 normal roman"
image
circle(100,200,5) # color=red text={star 1}
box(50.5,60.5,10,4,30) # text={a box} width=2
-ellipse(10,20,6,3,45)
polygon(1,1,10,1,10,10,1,10)
point(33,44) # point=cross
fk5;circle(10:00:24.0,+02:12:00,3") # color=blue
fk5
box(150.01,-2.5,1',0.5',0)
physical
circle 7 8 2.5
)";

} // namespace

TEST(Ds9Regions, ParsesShapesSystemsUnitsAndProperties) {
    const RegionFile f = parseDs9Regions(kSample);
    ASSERT_EQ(f.regions.size(), 8u);
    EXPECT_EQ(f.comments.size(), 2u);
    EXPECT_NE(f.global.find("color=green"), std::string::npos);

    const Region& c = f.regions[0];
    EXPECT_EQ(c.shape, RegionShape::Circle);
    EXPECT_EQ(c.system, RegionSystem::Image);
    EXPECT_EQ(c.points, (std::vector<double>{100, 200}));
    EXPECT_DOUBLE_EQ(c.sizes[0].value, 5.0);
    EXPECT_FALSE(c.sizes[0].sky);
    EXPECT_EQ(c.color, "red");
    EXPECT_EQ(c.text, "star 1");
    EXPECT_EQ(c.line, 5);

    const Region& b = f.regions[1];
    EXPECT_EQ(b.shape, RegionShape::Box);
    EXPECT_DOUBLE_EQ(b.angle, 30.0);
    EXPECT_EQ(b.text, "a box");
    EXPECT_EQ(b.properties, "width=2");

    EXPECT_TRUE(f.regions[2].exclude);
    EXPECT_EQ(f.regions[2].shape, RegionShape::Ellipse);
    EXPECT_EQ(f.regions[3].points.size(), 8u);
    EXPECT_EQ(f.regions[4].shape, RegionShape::Point);

    const Region& s = f.regions[5]; // sexagesimal: RA in hours, Dec in degrees, radius in arcsec
    EXPECT_EQ(s.system, RegionSystem::Fk5);
    EXPECT_NEAR(s.points[0], 150.1, 1e-12);
    EXPECT_NEAR(s.points[1], 2.2, 1e-12);
    EXPECT_TRUE(s.sizes[0].sky);
    EXPECT_NEAR(s.sizes[0].value, 3.0 / 3600.0, 1e-15);
    EXPECT_EQ(s.color, "blue");

    const Region& arcmin = f.regions[6];
    EXPECT_NEAR(arcmin.sizes[0].value, 1.0 / 60.0, 1e-15);
    EXPECT_NEAR(arcmin.sizes[1].value, 0.5 / 60.0, 1e-15);
    EXPECT_DOUBLE_EQ(arcmin.points[1], -2.5);

    EXPECT_EQ(f.regions[7].system, RegionSystem::Physical);
    EXPECT_DOUBLE_EQ(f.regions[7].sizes[0].value, 2.5);
}

TEST(Ds9Regions, BadInputIsATypedErrorWithItsLine) {
    auto lineOf = [](const std::string& text) {
        try {
            parseDs9Regions(text);
        } catch (const Ds9RegionError& e) {
            EXPECT_NE(std::string(e.what()).find("line " + std::to_string(e.line())), std::string::npos)
                << e.what();
            return e.line();
        }
        return -1;
    };
    EXPECT_EQ(lineOf("image\ncircle(1,2,3)\nannulus(1,2,3,4)\n"), 3);
    EXPECT_EQ(lineOf("image\ncircle(1,x,3)\n"), 2);
    EXPECT_EQ(lineOf("# c\ngalactic\ncircle(1,2,3)\n"), 2);
    EXPECT_EQ(lineOf("image\nbox(1,2,3)\n"), 2);
    EXPECT_EQ(lineOf("image\npolygon(1,2,3,4,5)\n"), 2);
    EXPECT_EQ(lineOf("image\ncircle(1,2,3\n"), 2);
    EXPECT_EQ(lineOf("image\ncircle(1,2,-3)\n"), 2);
    EXPECT_EQ(lineOf("image\ncircle(1,2,3) # text={open\n"), 2);
    EXPECT_EQ(lineOf("image\ncircle(1,2,3)\n"), -1); // good input does not throw
    EXPECT_THROW(readDs9Regions("/nonexistent/regions.reg"), IoError);
}

TEST(Ds9Regions, WriteThenParseGivesTheSameShapes) {
    const RegionFile a = parseDs9Regions(kSample);
    const auto path =
        std::filesystem::temp_directory_path() / ("ds9_roundtrip_" + std::to_string(::getpid()) + ".reg");
    writeDs9RegionFile(path.string(), a);
    const RegionFile b = readDs9Regions(path.string());
    std::filesystem::remove(path);
    EXPECT_EQ(b.global, a.global);
    ASSERT_EQ(b.regions.size(), a.regions.size());
    for (std::size_t i = 0; i < a.regions.size(); ++i) {
        const Region &x = a.regions[i], &y = b.regions[i];
        EXPECT_EQ(y.shape, x.shape) << i;
        EXPECT_EQ(y.system, x.system) << i;
        EXPECT_EQ(y.exclude, x.exclude) << i;
        EXPECT_EQ(y.points, x.points) << i; // shortest round-trip text: exact
        ASSERT_EQ(y.sizes.size(), x.sizes.size()) << i;
        for (std::size_t k = 0; k < x.sizes.size(); ++k) {
            EXPECT_EQ(y.sizes[k].sky, x.sizes[k].sky) << i;
            EXPECT_NEAR(y.sizes[k].value, x.sizes[k].value, 1e-12 * std::max(1.0, x.sizes[k].value)) << i;
        }
        EXPECT_DOUBLE_EQ(y.angle, x.angle) << i;
        EXPECT_EQ(y.text, x.text) << i;
        EXPECT_EQ(y.color, x.color) << i;
        EXPECT_EQ(y.properties, x.properties) << i;
    }
}

TEST(Ds9Regions, CatalogRegionsCarryIdsColoursByFlagAndFk5WithAWcs) {
    Table t;
    t.name = "cat";
    t.add("id", std::vector<std::int64_t>{1, 2, 3, 4});
    t.add("x", std::vector<double>{100.0, 120.5, std::nan(""), 80.0});
    t.add("y", std::vector<double>{100.0, 90.0, 5.0, 150.25});
    t.add("flags", std::vector<std::int32_t>{0, static_cast<std::int32_t>(FlagBlended), 0,
                                             static_cast<std::int32_t>(FlagSaturated | FlagBlended)});
    const RegionFile img = catalogRegions(t, nullptr);
    ASSERT_EQ(img.regions.size(), 3u); // the NaN row is skipped
    EXPECT_EQ(img.regions[0].system, RegionSystem::Image);
    EXPECT_EQ(img.regions[1].text, "2");
    EXPECT_EQ(img.regions[0].color, ""); // the global colour: green
    EXPECT_NE(img.global.find("color=green"), std::string::npos);
    EXPECT_EQ(img.regions[1].color, "yellow");
    EXPECT_EQ(img.regions[2].color, "red");

    const Wcs wcs = testWcs();
    const RegionFile sky = parseDs9Regions(formatDs9Regions(catalogRegions(t, &wcs)));
    ASSERT_EQ(sky.regions.size(), 3u);
    for (std::size_t i = 0; i < sky.regions.size(); ++i) {
        EXPECT_EQ(sky.regions[i].system, RegionSystem::Fk5);
        ASSERT_TRUE(sky.regions[i].sizes[0].sky);
        EXPECT_NEAR(sky.regions[i].sizes[0].value * 3600.0, 2.5, 1e-6); // 5 px at 0.5"/px
        const PixelRegion p = toPixels(sky.regions[i], &wcs);
        const std::size_t row = i < 2 ? i : 3;
        EXPECT_NEAR(p.points[0], t.find("x")->asDouble(row) - 1.0, 1e-6);
        EXPECT_NEAR(p.points[1], t.find("y")->asDouble(row) - 1.0, 1e-6);
        EXPECT_NEAR(p.sizes[0], 5.0, 1e-6);
    }
    EXPECT_EQ(sky.regions[2].text, "4");
    EXPECT_THROW(toPixels(sky.regions[0], nullptr), InvalidInput);
}

TEST(Ds9Regions, ContainsFollowsEachShape) {
    const RegionFile f =
        parseDs9Regions("image\nbox(11,11,10,2,90)\npolygon(1,1,11,1,1,11)\nellipse(21,21,4,1,0)\n"
                        "circle(31,31,2)\npoint(5,5)\n");
    std::vector<PixelRegion> p;
    for (const Region& r : f.regions)
        p.push_back(toPixels(r, nullptr));
    // box rotated by 90 degrees: 2 wide in x, 10 tall in y, centred at (10, 10)
    EXPECT_TRUE(contains(p[0], 10.0, 14.0));
    EXPECT_FALSE(contains(p[0], 14.0, 10.0));
    // triangle (0,0) (10,0) (0,10)
    EXPECT_TRUE(contains(p[1], 2.0, 2.0));
    EXPECT_FALSE(contains(p[1], 8.0, 8.0));
    EXPECT_TRUE(contains(p[2], 23.5, 20.0));
    EXPECT_FALSE(contains(p[2], 20.0, 21.5));
    EXPECT_TRUE(contains(p[3], 31.0, 30.0));
    EXPECT_FALSE(contains(p[3], 32.0, 32.0));
    EXPECT_FALSE(contains(p[4], 4.0, 4.0));
}

TEST(RegionStats, BoxStatisticsEqualADirectCount) {
    const int w = 64, h = 48;
    Image<float> img(w, h);
    Image<std::uint8_t> mask(w, h, 0);
    std::mt19937 rng(7);
    std::normal_distribution<float> noise(100.f, 5.f);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img.row(y)[x] = noise(rng) + (x == 30 && y == 20 ? 500.f : 0.f);
    mask.row(22)[31] = 1; // inside the box: left out
    // DS9 box(31,21,9,7): 0-based centre (30, 20), 9 x 7 -> x 26..34, y 17..23, 63 pixels, one masked
    const PixelRegion box = toPixels(parseDs9Regions("image\nbox(31,21,9,7)\n").regions[0], nullptr);
    const RegionStats s = regionStatistics(img.view(), mask.view(), box, nullptr);

    std::vector<double> v;
    double wx = 0, wy = 0;
    for (int y = 17; y <= 23; ++y)
        for (int x = 26; x <= 34; ++x)
            if (!(x == 31 && y == 22)) {
                v.push_back(img.row(y)[x]);
                wx += static_cast<double>(img.row(y)[x]) * x, wy += static_cast<double>(img.row(y)[x]) * y;
            }
    const double sum = std::accumulate(v.begin(), v.end(), 0.0), mean = sum / v.size();
    double ss = 0;
    for (double a : v)
        ss += (a - mean) * (a - mean);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(v.size(), 62u);
    EXPECT_EQ(s.pixels, 62u);
    EXPECT_EQ(s.masked, 1u);
    EXPECT_NEAR(s.sum, sum, 1e-9 * sum);
    EXPECT_NEAR(s.mean, mean, 1e-9 * mean);
    EXPECT_NEAR(s.stddev, std::sqrt(ss / 61.0), 1e-9);
    EXPECT_DOUBLE_EQ(s.median, 0.5 * (sorted[30] + sorted[31]));
    EXPECT_DOUBLE_EQ(s.min, sorted.front());
    EXPECT_DOUBLE_EQ(s.max, sorted.back());
    EXPECT_NEAR(s.centroidX, wx / sum, 1e-9);
    EXPECT_NEAR(s.centroidY, wy / sum, 1e-9);
    EXPECT_FALSE(s.haveBackground);
    EXPECT_TRUE(std::isnan(s.backgroundSubtractedSum));
}

TEST(RegionStats, RegionOffTheImageIsAnError) {
    Image<float> img(10, 10, 1.f);
    const PixelRegion far = toPixels(parseDs9Regions("image\ncircle(100,100,3)\n").regions[0], nullptr);
    EXPECT_THROW(regionStatistics(img.view(), {}, far, nullptr), InvalidInput);
}
