#include "core/sim/simulator.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numbers>
#include <vector>

#include <omp.h>

#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/psf_profile.hpp"
#include "core/sim/sim_random.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot {
namespace {

constexpr double kPi = std::numbers::pi;
constexpr double kDeg = kPi / 180.0;
constexpr int kBandRows = 32; // render band height (fixed: the image does not depend on it anyway)

// Independent random streams, so that e.g. adding galaxies does not move the stars.
enum Stream : std::uint64_t {
    kStreamPos = 1, kStreamMag, kStreamColour, kStreamPm, kStreamClusters, kStreamGalaxies, kStreamNoise,
    kStreamCosmics, kStreamHot, kStreamColumns, kStreamSip /* = 11, used in sim_wcs.cpp */, kStreamRefNoise,
    kStreamDistractors, kStreamDead, kStreamBiasRow, kStreamBiasColumn, kStreamPrnu, kStreamDarkHot,
    kStreamOverscan, kStreamScintillation
};

std::uint64_t detectorSeedOf(const SimParams& p) { return p.detectorSeed != 0 ? p.detectorSeed : p.seed; }

// The fixed detector structure of a raw frame: bias pattern, pixel response (flat) and dark current.
// Every value is a function of the detector seed and the pixel's data-section position only.
struct DarkHot {
    std::int64_t index;
    double rate; // e-/s
};
struct Detector {
    const SimParams* p = nullptr;
    std::uint64_t seed = 0;
    bool hasFlat = false, hasBiasPattern = false, hasDark = false;
    double vigNorm = 1.0; // median of the vignetting over the data section (the flat's median is ~1)
    std::vector<DarkHot> hot; // sorted by index

