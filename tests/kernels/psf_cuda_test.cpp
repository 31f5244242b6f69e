// The CUDA PSF stage (kernels/psf/psf.cu: the stars' profile fits and the PSF photometry on the device) against
// the CPU stage (docs/ARCHITECTURE.md, Determinism): every column of PsfResult bitwise equal on simulated
// frames with masked pixels (the simulator's defects plus masked blocks over some sources), sources at and
// beyond the edges and at non-finite positions, the background fitted or not, gain 0 and > 0, a fixed and the
// automatic fit radius, full background maps, lean maps (mesh grid + sampler: the device interpolates them)
// and global values only. The device path must really run (its fit count) and fit most sources, and fail
// some.
// The ePSF cells built on the device (kernels/psf/psf_epsf.cu, cpu::buildPsfModel's EpsfCellBatch) against
// the host loop's: every field of every cell bitwise, the device's cell count checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/model/flags.hpp"
#include "core/model/sources.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/psf/psf.hpp"
#include "core/stages/psf/psf_epsf.hpp"
#include "core/stages/psf/psf_flux_math.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/psf/psf_epsf.hpp"
#include "tests/kernels/cuda_test_util.hpp"

namespace gpuphot::cuda { // kernels/psf/psf.cu's test hook
std::size_t psfLastDeviceFits();
std::size_t psfLastDeviceProfileFits();
std::size_t psfLastDeviceEpsfCells(); // kernels/psf/psf_epsf.cu's (declared in kernels/psf/psf_epsf.hpp)
} // namespace gpuphot::cuda

using namespace gpuphot;

