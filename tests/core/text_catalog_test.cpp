#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "core/catalog/table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

class TextCatalogTest : public test::ScratchDirTest {
protected:
    TextCatalogTest() : ScratchDirTest("gpuphot_text_catalog") {}
};

using test::havePython;
using test::runPython;

std::string slurp(const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    for (std::string l; std::getline(ss, l);)
        out.push_back(l);
    return out;
}

Table sampleTable() {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    Table t;
    t.name = "CATALOG";
    t.add("id", std::vector<std::int64_t>{1, 2, 3, 4});
    t.add("x", std::vector<double>{10.25, 0.1, 1.0 / 3.0, nan}, "pix", "windowed x, 1-based");
    t.add("y", std::vector<double>{20.5, -1e-300, 123456789.123456789, 4.0}, "pix");
    t.add("a", std::vector<float>{2.0f, 0.1f, std::numeric_limits<float>::quiet_NaN(), 1.0f}, "pix");
    t.add("b", std::vector<float>{1.0f, 0.05f, 1.0f, -1.0f}, "pix");
    t.add("theta", std::vector<float>{30.0f, -45.0f, 0.0f, 10.0f}, "deg");
    t.add("flags", std::vector<std::int32_t>{0, 4, 0, 1});
    t.add("area", std::vector<std::int16_t>{5, -3, 0, 32767}, "pix2");
    t.add("class", std::vector<std::uint8_t>{0, 255, 7, 1});
    t.add("label", std::vector<std::string>{"star", "two words", "say \"hi\"", "a,b"}, "", "free text");
    t.meta.set("ZP", 25.5, "[mag] zero point");
    t.meta.set("NUSED", 17);
    t.meta.set("SOLVED", true);
    t.meta.set("FILTER", "r'");
    t.meta.set("SMALL", 1e-5);
    t.meta.set("LIMMAG", std::nan(""));
    t.meta.addComment("a comment");
    return t;
}

} // namespace

TEST(TextCatalogSplit, SplitsQuotedCommaAndBlankDelimitedRecords) {
    std::vector<std::string_view> f;
    std::string scratch;
    splitRecord("a, b ,,\"c,d\",\"say \"\"hi\"\"\",", ',', f, scratch);
    ASSERT_EQ(f.size(), 6u);
    EXPECT_EQ(f[0], "a");
    EXPECT_EQ(f[1], "b");
    EXPECT_EQ(f[2], "");
    EXPECT_EQ(f[3], "c,d");
    EXPECT_EQ(f[4], "say \"hi\"");
    EXPECT_EQ(f[5], "");
    splitRecord("  1.5   2  \"two words\" x\r", ' ', f, scratch);
    ASSERT_EQ(f.size(), 4u);
    EXPECT_EQ(f[0], "1.5");
    EXPECT_EQ(f[2], "two words");
    EXPECT_EQ(f[3], "x");
    splitRecord("1\t\t3", '\t', f, scratch);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(f[1], "");
    EXPECT_EQ(detectDelimiter("\"a,b\" c"), ' ');
    EXPECT_EQ(detectDelimiter("ra\tdec"), '\t');
    EXPECT_EQ(detectDelimiter("ra, dec"), ',');
}

TEST(TextCatalogNumbers, FormatNumberRoundTripsExactly) {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(-1e6, 1e6);
    for (int i = 0; i < 2000; ++i) {
        const double v = u(rng) * std::pow(10.0, static_cast<int>(rng() % 40) - 20);
        double back = 0;
        ASSERT_TRUE(parseNumber(formatNumber(v), back));
        EXPECT_EQ(back, v);
        const float fv = static_cast<float>(v);
        EXPECT_EQ(std::strtof(formatNumber(fv).c_str(), nullptr), fv);
    }
    EXPECT_EQ(formatNumber(std::nan("")), "nan");
    EXPECT_EQ(formatNumber(-std::numeric_limits<double>::infinity()), "-inf");
    double v;
    EXPECT_TRUE(parseNumber("+1.5e3", v));
    EXPECT_EQ(v, 1500.0);
    EXPECT_TRUE(parseNumber("NaN", v));
    EXPECT_TRUE(std::isnan(v));
    EXPECT_FALSE(parseNumber("1.5x", v));
    EXPECT_FALSE(parseNumber("", v));
}