    explicit Detector(const SimParams& sp) : p(&sp), seed(detectorSeedOf(sp)) {
        hasFlat = sp.flatVignetting > 0.0 || sp.flatPixelSigma > 0.0;
        hasBiasPattern = sp.biasRowAmplitude > 0.0 || sp.biasColumnAmplitude > 0.0;
        hasDark = (sp.darkCurrent > 0.0 || sp.darkHotPixels > 0) && sp.exptime > 0.0;
        if (sp.flatVignetting > 0.0) {
            constexpr int kGrid = 129;
            std::vector<double> v;
            v.reserve(kGrid * kGrid);
            for (int j = 0; j < kGrid; ++j)
                for (int i = 0; i < kGrid; ++i)
                    v.push_back(vignetting((i + 0.5) / kGrid * sp.width - 0.5, (j + 0.5) / kGrid * sp.height - 0.5));
            std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
            vigNorm = v[v.size() / 2];
        }
        sim::SimRng rng(seed, kStreamDarkHot);
        for (int i = 0; i < sp.darkHotPixels; ++i) {
            const int x = rng.uniformInt(sp.width), y = rng.uniformInt(sp.height);
            const double rate = sp.darkHotMin * std::pow(sp.darkHotMax / sp.darkHotMin, rng.uniform());
            hot.push_back({static_cast<std::int64_t>(y) * sp.width + x, rate});
        }
        std::stable_sort(hot.begin(), hot.end(), [](const DarkHot& a, const DarkHot& b) { return a.index < b.index; });
    }
    double vignetting(double x, double y) const {
        const double xn = (x - (p->width - 1) * 0.5) / (0.5 * p->width);
        const double yn = (y - (p->height - 1) * 0.5) / (0.5 * p->height);
        return 1.0 - p->flatVignetting * 0.5 * (xn * xn + yn * yn);
    }
    double flat(int x, int y) const {
        double f = p->flatVignetting > 0.0 ? vignetting(x, y) / vigNorm : 1.0;
        if (p->flatPixelSigma > 0.0) {
            sim::CounterRng rng(seed, kStreamPrnu, static_cast<std::uint64_t>(y) * p->width + x);
            f *= 1.0 + p->flatPixelSigma * rng.normal();
        }
        return f;
    }
    double rowPattern(int y) const {
        if (p->biasRowAmplitude <= 0.0) return 0.0;
        sim::CounterRng rng(seed, kStreamBiasRow, static_cast<std::uint64_t>(y));
        return p->biasRowAmplitude * rng.normal();
    }
    double columnPattern(int x) const {
        if (p->biasColumnAmplitude <= 0.0) return 0.0;
        sim::CounterRng rng(seed, kStreamBiasColumn, static_cast<std::uint64_t>(x));
        return p->biasColumnAmplitude * rng.normal();
    }
    double bias(int x, int y) const { return hasBiasPattern ? p->bias + rowPattern(y) + columnPattern(x) : p->bias; }
};

// The parameters a frame of `p.frameType` is rendered with: calibration frames have no sources, bias
// and dark frames no light, flat frames a uniform illumination of flatLevel ADU.
SimParams effectiveParams(const SimParams& p) {
    SimParams q = p;
    if (p.frameType == "light") return q;
    q.stars = 0;
    q.galaxies = 0;
    q.clusters = 0;
    q.skyGradientX = q.skyGradientY = q.skyCorner = 0.0;
    q.sky = p.frameType == "flat" ? p.flatLevel : 0.0;
    if (p.frameType == "bias") q.exptime = 0.0;
    return q;
}

struct Source {
    double x = 0, y = 0;          // 0-based
    double mag = 0, magInst = 0, flux = 0, colour = 0, pmra = 0, pmdec = 0;
    double fwhm = 0, ellipticity = 0, angle = 0;
    double re = std::nan(""), sersicN = std::nan("");
    bool galaxy = false;
    int cluster = 0;
};

// Magnitude from the power-law luminosity function dN/dm ~ 10^(slope m) on [m0, m1], by inversion.
double sampleLf(double u, double m0, double m1, double slope) {
    if (m1 <= m0) return m0;
    if (std::fabs(slope) < 1e-9) return m0 + u * (m1 - m0);
    // 10^(s m) = 10^(s m0) + u (10^(s m1) - 10^(s m0)); written relative to m0 to avoid overflow.
    const double span = std::pow(10.0, slope * (m1 - m0)) - 1.0;
    return m0 + std::log10(1.0 + u * span) / slope;
}

// Fraction of the luminosity function brighter than `limit`.
double lfFractionBrighter(double limit, double m0, double m1, double slope) {
    if (limit <= m0) return 0.0;
    if (limit >= m1) return 1.0;
    if (std::fabs(slope) < 1e-9) return (limit - m0) / (m1 - m0);
    return (std::pow(10.0, slope * (limit - m0)) - 1.0) / (std::pow(10.0, slope * (m1 - m0)) - 1.0);
}

double toFlux(double magInst) { return std::pow(10.0, -0.4 * magInst); }

// The sources, drawn from the field seed in field coordinates, then moved by the pointing offset; a
// variation dims chosen sources and scintillation scales every flux by its own draw of this exposure.
std::vector<Source> drawSources(const SimParams& p, const SimVariation* variation) {
    const double W = p.width, H = p.height;
    const std::uint64_t fs = fieldSeedOf(p);
    sim::SimRng pos(fs, kStreamPos), mag(fs, kStreamMag), col(fs, kStreamColour), pm(fs, kStreamPm),
        clus(fs, kStreamClusters), gal(fs, kStreamGalaxies);
    auto inFrame = [&](double x, double y) { return x >= -0.5 && x < W - 0.5 && y >= -0.5 && y < H - 0.5; };

    std::vector<double> cx(p.clusters), cy(p.clusters);
    for (int c = 0; c < p.clusters; ++c) {
        const double mx = std::min(p.clusterRadius, 0.25 * W), my = std::min(p.clusterRadius, 0.25 * H);
        cx[c] = clus.uniform(mx, W - 1 - mx);
        cy[c] = clus.uniform(my, H - 1 - my);
    }
    const int nCluster = p.clusters > 0 ? static_cast<int>(std::lround(p.stars * p.clusterFraction)) : 0;

    std::vector<Source> out;
    out.reserve(static_cast<std::size_t>(p.stars) + p.galaxies);
    for (int i = 0; i < p.stars; ++i) {
        Source s;
        if (i < nCluster) {
            s.cluster = 1 + i % p.clusters;
            bool placed = false;
            for (int attempt = 0; attempt < 100 && !placed; ++attempt) {
                // Projected Plummer sphere: M(<R) = R^2 / (R^2 + a^2).
                const double u = pos.uniform(), phi = 2.0 * kPi * pos.uniform();
                const double r = p.clusterRadius * std::sqrt(u / (1.0 - u));
                s.x = cx[s.cluster - 1] + r * std::cos(phi);
                s.y = cy[s.cluster - 1] + r * std::sin(phi);
                placed = inFrame(s.x, s.y);
            }
            if (!placed) {
                s.x = cx[s.cluster - 1];
                s.y = cy[s.cluster - 1];
            }
        } else {
            s.x = pos.uniform(-0.5, W - 0.5);
            s.y = pos.uniform(-0.5, H - 0.5);
        }
        s.mag = sampleLf(mag.uniform(), p.magBright, p.magFaint, p.lfSlope);
        s.colour = p.colourMean + p.colourSigma * col.normal();
        if (p.properMotions) {
            s.pmra = p.pmSigma * pm.normal();
            s.pmdec = p.pmSigma * pm.normal();
        }
        out.push_back(s);
    }
    for (int i = 0; i < p.galaxies; ++i) {
        Source s;
        s.galaxy = true;
        s.x = gal.uniform(-0.5, W - 0.5);
        s.y = gal.uniform(-0.5, H - 0.5);
        s.mag = sampleLf(gal.uniform(), p.galaxyMagBright, p.galaxyMagFaint, p.lfSlope);
        s.colour = p.colourMean + 0.3 + p.colourSigma * gal.normal();
        s.re = p.galaxyReMin * std::pow(p.galaxyReMax / p.galaxyReMin, gal.uniform()); // log-uniform
        s.sersicN = gal.uniform(p.galaxySersicMin, p.galaxySersicMax);
        s.ellipticity = gal.uniform(0.0, 0.6);
        s.angle = gal.uniform(0.0, 180.0);
        out.push_back(s);
    }
    // The catalogue magnitude (mag) stays the star's mean; the exposure's flux carries the variation.
    std::vector<double> dmag(out.size(), 0.0);
    if (variation)
        for (std::size_t k = 0; k < variation->ids.size() && k < variation->dmag.size(); ++k) {
            const std::int64_t id = variation->ids[k];
            if (id >= 1 && static_cast<std::size_t>(id) <= out.size()) dmag[id - 1] += variation->dmag[k];
        }
    sim::SimRng scint(p.seed, kStreamScintillation);
    for (std::size_t i = 0; i < out.size(); ++i) {
        Source& s = out[i];
        s.x += p.offsetX;
        s.y += p.offsetY;
        s.magInst = s.mag + dmag[i] - p.zeroPoint - p.colourTerm * s.colour;
        s.flux = toFlux(s.magInst);
        if (p.scintillation > 0.0) s.flux *= std::max(0.0, 1.0 + p.scintillation * scint.normal());
        const SimPsf psf = simPsfAt(p, s.x, s.y);
        s.fwhm = psf.fwhm;
        if (!s.galaxy) {
            s.ellipticity = psf.ellipticity;
            s.angle = psf.angle;
        }
    }
    return out;
}

// Sparse additive defects (hot pixels, cosmic-ray pixels), applied in generation order per pixel.
struct Deposit {
    std::int64_t index;
    double adu;
    std::uint8_t mask;
};
struct BadColumn {
    int x, y0;
    bool hot;
};

std::vector<Deposit> drawDeposits(const SimParams& p) {
    std::vector<Deposit> d;
    const int W = p.width, H = p.height;
    sim::SimRng hot(detectorSeedOf(p), kStreamHot), cr(p.seed, kStreamCosmics);
    for (int i = 0; i < p.hotPixels; ++i) {
        const int x = hot.uniformInt(W), y = hot.uniformInt(H);
        const double adu = p.hotPixelMin * std::pow(p.hotPixelMax / p.hotPixelMin, hot.uniform());
        d.push_back({static_cast<std::int64_t>(y) * W + x, adu, MaskBad});
    }
    for (int i = 0; i < p.cosmicRays; ++i) {
        const double x0 = cr.uniform(-0.5, W - 0.5), y0 = cr.uniform(-0.5, H - 0.5);
        const double len = cr.uniform(0.0, p.cosmicRayLengthMax), phi = cr.uniform(0.0, 2.0 * kPi);
        const int steps = static_cast<int>(std::ceil(len / 0.25));
        std::int64_t last = -1;
        for (int k = 0; k <= steps; ++k) {
            const double t = steps > 0 ? len * k / steps : 0.0;
            const int x = static_cast<int>(std::lround(x0 + t * std::cos(phi)));
            const int y = static_cast<int>(std::lround(y0 + t * std::sin(phi)));
            if (x < 0 || y < 0 || x >= W || y >= H) continue;
            const std::int64_t idx = static_cast<std::int64_t>(y) * W + x;
            if (idx == last) continue;
            last = idx;
            const double electrons = p.cosmicRayCharge * (0.3 + 0.7 * cr.exponential());
            d.push_back({idx, electrons / p.gain, MaskCosmicRay});
        }
    }
    std::stable_sort(d.begin(), d.end(), [](const Deposit& a, const Deposit& b) { return a.index < b.index; });
    return d;
}

std::vector<BadColumn> drawBadColumns(const SimParams& p) {
    std::vector<BadColumn> c;
    sim::SimRng rng(detectorSeedOf(p), kStreamColumns);
    for (int i = 0; i < p.badColumns; ++i) {
        BadColumn b;
        b.x = rng.uniformInt(p.width);
        b.y0 = rng.uniformInt(std::max(1, p.height / 2));
        b.hot = (i % 2) == 1;
        c.push_back(b);
    }
    return c;
}

// Renders sources, sky, noise and defects into `image` in parallel row bands. Every pixel's value is a
// function of the inputs and its own index only, so the result is the same for any thread count.
void render(const SimParams& p, const std::vector<sim::Profile>& profiles, Image<float>& image,
            Image<std::uint8_t>& defects, RunContext& ctx) {
    const int W = p.width, H = p.height;
    const int nBands = (H + kBandRows - 1) / kBandRows;
    std::vector<std::vector<int>> bands(nBands);
    for (std::size_t k = 0; k < profiles.size(); ++k) {
        const auto& pr = profiles[k];
        const double reach = pr.radius + 0.7072;
        const int y0 = std::max(0, static_cast<int>(std::ceil(pr.yc - reach)));
        const int y1 = std::min(H - 1, static_cast<int>(std::floor(pr.yc + reach)));
        if (y1 < y0) continue;
        for (int b = y0 / kBandRows; b <= y1 / kBandRows; ++b) bands[b].push_back(static_cast<int>(k));
    }
    const std::vector<Deposit> deposits = drawDeposits(p);
    const std::vector<BadColumn> columns = drawBadColumns(p);
    const Detector det(p);

    std::atomic<int> done{0};
    std::atomic<bool> cancelled{false};
    const double sat = p.saturation > 0.0 ? p.saturation : INFINITY;
    const double rnAdu = p.readNoise / p.gain;
    ParallelErrors errors;
#pragma omp parallel num_threads(ctx.threadCount())
    {
        std::vector<double> acc;
        errors.run([&] { acc.resize(static_cast<std::size_t>(kBandRows) * W); });
#pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < nBands; ++b)
            errors.run([&] {
                if (cancelled.load(std::memory_order_relaxed)) return;
                if (ctx.cancelRequested()) {
                    cancelled = true;
                    return;
                }
                const int y0 = b * kBandRows, y1 = std::min(H, y0 + kBandRows);
                std::fill(acc.begin(), acc.end(), 0.0);
                for (const int k : bands[b]) {
                    const auto& pr = profiles[k];
                    const double reach = pr.radius + 0.7072;
                    const int r0 = std::max(y0, static_cast<int>(std::ceil(pr.yc - reach)));
                    const int r1 = std::min(y1 - 1, static_cast<int>(std::floor(pr.yc + reach)));
                    for (int iy = r0; iy <= r1; ++iy) {
                        const double dy = iy - pr.yc;
                        const double hx = std::sqrt(std::max(0.0, reach * reach - dy * dy));
                        const int x0 = std::max(0, static_cast<int>(std::ceil(pr.xc - hx)));
                        const int x1 = std::min(W - 1, static_cast<int>(std::floor(pr.xc + hx)));
                        double* row = acc.data() + static_cast<std::size_t>(iy - y0) * W;
                        for (int ix = x0; ix <= x1; ++ix)
                            row[ix] += pr.pixel(ix, iy);
                    }
                }
                auto dep =
                    std::lower_bound(deposits.begin(), deposits.end(), static_cast<std::int64_t>(y0) * W,
                                     [](const Deposit& d, std::int64_t v) { return d.index < v; });
                auto dh = std::lower_bound(det.hot.begin(), det.hot.end(), static_cast<std::int64_t>(y0) * W,
                                           [](const DarkHot& d, std::int64_t v) { return d.index < v; });
                for (int iy = y0; iy < y1; ++iy) {
                    const double* row = acc.data() + static_cast<std::size_t>(iy - y0) * W;
                    float* out = image.row(iy);
                    std::uint8_t* mrow = defects.row(iy);
                    for (int ix = 0; ix < W; ++ix) {
                        const std::int64_t idx = static_cast<std::int64_t>(iy) * W + ix;
                        double v = row[ix] + simSkyAt(p, ix, iy);
                        if (det.hasFlat) v *= det.flat(ix, iy);
                        if (det.hasDark) {
                            double rate = p.darkCurrent; // e-/s
                            for (; dh != det.hot.end() && dh->index == idx; ++dh)
                                rate += dh->rate;
                            v += rate * p.exptime / p.gain;
                        }
                        if (p.noise) {
                            sim::CounterRng rng(p.seed, kStreamNoise, static_cast<std::uint64_t>(idx));
                            const double electrons = rng.poisson(std::max(v, 0.0) * p.gain);
                            v = electrons / p.gain + rnAdu * rng.normal();
                        }
                        v += det.bias(ix, iy);
                        for (; dep != deposits.end() && dep->index == idx; ++dep) {
                            v += dep->adu;
                            mrow[ix] |= dep->mask;
                        }
                        out[ix] = static_cast<float>(v);
                    }
                }
                for (const auto& c : columns) {
                    for (int iy = std::max(y0, c.y0); iy < y1; ++iy) {
                        float& v = image.row(iy)[c.x];
                        if (c.hot) {
                            v = static_cast<float>(v + p.hotPixelMin);
                        } else {
                            double dead = det.bias(c.x, iy);
                            if (p.noise) {
                                sim::CounterRng rng(p.seed, kStreamDead,
                                                    static_cast<std::uint64_t>(iy) * W + c.x);
                                dead += rnAdu * rng.normal();
                            }
                            v = static_cast<float>(dead);
                        }
                        defects.row(iy)[c.x] |= MaskBad;
                    }
                }
                if (std::isfinite(sat))
                    for (int iy = y0; iy < y1; ++iy) {
                        float* out = image.row(iy);
                        for (int ix = 0; ix < W; ++ix)
                            if (out[ix] > sat) out[ix] = static_cast<float>(sat);
                    }
                const int n = ++done;
                ctx.report("simulate", static_cast<double>(n) / nBands);
            });
    }
    errors.rethrow();
    if (cancelled) throw Cancelled();
}

struct RefStar {
    double ra, dec, mag, magErr, colour, pmra, pmdec;
    std::int64_t truthId;
};

double epochYear(double mjd) { return 2000.0 + (mjd - 51544.5) / 365.25; }

Table buildReference(const SimParams& p, const TanSip& wcs, const std::vector<Source>& src,
                     std::vector<std::int64_t>& truthRefId) {
    sim::SimRng noise(fieldSeedOf(p), kStreamRefNoise), dis(fieldSeedOf(p), kStreamDistractors);
    const double dt = epochYear(p.mjd + 0.5 * p.exptime / 86400.0) - p.refEpoch; // years, frame - reference
    const double scaleDeg = p.pixelScale / 3600.0;
    const double halfDiag = 0.5 * std::hypot(p.width, p.height) * scaleDeg * 1.02 + 2.0 * p.sipStrength * scaleDeg;
    const double capRadius = std::min(halfDiag + p.refMargin, 179.0);
    std::vector<RefStar> ref;
    auto magErr = [&](double m) { return p.refMagErrFloor + p.refMagErrAtLimit * std::pow(10.0, 0.4 * (m - p.refMagLimit)); };
    auto addNoise = [&](RefStar& r) {
        const double cosd = std::max(std::cos(r.dec * kDeg), 1e-6);
        r.ra += p.refPosErr * noise.normal() / 3.6e6 / cosd;
        r.dec += p.refPosErr * noise.normal() / 3.6e6;
        r.ra = std::fmod(r.ra + 360.0, 360.0);
        r.dec = std::clamp(r.dec, -90.0, 90.0);
        r.magErr = magErr(r.mag);
        r.mag += r.magErr * noise.normal();
    };

    truthRefId.assign(src.size(), -1);
    int nField = 0;
    for (std::size_t i = 0; i < src.size(); ++i) {
        const Source& s = src[i];
        if (!s.galaxy && s.cluster == 0) ++nField;
        if (s.galaxy || !(s.mag < p.refMagLimit)) continue;
        RefStar r{};
        wcs.pixelToWorld(s.x, s.y, r.ra, r.dec);
        // Back to the reference epoch (pmra is mu_alpha* = mu_alpha cos(dec), as Gaia gives it).
        r.ra -= s.pmra * dt / 3.6e6 / std::max(std::cos(r.dec * kDeg), 1e-6);
        r.dec -= s.pmdec * dt / 3.6e6;
        r.mag = s.mag;
        r.colour = s.colour;
        r.pmra = s.pmra;
        r.pmdec = s.pmdec;
        r.truthId = static_cast<std::int64_t>(i) + 1;
        addNoise(r);
        ref.push_back(r);
    }

    // Distractors: field stars of the same density and luminosity function over the cap around the
    // frame centre, outside the frame (the frame's own stars are the truth).
    double raC, decC;
    wcs.pixelToWorld(0.5 * (p.width - 1), 0.5 * (p.height - 1), raC, decC);
    const double frameSr = static_cast<double>(p.width) * p.height * (scaleDeg * kDeg) * (scaleDeg * kDeg);
    const double capSr = 2.0 * kPi * (1.0 - std::cos(capRadius * kDeg));
    const double faintest = std::min(p.refMagLimit, p.magFaint);
    const double frac = lfFractionBrighter(p.refMagLimit, p.magBright, p.magFaint, p.lfSlope);
    const double expected = nField / frameSr * capSr * frac;
    if (expected > 5.0e6)
        throw InvalidInput("simulation parameters: the reference catalog would hold " +
                           std::to_string(static_cast<long long>(expected)) +
                           " stars; reduce refMargin or refMagLimit");
    const long long nCap = std::llround(expected);
    const double cosCap = std::cos(capRadius * kDeg);
    for (long long i = 0; i < nCap; ++i) {
        const double cosT = 1.0 - dis.uniform() * (1.0 - cosCap), pa = 2.0 * kPi * dis.uniform();
        const double mag = sampleLf(dis.uniform(), p.magBright, faintest, p.lfSlope);
        const double colour = p.colourMean + p.colourSigma * dis.normal();
        const double pmra = p.properMotions ? p.pmSigma * dis.normal() : 0.0;
        const double pmdec = p.properMotions ? p.pmSigma * dis.normal() : 0.0;
        RefStar r{};
        offsetPosition(raC, decC, std::acos(cosT) / kDeg * 60.0, pa / kDeg, r.ra, r.dec);
        const double sep = std::acos(std::clamp(cosT, -1.0, 1.0)) / kDeg;
        if (sep < halfDiag) {
            double x, y;
            if (wcs.worldToPixel(r.ra, r.dec, x, y) && x >= -0.5 && x < p.width - 0.5 && y >= -0.5 &&
                y < p.height - 0.5)
                continue; // inside the frame: those are the truth's stars
        }
        r.mag = mag;
        r.colour = colour;
        r.pmra = pmra;
        r.pmdec = pmdec;
        r.truthId = -1;
        addNoise(r);
        ref.push_back(r);
    }

    std::vector<std::size_t> order(ref.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ref[a].mag < ref[b].mag; });
    const std::size_t n = ref.size();
    std::vector<std::int64_t> id(n), truthId(n);
    std::vector<double> ra(n), dec(n), mag(n), err(n), colour(n), pmra(n), pmdec(n);
    for (std::size_t k = 0; k < n; ++k) {
        const RefStar& r = ref[order[k]];
        id[k] = static_cast<std::int64_t>(k) + 1;
        ra[k] = r.ra;
        dec[k] = r.dec;
        mag[k] = r.mag;
        err[k] = r.magErr;
        colour[k] = r.colour;
        pmra[k] = r.pmra;
        pmdec[k] = r.pmdec;
        truthId[k] = r.truthId;
        if (r.truthId > 0) truthRefId[r.truthId - 1] = id[k];
    }
    Table t;
    t.name = "REFERENCE";
    t.add("id", std::move(id), "", "reference star number (1 = brightest)");
    t.add("ra", std::move(ra), "deg", "right ascension at the reference epoch");
    t.add("dec", std::move(dec), "deg", "declination at the reference epoch");
    t.add("mag", std::move(mag), "mag", "catalogue magnitude (with catalogue noise)");
    t.add("mag_err", std::move(err), "mag", "catalogue magnitude error");
    if (p.colourSigma > 0.0) t.add("colour", std::move(colour), "mag", "colour index");
    if (p.properMotions) {
        t.add("pmra", std::move(pmra), "mas/yr", "proper motion in RA (mu_alpha cos dec)");
        t.add("pmdec", std::move(pmdec), "mas/yr", "proper motion in Dec");
    }
    t.add("truth_id", std::move(truthId), "", "row id in the truth table (-1: outside the frame)");
    t.meta.set("EPOCH", p.refEpoch, "[yr] epoch of the positions");
    t.meta.set("RA", raC, "[deg] centre of the covered cap");
    t.meta.set("DEC", decC, "[deg] centre of the covered cap");
    t.meta.set("RADIUS", capRadius, "[deg] radius of the covered cap");
    t.meta.set("MAGLIM", p.refMagLimit, "[mag] limiting magnitude (true magnitudes)");
    t.meta.set("SIMSEED", static_cast<long long>(p.seed), "simulation seed");
    return t;
}

