// Acceptance of the measurement stages on a simulated field with known truth. The figures printed here
// are the ones recorded in docs/ACCURACY.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"

using namespace gpuphot;

namespace {

double median(std::vector<double> v) {
    if (v.empty()) return std::nan("");
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double robustSigma(const std::vector<double>& v) {
    const double m = median(v);
    std::vector<double> d;
    for (double x : v) d.push_back(std::fabs(x - m));
    return 1.4826 * median(d);
}

// Nearest catalog source within `radius` px of each truth position (grid hash), -1 if none.
std::vector<int> matchTruth(const std::vector<double>& tx, const std::vector<double>& ty, const Sources& s,
                            double radius) {
    const double cell = std::max(radius, 2.0);
    std::map<std::pair<int, int>, std::vector<int>> grid;
    for (std::size_t i = 0; i < s.size(); ++i)
        grid[{static_cast<int>(std::floor(s.x[i] / cell)), static_cast<int>(std::floor(s.y[i] / cell))}].push_back(
            static_cast<int>(i));
    std::vector<int> out(tx.size(), -1);
    for (std::size_t k = 0; k < tx.size(); ++k) {
        const int cx = static_cast<int>(std::floor(tx[k] / cell)), cy = static_cast<int>(std::floor(ty[k] / cell));
        double best = radius * radius;
        for (int dy = -1; dy <= 1; ++dy)
            for (int dx = -1; dx <= 1; ++dx) {
                auto it = grid.find({cx + dx, cy + dy});
                if (it == grid.end()) continue;
                for (int i : it->second) {
                    const double d2 = (s.x[i] - tx[k]) * (s.x[i] - tx[k]) + (s.y[i] - ty[k]) * (s.y[i] - ty[k]);
                    if (d2 < best) {
                        best = d2;
                        out[k] = i;
                    }
                }
            }
    }
    return out;
}

struct Field {
    SimParams params;
    SimResult sim;
    Frame frame;
    PipelineConfig config;
    PipelineResult result;
    std::vector<double> tx, ty, flux, mag; // 0-based truth positions
    std::vector<bool> isolated, star;
    std::vector<double> neighbourRatio; // flux of the brightest other star within 3 FWHM / own flux
    std::vector<int> match;
};

// 4096 x 4096, 20,000 stars, FWHM 3 px (the acceptance field), reduced once for every test of this file.
const Field& field() {
    static const Field f = [] {
        Field f;
        f.params.width = 4096;
        f.params.height = 4096;
        f.params.stars = 20000;
        f.params.fwhm = 3.0;
        f.params.seed = 2024;
        f.sim = simulateField(f.params);
        f.frame = frameFromSimulation(f.sim);
        RunContext ctx;
        f.result = runPipeline(f.frame, f.config, ctx);
        for (const auto& r : ctx.records) std::printf("[accuracy] %-24s %.2f s\n", r.stage.c_str(), r.seconds);
        const Table& t = f.sim.truth;
        f.tx = t.doubles("x");
        f.ty = t.doubles("y");
        for (auto& v : f.tx) v -= 1.0;
        for (auto& v : f.ty) v -= 1.0;
        f.flux = t.doubles("flux");
        f.mag = t.doubles("mag");
        const auto gal = t.doubles("is_galaxy"), sat = t.doubles("saturated");
        const std::size_t n = f.tx.size();
        f.isolated.assign(n, true);
        f.neighbourRatio.assign(n, 0.0);
        f.star.assign(n, true);
        // Isolated: no neighbour brighter than (mag + 1) within 3 FWHM.
        const double r = 3.0 * f.params.fwhm;
        std::map<std::pair<int, int>, std::vector<int>> grid;
        for (std::size_t i = 0; i < n; ++i) grid[{int(f.tx[i] / r), int(f.ty[i] / r)}].push_back(int(i));
        for (std::size_t i = 0; i < n; ++i) {
            f.star[i] = gal[i] == 0 && sat[i] == 0;
            for (int dy = -1; dy <= 1; ++dy)
                for (int dx = -1; dx <= 1; ++dx) {
                    auto it = grid.find({int(f.tx[i] / r) + dx, int(f.ty[i] / r) + dy});
                    if (it == grid.end()) continue;
                    for (int j : it->second) {
                        if (j == int(i)) continue;
                        const double d = std::hypot(f.tx[j] - f.tx[i], f.ty[j] - f.ty[i]);
                        if (d >= r) continue;
                        if (f.mag[j] < f.mag[i] + 1.0) f.isolated[i] = false;
                        f.neighbourRatio[i] = std::max(f.neighbourRatio[i], f.flux[j] / f.flux[i]);
                    }
                }
        }
        f.match = matchTruth(f.tx, f.ty, f.result.detection.sources, 1.0);
        return f;
    }();
    return f;
}

// Expected S/N of a star in a circular aperture of radius r (px) from the truth: Moffat encircled energy.
double expectedSnr(const Field& f, std::size_t i, double r) {
    const double beta = f.params.moffatBeta, fwhm = f.params.fwhm;
    const double alpha = fwhm / (2.0 * std::sqrt(std::pow(2.0, 1.0 / beta) - 1.0));
    const double ee = 1.0 - std::pow(1.0 + (r / alpha) * (r / alpha), 1.0 - beta);
    const double g = f.params.gain, rn = f.params.readNoise;
    const double signal = f.flux[i] * ee, area = M_PI * r * r;
    const double var = signal / g + area * (f.params.sky / g + (rn / g) * (rn / g));
    return signal / std::sqrt(var);
}

} // namespace

TEST(Accuracy, CompletenessOfIsolatedStarsAboveSnr10) {
    const Field& f = field();
    std::size_t n = 0, found = 0;
    for (std::size_t i = 0; i < f.tx.size(); ++i) {
        if (!f.star[i] || !f.isolated[i] || expectedSnr(f, i, 1.5 * f.params.fwhm) < 10.0) continue;
        if (f.tx[i] < 5 || f.ty[i] < 5 || f.tx[i] > f.params.width - 6 || f.ty[i] > f.params.height - 6) continue;
        ++n;
        found += f.match[i] >= 0;
    }
    const double completeness = double(found) / n;
    std::printf("[accuracy] completeness (isolated, S/N >= 10): %zu / %zu = %.4f\n", found, n, completeness);
    ASSERT_GT(n, 1000u);
    EXPECT_GE(completeness, 0.98);
}

TEST(Accuracy, PositionsOfBrightStars) {
    // Stars with S/N > 100 whose neighbours within 3 FWHM all have less than 10% of their flux: the
    // windowed centroid is a single-object estimator, so a blended neighbour shifts it physically. The
    // figure for the completeness test's looser isolation (no neighbour within 1 mag) is printed too.
    const Field& f = field();
    const Sources& s = f.result.detection.sources;
    auto rms = [](const std::vector<double>& v) {
        return std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.0) / v.size());
    };
    for (const double maxRatio : {0.4, 0.1}) {
        std::vector<double> dx, dy;
        for (std::size_t i = 0; i < f.tx.size(); ++i) {
            if (!f.star[i] || f.neighbourRatio[i] >= maxRatio || f.match[i] < 0) continue;
            if (expectedSnr(f, i, 1.5 * f.params.fwhm) < 100.0 || s.flags[f.match[i]] != 0) continue;
            dx.push_back(s.x[f.match[i]] - f.tx[i]);
            dy.push_back(s.y[f.match[i]] - f.ty[i]);
        }
        std::printf("[accuracy] position rms (S/N > 100, neighbours < %.0f%% of the flux, n=%zu): x %.4f px, y %.4f px\n",
                    100 * maxRatio, dx.size(), rms(dx), rms(dy));
        if (maxRatio > 0.2) continue;
        ASSERT_GT(dx.size(), 200u);
        EXPECT_LE(rms(dx), 0.02);
        EXPECT_LE(rms(dy), 0.02);
    }
}