TEST_F(TextCatalogTest, EcsvIsReadByAstropyWithNamesUnitsTypesValuesAndMeta) {
    const std::string p = path("cat.ecsv");
    writeEcsv(p, sampleTable());
    const std::string text = slurp(p);
    EXPECT_EQ(text.rfind("# %ECSV 1.0\n# ---\n", 0), 0u) << text;
    if (!havePython()) GTEST_SKIP() << "/usr/bin/python3 with astropy not available";
    int rc = 0;
    const std::string out = runPython(
        "from astropy.table import Table\n"
        "import numpy as np\n"
        "t = Table.read('" +
            p +
            "', format='ascii.ecsv')\n"
            "print('names', ' '.join(t.colnames))\n"
            "print('units', t['x'].unit, t['theta'].unit, t['area'].unit)\n"
            "print('types', ' '.join(str(t[c].dtype) for c in ['id', 'x', 'a', 'flags', 'area', 'class']))\n"
            "print('desc', t['x'].description, '|', t['label'].description)\n"
            "print('vals', repr(float(t['x'][0])), float(t['x'][2]) == 1/3, bool(np.isnan(t['x'][3])), "
            "int(t['class'][1]))\n"
            "print('yval', float(t['y'][2]) == 123456789.123456789, float(t['y'][1]) == -1e-300)\n"
            "print('strs', '|'.join(t['label']))\n"
            "print('meta', t.meta['ZP'], t.meta['NUSED'], t.meta['SOLVED'], t.meta['FILTER'], "
            "t.meta['SMALL'] == 1e-5, t.meta['comments'], bool(np.isnan(t.meta['LIMMAG'])))\n",
        &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("names id x y a b theta flags area class label"), std::string::npos) << out;
    EXPECT_NE(out.find("units pix deg pix2"), std::string::npos) << out;
    EXPECT_NE(out.find("types int64 float64 float32 int32 int16 uint8"), std::string::npos) << out;
    EXPECT_NE(out.find("desc windowed x, 1-based | free text"), std::string::npos) << out;
    EXPECT_NE(out.find("vals 10.25 True True 255"), std::string::npos) << out;
    EXPECT_NE(out.find("yval True True"), std::string::npos) << out;
    EXPECT_NE(out.find("strs star|two words|say \"hi\"|a,b"), std::string::npos) << out;
    EXPECT_NE(out.find("meta 25.5 17 True r' True ['a comment'] True"), std::string::npos) << out;
}

TEST_F(TextCatalogTest, CsvRoundTripThroughReadCsvIsExact) {
    const Table t = sampleTable();
    const std::string p = path("cat.csv");
    writeCsv(p, t);
    const auto ls = lines(slurp(p));
    ASSERT_EQ(ls.size(), 5u);
    EXPECT_EQ(ls[0], "id,x,y,a,b,theta,flags,area,class,label");
    EXPECT_NE(ls[4].find("nan"), std::string::npos) << "NaN is written as nan: " << ls[4];
    const Table back = readCsv(p);
    ASSERT_EQ(back.rows(), 4u);
    EXPECT_EQ(back.at("id").as<std::int64_t>(), (std::vector<std::int64_t>{1, 2, 3, 4}));
    const auto& x = back.at("x").as<double>();
    EXPECT_EQ(x[0], 10.25);
    EXPECT_EQ(x[1], 0.1);
    EXPECT_EQ(x[2], 1.0 / 3.0);
    EXPECT_TRUE(std::isnan(x[3]));
    EXPECT_EQ(back.at("y").as<double>(), t.at("y").as<double>());
    // Floats come back as the float's shortest decimal, which converts back to the same float.
    const auto& a = back.at("a").as<double>();
    EXPECT_EQ(static_cast<float>(a[1]), 0.1f);
    EXPECT_EQ(a[1], 0.1);
    EXPECT_EQ(back.at("class").as<std::int64_t>()[1], 255);
    EXPECT_EQ(back.at("label").as<std::string>(), t.at("label").as<std::string>());

    if (!havePython()) return;
    int rc = 0;
    const std::string out =
        runPython("from astropy.table import Table\n"
                  "t = Table.read('" +
                      p +
                      "', format='ascii.csv')\n"
                      "print(len(t), float(t['x'][2]) == 1/3, t['label'][3], t['label'][2])\n",
                  &rc);
    EXPECT_NE(out.find("4 True a,b say \"hi\""), std::string::npos) << out;
}

