// The PSF profile fit's fixed sum order (core/stages/psf/psf_fit_math.hpp), on which the CUDA batch
// (kernels/psf/psf.cu, one block per star) relies to give the host's bits: fitProfile equals psffit::lmFit
// driven by this test's own evaluator, which makes every sum in full in the documented order (lanes of
// strided samples, then the tree) and never stops early. So the host's early stop of rejected trials
// changes no decision, and a device evaluator that follows the documented order gives the same fit.
// Also the 8 x 8 damped solve against Eigen.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/stages/psf/psf_fit_math.hpp"
#include "core/stages/psf/psf_moffat.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

namespace {

// The documented order, written out: lane l sums samples l, l + L, ...; lanes added as a tree.
struct FullPassEval {
    const std::vector<FitSample>& samples;
    const psffit::LmSetup& setup;
    int rejected = 0; // trials whose chi2 came out above the limit (the host may stop those early)
    double operator()(const double* p, double limit, double* h, double* g) {
        std::vector<std::vector<double>> lane(psffit::kLmLanes, std::vector<double>(psffit::kLmSums, 0.0));
        for (std::size_t k = 0; k < samples.size(); ++k) {
            const FitSample& s = samples[k];
            psffit::accumulateSample(setup, p, s.x, s.y, s.value, s.weight,
                                     lane[k % psffit::kLmLanes].data());
        }
        for (int step = psffit::kLmLanes / 2; step > 0; step /= 2)
            for (int l = 0; l < step; ++l)
                for (int v = 0; v < psffit::kLmSums; ++v)
                    lane[l][v] = lane[l][v] + lane[l + step][v];
        for (int k = 0; k < psffit::kLmNormal; ++k)
            h[k] = lane[0][1 + k];
        for (int k = 0; k < setup.nActive; ++k)
            g[k] = lane[0][1 + psffit::kLmNormal + k];
        if (lane[0][0] > limit) ++rejected;
        return lane[0][0];
    }
};

// A noisy elliptical Moffat (or Gaussian) star, rendered with the test's own std::pow / std::exp at the
// pixel centres (the fit integrates over the pixel: a small model mismatch, which the fit absorbs).
std::vector<FitSample> star(bool moffat, double x0, double y0, double fwhm, unsigned seed, int radius) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> noise(0.0, 1.0);
    const double alpha = fwhm / (2.0 * std::sqrt(std::pow(2.0, 1.0 / 3.0) - 1.0));
    const double sigma = fwhm / 2.3548200450309493;
    std::vector<FitSample> s;
    const int cx = static_cast<int>(std::lround(x0)), cy = static_cast<int>(std::lround(y0));
    for (int j = cy - radius; j <= cy + radius; ++j)
        for (int i = cx - radius; i <= cx + radius; ++i) {
            if ((i - cx) * (i - cx) + (j - cy) * (j - cy) > radius * radius) continue;
            const double dx = i - x0, dy = (j - y0) * 1.15;
            const double r2 = dx * dx + dy * dy;
            const double f =
                moffat ? std::pow(1.0 + r2 / (alpha * alpha), -3.0) : std::exp(-0.5 * r2 / (sigma * sigma));
            const double v = 5000.0 * f + 3.0 + 4.0 * noise(rng);
            s.push_back({static_cast<double>(i), static_cast<double>(j), v, 1.0 / 16.0});
        }
    return s;
}

bool sameBits(const ProfileFitResult& a, const ProfileFitResult& b) {
    return std::memcmp(&a.params, &b.params, sizeof(ProfileParams)) == 0 &&
           std::memcmp(&a.chi2, &b.chi2, sizeof(double)) == 0 && a.iterations == b.iterations &&
           a.converged == b.converged;
}

} // namespace

TEST(PsfFitOrder, FitProfileIsTheDocumentedOrderWithoutEarlyStops) {
    int fits = 0, rejections = 0;
    for (int kindIndex = 0; kindIndex < 2; ++kindIndex) {
        const PsfModelKind kind = kindIndex == 0 ? PsfModelKind::Moffat : PsfModelKind::Gaussian;
        for (unsigned seed = 1; seed <= 6; ++seed) {
            const double x0 = 40.0 + 0.13 * seed, y0 = 30.0 - 0.29 * seed;
            // Radii 6..14: 113..613 samples, fewer and more than the 128 lanes' one round.
            const std::vector<FitSample> samples = star(
                kind == PsfModelKind::Moffat, x0, y0, 3.0 + 0.2 * seed, seed, 4 + 2 * static_cast<int>(seed));
            ProfileParams start;
            // Starts off by up to a pixel and a factor 2 in FWHM, so that some trials are rejected.
            start.x0 = x0 + 0.15 * seed;
            start.y0 = y0 - 0.1 * seed;
            start.amplitude = 800.0 * seed;
            start.beta = 2.5;
            setProfileShape(start, kind, (3.0 + 0.2 * seed) * (seed % 2 ? 2.0 : 0.6), 0.0, 0.0);
            LmOptions opt;
            opt.maxIterations = 40;
            opt.fitBackground = seed % 2 == 0;
            opt.nQuad = 1 + static_cast<int>(seed % 4);
            const ProfileFitResult host = fitProfile(samples, kind, start, opt);

            const psffit::LmSetup setup = profileFitSetup(kind, start, opt);
            double p[psffit::kLmParams];
            profileFitStart(start, opt, p);
            FullPassEval eval{samples, setup};
            const psffit::LmOutcome o = psffit::lmFit(setup, p, eval);
            const ProfileFitResult ref =
                profileFitResult(start, o, static_cast<int>(samples.size()), setup.nActive);
            EXPECT_TRUE(sameBits(host, ref)) << "kind " << kindIndex << " seed " << seed;
            EXPECT_TRUE(host.converged) << "kind " << kindIndex << " seed " << seed;
            ++fits;
            rejections += eval.rejected;
        }
    }
    EXPECT_EQ(fits, 12);
    EXPECT_GT(rejections, 0); // the early stop was on the path
}

