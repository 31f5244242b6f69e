// Forced photometry (core/stages/forced_photometry) and the target-list reader (core/io/target_list):
// at the detections' own positions it reproduces the catalog's aperture fluxes exactly; at the
// simulator's true positions the aperture-corrected fluxes match the true fluxes within their errors;
// off-frame, edge and blank-sky targets are flagged or consistent with zero; target files in every
// accepted form parse to the same degrees; bad files are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>

#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/target_list.hpp"
#include "core/model/flags.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;
using gpuphot::test::TempDir;

namespace {

struct Field {
    TempDir dir{"gpuphot_forced"};
    SimResult sim;
    Frame frame;
    PipelineConfig config;
    PipelineResult result;
};

// One simulated 320x320 field, reduced once (no calibration: the stage needs none).
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
        g.sim = simulateField(p);
        writeSimulation(g.sim, g.dir.str(), "f", -32);
        g.frame = readFrame(g.dir / "f.fits");
        RunContext ctx;
        g.result = runPipeline(g.frame, g.config, ctx);
        return owned;
    }();
    return *f;
}

ForcedPhotometryResult forcedAt(const std::vector<double>& x, const std::vector<double>& y) {
    Field& f = field();
    RunContext ctx;
    ApertureParams ap = f.config.aperture;
    ap.saturation = f.frame.instrument.saturation;
    return forcedPhotometry(f.frame.view(), f.frame.maskView(), f.result.background,
                            f.result.detection.segmentation.view(), f.result.detection.sources,
                            f.result.aperture, x, y, f.result.fwhm, f.frame.instrument.gain,
                            f.frame.instrument.readNoise, ap, ForcedPhotometryParams{}, ctx);
}

} // namespace

TEST(ForcedPhotometry, AtTheDetectionsReproducesTheCatalogApertureFluxesExactly) {
    Field& f = field();
    const Sources& s = f.result.detection.sources;
    ASSERT_GT(s.size(), 50u);
    const ForcedPhotometryResult r = forcedAt(s.x, s.y);
    ASSERT_EQ(r.count, s.size());
    ASSERT_EQ(r.aperture.radii, f.result.aperture.radii);
    for (std::size_t i = 0; i < s.size(); ++i) {
        EXPECT_EQ(r.detIndex[i], static_cast<std::int32_t>(i)) << "its own detection is the counterpart";
        EXPECT_EQ(r.detSeparation[i], 0.0);
        EXPECT_TRUE(r.flags[i] & FlagTargetDetected);
        EXPECT_EQ(r.aperture.sky[i], f.result.aperture.sky[i]) << i;
        for (std::size_t k = 0; k < r.aperture.radii.size(); ++k) {
            EXPECT_EQ(r.aperture.flux[k][i], f.result.aperture.flux[k][i])
                << "radius " << k << " source " << i;
            EXPECT_EQ(r.aperture.fluxErr[k][i], f.result.aperture.fluxErr[k][i])
                << "radius " << k << " source " << i;
            EXPECT_EQ(r.aperture.apertureFlags[k][i], f.result.aperture.apertureFlags[k][i]);
        }
    }
}

TEST(ForcedPhotometry, AtTheTruePositionsRecoversTheTrueFluxesWithinErrors) {
    Field& f = field();
    const Table& t = f.sim.truth;
    const auto tx = t.doubles("x"), ty = t.doubles("y"), flux = t.doubles("flux"),
               magInst = t.doubles("mag_inst");
    const auto galaxy = t.doubles("is_galaxy"), saturated = t.doubles("saturated");
    // Isolated, unsaturated stars away from the edges (no other star within 15 px: its wings would be
    // part of the aperture and of the annulus).
    std::vector<double> x, y;
    std::vector<std::size_t> rows;
    for (std::size_t k = 0; k < tx.size(); ++k) {
        if (galaxy[k] != 0 || saturated[k] != 0) continue;
        if (tx[k] < 20 || ty[k] < 20 || tx[k] > 300 || ty[k] > 300) continue;
        bool isolated = true;
        for (std::size_t j = 0; j < tx.size() && isolated; ++j)
            isolated = j == k || std::hypot(tx[j] - tx[k], ty[j] - ty[k]) > 15.0;
        if (!isolated) continue;
        x.push_back(tx[k] - 1.0); // truth is 1-based
        y.push_back(ty[k] - 1.0);
        rows.push_back(k);
    }
    ASSERT_GT(rows.size(), 25u);
    const ForcedPhotometryResult r = forcedAt(x, y);
    const ApertureResult& main = f.result.aperture;
    ASSERT_EQ(main.apCorrRatio.size(), r.aperture.radii.size());
    for (std::size_t k = 0; k < r.aperture.radii.size(); ++k) {
        if (r.aperture.radii[k] < 1.2 * f.result.fwhm)
            continue; // small apertures: centring-sensitive corrections
        std::vector<double> pulls;
        for (std::size_t m = 0; m < rows.size(); ++m) {
            const double corrected = r.aperture.flux[k][m] / main.apCorrRatio[k];
            const double err = r.aperture.fluxErr[k][m] / main.apCorrRatio[k];
            pulls.push_back((corrected - flux[rows[m]]) / err);
        }
        std::vector<double> sorted = pulls;
        std::sort(sorted.begin(), sorted.end());
        const double median = sorted[sorted.size() / 2];
        std::size_t within3 = 0;
        for (double p : pulls)
            within3 += std::fabs(p) < 3.0;
        EXPECT_LT(std::fabs(median), 0.7)
            << "radius " << r.aperture.radii[k] << ": biased aperture-corrected flux";
        EXPECT_GE(within3, pulls.size() * 9 / 10) << "radius " << r.aperture.radii[k];
    }
    // The total magnitude of the highest-S/N aperture against the true instrumental magnitude.
    std::size_t good = 0;
    for (std::size_t m = 0; m < rows.size(); ++m) {
        ASSERT_GE(r.calAperture[m], 0);
        const double d = r.magTotal[m] - magInst[rows[m]];
        good += std::fabs(d) < 3.0 * r.magTotalErr[m] + 0.01;
    }
    EXPECT_GE(good, rows.size() * 9 / 10);
}

