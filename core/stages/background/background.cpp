#include "core/stages/background/background.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/mesh_histogram.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot {
namespace {

using bkgmath::kMaxLevels;

// One mesh: what it gave.
using MeshValue = detail::MeshStat;

// Per-thread scratch for mesh statistics.
struct MeshScratch {
    std::vector<float> values;       // valid pixels of the mesh, row-major
    std::vector<int> rowEnd;         // end of each mesh row's valid pixels in `values`
    std::vector<std::int64_t> histo; // kMaxLevels + 1 bins (the extra one stays 0)
};

// Copies the valid pixels of a mesh into s.values (row by row) and returns how many there are.
template <bool HasMask, bool HasSource>
int gatherMesh(const ImageView& img, const MaskView& mask, const ImageViewT<std::int32_t>* src, int x0,
               int y0, int w, int h, MeshScratch& s) {
    float* out = s.values.data();
    int n = 0;
    for (int y = 0; y < h; ++y) {
        const float* p = img.row(y0 + y) + x0;
        [[maybe_unused]] const std::uint8_t* m = HasMask ? mask.row(y0 + y) + x0 : nullptr;
        [[maybe_unused]] const std::int32_t* sm = HasSource ? src->row(y0 + y) + x0 : nullptr;
        for (int x = 0; x < w; ++x) {
            const float v = p[x];
            bool ok = std::isfinite(v);
            if constexpr (HasMask) ok = ok && m[x] == 0;
            if constexpr (HasSource) ok = ok && sm[x] == 0;
            out[n] = v;
            n += ok ? 1 : 0;
        }
        s.rowEnd[y] = n;
    }
    return n;
}

// Sum and sum of squares of the valid pixels within [lo, hi], in the documented order: per mesh row
// left to right, row partials added top down.
void clippedSums(const MeshScratch& s, int h, float lo, float hi, bool clip, double& sum, double& sum2,
                 std::int64_t& n) {
    sum = 0.0;
    sum2 = 0.0;
    n = 0;
    int start = 0;
    for (int y = 0; y < h; ++y) {
        const int end = s.rowEnd[y];
        double rs = 0.0;
        double rs2 = 0.0;
        std::int64_t rn = 0;
        for (int i = start; i < end; ++i) {
            const float v = s.values[i];
            if (clip && !(v >= lo && v <= hi)) continue;
            const double d = v;
            rs += d;
            rs2 += d * d;
            ++rn;
        }
        sum += rs;
        sum2 += rs2;
        n += rn;
        start = end;
    }
}

// SExtractor's mesh estimator: 2-sigma clipped mean/sigma, histogram, iterative 3-sigma clipping of the
// histogram around its median, mode = 2.5 median - 1.5 mean (or the median when skewed).
MeshValue meshStatistics(const ImageView& img, const MaskView& mask, const ImageViewT<std::int32_t>* src,
                         int x0, int y0, int w, int h, double minGoodFraction, MeshScratch& s) {
    MeshValue out;
    int nValid = 0;
    const bool hasMask = !mask.empty();
    if (hasMask && src)
        nValid = gatherMesh<true, true>(img, mask, src, x0, y0, w, h, s);
    else if (hasMask)
        nValid = gatherMesh<true, false>(img, mask, src, x0, y0, w, h, s);
    else if (src)
        nValid = gatherMesh<false, true>(img, mask, src, x0, y0, w, h, s);
    else
        nValid = gatherMesh<false, false>(img, mask, src, x0, y0, w, h, s);

    if (nValid == 0 || static_cast<double>(nValid) < minGoodFraction * static_cast<double>(w) * h) {
        out.bad = true;
        return out;
    }

    // Clip 1: mean +- 2 sigma of all valid pixels.
    double sum = 0.0, sum2 = 0.0;
    std::int64_t n = 0;
    clippedSums(s, h, 0.0f, 0.0f, false, sum, sum2, n);
    double mean = sum / static_cast<double>(n);
    double var = sum2 / static_cast<double>(n) - mean * mean;
    double sigma = var > 0.0 ? std::sqrt(var) : 0.0;
    const float lcut = static_cast<float>(mean - 2.0 * sigma);
    const float hcut = static_cast<float>(mean + 2.0 * sigma);
    clippedSums(s, h, lcut, hcut, true, sum, sum2, n);
    if (n == 0) {
        out.bad = true;
        return out;
    }
    mean = sum / static_cast<double>(n);
    var = sum2 / static_cast<double>(n) - mean * mean;
    sigma = var > 0.0 ? std::sqrt(var) : 0.0;

    // Histogram over mean +- 5 sigma (bkgmath, shared with the CUDA kernel), then its clipping and mode.
    const bkgmath::HistoScale q = bkgmath::histoScale(mean, sigma, n);
    std::int64_t* histo = s.histo.data();
    std::fill(histo, histo + q.nlevels + 1, 0);
    const float flevels = static_cast<float>(q.nlevels);
    for (int i = 0; i < nValid; ++i) {
        const float t = s.values[i] / q.qscale + q.cste;
        if (t > -1.0f && t < flevels) ++histo[static_cast<int>(t)];
    }
    const bkgmath::MeshMode mode = bkgmath::clipHistogram(histo, q);
    out.level = mode.level;
    out.rms = mode.rms;
    return out;
}

// Bad meshes take the average of the nearest good ones (ties: all of them, summed in row-major order).
int fillBadMeshes(std::vector<MeshValue>& meshes, int nx, int ny) {
    std::vector<int> bad;
    for (int i = 0; i < nx * ny; ++i)
        if (meshes[i].bad) bad.push_back(i);
    if (bad.empty()) return 0;
    if (static_cast<int>(bad.size()) == nx * ny) {
        for (auto& m : meshes) { // nothing to interpolate from (sep: 0 and 1)
            m.level = 0.0f;
            m.rms = 1.0f;
        }
        return nx * ny;
    }
    const std::vector<MeshValue> src = meshes;
    std::vector<int> nearest;
    for (const int i : bad) {
        const int px = i % nx, py = i / nx;
        std::int64_t best = std::numeric_limits<std::int64_t>::max();
        nearest.clear();
        const int rmax = std::max(nx, ny);
        for (int r = 0; r <= rmax; ++r) {
            if (static_cast<std::int64_t>(r) * r > best) break; // ring r is at least r away
            for (int y = py - r; y <= py + r; ++y) {
                if (y < 0 || y >= ny) continue;
                const bool edgeRow = (y == py - r || y == py + r);
                for (int x = px - r; x <= px + r; x += edgeRow ? 1 : std::max(1, 2 * r)) {
                    if (x < 0 || x >= nx) continue;
                    const int j = y * nx + x;
                    if (src[j].bad) continue;
                    const std::int64_t d2 = std::int64_t(x - px) * (x - px) + std::int64_t(y - py) * (y - py);
                    if (d2 < best) {
                        best = d2;
                        nearest.clear();
                    }
                    if (d2 == best) nearest.push_back(j);
                }
            }
        }
        std::sort(nearest.begin(), nearest.end());
        double sl = 0.0, sr = 0.0;
        for (const int j : nearest) {
            sl += src[j].level;
            sr += src[j].rms;
        }
        meshes[i].level = static_cast<float>(sl / nearest.size());
        meshes[i].rms = static_cast<float>(sr / nearest.size());
    }
    return static_cast<int>(bad.size());
}

// Median of an odd or even count (even: mean of the two middle values, in double).
double medianOf(std::vector<float>& v) {
    const std::size_t n = v.size();
    if (n == 0) return 0.0;
    auto mid = v.begin() + static_cast<std::ptrdiff_t>(n / 2);
    std::nth_element(v.begin(), mid, v.end());
    if (n % 2 == 1) return *mid;
    const float upper = *mid;
    const float lower = *std::max_element(v.begin(), mid);
    return 0.5 * (static_cast<double>(lower) + upper);
}

// SExtractor's median filter over meshes: the window shrinks symmetrically at the edges. Rows of meshes
// in parallel (each mesh reads the unfiltered grid only).
void medianFilter(std::vector<MeshValue>& meshes, int nx, int ny, int fw, int fh, double threshold,
                  int threads) {
    const int hx = fw / 2, hy = fh / 2;
    if (hx == 0 && hy == 0) return;
    const std::vector<MeshValue> src = meshes;
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (nx * ny > 4096)
    for (int py = 0; py < ny; ++py) {
        std::vector<float> bl, br;
        const int ry = std::min({hy, py, ny - 1 - py});
        for (int px = 0; px < nx; ++px) {
            const int rx = std::min({hx, px, nx - 1 - px});
            bl.clear();
            br.clear();
            for (int y = py - ry; y <= py + ry; ++y)
                for (int x = px - rx; x <= px + rx; ++x) {
                    bl.push_back(src[y * nx + x].level);
                    br.push_back(src[y * nx + x].rms);
                }
            const int i = py * nx + px;
            const double med = medianOf(bl);
            if (std::fabs(med - static_cast<double>(src[i].level)) >= threshold) {
                meshes[i].level = static_cast<float>(med);
                meshes[i].rms = static_cast<float>(medianOf(br));
            }
        }
    }
}

// Natural cubic spline through unit-spaced values: second derivatives divided by 6 (zero at both ends).
// Solves d[k-1] + 4 d[k] + d[k+1] = v[k+1] - 2 v[k] + v[k-1], k = 1 .. n-2 (Thomas algorithm, in double).
// coupling = 1 solves the system; SExtractor/sep divide the back-substitution's coupling term by 6 as well
// (coupling = 1/6), which the sextractorSpline option reproduces.
void naturalSpline(const double* v, std::ptrdiff_t vs, double* d, std::ptrdiff_t ds, int n, double coupling,
                   std::vector<double>& cp, std::vector<double>& rp) {
    for (int k = 0; k < n; ++k)
        d[k * ds] = 0.0;
    if (n < 3) return;
    cp.assign(n, 0.0);
    rp.assign(n, 0.0);
    for (int k = 1; k <= n - 2; ++k) {
        const double rhs = (v[(k + 1) * vs] - 2.0 * v[k * vs]) + v[(k - 1) * vs];
        const double denom = 4.0 - (k > 1 ? cp[k - 1] : 0.0);
        cp[k] = 1.0 / denom;
        rp[k] = (rhs - (k > 1 ? rp[k - 1] : 0.0)) / denom;
    }
    d[(n - 2) * ds] = rp[n - 2];
    for (int k = n - 3; k >= 1; --k)
        d[k * ds] = rp[k] - (cp[k] * d[(k + 1) * ds]) * coupling;
}

SplineGrid makeGrid(const Image<float>& mesh, bool sextractor) {
    const double coupling = sextractor ? 1.0 / 6.0 : 1.0;
    SplineGrid g;
    g.nx = mesh.width();
    g.ny = mesh.height();
    const int s = g.nx + 1;
    const std::size_t size = static_cast<std::size_t>(s) * (g.ny + 1);
    g.v.assign(size, 0.0);
    g.dyy.assign(size, 0.0);
    g.dxx.assign(size, 0.0);
    g.dxxyy.assign(size, 0.0);
    for (int y = 0; y < g.ny; ++y)
        for (int x = 0; x < g.nx; ++x)
            g.v[static_cast<std::size_t>(y) * s + x] = mesh(x, y);
    std::vector<double> cp, rp;
    for (int x = 0; x < g.nx; ++x)
        naturalSpline(g.v.data() + x, s, g.dyy.data() + x, s, g.ny, coupling, cp, rp);
    for (int y = 0; y < g.ny; ++y) {
        const std::size_t r = static_cast<std::size_t>(y) * s;
        naturalSpline(g.v.data() + r, 1, g.dxx.data() + r, 1, g.nx, coupling, cp, rp);
        naturalSpline(g.dyy.data() + r, 1, g.dxxyy.data() + r, 1, g.nx, coupling, cp, rp);
    }
    return g;
}

// Node k sits at pixel (k + 0.5) * meshSize - 0.5; SExtractor/sep put the row nodes at (k + 0.5) * meshSize
// (half a pixel off), which `sextractorRows` reproduces (with its float arithmetic).
SplineWeights makeWeights(int pixels, int meshSize, int nodes, bool sextractorRows) {
    SplineWeights w;
    w.lo.resize(pixels);
    w.wa.resize(pixels);
    w.wb.resize(pixels);
    w.wa3.resize(pixels);
    w.wb3.resize(pixels);
    for (int p = 0; p < pixels; ++p) {
        if (nodes < 2) {
            w.lo[p] = 0;
            w.wa[p] = 1.0;
            w.wb[p] = w.wa3[p] = w.wb3[p] = 0.0;
            continue;
        }
        const double u = sextractorRows ? static_cast<double>(static_cast<float>(
                                              static_cast<float>(p) / static_cast<float>(meshSize) - 0.5))
                                        : (p + 0.5) / meshSize - 0.5; // position in node units
        const int k = std::clamp(static_cast<int>(std::floor(u)), 0, nodes - 2);
        const double d = u - k;
        const double c = 1.0 - d;
        w.lo[p] = k;
        w.wa[p] = c;
        w.wb[p] = d;
        w.wa3[p] = c * c * c - c;
        w.wb3[p] = d * d * d - d;
    }
    return w;
}

void checkSize(int w, int h, int ow, int oh, const char* what) {
    if (w != ow || h != oh)
        throw InvalidInput(std::string("background: ") + what + " is " + std::to_string(ow) + "x" +
                           std::to_string(oh) + " but the image is " + std::to_string(w) + "x" +
                           std::to_string(h));
}

template <class Progress>
void interpolateRows(const BackgroundResult& bkg, const BackgroundSpline& sp, int y0, int rows, float* level,
                     float* rms, std::ptrdiff_t stride, RunContext& ctx, Progress&& progress) {
    if (rows <= 0 || (!level && !rms)) return;
    if (y0 < 0 || y0 + rows > bkg.height)
        throw InvalidInput("background: rows " + std::to_string(y0) + ".." + std::to_string(y0 + rows - 1) +
                           " are outside the " + std::to_string(bkg.height) + "-row frame");
    const int width = bkg.width;
    const int nx = sp.level.nx;
    // Column weights as float, and the runs of columns sharing one node interval.
    std::vector<float> ca(width), cb(width), ca3(width), cb3(width);
    for (int x = 0; x < width; ++x) {
        ca[x] = static_cast<float>(sp.columns.wa[x]);
        cb[x] = static_cast<float>(sp.columns.wb[x]);
        ca3[x] = static_cast<float>(sp.columns.wa3[x]);
        cb3[x] = static_cast<float>(sp.columns.wb3[x]);
    }
    std::vector<int> runStart, runNode;
    for (int x = 0; x < width; ++x)
        if (x == 0 || sp.columns.lo[x] != sp.columns.lo[x - 1]) {
            runStart.push_back(x);
            runNode.push_back(sp.columns.lo[x]);
        }
    runStart.push_back(width);
    const int nRuns = static_cast<int>(runNode.size());
    const int nth = ctx.threadCount();
    const int chunk = 256;
    for (int c0 = 0; c0 < rows; c0 += chunk) {
        ctx.checkCancelled();
        const int c1 = std::min(rows, c0 + chunk);
        ParallelErrors errors;
#pragma omp parallel num_threads(nth)
        {
            std::vector<float> node, dnode;
            errors.run([&] {
                node.resize(nx + 1);
                dnode.resize(nx + 1);
            });
            const bool ok = !errors.failed();
#pragma omp for schedule(static)
            for (int r = c0; r < c1; ++r) {
                if (!ok) continue;
                const int y = y0 + r;
                const int lo = sp.rows.lo[y];
                const double A = sp.rows.wa[y], B = sp.rows.wb[y], A3 = sp.rows.wa3[y], B3 = sp.rows.wb3[y];
                for (int map = 0; map < 2; ++map) {
                    float* out = map == 0 ? level : rms;
                    if (!out) continue;
                    const SplineGrid& g = map == 0 ? sp.level : sp.rms;
                    const std::size_t s = static_cast<std::size_t>(nx) + 1;
                    const double* v0 = g.v.data() + lo * s;
                    const double* v1 = v0 + s;
                    const double* e0 = g.dyy.data() + lo * s;
                    const double* e1 = e0 + s;
                    const double* x0 = g.dxx.data() + lo * s;
                    const double* x1 = x0 + s;
                    const double* f0 = g.dxxyy.data() + lo * s;
                    const double* f1 = f0 + s;
                    for (int i = 0; i <= nx; ++i) {
                        node[i] = static_cast<float>(((A * v0[i] + B * v1[i]) + A3 * e0[i]) + B3 * e1[i]);
                        dnode[i] = static_cast<float>(((A * x0[i] + B * x1[i]) + A3 * f0[i]) + B3 * f1[i]);
                    }
                    float* o = out + static_cast<std::ptrdiff_t>(r) * stride;
                    for (int k = 0; k < nRuns; ++k) {
                        const int j = runNode[k];
                        const float n0 = node[j], n1 = node[j + 1], d0 = dnode[j], d1 = dnode[j + 1];
#pragma omp simd
                        for (int x = runStart[k]; x < runStart[k + 1]; ++x)
                            o[x] = ((ca[x] * n0 + cb[x] * n1) + ca3[x] * d0) + cb3[x] * d1;
                    }
                }
            }
        }
        errors.rethrow();
        progress(static_cast<double>(c1) / rows);
    }
}

} // namespace

