// SExtractor catalogs from gpuphot's results (core/pipeline/sextractor_catalog.hpp) and the FITS_LDAC
// writer (core/io/fits_ldac.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_ldac.hpp"
#include "core/io/fits_table.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/pipeline/sextractor_catalog.hpp"
#include "core/pipeline/sextractor_window.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
using gpuphot::test::TempDir;

namespace {

struct Field {
    TempDir dir{"gpuphot_sexcat"};
    Frame frame;
    PipelineConfig config;
    PipelineResult result;
    Table catalog;
};

// A 320x320 field of Moffat (beta 3) stars of FWHM 3 px, reduced once.
Field& field() {
    static const std::unique_ptr<Field> f = [] {
        auto owned = std::make_unique<Field>();
        Field& g = *owned;
        SimParams p;
        p.width = 320;
        p.height = 320;
        p.stars = 90;
        p.seed = 21;
        p.magBright = 13.0;
        p.magFaint = 18.0;
        p.fwhm = 3.0;
        p.moffatBeta = 3.0;
        writeSimulation(simulateField(p), g.dir.str(), "f", -32);
        g.frame = readFrame(g.dir / "f.fits");
        g.config.aperture.radii = {2.0, 4.0, 6.0};
        g.config.aperture.radiiInFwhm = false;
        RunContext ctx;
        g.result = runPipeline(g.frame, g.config, ctx);
        g.catalog = buildCatalog(g.frame, g.result, g.config, nullptr);
        return owned;
    }();
    return *f;
}

SextractorCatalogOptions optionsFor(const std::string& params) {
    SextractorCatalogOptions o;
    o.params = parseSextractorParams(params, "test.param");
    return o;
}

const LdacColumn& column(const std::vector<LdacColumn>& cols, const std::string& name) {
    const auto it =
        std::find_if(cols.begin(), cols.end(), [&](const LdacColumn& c) { return c.name == name; });
    if (it == cols.end()) throw std::runtime_error("no column " + name);
    return *it;
}

std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v[v.size() / 2];
}

} // namespace

TEST(SextractorParams, ParsesNamesAndSizes) {
    const auto p =
        parseSextractorParams("# comment\nNUMBER\n  FLUX_APER(3)  # three\n\nVIGNET(35, 25)\n", "x");
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[0].text(), "NUMBER");
    EXPECT_EQ(p[1].dims, std::vector<long>{3});
    EXPECT_EQ(p[2].dims, (std::vector<long>{35, 25}));
    for (const char* bad :
         {"flux_auto\n", "FLUX_APER(\n", "FLUX_APER(0)\n", "VIGNET(3,3,3)\n", "X_IMAGE junk(\n"})
        EXPECT_THROW(parseSextractorParams(bad, "x"), InvalidInput) << bad;
    EXPECT_THROW(readSextractorParams("/nonexistent/default.param"), InvalidInput);
}

TEST(SextractorCatalog, ColumnsFollowSextractorsDefinitions) {
    Field& f = field();
    SextractorCatalogOptions o = optionsFor("NUMBER\nX_IMAGE\nXWIN_IMAGE\nFLUX_AUTO\nMAG_AUTO\nMAGERR_AUTO\n"
                                            "FLUX_APER(3)\nMAG_APER(2)\nFLUX_RADIUS\nFWHM_IMAGE\nELONGATION\n"
                                            "THETA_IMAGE\nFLAGS\nALPHA_J2000\n");
    o.magZeropoint = 25.0;
    const auto cols = sextractorColumns(f.frame, f.result, f.catalog, o);
    const std::size_t n = f.catalog.rows();
    ASSERT_GT(n, 40u);
    const std::vector<double> fluxAuto = f.catalog.doubles("flux_auto"), xIso = f.catalog.doubles("x_iso"),
                              ap3 = f.catalog.doubles("flux_aper_3"), flags = f.catalog.doubles("flags");
    const LdacColumn &mag = column(cols, "MAG_AUTO"), &aper = column(cols, "FLUX_APER"),
                     &x = column(cols, "X_IMAGE");
    EXPECT_EQ(aper.repeat(), 3);
    EXPECT_EQ(column(cols, "MAG_APER").repeat(), 2);
    EXPECT_EQ(column(cols, "NUMBER").j.back(), static_cast<std::int32_t>(n));
    for (std::size_t i = 0; i < n; ++i) {
        EXPECT_DOUBLE_EQ(x.d[i], xIso[i]) << "X_IMAGE is the isophotal barycentre, 1-based";
        EXPECT_FLOAT_EQ(aper.e[3 * i + 2], static_cast<float>(ap3[i]));
        if (fluxAuto[i] > 0)
            EXPECT_NEAR(mag.e[i], 25.0 - 2.5 * std::log10(fluxAuto[i]), 1e-4);
        else
            EXPECT_EQ(mag.e[i], 99.0f) << "SExtractor's magnitude of a non-positive flux";
        const auto bits = static_cast<std::uint32_t>(flags[i]);
        const auto sexFlags = static_cast<std::uint32_t>(column(cols, "FLAGS").i[i]);
        EXPECT_EQ(sexFlags & 14u, bits & 14u) << "bits 2..8 shared (1 is SExtractor's CROWDED rule)";
        if (bits & 16u) {
            EXPECT_TRUE(sexFlags & 16u) << "16 shared, and set where an AUTO box leaves the frame";
        }
        EXPECT_GT(column(cols, "THETA_IMAGE").e[i], -90.0001f);
        EXPECT_LE(column(cols, "THETA_IMAGE").e[i], 90.0f);
    }
    // The half-light radius of a Moffat profile (beta 3, FWHM 3): alpha sqrt(2^(1/(beta-1)) - 1).
    const double alpha = 3.0 / (2.0 * std::sqrt(std::pow(2.0, 1.0 / 3.0) - 1.0));
    const double r50 = alpha * std::sqrt(std::sqrt(2.0) - 1.0);
    std::vector<double> radius, fwhm;
    const std::vector<double> err = f.catalog.doubles("fluxerr_auto");
    for (std::size_t i = 0; i < n; ++i)
        if (column(cols, "FLAGS").i[i] == 0 && fluxAuto[i] > 50 * err[i]) {
            radius.push_back(column(cols, "FLUX_RADIUS").e[i]);
            fwhm.push_back(column(cols, "FWHM_IMAGE").e[i]);
        }
    ASSERT_GT(radius.size(), 10u);
    EXPECT_NEAR(median(radius), r50, 0.05 * r50) << "FLUX_RADIUS of isolated bright stars";
    EXPECT_NEAR(median(fwhm), 3.0, 0.3) << "FWHM_IMAGE: the area above half the peak";
}