TEST(ForcedPhotometry, OffFrameEdgeAndBlankSkyTargets) {
    Field& f = field();
    // Blank sky: the position farthest from every true source on a coarse grid.
    const auto tx = f.sim.truth.doubles("x"), ty = f.sim.truth.doubles("y");
    double bx = 0, by = 0, best = -1;
    for (int gy = 30; gy < 290; gy += 4)
        for (int gx = 30; gx < 290; gx += 4) {
            double d = 1e9;
            for (std::size_t k = 0; k < tx.size(); ++k)
                d = std::min(d, std::hypot(tx[k] - 1 - gx, ty[k] - 1 - gy));
            if (d > best) {
                best = d;
                bx = gx;
                by = gy;
            }
        }
    ASSERT_GT(best, 15.0);
    const std::vector<double> x{-5.0, 400.0, std::nan(""), 2.0, bx}, y{100.0, 100.0, 50.0, 150.0, by};
    const ForcedPhotometryResult r = forcedAt(x, y);
    for (int i : {0, 1, 2}) {
        EXPECT_TRUE(r.flags[i] & FlagTargetOffFrame) << i;
        EXPECT_TRUE(std::isnan(r.aperture.flux[0][i])) << i;
        EXPECT_EQ(r.detIndex[i], -1);
    }
    EXPECT_FALSE(r.flags[3] & FlagTargetOffFrame);
    EXPECT_TRUE(r.flags[3] & FlagTargetNearEdge);
    EXPECT_TRUE(r.flags[3] & FlagApertureIncomplete)
        << "the largest aperture (6 px) crosses the edge at x = 2";
    EXPECT_FALSE(r.flags[4] &
                 (FlagTargetOffFrame | FlagTargetNearEdge | FlagApertureIncomplete | FlagTargetDetected));
    for (std::size_t k = 0; k < r.aperture.radii.size(); ++k)
        EXPECT_LT(std::fabs(r.aperture.flux[k][4]), 4.0 * r.aperture.fluxErr[k][4])
            << "blank sky, radius " << k;
}

TEST(ForcedPhotometry, MaskedPixelsAreFlagged) {
    Field& f = field();
    Frame masked = f.frame;
    const double cx = f.result.detection.sources.x[0], cy = f.result.detection.sources.y[0];
    masked.mask(static_cast<int>(std::lround(cx)) + 1, static_cast<int>(std::lround(cy))) = MaskBad;
    RunContext ctx;
    const ForcedPhotometryResult r = forcedPhotometry(
        masked.view(), masked.maskView(), f.result.background, f.result.detection.segmentation.view(),
        f.result.detection.sources, f.result.aperture, {cx}, {cy}, f.result.fwhm, f.frame.instrument.gain,
        f.frame.instrument.readNoise, f.config.aperture, ForcedPhotometryParams{}, ctx);
    EXPECT_TRUE(r.flags[0] & FlagApertureMasked);
}

