#include "core/stages/psf_epsf.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/stages/background.hpp"

namespace gpuphot {

double PsfFrame::level(int x, int y) const {
    if (bkg == nullptr) return 0.0;
    if (bkg->level.empty() && bkg->sampler) return bkg->sampler->levelAt(x, y); // maps on demand, same pixels
    return bkg->level.empty() ? bkg->globalLevel : static_cast<double>(bkg->level(x, y));
}

double PsfFrame::rms(int x, int y) const {
    if (bkg == nullptr) return 0.0;
    if (bkg->rms.empty() && bkg->sampler) return bkg->sampler->rmsAt(x, y);
    return bkg->rms.empty() ? bkg->globalRms : static_cast<double>(bkg->rms(x, y));
}

namespace {

// Keys cubic convolution weights (a = -0.5) for the nodes -1, 0, 1, 2 around a fraction t in [0, 1).
std::array<double, 4> keysWeights(double t) {
    return {((-0.5 * t + 1.0) * t - 0.5) * t, (1.5 * t - 2.5) * t * t + 1.0, ((-1.5 * t + 2.0) * t + 0.5) * t,
            (0.5 * t - 0.5) * t * t};
}

double median(std::vector<double>& v) {
    const std::size_t n = v.size();
    std::sort(v.begin(), v.end());
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Mean after one 3-sigma clip around the median (MAD scale); plain mean for fewer than 4 values.
double clippedMean(std::vector<double>& v) {
    const std::size_t n = v.size();
    if (n < 4) {
        double s = 0.0;
        for (double x : v)
            s += x;
        return s / static_cast<double>(n);
    }
    std::vector<double> sorted = v;
    const double med = median(sorted);
    for (double& x : sorted)
        x = std::abs(x - med);
    const double sigma = 1.4826 * median(sorted);
    double s = 0.0;
    int k = 0;
    for (double x : v)
        if (sigma <= 0.0 || std::abs(x - med) <= 3.0 * sigma) {
            s += x;
            ++k;
        }
    return k > 0 ? s / k : med;
}

// Cells and weights blending the ePSF at a frame position (bilinear in the cell centres, clamped).
int blendCells(const PsfResult& r, double x, double y, std::array<int, 4>& idx, std::array<double, 4>& w) {
    if (r.epsf.empty()) return 0;
    auto axis = [](double p, int size, int n, int& k0, double& f) {
        const double cell = static_cast<double>(size) / n;
        double t = (p + 0.5) / cell - 0.5; // fractional index of the cell centres
        t = std::clamp(t, 0.0, static_cast<double>(n - 1));
        k0 = std::min(static_cast<int>(std::floor(t)), std::max(n - 2, 0));
        f = n > 1 ? t - k0 : 0.0;
    };
    int kx, ky;
    double fx, fy;
    axis(x, r.width, r.gridNx, kx, fx);
    axis(y, r.height, r.gridNy, ky, fy);
    int n = 0;
    for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 2; ++i) {
            const double wi = (i ? fx : 1.0 - fx) * (j ? fy : 1.0 - fy);
            if (wi <= 0.0) continue;
            const int cx = std::min(kx + i, r.gridNx - 1), cy = std::min(ky + j, r.gridNy - 1);
            idx[n] = cy * r.gridNx + cx;
            w[n] = wi;
            ++n;
        }
    return n;
}

// Residual stack of the stars against the base, registered with centre shift (sx, sy); returns the
// smoothed residual on the oversampled nodes.
std::vector<double> stackResiduals(const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                                   const ProfileParams& base, PsfModelKind kind, int radius, int os,
                                   int nQuad, double sx, double sy) {
    const int n = 2 * radius * os + 1, c = radius * os;
    std::vector<std::vector<double>> bins(static_cast<std::size_t>(n) * n);
    for (const PsfStar* s : stars) {
        const double xc = s->fit.x0 + sx, yc = s->fit.y0 + sy;
        const int ix = static_cast<int>(std::lround(xc)), iy = static_cast<int>(std::lround(yc));
        for (int j = iy - radius; j <= iy + radius; ++j)
            for (int i = ix - radius; i <= ix + radius; ++i) {
                if (!frame.inside(i, j) || frame.masked(i, j)) continue;
                const double dx = i - xc, dy = j - yc;
                const long ki = std::lround(dx * os) + c, kj = std::lround(dy * os) + c;
                if (ki < 0 || kj < 0 || ki >= n || kj >= n) continue;
                const double v = (frame.image(i, j) - frame.level(i, j) - s->fit.background) / s->flux;
                bins[static_cast<std::size_t>(kj) * n + ki].push_back(
                    v - profileValue(base, kind, dx, dy, nQuad));
            }
    }
    std::vector<double> mean(bins.size(), 0.0), count(bins.size(), 0.0);
    for (std::size_t k = 0; k < bins.size(); ++k)
        if (!bins[k].empty()) {
            count[k] = static_cast<double>(bins[k].size());
            mean[k] = clippedMean(bins[k]) * count[k];
        }
    // Normalised convolution with the 3 x 3 binomial kernel.
    const double kern[3] = {1.0, 2.0, 1.0};
    std::vector<double> out(bins.size(), 0.0);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < n; ++i) {
            double s = 0.0, w = 0.0;
            for (int b = -1; b <= 1; ++b)
                for (int a = -1; a <= 1; ++a) {
                    const int ii = i + a, jj = j + b;
                    if (ii < 0 || jj < 0 || ii >= n || jj >= n) continue;
                    const double k = kern[a + 1] * kern[b + 1];
                    const std::size_t q = static_cast<std::size_t>(jj) * n + ii;
                    s += k * mean[q];
                    w += k * count[q];
                }
            out[static_cast<std::size_t>(j) * n + i] = w > 0.0 ? s / w : 0.0;
        }
    return out;
}

} // namespace

