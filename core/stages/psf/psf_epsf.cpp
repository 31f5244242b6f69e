#include "core/stages/psf/psf_epsf.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/stages/background/background.hpp"
#include "core/stages/psf/psf_epsf_math.hpp"
#include "core/stages/psf/psf_fit_math.hpp"
#include "core/stages/psf/psf_flux_math.hpp"

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

// Cells and weights blending the ePSF at a frame position (psfmath::blendCells; none without an ePSF).
int blendCells(const PsfResult& r, double x, double y, std::array<int, 4>& idx, std::array<double, 4>& w) {
    if (r.epsf.empty()) return 0;
    return psfmath::blendCells(r.width, r.height, r.gridNx, r.gridNy, x, y, idx.data(), w.data());
}

psfmath::EpsfCellView cellView(const EpsfCell& c) {
    return {c.image.data(), c.image.width(), c.image.height(), c.centreX, c.centreY, c.oversampling};
}

// Residual stack of the stars against the base (psffit vector p), registered with centre shift (sx, sy);
// returns the smoothed residual on the oversampled nodes. The arithmetic: core/stages/psf/psf_epsf_math.hpp.
std::vector<double> stackResiduals(const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                                   const double* p, bool moffat, const psffit::Quadrature& quad, int radius,
                                   int os, double sx, double sy) {
    const int n = epsfmath::nodesPerSide(radius, os), c = epsfmath::centreNode(radius, os);
    // The stars' (node, residual) pairs in star and pixel order; then the bins as one array by node
    // (counted, then filled in that order), so that no bin is a vector of its own.
    struct Item {
        std::size_t node;
        double value;
    };
    std::vector<Item> items;
    for (const PsfStar* s : stars) {
        const epsfmath::StarStamp st = epsfmath::starStamp(s->fit.x0, s->fit.y0, sx, sy);
        for (int j = st.iy - radius; j <= st.iy + radius; ++j)
            for (int i = st.ix - radius; i <= st.ix + radius; ++i) {
                if (!frame.inside(i, j) || frame.masked(i, j)) continue;
                double dx, dy;
                const int node = epsfmath::pixelNode(i, j, st, os, c, n, dx, dy);
                if (node < 0) continue;
                items.push_back(
                    {static_cast<std::size_t>(node),
                     epsfmath::residualValue(frame.image(i, j), frame.level(i, j), s->fit.background, s->flux,
                                             p, moffat, quad, dx, dy)});
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
    std::vector<double> work; // clippedMean's working memory
    // The host sorts with std::sort (a NaN residual, which the device path leaves to the host, sorts as
    // it always did).
    auto sort = [](double* v, int m) { std::sort(v, v + m); };
    for (std::size_t k = 0; k < nNodes; ++k) {
        const std::size_t m = start[k + 1] - start[k];
        if (m > 0) {
            count[k] = static_cast<double>(m);
            work.resize(m);
            mean[k] =
                epsfmath::clippedMean(values.data() + start[k], static_cast<int>(m), work.data(), sort) *
                count[k];
        }
    }
    // Normalised convolution with the 3 x 3 binomial kernel.
    std::vector<double> out(nNodes, 0.0);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < n; ++i)
            out[static_cast<std::size_t>(j) * n + i] =
                epsfmath::smoothNode(mean.data(), count.data(), n, i, j);
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

void profileVector(const ProfileParams& p, double out[8]) {
    static_assert(psffit::kLmParams == 8);
    out[psffit::PX0] = p.x0;
    out[psffit::PY0] = p.y0;
    out[psffit::PAMP] = p.amplitude;
    out[psffit::PBKG] = p.background;
    out[psffit::PC11] = p.c11;
    out[psffit::PC12] = p.c12;
    out[psffit::PC22] = p.c22;
    out[psffit::PBETA] = p.beta;
}

std::vector<double> epsfCellNodes(const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                                  const ProfileParams& base, PsfModelKind kind, int radius, int oversampling,
                                  int nQuad) {
    // The arithmetic is epsfmath's (core/stages/psf/psf_epsf_math.hpp), shared with kernels/psf/psf_epsf.cu.
    const int os = oversampling, n = epsfmath::nodesPerSide(radius, os), c = epsfmath::centreNode(radius, os);
    const bool moffat = kind == PsfModelKind::Moffat;
    const psffit::Quadrature quad = psffit::quadrature(nQuad);
    double p[psffit::kLmParams];
    profileVector(base, p);
    std::vector<double> model(static_cast<std::size_t>(n) * n);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < n; ++i)
            model[static_cast<std::size_t>(j) * n + i] = epsfmath::nodeModel(p, moffat, quad, i, j, c, os);
    const double baseFwhm = profileShape(base, kind).fwhm;

    auto assemble = [&](double sx, double sy) {
        std::vector<double> e = model;
        if (!stars.empty()) {
            const std::vector<double> r = stackResiduals(frame, stars, p, moffat, quad, radius, os, sx, sy);
            for (std::size_t k = 0; k < e.size(); ++k)
                e[k] += r[k];
        }
        return e;
    };
    std::vector<double> e = assemble(0.0, 0.0);
    if (!stars.empty()) {
        // Re-centring: centroid of the positive ePSF within a disc of radius FWHM.
        const epsfmath::CentroidSums sums =
            epsfmath::centroidSums(e.data(), n, c, os, epsfmath::recentreRadius(baseFwhm));
        double cx = 0.0, cy = 0.0;
        if (epsfmath::recentreShift(sums, cx, cy)) e = assemble(cx, cy);
    }
    return e;
}

void buildEpsfCell(EpsfCell& cell, const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                   const ProfileParams& base, PsfModelKind kind, int radius, int oversampling, int nQuad) {
    const int os = oversampling, n = epsfmath::nodesPerSide(radius, os), c = epsfmath::centreNode(radius, os);
    cell.oversampling = os;
    cell.centreX = cell.centreY = c;
    cell.nStars = static_cast<int>(stars.size());
    const std::vector<double> e = epsfCellNodes(frame, stars, base, kind, radius, oversampling, nQuad);
    const double baseFwhm = profileShape(base, kind).fwhm;
    // Unit sum at native sampling (zero sub-pixel phase).
    const double sum = epsfmath::nativeSum(e.data(), n, os);
    cell.image = Image<float>(n, n);
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < n; ++i)
            cell.image(i, j) = epsfmath::nodeImage(e[static_cast<std::size_t>(j) * n + i], sum);

    // Effective FWHM: diameter of the disc with the area of the half-maximum isophote, sampled at
    // 1/16 px with the same bicubic interpolation used by the photometry.
    const int m = epsfmath::fwhmHalfSteps(baseFwhm, radius);
    const psfmath::EpsfCellView view = cellView(cell);
    std::vector<double> fine;
    fine.reserve(static_cast<std::size_t>(2 * m + 1) * (2 * m + 1));
    double peak = 0.0;
    for (int j = -m; j <= m; ++j)
        for (int i = -m; i <= m; ++i) {
            const double v =
                psfmath::cellValue(view, epsfmath::fwhmSampleOffset(i), epsfmath::fwhmSampleOffset(j));
            fine.push_back(v);
            peak = epsfmath::maxLikeStd(peak, v);
        }
    unsigned long long above = 0;
    for (double v : fine)
        if (v >= 0.5 * peak) ++above;
    cell.fwhm = epsfmath::fwhmFromCount(above, peak);
}

PsfFluxResult fitPsfFlux(const PsfFrame& frame, const PsfResult& model, double x, double y, double radius,
                         bool fitBackground, double maxMaskedWeight) {
    // The arithmetic is psfmath's (core/stages/psf/psf_flux_math.hpp), shared with kernels/psf/psf.cu.
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
