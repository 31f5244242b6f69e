// Colour-filter-array frames: pattern layout (BAYERPAT/FILTER, ROWORDER, XBAYROFF/YBAYROFF), 2x2
// super-pixels against known colour planes, mask propagation, instrument scaling, and the WCS of the
// binned frame (closed-form TAN-SIP and WCSLIB through headers) against the original; the PANOPTES
// Canon frame in tests/data/real.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/bayer.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/core/test_fields.hpp"

using namespace gpuphot;

namespace {

// Known planes on the super-pixel grid; two slightly different greens so that their mean is checked.
float planeValue(CfaColour c, int X, int Y, bool secondGreen) {
    switch (c) {
    case CfaColour::Red:
        return 100.0f + X + 0.5f * Y;
    case CfaColour::Green:
        return 2000.0f + 2.0f * Y + X + (secondGreen ? 8.0f : 0.0f);
    case CfaColour::Blue:
        return 30000.0f - X - Y;
    }
    return 0.0f;
}

// Mosaics the planes into a CFA frame following the layout's own rule, written independently here:
// the sensor row index of file row y is y (top-down) or height-1-y (bottom-up).
Image<float> mosaic(const std::string& pattern, bool topDown, int xoff, int yoff, int w, int h) {
    Image<float> img(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const int sy = topDown ? y : h - 1 - y;
            const char c = pattern[static_cast<std::size_t>(2 * ((sy + yoff) % 2) + (x + xoff) % 2)];
            const CfaColour col = c == 'R' ? CfaColour::Red : (c == 'G' ? CfaColour::Green : CfaColour::Blue);
            // The "second" green is the one in the upper file row of the cell.
            img(x, y) = planeValue(col, x / 2, y / 2, col == CfaColour::Green && (y % 2) == 1);
        }
    return img;
}

TanSip sampleSip() {
    TanSip t = test::rotatedTanSip(101.3, 80.6, 150.2, 35.4, 1.2, 0.4, 3);
    t.coeffA(2, 0) = 2e-5;
    t.coeffA(1, 1) = -1e-5;
    t.coeffA(0, 2) = 3e-6;
    t.coeffA(3, 0) = 4e-8;
    t.coeffA(1, 2) = -2e-8;
    t.coeffB(0, 2) = -1.5e-5;
    t.coeffB(2, 0) = 6e-6;
    t.coeffB(2, 1) = 3e-8;
    t.coeffB(0, 3) = -5e-8;
    return t;
}

std::string sharedData(const std::string& name) {
    return std::string(GPUPHOT_TEST_DATA) + "/real/" + name;
}

} // namespace

