// The panels' Qt-free data extraction (ui/panel_data) on a simulated frame reduced with its reference
// catalog, checked against the simulation's truth and against independent computations from the
// stages' raw results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>

#include "core/model/flags.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/aperture/aperture_overlap.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/ui/panel_fixture.hpp"
#include "ui/panel_data.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;
using gpuphot::test::panelFixture;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

} // namespace

TEST(PanelData, ZeroPointPointsMatchTheFitAndTheTruth) {
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    const ZeroPointResult& z = s.result.zeropoint;
    ASSERT_TRUE(z.ok) << z.message;
    const ZeroPointPlotData d = zeroPointPlotData(s);
    ASSERT_TRUE(d.available) << d.why;
    EXPECT_EQ(static_cast<int>(d.used.size()), z.nUsed);
    EXPECT_EQ(static_cast<int>(d.used.size() + d.clipped.size()), z.nCandidates);
    EXPECT_TRUE(d.colourTermFitted);
    EXPECT_TRUE(d.hasColour);
    // Independently: ref.mag - mag_inst from the crossmatch and the instrumental magnitudes; the fit's
    // residual is that minus (zp + ct colour).
    for (const ZeroPointPoints* p : {&d.used, &d.clipped})
        for (std::size_t k = 0; k < p->size(); ++k) {
            const int i = p->sourceIndex[k];
            const int ri = s.result.crossmatch.refIndex[i];
            ASSERT_GE(ri, 0);
            EXPECT_DOUBLE_EQ(p->refMag[k], s.reference->mag[ri]);
            EXPECT_NEAR(p->offsetRaw[k], s.reference->mag[ri] - s.result.magInst[i], 1e-12);
            EXPECT_NEAR(p->offsetRaw[k] - z.zp - z.colourTerm * p->colour[k], p->residual[k], 1e-9);
            EXPECT_NEAR(p->offset[k], p->offsetRaw[k] - z.colourTerm * p->colour[k], 1e-12);
        }
    // Against the truth: the stars' own zero points (colour term removed with the true one) centre on SIMZP.
    const double zpTrue = *f.sim.header.getDouble("SIMZP");
    std::vector<double> own;
    for (std::size_t k = 0; k < d.used.size(); ++k)
        own.push_back(d.used.offsetRaw[k] - f.sim.params.colourTerm * d.used.colour[k]);
    EXPECT_NEAR(median(own), zpTrue, 0.02);
    EXPECT_NE(d.summary.find("of"), std::string::npos);
}

TEST(PanelData, ZeroPointEmptyStatesSayWhy) {
    const auto& f = panelFixture();
    const ZeroPointPlotData d = zeroPointPlotData(*f.noReference);
    EXPECT_FALSE(d.available);
    EXPECT_EQ(d.why, "no reference catalog");
    const AstrometryPlotData a = astrometryPlotData(*f.noReference);
    EXPECT_FALSE(a.available);
    EXPECT_EQ(a.why, "no reference catalog");
    const AstrometryPlotData off = astrometryPlotData(*f.noAstrometry);
    EXPECT_FALSE(off.available);
    EXPECT_NE(off.why.find("astrometry did not run"), std::string::npos) << off.why;
    // the zero point still runs with the header WCS
    EXPECT_TRUE(zeroPointPlotData(*f.noAstrometry).available);
}