namespace {

using namespace gpuphot::cudatest;

struct PsfField {
    SimField f;
    Image<std::uint8_t> mask; // the defects plus masked blocks
    Sources sources;          // detections, some moved to the edges / off the frame / NaN
};

PsfField makePsfField(int w, int h, int stars, std::uint64_t seed) {
    PsfField p{simulateDetectedField(w, h, stars, seed), {}, {}};
    p.mask = Image<std::uint8_t>(w, h, 0);
    for (int j = 0; j < h; ++j)
        for (int i = 0; i < w; ++i)
            p.mask(i, j) = p.f.sim.defects(i, j);
    p.sources = p.f.det.sources;
    Sources& s = p.sources;
    const std::size_t n = s.size();
    // Masked blocks over every 7th source: a corner (fit with masked pixels) or the whole core (fails).
    for (std::size_t k = 0; k < n; k += 7) {
        const int cx = static_cast<int>(std::lround(s.x[k])), cy = static_cast<int>(std::lround(s.y[k]));
        const int r = (k / 7) % 2 ? 1 : 3;
        const int ox = (k / 7) % 2 ? 1 : -1;
        for (int j = cy - r; j <= cy + r; ++j)
            for (int i = cx + ox - r; i <= cx + ox + r; ++i)
                if (i >= 0 && j >= 0 && i < w && j < h) p.mask(i, j) |= 1;
    }
    // Some sources moved: on the edges, half off, outside, non-finite.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double xs[] = {0.0, w - 1.0, 2.3, -3.0, w + 2.5, 40.7, nan, 17.0, 1.6, w - 2.2};
    const double ys[] = {0.0, h - 1.0, h - 2.6, 20.0, 30.0, -1.2, 12.0, nan, h * 0.5, h * 0.25};
    for (std::size_t e = 0; e < 10 && 3 + 11 * e < n; ++e) {
        s.x[3 + 11 * e] = xs[e];
        s.y[3 + 11 * e] = ys[e];
    }
    return p;
}

BackgroundResult leanBackground(const PsfField& p) {
    RunContext c = cpuContext();
    BackgroundParams bp;
    bp.fullMaps = false;
    BackgroundResult b = cpu::estimateBackground(p.f.sim.image.view(), p.mask.view(), bp, c, nullptr);
    b.sampler = std::make_shared<const BackgroundSampler>(b, c);
    return b;
}

BackgroundResult globalBackground(const BackgroundResult& full) {
    BackgroundResult b;
    b.globalLevel = full.globalLevel;
    b.globalRms = full.globalRms;
    return b;
}

void expectSamePsf(const PsfResult& c, const PsfResult& g, const std::string& what) {
    ASSERT_EQ(c.fluxPsf.size(), g.fluxPsf.size()) << what;
    EXPECT_TRUE(sameVec(c.fluxPsf, g.fluxPsf, what + " fluxPsf"));
    EXPECT_TRUE(sameVec(c.fluxPsfErr, g.fluxPsfErr, what + " fluxPsfErr"));
    EXPECT_TRUE(sameVec(c.flags, g.flags, what + " flags"));
    EXPECT_TRUE(sameVec(c.fwhm, g.fwhm, what + " fwhm"));
    EXPECT_TRUE(sameVec(c.ellipticity, g.ellipticity, what + " ellipticity"));
    EXPECT_TRUE(sameVec(c.theta, g.theta, what + " theta"));
    EXPECT_TRUE(sameBits(&c.medianFwhm, &g.medianFwhm, 1, what + " medianFwhm"));
    EXPECT_TRUE(sameBits(&c.medianEllipticity, &g.medianEllipticity, 1, what + " medianEllipticity"));
    EXPECT_TRUE(sameBits(&c.medianBeta, &g.medianBeta, 1, what + " medianBeta"));
    EXPECT_EQ(c.nStars, g.nStars) << what;
    ASSERT_EQ(c.stars.size(), g.stars.size()) << what;
    // Every star's profile fit (the device's, one block per star): parameters, chi2, iterations, flags.
    for (std::size_t k = 0; k < c.stars.size(); ++k) {
        const PsfStar &a = c.stars[k], &b = g.stars[k];
        const std::string s = what + " star " + std::to_string(k);
        const double pa[] = {a.fit.x0,  a.fit.y0,   a.fit.amplitude, a.fit.background, a.fit.c11,   a.fit.c12,
                             a.fit.c22, a.fit.beta, a.chi2,          a.flux,           a.shape.fwhm};
        const double pb[] = {b.fit.x0,  b.fit.y0,   b.fit.amplitude, b.fit.background, b.fit.c11,   b.fit.c12,
                             b.fit.c22, b.fit.beta, b.chi2,          b.flux,           b.shape.fwhm};
        EXPECT_TRUE(sameBits(pa, pb, 11, s + " fit"));
        EXPECT_EQ(a.index, b.index) << s;
        EXPECT_EQ(a.iterations, b.iterations) << s;
        EXPECT_EQ(a.converged, b.converged) << s;
        EXPECT_EQ(a.used, b.used) << s;
    }
    EXPECT_TRUE(sameVec(c.fwhmPoly.coeffs, g.fwhmPoly.coeffs, what + " fwhmPoly"));
    ASSERT_EQ(c.epsf.size(), g.epsf.size()) << what;
    for (std::size_t k = 0; k < c.epsf.size(); ++k)
        EXPECT_TRUE(sameImage(c.epsf[k].image, g.epsf[k].image, what + " ePSF cell " + std::to_string(k)));
}

struct Case {
    std::string name;
    PsfParams params;
    double gain;
};

std::vector<Case> cases() {
    std::vector<Case> v;
    PsfParams p;
    v.push_back({"defaults, gain 0", p, 0.0});
    v.push_back({"defaults, gain 2.5", p, 2.5});
    p.psfFitBackground = true;
    v.push_back({"fit background, gain 2.5", p, 2.5});
    v.push_back({"fit background, gain 0", p, 0.0});
    p.psfFitRadius = 4.5;
    p.maxMaskedPsfWeight = 0.05;
    v.push_back({"fit background, radius 4.5, masked weight 0.05", p, 1.0});
    // The profile fits' other set-ups: a Gaussian, a fixed beta, other quadratures.
    PsfParams q;
    q.model = PsfModelKind::Gaussian;
    q.pixelIntegration = 5;
    v.push_back({"gaussian, 5 x 5 nodes", q, 2.0});
    q = PsfParams{};
    q.fitBeta = false;
    q.pixelIntegration = 1;
    v.push_back({"moffat with a fixed beta, 1 node", q, 2.0});
    return v;
}

void compareOn(const PsfField& p, const BackgroundResult& bkg, const std::string& label) {
    for (const Case& c : cases()) {
        const std::string what = label + ", " + c.name;
        RunContext cc = cpuContext(), gc = cudaContext();
        const PsfResult cpuRes =
            cpu::buildPsfModel(p.f.sim.image.view(), p.mask.view(), bkg, p.sources, c.gain, c.params, cc);
        ASSERT_TRUE(cpuRes.hasModel()) << what << ": the field gives no PSF model (test is vacuous)";
        const PsfResult gpuRes =
            cuda::buildPsfModel(p.f.sim.image.view(), p.mask.view(), bkg, p.sources, c.gain, c.params, gc);
        EXPECT_EQ(cuda::psfLastDeviceFits(), p.sources.size()) << what << ": the device path did not run";
        // The stars' profile fits ran on the device (all but those with too few samples).
        EXPECT_GE(cuda::psfLastDeviceProfileFits(), cpuRes.stars.size() / 2) << what;
        EXPECT_GT(cuda::psfLastDeviceProfileFits(), 0u) << what;
        expectSamePsf(cpuRes, gpuRes, what);
        // Not vacuous: most sources fitted, some failed (edges, masks, NaN).
        std::size_t ok = 0, failed = 0;
        for (std::size_t k = 0; k < cpuRes.flags.size(); ++k)
            (cpuRes.flags[k] & FlagPsfFitFailed ? failed : ok) += 1;
        EXPECT_GT(ok, cpuRes.flags.size() / 2) << what;
        EXPECT_GE(failed, 5u) << what;
    }
}

// The kernel's walk (psfmath::fitFluxRewalk: the disc walked again per pass) against the host's fitPsfFlux
// (the pixel terms stored), on the host: every source, bitwise. Needs no device.
struct HostAccess {
    const PsfFrame& f;
    bool inside(int i, int j) const { return f.inside(i, j); }
    bool masked(int i, int j) const { return f.masked(i, j); }
    double data(int i, int j) const { return f.image(i, j); }
    double level(int i, int j) const { return f.level(i, j); }
    double rms(int i, int j) const { return f.rms(i, j); }
};

void compareRewalk(const PsfField& p, const BackgroundResult& bkg, const std::string& label) {
    for (const Case& c : cases()) {
        const std::string what = label + ", " + c.name;
        RunContext cc = cpuContext();
        PsfParams noPhot = c.params;
        noPhot.psfPhotometry = false;
        const PsfResult model =
            cpu::buildPsfModel(p.f.sim.image.view(), p.mask.view(), bkg, p.sources, c.gain, noPhot, cc);
        ASSERT_TRUE(model.hasModel()) << what;
        const PsfFrame frame{p.f.sim.image.view(), p.mask.view(), &bkg, c.gain};
        auto cellValue = [&](int k, double dx, double dy) { return model.epsf[k].valueAt(dx, dy); };
        const std::size_t n = p.sources.size();
        std::vector<double> f1(n, -1.0), e1(n, -1.0), f2(n, -1.0), e2(n, -1.0);
        std::vector<int> ok1(n), ok2(n);
        for (std::size_t k = 0; k < n; ++k) {
            const double x = p.sources.x[k], y = p.sources.y[k];
            const double r = psfmath::fitRadius(c.params.psfFitRadius, model.fwhm[k]);
            const PsfFluxResult h =
                fitPsfFlux(frame, model, x, y, r, c.params.psfFitBackground, c.params.maxMaskedPsfWeight);
            ok1[k] = h.ok;
            if (h.ok) {
                f1[k] = h.flux;
                e1[k] = h.fluxErr;
            }
            ok2[k] = psfmath::fitFluxRewalk(HostAccess{frame}, cellValue, model.width, model.height,
                                            model.gridNx, model.gridNy, x, y, r, c.params.psfFitBackground,
                                            c.params.maxMaskedPsfWeight, c.gain, f2[k], e2[k]);
        }
        EXPECT_TRUE(sameVec(ok1, ok2, what + " ok"));
        EXPECT_TRUE(sameVec(f1, f2, what + " flux"));
        EXPECT_TRUE(sameVec(e1, e2, what + " flux error"));
        EXPECT_GT(std::count(ok1.begin(), ok1.end(), 1), static_cast<long>(n / 2)) << what;
        EXPECT_GE(std::count(ok1.begin(), ok1.end(), 0), 5) << what;
    }
}

TEST(PsfCuda, RewalkMatchesHostFit) {
    const PsfField p = makePsfField(400, 360, 200, 5);
    compareRewalk(p, p.f.bkg, "full maps");
    compareRewalk(p, leanBackground(p), "lean maps");
    compareRewalk(p, globalBackground(p.f.bkg), "global level and rms");
    const PsfField q = makePsfField(480, 400, 260, 21);
    compareRewalk(q, q.f.bkg, "full maps (2)");
}

TEST(PsfCuda, FullMapsBitwiseCpu) {
    REQUIRE_DEVICE();
    const PsfField p = makePsfField(480, 400, 260, 21);
    compareOn(p, p.f.bkg, "full maps");
}

TEST(PsfCuda, LeanMapsAndGlobalsBitwiseCpu) {
    REQUIRE_DEVICE();
    const PsfField p = makePsfField(400, 360, 200, 5);
    compareOn(p, leanBackground(p), "lean maps");
    compareOn(p, globalBackground(p.f.bkg), "global level and rms");
}

TEST(PsfCuda, NoMaskDispatchAndSwitch) {
    REQUIRE_DEVICE();
    const PsfField p = makePsfField(400, 360, 200, 5);
    RunContext cc = cpuContext(), gc = cudaContext();
    PsfParams params;
    const PsfResult cpuRes =
        cpu::buildPsfModel(p.f.sim.image.view(), MaskView{}, p.f.bkg, p.sources, 3.0, params, cc);
    ASSERT_TRUE(cpuRes.hasModel());
    // Through core's dispatch (the registered table entry).
    const PsfResult viaTable =
        buildPsfModel(p.f.sim.image.view(), MaskView{}, p.f.bkg, p.sources, 3.0, params, gc);
    EXPECT_EQ(cuda::psfLastDeviceFits(), p.sources.size());
    expectSamePsf(cpuRes, viaTable, "no mask, dispatch");
    // Twice on one context (frame and maps cached): the same.
    const PsfResult again =
        buildPsfModel(p.f.sim.image.view(), MaskView{}, p.f.bkg, p.sources, 3.0, params, gc);
    expectSamePsf(cpuRes, again, "no mask, again");
    {
        const EnvOverride off("GPUPHOT_PSF_DEVICE", "0");
        RunContext hostFits = gc;
        useEnvironment(hostFits);
        EXPECT_FALSE(hostFits.tuning.psfOnDevice);
        const PsfResult host =
            cuda::buildPsfModel(p.f.sim.image.view(), MaskView{}, p.f.bkg, p.sources, 3.0, params, hostFits);
        EXPECT_EQ(cuda::psfLastDeviceFits(), 0u);
        EXPECT_EQ(cuda::psfLastDeviceProfileFits(), 0u);
        expectSamePsf(cpuRes, host, "GPUPHOT_PSF_DEVICE=0");
    }
    // No PSF photometry asked: no device work, the same result.
    params.psfPhotometry = false;
    const PsfResult cpuNone =
        cpu::buildPsfModel(p.f.sim.image.view(), MaskView{}, p.f.bkg, p.sources, 3.0, params, cc);
    const PsfResult gpuNone =
        cuda::buildPsfModel(p.f.sim.image.view(), MaskView{}, p.f.bkg, p.sources, 3.0, params, gc);
    EXPECT_EQ(cuda::psfLastDeviceFits(), 0u);
    EXPECT_GT(cuda::psfLastDeviceProfileFits(), 0u); // the profile fits still run on the device
    expectSamePsf(cpuNone, gpuNone, "no PSF photometry");
}

// ---- ePSF cells on the device (kernels/psf/psf_epsf.cu) -------------------------------------------------

::testing::AssertionResult sameCells(const PsfResult& c, const PsfResult& g, const std::string& what) {
    if (c.epsf.size() != g.epsf.size())
        return ::testing::AssertionFailure()
               << what << ": " << c.epsf.size() << " vs " << g.epsf.size() << " cells";
    for (std::size_t k = 0; k < c.epsf.size(); ++k) {
        const EpsfCell& a = c.epsf[k];
        const EpsfCell& b = g.epsf[k];
        const std::string cell = what + ", cell " + std::to_string(k);
        auto r = sameImage(a.image, b.image, cell + " image");
        if (!r) return r;
        if (!(r = sameBits(&a.fwhm, &b.fwhm, 1, cell + " fwhm"))) return r;
        if (!(r = sameBits(&a.centreX, &b.centreX, 1, cell + " centreX"))) return r;
        if (!(r = sameBits(&a.centreY, &b.centreY, 1, cell + " centreY"))) return r;
        if (a.oversampling != b.oversampling || a.nStars != b.nStars)
            return ::testing::AssertionFailure()
                   << cell << ": oversampling " << a.oversampling << " vs " << b.oversampling << ", stars "
                   << a.nStars << " vs " << b.nStars;
    }
    return ::testing::AssertionSuccess();
}

std::vector<std::pair<std::string, PsfParams>> epsfCases() {
    std::vector<std::pair<std::string, PsfParams>> v;
    v.push_back({"defaults", PsfParams{}});
    PsfParams p;
    p.model = PsfModelKind::Gaussian;
    p.epsfOversampling = 3;
    p.gridNx = 2;
    p.gridNy = 3;
    p.pixelIntegration = 2;
    v.push_back({"Gaussian, oversampling 3, 2 x 3 cells", p});
    p = PsfParams{};
    p.epsfOversampling = 5;
    p.gridNx = p.gridNy = 4;
    p.epsfMinStars = 12; // borrowing
    p.stampRadius = 9;
    p.maxStarsPerCell = 0;
    v.push_back({"oversampling 5, 4 x 4 cells borrowing stars, radius 9", p});
    return v;
}

// cpu::buildPsfModel with the device batch against the host loop; the number of cells the device built.
std::size_t compareEpsf(const PsfField& p, const Image<float>& image, const BackgroundResult& bkg,
                        const PsfParams& params, const std::string& what) {
    RunContext cc = cpuContext(), gc = cudaContext();
    const PsfResult cpuRes = cpu::buildPsfModel(image.view(), p.mask.view(), bkg, p.sources, 2.0, params, cc);
    EXPECT_TRUE(cpuRes.hasModel()) << what << ": the field gives no PSF model (test is vacuous)";
    const EpsfCellBatch device = cuda::deviceEpsfCellBatch(gc, image.view(), p.mask.view(), bkg);
    EXPECT_EQ(cuda::psfLastDeviceEpsfCells(), 0u) << what << ": making the batch resets the count";
    // The device batch, then its cells' double nodes (before the normalisation: the float image would hide
    // a last-bit difference of most nodes) against the host's epsfCellNodes.
    const PsfFrame frame{image.view(), p.mask.view(), &bkg, 2.0};
    std::size_t built = 0, compared = 0;
    const EpsfCellBatch batch = [&](const std::vector<EpsfCellJob>& jobs, PsfModelKind kind, int radius,
                                    int os, int nQuad, std::vector<char>& done) {
        cuda::psfKeepDeviceEpsfNodes(true);
        device(jobs, kind, radius, os, nQuad, done);
        cuda::psfKeepDeviceEpsfNodes(false);
        built = cuda::psfLastDeviceEpsfCells();
        const std::vector<std::vector<double>>& nodes = cuda::psfLastDeviceEpsfNodes();
        for (std::size_t k = 0; k < jobs.size(); ++k) {
            if (!done[k]) continue;
            ASSERT_LT(k, nodes.size()) << what;
            const std::vector<double> host =
                epsfCellNodes(frame, *jobs[k].stars, jobs[k].base, kind, radius, os, nQuad);
            EXPECT_TRUE(sameVec(host, nodes[k], what + ", double nodes of cell " + std::to_string(k)));
            ++compared;
        }
    };
    const PsfResult gpuRes = cpu::buildPsfModel(image.view(), p.mask.view(), bkg, p.sources, 2.0, params, gc,
                                                nullptr, nullptr, &batch);
    EXPECT_EQ(compared, built) << what;
    EXPECT_TRUE(sameCells(cpuRes, gpuRes, what));
    expectSamePsf(cpuRes, gpuRes, what);
    return built;
}

TEST(PsfCuda, EpsfCellsBitwiseCpu) {
    REQUIRE_DEVICE();
    const PsfField p = makePsfField(480, 400, 260, 21);
    const BackgroundResult lean = leanBackground(p), globals = globalBackground(p.f.bkg);
    for (const auto& [name, params] : epsfCases()) {
        const std::size_t cells = static_cast<std::size_t>(params.gridNx) * params.gridNy;
        EXPECT_EQ(compareEpsf(p, p.f.sim.image, p.f.bkg, params, "full maps, " + name), cells);
        EXPECT_EQ(compareEpsf(p, p.f.sim.image, lean, params, "lean maps, " + name), cells);
        EXPECT_EQ(compareEpsf(p, p.f.sim.image, globals, params, "global level, " + name), cells);
    }
    EXPECT_GT(cuda::psfLastDeviceEpsfCells(), 0u);
    const PsfField q = makePsfField(400, 360, 200, 5);
    EXPECT_EQ(compareEpsf(q, q.f.sim.image, q.f.bkg, PsfParams{}, "second field"), 9u);
}

// The cells whose stacks hold the star with source index `index`, per cell (the host's jobs).
std::vector<char> cellsHolding(const PsfField& p, const Image<float>& image, int index) {
    RunContext cc = cpuContext();
    std::vector<char> holds;
    const EpsfCellBatch probe = [&](const std::vector<EpsfCellJob>& jobs, PsfModelKind, int, int, int,
                                    std::vector<char>&) { // builds nothing: the host loop does
        holds.assign(jobs.size(), 0);
        for (std::size_t k = 0; k < jobs.size(); ++k)
            for (const PsfStar* s : *jobs[k].stars)
                holds[k] = holds[k] || s->index == index;
    };
    cpu::buildPsfModel(image.view(), p.mask.view(), p.f.bkg, p.sources, 2.0, PsfParams{}, cc, nullptr,
                       nullptr, &probe);
    return holds;
}

// A NaN pixel (not masked) in a PSF star's ePSF stamp (the corner node inside the grid), outside its fit
// disc: the cells that stack that star are the host's, the others the device's, the result the host loop's.
// The star is one that the fewest cells stack (stars are shared with neighbouring cells short of stars;
// the field is large enough for cells of their own).
TEST(PsfCuda, EpsfNonFiniteCellLeftToHost) {
    const PsfField p = makePsfField(1200, 1000, 1500, 33);
    RunContext cc = cpuContext();
    const PsfResult clean =
        cpu::buildPsfModel(p.f.sim.image.view(), p.mask.view(), p.f.bkg, p.sources, 2.0, PsfParams{}, cc);
    ASSERT_TRUE(clean.hasModel());
    const int r = clean.stampRadius;
    int index = -1, ix = 0, iy = 0;
    std::size_t fewest = clean.epsf.size();
    for (const PsfStar& s : clean.stars) {
        const int x = static_cast<int>(std::lround(s.fit.x0)) + r - 1,
                  y = static_cast<int>(std::lround(s.fit.y0)) + r - 1;
        if (!s.used || x >= p.f.sim.image.width() || y >= p.f.sim.image.height() || p.mask(x, y) != 0)
            continue;
        const std::vector<char> holds = cellsHolding(p, p.f.sim.image, s.index);
        const std::size_t n = static_cast<std::size_t>(std::count(holds.begin(), holds.end(), 1));
        if (n >= 1 && n < fewest) {
            fewest = n;
            index = s.index;
            ix = x;
            iy = y;
            if (n == 1) break; // none fewer
        }
    }
    ASSERT_GE(index, 0) << "no PSF star that only some cells stack";
    Image<float> image = p.f.sim.image;
    image(ix, iy) = std::numeric_limits<float>::quiet_NaN();
    const PsfResult dirty =
        cpu::buildPsfModel(image.view(), p.mask.view(), p.f.bkg, p.sources, 2.0, PsfParams{}, cc);
    bool used = false;
    for (const PsfStar& s : dirty.stars)
        used = used || (s.index == index && s.used);
    ASSERT_TRUE(used) << "the star must stay a PSF star for the test to mean anything";
    const std::vector<char> holds = cellsHolding(p, image, index);
    const std::size_t held = static_cast<std::size_t>(std::count(holds.begin(), holds.end(), 1));
    ASSERT_GE(held, 1u);
    ASSERT_LT(held, dirty.epsf.size());
    REQUIRE_DEVICE();
    // The NaN can also fall in a neighbour's stamp in another cell: at most the cells without the star.
    const std::size_t built = compareEpsf(p, image, p.f.bkg, PsfParams{}, "a NaN pixel");
    EXPECT_GE(built, 1u);
    EXPECT_LE(built, dirty.epsf.size() - held);
}

// Through the CUDA stage (kernels/psf/psf.cu passes the device batch to cpu::buildPsfModel): the device built
// the cells, bitwise the CPU stage's.
TEST(PsfCuda, EpsfCellsThroughCudaStage) {
    REQUIRE_DEVICE();
    const PsfField p = makePsfField(480, 400, 260, 21);
    RunContext cc = cpuContext(), gc = cudaContext();
    const PsfResult cpuRes =
        cpu::buildPsfModel(p.f.sim.image.view(), p.mask.view(), p.f.bkg, p.sources, 2.5, PsfParams{}, cc);
    ASSERT_TRUE(cpuRes.hasModel());
    const PsfResult gpuRes =
        cuda::buildPsfModel(p.f.sim.image.view(), p.mask.view(), p.f.bkg, p.sources, 2.5, PsfParams{}, gc);
    EXPECT_EQ(cuda::psfLastDeviceEpsfCells(), cpuRes.epsf.size()) << "the device ePSF path did not run";
    EXPECT_TRUE(sameCells(cpuRes, gpuRes, "CUDA stage"));
    expectSamePsf(cpuRes, gpuRes, "CUDA stage");
}

} // namespace