TEST(Bayer, LayoutFollowsRowOrderAndOffsets) {
    CfaLayout l;
    l.pattern = "RGGB";
    // Bottom-up (default): the sensor's top row is the file's last row.
    EXPECT_EQ(l.colourAt(0, 3, 4), CfaColour::Red);
    EXPECT_EQ(l.colourAt(1, 3, 4), CfaColour::Green);
    EXPECT_EQ(l.colourAt(0, 2, 4), CfaColour::Green);
    EXPECT_EQ(l.colourAt(1, 2, 4), CfaColour::Blue);
    EXPECT_EQ(l.colourAt(1, 0, 4), CfaColour::Blue);
    EXPECT_EQ(l.colourAt(0, 0, 5), CfaColour::Red); // odd height: the first row has the top row's phase
    l.topDown = true;
    EXPECT_EQ(l.colourAt(0, 0, 4), CfaColour::Red);
    EXPECT_EQ(l.colourAt(1, 1, 4), CfaColour::Blue);
    l.xOffset = 1;
    EXPECT_EQ(l.colourAt(0, 0, 4), CfaColour::Green);
    EXPECT_EQ(l.colourAt(1, 0, 4), CfaColour::Red);

    Header h;
    EXPECT_FALSE(cfaLayoutFromHeader(h).has_value());
    h.set("FILTER", "V");
    EXPECT_FALSE(cfaLayoutFromHeader(h).has_value());
    h.set("FILTER", " rggb ");
    ASSERT_TRUE(cfaLayoutFromHeader(h).has_value());
    EXPECT_EQ(cfaLayoutFromHeader(h)->pattern, "RGGB");
    EXPECT_FALSE(cfaLayoutFromHeader(h)->topDown);
    h.set("BAYERPAT", "GBRG");
    h.set("ROWORDER", "TOP-DOWN");
    h.set("XBAYROFF", 1);
    h.set("YBAYROFF", 1);
    auto l2 = cfaLayoutFromHeader(h);
    ASSERT_TRUE(l2.has_value());
    EXPECT_EQ(l2->pattern, "GBRG");
    EXPECT_TRUE(l2->topDown);
    EXPECT_EQ(l2->xOffset, 1);
    EXPECT_EQ(l2->yOffset, 1);
    BayerParams p;
    p.pattern = "bggr";
    p.rowOrder = "bottom-up";
    p.xOffset = 0;
    auto l3 = cfaLayoutFromHeader(h, p);
    EXPECT_EQ(l3->pattern, "BGGR");
    EXPECT_FALSE(l3->topDown);
    EXPECT_EQ(l3->xOffset, 0);
    EXPECT_EQ(l3->yOffset, 1);
    p.pattern = "RGBG";
    EXPECT_THROW(cfaLayoutFromHeader(h, p), InvalidInput);
    h.set("BAYERPAT", "XYZW");
    EXPECT_THROW(cfaLayoutFromHeader(h), InvalidInput);
    h.set("BAYERPAT", "RGGB");
    h.set("ROWORDER", "SIDEWAYS");
    EXPECT_THROW(cfaLayoutFromHeader(h), InvalidInput);
    h.remove("ROWORDER");
    h.set("CFAOUT", "lum"); // binned already
    EXPECT_FALSE(cfaLayoutFromHeader(h).has_value());
    EXPECT_THROW(parseCfaOutput("ir"), InvalidInput);
}

TEST(Bayer, SuperPixelsRecoverKnownPlanes) {
    RunContext ctx;
    ctx.threads = 1; // 160 tiny images: thread start-up would dominate
    const int w = 14, h = 10;
    for (const std::string pattern : {"RGGB", "BGGR", "GRBG", "GBRG"})
        for (bool topDown : {false, true})
            for (int xoff : {0, 1})
                for (int yoff : {0, 1}) {
                    SCOPED_TRACE(pattern + (topDown ? " top-down" : " bottom-up") + " xoff " +
                                 std::to_string(xoff) + " yoff " + std::to_string(yoff));
                    const Image<float> img =
                        mosaic(pattern, topDown, xoff, yoff, w + 1, h + 1); // odd: dropped
                    Header hd;
                    hd.set("BAYERPAT", pattern);
                    hd.set("ROWORDER", topDown ? "TOP-DOWN" : "BOTTOM-UP");
                    hd.set("XBAYROFF", xoff);
                    hd.set("YBAYROFF", yoff);
                    const CfaLayout layout = *cfaLayoutFromHeader(hd);
                    const Image<float> r = cfaSuperPixels(img.view(), layout, CfaOutput::Red, false, ctx);
                    const Image<float> g = cfaSuperPixels(img.view(), layout, CfaOutput::Green, false, ctx);
                    const Image<float> b = cfaSuperPixels(img.view(), layout, CfaOutput::Blue, false, ctx);
                    const Image<float> lum =
                        cfaSuperPixels(img.view(), layout, CfaOutput::Luminance, false, ctx);
                    const Image<float> lumMean =
                        cfaSuperPixels(img.view(), layout, CfaOutput::Luminance, true, ctx);
                    ASSERT_EQ(r.width(), w / 2);
                    ASSERT_EQ(r.height(), h / 2);
                    for (int Y = 0; Y < h / 2; ++Y)
                        for (int X = 0; X < w / 2; ++X) {
                            const float R = planeValue(CfaColour::Red, X, Y, false);
                            const float G1 = planeValue(CfaColour::Green, X, Y, false);
                            const float G2 = planeValue(CfaColour::Green, X, Y, true);
                            const float B = planeValue(CfaColour::Blue, X, Y, false);
                            ASSERT_EQ(r(X, Y), R);
                            ASSERT_EQ(b(X, Y), B);
                            ASSERT_EQ(g(X, Y), 0.5f * (G1 + G2));
                            ASSERT_NEAR(lum(X, Y), R + G1 + G2 + B, 1e-3);
                            ASSERT_NEAR(lumMean(X, Y), 0.25 * (R + G1 + G2 + B), 1e-3);
                        }
                }
    EXPECT_THROW(cfaSuperPixels(Image<float>(1, 5).view(), CfaLayout{}, CfaOutput::Red, false, ctx),
                 InvalidInput);
}

