// Wcs (WCSLIB) against astropy.wcs fixtures (tests/data/wcs/make_fixtures.py), the closed-form TanSip,
// real DECam (TPV) and PANOPTES (TAN-SIP) headers, and its own inverse.
#include <gtest/gtest.h>

#include <fitsio.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/header.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/core/test_fields.hpp"

using namespace gpuphot;

namespace {

const std::string kFixtures = std::string(GPUPHOT_TEST_DATA) + "/wcs/wcs_fixtures.json";
const std::string kDecam = std::string(GPUPHOT_TEST_DATA) + "/real/decam_ls9_N6_cutout.fits";
const std::string kPanoptes = std::string(GPUPHOT_TEST_DATA) + "/real/panoptes_solved.fits.fz";

struct FixtureCase {
    std::string name, projection;
    int width = 0, height = 0;
    Header header;
    std::vector<double> x, y, ra, dec;
};

std::vector<FixtureCase> loadFixtures() {
    std::ifstream in(kFixtures);
    if (!in) throw std::runtime_error("cannot open " + kFixtures);
    const auto doc = nlohmann::json::parse(in);
    std::vector<FixtureCase> out;
    for (const auto& c : doc.at("cases")) {
        FixtureCase f;
        f.name = c.at("name");
        f.projection = c.at("projection");
        f.width = c.at("width");
        f.height = c.at("height");
        std::string text;
        for (const auto& card : c.at("cards")) {
            std::string s = card;
            s.resize(80, ' ');
            text += s;
        }
        f.header = Header::fromFitsString(text);
        for (const auto& p : c.at("pixels")) {
            f.x.push_back(p[0]);
            f.y.push_back(p[1]);
        }
        for (const auto& w : c.at("world")) {
            f.ra.push_back(w[0]);
            f.dec.push_back(w[1]);
        }
        out.push_back(std::move(f));
    }
    return out;
}

const FixtureCase& fixture(const std::string& name) {
    static const std::vector<FixtureCase> all = loadFixtures();
    for (const auto& f : all)
        if (f.name == name) return f;
    throw std::runtime_error("no fixture case " + name);
}

// The header of HDU `hdu` (1 = primary) read with CFITSIO; tile-compressed images give the image header.
std::optional<Header> readHeader(const std::string& path, int hdu) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    fitsfile* f = nullptr;
    int status = 0;
    if (fits_open_file(&f, path.c_str(), READONLY, &status)) return std::nullopt;
    char* text = nullptr;
    int nkeys = 0;
    fits_movabs_hdu(f, hdu, nullptr, &status);
    fits_convert_hdr2str(f, 0, nullptr, 0, &text, &nkeys, &status);
    std::optional<Header> h;
    if (status == 0) h = Header::fromFitsString(std::string_view(text, static_cast<std::size_t>(nkeys) * 80));
    if (text) {
        int s2 = 0;
        fits_free_memory(text, &s2);
    }
    int s3 = 0;
    fits_close_file(f, &s3);
    return h;
}

// Pixels on a grid spanning the image, edges included, plus off-grid points.
void gridPixels(int width, int height, std::vector<double>& x, std::vector<double>& y) {
    x.clear();
    y.clear();
    const int n = 13;
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < n; ++i) {
            x.push_back(-0.5 + (width)*i / (n - 1.0) + 0.137 * (j % 3));
            y.push_back(-0.5 + (height)*j / (n - 1.0) - 0.291 * (i % 2));
        }
}

// Maximum round-trip error in pixels of pixel -> world -> pixel over a grid.
double roundTripError(const Wcs& wcs, int width, int height) {
    std::vector<double> x, y;
    gridPixels(width, height, x, y);
    std::vector<double> ra(x.size()), dec(x.size()), x2(x.size()), y2(x.size());
    wcs.pixelToWorld(x, y, ra, dec);
    wcs.worldToPixel(ra, dec, x2, y2);
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (!std::isfinite(x2[i]) || !std::isfinite(y2[i])) return INFINITY;
        worst = std::max(worst, std::hypot(x2[i] - x[i], y2[i] - y[i]));
    }
    return worst;
}