std::string sexagesimal(double value, bool hours) {
    double v = hours ? value / 15.0 : value;
    const char sign = v < 0 ? '-' : '+';
    v = std::fabs(v);
    int d = static_cast<int>(v);
    int m = static_cast<int>((v - d) * 60.0);
    double s = ((v - d) * 60.0 - m) * 60.0;
    if (s >= 59.995) { s = 0; if (++m == 60) { m = 0; ++d; } }
    char buf[32];
    if (hours) std::snprintf(buf, sizeof buf, "%02d %02d %05.2f", d, m, s);
    else std::snprintf(buf, sizeof buf, "%c%02d %02d %04.1f", sign, d, m, s);
    return buf;
}

void addSimKeywords(Header& h, const SimParams& p, const TanSip& truth) {
    h.set("SIMULATD", true, "simulated by gpuphot simulate");
    h.set("SIMSEED", static_cast<long long>(p.seed), "simulation seed");
    h.set("SIMZP", p.zeroPoint, "[mag] true ZP: mag = -2.5 log10(flux_ADU) + ZP");
    h.set("SIMCT", p.colourTerm, "true colour term: mag = m_inst + ZP + CT * colour");
    h.set("SIMNSTAR", p.stars, "stars rendered");
    h.set("SIMNGAL", p.galaxies, "galaxies rendered");
    h.set("SIMPSF", p.psf == "moffat" ? "MOFFAT" : "GAUSSIAN", "PSF model");
    if (p.psf == "moffat") h.set("SIMBETA", p.moffatBeta, "Moffat beta");
    h.set("SIMFWHM", p.fwhm, "[px] FWHM at the frame centre");
    h.set("SIMFWHMC", p.fwhmCornerFactor, "FWHM(corner) / FWHM(centre)");
    h.set("SIMELL", p.ellipticity, "PSF ellipticity at the centre");
    h.set("SIMELLC", p.ellipticityCorner, "PSF ellipticity at the corners");
    h.set("SIMSKY", p.sky, "[ADU] sky level at the centre (without bias)");
    h.set("SIMBIAS", p.bias, "[ADU] bias level");
    h.set("SIMNOISE", p.noise, "photon and read noise added");
    h.set("SIMPSCL", p.pixelScale, "[arcsec/px] true pixel scale");
    h.set("SIMROT", p.rotation, "[deg] true position angle of +y");
    h.set("SIMCRVL1", truth.crval[0], "[deg] true RA of the frame centre");
    h.set("SIMCRVL2", truth.crval[1], "[deg] true Dec of the frame centre");
    h.set("SIMSIP", truth.sipOrder, "true SIP order");
    h.set("SIMSIPS", p.sipStrength, "[px] true SIP strength at the border");
    h.set("SIMWOFF", p.wcsOffset, "[arcmin] header WCS centre error");
    h.set("SIMWROT", p.wcsRotation, "[deg] header WCS rotation error");
    h.set("SIMWSCL", p.wcsScaleError, "header WCS scale error (fraction)");
    h.set("SIMREFLM", p.refMagLimit, "[mag] reference catalog limit");
    if (p.detectorSeed != 0) h.set("SIMDSEED", static_cast<long long>(p.detectorSeed), "detector structure seed");
    if (p.darkCurrent > 0 || p.darkHotPixels > 0) h.set("SIMDARK", p.darkCurrent, "[e-/s] dark current");
    if (p.flatVignetting > 0) h.set("SIMVIGN", p.flatVignetting, "flat-field vignetting at the corners");
    if (p.flatPixelSigma > 0) h.set("SIMPRNU", p.flatPixelSigma, "pixel-to-pixel response RMS");
}