TEST(Bayer, MaskIsTheOrOfTheUsedPixels) {
    CfaLayout l; // RGGB bottom-up; 4 x 4 frame: file row 3 = R G, row 2 = G B
    Image<std::uint8_t> m(4, 4, std::uint8_t{0});
    m(0, 3) = MaskSaturated; // the red pixel of cell (0, 1)
    m(3, 0) = MaskBad;       // the green pixel of cell (1, 0) in file row 0 (G B row: x=2 G, x=3 B)
    const auto red = cfaSuperPixelMask(m.view(), l, CfaOutput::Red, 4, 4);
    const auto blue = cfaSuperPixelMask(m.view(), l, CfaOutput::Blue, 4, 4);
    const auto lum = cfaSuperPixelMask(m.view(), l, CfaOutput::Luminance, 4, 4);
    EXPECT_EQ(red(0, 1), MaskSaturated);
    EXPECT_EQ(blue(0, 1), 0);
    EXPECT_EQ(lum(0, 1), MaskSaturated);
    // File row 0 has sensor row 3 (odd): G B, so x = 3 is blue.
    EXPECT_EQ(blue(1, 0), MaskBad);
    EXPECT_EQ(red(1, 0), 0);
    EXPECT_EQ(lum(1, 0), MaskBad);
}

TEST(Bayer, BinnedTanSipMapsBinnedPixelsToTheSameSky) {
    const TanSip t = sampleSip();
    const TanSip b = binTanSip2x2(t);
    EXPECT_DOUBLE_EQ(b.crpix[0], (t.crpix[0] - 0.5) / 2 + 0.5);
    const Wcs orig = Wcs::fromTanSip(t);
    Header wh = orig.toHeader();
    binWcsHeader2x2(wh);
    const Wcs binnedLib = Wcs::fromHeader(wh);
    double worst = 0, worstLib = 0;
    for (int Y = 0; Y < 80; Y += 7)
        for (int X = 0; X < 100; X += 9) {
            double ra0, dec0, ra1, dec1;
            t.pixelToWorld(2.0 * X + 0.5, 2.0 * Y + 0.5, ra0, dec0);
            b.pixelToWorld(X, Y, ra1, dec1);
            worst = std::max(worst, angularSeparationDeg(ra0, dec0, ra1, dec1) * 3600);
            const auto [ra2, dec2] = orig.pixelToWorld(2.0 * X + 0.5, 2.0 * Y + 0.5);
            const auto [ra3, dec3] = binnedLib.pixelToWorld(X, Y);
            worstLib = std::max(worstLib, angularSeparationDeg(ra2, dec2, ra3, dec3) * 3600);
            // And back: the binned WCS puts the sky position at the binned pixel.
            const auto [x4, y4] = binnedLib.worldToPixel(ra2, dec2);
            EXPECT_NEAR(x4, X, 1e-6);
            EXPECT_NEAR(y4, Y, 1e-6);
        }
    EXPECT_LT(worst, 1e-6);    // arcsec
    EXPECT_LT(worstLib, 1e-6); // arcsec
    // The un-rescaled SIP would be off by arcseconds at the corners: the test can fail.
    TanSip naive = b;
    naive.a = t.a;
    naive.b = t.b;
    double ra0, dec0, ra1, dec1;
    t.pixelToWorld(0.5, 0.5, ra0, dec0);
    naive.pixelToWorld(0, 0, ra1, dec1);
    EXPECT_GT(angularSeparationDeg(ra0, dec0, ra1, dec1) * 3600, 0.05);
    // PC + CDELT headers: CDELT doubles, PC stays.
    Header pc;
    pc.set("CTYPE1", "RA---TAN");
    pc.set("CTYPE2", "DEC--TAN");
    pc.set("CRPIX1", 10.0);
    pc.set("CRPIX2", 20.0);
    pc.set("CDELT1", -1e-4);
    pc.set("CDELT2", 1e-4);
    pc.set("PC1_2", 0.1);
    binWcsHeader2x2(pc);
    EXPECT_DOUBLE_EQ(*pc.getDouble("CRPIX1"), 5.25);
    EXPECT_DOUBLE_EQ(*pc.getDouble("CRPIX2"), 10.25);
    EXPECT_DOUBLE_EQ(*pc.getDouble("CDELT1"), -2e-4);
    EXPECT_DOUBLE_EQ(*pc.getDouble("PC1_2"), 0.1);
}