TEST(SextractorCatalog, VignetIsCentredAndBlankOffTheFrame) {
    Field& f = field();
    const auto cols = sextractorColumns(f.frame, f.result, f.catalog, optionsFor("VIGNET(15,11)\n"));
    const LdacColumn& v = column(cols, "VIGNET");
    ASSERT_EQ(v.dims, (std::vector<long>{15, 11}));
    const std::vector<double> x = f.catalog.doubles("x_iso"), y = f.catalog.doubles("y_iso"),
                              peak = f.catalog.doubles("peak");
    const std::size_t brightest =
        static_cast<std::size_t>(std::max_element(peak.begin(), peak.end()) - peak.begin());
    const float* cut = v.e.data() + brightest * 165;
    EXPECT_EQ(std::max_element(cut, cut + 165) - cut, 5 * 15 + 7) << "the peak at the vignet's centre";
    EXPECT_NEAR(cut[5 * 15 + 7], peak[brightest], 1e-3 * peak[brightest]) << "background-subtracted pixels";
    bool sawBlank = false;
    for (std::size_t i = 0; i < f.catalog.rows(); ++i)
        if (x[i] < 7 || y[i] < 5) { // within half a vignet of the frame's first column or row
            const float* c = v.e.data() + i * 165;
            EXPECT_EQ(c[0], -1e30f) << "off-frame pixels are SExtractor's -1e30";
            sawBlank = true;
        }
    EXPECT_TRUE(sawBlank) << "no object near the edge: the check did not run";
}

