#include <gtest/gtest.h>

#include <fitsio.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

class FitsTableTest : public test::ScratchDirTest {
protected:
    FitsTableTest() : ScratchDirTest("gpuphot_fits_table") {}
};

using test::havePython;
using test::runPython;

Table everyTypeTable() {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    Table t;
    t.name = "CATALOG";
    t.add("x", std::vector<double>{1.0, -0.1, nan, 1e300, -inf, 5e-324}, "pix", "windowed centroid, 1-based");
    t.add("fwhm",
          std::vector<float>{2.5f, std::numeric_limits<float>::quiet_NaN(), 0.1f, -3.4e38f, 1e-45f, 7.f},
          "pix");
    t.add("id", std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), -1, 0, 1,
                                          std::numeric_limits<std::int64_t>::max(), 3095663447428055168LL});
    t.add("flags", std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), 0, 1, 2, 1 << 20,
                                             std::numeric_limits<std::int32_t>::max()});
    t.add("area", std::vector<std::int16_t>{-32768, -1, 0, 1, 12345, 32767}, "pix2");
    t.add("class", std::vector<std::uint8_t>{0, 1, 127, 128, 254, 255});
    t.add("name",
          std::vector<std::string>{"", "a", "with space", "O'Brien", "long name with 30 characters!", "z"},
          "", "a string column");
    t.meta.set("ZP", 25.123456789012345, "[mag] zero point");
    t.meta.set("NUSED", 42, "stars in the fit");
    t.meta.set("SOLVED", true);
    t.meta.set("FILTER", "r'");
    t.meta.set("BADNUM", std::nan(""));
    t.meta.set("LONGSTR", std::string(150, 'q') + " end", "a value longer than one card");
    t.meta.set("APRAD1", 3.0, "[pix] aperture radius");
    t.meta.addComment("made by the fits table test");
    t.meta.addHistory("step one");
    return t;
}

template <class T>
void expectSameValues(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(a[i])) {
                EXPECT_TRUE(std::isnan(b[i])) << what << " row " << i;
                continue;
            }
        }
        EXPECT_EQ(a[i], b[i]) << what << " row " << i;
    }
}

} // namespace

TEST_F(FitsTableTest, RoundTripIsExactForEveryTypeWithUnitsAndMeta) {
    const Table t = everyTypeTable();
    const std::string p = path("cat.fits");
    writeFitsTable(p, t);
    const Table back = readFitsTable(p);
    EXPECT_EQ(back.name, "CATALOG");
    ASSERT_EQ(back.columns().size(), t.columns().size());
    ASSERT_EQ(back.rows(), t.rows());
    for (std::size_t i = 0; i < t.columns().size(); ++i) {
        const Column& a = t.columns()[i];
        const Column& b = back.columns()[i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.unit, b.unit) << a.name;
        EXPECT_EQ(a.description, b.description) << a.name;
        ASSERT_EQ(a.data.index(), b.data.index()) << a.name << ": type changed";
        std::visit(
            [&](const auto& va) {
                using V = std::decay_t<decltype(va)>;
                expectSameValues(va, std::get<V>(b.data), a.name);
            },
            a.data);
    }
    EXPECT_EQ(*back.meta.getDouble("ZP"), 25.123456789012345);
    EXPECT_EQ(back.meta.find("ZP")->comment, "[mag] zero point");
    EXPECT_EQ(*back.meta.getInt("NUSED"), 42);
    EXPECT_TRUE(*back.meta.getBool("SOLVED"));
    EXPECT_EQ(*back.meta.getString("FILTER"), "r'");
    EXPECT_TRUE(std::isnan(*back.meta.getDouble("BADNUM")));
    EXPECT_EQ(*back.meta.getString("LONGSTR"), std::string(150, 'q') + " end");
    EXPECT_DOUBLE_EQ(*back.meta.getDouble("APRAD1"), 3.0);
    int comments = 0, history = 0;
    for (const auto& c : back.meta.cards()) {
        comments += c.key == "COMMENT" && c.comment == "made by the fits table test";
        history += c.key == "HISTORY" && c.comment == "step one";
        EXPECT_NE(c.key, "TTYPE1") << "structural keys stay out of meta";
        EXPECT_NE(c.key, "NAXIS2");
        EXPECT_NE(c.key, "EXTNAME");
        EXPECT_NE(c.key, "CONTINUE");
    }
    EXPECT_EQ(comments, 1);
    EXPECT_EQ(history, 1);

    // Writing what was read gives the same table again (meta does not grow).
    writeFitsTable(path("again.fits"), back);
    const Table again = readFitsTable(path("again.fits"));
    EXPECT_EQ(again.meta.size(), back.meta.size());
}

