#include "core/stages/prepare/cosmic_rays.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/model/instrument.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot {
namespace {

constexpr std::uint8_t kBadBits = MaskBad | MaskNonFinite | MaskOutside;
constexpr int kTile = 256; // columns per median tile: the 7x7 scratch (49 x 256 floats) stays in L1/L2

// ---------------------------------------------------------------------------------------------------
// Exact small-window medians with sorting networks.

// One compare-exchange of a network: kind 0 writes min to a and max to b, 1 only the min, 2 only the max
// (pruned selection networks need just one output of some comparators).
struct Comparator {
    int a = 0;
    int b = 0;
    int kind = 0;
};

// Batcher's odd-even merge sort for n elements: the network for the next power of two without the
// comparators that touch padding (padding would be +inf at the end, so those never exchange).
std::vector<std::pair<int, int>> batcherNetwork(int n) {
    std::vector<std::pair<int, int>> net;
    int pow2 = 1;
    while (pow2 < n)
        pow2 <<= 1;
    for (int p = 1; p < pow2; p <<= 1)
        for (int k = p; k >= 1; k >>= 1)
            for (int j = k % p; j + k < pow2; j += 2 * k)
                for (int i = 0; i < std::min(k, pow2 - j - k); ++i)
                    if ((i + j) / (2 * p) == (i + j + k) / (2 * p) && i + j + k < n)
                        net.emplace_back(i + j, i + j + k);
    return net;
}

std::vector<Comparator> fullNetwork(int n) {
    std::vector<Comparator> out;
    for (auto [a, b] : batcherNetwork(n))
        out.push_back({a, b, 0});
    return out;
}

// The comparators of a sorting network that the output at `target` depends on.
std::vector<Comparator> selectionNetwork(int n, int target) {
    const auto net = batcherNetwork(n);
    std::vector<bool> need(static_cast<std::size_t>(n), false);
    need[static_cast<std::size_t>(target)] = true;
    std::vector<Comparator> out;
    for (auto it = net.rbegin(); it != net.rend(); ++it) {
        const bool na = need[static_cast<std::size_t>(it->first)],
                   nb = need[static_cast<std::size_t>(it->second)];
        if (!na && !nb) continue;
        out.push_back({it->first, it->second, na && nb ? 0 : (na ? 1 : 2)});
        need[static_cast<std::size_t>(it->first)] = need[static_cast<std::size_t>(it->second)] = true;
    }
    std::reverse(out.begin(), out.end());
    return out;
}

// For a k x k window: sort the columns, then the rows (the columns stay sorted). Entry (i, j) of the
// doubly sorted window (row rank i, column rank j) is >= (i+1)(j+1) entries and <= (k-i)(k-j) entries,
// so with m = (k*k-1)/2 it can be the median only when (i+1)(j+1) <= m+1 and (k-i)(k-j) <= m+1; the
// entries with (k-i)(k-j) > m+1 (nLow of them) are below it. The median is the candidate of rank
// m - nLow among the candidates.
struct MedianPlan {
    int k = 0;
    std::vector<Comparator> sortK;
    std::vector<std::pair<int, int>> candidates; // (i, j)
    std::vector<Comparator> select;              // on candidate indices
    int target = 0;
};

MedianPlan makePlan(int k) {
    MedianPlan plan;
    plan.k = k;
    plan.sortK = fullNetwork(k);
    const int m = (k * k - 1) / 2;
    int low = 0;
    for (int i = 0; i < k; ++i)
        for (int j = 0; j < k; ++j) {
            if ((k - i) * (k - j) > m + 1)
                ++low;
            else if ((i + 1) * (j + 1) <= m + 1)
                plan.candidates.emplace_back(i, j);
        }
    plan.target = m - low;
    plan.select = selectionNetwork(static_cast<int>(plan.candidates.size()), plan.target);
    return plan;
}

const MedianPlan& medianPlan(int k) {
    static const MedianPlan p3 = makePlan(3), p5 = makePlan(5), p7 = makePlan(7);
    return k == 3 ? p3 : (k == 5 ? p5 : p7);
}

inline void exchange(float* __restrict a, float* __restrict b, int n, int kind) {
    if (kind == 0) {
#pragma omp simd
        for (int t = 0; t < n; ++t) {
            const float x = a[t], y = b[t];
            a[t] = y < x ? y : x;
            b[t] = x < y ? y : x;
        }
    } else if (kind == 1) {
#pragma omp simd
        for (int t = 0; t < n; ++t)
            a[t] = b[t] < a[t] ? b[t] : a[t];
    } else {
#pragma omp simd
        for (int t = 0; t < n; ++t)
            b[t] = b[t] < a[t] ? a[t] : b[t];
    }
}

// Median of one output row y, columns [x0, x0 + n), into out. scratch: k * (kTile + k) + k * k * kTile.
void medianTile(const ImageView& in, const MedianPlan& plan, int y, int x0, int n, float* out,
                float* scratch) {
    const int k = plan.k, r = k / 2, wide = n + k - 1;
    float* cols = scratch;                  // k rows of `wide`
    float* win = scratch + k * (kTile + k); // k * k rows of n
    for (int i = 0; i < k; ++i) {
        const float* src = in.row(std::clamp(y - r + i, 0, in.height - 1));
        float* dst = cols + i * (kTile + k);
        for (int t = 0; t < wide; ++t)
            dst[t] = src[std::clamp(x0 - r + t, 0, in.width - 1)];
    }
    for (const Comparator& c : plan.sortK)
        exchange(cols + c.a * (kTile + k), cols + c.b * (kTile + k), wide, 0);
    for (int i = 0; i < k; ++i)
        for (int j = 0; j < k; ++j)
            std::copy_n(cols + i * (kTile + k) + j, n, win + (i * k + j) * kTile);
    for (int i = 0; i < k; ++i)
        for (const Comparator& c : plan.sortK)
            exchange(win + (i * k + c.a) * kTile, win + (i * k + c.b) * kTile, n, 0);
    float* cand[64];
    for (std::size_t c = 0; c < plan.candidates.size(); ++c)
        cand[c] = win + (plan.candidates[c].first * k + plan.candidates[c].second) * kTile;
    for (const Comparator& c : plan.select)
        exchange(cand[c.a], cand[c.b], n, c.kind);
    std::copy_n(cand[plan.target], n, out);
}

void medianInto(const ImageView& in, int k, Image<float>& out, int threads) {
    const MedianPlan& plan = medianPlan(k);
    const int w = in.width, h = in.height;
    ParallelErrors errors;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> scratch;
        errors.run([&] { scratch.resize(static_cast<std::size_t>(k * (kTile + k) + k * k * kTile)); });
        const bool ok = !errors.failed();
#pragma omp for schedule(dynamic, 4)
        for (int y = 0; y < h; ++y)
            for (int x0 = 0; ok && x0 < w; x0 += kTile)
                medianTile(in, plan, y, x0, std::min(kTile, w - x0), out.row(y) + x0, scratch.data());
    }
    errors.rethrow();
}