TEST(SextractorCatalog, RefusesWhatItCannotGive) {
    Field& f = field();
    auto refusal = [&](const std::string& params, const std::string& type = "FITS_LDAC") {
        SextractorCatalogOptions o = optionsFor(params);
        o.type = type;
        try {
            (void)sextractorColumns(f.frame, f.result, f.catalog, o);
        } catch (const InvalidInput& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(refusal("CLASS_STAR\n").find("CLASS_STAR: gpuphot has no star/galaxy classifier"),
              std::string::npos);
    EXPECT_NE(refusal("FLUX_APER(4)\n").find("gives 3"), std::string::npos) << "three apertures in the run";
    EXPECT_NE(refusal("NUMBER(2)\n").find("takes no size"), std::string::npos);
    EXPECT_NE(refusal("NUMBER\n", "VOTABLE").find("CATALOG_TYPE VOTABLE"), std::string::npos);
    EXPECT_EQ(refusal("FLUX_APER(3)\n"), "");
}

TEST(SextractorCatalog, LdacHoldsTheImageHeaderAndTheObjects) {
    Field& f = field();
    SextractorCatalogOptions o = optionsFor("NUMBER\nXWIN_IMAGE\nFLUX_APER(2)\nVIGNET(5,5)\n");
    o.type = "FITS_LDAC";
    const std::string path = f.dir / "t.ldac";
    writeSextractorCatalog(path, f.frame, f.result, f.catalog, o);
    const Table objects = readFitsTable(path, "LDAC_OBJECTS");
    ASSERT_EQ(objects.rows(), f.catalog.rows());
    // SExtractor's window (sextractor_window.hpp), near gpuphot's own windowed centroid
    const std::vector<double> xwin = objects.doubles("XWIN_IMAGE"), x = f.catalog.doubles("x");
    std::vector<double> dx;
    for (std::size_t i = 0; i < x.size(); ++i)
        dx.push_back(std::fabs(xwin[i] - x[i]));
    std::nth_element(dx.begin(), dx.begin() + dx.size() / 2, dx.end());
    EXPECT_LT(dx[dx.size() / 2], 0.02);
    EXPECT_EQ(objects.at("XWIN_IMAGE").unit, "pixel");
    EXPECT_EQ(objects.find("VIGNET"), nullptr) << "an array column (the reader skips them)";
    const std::string bytes = slurp(path);
    EXPECT_NE(bytes.find("EXTNAME = 'LDAC_IMHEAD'"), std::string::npos);
    EXPECT_NE(bytes.find("TDIM1   = '(80, "), std::string::npos);
    EXPECT_NE(bytes.find("TDIM4   = '(5, 5)"), std::string::npos);
    // The frame's cards as 80-character records inside the table data, the SExtractor keywords PSFEx reads
    // among them, and END.
    for (const char* card :
         {"NAXIS1  =                  320", "CRVAL1  =", "SEXBKDEV=", "SIMSEED =", "END     "})
        EXPECT_NE(bytes.find(card), std::string::npos) << card;
}

TEST(SextractorCatalog, AsciiHeadNumbersTheColumns) {
    Field& f = field();
    SextractorCatalogOptions o = optionsFor("NUMBER\nFLUX_APER(3)\nFLAGS\n");
    o.type = "ASCII_HEAD";
    const std::string path = f.dir / "t.cat";
    writeSextractorCatalog(path, f.frame, f.result, f.catalog, o);
    std::ifstream in(path);
    std::string l1, l2, l3, row;
    std::getline(in, l1);
    std::getline(in, l2);
    std::getline(in, l3);
    std::getline(in, row);
    EXPECT_EQ(l1.rfind("#   1 NUMBER ", 0), 0u) << l1;
    EXPECT_EQ(l2.rfind("#   2 FLUX_APER ", 0), 0u) << l2;
    EXPECT_NE(l2.find("[count]"), std::string::npos) << l2;
    EXPECT_EQ(l3.rfind("#   5 FLAGS ", 0), 0u) << "a vector of 3 takes numbers 2..4: " << l3;
    std::istringstream fields(row);
    int number = 0;
    double a1 = 0;
    fields >> number >> a1;
    EXPECT_EQ(number, 1);
    EXPECT_NEAR(a1, f.catalog.doubles("flux_aper_1")[0], 1e-6 * std::abs(a1) + 1e-6);
}

// SExtractor's windowed centroid of a Gaussian star: the true centre, the window-weighted flux of a Gaussian
// (F / (1 + s^2/w^2) for star sigma s and window sigma w, all of it inside 4 w), and errors that scale
// with the noise; a masked pixel is replaced by its mirror through the centre.
TEST(SextractorWindow, GaussianStarGivesItsCentreFluxAndErrors) {
    const int w = 64, h = 64;
    const double cx = 31.37, cy = 30.81, s = 1.5, flux = 10000.0;
    std::vector<double> img(static_cast<std::size_t>(w * h));
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const double r2 = (x - cx) * (x - cx) + (y - cy) * (y - cy);
            img[static_cast<std::size_t>(y * w + x)] = flux / (2 * M_PI * s * s) * std::exp(-0.5 * r2 / (s * s));
        }
    double sigma = 2.0;
    int masked = -1;
    const WindowPixel pixel = [&](int x, int y, double& v, double& var) {
        v = img[static_cast<std::size_t>(y * w + x)];
        var = sigma * sigma;
        return y * w + x != masked;
    };
    const double hl = s * std::sqrt(2.0 * std::log(2.0)); // a Gaussian's half-light radius
    const SextractorWindow a = sextractorWindow(pixel, w, h, 31.0, 31.0, hl, 0.0);
    EXPECT_NEAR(a.x, cx, 0.002);
    EXPECT_NEAR(a.y, cy, 0.002);
    const double ws = hl * 2.0 / 2.35;
    EXPECT_NEAR(a.flux, flux / (1.0 + s * s / (ws * ws)), 0.01 * flux);
    EXPECT_GT(a.errA, 0.0);
    EXPECT_GE(a.errA, a.errB);
    EXPECT_FALSE(a.truncated);
    sigma = 4.0;
    const SextractorWindow b = sextractorWindow(pixel, w, h, 31.0, 31.0, hl, 0.0);
    EXPECT_NEAR(b.fluxErr / a.fluxErr, 2.0, 1e-9);
    EXPECT_NEAR(b.errA / a.errA, 2.0, 1e-6);
    masked = 31 * w + 30; // a pixel next to the peak: its mirror stands in
    const SextractorWindow c = sextractorWindow(pixel, w, h, 31.0, 31.0, hl, 0.0);
    EXPECT_NEAR(c.x, cx, 0.05);
    EXPECT_NEAR(c.flux, b.flux, 0.02 * flux);
    const SextractorWindow e = sextractorWindow(pixel, w, h, 1.0, 30.0, hl, 0.0);
    EXPECT_TRUE(e.truncated) << "a window at the frame's edge";
}