Header makeTanHeader(double cd11, double cd12, double cd21, double cd22) {
    Header h;
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC--TAN");
    h.set("CRPIX1", 100.0);
    h.set("CRPIX2", 100.0);
    h.set("CRVAL1", 150.0);
    h.set("CRVAL2", 2.0);
    h.set("CD1_1", cd11);
    h.set("CD1_2", cd12);
    h.set("CD2_1", cd21);
    h.set("CD2_2", cd22);
    return h;
}

// An order-3 TAN-SIP with corner distortions of a few pixels (like a wide-field refractor).
TanSip realisticTanSip() {
    TanSip t = test::rotatedTanSip(1530.25, 1020.75, 83.82, -5.39, 2.5, 0.35, 3);
    t.coeffA(2, 0) = 3.1e-7;
    t.coeffA(1, 1) = -1.7e-7;
    t.coeffA(0, 2) = 5.5e-8;
    t.coeffA(3, 0) = -8.0e-11;
    t.coeffA(1, 2) = -7.5e-11;
    t.coeffA(2, 1) = 2.0e-12;
    t.coeffB(2, 0) = -4.0e-8;
    t.coeffB(1, 1) = 2.4e-7;
    t.coeffB(0, 2) = -1.1e-7;
    t.coeffB(0, 3) = -8.2e-11;
    t.coeffB(2, 1) = -7.7e-11;
    t.coeffB(1, 2) = 3.0e-12;
    return t;
}

} // namespace

// ---------------------------------------------------------------------------------------------------
// Independent values: astropy.wcs (SIP and TPV cross-checked against numpy in the fixture script).

TEST(WcsAstropy, PixelToWorldMatchesAstropyFixtures) {
    for (const char* name :
         {"tan", "tan_sip_order3", "zpn", "tan_near_pole", "panoptes_tan_sip", "decam_tpv"}) {
        SCOPED_TRACE(name);
        const FixtureCase& f = fixture(name);
        const Wcs wcs = Wcs::fromHeader(f.header);
        EXPECT_EQ(wcs.projectionCode(), f.projection);
        std::vector<double> ra(f.x.size()), dec(f.x.size());
        wcs.pixelToWorld(f.x, f.y, ra, dec);
        double worst = 0;
        for (std::size_t i = 0; i < f.x.size(); ++i) {
            ASSERT_GE(ra[i], 0.0);
            ASSERT_LT(ra[i], 360.0);
            worst = std::max(worst, angularSeparationDeg(ra[i], dec[i], f.ra[i], f.dec[i]));
            // Per-coordinate too (the separation formula loses precision below ~1e-12 deg only).
            double dra = std::remainder(ra[i] - f.ra[i], 360.0);
            EXPECT_LT(std::fabs(dra) * std::cos(dec[i] * M_PI / 180), 1e-9) << "point " << i;
            EXPECT_NEAR(dec[i], f.dec[i], 1e-9) << "point " << i;
        }
        EXPECT_LT(worst, 1e-9);
        // And back: astropy's world values land on the fixture's pixels.
        std::vector<double> x(f.x.size()), y(f.x.size());
        wcs.worldToPixel(f.ra, f.dec, x, y);
        for (std::size_t i = 0; i < f.x.size(); ++i) {
            EXPECT_NEAR(x[i], f.x[i], 1e-6) << "point " << i;
            EXPECT_NEAR(y[i], f.y[i], 1e-6) << "point " << i;
        }
    }
}

TEST(WcsAstropy, ClosedFormTanSipMatchesAstropy) {
    // tan_sip.cpp's closed form, built from the fixture's keywords, against astropy's SIP.
    const FixtureCase& f = fixture("tan_sip_order3");
    TanSip t;
    t.crpix[0] = *f.header.getDouble("CRPIX1");
    t.crpix[1] = *f.header.getDouble("CRPIX2");
    t.crval[0] = *f.header.getDouble("CRVAL1");
    t.crval[1] = *f.header.getDouble("CRVAL2");
    t.cd[0][0] = *f.header.getDouble("CD1_1");
    t.cd[0][1] = *f.header.getDouble("CD1_2");
    t.cd[1][0] = *f.header.getDouble("CD2_1");
    t.cd[1][1] = *f.header.getDouble("CD2_2");
    t.setSipOrder(3);
    for (int p = 0; p <= 3; ++p)
        for (int q = 0; p + q <= 3; ++q) {
            const std::string suffix = std::to_string(p) + "_" + std::to_string(q);
            t.coeffA(p, q) = f.header.getDouble("A_" + suffix).value_or(0.0);
            t.coeffB(p, q) = f.header.getDouble("B_" + suffix).value_or(0.0);
        }
    for (std::size_t i = 0; i < f.x.size(); ++i) {
        double ra = 0, dec = 0;
        t.pixelToWorld(f.x[i], f.y[i], ra, dec);
        EXPECT_LT(angularSeparationDeg(ra, dec, f.ra[i], f.dec[i]), 1e-9) << "point " << i;
    }
}