BackgroundSpline makeBackgroundSpline(const BackgroundResult& bkg) {
    if (bkg.meshLevel.empty() || bkg.meshRms.empty() || bkg.width <= 0 || bkg.height <= 0)
        throw InvalidInput("background: no mesh grid to interpolate");
    BackgroundSpline sp;
    sp.level = makeGrid(bkg.meshLevel, bkg.sextractorSpline);
    sp.rms = makeGrid(bkg.meshRms, bkg.sextractorSpline);
    sp.rows = makeWeights(bkg.height, bkg.meshHeight, sp.level.ny, bkg.sextractorSpline);
    sp.columns = makeWeights(bkg.width, bkg.meshWidth, sp.level.nx, false);
    return sp;
}

void interpolateBackground(const BackgroundResult& bkg, const BackgroundSpline& spline, int y0, int rows,
                           float* level, float* rms, std::ptrdiff_t stride, RunContext& ctx) {
    interpolateRows(bkg, spline, y0, rows, level, rms, stride, ctx, [](double) {});
}

BackgroundSampler::BackgroundSampler(const BackgroundResult& bkg, RunContext& ctx) {
    const BackgroundSpline sp = makeBackgroundSpline(bkg);
    m_width = bkg.width;
    m_height = bkg.height;
    const int nx = sp.level.nx;
    m_stride = static_cast<std::size_t>(nx) + 1;
    m_lo = sp.columns.lo;
    m_ca.resize(m_width);
    m_cb.resize(m_width);
    m_ca3.resize(m_width);
    m_cb3.resize(m_width);
    for (int x = 0; x < m_width; ++x) {
        m_ca[x] = static_cast<float>(sp.columns.wa[x]);
        m_cb[x] = static_cast<float>(sp.columns.wb[x]);
        m_ca3[x] = static_cast<float>(sp.columns.wa3[x]);
        m_cb3[x] = static_cast<float>(sp.columns.wb3[x]);
        if (x == 0 || m_lo[x] != m_lo[x - 1]) {
            m_runStart.push_back(x);
            m_runNode.push_back(m_lo[x]);
        }
    }
    m_runStart.push_back(m_width);
    const std::size_t size = static_cast<std::size_t>(m_height) * m_stride;
    m_levelN.resize(size);
    m_levelD.resize(size);
    m_rmsN.resize(size);
    m_rmsD.resize(size);
    // Node values of every row, as interpolateRows computes them.
#pragma omp parallel for num_threads(ctx.threadCount()) schedule(static)
    for (int y = 0; y < m_height; ++y) {
        const int lo = sp.rows.lo[y];
        const double A = sp.rows.wa[y], B = sp.rows.wb[y], A3 = sp.rows.wa3[y], B3 = sp.rows.wb3[y];
        for (int map = 0; map < 2; ++map) {
            const SplineGrid& g = map == 0 ? sp.level : sp.rms;
            float* node = (map == 0 ? m_levelN : m_rmsN).data() + static_cast<std::size_t>(y) * m_stride;
            float* dnode = (map == 0 ? m_levelD : m_rmsD).data() + static_cast<std::size_t>(y) * m_stride;
            const std::size_t s = m_stride;
            const double* v0 = g.v.data() + lo * s;
            const double* v1 = v0 + s;
            const double* e0 = g.dyy.data() + lo * s;
            const double* e1 = e0 + s;
            const double* x0 = g.dxx.data() + lo * s;
            const double* x1 = x0 + s;
            const double* f0 = g.dxxyy.data() + lo * s;
            const double* f1 = f0 + s;
            for (int i = 0; i <= nx; ++i) {
                node[i] = static_cast<float>(((A * v0[i] + B * v1[i]) + A3 * e0[i]) + B3 * e1[i]);
                dnode[i] = static_cast<float>(((A * x0[i] + B * x1[i]) + A3 * f0[i]) + B3 * f1[i]);
            }
        }
    }
}