TEST(PanelData, AstrometryResidualsMatchAnIndependentProjection) {
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    const AstrometryResult& a = s.result.astrometry;
    ASSERT_TRUE(a.ok) << a.message;
    const AstrometryPlotData d = astrometryPlotData(s);
    ASSERT_TRUE(d.available) << d.why;
    EXPECT_EQ(static_cast<int>(d.used.size()), a.nUsed);
    EXPECT_EQ(d.used.size() + d.clipped.size(), a.sourceIndex.size());
    EXPECT_EQ(d.width, f.sim.params.width);
    const Wcs fitted = Wcs::fromTanSip(a.wcs);
    const double scale = a.wcs.pixelScaleArcsec();
    std::size_t checked = 0;
    for (const AstrometryPoints* p : {&d.used, &d.clipped})
        for (std::size_t k = 0; k < p->size(); ++k) {
            const int i = p->sourceIndex[k];
            EXPECT_DOUBLE_EQ(p->x[k], s.result.detection.sources.x[i]);
            // the reference star of this match, found again by its residual entry
            std::size_t m = 0;
            while (m < a.sourceIndex.size() && a.sourceIndex[m] != i)
                ++m;
            ASSERT_LT(m, a.sourceIndex.size());
            const int ri = a.refIndex[m];
            const auto [ra, dec] = fitted.pixelToWorld(p->x[k], p->y[k]);
            const double dRa = (ra - s.reference->ra[ri]) * std::cos(dec * M_PI / 180.0) * 3600.0;
            const double dDec = (dec - s.reference->dec[ri]) * 3600.0;
            EXPECT_NEAR(p->dRa[k], dRa, 2e-3);
            EXPECT_NEAR(p->dDec[k], dDec, 2e-3);
            // pixel vectors have the same length (pixel scale) as the sky residuals
            EXPECT_NEAR(std::hypot(p->dxPx[k], p->dyPx[k]) * scale, std::hypot(dRa, dDec),
                        0.02 * std::hypot(dRa, dDec) + 2e-3);
            ++checked;
        }
    EXPECT_GT(checked, 20u);
    const double k = autoVectorExaggeration(d);
    EXPECT_GT(k, 1.0);
    // a round number: 1, 2 or 5 times a power of ten
    const double mant = k / std::pow(10.0, std::floor(std::log10(k) + 1e-12));
    EXPECT_TRUE(std::fabs(mant - 1) < 1e-9 || std::fabs(mant - 2) < 1e-9 || std::fabs(mant - 5) < 1e-9) << k;
}

TEST(PanelData, SnrIsFluxOverErrorAndTheLimitLiesWhereSnrIsFive) {
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    const SnrPlotData d = snrPlotData(s);
    ASSERT_TRUE(d.available) << d.why;
    EXPECT_TRUE(d.calibrated);
    const ApertureResult& ap = s.result.aperture;
    std::size_t expected = 0;
    for (std::size_t i = 0; i < ap.fluxOpt.size(); ++i)
        expected += ap.fluxOpt[i] > 0 && ap.fluxOptErr[i] > 0;
    EXPECT_EQ(d.mag.size(), expected);
    for (std::size_t k = 0; k < d.mag.size(); ++k) {
        const int i = d.sourceIndex[k];
        EXPECT_NEAR(d.snr[k], ap.fluxOpt[i] / ap.fluxOptErr[i], 1e-9 * d.snr[k]);
    }
    ASSERT_TRUE(std::isfinite(d.limitingMag));
    EXPECT_DOUBLE_EQ(d.limitingMag, s.result.zeropoint.limitingMag);
    // Independent: the faintest sources (5.5 <= S/N <= 8, detection stops near 6) scaled to S/N 5 as
    // sky-limited stars (S/N ∝ flux), median.
    std::vector<double> near5;
    for (std::size_t k = 0; k < d.mag.size(); ++k)
        if (d.snr[k] >= 5.5 && d.snr[k] <= 8.0) near5.push_back(d.mag[k] + 2.5 * std::log10(d.snr[k] / 5.0));
    ASSERT_GE(near5.size(), 5u);
    EXPECT_NEAR(d.limitingMag, median(near5), 0.3);
    // without calibration the magnitudes are instrumental and the limit is computed from them
    const SnrPlotData u = snrPlotData(*f.noReference);
    ASSERT_TRUE(u.available);
    EXPECT_FALSE(u.calibrated);
    EXPECT_NEAR(u.limitingMag, d.limitingMag - (d.mag[0] - u.mag[0]), 1e-9);
}

// The worker's lean result (no full-resolution maps, the sampler instead) gives the same map, value for value.
TEST(PanelData, BackgroundMapFromTheSamplerEqualsTheFullMap) {
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    RunContext ctx;
    PipelineResult lean; // keepFullMaps false: mesh grid + sampler
    runPipeline(*s.frame, s.config, ctx, lean, Stage::Background, nullptr);
    ASSERT_TRUE(lean.background.level.empty());
    ASSERT_TRUE(lean.background.sampler);
    const MapData a = backgroundMap(s.result.background, 100), b = backgroundMap(lean.background, 100);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(a.nx, b.nx);
    EXPECT_EQ(a.ny, b.ny);
    EXPECT_EQ(a.dx, b.dx);
    EXPECT_EQ(a.x0, b.x0);
    ASSERT_EQ(a.values.size(), b.values.size());
    for (std::size_t k = 0; k < a.values.size(); ++k) ASSERT_EQ(a.values[k], b.values[k]) << k;
}