// ---------------------------------------------------------------------------------------------------
// Round trips pixel -> world -> pixel.

TEST(WcsRoundTrip, TanAndTanSipAndZpn) {
    for (const char* name : {"tan", "tan_sip_order3", "zpn", "tan_near_pole"}) {
        SCOPED_TRACE(name);
        const FixtureCase& f = fixture(name);
        const Wcs wcs = Wcs::fromHeader(f.header);
        EXPECT_LT(roundTripError(wcs, f.width, f.height), 1e-8);
    }
}

TEST(WcsRoundTrip, RealDecamTpvHeader) {
    const auto header = readHeader(kDecam, 2);
    if (!header) FAIL() << "test data missing: " << kDecam;
    const Wcs wcs = Wcs::fromHeader(*header);
    EXPECT_EQ(wcs.projectionCode(), "TPV");
    const int w = static_cast<int>(*header->getInt("NAXIS1")),
              h = static_cast<int>(*header->getInt("NAXIS2"));
    EXPECT_LT(roundTripError(wcs, w, h), 1e-8);
    // The survey's nominal 0.262"/px (DECam) at the centre, to a percent.
    EXPECT_NEAR(wcs.pixelScaleArcsec(w / 2.0, h / 2.0), 0.262, 0.0027);
    // Full header (with all its non-WCS cards) gives the same numbers as the fixture's WCS-only cards,
    // which astropy evaluated.
    const FixtureCase& f = fixture("decam_tpv");
    for (std::size_t i = 0; i < f.x.size(); ++i) {
        const auto [ra, dec] = wcs.pixelToWorld(f.x[i], f.y[i]);
        EXPECT_LT(angularSeparationDeg(ra, dec, f.ra[i], f.dec[i]), 1e-9);
    }
}

TEST(WcsRoundTrip, RealPanoptesTanSipHeader) {
    const auto header = readHeader(kPanoptes, 2);
    if (!header) FAIL() << "test data missing: " << kPanoptes;
    const Wcs wcs = Wcs::fromHeader(*header);
    EXPECT_EQ(wcs.projectionCode(), "TAN-SIP");
    EXPECT_LT(roundTripError(wcs, 700, 700), 1e-8);
    EXPECT_NEAR(wcs.pixelScaleArcsec(349.5, 349.5), 10.32, 0.05); // astrometry.net's "scale: 10.3199"
    const FixtureCase& f = fixture("panoptes_tan_sip");
    for (std::size_t i = 0; i < f.x.size(); ++i) {
        const auto [ra, dec] = wcs.pixelToWorld(f.x[i], f.y[i]);
        EXPECT_LT(angularSeparationDeg(ra, dec, f.ra[i], f.dec[i]), 1e-9);
    }
}

// ---------------------------------------------------------------------------------------------------
// TanSip (closed form) and WCSLIB.