void BackgroundSampler::spanOf(const Nodes& n, const Nodes& d, int y, int x0, int x1, float* o) const {
    const float* node = n.data() + static_cast<std::size_t>(y) * m_stride;
    const float* dnode = d.data() + static_cast<std::size_t>(y) * m_stride;
    const float *ca = m_ca.data(), *cb = m_cb.data(), *ca3 = m_ca3.data(), *cb3 = m_cb3.data();
    // the run holding x0: the last start <= x0
    const auto first = std::upper_bound(m_runStart.begin(), m_runStart.end() - 1, x0) - m_runStart.begin() - 1;
    for (std::size_t k = static_cast<std::size_t>(std::max<std::ptrdiff_t>(first, 0));
         k + 1 < m_runStart.size() && m_runStart[k] < x1; ++k) {
        const int j = m_runNode[k];
        const float n0 = node[j], n1 = node[j + 1], d0 = dnode[j], d1 = dnode[j + 1];
        const int a = std::max(m_runStart[k], x0), b = std::min(m_runStart[k + 1], x1);
        float* out = o - x0;
#pragma omp simd
        for (int x = a; x < b; ++x)
            out[x] = ((ca[x] * n0 + cb[x] * n1) + ca3[x] * d0) + cb3[x] * d1;
    }
}