TEST(PanelData, BackgroundMapSamplesTheLevelMap) {
    const auto& f = panelFixture();
    const BackgroundResult& b = f.calibrated->result.background;
    const MapData m = backgroundMap(b, 100);
    ASSERT_FALSE(m.empty());
    const int block = static_cast<int>(m.dx);
    EXPECT_LE(std::max(m.nx, m.ny), 100);
    EXPECT_EQ(m.nx, (b.level.width() + block - 1) / block);
    for (auto [i, j] : {std::pair{0, 0}, std::pair{m.nx / 2, m.ny / 3}, std::pair{m.nx - 1, m.ny - 1}}) {
        // the block's centre pixel, clamped to the frame
        const int x = std::min(b.level.width() - 1, i * block + block / 2);
        const int y = std::min(b.level.height() - 1, j * block + block / 2);
        EXPECT_FLOAT_EQ(static_cast<float>(m.at(i, j)), b.level(x, y));
        // and close to the block's mean (the map is smooth)
        double sum = 0;
        int n = 0;
        for (int yy = j * block; yy < std::min(b.level.height(), (j + 1) * block); ++yy)
            for (int xx = i * block; xx < std::min(b.level.width(), (i + 1) * block); ++xx, ++n)
                sum += b.level(xx, yy);
        EXPECT_NEAR(m.at(i, j), sum / n, 0.5);
    }
    // against the simulation's sky: the level within 3% (faint unresolved stars raise it a little) and
    // the gradient of 40 ADU across x within 3 ADU
    const int j = m.ny / 2, i0 = 1, i1 = m.nx - 2;
    for (int i : {i0, m.nx / 2, i1})
        EXPECT_NEAR(m.at(i, j), simSkyAt(f.sim.params, m.xCentre(i), m.yCentre(j)), 0.03 * m.at(i, j));
    EXPECT_NEAR(m.at(i1, j) - m.at(i0, j),
                simSkyAt(f.sim.params, m.xCentre(i1), m.yCentre(j)) -
                    simSkyAt(f.sim.params, m.xCentre(i0), m.yCentre(j)),
                3.0);
    EXPECT_LT(m.minValue, m.maxValue);
}

TEST(PanelData, PsfMapsFollowTheSimulatedPsf) {
    const auto& f = panelFixture();
    const PsfResult& psf = f.calibrated->result.psf;
    ASSERT_TRUE(psf.hasModel());
    const MapData m = psfFieldMap(psf, PsfMapKind::Fwhm, 8, 7);
    ASSERT_EQ(m.nx, 8);
    ASSERT_EQ(m.ny, 7);
    // The cells are the model evaluated at their centres; the model follows the simulated PSF on average
    // (with the few PSF stars of this small field the polynomial is of low order: no cell-wise check).
    double sumModel = 0, sumTruth = 0;
    for (int j = 0; j < m.ny; ++j)
        for (int i = 0; i < m.nx; ++i) {
            EXPECT_DOUBLE_EQ(m.at(i, j), psf.fwhmAt(m.xCentre(i), m.yCentre(j)));
            sumModel += m.at(i, j);
            sumTruth += simPsfAt(f.sim.params, m.xCentre(i), m.yCentre(j)).fwhm;
        }
    EXPECT_NEAR(sumModel / (m.nx * m.ny), sumTruth / (m.nx * m.ny), 0.05 * sumTruth / (m.nx * m.ny));
    const MapData e = psfFieldMap(psf, PsfMapKind::Ellipticity, 4, 4);
    for (int j = 0; j < e.ny; ++j)
        for (int i = 0; i < e.nx; ++i)
            EXPECT_DOUBLE_EQ(e.at(i, j), psf.ellipticityAt(e.xCentre(i), e.yCentre(j)));
}