// The directory the simulation's files go to (created when missing; "" is the current directory).
std::filesystem::path outputDirectory(const std::string& dir) {
    namespace fs = std::filesystem;
    const fs::path base = dir.empty() ? fs::path(".") : fs::path(dir);
    std::error_code ec;
    fs::create_directories(base, ec);
    if (ec) throw IoError(base.string() + ": cannot create the output directory: " + ec.message());
    return base;
}

// A float map of one per-pixel detector quantity, value(det, x, y), for the effective parameters.
template <class Value> Image<float> detectorMap(const SimParams& pIn, const Value& value) {
    const SimParams p = effectiveParams(pIn);
    const Detector det(p);
    Image<float> m(p.width, p.height, Image<float>::NoInit{});
#pragma omp parallel for schedule(static)
    for (int y = 0; y < p.height; ++y)
        for (int x = 0; x < p.width; ++x) m(x, y) = static_cast<float>(value(det, x, y));
    return m;
}

// Each source's rendering profile (star PSF or PSF-convolved galaxy), built in parallel; one slot per source.
std::vector<sim::Profile> makeProfiles(const SimParams& p, const std::vector<Source>& src, RunContext& ctx) {
    const sim::ProfileKind kind = p.psf == "moffat" ? sim::ProfileKind::Moffat : sim::ProfileKind::Gaussian;
    std::vector<sim::Profile> profiles(src.size());
    ParallelErrors errors;
#pragma omp parallel for num_threads(ctx.threadCount()) schedule(static)
    for (std::ptrdiff_t i = 0; i < static_cast<std::ptrdiff_t>(src.size()); ++i)
        errors.run([&] {
            const Source& s = src[i];
            if (s.galaxy)
                profiles[i] =
                    sim::makeGalaxy(s.x, s.y, s.flux, s.re, s.sersicN, s.ellipticity, s.angle,
                                    sim::gaussianSigma(s.fwhm), p.renderThreshold, p.maxStampRadius);
            else
                profiles[i] = sim::makeStar(kind, s.x, s.y, s.flux, s.fwhm, s.ellipticity, s.angle,
                                            p.moffatBeta, p.renderThreshold, p.maxStampRadius);
        });
    errors.rethrow();
    return profiles;
}