void BackgroundSampler::rmsSpan(int y, int x0, int n, float* out) const {
    spanOf(m_rmsN, m_rmsD, y, x0, x0 + n, out);
}

void BackgroundSampler::row(int y, float* level, float* rms) const {
    if (level) rowOf(m_levelN, m_levelD, y, level);
    if (rms) rowOf(m_rmsN, m_rmsD, y, rms);
}

float sampledLevel(const BackgroundSampler* sampler, int x, int y) {
    return sampler->levelAt(x, y);
}
float sampledRms(const BackgroundSampler* sampler, int x, int y) {
    return sampler->rmsAt(x, y);
}

void materializeBackgroundMaps(BackgroundResult& bkg, RunContext& ctx) {
    const BackgroundSpline sp = makeBackgroundSpline(bkg);
    bkg.level = Image<float>(bkg.width, bkg.height, Image<float>::NoInit{});
    bkg.rms = Image<float>(bkg.width, bkg.height, Image<float>::NoInit{});
    interpolateRows(bkg, sp, 0, bkg.height, bkg.level.data(), bkg.rms.data(), bkg.width, ctx, [](double) {});
}

void detail::finishMeshGrid(std::vector<MeshStat>& meshes, int nx, int ny, const BackgroundParams& params,
                            BackgroundResult& res, int threads) {
    res.badMeshes = fillBadMeshes(meshes, nx, ny);
    medianFilter(meshes, nx, ny, params.filterW(), params.filterH(), params.filterThreshold, threads);
    res.meshLevel = Image<float>(nx, ny, Image<float>::NoInit{});
    res.meshRms = Image<float>(nx, ny, Image<float>::NoInit{});
    std::vector<float> lv, rv;
    lv.reserve(meshes.size());
    rv.reserve(meshes.size());
    for (int i = 0; i < nx * ny; ++i) {
        res.meshLevel.data()[i] = meshes[i].level;
        res.meshRms.data()[i] = meshes[i].rms;
        lv.push_back(meshes[i].level);
        rv.push_back(meshes[i].rms);
    }
    res.globalLevel = medianOf(lv);
    res.globalRms = medianOf(rv);
    if (res.globalRms <= 0.0) {
        std::vector<float> pos;
        for (const float r : rv)
            if (r > 0.0f) pos.push_back(r);
        res.globalRms = pos.empty() ? 1.0 : medianOf(pos);
    }
    if (params.uniformRms)
        for (int i = 0; i < nx * ny; ++i)
            res.meshRms.data()[i] = static_cast<float>(res.globalRms);
    if (params.manualLevel) {
        for (int i = 0; i < nx * ny; ++i)
            res.meshLevel.data()[i] = static_cast<float>(*params.manualLevel);
        res.globalLevel = static_cast<float>(*params.manualLevel);
    }
}