TEST_F(FitsTableTest, AstropyReadsTheWrittenTable) {
    if (!havePython()) GTEST_SKIP() << "/usr/bin/python3 with astropy not available";
    const std::string p = path("cat.fits");
    writeFitsTable(p, everyTypeTable());
    const std::string out = runPython(
        "from astropy.io import fits\n"
        "import numpy as np\n"
        "h = fits.open('" +
        p +
        "')\n"
        "print(len(h), h[0].header['NAXIS'], h[1].name)\n"
        "d = h[1]\n"
        "print(' '.join(d.columns.names))\n"
        "print(' '.join(d.columns.formats))\n"
        "print(d.columns['x'].unit, d.columns['fwhm'].unit, d.columns['area'].unit)\n"
        "print(repr(float(d.data['x'][1])), bool(np.isnan(d.data['x'][2])), int(d.data['id'][5]), "
        "d.data['name'][2])\n"
        "print(d.header['ZP'] == 25.123456789012345, d.header['TCOMM1'], d.header['LONGSTR'][-4:])\n");
    EXPECT_NE(out.find("2 0 CATALOG"), std::string::npos) << out;
    EXPECT_NE(out.find("x fwhm id flags area class name"), std::string::npos) << out;
    EXPECT_NE(out.find("D E K J I B 29A"), std::string::npos) << out;
    EXPECT_NE(out.find("pix pix pix2"), std::string::npos) << out;
    EXPECT_NE(out.find("-0.1 True 3095663447428055168 with space"), std::string::npos) << out;
    EXPECT_NE(out.find("True windowed centroid, 1-based  end"), std::string::npos) << out;
}

TEST_F(FitsTableTest, ReadsAstropyTablesWithUnsignedLogicalAndScaledColumns) {
    if (!havePython()) GTEST_SKIP() << "/usr/bin/python3 with astropy not available";
    const std::string p = path("astropy.fits");
    int rc = 0;
    const std::string out =
        runPython("import numpy as np\n"
                  "from astropy.io import fits\n"
                  "cols = [fits.Column(name='u16', format='I', bzero=32768, array=np.array([0, 40000, "
                  "65535], dtype=np.uint16)),\n"
                  "        fits.Column(name='u32', format='J', bzero=2147483648, array=np.array([0, "
                  "3000000000, 4294967295], dtype=np.uint32)),\n"
                  "        fits.Column(name='flag', format='L', array=np.array([True, False, True])),\n"
                  "        fits.Column(name='vec', format='3E', array=np.zeros((3, 3), dtype=np.float32)),\n"
                  "        fits.Column(name='mag', format='E', unit='mag', array=np.array([1.5, np.nan, "
                  "3.25], dtype=np.float32))]\n"
                  "hdu = fits.BinTableHDU.from_columns(cols, name='REFS')\n"
                  "hdu.header['SURVEY'] = 'test'\n"
                  "fits.HDUList([fits.PrimaryHDU(np.zeros((4, 4), dtype=np.int16)), hdu]).writeto('" +
                      p + "')\n",
                  &rc);
    ASSERT_EQ(rc, 0) << out;
    const Table t = readFitsTable(p);
    EXPECT_EQ(t.name, "REFS");
    EXPECT_EQ(t.find("vec"), nullptr) << "vector columns are skipped";
    EXPECT_EQ(t.at("u16").as<std::int32_t>(), (std::vector<std::int32_t>{0, 40000, 65535}));
    EXPECT_EQ(t.at("u32").as<std::int64_t>(), (std::vector<std::int64_t>{0, 3000000000LL, 4294967295LL}));
    EXPECT_EQ(t.at("flag").as<std::uint8_t>(), (std::vector<std::uint8_t>{1, 0, 1}));
    const auto& mag = t.at("mag").as<float>();
    EXPECT_EQ(mag[0], 1.5f);
    EXPECT_TRUE(std::isnan(mag[1]));
    EXPECT_EQ(t.at("mag").unit, "mag");
    EXPECT_EQ(*t.meta.getString("SURVEY"), "test");

    // By 0-based index and by EXTNAME (case-insensitive).
    EXPECT_EQ(readFitsTable(p, "1").rows(), 3u);
    EXPECT_EQ(readFitsTable(p, "refs").rows(), 3u);
    try {
        readFitsTable(p, "0");
        FAIL() << "HDU 0 is an image";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("not a table"), std::string::npos) << e.what();
    }
    EXPECT_THROW(readFitsTable(p, "5"), InvalidInput);
    EXPECT_THROW(readFitsTable(p, "NOPE"), InvalidInput);
}