double EpsfCell::valueAt(double dx, double dy) const {
    if (image.empty()) return 0.0;
    const double u = centreX + dx * oversampling, v = centreY + dy * oversampling;
    const double fu = std::floor(u), fv = std::floor(v);
    const int iu = static_cast<int>(fu), iv = static_cast<int>(fv);
    if (iu < -1 || iv < -1 || iu > image.width() || iv > image.height()) return 0.0;
    const auto wu = keysWeights(u - fu), wv = keysWeights(v - fv);
    double s = 0.0;
    for (int b = 0; b < 4; ++b) {
        const int jj = iv - 1 + b;
        if (jj < 0 || jj >= image.height()) continue;
        double row = 0.0;
        for (int a = 0; a < 4; ++a) {
            const int ii = iu - 1 + a;
            if (ii < 0 || ii >= image.width()) continue;
            row += wu[a] * image(ii, jj);
        }
        s += wv[b] * row;
    }
    return s;
}

double PsfResult::epsfValue(double x, double y, double dx, double dy) const {
    std::array<int, 4> idx{};
    std::array<double, 4> w{};
    const int n = blendCells(*this, x, y, idx, w);
    double s = 0.0;
    for (int k = 0; k < n; ++k)
        s += w[k] * epsf[idx[k]].valueAt(dx, dy);
    return s;
}

void buildEpsfCell(EpsfCell& cell, const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                   const ProfileParams& base, PsfModelKind kind, int radius, int oversampling, int nQuad) {
    const int os = oversampling, n = 2 * radius * os + 1, c = radius * os;
    cell.oversampling = os;
    cell.centreX = cell.centreY = c;
    cell.nStars = static_cast<int>(stars.size());
    std::vector<double> model(static_cast<std::size_t>(n) * n);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < n; ++i)
            model[static_cast<std::size_t>(j) * n + i] = profileValue(
                base, kind, static_cast<double>(i - c) / os, static_cast<double>(j - c) / os, nQuad);
    const double baseFwhm = profileShape(base, kind).fwhm;

    auto assemble = [&](double sx, double sy) {
        std::vector<double> e = model;
        if (!stars.empty()) {
            const std::vector<double> r = stackResiduals(frame, stars, base, kind, radius, os, nQuad, sx, sy);
            for (std::size_t k = 0; k < e.size(); ++k)
                e[k] += r[k];
        }
        return e;
    };
    std::vector<double> e = assemble(0.0, 0.0);
    if (!stars.empty()) {
        // Re-centring: centroid of the positive ePSF within a disc of radius FWHM.
        const double rc = std::max(1.0, std::isfinite(baseFwhm) ? baseFwhm : 2.0);
        double s = 0.0, sxm = 0.0, sym = 0.0;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < n; ++i) {
                const double dx = static_cast<double>(i - c) / os, dy = static_cast<double>(j - c) / os;
                const double v = e[static_cast<std::size_t>(j) * n + i];
                if (v <= 0.0 || dx * dx + dy * dy > rc * rc) continue;
                s += v;
                sxm += v * dx;
                sym += v * dy;
            }
        if (s > 0.0) {
            const double cx = sxm / s, cy = sym / s;
            if (std::abs(cx) > 1e-4 || std::abs(cy) > 1e-4) e = assemble(cx, cy);
        }
    }
    // Unit sum at native sampling (zero sub-pixel phase).
    double sum = 0.0;
    for (int j = 0; j < n; j += os)
        for (int i = 0; i < n; i += os)
            sum += e[static_cast<std::size_t>(j) * n + i];
    cell.image = Image<float>(n, n);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < n; ++i)
            cell.image(i, j) =
                static_cast<float>(sum > 0.0 ? e[static_cast<std::size_t>(j) * n + i] / sum : 0.0);

    // Effective FWHM: diameter of the disc with the area of the half-maximum isophote, sampled at
    // 1/16 px with the same bicubic interpolation used by the photometry.
    const double half = std::clamp(std::isfinite(baseFwhm) ? 2.0 * baseFwhm : 6.0, 2.0, double(radius));
    const int steps = 16;
    const int m = static_cast<int>(std::ceil(half * steps));
    std::vector<double> fine;
    fine.reserve(static_cast<std::size_t>(2 * m + 1) * (2 * m + 1));
    double peak = 0.0;
    for (int j = -m; j <= m; ++j)
        for (int i = -m; i <= m; ++i) {
            const double v = cell.valueAt(static_cast<double>(i) / steps, static_cast<double>(j) / steps);
            fine.push_back(v);
            peak = std::max(peak, v);
        }
    std::size_t above = 0;
    for (double v : fine)
        if (v >= 0.5 * peak) ++above;
    const double area = static_cast<double>(above) / (steps * steps);
    cell.fwhm =
        peak > 0.0 ? 2.0 * std::sqrt(area / std::numbers::pi) : std::numeric_limits<double>::quiet_NaN();
}

