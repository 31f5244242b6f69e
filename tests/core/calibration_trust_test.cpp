// Calibration refuses what is not real: a reference catalog of another field (its stars where this
// frame has none) gives chance matches only, and the zero point is then not reported as one (ok false,
// the reason said, mag_cal NaN, exit 4 for the CLI), while the right catalog calibrates the same frames.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/frame.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "tests/core/test_fields.hpp"

using namespace gpuphot;
using gpuphot::test::referenceOf;

namespace {

// The trust tests' field: 768 x 768 px, 700 stars.
SimResult trustField(std::uint64_t seed) {
    SimParams sp;
    sp.width = 768;
    sp.height = 768;
    sp.stars = 700;
    sp.seed = seed;
    return simulateField(sp);
}

// Another field's catalog over the same sky: as many stars, the same magnitudes, at positions drawn
// uniformly over the frame (so every match is by chance).
ReferenceCatalog otherField(const ReferenceCatalog& right, const Frame& frame, std::uint64_t seed) {
    ReferenceCatalog ref = right;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> ux(-20.0, frame.width() + 20.0), uy(-20.0, frame.height() + 20.0);
    for (std::size_t i = 0; i < ref.ra.size(); ++i) {
        const auto [ra, dec] = frame.wcs->pixelToWorld(ux(rng), uy(rng));
        ref.ra[i] = ra;
        ref.dec[i] = dec;
    }
    return ref;
}

} // namespace

TEST(CalibrationTrust, WrongFieldIsRefusedAndRightFieldCalibratesIn20Trials) {
    int refused = 0, calibrated = 0;
    for (int trial = 0; trial < 20; ++trial) {
        const std::uint64_t seed = 500 + static_cast<std::uint64_t>(trial);
        const SimResult sim = trustField(seed);
        const Frame frame = frameFromSimulation(sim);
        ASSERT_TRUE(frame.wcs);
        const ReferenceCatalog right = referenceOf(sim), wrong = otherField(right, frame, seed);
        PipelineConfig config;
        config.fitAstrometry = false; // the header WCS as it is: the chance matches reach the zero point
        RunContext ctx;
        ctx.threads = 2;
        const PipelineResult good = runPipeline(frame, config, ctx, &right);
        const PipelineResult bad = runPipeline(frame, config, ctx, &wrong);
        const double zpTrue = *sim.header.getDouble("SIMZP");
        SCOPED_TRACE("trial " + std::to_string(trial));
        EXPECT_TRUE(good.zeropoint.ok) << good.zeropoint.message;
        EXPECT_NEAR(good.zeropoint.zp, zpTrue, 0.02);
        EXPECT_FALSE(bad.zeropoint.ok) << "zp " << bad.zeropoint.zp << " +- " << bad.zeropoint.zpErr;
        EXPECT_TRUE(std::isnan(bad.zeropoint.zp));
        EXPECT_NE(bad.calibrationProblem.find("not significant"), std::string::npos) << bad.calibrationProblem;
        EXPECT_GT(bad.crossmatch.chanceMatches, 0.0);
        calibrated += good.zeropoint.ok;
        refused += !bad.zeropoint.ok;
        if (trial == 0)
            std::printf("[trust] right: %zu matched (%.1f by chance), zp %.4f +- %.4f; wrong: %zu matched (%.1f by "
                        "chance): %s\n",
                        good.crossmatch.nMatched, good.crossmatch.chanceMatches, good.zeropoint.zp,
                        good.zeropoint.zpErr, bad.crossmatch.nMatched, bad.crossmatch.chanceMatches,
                        bad.calibrationProblem.c_str());
    }
    EXPECT_EQ(calibrated, 20);
    EXPECT_EQ(refused, 20);
}

