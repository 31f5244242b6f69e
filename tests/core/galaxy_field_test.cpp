// A field of galaxies with few stars (the regime of the workbench's galaxies frame, whose History FWHM
// and per-source FWHM disagreed): the field's median PSF FWHM (History's number: the PSF stars' own fits)
// and the model's FWHM at every source (the catalog's `fwhm`) are the same PSF, and both are the
// simulated one. A galaxy's own size never enters either.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>

#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"

namespace gpuphot {
namespace {

TEST(GalaxyField, MedianAndPerSourceFwhmAreTheStarsPsf) {
    struct Case {
        int size, stars, galaxies;
        double fwhm;
        std::uint64_t seed;
    };
    for (const Case c :
         {Case{256, 12, 150, 2.3, 3}, Case{256, 25, 300, 3.5, 4}, Case{1024, 40, 1200, 2.2, 5}}) {
        SimParams p;
        p.width = p.height = c.size;
        p.stars = c.stars;
        p.galaxies = c.galaxies;
        p.galaxyReMax = 8.0;
        p.fwhm = c.fwhm;
        p.seed = c.seed;
        const Frame frame = frameFromSimulation(simulateField(p), true);
        RunContext ctx;
        ctx.threads = 2;
        const PipelineResult r = runPipeline(frame, PipelineConfig{}, ctx);
        const PsfResult& psf = r.psf;
        if (!psf.hasModel()) { // History then shows "-", not a number
            EXPECT_FALSE(std::isfinite(psf.medianFwhm) && psf.medianFwhm > 0.0 && psf.nStars > 0) << c.size;
            continue;
        }
        EXPECT_NEAR(psf.medianFwhm, c.fwhm, 0.15 * c.fwhm) << c.size << " px, " << c.stars << " stars";
        std::size_t far = 0, n = 0;
        for (std::size_t k = 0; k < psf.fwhm.size(); ++k) {
            if (!std::isfinite(psf.fwhm[k])) continue;
            ++n;
            far += std::fabs(psf.fwhm[k] - psf.medianFwhm) > 0.15 * psf.medianFwhm;
        }
        EXPECT_GT(n, static_cast<std::size_t>(c.stars));
        EXPECT_EQ(far, 0u) << "sources whose model FWHM is off the stars' median (" << psf.medianFwhm
                           << " px), " << c.size << " px, " << c.stars << " stars";
    }
}

} // namespace
} // namespace gpuphot
