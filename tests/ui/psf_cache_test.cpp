// PsfFitCache (core/stages/psf/psf.hpp), the workbench's reuse of PSF star fits between runs: a run that takes
// fits from the cache gives bitwise the result of a fresh run without one, for every kind of edit the
// workbench makes (detection threshold and deblending, PSF parameters that do or do not change the fits,
// a value set back), with a cache that evicts, and when one star's stamp pixels change under an unchanged
// source list (only that star is fitted again). Simulated fields, CPU backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/model/frame.hpp"
#include "core/model/sources.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/psf/psf.hpp"

using namespace gpuphot;

namespace {

const Frame& field() {
    static const Frame frame = [] {
        SimParams p;
        p.width = p.height = 768; // sparse enough for isolated PSF stars
        p.stars = 350;
        p.seed = 21;
        p.magBright = 12.0;
        p.magFaint = 19.0;
        p.galaxies = 5;
        return frameFromSimulation(simulateField(p));
    }();
    return frame;
}

template <class T>
bool sameBits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every number of the PSF result, bit for bit (NaN == NaN when the bits agree).
void expectSamePsf(const PsfResult& a, const PsfResult& b) {
    ASSERT_EQ(a.stars.size(), b.stars.size());
    for (std::size_t k = 0; k < a.stars.size(); ++k) {
        const PsfStar &s = a.stars[k], &t = b.stars[k];
        ASSERT_EQ(s.index, t.index) << k;
        ASSERT_EQ(std::memcmp(&s.fit, &t.fit, sizeof s.fit), 0) << "star " << k;
        ASSERT_EQ(std::memcmp(&s.shape, &t.shape, sizeof s.shape), 0) << "star " << k;
        ASSERT_TRUE(sameBits(s.flux, t.flux) && sameBits(s.chi2, t.chi2)) << k;
        ASSERT_EQ(s.iterations, t.iterations) << k;
        ASSERT_EQ(s.converged, t.converged) << k;
        ASSERT_EQ(s.used, t.used) << k;
    }
    EXPECT_TRUE(sameBits(a.fwhmPoly.coeffs, b.fwhmPoly.coeffs));
    EXPECT_TRUE(sameBits(a.e1Poly.coeffs, b.e1Poly.coeffs));
    EXPECT_TRUE(sameBits(a.e2Poly.coeffs, b.e2Poly.coeffs));
    EXPECT_TRUE(sameBits(a.fwhm, b.fwhm));
    EXPECT_TRUE(sameBits(a.ellipticity, b.ellipticity));
    EXPECT_TRUE(sameBits(a.theta, b.theta));
    EXPECT_TRUE(sameBits(a.fluxPsf, b.fluxPsf));
    EXPECT_TRUE(sameBits(a.fluxPsfErr, b.fluxPsfErr));
    EXPECT_TRUE(sameBits(a.flags, b.flags));
    EXPECT_TRUE(sameBits(a.medianFwhm, b.medianFwhm) && sameBits(a.medianBeta, b.medianBeta));
    EXPECT_EQ(a.nStars, b.nStars);
    EXPECT_EQ(a.stampRadius, b.stampRadius);
    ASSERT_EQ(a.epsf.size(), b.epsf.size());
    for (std::size_t c = 0; c < a.epsf.size(); ++c) {
        const Image<float> &x = a.epsf[c].image, &y = b.epsf[c].image;
        ASSERT_EQ(x.width(), y.width());
        ASSERT_EQ(x.height(), y.height());
        EXPECT_EQ(std::memcmp(x.data(), y.data(), x.pixelCount() * sizeof(float)), 0) << "ePSF cell " << c;
        EXPECT_EQ(a.epsf[c].nStars, b.epsf[c].nStars);
    }
}

void expectSame(const PipelineResult& a, const PipelineResult& b) {
    ASSERT_EQ(a.detection.sources.size(), b.detection.sources.size());
    ASSERT_NO_FATAL_FAILURE(expectSamePsf(a.psf, b.psf));
    EXPECT_TRUE(sameBits(a.fwhm, b.fwhm));
    EXPECT_TRUE(sameBits(a.aperture.fluxOpt, b.aperture.fluxOpt));
    EXPECT_TRUE(sameBits(a.aperture.fluxOptErr, b.aperture.fluxOptErr));
    ASSERT_EQ(a.aperture.flux.size(), b.aperture.flux.size());
    for (std::size_t r = 0; r < a.aperture.flux.size(); ++r) EXPECT_TRUE(sameBits(a.aperture.flux[r], b.aperture.flux[r]));
}

PipelineResult freshRun(const PipelineConfig& c, bool fullMaps = false) {
    RunContext ctx;
    ctx.threads = 2;
    PipelineResult r;
    r.keepFullMaps = fullMaps; // lean (sampler) as the workbench, or full maps
    runPipeline(field(), c, ctx, r, Stage::Background, nullptr);
    return r;
}

int fittedStars(const PsfResult& p) {
    int n = 0;
    for (const PsfStar& s : p.stars) n += s.iterations > 0;
    return n;
}

// The workbench's sequence of edits on one result, each re-run from its first affected stage, against fresh
// runs of the same configs.
TEST(PsfFitCache, IncrementalRunsAreBitwiseFreshRuns) {
    auto cache = std::make_shared<PsfFitCache>();
    RunContext ctx;
    ctx.threads = 2;
    PipelineResult inc; // lean maps, as the workbench
    inc.psfFitCache = cache;
    PipelineConfig a;
    runPipeline(field(), a, ctx, inc, Stage::Background, nullptr);
    const int nFit = fittedStars(inc.psf);
    ASSERT_GE(nFit, 15);
    EXPECT_EQ(cache->lastHits(), 0);
    EXPECT_EQ(cache->lastMisses(), nFit);
    ASSERT_NO_FATAL_FAILURE(expectSame(inc, freshRun(a)));

    const auto step = [&](const PipelineConfig& from, const PipelineConfig& to, const char* what) {
        SCOPED_TRACE(what);
        runPipeline(field(), to, ctx, inc, firstAffectedStage(from, to), nullptr);
        const PipelineResult fresh = freshRun(to);
        expectSame(inc, fresh);
        EXPECT_EQ(cache->lastHits() + cache->lastMisses(), fittedStars(fresh.psf));
    };

    PipelineConfig b = a;
    b.detection.threshold = a.detection.threshold + 0.5; // every isophote changes: positions move a little
    step(a, b, "threshold raised");
    step(b, a, "threshold set back");
    EXPECT_EQ(cache->lastMisses(), 0) << "every star's fit inputs are those of the first run";
    EXPECT_EQ(cache->lastHits(), nFit);

    PipelineConfig d = a;
    d.detection.deblendContrast = 0.05; // (the frame-wide FWHM guess, part of every fit's start, may change)
    step(a, d, "deblending contrast");

    PipelineConfig g = d;
    g.psf.gridNx = g.psf.gridNy = 2; // the ePSF grid: no star fit changes
    g.psf.psfFitRadius = 4.0;
    step(d, g, "ePSF grid and PSF photometry radius");
    EXPECT_EQ(cache->lastMisses(), 0);

    PipelineConfig m = g;
    m.psf.maxIterations = 25; // a fit option: every fit is made again
    step(g, m, "maximum iterations");
    EXPECT_EQ(cache->lastHits(), 0);
}

// A cache far too small for one run's fits evicts as it goes: results stay those of a fresh run (full maps).
TEST(PsfFitCache, EvictingCacheKeepsResults) {
    auto cache = std::make_shared<PsfFitCache>(64 * 1024);
    RunContext ctx;
    ctx.threads = 2;
    PipelineResult inc;
    inc.keepFullMaps = true;
    inc.psfFitCache = cache;
    PipelineConfig a, b;
    b.psf.gridNx = 2;
    runPipeline(field(), a, ctx, inc, Stage::Background, nullptr);
    EXPECT_LE(cache->bytes(), std::size_t(64 * 1024));
    runPipeline(field(), b, ctx, inc, Stage::Psf, nullptr);
    EXPECT_LE(cache->bytes(), std::size_t(64 * 1024));
    EXPECT_GT(cache->lastMisses(), 0); // most fits were evicted
    expectSame(inc, freshRun(b, true));
}

// The stamp is part of the key: one star's pixels changed under the same source list (same positions, same
// start) makes that star, and only it, be fitted again; the result is the fresh one on the changed image.
TEST(PsfFitCache, ChangedStampPixelsAreFittedAgain) {
    const Frame& f = field();
    RunContext ctx;
    ctx.threads = 2;
    const PipelineResult base = freshRun(PipelineConfig{});
    PsfParams params;
    if (std::isfinite(f.instrument.saturation)) params.saturation = f.instrument.saturation; // as the pipeline
    PsfFitCache cache;
    const PsfResult first = cpu::buildPsfModel(f.view(), f.maskView(), base.background, base.detection.sources,
                                               f.instrument.gain, params, ctx, &cache);
    const int nFit = fittedStars(first);
    ASSERT_GE(nFit, 15);
    // The brightest fitted star: one pixel 2 px from its centre, +50 ADU.
    const PsfStar* star = nullptr;
    for (const PsfStar& s : first.stars)
        if (s.iterations > 0) {
            star = &s;
            break;
        }
    ASSERT_TRUE(star);
    Image<float> changed(f.pixels);
    const int ix = static_cast<int>(std::lround(base.detection.sources.x[star->index]));
    const int iy = static_cast<int>(std::lround(base.detection.sources.y[star->index]));
    changed(ix + 2, iy) += 50.0f;
    const PsfResult again = cpu::buildPsfModel(changed.view(), f.maskView(), base.background, base.detection.sources,
                                               f.instrument.gain, params, ctx, &cache);
    EXPECT_EQ(cache.lastMisses(), 1);
    EXPECT_EQ(cache.lastHits(), nFit - 1);
    const PsfResult fresh = cpu::buildPsfModel(changed.view(), f.maskView(), base.background,
                                               base.detection.sources, f.instrument.gain, params, ctx);
    expectSamePsf(again, fresh);
    // And the unchanged image again: every fit from the cache, the first result.
    const PsfResult back = cpu::buildPsfModel(f.view(), f.maskView(), base.background, base.detection.sources,
                                              f.instrument.gain, params, ctx, &cache);
    EXPECT_EQ(cache.lastMisses(), 0);
    expectSamePsf(back, first);
}

} // namespace