TEST(PanelData, EpsfCellAndRadialProfile) {
    const auto& f = panelFixture();
    const PsfResult& psf = f.calibrated->result.psf;
    ASSERT_FALSE(psf.epsf.empty());
    for (auto [x, y] : {std::pair{10.0, 10.0}, std::pair{1000.0, 30.0}, std::pair{512.0, 450.0},
                        std::pair{1020.0, 890.0}}) {
        const int c = nearestEpsfCell(psf, x, y);
        ASSERT_GE(c, 0);
        for (const EpsfCell& other : psf.epsf)
            EXPECT_LE(std::hypot(psf.epsf[c].cx - x, psf.epsf[c].cy - y),
                      std::hypot(other.cx - x, other.cy - y));
    }
    const double x = 120, y = 420;
    const int c = nearestEpsfCell(psf, x, y);
    const EpsfCell& cell = psf.epsf[c];
    const RadialProfile p = epsfRadialProfile(psf, c, x, y);
    ASSERT_EQ(p.r.size(), static_cast<std::size_t>(cell.image.width()) * cell.image.height());
    // nodes of zero sub-pixel phase sum to 1 (the ePSF's normalisation)
    double native = 0;
    for (std::size_t k = 0; k < p.r.size(); ++k) {
        const int i = static_cast<int>(k % cell.image.width()), j = static_cast<int>(k / cell.image.width());
        const double u = (i - cell.centreX) / cell.oversampling, v = (j - cell.centreY) / cell.oversampling;
        if (std::fabs(u - std::round(u)) < 1e-9 && std::fabs(v - std::round(v)) < 1e-9) native += p.value[k];
        EXPECT_NEAR(p.r[k], std::hypot(u, v), 1e-12);
    }
    EXPECT_NEAR(native, 1.0, 1e-3);
    // the model: unit flux on the native grid, the peak close to the ePSF's, the FWHM close to the truth
    ASSERT_FALSE(p.modelR.empty());
    EXPECT_NEAR(p.fwhm, simPsfAt(f.sim.params, x, y).fwhm, 0.08 * p.fwhm);
    double peakEpsf = 0;
    for (std::size_t k = 0; k < p.r.size(); ++k)
        if (p.r[k] < 1e-9) peakEpsf = p.value[k];
    EXPECT_NEAR(p.modelValue[0], peakEpsf, 0.15 * peakEpsf);
    // model values decrease with radius
    for (std::size_t k = 1; k < p.modelValue.size(); ++k)
        EXPECT_LE(p.modelValue[k], p.modelValue[k - 1] + 1e-15);
}

TEST(PanelData, StampAndStretch) {
    const auto& f = panelFixture();
    const Frame& fr = *f.calibrated->frame;
    const Stamp s = extractStamp(fr, 100.4, 200.6, 5);
    EXPECT_EQ(s.width, 11);
    EXPECT_EQ(s.x0, 95);
    EXPECT_EQ(s.y0, 196);
    EXPECT_EQ(s.values[3 * 11 + 4], fr.pixels(99, 199));
    const Stamp corner = extractStamp(fr, 0, 0, 3);
    EXPECT_TRUE(std::isnan(corner.values[0]));
    EXPECT_NE(corner.masked[0], 0);
    EXPECT_EQ(corner.values[3 * 7 + 3], fr.pixels(0, 0));
    const auto g = asinhStretch({0.f, 10.f, 100.f, 1000.f, NAN, -5.f, 2000.f}, 0.0, 1000.0, 10.0);
    EXPECT_EQ(g[0], 0);
    EXPECT_EQ(g[3], 255);
    EXPECT_EQ(g[4], 0);
    EXPECT_EQ(g[5], 0);
    EXPECT_EQ(g[6], 255);
    EXPECT_LT(g[1], g[2]);
    EXPECT_LT(g[2], g[3]);
    EXPECT_NEAR(g[1], 255.0 * std::asinh(1.0) / std::asinh(100.0), 0.6);
}

TEST(PanelData, CurveOfGrowthMatchesTheCatalogAndASubsampledSum) {
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    const PipelineResult& r = s.result;
    const ApertureResult& ap = r.aperture;
    // a bright unflagged source away from the edges
    int best = -1;
    for (std::size_t i = 0; i < ap.count; ++i) {
        const Sources& src = r.detection.sources;
        if ((src.flags[i] | ap.flags[i]) != 0 || src.x[i] < 30 || src.y[i] < 30 || src.x[i] > 990 ||
            src.y[i] > 870)
            continue;
        if (best < 0 || ap.flux[1][i] > ap.flux[1][best]) best = static_cast<int>(i);
    }
    ASSERT_GE(best, 0);
    const CurveOfGrowth cat = catalogCurveOfGrowth(r, best);
    ASSERT_EQ(cat.radius.size(), ap.radii.size());
    const double x = r.detection.sources.x[best], y = r.detection.sources.y[best];
    for (std::size_t k = 0; k < cat.radius.size(); ++k) {
        const CurveOfGrowth one =
            fineCurveOfGrowth(*s.frame, x, y, ap.sky[best], cat.radius[k], cat.radius[k]);
        ASSERT_EQ(one.flux.size(), 1u);
        EXPECT_NEAR(one.flux[0], cat.flux[k], 1e-6 * std::fabs(cat.flux[k]) + 1e-6)
            << "r = " << cat.radius[k];
    }
    const CurveOfGrowth fine = fineCurveOfGrowth(*s.frame, x, y, ap.sky[best], 8.0, 0.25);
    ASSERT_EQ(fine.radius.size(), 32u);
    EXPECT_DOUBLE_EQ(fine.radius.back(), 8.0);
    // Independent: a 16 x 16 sub-pixel sampling of the disc at r = 3 px.
    const double R = 3.0;
    double sub = 0;
    for (int py = static_cast<int>(y) - 5; py <= static_cast<int>(y) + 5; ++py)
        for (int px = static_cast<int>(x) - 5; px <= static_cast<int>(x) + 5; ++px) {
            int in = 0;
            for (int b = 0; b < 16; ++b)
                for (int a = 0; a < 16; ++a)
                    in += std::hypot(px - 0.5 + (a + 0.5) / 16 - x, py - 0.5 + (b + 0.5) / 16 - y) <= R;
            sub += in / 256.0 * (s.frame->pixels(px, py) - ap.sky[best]);
        }
    EXPECT_NEAR(fine.flux[11], sub, 0.01 * sub); // radius 12 * 0.25 = 3
    // the curve rises towards the total
    EXPECT_GT(fine.flux[31], fine.flux[3]);
}