// ---------------------------------------------------------------------------------------------------
// Masks.

// out = any pixel of `in` set within the window (3x3 square, or 5x5 without its corners).
Image<std::uint8_t> dilate(const Image<std::uint8_t>& in, int radius, bool dropCorners, int threads) {
    const int w = in.width(), h = in.height();
    Image<std::uint8_t> out(w, h, Image<std::uint8_t>::NoInit{});
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int y = 0; y < h; ++y) {
        std::uint8_t* o = out.row(y);
        for (int x = 0; x < w; ++x) {
            std::uint8_t any = 0;
            for (int dy = -radius; dy <= radius && !any; ++dy) {
                const int yy = y + dy;
                if (yy < 0 || yy >= h) continue;
                const std::uint8_t* row = in.row(yy);
                for (int dx = -radius; dx <= radius; ++dx) {
                    const int xx = x + dx;
                    if (xx < 0 || xx >= w) continue;
                    if (dropCorners && std::abs(dx) == radius && std::abs(dy) == radius) continue;
                    if (row[xx]) {
                        any = 1;
                        break;
                    }
                }
            }
            o[x] = any;
        }
    }
    return out;
}

std::size_t countSet(const Image<std::uint8_t>& m) {
    std::size_t n = 0;
    const std::uint8_t* d = m.data();
    for (std::size_t i = 0; i < m.pixelCount(); ++i)
        n += d[i] != 0;
    return n;
}

