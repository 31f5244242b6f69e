// The aperture correction when too few stars qualify to measure it (small fields). The curve of growth of
// a Gaussian of the field FWHM has no wings: for the simulator's Moffat stars (beta 3, FWHM 3 px) it puts
// 0.3 mag too little light outside r = 2 px, a zero point 0.3 mag off. The fallback is the curve of growth
// of the frame's PSF model, as aperture photometry of the model's pixels measures it
// (PsfResult::apertureFractions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/psf/psf.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;

namespace {

// Independent brute force: the flux fraction of a circular Moffat (unit total) that an aperture of
// radius r collects from the pixels, each pixel's value and its overlap with the disc both sampled on an
// s x s grid, averaged over a 5 x 5 grid of centre offsets spanning the whole pixel.
double bruteApertureFraction(double fwhm, double beta, double r) {
    const double alpha = fwhm / (2.0 * std::sqrt(std::pow(2.0, 1.0 / beta) - 1.0));
    const double norm = (beta - 1.0) / (M_PI * alpha * alpha);
    constexpr int s = 16, nOff = 5;
    const int half = static_cast<int>(std::ceil(r)) + 1;
    double total = 0.0;
    for (int oy = 0; oy < nOff; ++oy)
        for (int ox = 0; ox < nOff; ++ox) {
            const double cx = (ox + 0.5) / nOff - 0.5, cy = (oy + 0.5) / nOff - 0.5;
            for (int py = -half; py <= half; ++py)
                for (int px = -half; px <= half; ++px) {
                    double value = 0.0, inside = 0.0;
                    for (int j = 0; j < s; ++j)
                        for (int i = 0; i < s; ++i) {
                            const double x = px - 0.5 + (i + 0.5) / s, y = py - 0.5 + (j + 0.5) / s;
                            const double d2 = (x - cx) * (x - cx) + (y - cy) * (y - cy);
                            value += norm * std::pow(1.0 + d2 / (alpha * alpha), -beta);
                            inside += d2 <= r * r ? 1.0 : 0.0;
                        }
                    total += (value / (s * s)) * (inside / (s * s));
                }
        }
    return total / (nOff * nOff);
}

TEST(ApertureCorrection, PsfModelCurveOfGrowthIsThatOfTheModelsPixels) {
    PsfResult psf;
    psf.model = PsfModelKind::Moffat;
    psf.width = psf.height = 100;
    psf.fwhmPoly.coeffs = {3.0};
    psf.medianFwhm = 3.0;
    psf.medianBeta = 3.0;
    const std::vector<double> radii{1.0, 2.0, 3.0, 4.0, 6.0, 12.0};
    const std::vector<double> f = psf.apertureFractions(radii);
    ASSERT_EQ(f.size(), radii.size());
    for (std::size_t k = 0; k < radii.size(); ++k) {
        const double truth = bruteApertureFraction(3.0, 3.0, radii[k]);
        EXPECT_NEAR(f[k], truth, 0.002) << "r = " << radii[k];
    }
    // the pixels blur the core: at 2 px the aperture collects visibly less than the encircled energy
    EXPECT_LT(f[1], psf.encircledEnergy(2.0) - 0.02);
    PsfResult none;
    EXPECT_TRUE(std::isnan(none.apertureFractions({2.0})[0]));
}

struct Reduced {
    test::TempDir dir{"gpuphot_apcorr"};
    SimParams params;
    PipelineResult result;
};

// A simulated field (the CLI's simulate defaults otherwise), reduced with its reference catalog.
std::unique_ptr<Reduced> reduce(int size, int stars) {
    auto r = std::make_unique<Reduced>();
    r->params.width = size;
    r->params.height = size;
    r->params.stars = stars;
    const SimResult sim = simulateField(r->params);
    writeSimulation(sim, r->dir.str(), "a", -32);
    const Frame frame = readFrame(r->dir / "a.fits");
    const ReferenceCatalog ref = readReferenceCatalog(r->dir / "a.ref.fits");
    RunContext ctx;
    r->result = runPipeline(frame, PipelineConfig{}, ctx, &ref);
    const ApertureResult& ap = r->result.aperture;
    std::printf("[apcorr] %dx%d, %d stars: apcorr from %s (%d stars, %d PSF stars), zp %.4f:", size, size, stars,
                ap.apCorrSource.c_str(), ap.apCorrStars, r->result.psf.nStars, r->result.zeropoint.zp);
    for (double m : ap.apCorrMag) std::printf(" %.4f", m);
    std::printf("\n");
    return r;
}

const Reduced& smallField() {
    static const std::unique_ptr<Reduced> r = reduce(512, 300);
    return *r;
}

const Reduced& largeField() {
    static const std::unique_ptr<Reduced> r = reduce(1024, 1500);
    return *r;
}

TEST(ApertureCorrection, FallbackOnASmallFieldMatchesTheMeasuredCorrection) {
    const Reduced& small = smallField();
    const Reduced& large = largeField();
    const ApertureResult& a = small.result.aperture;
    const ApertureResult& b = large.result.aperture;
    // the situation under test: no stars qualify on the small field (5 PSF stars), 30 or so on the large one
    ASSERT_EQ(a.apCorrSource, "psf_model") << "the small field no longer exercises the fallback";
    EXPECT_EQ(a.apCorrStars, 0);
    ASSERT_GE(b.apCorrStars, 10);
    EXPECT_EQ(b.apCorrSource, "stars");
    ASSERT_EQ(a.apCorrMag.size(), b.apCorrMag.size());
    for (std::size_t k = 0; k < a.apCorrMag.size(); ++k) {
        EXPECT_NEAR(a.apCorrMag[k], b.apCorrMag[k], 0.01) << "radius " << a.radii[k] << " px";
        // and both agree with the truth: the simulator's Moffat (beta 3, FWHM 3 px) on its pixels
        const double truth = 2.5 * std::log10(bruteApertureFraction(3.0, 3.0, a.radii[k]));
        EXPECT_NEAR(a.apCorrMag[k], truth, 0.015) << "radius " << a.radii[k] << " px";
    }
}

TEST(ApertureCorrection, ZeroPointOfASmallFieldWithFewPsfStars) {
    for (const Reduced* r : {&smallField(), &largeField()}) {
        ASSERT_TRUE(r->result.zeropoint.ok);
        EXPECT_NEAR(r->result.zeropoint.zp, r->params.zeroPoint, 0.01) << r->params.width << " px field";
    }
}

} // namespace