TEST(TargetList, DegreesSexagesimalAndCoordColumnsAgree) {
    TempDir dir("gpuphot_targets");
    // 12:30:15.5 = 187.564583333 deg; -05:06:07.2 = -5.102 deg; 00:00:36 +00:30:00 = 0.15, 0.5
    std::ofstream(dir / "deg.csv") << "# comment\nname,ra,dec\nM1,187.56458333333333,-5.102\nM2,0.15,0.5\n";
    std::ofstream(dir / "sex.csv") << "name,ra,dec\nM1,12:30:15.5,-05:06:07.2\nM2,00 00 36,+00 30 00\n";
    std::ofstream(dir / "coord.txt")
        << "id coord\n7 \"12:30:15.5 -05:06:07.2\"\n8 \"00h00m36s +00d30m00s\"\n";
    Table fits;
    fits.add("NAME", std::vector<std::string>{"M1", "M2"});
    fits.add("RA", std::vector<double>{187.56458333333333, 0.15}, "deg");
    fits.add("DEC", std::vector<double>{-5.102, 0.5}, "deg");
    writeFitsTable(dir / "t.fits", fits);
    for (const std::string file : {"deg.csv", "sex.csv", "coord.txt", "t.fits"}) {
        const TargetList t = readTargetList(dir / file);
        ASSERT_EQ(t.size(), 2u) << file;
        EXPECT_NEAR(t.ra[0], 187.56458333333333, 1e-9) << file;
        EXPECT_NEAR(t.dec[0], -5.102, 1e-9) << file;
        EXPECT_NEAR(t.ra[1], 0.15, 1e-9) << file;
        EXPECT_NEAR(t.dec[1], 0.5, 1e-9) << file;
    }
    EXPECT_EQ(readTargetList(dir / "deg.csv").name[1], "M2");
    EXPECT_EQ(readTargetList(dir / "coord.txt").name[0], "7");
    EXPECT_FALSE(parseSexagesimalAngle("12.5").has_value()) << "a bare number is degrees, not sexagesimal";
    EXPECT_FALSE(parseSexagesimalAngle("12:75:00").has_value());
    EXPECT_NEAR(*parseSexagesimalAngle("-00:30:00"), -0.5, 1e-12) << "the sign of -00 must survive";
}

TEST(TargetList, BadFilesAreClearErrors) {
    TempDir dir("gpuphot_targets_bad");
    std::ofstream(dir / "nocols.csv") << "a,b\n1,2\n";
    std::ofstream(dir / "range.csv") << "ra,dec\n10,20\n370,5\n";
    std::ofstream(dir / "text.csv") << "ra,dec\nabc,5\n";
    std::ofstream(dir / "empty.csv") << "ra,dec\n";
    auto message = [&](const std::string& f) {
        try {
            readTargetList(dir / f);
        } catch (const InvalidInput& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    EXPECT_NE(message("nocols.csv").find("no ra/dec"), std::string::npos) << message("nocols.csv");
    EXPECT_NE(message("range.csv").find("row 2"), std::string::npos) << message("range.csv");
    EXPECT_NE(message("text.csv").find("abc"), std::string::npos) << message("text.csv");
    EXPECT_NE(message("empty.csv").find("no rows"), std::string::npos) << message("empty.csv");
    EXPECT_THROW(readTargetList(dir / "missing.csv"), IoError);
}

TEST(SolvedFrame, WcsKeywordSelection) {
    for (const char* k :
         {"CTYPE1", "CRPIX2", "CRVAL1", "CDELT2", "CD1_1", "PC2_1", "PV2_10", "A_ORDER", "A_2_0", "BP_0_3",
          "B_DMAX", "LONPOLE", "RADESYS", "EQUINOX", "WCSAXES", "CUNIT1", "CROTA2"})
        EXPECT_TRUE(isPrimaryWcsKeyword(k)) << k;
    for (const char* k :
         {"CTYPE1A", "CRVAL1B", "NAXIS1", "RA", "DEC", "DATE-OBS", "EXPTIME", "A", "OBJECT", "BZERO"})
        EXPECT_FALSE(isPrimaryWcsKeyword(k)) << k;
}

TEST(Airmass, FromAltitudeKeywordsFollowsTheSecantAndKastenYoung) {
    Header h;
    EXPECT_TRUE(std::isnan(airmassFromAltitudeKeywords(h)));
    h.set("ALT", 60.0);
    std::string which;
    // High altitude: the plane-parallel secant to 0.1%.
    EXPECT_NEAR(airmassFromAltitudeKeywords(h, &which), 1.0 / std::sin(60.0 * M_PI / 180.0), 1.5e-3);
    EXPECT_EQ(which, "ALT");
    Header z;
    z.set("ZD", 30.0);
    EXPECT_NEAR(airmassFromAltitudeKeywords(z), airmassFromAltitudeKeywords(h), 1e-12);
    Header low;
    low.set("ELEVATIO",
            0.0); // horizon: Kasten & Young's 38 rather than an infinite secant... but 0 is "unset"
    EXPECT_TRUE(std::isnan(airmassFromAltitudeKeywords(low)));
    low.set("ELEVATIO", 5.0);
    EXPECT_GT(airmassFromAltitudeKeywords(low), 9.0); // tables give ~10.4 at 5 deg
    EXPECT_LT(airmassFromAltitudeKeywords(low), 1.0 / std::sin(5.0 * M_PI / 180.0));
}