// Median of a value list (the lower of the two middle values for an even count); empty: fallback.
float medianOf(std::vector<float>& v, float fallback) {
    if (v.empty()) return fallback;
    auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
    std::nth_element(v.begin(), mid, v.end());
    return *mid;
}

void checkInputs(const ImageView& pixels, const MaskView& mask, const char* what) {
    if (pixels.empty()) throw InvalidInput(std::string(what) + ": empty image");
    if (!mask.empty() && (mask.width != pixels.width || mask.height != pixels.height))
        throw InvalidInput(std::string(what) + ": mask is " + std::to_string(mask.width) + " x " +
                           std::to_string(mask.height) + ", image " + std::to_string(pixels.width) + " x " +
                           std::to_string(pixels.height));
}

} // namespace

Image<float> medianFilter(const ImageView& image, int size, RunContext& ctx) {
    if (size != 3 && size != 5 && size != 7)
        throw InvalidInput("medianFilter: size " + std::to_string(size) + " (expected 3, 5 or 7)");
    if (image.empty()) throw InvalidInput("medianFilter: empty image");
    Image<float> out(image.width, image.height, Image<float>::NoInit{});
    medianInto(image, size, out, ctx.threadCount());
    return out;
}

namespace {

// The checked parameters and the gain, read noise and saturation to use (the params' where given, else the
// instrument's); throws InvalidInput for unusable ones.
CosmicRayResult checkedSettings(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                const CosmicRayParams& p) {
    checkInputs(pixels, mask, "cosmic rays");
    if (!(p.sigclip > 0) || !(p.sigfrac > 0) || !(p.objlim > 0) || p.niter < 1)
        throw InvalidInput("cosmic rays: sigclip, sigfrac and objlim must be > 0 and niter >= 1");
    if (!std::isfinite(p.pedestal))
        throw InvalidInput("cosmic rays: the pedestal must be a finite number (got " +
                           std::to_string(p.pedestal) + ")");
    CosmicRayResult res;
    res.gain = p.gain > 0 ? p.gain : instrument.gain;
    res.readnoise = p.readnoise >= 0 ? p.readnoise : instrument.readNoise;
    res.satlevel = p.satlevel > 0 ? p.satlevel : instrument.saturation;
    if (!(res.gain > 0) || !std::isfinite(res.gain) || !std::isfinite(res.readnoise) || res.readnoise < 0 ||
        !(res.satlevel > 0))
        throw InvalidInput("cosmic rays: unusable gain " + std::to_string(res.gain) + ", read noise " +
                           std::to_string(res.readnoise) + " or saturation " + std::to_string(res.satlevel));
    return res;
}

// The working image in electrons (e) and the bad input pixels; non-finite pixels are replaced by the median
// of the good ones, which is returned (the fill for pixels without good neighbours later).
float toElectrons(const ImageView& pixels, const MaskView& mask, const CosmicRayParams& p, double gain,
                  int threads, Image<float>& e, Image<std::uint8_t>& bad) {
    const int w = pixels.width, h = pixels.height;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int y = 0; y < h; ++y) {
        const float* src = pixels.row(y);
        const std::uint8_t* m = mask.empty() ? nullptr : mask.row(y);
        for (int x = 0; x < w; ++x) {
            const bool b = !std::isfinite(src[x]) || (m && (m[x] & kBadBits));
            bad(x, y) = b;
            e(x, y) = b ? 0.0f : static_cast<float>((static_cast<double>(src[x]) - p.pedestal) * gain);
        }
    }
    float backgroundLevel = 0.0f;
    {
        std::vector<float> good;
        good.reserve(pixels.pixelCount());
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x)
                if (!bad(x, y)) good.push_back(e(x, y));
        backgroundLevel = medianOf(good, 0.0f);
    }
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            if (!std::isfinite(pixels(x, y))) e(x, y) = backgroundLevel;
    return backgroundLevel;
}