// ECSV and CSV written together (each number formatted once) over more rows than one block of the
// writer: the same files as written one at a time, every row read back exactly, strings quoted per format.
TEST_F(TextCatalogTest, EcsvAndCsvTogetherEqualEachAloneAcrossBlocks) {
    std::mt19937_64 rng(3);
    std::normal_distribution<double> g(0.0, 1e3);
    const std::size_t n = 9001;
    std::vector<double> x(n);
    std::vector<float> f(n);
    std::vector<std::int32_t> k(n);
    std::vector<std::string> label(n);
    for (std::size_t i = 0; i < n; ++i) {
        x[i] = i % 997 == 5 ? std::nan("") : g(rng);
        f[i] = static_cast<float>(g(rng));
        k[i] = static_cast<std::int32_t>(i) - 4096;
        label[i] = i % 3 == 0 ? "a,b" : i % 3 == 1 ? "two words" : "plain" + std::to_string(i);
    }
    Table t;
    t.add("x", x, "pix");
    t.add("label", label);
    t.add("f", f);
    t.add("k", k);
    writeTextTables(path("both.ecsv"), path("both.csv"), t);
    writeEcsv(path("alone.ecsv"), t);
    writeCsv(path("alone.csv"), t);
    const std::string ecsv = slurp(path("both.ecsv")), csv = slurp(path("both.csv"));
    EXPECT_EQ(ecsv, slurp(path("alone.ecsv")));
    EXPECT_EQ(csv, slurp(path("alone.csv")));
    const auto cl = lines(csv);
    ASSERT_EQ(cl.size(), n + 1);
    EXPECT_EQ(cl[1].substr(cl[1].find(',') + 1, 5), "\"a,b\"");
    const auto el = lines(ecsv);
    EXPECT_NE(std::find(el.begin(), el.end(), "x label f k"), el.end());
    EXPECT_NE(ecsv.find(" \"two words\" "), std::string::npos);
    const Table back = readCsv(path("both.csv"));
    ASSERT_EQ(back.rows(), n);
    const auto& bx = back.at("x").as<double>();
    const auto& bk = back.at("k").as<std::int64_t>();
    for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isnan(x[i]) ? std::isnan(bx[i]) : bx[i] == x[i]) << "row " << i;
        ASSERT_EQ(bk[i], k[i]) << "row " << i;
        ASSERT_EQ(static_cast<float>(back.at("f").as<double>()[i]), f[i]) << "row " << i;
    }
    EXPECT_EQ(back.at("label").as<std::string>(), label);
}

TEST_F(TextCatalogTest, ReadCsvHandlesCommentsTabsAndRejectsRaggedRows) {
    const std::string p = path("t.tsv");
    std::ofstream(p) << "# a comment\n\nra\tdec\tname\n10.5\t-3\tfoo\n\n# more\n11\t\tbar\n";
    const Table t = readCsv(p);
    ASSERT_EQ(t.rows(), 2u);
    EXPECT_EQ(t.at("ra").as<double>()[1], 11.0);
    EXPECT_TRUE(std::isnan(t.at("dec").as<double>()[1])) << "empty numeric field -> NaN";
    EXPECT_EQ(t.at("name").as<std::string>()[0], "foo");

    const std::string bad = path("bad.csv");
    std::ofstream(bad) << "a,b\n1,2\n3\n";
    try {
        readCsv(bad);
        FAIL();
    } catch (const InvalidInput& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(bad), std::string::npos) << m;
        EXPECT_NE(m.find("line 3"), std::string::npos) << m;
    }
    EXPECT_THROW(readCsv(path("missing.csv")), IoError);
}