// The zero point's error covers the calibrators' spread: the bootstrap is reported beside the formal
// error, zpErr takes the larger of the two and adds the curve of growth's error.
TEST(CalibrationTrust, ZeroPointErrorIsTheLargerOfFormalAndBootstrap) {
    const SimResult sim = trustField(77);
    const Frame frame = frameFromSimulation(sim);
    const ReferenceCatalog right = referenceOf(sim);
    PipelineConfig config;
    config.fitAstrometry = false;
    config.zeropoint.magSource = "aperture";
    RunContext ctx;
    const PipelineResult r = runPipeline(frame, config, ctx, &right);
    ASSERT_TRUE(r.zeropoint.ok) << r.zeropoint.message;
    EXPECT_GT(r.zeropoint.zpErrBootstrap, 0.0);
    EXPECT_GT(r.zeropoint.zpErrFormal, 0.0);
    // and the curve of growth's error, common to every calibrator, on top in quadrature
    EXPECT_GT(r.zeropoint.zpErrShared, 0.0);
    EXPECT_NEAR(r.zeropoint.zpErr,
                std::hypot(std::max(r.zeropoint.zpErrFormal, r.zeropoint.zpErrBootstrap), r.zeropoint.zpErrShared),
                1e-12);
    config.zeropoint.bootstrap = 0;
    const PipelineResult formal = runPipeline(frame, config, ctx, &right);
    EXPECT_GT(formal.zeropoint.zpErr, formal.zeropoint.zpErrFormal);
    EXPECT_TRUE(std::isnan(formal.zeropoint.zpErrBootstrap));
    EXPECT_EQ(formal.zeropoint.zp, r.zeropoint.zp);
}

// The magnitudes calibrated: "aperture" and "psf" as asked (mag_cal made of that source's magnitudes),
// "auto" the one whose zero point is the more certain; the report says which.
TEST(CalibrationTrust, MagnitudeSourceIsChosenAndReported) {
    const SimResult sim = trustField(78);
    const Frame frame = frameFromSimulation(sim);
    const ReferenceCatalog right = referenceOf(sim);
    PipelineConfig config;
    config.fitAstrometry = false;
    RunContext ctx;
    auto run = [&](const char* source) {
        config.zeropoint.magSource = source;
        return runPipeline(frame, config, ctx, &right);
    };
    const PipelineResult ap = run("aperture"), psf = run("psf"), best = run("auto");
    ASSERT_TRUE(ap.zeropoint.ok && psf.zeropoint.ok && best.zeropoint.ok);
    EXPECT_EQ(ap.zeropoint.magSource, "aperture");
    EXPECT_EQ(psf.zeropoint.magSource, "psf");
    const double zpTrue = *sim.header.getDouble("SIMZP");
    EXPECT_NEAR(psf.zeropoint.zp, zpTrue, 0.02);
    const bool psfWins = psf.zeropoint.zpErr < ap.zeropoint.zpErr;
    EXPECT_EQ(best.zeropoint.magSource, psfWins ? "psf" : "aperture");
    EXPECT_EQ(best.zeropoint.zp, psfWins ? psf.zeropoint.zp : ap.zeropoint.zp);
    // "auto" fits both at once on two threads, or one after the other on one: the same numbers
    for (const int threads : {1, 3}) {
        RunContext one;
        one.threads = threads;
        config.zeropoint.magSource = "auto";
        const PipelineResult b = runPipeline(frame, config, one, &right);
        EXPECT_EQ(b.zeropoint.zp, best.zeropoint.zp) << threads;
        EXPECT_EQ(b.zeropoint.zpErr, best.zeropoint.zpErr) << threads;
        EXPECT_EQ(b.zeropoint.message, best.zeropoint.message) << threads;
        EXPECT_EQ(b.zeropoint.used, best.zeropoint.used) << threads;
    }
    // PSF magnitudes: flux_psf scaled by one factor (tied to the aperture's total), the same for every source
    std::vector<double> offset;
    for (std::size_t i = 0; i < psf.magInst.size(); ++i) {
        const double f = psf.psf.fluxPsf[i];
        if (f > 0.0) offset.push_back(psf.magInst[i] + 2.5 * std::log10(f));
        const double g = ap.aperture.fluxOpt[i];
        if (g > 0.0) {
            ASSERT_EQ(ap.magInst[i], -2.5 * std::log10(g)) << i;
        }
    }
    ASSERT_GT(offset.size(), 100u);
    for (double o : offset)
        ASSERT_NEAR(o, offset.front(), 1e-9);
    EXPECT_GT(std::fabs(offset.front()), 1e-4); // the scale is applied (PSF fluxes are not total fluxes here)
    EXPECT_NE(psf.zeropoint.message.find("PSF fluxes scaled by"), std::string::npos) << psf.zeropoint.message;
    std::printf("[trust] aperture zp %.4f +- %.4f, psf zp %.4f +- %.4f (true %.4f); auto: %s\n", ap.zeropoint.zp,
                ap.zeropoint.zpErr, psf.zeropoint.zp, psf.zeropoint.zpErr, zpTrue, best.zeropoint.magSource.c_str());
    config.zeropoint.magSource = "kron";
    EXPECT_THROW(runPipeline(frame, config, ctx, &right), InvalidInput);
}
