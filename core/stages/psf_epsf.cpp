#include "core/stages/psf_epsf.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/stages/background.hpp"
#include "core/stages/psf_flux_math.hpp"

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

double median(std::vector<double>& v) {
    const std::size_t n = v.size();
    std::sort(v.begin(), v.end());
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Mean after one 3-sigma clip around the median (MAD scale); plain mean for fewer than 4 values. The n values
// at v, in their order; `sorted`: working memory.
double clippedMean(const double* v, std::size_t n, std::vector<double>& sorted) {
    if (n < 4) {
        double s = 0.0;
        for (std::size_t k = 0; k < n; ++k)
            s += v[k];
        return s / static_cast<double>(n);
    }
    sorted.assign(v, v + n);
    const double med = median(sorted);
    for (double& x : sorted)
        x = std::abs(x - med);
    const double sigma = 1.4826 * median(sorted);
    double s = 0.0;
    int k = 0;
    for (std::size_t q = 0; q < n; ++q) {
        const double x = v[q];
        if (sigma <= 0.0 || std::abs(x - med) <= 3.0 * sigma) {
            s += x;
            ++k;
        }
    }
    return k > 0 ? s / k : med;
}

// Cells and weights blending the ePSF at a frame position (psfmath::blendCells; none without an ePSF).
int blendCells(const PsfResult& r, double x, double y, std::array<int, 4>& idx, std::array<double, 4>& w) {
    if (r.epsf.empty()) return 0;
    return psfmath::blendCells(r.width, r.height, r.gridNx, r.gridNy, x, y, idx.data(), w.data());
}

psfmath::EpsfCellView cellView(const EpsfCell& c) {
    return {c.image.data(), c.image.width(), c.image.height(), c.centreX, c.centreY, c.oversampling};
}

// Residual stack of the stars against the base, registered with centre shift (sx, sy); returns the
// smoothed residual on the oversampled nodes.
std::vector<double> stackResiduals(const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                                   const ProfileParams& base, PsfModelKind kind, int radius, int os,
                                   int nQuad, double sx, double sy) {
    const int n = 2 * radius * os + 1, c = radius * os;
    // The stars' (node, residual) pairs in star and pixel order; then the bins as one array by node
    // (counted, then filled in that order), so that no bin is a vector of its own.
    struct Item {
        std::size_t node;
        double value;
    };
    std::vector<Item> items;
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
                items.push_back({static_cast<std::size_t>(kj) * n + static_cast<std::size_t>(ki),
                                 v - profileValue(base, kind, dx, dy, nQuad)});
            }
    }
    const std::size_t nNodes = static_cast<std::size_t>(n) * n;
    std::vector<std::size_t> start(nNodes + 1, 0);
    for (const Item& it : items)
        ++start[it.node + 1];
    for (std::size_t k = 0; k < nNodes; ++k)
        start[k + 1] += start[k];
    std::vector<double> values(items.size());
    {
        std::vector<std::size_t> fill(start.begin(), start.end() - 1);
        for (const Item& it : items)
            values[fill[it.node]++] = it.value;
    }
    std::vector<double> mean(nNodes, 0.0), count(nNodes, 0.0);
    std::vector<double> sorted; // clippedMean's working memory
    for (std::size_t k = 0; k < nNodes; ++k) {
        const std::size_t m = start[k + 1] - start[k];
        if (m > 0) {
            count[k] = static_cast<double>(m);
            mean[k] = clippedMean(values.data() + start[k], m, sorted) * count[k];
        }
    }
    // Normalised convolution with the 3 x 3 binomial kernel.
    const double kern[3] = {1.0, 2.0, 1.0};
    std::vector<double> out(nNodes, 0.0);
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
    return psfmath::cellValue(cellView(*this), dx, dy);
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
    // The arithmetic is psfmath's (core/stages/psf_flux_math.hpp), shared with kernels/psf.cu.
    PsfFluxResult res;
    if (!psfmath::fitInputsOk(x, y, radius)) return res;
    std::array<int, 4> idx{};
    std::array<double, 4> bw{};
    const int nCells = blendCells(model, x, y, idx, bw);
    if (nCells == 0) return res;
    std::array<psfmath::EpsfCellView, 4> cells{};
    for (int k = 0; k < nCells; ++k)
        cells[k] = cellView(model.epsf[idx[k]]);
    const int slot[4] = {0, 1, 2, 3};
    auto cellValue = [&](int k, double dx, double dy) { return psfmath::cellValue(cells[k], dx, dy); };

    struct Px {
        double d, p, rms2;
    };
    std::vector<Px> px;
    double psfAll = 0.0, psfMasked = 0.0;
    const bool inFrame = psfmath::forDiscPixels(x, y, radius, [&](int i, int j, double dx, double dy) {
        if (!frame.inside(i, j)) return false; // too close to the edge
        const double p = psfmath::blendValue(cellValue, nCells, slot, bw.data(), dx, dy);
        if (!psfmath::tallyPixel(p, frame.masked(i, j), psfAll, psfMasked)) return true;
        const double r = frame.rms(i, j);
        px.push_back({frame.image(i, j) - frame.level(i, j), p, r * r});
        return true;
    });
    if (!inFrame || !psfmath::discAccepted(psfAll, psfMasked, maxMaskedWeight, static_cast<int>(px.size()),
                                           fitBackground))
        return res;

    // Weighted linear least squares; the Poisson term of the variance comes from the model flux of
    // the previous pass (first pass: background noise only).
    double flux = 0.0;
    psfmath::FluxSums sums;
    for (int pass = 0; pass < psfmath::kFluxPasses; ++pass) {
        sums = psfmath::FluxSums{};
        for (const Px& q : px)
            psfmath::addPixel(sums, q.d, q.p, q.rms2, pass, flux, frame.gain);
        if (!psfmath::solveFlux(sums, fitBackground, flux)) return res;
    }
    res.ok = psfmath::finishFlux(sums, fitBackground, flux, res.flux, res.fluxErr);
    return res;
}

} // namespace gpuphot