TEST(PanelData, FlagNamesFollowDocsFlagsMd) {
    std::ifstream in(GPUPHOT_TEST_DATA "/../../docs/FLAGS.md");
    ASSERT_TRUE(in) << "docs/FLAGS.md";
    std::map<int, std::string> doc;
    const std::regex row(R"(^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([a-z_]+)\s*\|)");
    std::string line;
    while (std::getline(in, line)) {
        std::smatch m;
        if (!doc.empty() && line.rfind("#", 0) == 0) break; // the catalog flags table ends (pixel mask bits follow)
        if (std::regex_search(line, m, row)) {
            EXPECT_EQ(std::stoul(m[2]), 1ul << std::stoi(m[1]));
            doc[std::stoi(m[1])] = m[3];
        }
    }
    ASSERT_GE(doc.size(), 14u);
    for (const auto& [bit, name] : doc) {
        const auto names = flagNames(1u << bit);
        ASSERT_EQ(names.size(), 1u);
        EXPECT_EQ(names[0], name) << "bit " << bit;
    }
    EXPECT_EQ(flagsText(0), "0 = none");
    EXPECT_EQ(flagsText(FlagSaturated | FlagApertureIncomplete), "20 = saturated | aperture_incomplete");
    EXPECT_EQ(flagNames(1u << 30), std::vector<std::string>{"bit 30"});
}

TEST(PanelData, SourceDetailsAreOneBasedWithDecodedFlags) {
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    const ZeroPointResult& z = s.result.zeropoint;
    int i = -1;
    for (std::size_t k = 0; k < z.sourceIndex.size(); ++k)
        if (z.used[k]) {
            i = z.sourceIndex[k];
            break;
        }
    ASSERT_GE(i, 0);
    const auto rows = sourceDetails(s, i);
    std::map<std::string, std::string> byLabel;
    for (const auto& r : rows)
        byLabel[r.label] = r.value;
    EXPECT_EQ(byLabel["id"], std::to_string(i + 1));
    char xy[64];
    std::snprintf(xy, sizeof xy, "%.3f, %.3f", s.result.detection.sources.x[i] + 1,
                  s.result.detection.sources.y[i] + 1);
    EXPECT_EQ(byLabel["x, y (1-based)"], xy);
    EXPECT_NE(byLabel["flags"].find("calibrator"), std::string::npos) << byLabel["flags"];
    EXPECT_FALSE(byLabel["mag_cal"].empty());
    EXPECT_FALSE(byLabel["reference"].empty());
    EXPECT_TRUE(sourceDetails(s, -1).empty());
    EXPECT_TRUE(sourceDetails(s, 1 << 30).empty());
}

TEST(PanelData, HeaderFilterIsCaseInsensitiveOverKeyValueAndComment) {
    const HeaderCard c{"EXPTIME", "60.0", "Exposure time [s]"};
    EXPECT_TRUE(headerCardMatches(c, ""));
    EXPECT_TRUE(headerCardMatches(c, "exp"));
    EXPECT_TRUE(headerCardMatches(c, "60."));
    EXPECT_TRUE(headerCardMatches(c, "TIME [S"));
    EXPECT_FALSE(headerCardMatches(c, "gain"));
}