TEST(Accuracy, FluxPullsHaveUnitWidth) {
    // Pulls against a noiseless twin of the same field, measured at the same positions with the same
    // segmentation: the difference is pure noise, so (noisy - noiseless) / error must have sigma 1.
    const Field& f = field();
    SimParams quiet = f.params;
    quiet.noise = false;
    const SimResult twin = simulateField(quiet);
    const Frame twinFrame = frameFromSimulation(twin);
    RunContext ctx;
    const BackgroundResult bkg = estimateBackground(twinFrame.view(), twinFrame.maskView(), f.config.background, ctx);
    const ApertureResult ref = measureApertures(twinFrame.view(), twinFrame.maskView(), bkg,
                                                f.result.detection.segmentation.view(), f.result.detection.sources,
                                                f.result.fwhm, f.frame.instrument.gain, f.frame.instrument.readNoise,
                                                f.config.aperture, ctx);
    const ApertureResult& ap = f.result.aperture;
    for (std::size_t r = 0; r < ap.radii.size(); ++r) {
        std::vector<double> pulls;
        for (std::size_t i = 0; i < f.tx.size(); ++i) {
            const int k = f.match[i];
            if (!f.star[i] || !f.isolated[i] || k < 0 || ap.flags[k] != 0) continue;
            const double e = ap.fluxErr[r][k];
            if (!(e > 0)) continue;
            pulls.push_back((ap.flux[r][k] - ref.flux[r][k]) / e);
        }
        double mean = std::accumulate(pulls.begin(), pulls.end(), 0.0) / pulls.size(), var = 0;
        for (double p : pulls) var += (p - mean) * (p - mean);
        const double sd = std::sqrt(var / (pulls.size() - 1)), rs = robustSigma(pulls);
        std::printf("[accuracy] flux pulls r=%.2f px: n=%zu mean %.3f sd %.3f robust sd %.3f\n", ap.radii[r],
                    pulls.size(), mean, sd, rs);
        ASSERT_GT(pulls.size(), 1000u);
        EXPECT_NEAR(rs, 1.0, 0.10) << "radius " << ap.radii[r];
        EXPECT_NEAR(sd, 1.0, 0.10) << "radius " << ap.radii[r];
    }
}