TEST_F(FitsTableTest, ReadsCfitsioSignedByteAndUnsignedColumns) {
    // CFITSIO's own S/U/V forms: B with TZERO -128, I with TZERO 32768, J with TZERO 2^31.
    const std::string p = path("unsigned.fits");
    fitsfile* f = nullptr;
    int status = 0;
    // Also a scaled integer column (TSCAL 0.5, TZERO 10, TNULL -32768) added after the raw values.
    char n1[] = "i8", n2[] = "u16", n3[] = "u32", n4[] = "scaled", f1[] = "S", f2[] = "U", f3[] = "V",
         f4[] = "I";
    char* ttype[] = {n1, n2, n3, n4};
    char* tform[] = {f1, f2, f3, f4};
    fits_create_diskfile(&f, p.c_str(), &status);
    fits_create_tbl(f, BINARY_TBL, 0, 4, ttype, tform, nullptr, "U", &status);
    signed char i8[] = {-128, 0, 127, 1};
    unsigned short u16[] = {0, 40000, 65535, 1};
    unsigned int u32[] = {0, 3000000000u, 4294967295u, 1};
    short raw[] = {0, 3, -30, -32768};
    fits_write_col(f, TSBYTE, 1, 1, 1, 4, i8, &status);
    fits_write_col(f, TUSHORT, 2, 1, 1, 4, u16, &status);
    fits_write_col(f, TUINT, 3, 1, 1, 4, u32, &status);
    fits_write_col(f, TSHORT, 4, 1, 1, 4, raw, &status);
    double scale = 0.5, zero = 10;
    int tnull = -32768;
    fits_write_key(f, TDOUBLE, "TSCAL4", &scale, "", &status);
    fits_write_key(f, TDOUBLE, "TZERO4", &zero, "", &status);
    fits_write_key(f, TINT, "TNULL4", &tnull, "", &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0);
    const Table t = readFitsTable(p, "u");
    EXPECT_EQ(t.at("i8").as<std::int16_t>(), (std::vector<std::int16_t>{-128, 0, 127, 1}));
    EXPECT_EQ(t.at("u16").as<std::int32_t>(), (std::vector<std::int32_t>{0, 40000, 65535, 1}));
    EXPECT_EQ(t.at("u32").as<std::int64_t>(), (std::vector<std::int64_t>{0, 3000000000LL, 4294967295LL, 1}));
    const auto& sc = t.at("scaled").as<double>();
    EXPECT_EQ(sc[0], 10.0);
    EXPECT_EQ(sc[1], 11.5);
    EXPECT_EQ(sc[2], -5.0);
    EXPECT_TRUE(std::isnan(sc[3])) << "TNULL -> NaN";
    for (const auto& c : t.meta.cards())
        EXPECT_NE(c.key, "TSCAL4");
}