// The truth table's columns, one entry per source (ref_id comes from the reference catalog).
struct TruthColumns {
    std::vector<std::int64_t> id, cluster;
    std::vector<double> x, y, ra, dec, flux, mag, magInst, colour, fwhm, ell, theta, re, sersic;
    std::vector<std::uint8_t> isGalaxy, saturated;

    explicit TruthColumns(std::size_t n)
        : id(n), cluster(n), x(n), y(n), ra(n), dec(n), flux(n), mag(n), magInst(n), colour(n), fwhm(n),
          ell(n), theta(n), re(n), sersic(n), isGalaxy(n), saturated(n) {}
};

// The sources' true values (1-based pixel positions, frame-epoch sky positions) and whether a pixel within
// 1 px of each centre reached saturation in the rendered data section.
TruthColumns truthColumns(const SimParams& p, const std::vector<Source>& src, const TanSip& trueWcs,
                          const Image<float>& image) {
    const std::size_t n = src.size();
    TruthColumns c(n);
    const double sat = p.saturation > 0.0 ? p.saturation : INFINITY;
    for (std::size_t i = 0; i < n; ++i) {
        const Source& s = src[i];
        c.id[i] = static_cast<std::int64_t>(i) + 1;
        c.x[i] = s.x + 1.0;
        c.y[i] = s.y + 1.0;
        trueWcs.pixelToWorld(s.x, s.y, c.ra[i], c.dec[i]);
        c.flux[i] = s.flux;
        c.mag[i] = s.mag;
        c.magInst[i] = s.magInst;
        c.colour[i] = s.colour;
        c.fwhm[i] = s.fwhm;
        c.ell[i] = s.ellipticity;
        c.theta[i] = s.angle;
        c.re[i] = s.re;
        c.sersic[i] = s.sersicN;
        c.isGalaxy[i] = s.galaxy ? 1 : 0;
        c.cluster[i] = s.cluster;
        const int cx = static_cast<int>(std::lround(s.x)), cy = static_cast<int>(std::lround(s.y));
        bool satHit = false;
        for (int yy = std::max(0, cy - 1); yy <= std::min(p.height - 1, cy + 1) && !satHit; ++yy)
            for (int xx = std::max(0, cx - 1); xx <= std::min(p.width - 1, cx + 1); ++xx)
                if (image(xx, yy) >= sat) satHit = true;
        c.saturated[i] = satHit ? 1 : 0;
    }
    return c;
}