const ImageViewT<std::int32_t>* detail::validateBackgroundInputs(const ImageView& image, const MaskView& mask,
                                                                 const BackgroundParams& params,
                                                                 const ImageViewT<std::int32_t>* sourceMask) {
    if (image.empty()) throw InvalidInput("background: the image is empty");
    if (image.stride < image.width) throw InvalidInput("background: image stride is smaller than its width");
    const int bw = params.meshW(), bh = params.meshH();
    if (bw <= 0 || bh <= 0)
        throw InvalidInput("background: mesh size must be positive (got " + std::to_string(bw) + "x" +
                           std::to_string(bh) + ")");
    if (params.filterW() < 1 || params.filterH() < 1)
        throw InvalidInput("background: filter size must be at least 1 mesh");
    if (!(params.minGoodFraction >= 0.0 && params.minGoodFraction <= 1.0))
        throw InvalidInput("background: minGoodFraction must lie in [0, 1]");
    if (!mask.empty()) checkSize(image.width, image.height, mask.width, mask.height, "the mask");
    if (sourceMask && sourceMask->empty()) sourceMask = nullptr;
    if (sourceMask)
        checkSize(image.width, image.height, sourceMask->width, sourceMask->height, "the source mask");
    return sourceMask;
}

BackgroundResult cpu::estimateBackground(const ImageView& image, const MaskView& mask,
                                         const BackgroundParams& params, RunContext& ctx,
                                         const ImageViewT<std::int32_t>* sourceMask) {
    sourceMask = detail::validateBackgroundInputs(image, mask, params, sourceMask);
    const int bw = params.meshW(), bh = params.meshH();

    const int W = image.width, H = image.height;
    const int nx = (W - 1) / bw + 1, ny = (H - 1) / bh + 1;
    const bool full = params.fullMaps;
    const double meshShare = full ? 0.5 : 1.0; // progress: meshes, then the maps

    BackgroundResult res;
    res.width = W;
    res.height = H;
    res.meshWidth = bw;
    res.meshHeight = bh;
    res.sextractorSpline = params.sextractorSpline;

    // 1. Mesh statistics, meshes in parallel, a band of mesh rows per chunk.
    std::vector<MeshValue> meshes(static_cast<std::size_t>(nx) * ny);
    const int nth = ctx.threadCount();
    const int bandRows = std::max(1, (4 * nth * 16 + nx - 1) / nx);
    for (int j0 = 0; j0 < ny; j0 += bandRows) {
        ctx.checkCancelled();
        const int j1 = std::min(ny, j0 + bandRows);
        const int first = j0 * nx, last = j1 * nx;
        ParallelErrors errors;
#pragma omp parallel num_threads(nth)
        {
            MeshScratch s;
            errors.run([&] {
                s.values.resize(static_cast<std::size_t>(bw) * bh);
                s.rowEnd.resize(bh);
                s.histo.resize(kMaxLevels + 1);
            });
#pragma omp for schedule(dynamic)
            for (int i = first; i < last; ++i)
                errors.run([&] {
                    const int mx = i % nx, my = i / nx;
                    const int x0 = mx * bw, y0 = my * bh;
                    const int w = std::min(bw, W - x0), h = std::min(bh, H - y0);
                    meshes[i] =
                        meshStatistics(image, mask, sourceMask, x0, y0, w, h, params.minGoodFraction, s);
                });
        }
        errors.rethrow();
        ctx.report("background", meshShare * 0.95 * j1 / ny);
    }

    // 2. Bad meshes, median filter, global values.
    detail::finishMeshGrid(meshes, nx, ny, params, res, ctx.threadCount());
    ctx.report("background", meshShare);

    // 3. Full-resolution maps.
    if (full) {
        const BackgroundSpline sp = makeBackgroundSpline(res);
        res.level = Image<float>(W, H, Image<float>::NoInit{});
        res.rms = Image<float>(W, H, Image<float>::NoInit{});
        interpolateRows(res, sp, 0, H, res.level.data(), res.rms.data(), W, ctx,
                        [&](double f) { ctx.report("background", 0.5 + 0.5 * f); });
    }
    return res;
}

// The stage's public entry point: the CUDA engine when the backend is CUDA and the kernels are linked
// (core/pipeline/cuda_stages.hpp), else the CPU engine.
BackgroundResult estimateBackground(const ImageView& image, const MaskView& mask,
                                    const BackgroundParams& params, RunContext& ctx,
                                    const ImageViewT<std::int32_t>* sourceMask) {
    if (ctx.backend == Backend::Cuda && cudaStages().background)
        return cudaStages().background(image, mask, params, ctx, sourceMask);
    return cpu::estimateBackground(image, mask, params, ctx, sourceMask);
}

} // namespace gpuphot