TEST_F(FitsTableTest, ColumnSelectorReadsOnlyTheChosenColumns) {
    const std::string p = path("cat.fits");
    writeFitsTable(p, everyTypeTable());
    std::vector<std::string> seen;
    const Table t = readFitsTable(p, "", [&](const std::vector<std::string>& available) {
        seen = available;
        return std::vector<std::string>{"NAME", "x"};
    });
    EXPECT_EQ(seen.size(), 7u);
    ASSERT_EQ(t.columns().size(), 2u);
    EXPECT_EQ(t.columns()[0].name, "name");
    EXPECT_EQ(t.columns()[1].name, "x");
    EXPECT_EQ(t.at("name").as<std::string>()[2], "with space");
    EXPECT_THROW(readFitsTable(p, "", [](const auto&) { return std::vector<std::string>{"absent"}; }),
                 InvalidInput);
}

TEST_F(FitsTableTest, EmptyTableAndNoColumns) {
    Table t;
    t.name = "EMPTY";
    t.add("a", std::vector<double>{}, "deg");
    t.add("s", std::vector<std::string>{});
    writeFitsTable(path("e.fits"), t);
    const Table back = readFitsTable(path("e.fits"));
    EXPECT_EQ(back.rows(), 0u);
    ASSERT_EQ(back.columns().size(), 2u);
    EXPECT_EQ(back.at("a").unit, "deg");
}

TEST_F(FitsTableTest, BadFilesGiveErrorsNamingTheFile) {
    const std::string missing = path("missing.fits");
    try {
        readFitsTable(missing);
        FAIL();
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    }
    const std::string text = path("text.fits");
    std::ofstream(text) << "ra,dec\n1,2\n";
    try {
        readFitsTable(text);
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
    // An image-only file (written with CFITSIO directly).
    const std::string image = path("image.fits");
    fitsfile* f = nullptr;
    int status = 0;
    long axes[2] = {4, 3};
    fits_create_diskfile(&f, image.c_str(), &status);
    fits_create_img(f, FLOAT_IMG, 2, axes, &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0);
    try {
        readFitsTable(image);
        FAIL();
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find(image), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("no table"), std::string::npos) << e.what();
    }
}

TEST_F(FitsTableTest, WriteIsAtomicAndReplacesAnOldFile) {
    const std::string p = path("cat.fits");
    std::ofstream(p) << "old contents";
    writeFitsTable(p, everyTypeTable());
    EXPECT_EQ(readFitsTable(p).rows(), 6u);
    for (const auto& e : fs::directory_iterator(m_dir))
        EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left over: " << e.path();
    EXPECT_THROW(writeFitsTable(path("no/such/dir/cat.fits"), everyTypeTable()), IoError);
}