TEST(PsfFitOrder, TooFewSamplesAndInvalidStartsReturnTheStart) {
    const std::vector<FitSample> samples = star(true, 20.0, 20.0, 3.0, 3, 1); // 5 samples, 7 parameters
    ProfileParams start;
    start.x0 = start.y0 = 20.0;
    start.amplitude = 100.0;
    setProfileShape(start, PsfModelKind::Moffat, 3.0, 0.0, 0.0);
    const ProfileFitResult few = fitProfile(samples, PsfModelKind::Moffat, start, LmOptions{});
    EXPECT_EQ(few.iterations, 0);
    EXPECT_FALSE(few.converged);
    EXPECT_EQ(std::memcmp(&few.params, &start, sizeof start), 0);

    const std::vector<FitSample> many = star(true, 20.0, 20.0, 3.0, 3, 8);
    ProfileParams bad = start;
    bad.amplitude = -1.0; // not a valid start
    const ProfileFitResult invalid = fitProfile(many, PsfModelKind::Moffat, bad, LmOptions{});
    EXPECT_EQ(invalid.iterations, 0);
    EXPECT_EQ(invalid.chi2, 0.0);
    EXPECT_EQ(std::memcmp(&invalid.params, &bad, sizeof bad), 0);
}

TEST(PsfFitOrder, DampedSolveMatchesEigen) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int n = 1; n <= psffit::kLmParams; ++n) {
        Eigen::MatrixXd a(n + 3, n);
        for (int i = 0; i < a.rows(); ++i)
            for (int j = 0; j < n; ++j)
                a(i, j) = u(rng) * (1.0 + 100.0 * j); // columns of different scales
        const Eigen::MatrixXd h = a.transpose() * a;
        Eigen::VectorXd g(n);
        for (int i = 0; i < n; ++i)
            g(i) = u(rng);
        const double lambda = 1e-3;
        Eigen::MatrixXd damped = h;
        double packedH[psffit::kLmNormal];
        for (int i = 0; i < n; ++i) {
            damped(i, i) = h(i, i) * (1.0 + lambda) + 1e-300;
            for (int j = 0; j <= i; ++j)
                packedH[psffit::packed(i, j)] = h(i, j);
        }
        const Eigen::VectorXd want = damped.ldlt().solve(g);
        double x[psffit::kLmParams];
        psffit::solveDamped(packedH, g.data(), n, lambda, x);
        for (int i = 0; i < n; ++i)
            EXPECT_NEAR(x[i], want(i), 1e-9 * (std::abs(want(i)) + want.cwiseAbs().maxCoeff()))
                << n << " " << i;
    }
    // A zero matrix: the 1e-300 floor gives a huge step, which lmFit's validity check rejects.
    double zero[psffit::kLmNormal] = {};
    const double g1[1] = {1.0};
    double x1[1];
    psffit::solveDamped(zero, g1, 1, 1e-3, x1);
    EXPECT_FALSE(std::isfinite(x1[0]) && std::abs(x1[0]) < 1e200);
}

// A cancel flag stops a fit at its next evaluation (the workbench's next run waits for no fit in flight);
// an unset flag changes no bit.
TEST(PsfFitOrder, CancelFlagStopsTheFitAndAnUnsetOneChangesNothing) {
    const std::vector<FitSample> samples = star(true, 40.3, 29.8, 3.2, 5, 10);
    ProfileParams start;
    start.x0 = 40.6;
    start.y0 = 29.5;
    start.amplitude = 3000.0;
    start.beta = 2.5;
    setProfileShape(start, PsfModelKind::Moffat, 4.0, 0.0, 0.0);
    const LmOptions opt;
    std::atomic<bool> cancel{false};
    const ProfileFitResult plain = fitProfile(samples, PsfModelKind::Moffat, start, opt);
    const ProfileFitResult flagged = fitProfile(samples, PsfModelKind::Moffat, start, opt, &cancel);
    EXPECT_TRUE(sameBits(plain, flagged));
    EXPECT_GT(plain.iterations, 1);
    cancel = true;
    EXPECT_THROW(fitProfile(samples, PsfModelKind::Moffat, start, opt, &cancel), Cancelled);
}