// The TRUTH table from the columns (moved in) and the reference ids, with the simulation keywords, the
// epoch and the true WCS.
void fillTruthTable(Table& t, const SimParams& p, const TanSip& trueWcs, TruthColumns& c,
                    std::vector<std::int64_t>& refId) {
    t.name = "TRUTH";
    t.add("id", std::move(c.id), "", "source number");
    t.add("x", std::move(c.x), "pix", "true x (1-based FITS pixel)");
    t.add("y", std::move(c.y), "pix", "true y (1-based FITS pixel)");
    t.add("ra", std::move(c.ra), "deg", "true right ascension at the frame epoch");
    t.add("dec", std::move(c.dec), "deg", "true declination at the frame epoch");
    t.add("flux", std::move(c.flux), "adu", "total flux");
    t.add("mag", std::move(c.mag), "mag", "calibrated magnitude (reference band)");
    t.add("mag_inst", std::move(c.magInst), "mag", "-2.5 log10(flux)");
    t.add("colour", std::move(c.colour), "mag", "colour index");
    t.add("fwhm", std::move(c.fwhm), "pix", "PSF FWHM at the source");
    t.add("ellipticity", std::move(c.ell), "", "1 - b/a (PSF for stars, shape for galaxies)");
    t.add("theta", std::move(c.theta), "deg", "major axis, counter-clockwise from +x");
    t.add("is_galaxy", std::move(c.isGalaxy), "", "1: galaxy");
    t.add("r_eff", std::move(c.re), "pix", "galaxy half-light radius (NaN for stars)");
    t.add("sersic_n", std::move(c.sersic), "", "galaxy Sersic index (NaN for stars)");
    t.add("saturated", std::move(c.saturated), "", "1: a pixel within 1 px of the centre is saturated");
    t.add("cluster", std::move(c.cluster), "", "cluster number (0: field)");
    t.add("ref_id", std::move(refId), "", "reference catalog id (-1: not in the reference)");
    addSimKeywords(t.meta, p, trueWcs);
    t.meta.set("MJD-OBS", p.mjd, "[d] start of exposure");
    t.meta.set("EPOCH", epochYear(p.mjd + 0.5 * p.exptime / 86400.0), "[yr] epoch of the true positions");
    t.meta.update(trueWcs.toHeader());
}