TEST(Accuracy, ApertureCorrectedMagnitudesOfBrightStarsAreUnbiased) {
    const Field& f = field();
    const ApertureResult& ap = f.result.aperture;
    const auto magInst = f.sim.truth.doubles("mag_inst");
    for (std::size_t r = 0; r < ap.radii.size(); ++r) {
        std::vector<double> d;
        for (std::size_t i = 0; i < f.tx.size(); ++i) {
            const int k = f.match[i];
            if (!f.star[i] || !f.isolated[i] || k < 0 || ap.flags[k] != 0) continue;
            if (expectedSnr(f, i, 1.5 * f.params.fwhm) < 200.0) continue;
            d.push_back(apertureCorrectedMag(ap, r, k) - magInst[i]);
        }
        const double bias = median(d);
        std::printf("[accuracy] aperture-corrected mag bias r=%.2f px: %+.4f mag (n=%zu, robust sd %.4f)\n",
                    ap.radii[r], bias, d.size(), robustSigma(d));
        ASSERT_GT(d.size(), 100u);
        EXPECT_LE(std::fabs(bias), 0.002) << "radius " << ap.radii[r];
    }
}

TEST(Accuracy, PsfFwhmRecoveredAcrossAFieldVarying30Percent) {
    SimParams p;
    p.width = 2048;
    p.height = 2048;
    p.stars = 4000;
    p.seed = 77;
    p.fwhm = 3.4;
    p.fwhmGradientX = 0.065; // linear: FWHM(top right corner) / FWHM(bottom left corner) = 1.13 / 0.87 = 1.30
    p.fwhmGradientY = 0.065;
    const SimResult sim = simulateField(p);
    const double lo = simPsfAt(p, 0, 0).fwhm, hi = simPsfAt(p, p.width - 1, p.height - 1).fwhm;
    ASSERT_NEAR(hi / lo, 1.30, 0.02) << "the field varies by 30% corner to corner";
    const Frame frame = frameFromSimulation(sim);
    RunContext ctx;
    const PipelineResult r = runPipeline(frame, PipelineConfig{}, ctx);
    ASSERT_TRUE(r.psf.hasModel());
    double worst = 0.0;
    for (int j = 0; j <= 8; ++j)
        for (int i = 0; i <= 8; ++i) {
            const double x = i * (p.width - 1) / 8.0, y = j * (p.height - 1) / 8.0;
            const double truth = simPsfAt(p, x, y).fwhm;
            worst = std::max(worst, std::fabs(r.psf.fwhmAt(x, y) / truth - 1.0));
        }
    std::printf("[accuracy] PSF FWHM worst relative error on a 9x9 grid: %.4f (%d stars)\n", worst, r.psf.nStars);
    EXPECT_LE(worst, 0.02);
}