TEST_F(TextCatalogTest, Ds9RegionsWriteCirclesEllipsesColoursAndLabels) {
    const Table t = sampleTable();
    RegionStyle style;
    style.aCol = "a";
    style.bCol = "b";
    style.thetaCol = "theta";
    style.ellipseScale = 3.0;
    style.flagsCol = "flags";
    style.textCol = "id";
    style.radius = 4.0;
    const std::string p = path("cat.reg");
    writeDs9Regions(p, t, style);
    const auto ls = lines(slurp(p));
    ASSERT_EQ(ls.size(), 3u + 3u) << "row 4 has NaN x and is skipped";
    EXPECT_EQ(ls[0], "# Region file format: DS9 version 4.1");
    EXPECT_EQ(ls[1].rfind("global color=green", 0), 0u) << ls[1];
    EXPECT_EQ(ls[2], "image");
    // Row 1: ellipse with a, b scaled by 3, positions as given (already 1-based).
    double x, y, a, b, th;
    ASSERT_EQ(std::sscanf(ls[3].c_str(), "ellipse(%lf,%lf,%lf,%lf,%lf)", &x, &y, &a, &b, &th), 5) << ls[3];
    EXPECT_DOUBLE_EQ(x, 10.25);
    EXPECT_DOUBLE_EQ(y, 20.5);
    EXPECT_DOUBLE_EQ(a, 6.0);
    EXPECT_DOUBLE_EQ(b, 3.0);
    EXPECT_DOUBLE_EQ(th, 30.0);
    EXPECT_NE(ls[3].find("text={1}"), std::string::npos) << ls[3];
    EXPECT_EQ(ls[3].find("color="), std::string::npos) << "unflagged rows take the global colour";
    // Row 2: flagged -> red.
    EXPECT_EQ(ls[4].rfind("ellipse(", 0), 0u) << ls[4];
    EXPECT_NE(ls[4].find("color=red"), std::string::npos) << ls[4];
    // Row 3: a is NaN -> circle with the fallback radius.
    double r;
    ASSERT_EQ(std::sscanf(ls[5].c_str(), "circle(%lf,%lf,%lf)", &x, &y, &r), 3) << ls[5];
    EXPECT_NEAR(x, 1.0 / 3.0, 1e-4);
    EXPECT_DOUBLE_EQ(r, 4.0);

    // Circles only, with string labels.
    RegionStyle plain;
    plain.textCol = "label";
    writeDs9Regions(path("plain.reg"), t, plain);
    const auto pl = lines(slurp(path("plain.reg")));
    ASSERT_EQ(pl.size(), 6u);
    EXPECT_EQ(pl[3], "circle(10.2500,20.5000,5.0000) # text={star}");

    RegionStyle missing;
    missing.flagsCol = "nope";
    try {
        writeDs9Regions(path("m.reg"), t, missing);
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
    }
    EXPECT_FALSE(fs::exists(path("m.reg")));
}

TEST_F(TextCatalogTest, WritersAreAtomic) {
    EXPECT_THROW(writeCsv(path("none/x.csv"), sampleTable()), IoError);
    EXPECT_THROW(writeEcsv(path("none/x.ecsv"), sampleTable()), IoError);
    writeCsv(path("x.csv"), sampleTable());
    writeEcsv(path("x.ecsv"), sampleTable());
    int files = 0;
    for (const auto& e : fs::directory_iterator(m_dir)) {
        ++files;
        EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    }
    EXPECT_EQ(files, 2);
}