// Raw frame: bias-only prescan/overscan columns around the data section (replaces r.image and r.defects;
// only called with prescan + overscan > 0).
void addOverscan(const SimParams& p, SimResult& r, RunContext& ctx) {
    const int pre = p.prescan, over = p.overscan;
    const Detector det(p);
    const int W = p.width, H = p.height, RW = W + pre + over;
    Image<float> raw(RW, H, Image<float>::NoInit{});
    Image<std::uint8_t> rawDefects(RW, H, 0);
    const double rnAdu = p.readNoise / p.gain;
#pragma omp parallel for num_threads(ctx.threadCount()) schedule(static)
    for (int y = 0; y < H; ++y) {
        float* out = raw.row(y);
        std::uint8_t* m = rawDefects.row(y);
        std::copy(r.image.row(y), r.image.row(y) + W, out + pre);
        std::copy(r.defects.row(y), r.defects.row(y) + W, m + pre);
        const double level = p.bias + det.rowPattern(y);
        for (int x = 0; x < RW; ++x) {
            if (x >= pre && x < pre + W) continue;
            double v = level;
            if (p.noise) {
                sim::CounterRng rng(p.seed, kStreamOverscan, static_cast<std::uint64_t>(y) * RW + x);
                v += rnAdu * rng.normal();
            }
            out[x] = static_cast<float>(v);
            m[x] = MaskOutside;
        }
    }
    r.image = std::move(raw);
    r.defects = std::move(rawDefects);
}

// The image header: observation and instrument keywords, the (perturbed) pointing, the header WCS, the
// frame type, the raw frame's sections and the simulation keywords.
void fillImageHeader(const SimParams& p, SimResult& r) {
    const int pre = p.prescan, over = p.overscan;
    Header& h = r.header;
    h.set("OBJECT", p.object, "target");
    h.set("TELESCOP", "GPUPHOT-SIM", "simulated telescope");
    h.set("INSTRUME", "SIMCAM", "simulated camera");
    h.set("FILTER", p.filter, "filter");
    h.set("EXPTIME", p.exptime, "[s] exposure time");
    h.set("DATE-OBS", mjdToIso(p.mjd), "UTC start of exposure");
    h.set("MJD-OBS", p.mjd, "[d] MJD at the start of exposure");
    h.set("AIRMASS", p.airmass, "airmass");
    if (p.writeSite) {
        h.set("SITELAT", p.siteLatitude, "[deg] observatory latitude");
        h.set("SITELONG", p.siteLongitude, "[deg] observatory longitude, east positive");
        h.set("SITEELEV", p.siteElevation, "[m] observatory elevation");
    }
    h.set("GAIN", p.gain, "[e-/ADU] gain");
    h.set("RDNOISE", p.readNoise, "[e-] read noise");
    if (p.saturation > 0.0) h.set("SATURATE", p.saturation, "[ADU] saturation level");
    double raP = p.ra, decP = p.dec;
    if (p.wcsOffset != 0.0) offsetPosition(p.ra, p.dec, p.wcsOffset, p.wcsOffsetAngle, raP, decP);
    h.set("RA", raP, "[deg] pointing");
    h.set("DEC", decP, "[deg] pointing");
    h.set("OBJCTRA", sexagesimal(raP, true), "pointing RA (h m s)");
    h.set("OBJCTDEC", sexagesimal(decP, false), "pointing Dec (d m s)");
    h.set("EQUINOX", 2000.0, "equinox of the coordinates");
    if (p.writeWcs) {
        h.update(r.headerWcs.toHeader());
        if (pre > 0) h.set("CRPIX1", r.headerWcs.crpix[0] + pre, "reference pixel (1-based)");
    }
    static const char* kImageTypes[][2] = {
        {"light", "Light Frame"}, {"bias", "Bias Frame"}, {"dark", "Dark Frame"}, {"flat", "Flat Field"}};
    for (const auto& t : kImageTypes)
        if (p.frameType == t[0]) h.set("IMAGETYP", t[1], "frame type");
    if (pre + over > 0) {
        auto sec = [](int x0, int x1, int y1) {
            return "[" + std::to_string(x0) + ":" + std::to_string(x1) + ",1:" + std::to_string(y1) + "]";
        };
        const std::string data = sec(pre + 1, pre + p.width, p.height);
        h.set("DATASEC", data, "data section (1-based)");
        h.set("TRIMSEC", data, "section to keep after overscan correction");
        if (over > 0) h.set("BIASSEC", sec(pre + p.width + 1, pre + p.width + over, p.height), "overscan section");
        else h.set("BIASSEC", sec(1, pre, p.height), "prescan section");
    }
    addSimKeywords(h, p, r.trueWcs);
    h.addHistory("simulated by gpuphot " GPUPHOT_VERSION " (gpuphot simulate)");
}

} // namespace