TEST(WcsTanSip, ClosedFormAndWcslibAgree) {
    for (bool withInverse : {false, true}) {
        SCOPED_TRACE(withInverse ? "with AP/BP" : "without AP/BP");
        TanSip t = realisticTanSip();
        if (withInverse) {
            // A rough first-order inverse (AP ~ -A): WCSLIB uses it only as a starting point.
            t.sipInvOrder = 3;
            t.ap.assign(16, 0.0);
            t.bp.assign(16, 0.0);
            for (int i = 0; i < 16; ++i) {
                t.ap[i] = -t.a[i];
                t.bp[i] = -t.b[i];
            }
            t.ap[0] = 1e-3; // a constant term (AP_0_0) must survive toHeader
            ASSERT_TRUE(t.toHeader().getDouble("AP_0_0").has_value());
            EXPECT_EQ(*t.toHeader().getDouble("AP_0_0"), 1e-3);
        }
        const Wcs wcs = Wcs::fromTanSip(t);
        EXPECT_EQ(wcs.projectionCode(), "TAN-SIP");
        std::vector<double> x, y;
        gridPixels(3060, 2040, x, y);
        double worstDeg = 0, worstPx = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            double ra1 = 0, dec1 = 0;
            t.pixelToWorld(x[i], y[i], ra1, dec1);
            const auto [ra2, dec2] = wcs.pixelToWorld(x[i], y[i]);
            worstDeg = std::max(worstDeg, angularSeparationDeg(ra1, dec1, ra2, dec2));
            double px = 0, py = 0;
            ASSERT_TRUE(t.worldToPixel(ra1, dec1, px, py));
            const auto [qx, qy] = wcs.worldToPixel(ra1, dec1);
            worstPx = std::max(worstPx, std::hypot(px - qx, py - qy));
            EXPECT_NEAR(qx, x[i], 1e-8);
            EXPECT_NEAR(qy, y[i], 1e-8);
        }
        EXPECT_LT(worstDeg, 1e-9);
        EXPECT_LT(worstPx, 1e-8);
    }
}

TEST(WcsTanSip, ToHeaderRoundTrip) {
    const TanSip t = realisticTanSip();
    const Wcs a = Wcs::fromTanSip(t);
    const Header written = a.toHeader();
    // WCSLIB writes SIP natively.
    ASSERT_TRUE(written.getString("CTYPE1").has_value());
    EXPECT_EQ(*written.getString("CTYPE1"), "RA---TAN-SIP");
    EXPECT_TRUE(written.has("A_ORDER"));
    EXPECT_TRUE(written.has("B_3_0") || written.has("B_0_3"));
    EXPECT_TRUE(written.has("CD1_1") && written.has("CD2_2") && !written.has("PC1_1"))
        << "SIP is defined on CD";
    EXPECT_DOUBLE_EQ(*written.getDouble("CD1_2"), t.cd[0][1]);
    const Wcs b = Wcs::fromHeader(written);
    EXPECT_EQ(b.projectionCode(), "TAN-SIP");
    std::vector<double> x, y;
    gridPixels(3060, 2040, x, y);
    for (std::size_t i = 0; i < x.size(); ++i) {
        double ra = 0, dec = 0;
        t.pixelToWorld(x[i], y[i], ra, dec);
        const auto [ra2, dec2] = b.pixelToWorld(x[i], y[i]);
        EXPECT_LT(angularSeparationDeg(ra, dec, ra2, dec2), 1e-10);
    }
    // Pure TAN too.
    TanSip tan = realisticTanSip();
    tan.setSipOrder(0);
    const Wcs c = Wcs::fromHeader(Wcs::fromTanSip(tan).toHeader());
    EXPECT_EQ(c.projectionCode(), "TAN");
    double ra = 0, dec = 0;
    tan.pixelToWorld(10.0, 2000.0, ra, dec);
    const auto [ra2, dec2] = c.pixelToWorld(10.0, 2000.0);
    EXPECT_LT(angularSeparationDeg(ra, dec, ra2, dec2), 1e-10);
}