// A star on a CFA frame: its centroid on the binned luminance image, through the binned WCS, gives the
// same RA/Dec as its true position through the original WCS.
TEST(Bayer, StarKeepsItsSkyPositionThroughBinCfaFrame) {
    const TanSip t = sampleSip();
    Frame f;
    f.pixels = Image<float>(200, 160, 0.0f);
    f.mask = Image<std::uint8_t>(200, 160, std::uint8_t{0});
    f.header = Wcs::fromTanSip(t).toHeader();
    f.header.set("BAYERPAT", "RGGB");
    f.header.set("GAIN", 1.6);
    f.header.set("RDNOISE", 7.0);
    f.header.set("SATURATE", 16000.0);
    f.wcs = std::make_shared<const Wcs>(Wcs::fromHeader(f.header));
    f.instrument = readInstrument(f.header);
    const double sx = 123.37, sy = 61.81, sig = 2.2; // 0-based original pixels
    for (int y = 0; y < 160; ++y)
        for (int x = 0; x < 200; ++x)
            f.pixels(x, y) = static_cast<float>(
                10.0 + 5000.0 * std::exp(-0.5 * ((x - sx) * (x - sx) + (y - sy) * (y - sy)) / (sig * sig)));
    RunContext ctx;
    BayerParams p;
    const Frame b = binCfaFrame(f, p, ctx);
    ASSERT_EQ(b.width(), 100);
    ASSERT_EQ(b.height(), 80);
    ASSERT_TRUE(b.wcs);
    double s = 0, mx = 0, my = 0;
    for (int Y = 0; Y < 80; ++Y)
        for (int X = 0; X < 100; ++X) {
            const double v = b.pixels(X, Y) - 40.0; // sum of four pixels of 10 ADU sky
            if (std::hypot(X - sx / 2, Y - sy / 2) > 8) continue;
            s += v;
            mx += v * X;
            my += v * Y;
        }
    mx /= s;
    my /= s;
    const auto [ra0, dec0] = f.wcs->pixelToWorld(sx, sy);
    const auto [ra1, dec1] = b.wcs->pixelToWorld(mx, my);
    EXPECT_LT(angularSeparationDeg(ra0, dec0, ra1, dec1) * 3600, 0.01 * 2.4); // 0.01 binned px
    // The same through the header that would be written with the binned frame.
    const Wcs fromHeader = Wcs::fromHeader(b.header);
    const auto [ra2, dec2] = fromHeader.pixelToWorld(mx, my);
    EXPECT_LT(angularSeparationDeg(ra1, dec1, ra2, dec2) * 3600, 1e-6);

    // Instrument: luminance sum keeps the gain, doubles the read noise, saturation x 4; header rewritten.
    EXPECT_DOUBLE_EQ(b.instrument.gain, 1.6);
    EXPECT_DOUBLE_EQ(b.instrument.readNoise, 14.0);
    EXPECT_DOUBLE_EQ(b.instrument.saturation, 64000.0);
    EXPECT_DOUBLE_EQ(*b.header.getDouble("RDNOISE"), 14.0);
    EXPECT_FALSE(b.header.has("BAYERPAT"));
    EXPECT_EQ(*b.header.getString("CFAOUT"), "lum");
    EXPECT_THROW(binCfaFrame(b, p, ctx), InvalidInput); // binned already: no pattern left
    p.luminanceMean = true;
    const Frame m = binCfaFrame(f, p, ctx);
    EXPECT_DOUBLE_EQ(m.instrument.gain, 6.4);
    EXPECT_DOUBLE_EQ(m.instrument.readNoise, 14.0);
    EXPECT_DOUBLE_EQ(m.instrument.saturation, 16000.0);
    p.output = "g";
    const Frame g = binCfaFrame(f, p, ctx);
    EXPECT_DOUBLE_EQ(g.instrument.gain, 3.2);
    EXPECT_NEAR(g.instrument.readNoise, 7.0 * std::sqrt(2.0), 1e-12);
    p.output = "r";
    const Frame r = binCfaFrame(f, p, ctx);
    EXPECT_DOUBLE_EQ(r.instrument.gain, 1.6);
    EXPECT_DOUBLE_EQ(r.instrument.readNoise, 7.0);
    EXPECT_DOUBLE_EQ(r.instrument.saturation, 16000.0);
}