SimResult simulateField(const SimParams& pIn, RunContext* ctxIn, const SimVariation* variation) {
    validate(pIn);
    const SimParams p = effectiveParams(pIn);
    RunContext local;
    RunContext& ctx = ctxIn ? *ctxIn : local;
    auto timer = ctx.time("simulate");

    SimResult r;
    r.params = p;
    r.trueWcs = makeTrueWcs(p);
    r.headerWcs = makeHeaderWcs(p, r.trueWcs);
    const std::vector<Source> src = drawSources(p, variation);
    ctx.checkCancelled();

    const std::vector<sim::Profile> profiles = makeProfiles(p, src, ctx);
    r.image = Image<float>(p.width, p.height, Image<float>::NoInit{});
    r.defects = Image<std::uint8_t>(p.width, p.height, 0);
    render(p, profiles, r.image, r.defects, ctx);

    // Truth table (its saturation flags from the data section, before any overscan is added).
    TruthColumns truth = truthColumns(p, src, r.trueWcs, r.image);
    std::vector<std::int64_t> refId;
    r.reference = buildReference(p, r.trueWcs, src, refId);
    fillTruthTable(r.truth, p, r.trueWcs, truth, refId);

    if (p.prescan + p.overscan > 0) addOverscan(p, r, ctx);
    fillImageHeader(p, r);
    return r;
}

void writeSimulation(const SimResult& result, const std::string& dir, const std::string& name, int bitpix) {
    int bp;
    if (bitpix == 16 || bitpix == kBitpixUInt16) bp = kBitpixUInt16;
    else if (bitpix == -32) bp = -32;
    else throw InvalidInput("simulate: bitpix must be 16 or -32, not " + std::to_string(bitpix));
    if (name.empty() || name.find('/') != std::string::npos)
        throw InvalidInput("simulate: output name '" + name + "' must be a plain file stem");
    const std::filesystem::path base = outputDirectory(dir);
    writeFitsImage((base / (name + ".fits")).string(), result.image.view(), result.header, bp);
    writeFitsTable((base / (name + ".truth.fits")).string(), result.truth);
    writeFitsTable((base / (name + ".ref.fits")).string(), result.reference);
    // Cosmic-ray truth: 1 where a simulated track deposited charge (the colleague's detection accuracy
    // is measured against it). Written only when the simulation has cosmic rays.
    if (result.params.cosmicRays > 0 && result.defects.width() == result.image.width() &&
        result.defects.height() == result.image.height()) {
        const int w = result.defects.width(), h = result.defects.height();
        Image<std::uint8_t> cr(w, h, 0);
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) cr(x, y) = (result.defects(x, y) & MaskCosmicRay) ? 1 : 0;
        Header ch;
        ch.set("EXTNAME", "CRMASK", "cosmic-ray truth mask");
        ch.set("SIMSEED", static_cast<long long>(result.params.seed), "simulation seed");
        ch.set("SIMNCR", result.params.cosmicRays, "cosmic-ray tracks injected");
        ch.addHistory("1 = pixel hit by a simulated cosmic ray, 0 = clean");
        writeFitsImage((base / (name + ".crmask.fits")).string(), cr.view(), ch);
    }
}

Image<float> simFlatMap(const SimParams& pIn) {
    return detectorMap(pIn,
                       [](const Detector& det, int x, int y) { return det.hasFlat ? det.flat(x, y) : 1.0; });
}

Image<float> simBiasMap(const SimParams& pIn) {
    return detectorMap(pIn, [](const Detector& det, int x, int y) { return det.bias(x, y); });
}

Image<float> simDarkMap(const SimParams& pIn) {
    SimParams p = effectiveParams(pIn);
    p.exptime = 1.0; // the rate does not depend on it
    const Detector det(p);
    Image<float> m(p.width, p.height, static_cast<float>(p.darkCurrent));
    for (const DarkHot& d : det.hot)
        m(static_cast<int>(d.index % p.width), static_cast<int>(d.index / p.width)) += static_cast<float>(d.rate);
    return m;
}

SimParams calibrationFrameParams(const SimParams& light, const std::string& type, int index) {
    if (type != "bias" && type != "dark" && type != "flat")
        throw InvalidInput("simulate: calibration frame type must be bias, dark or flat, not '" + type + "'");
    SimParams q = light;
    q.frameType = type;
    q.detectorSeed = detectorSeedOf(light);
    const std::uint64_t typeNo = type == "bias" ? 1 : type == "dark" ? 2 : 3;
    q.seed = light.seed + 1000003ull * typeNo + static_cast<std::uint64_t>(index) + 1;
    if (type == "flat") q.exptime = kCalibrationFlatExptime;
    if (type == "bias") q.exptime = 0.0;
    q.refMargin = 0.0;
    return q;
}

std::vector<std::string> writeCalibrationFrames(const SimParams& light, const std::string& dir,
                                                const std::string& name, int count, int bitpix, RunContext* ctx) {
    if (count < 1 || count > 999) throw InvalidInput("simulate: calibration frame count must be in [1, 999]");
    const std::filesystem::path base = outputDirectory(dir);
    const int bp = bitpix == 16 ? kBitpixUInt16 : bitpix;
    std::vector<std::string> out;
    for (const char* type : {"bias", "dark", "flat"})
        for (int i = 0; i < count; ++i) {
            const SimResult r = simulateField(calibrationFrameParams(light, type, i), ctx);
            char suffix[32];
            std::snprintf(suffix, sizeof suffix, ".%s_%02d.fits", type, i + 1);
            const std::string path = (base / (name + suffix)).string();
            writeFitsImage(path, r.image.view(), r.header, bp);
            out.push_back(path);
        }
    return out;
}

} // namespace gpuphot