// The pixels that are not good: the bad input pixels grown by one pixel, and the (grown) saturated stars,
// whose count goes to res.saturatedStarPixels.
Image<std::uint8_t> notGoodPixels(const Image<float>& e, const Image<std::uint8_t>& bad,
                                  const CosmicRayParams& p, int threads, CosmicRayResult& res,
                                  RunContext& ctx) {
    const int w = e.width(), h = e.height();
    const std::size_t npix = e.pixelCount();
    Image<std::uint8_t> notGood = dilate(bad, 1, false, threads);
    if (std::isfinite(res.satlevel)) {
        const float satE = static_cast<float>((res.satlevel - p.pedestal) * res.gain);
        const float coreE = static_cast<float>((res.satlevel / 10.0 - p.pedestal) * res.gain);
        const Image<float> m5 = medianFilter(e.view(), 5, ctx);
        Image<std::uint8_t> sat(w, h, Image<std::uint8_t>::NoInit{});
        for (std::size_t i = 0; i < npix; ++i)
            sat.data()[i] = e.data()[i] >= satE && m5.data()[i] > coreE;
        sat = dilate(dilate(sat, 2, true, threads), 2, true, threads);
        res.saturatedStarPixels = countSet(sat);
        for (std::size_t i = 0; i < npix; ++i)
            notGood.data()[i] |= sat.data()[i];
    }
    return notGood;
}

// Steps 1-3 of an iteration: the noise model N and S = L+ / (2 N), then S' = S - med5(S) in sp.
void laplacianSignificance(const Image<float>& e, float rn2, int threads, RunContext& ctx,
                           Image<float>& noise, Image<float>& sp) {
    const int w = e.width(), h = e.height();
    const std::size_t npix = e.pixelCount();
    {
        const Image<float> m5 = medianFilter(e.view(), 5, ctx);
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int y = 0; y < h; ++y) {
            const float* c = e.row(y);
            const float* up = e.row(std::max(y - 1, 0));
            const float* dn = e.row(std::min(y + 1, h - 1));
            for (int x = 0; x < w; ++x) {
                const float v2 = 2.0f * c[x];
                const float l = c[std::max(x - 1, 0)], r = c[std::min(x + 1, w - 1)];
                const float lplus =
                    0.25f * ((std::max(0.0f, (v2 - l) - up[x]) + std::max(0.0f, (v2 - r) - up[x])) +
                             (std::max(0.0f, (v2 - l) - dn[x]) + std::max(0.0f, (v2 - r) - dn[x])));
                const float n = std::sqrt(std::max(m5(x, y) + rn2, 1e-5f));
                noise(x, y) = n;
                sp(x, y) = lplus / (2.0f * n);
            }
        }
    }
    ctx.checkCancelled();
    {
        const Image<float> ms = medianFilter(sp.view(), 5, ctx);
        for (std::size_t i = 0; i < npix; ++i)
            sp.data()[i] -= ms.data()[i];
    }
}

// Steps 4-5: the fine structure F and the candidates (S' > sigclip and S' / F > objlim, good pixels only).
void markCandidates(const Image<float>& e, const Image<float>& noise, const Image<float>& sp,
                    const Image<std::uint8_t>& notGood, float sigclip, float objlim, int threads,
                    RunContext& ctx, Image<std::uint8_t>& cand) {
    const int w = e.width(), h = e.height();
    const Image<float> f3 = medianFilter(e.view(), 3, ctx);
    const Image<float> m7 = medianFilter(f3.view(), 7, ctx);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const float f = std::max((f3(x, y) - m7(x, y)) / noise(x, y), 0.01f);
            cand(x, y) = !notGood(x, y) && sp(x, y) > sigclip && sp(x, y) / f > objlim;
        }
}