PsfFluxResult fitPsfFlux(const PsfFrame& frame, const PsfResult& model, double x, double y, double radius,
                         bool fitBackground, double maxMaskedWeight) {
    PsfFluxResult res;
    if (!std::isfinite(x) || !std::isfinite(y) || !(radius > 0.0)) return res;
    const int i0 = static_cast<int>(std::floor(x - radius)), i1 = static_cast<int>(std::ceil(x + radius));
    const int j0 = static_cast<int>(std::floor(y - radius)), j1 = static_cast<int>(std::ceil(y + radius));
    std::array<int, 4> idx{};
    std::array<double, 4> bw{};
    const int nCells = blendCells(model, x, y, idx, bw);
    if (nCells == 0) return res;

    struct Px {
        double d, p, rms2;
    };
    std::vector<Px> px;
    double psfAll = 0.0, psfMasked = 0.0;
    for (int j = j0; j <= j1; ++j)
        for (int i = i0; i <= i1; ++i) {
            const double dx = i - x, dy = j - y;
            if (dx * dx + dy * dy > radius * radius) continue;
            if (!frame.inside(i, j)) return res; // too close to the edge
            double p = 0.0;
            for (int k = 0; k < nCells; ++k)
                p += bw[k] * model.epsf[idx[k]].valueAt(dx, dy);
            psfAll += std::max(p, 0.0);
            if (frame.masked(i, j)) {
                psfMasked += std::max(p, 0.0);
                continue;
            }
            const double r = frame.rms(i, j);
            px.push_back({frame.image(i, j) - frame.level(i, j), p, r * r});
        }
    const int npar = fitBackground ? 2 : 1;
    if (!(psfAll > 0.0) || psfMasked > maxMaskedWeight * psfAll || static_cast<int>(px.size()) < npar + 3)
        return res;

    // Weighted linear least squares; the Poisson term of the variance comes from the model flux of
    // the previous pass (first pass: background noise only).
    double flux = 0.0, bkgOff = 0.0;
    double hff = 0.0, hfb = 0.0, hbb = 0.0;
    for (int pass = 0; pass < 3; ++pass) {
        double gf = 0.0, gb = 0.0;
        hff = hfb = hbb = 0.0;
        for (const Px& q : px) {
            double var = q.rms2;
            if (pass > 0 && frame.gain > 0.0) var += std::max(flux * q.p, 0.0) / frame.gain;
            if (!(var > 0.0)) var = 1.0; // no noise model: unweighted
            const double w = 1.0 / var;
            hff += w * q.p * q.p;
            hfb += w * q.p;
            hbb += w;
            gf += w * q.p * q.d;
            gb += w * q.d;
        }
        if (fitBackground) {
            const double det = hff * hbb - hfb * hfb;
            if (!(det > 1e-12 * hff * hbb)) return res;
            flux = (gf * hbb - gb * hfb) / det;
            bkgOff = (hff * gb - hfb * gf) / det;
        } else {
            if (!(hff > 0.0)) return res;
            flux = gf / hff;
        }
    }
    (void)bkgOff;
    const double varF = fitBackground ? hbb / (hff * hbb - hfb * hfb) : 1.0 / hff;
    if (!std::isfinite(flux) || !(varF >= 0.0)) return res;
    res.flux = flux;
    res.fluxErr = std::sqrt(varF);
    res.ok = true;
    return res;
}

} // namespace gpuphot