// The PANOPTES Canon frame (FILTER = 'RGGB', no ROWORDER): the pixels that the default (bottom-up)
// reading calls green have equal levels and are the brightest, and red is the faintest (the camera's
// white balance multiplies red most: REDBAL > BLUEBAL); the top-down reading would not pair the greens.
TEST(Bayer, PanoptesFrameColoursAndWcs) {
    const std::string path = sharedData("panoptes_solved.fits.fz");
    if (!std::filesystem::exists(path)) FAIL() << "test data missing: " << path;
    const Frame f = readFrame(path);
    ASSERT_TRUE(f.wcs);
    auto layout = cfaLayoutFromHeader(f.header);
    ASSERT_TRUE(layout.has_value());
    EXPECT_EQ(layout->pattern, "RGGB");
    EXPECT_FALSE(layout->topDown);
    ASSERT_GT(*f.header.getDouble("REDBAL"), *f.header.getDouble("BLUEBAL"));

    auto phaseMedian = [&](int dx, int dy) {
        std::vector<float> v;
        for (int y = dy; y < f.height(); y += 2)
            for (int x = dx; x < f.width(); x += 2)
                v.push_back(f.pixels(x, y));
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return double(v[v.size() / 2]);
    };
    double level[3] = {0, 0, 0}, greens[2];
    int ng = 0;
    for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx) {
            const double m = phaseMedian(dx, dy);
            const CfaColour c = layout->colourAt(dx, dy, f.height());
            if (c == CfaColour::Green)
                greens[ng++] = m;
            else
                level[static_cast<int>(c)] = m;
        }
    ASSERT_EQ(ng, 2);
    const double black = 2048.0; // Canon raw black level
    std::printf("[bayer] PANOPTES phase medians above %g: R %.1f, G %.1f / %.1f, B %.1f\n", black,
                level[0] - black, greens[0] - black, greens[1] - black, level[2] - black);
    EXPECT_LT(std::fabs(greens[0] - greens[1]), 0.02 * (greens[0] - black));
    EXPECT_GT(std::min(greens[0], greens[1]), level[2]);
    EXPECT_GT(level[2], level[0]); // blue above red
    // The other reading pairs two unequal phases as "green".
    CfaLayout wrong = *layout;
    wrong.topDown = true;
    double wg[2];
    int nw = 0;
    for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx)
            if (wrong.colourAt(dx, dy, f.height()) == CfaColour::Green) wg[nw++] = phaseMedian(dx, dy);
    EXPECT_GT(std::fabs(wg[0] - wg[1]), 0.1 * (std::max(wg[0], wg[1]) - black));

    // Binned frame and its WCS (TAN-SIP from astrometry.net) against the original on a grid.
    RunContext ctx;
    const Frame b = binCfaFrame(f, {}, ctx);
    ASSERT_EQ(b.width(), 350);
    ASSERT_TRUE(b.wcs);
    EXPECT_NEAR(b.wcs->pixelScaleArcsec(175, 175), 2 * f.wcs->pixelScaleArcsec(350.5, 350.5), 0.05);
    double worst = 0;
    for (int Y = 0; Y < 350; Y += 29)
        for (int X = 0; X < 350; X += 31) {
            const auto [ra0, dec0] = f.wcs->pixelToWorld(2.0 * X + 0.5, 2.0 * Y + 0.5);
            const auto [ra1, dec1] = b.wcs->pixelToWorld(X, Y);
            worst = std::max(worst, angularSeparationDeg(ra0, dec0, ra1, dec1) * 3600);
        }
    EXPECT_LT(worst, 1e-4); // arcsec (the pixels are 10 arcsec)
}