// The candidates' growth to their neighbours (S' > sigclip, then S' > siglow), ORed into cr; returns the
// number of pixels new to cr.
std::size_t growIntoMask(const Image<std::uint8_t>& cand, const Image<std::uint8_t>& notGood,
                         const Image<float>& sp, float sigclip, float siglow, int threads,
                         Image<std::uint8_t>& cr) {
    const std::size_t npix = cand.pixelCount();
    Image<std::uint8_t> grown = dilate(cand, 1, false, threads);
    for (std::size_t i = 0; i < npix; ++i)
        grown.data()[i] = grown.data()[i] && !notGood.data()[i] && sp.data()[i] > sigclip;
    grown = dilate(grown, 1, false, threads);
    std::size_t fresh = 0;
    for (std::size_t i = 0; i < npix; ++i) {
        const bool hit = grown.data()[i] && !notGood.data()[i] && sp.data()[i] > siglow;
        fresh += hit && !cr.data()[i];
        cr.data()[i] |= static_cast<std::uint8_t>(hit);
    }
    return fresh;
}

// Replace the cosmic-ray pixels by the mean of their good 5x5 neighbours (reads only pixels that are not
// written, so the update in place does not depend on the order).
void replaceByNeighbourMean(const Image<std::uint8_t>& cr, const Image<std::uint8_t>& notGood,
                            float backgroundLevel, int threads, Image<float>& e) {
    const int w = e.width(), h = e.height();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            if (!cr(x, y)) continue;
            float s = 0.0f;
            int n = 0;
            for (int yy = std::max(y - 2, 0); yy <= std::min(y + 2, h - 1); ++yy)
                for (int xx = std::max(x - 2, 0); xx <= std::min(x + 2, w - 1); ++xx)
                    if (!cr(xx, yy) && !notGood(xx, yy)) {
                        s += e(xx, yy);
                        ++n;
                    }
            e(x, y) = n > 0 ? s / static_cast<float>(n) : backgroundLevel;
        }
}

// The display-only cleaned image: each cosmic-ray pixel replaced by the median of the good, non-cosmic-ray
// input pixels of its 5x5 neighbourhood (unchanged when there are none).
void fillCleaned(const ImageView& pixels, const Image<std::uint8_t>& cr, const Image<std::uint8_t>& bad,
                 int threads, Image<float>& cleaned) {
    const int w = pixels.width, h = pixels.height;
    ParallelErrors errors;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int y = 0; y < h; ++y)
        errors.run([&] {
            std::vector<float> vals;
            vals.reserve(25);
            for (int x = 0; x < w; ++x) {
                float v = pixels(x, y);
                if (cr(x, y)) {
                    vals.clear();
                    for (int yy = std::max(y - 2, 0); yy <= std::min(y + 2, h - 1); ++yy)
                        for (int xx = std::max(x - 2, 0); xx <= std::min(x + 2, w - 1); ++xx)
                            if (!cr(xx, yy) && !bad(xx, yy)) vals.push_back(pixels(xx, yy));
                    v = medianOf(vals, v);
                }
                cleaned(x, y) = v;
            }
        });
    errors.rethrow();
}

} // namespace