TEST_F(FitsTableTest, ManyRowsRoundTrip) {
    const std::size_t n = 300000;
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(0, 360);
    std::vector<double> ra(n), dec(n);
    std::vector<float> mag(n);
    std::vector<std::int64_t> id(n);
    for (std::size_t i = 0; i < n; ++i) {
        ra[i] = u(rng);
        dec[i] = u(rng) / 4 - 45;
        mag[i] = static_cast<float>(u(rng) / 20);
        id[i] = static_cast<std::int64_t>(rng());
    }
    Table t;
    t.add("ra", ra, "deg");
    t.add("dec", dec, "deg");
    t.add("mag", mag, "mag");
    t.add("id", id);
    const auto t0 = std::chrono::steady_clock::now();
    writeFitsTable(path("big.fits"), t);
    const auto t1 = std::chrono::steady_clock::now();
    const Table back = readFitsTable(path("big.fits"));
    const auto t2 = std::chrono::steady_clock::now();
    EXPECT_EQ(back.at("ra").as<double>(), ra);
    EXPECT_EQ(back.at("dec").as<double>(), dec);
    EXPECT_EQ(back.at("mag").as<float>(), mag);
    EXPECT_EQ(back.at("id").as<std::int64_t>(), id);
    std::printf("[ info ] %zu rows x 4 columns: write %.3f s, read %.3f s\n", n,
                std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
}

// The rows are encoded here (in parallel, in chunks) rather than column by column through CFITSIO: the
// data unit must be what CFITSIO's own column writes give, byte for byte (big-endian values, NaN bits
// kept, strings padded with blanks), over several chunks.
TEST_F(FitsTableTest, TheDataUnitIsCfitsiosColumnWritesByteForByte) {
    const Table small = everyTypeTable();
    const std::size_t reps = 70000; // 420,000 rows of 56 bytes: two chunks
    Table t;
    t.name = "CATALOG";
    auto repeated = [&](const auto& v) {
        std::decay_t<decltype(v)> out;
        out.reserve(v.size() * reps);
        for (std::size_t r = 0; r < reps; ++r)
            out.insert(out.end(), v.begin(), v.end());
        return out;
    };
    for (const Column& c : small.columns())
        std::visit([&](const auto& v) { t.add(c.name, repeated(v), c.unit); }, c.data);
    writeFitsTable(path("ours.fits"), t);

    // The same table through fits_write_col, one call per column.
    int status = 0;
    fitsfile* f = nullptr;
    const std::string ref = "!" + path("cfitsio.fits");
    ASSERT_EQ(fits_create_file(&f, ref.c_str(), &status), 0);
    fits_create_img(f, BYTE_IMG, 0, nullptr, &status);
    std::vector<std::string> names, forms{"D", "E", "K", "J", "I", "B", "29A"};
    std::vector<char*> pn, pf;
    for (const Column& c : t.columns())
        names.push_back(c.name);
    for (std::size_t i = 0; i < names.size(); ++i) {
        pn.push_back(names[i].data());
        pf.push_back(forms[i].data());
    }
    fits_create_tbl(f, BINARY_TBL, static_cast<LONGLONG>(t.rows()), static_cast<int>(names.size()), pn.data(),
                    pf.data(), nullptr, "CATALOG", &status);
    const LONGLONG n = static_cast<LONGLONG>(t.rows());
    fits_write_col(f, TDOUBLE, 1, 1, 1, n,
                   const_cast<void*>(static_cast<const void*>(t.at("x").as<double>().data())), &status);
    fits_write_col(f, TFLOAT, 2, 1, 1, n,
                   const_cast<void*>(static_cast<const void*>(t.at("fwhm").as<float>().data())), &status);
    fits_write_col(f, TLONGLONG, 3, 1, 1, n,
                   const_cast<void*>(static_cast<const void*>(t.at("id").as<std::int64_t>().data())),
                   &status);
    fits_write_col(f, TINT, 4, 1, 1, n,
                   const_cast<void*>(static_cast<const void*>(t.at("flags").as<std::int32_t>().data())),
                   &status);
    fits_write_col(f, TSHORT, 5, 1, 1, n,
                   const_cast<void*>(static_cast<const void*>(t.at("area").as<std::int16_t>().data())),
                   &status);
    fits_write_col(f, TBYTE, 6, 1, 1, n,
                   const_cast<void*>(static_cast<const void*>(t.at("class").as<std::uint8_t>().data())),
                   &status);
    std::vector<char*> text;
    for (const std::string& s : t.at("name").as<std::string>())
        text.push_back(const_cast<char*>(s.c_str()));
    fits_write_col(f, TSTRING, 7, 1, 1, n, text.data(), &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0);

    auto dataUnit = [](const std::string& file) {
        int s = 0;
        fitsfile* g = nullptr;
        LONGLONG head = 0, start = 0, end = 0;
        fits_open_file(&g, file.c_str(), READONLY, &s);
        fits_movabs_hdu(g, 2, nullptr, &s);
        fits_get_hduaddrll(g, &head, &start, &end, &s);
        fits_close_file(g, &s);
        EXPECT_EQ(s, 0) << file;
        std::ifstream in(file, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return bytes.substr(static_cast<std::size_t>(start), static_cast<std::size_t>(end - start));
    };
    const std::string ours = dataUnit(path("ours.fits")), theirs = dataUnit(path("cfitsio.fits"));
    ASSERT_EQ(ours.size(), theirs.size());
    ASSERT_GT(ours.size(), std::size_t{16} << 20) << "more than one chunk";
    EXPECT_TRUE(ours == theirs) << "first difference at byte "
                                << std::mismatch(ours.begin(), ours.end(), theirs.begin()).first -
                                       ours.begin();
}