TEST(WcsTanSip, ToHeaderKeepsTpvAndSipOfRealHeaders) {
    for (const char* name : {"decam_tpv", "panoptes_tan_sip"}) {
        SCOPED_TRACE(name);
        const FixtureCase& f = fixture(name);
        const Wcs again = Wcs::fromHeader(Wcs::fromHeader(f.header).toHeader());
        EXPECT_EQ(again.projectionCode(), f.projection);
        for (std::size_t i = 0; i < f.x.size(); ++i) {
            const auto [ra, dec] = again.pixelToWorld(f.x[i], f.y[i]);
            EXPECT_LT(angularSeparationDeg(ra, dec, f.ra[i], f.dec[i]), 1e-9);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Errors and edge cases.

TEST(WcsErrors, NoWcsGivesNulloptWithReason) {
    Header h;
    h.set("NAXIS", 2);
    h.set("NAXIS1", 100);
    h.set("NAXIS2", 100);
    h.set("EXPTIME", 30.0);
    std::string why;
    EXPECT_FALSE(Wcs::tryFromHeader(h, &why).has_value());
    EXPECT_FALSE(why.empty());
    EXPECT_THROW(Wcs::fromHeader(h), InvalidInput);
    // A linear (non-celestial) WCS is not a sky WCS either.
    h.set("CTYPE1", "LINEAR");
    h.set("CTYPE2", "LINEAR");
    h.set("CRPIX1", 1.0);
    why.clear();
    EXPECT_FALSE(Wcs::tryFromHeader(h, &why).has_value());
    EXPECT_NE(why.find("celestial"), std::string::npos) << why;
}

TEST(WcsErrors, SingularCdMatrixThrows) {
    const Header h = makeTanHeader(1e-4, 2e-4, 0.5e-4, 1e-4); // rows proportional: det = 0
    try {
        Wcs::fromHeader(h);
        FAIL() << "expected InvalidInput";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("singular"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Wcs::tryFromHeader(h), InvalidInput);
    EXPECT_THROW(Wcs::fromHeader(makeTanHeader(0, 0, 0, 0)), InvalidInput);
}

TEST(WcsErrors, BrokenKeywordsThrow) {
    Header h = makeTanHeader(-1e-4, 0, 0, 1e-4);
    h.setRaw("CRVAL1", "'abc'");
    try {
        Wcs::tryFromHeader(h);
        FAIL() << "expected InvalidInput";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("CRVAL1"), std::string::npos) << e.what();
    }
    Header unknown = makeTanHeader(-1e-4, 0, 0, 1e-4);
    unknown.set("CTYPE1", "RA---XYZ");
    unknown.set("CTYPE2", "DEC--XYZ");
    EXPECT_THROW(Wcs::tryFromHeader(unknown), InvalidInput);
    Header unpaired = makeTanHeader(-1e-4, 0, 0, 1e-4);
    unpaired.set("CTYPE2", "LINEAR");
    EXPECT_THROW(Wcs::tryFromHeader(unpaired), InvalidInput);
}

TEST(WcsEdges, FailedPointsAreNaNAndRaIsWrapped) {
    const Wcs wcs = Wcs::fromHeader(makeTanHeader(-1e-3, 0, 0, 1e-3));
    const std::vector<double> ra = {150.0, 330.0, NAN, 150.1}, dec = {2.0, -2.0, 0.0, 95.0};
    std::vector<double> x(4), y(4);
    wcs.worldToPixel(ra, dec, x, y);
    EXPECT_NEAR(x[0], 99.0, 1e-9); // CRPIX 100 (1-based) is pixel 99 (0-based)
    EXPECT_NEAR(y[0], 99.0, 1e-9);
    EXPECT_TRUE(std::isnan(x[1]) && std::isnan(y[1])) << "far hemisphere of a TAN";
    EXPECT_TRUE(std::isnan(x[2]) && std::isnan(y[2]));
    EXPECT_TRUE(std::isnan(x[3]) && std::isnan(y[3]));
    const auto [r, d] = wcs.pixelToWorld(NAN, 3.0);
    EXPECT_TRUE(std::isnan(r) && std::isnan(d));
    // A field across RA = 0 gives RA in [0, 360).
    Header h = makeTanHeader(-1e-3, 0, 0, 1e-3);
    h.set("CRVAL1", 0.0);
    const Wcs zero = Wcs::fromHeader(h);
    const auto [r1, d1] = zero.pixelToWorld(149.0, 99.0);
    const auto [r2, d2] = zero.pixelToWorld(49.0, 99.0);
    EXPECT_GT(r1, 359.9);
    EXPECT_LT(r1, 360.0);
    EXPECT_GE(r2, 0.0);
    EXPECT_LT(r2, 0.1);
    EXPECT_NEAR(d1, d2, 1e-12);
    EXPECT_THROW(wcs.pixelToWorld(std::vector<double>(3), std::vector<double>(2), std::span<double>(x),
                                  std::span<double>(y)),
                 InvalidInput);
}

TEST(WcsEdges, PixelScaleSummaryAndAlternates) {
    const FixtureCase& f = fixture("tan");
    const Wcs wcs = Wcs::fromHeader(f.header);
    // At the reference point a TAN's scale is sqrt|det CD|.
    EXPECT_NEAR(wcs.pixelScaleArcsec(1023.5, 767.5), 0.4, 1e-6);
    const std::string s = wcs.summary(f.width, f.height);
    EXPECT_NE(s.find("TAN"), std::string::npos) << s;
    EXPECT_NE(s.find("0.4000 arcsec/px"), std::string::npos) << s;
    // The CD matrix is a 30 deg rotation: +y points 30 deg from north (east of north or west of it).
    EXPECT_NE(s.find("30.00 deg"), std::string::npos) << s;
    EXPECT_NE(s.find("00:42:"), std::string::npos) << s; // M31 at RA 00h42m
    EXPECT_NE(s.find("+41:"), std::string::npos) << s;

    // Only an alternate description is celestial: it is used.
    Header alt;
    alt.set("CTYPE1", "LINEAR");
    alt.set("CTYPE2", "LINEAR");
    alt.set("CTYPE1A", "RA---TAN");
    alt.set("CTYPE2A", "DEC--TAN");
    alt.set("CRPIX1A", 10.0);
    alt.set("CRPIX2A", 10.0);
    alt.set("CRVAL1A", 20.0);
    alt.set("CRVAL2A", 30.0);
    alt.set("CD1_1A", -1e-4);
    alt.set("CD2_2A", 1e-4);
    const Wcs a = Wcs::fromHeader(alt);
    const auto [ra, dec] = a.pixelToWorld(9.0, 9.0);
    EXPECT_NEAR(ra, 20.0, 1e-12);
    EXPECT_NEAR(dec, 30.0, 1e-12);

    // A cube (RA, Dec, frequency): the celestial axes are extracted.
    Header cube = makeTanHeader(-1e-3, 0, 0, 1e-3);
    cube.set("NAXIS", 3);
    cube.set("CTYPE3", "FREQ");
    cube.set("CRPIX3", 1.0);
    cube.set("CRVAL3", 1.4e9);
    cube.set("CDELT3", 1e6);
    const Wcs c = Wcs::fromHeader(cube);
    EXPECT_EQ(c.projectionCode(), "TAN");
    const auto [cra, cdec] = c.pixelToWorld(99.0, 99.0);
    EXPECT_NEAR(cra, 150.0, 1e-12);
    EXPECT_NEAR(cdec, 2.0, 1e-12);
}

// ---------------------------------------------------------------------------------------------------
// Copies and threads.

TEST(WcsThreads, SharedObjectAndCopiesGiveIdenticalResults) {
    const FixtureCase& f = fixture("decam_tpv");
    const Wcs wcs = Wcs::fromHeader(f.header);
    std::vector<double> x, y;
    for (int i = 0; i < 3000; ++i) {
        x.push_back(std::fmod(i * 37.77, 280.0));
        y.push_back(std::fmod(i * 53.13, 375.0));
    }
    std::vector<double> refRa(x.size()), refDec(x.size()), refX(x.size()), refY(x.size());
    wcs.pixelToWorld(x, y, refRa, refDec);
    wcs.worldToPixel(refRa, refDec, refX, refY);

    const int nThreads = 6;
    std::vector<std::vector<double>> ra(nThreads, std::vector<double>(x.size())), dec = ra, bx = ra, by = ra;
    std::vector<std::thread> threads;
    for (int t = 0; t < nThreads; ++t)
        threads.emplace_back([&, t] {
            const bool ownCopy = t % 2 == 1;
            const Wcs copy = wcs; // copying concurrently with other threads' transforms is safe too
            const Wcs& use = ownCopy ? copy : wcs;
            for (int rep = 0; rep < 5; ++rep) {
                use.pixelToWorld(x, y, ra[t], dec[t]);
                use.worldToPixel(ra[t], dec[t], bx[t], by[t]);
            }
        });
    for (auto& th : threads)
        th.join();
    for (int t = 0; t < nThreads; ++t) {
        EXPECT_EQ(ra[t], refRa) << "thread " << t;
        EXPECT_EQ(dec[t], refDec) << "thread " << t;
        EXPECT_EQ(bx[t], refX) << "thread " << t;
        EXPECT_EQ(by[t], refY) << "thread " << t;
    }

    // Copy assignment and moves keep a working, independent object.
    Wcs other = Wcs::fromHeader(makeTanHeader(-1e-3, 0, 0, 1e-3));
    other = wcs;
    Wcs moved = std::move(other);
    const auto [r, d] = moved.pixelToWorld(x[5], y[5]);
    EXPECT_EQ(r, refRa[5]);
    EXPECT_EQ(d, refDec[5]);
}