CosmicRayResult detectCosmicRays(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                 const CosmicRayParams& p, RunContext& ctx) {
    CosmicRayResult res = checkedSettings(pixels, mask, instrument, p);
    // CUDA backend: the same steps on the device (kernels/prepare/cosmic_rays.cu), bitwise equal.
    if (ctx.backend == Backend::Cuda && cudaStages().cosmicRays)
        return cudaStages().cosmicRays(pixels, mask, instrument, p, ctx);

    const int w = pixels.width, h = pixels.height, threads = ctx.threadCount();
    const std::size_t npix = pixels.pixelCount();
    const float rn2 = static_cast<float>(res.readnoise * res.readnoise);
    const float sigclip = static_cast<float>(p.sigclip), siglow = static_cast<float>(p.sigfrac * p.sigclip);
    const float objlim = static_cast<float>(p.objlim);

    // Working image in electrons; bad input pixels.
    Image<float> e(w, h, Image<float>::NoInit{});
    Image<std::uint8_t> bad(w, h, Image<std::uint8_t>::NoInit{});
    const float backgroundLevel = toElectrons(pixels, mask, p, res.gain, threads, e, bad);
    ctx.checkCancelled();

    // Good pixels: input mask grown by one pixel, saturated stars excluded.
    const Image<std::uint8_t> notGood = notGoodPixels(e, bad, p, threads, res, ctx);
    ctx.checkCancelled();

    Image<std::uint8_t> cr(w, h, std::uint8_t{0});
    Image<float> noise(w, h, Image<float>::NoInit{}), sp(w, h, Image<float>::NoInit{});
    Image<std::uint8_t> cand(w, h, Image<std::uint8_t>::NoInit{});
    for (int it = 0; it < p.niter; ++it) {
        laplacianSignificance(e, rn2, threads, ctx, noise, sp);
        ctx.checkCancelled();
        markCandidates(e, noise, sp, notGood, sigclip, objlim, threads, ctx, cand);
        ctx.checkCancelled();
        const std::size_t fresh = growIntoMask(cand, notGood, sp, sigclip, siglow, threads, cr);
        res.perIteration.push_back(fresh);
        ctx.report("cosmic_rays", static_cast<double>(it + 1) / p.niter);
        if (fresh == 0 || it + 1 == p.niter) break;
        replaceByNeighbourMean(cr, notGood, backgroundLevel, threads, e);
        ctx.checkCancelled();
    }

    res.mask = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
    for (std::size_t i = 0; i < npix; ++i)
        res.mask.data()[i] = cr.data()[i] ? MaskCosmicRay : 0;
    res.crPixels = countSet(cr);

    if (p.clean) {
        res.cleaned = Image<float>(w, h, Image<float>::NoInit{});
        fillCleaned(pixels, cr, bad, threads, res.cleaned);
    }
    return res;
}

SaltPepperResult saltPepperMask(const ImageView& pixels, const MaskView& mask, const SaltPepperParams& p,
                                RunContext& ctx) {
    checkInputs(pixels, mask, "salt-and-pepper filter");
    if (p.window != 3 && p.window != 5)
        throw InvalidInput("salt-and-pepper filter: window " + std::to_string(p.window) +
                           " (expected 3 or 5)");
    if (!(p.highSigma > 0) || !(p.lowSigma > 0))
        throw InvalidInput("salt-and-pepper filter: highSigma and lowSigma must be > 0");
    // kernels/prepare/cosmic_rays.cu, bitwise equal
    if (ctx.backend == Backend::Cuda && cudaStages().saltPepper)
        return cudaStages().saltPepper(pixels, mask, p, ctx);
    const int w = pixels.width, h = pixels.height;
    auto valid = [&](int x, int y) {
        return std::isfinite(pixels(x, y)) && (mask.empty() || !(mask(x, y) & kBadBits));
    };
    std::vector<float> vals;
    vals.reserve(pixels.pixelCount());
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            if (valid(x, y)) vals.push_back(pixels(x, y));
    const float fill = medianOf(vals, 0.0f);
    Image<float> work(w, h, Image<float>::NoInit{});
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            work(x, y) = std::isfinite(pixels(x, y)) ? pixels(x, y) : fill;
    const Image<float> med = medianFilter(work.view(), p.window, ctx);
    ctx.checkCancelled();

    vals.clear();
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            if (valid(x, y)) vals.push_back(work(x, y) - med(x, y));
    const float centre = medianOf(vals, 0.0f);
    for (float& v : vals)
        v = std::fabs(v - centre);
    SaltPepperResult res;
    res.sigma = 1.4826 * static_cast<double>(medianOf(vals, 0.0f));
    const float hi = static_cast<float>(p.highSigma * res.sigma),
                lo = static_cast<float>(p.lowSigma * res.sigma);
    res.mask = Image<std::uint8_t>(w, h, std::uint8_t{0});
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            if (!valid(x, y)) continue;
            const float r = work(x, y) - med(x, y);
            if (r > hi) {
                res.mask(x, y) = MaskBad;
                ++res.high;
            } else if (r < -lo) {
                res.mask(x, y) = MaskBad;
                ++res.low;
            }
        }
    return res;
}

} // namespace gpuphot
