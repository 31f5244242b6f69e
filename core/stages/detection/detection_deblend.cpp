// Multi-threshold deblending (SExtractor DEBLEND_NTHRESH / DEBLEND_MINCONT semantics).
//
// The region is re-thresholded at deblendLevels - 1 levels spaced exponentially between its detection
// threshold t0 and its filtered peak: t_k = t0 (peak / t0)^(k / N). At each level every current branch
// is split into its 8-connected parts above t_k; a part counts when it has at least minArea pixels and
// a filtered flux above deblendContrast times the whole region's flux. A branch with at least two such
// parts is replaced by them (they are deblended); otherwise it stays as it is and is re-examined at the
// next level. The final branches are the cores of the children; every other pixel of the region goes
// to the child whose bivariate Gaussian (fitted to the core's filtered pixels: centre, second moments,
// peak amplitude) is highest there (ties: the earlier child).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot::detail {

namespace {

struct Gaussian2d {
    double mx = 0.0, my = 0.0, cxx = 0.0, cyy = 0.0, cxy = 0.0, logAmp = 0.0;
};

Gaussian2d fitCore(const std::vector<std::int32_t>& pix, const std::vector<std::int32_t>& xs,
                   const std::vector<std::int32_t>& ys, const std::vector<float>& fs) {
    const double x0 = xs[pix.front()], y0 = ys[pix.front()];
    double s = 0, sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, fmax = 0;
    for (std::int32_t i : pix) {
        const double f = fs[i];
        const double dx = xs[i] - x0, dy = ys[i] - y0;
        s += f;
        sx += f * dx;
        sy += f * dy;
        sxx += f * dx * dx;
        syy += f * dy * dy;
        sxy += f * dx * dy;
        fmax = std::max(fmax, f);
    }
    Gaussian2d g;
    double mx = sx / s, my = sy / s;
    double vxx = sxx / s - mx * mx, vyy = syy / s - my * my, vxy = sxy / s - mx * my;
    if (vxx * vyy - vxy * vxy < 1.0 / 144.0) { // as SExtractor: avoid infinitely thin profiles
        vxx += 1.0 / 12.0;
        vyy += 1.0 / 12.0;
    }
    const double det = vxx * vyy - vxy * vxy;
    g.mx = x0 + mx;
    g.my = y0 + my;
    g.cxx = vyy / det;
    g.cyy = vxx / det;
    g.cxy = -2.0 * vxy / det;
    g.logAmp = std::log(fmax);
    return g;
}

// A branch of the deblending: its pixels (indices into the region's, raster order) and the working list.
struct Branch {
    std::vector<std::int32_t> pix;  // raster order
    std::vector<std::int32_t> work; // pixels of pix still to scan, raster order (unused while workIsPix)
    bool workIsPix = true;
    bool frozen = false; // fewer than 2 minArea pixels above a level: never split again
};

// deblendObject's working memory, kept per thread between calls (freed after a region of more than
// kKeptPixels pixels), so that the thousands of small blends of a crowded frame do not allocate.
struct DeblendScratch {
    std::vector<std::int32_t> xs, ys;
    std::vector<float> fs;
    std::vector<std::uint8_t> leftOf;
    std::vector<double> tLevel;
    std::vector<Branch> branches; // [0, nBranches) in use
    std::size_t nBranches = 0;
    std::vector<std::int32_t> cur, next, runStart, abovePix, compArea, parent, lab, owner, boxIndex;
    std::vector<std::uint8_t> isMax;
    std::vector<Run> subRuns;
    std::vector<double> compFlux;
    std::vector<Gaussian2d> model;

    std::int32_t newBranch() {
        if (nBranches == branches.size()) branches.emplace_back();
        Branch& b = branches[nBranches];
        b.pix.clear();
        b.work.clear();
        b.workIsPix = true;
        b.frozen = false;
        return static_cast<std::int32_t>(nBranches++);
    }
};
constexpr std::int32_t kKeptPixels = 1 << 16;

} // namespace

int peakCount(const std::vector<Run>& root, const DetectionImages& im) {
    int count = 0;
    for (const Run& r : root) {
        const int ya = std::max(0, r.y - 1), yb = std::min(im.height - 1, r.y + 1);
        for (std::int32_t x = r.x0; x <= r.x1; ++x) {
            const float f = im.detAt(x, r.y);
            const int xa = std::max(0, x - 1), xb = std::min(im.width - 1, x + 1);
            bool peak = true;
            for (int yy = ya; yy <= yb && peak; ++yy) {
                for (int xx = xa; xx <= xb; ++xx)
                    if (im.detAt(xx, yy) > f) {
                        peak = false;
                        break;
                    }
            }
            if (peak && ++count >= 2) return count;
        }
    }
    return count;
}

void deblendObject(const std::vector<Run>& root, const DetectionImages& im, const DetectionParams& p,
                   DeblendOutput& out, bool peakShortcut, bool freezeSinglePeak) {
    out.children.clear();
    out.split = false;
    out.overflow = false;
    const std::int64_t n64 = runsArea(root);
    const int nLevels = p.deblendLevels;
    if (nLevels < 2 || n64 < 2 * static_cast<std::int64_t>(p.minArea) || n64 < 2) {
        out.children.push_back(root);
        return;
    }
    const auto n = static_cast<std::int32_t>(n64);
    if (peakShortcut && peakCount(root, im) < 2) { // a single (non-strict) local maximum: no level can split it
        out.children.push_back(root);
        return;
    }

    thread_local DeblendScratch scratch;
    DeblendScratch& w = scratch;
    struct Release { // a large region's memory is not kept
        DeblendScratch& w;
        bool large;
        ~Release() {
            if (large) w = DeblendScratch{};
        }
    } release{w, n > kKeptPixels};

    // Materialise the region's pixels in raster order.
    std::vector<std::int32_t>& xs = w.xs;
    std::vector<std::int32_t>& ys = w.ys;
    std::vector<float>& fs = w.fs;
    std::vector<std::uint8_t>& leftOf = w.leftOf; // pixel i - 1 is the left neighbour of pixel i
    xs.resize(n);
    ys.resize(n);
    fs.resize(n);
    leftOf.resize(n);
    double t0 = std::numeric_limits<double>::infinity();
    double fmax = -std::numeric_limits<double>::infinity();
    double rootFlux = 0.0;
    {
        std::int32_t i = 0;
        for (const Run& r : root) {
            for (std::int32_t x = r.x0; x <= r.x1; ++x, ++i) {
                const float d = im.detAt(x, r.y);
                leftOf[i] = i > 0 && ys[i - 1] == r.y && xs[i - 1] == x - 1 ? 1 : 0;
                xs[i] = x;
                ys[i] = r.y;
                fs[i] = d;
                t0 = std::min(t0, im.thresholdAt(x, r.y));
                fmax = std::max(fmax, static_cast<double>(d));
                rootFlux += d;
            }
        }
    }
    if (!(t0 > 0.0) || !(fmax > t0) || !(rootFlux > 0.0)) {
        out.children.push_back(root);
        return;
    }
    const double minFlux = p.deblendContrast * rootFlux;

    // The levels' thresholds. They increase with k (fmax > t0 > 0), so a pixel below one level's threshold
    // is below every later one: each branch keeps, besides its pixels (its core if it is never split again),
    // the working list of its pixels above the last threshold it was examined at, and the next level scans
    // only those (the same runs, pixels and sums in the same order as a scan of all its pixels). A branch
    // with fewer than 2 minArea pixels above a level never splits again and is not examined any more. Should
    // rounding ever make the thresholds non-increasing, every level scans all the pixels of every branch.
    std::vector<double>& tLevel = w.tLevel;
    tLevel.assign(static_cast<std::size_t>(nLevels), 0.0);
    bool increasing = true;
    for (int k = 1; k < nLevels; ++k) {
        tLevel[k] = t0 * std::pow(fmax / t0, static_cast<double>(k) / nLevels);
        if (k > 1 && !(tLevel[k] >= tLevel[k - 1])) increasing = false;
    }
    // The region's local maxima: pixels that no 8-neighbour of the region exceeds. A part above a level t_k
    // of a branch holds its largest pixel m; a region neighbour of m above t_k lies in the same branch (the
    // two were above every earlier level, adjacent: never separated) and in the same part, so it is not
    // larger, and the other neighbours are at most t_k: m is such a maximum. So a branch holding at most one
    // never splits: it is frozen at once (with increasing thresholds) instead of being examined at every
    // later level, which gives the same branches (freezeSinglePeak = false examines them; tests compare).
    const bool freeze = freezeSinglePeak && increasing;
    std::vector<std::uint8_t>& isMax = w.isMax;
    if (freeze) {
        std::int32_t xMin = xs[0], xMax = xs[0];
        for (const Run& r : root) {
            xMin = std::min(xMin, r.x0);
            xMax = std::max(xMax, r.x1);
        }
        const std::int32_t yMin = ys[0], yMax = ys[n - 1];
        const std::int64_t bw = static_cast<std::int64_t>(xMax) - xMin + 1;
        const std::int64_t bh = static_cast<std::int64_t>(yMax) - yMin + 1;
        std::vector<std::int32_t>& at = w.boxIndex;
        at.assign(static_cast<std::size_t>(bw * bh), -1);
        for (std::int32_t i = 0; i < n; ++i)
            at[static_cast<std::size_t>((ys[i] - yMin) * bw + (xs[i] - xMin))] = i;
        isMax.resize(n);
        for (std::int32_t i = 0; i < n; ++i) {
            const float f = fs[i];
            bool top = true;
            for (int dy = -1; dy <= 1 && top; ++dy) {
                const std::int32_t yy = ys[i] + dy;
                if (yy < yMin || yy > yMax) continue;
                for (int dx = -1; dx <= 1; ++dx) {
                    const std::int32_t xx = xs[i] + dx;
                    if (xx < xMin || xx > xMax) continue;
                    const std::int32_t j = at[static_cast<std::size_t>((yy - yMin) * bw + (xx - xMin))];
                    if (j >= 0 && fs[j] > f) {
                        top = false;
                        break;
                    }
                }
            }
            isMax[i] = top ? 1 : 0;
        }
    }
    auto singlePeak = [&](const std::vector<std::int32_t>& pix) {
        int count = 0;
        for (const std::int32_t i : pix)
            if (isMax[i] && ++count >= 2) return false;
        return true;
    };
    std::vector<Branch>& branches = w.branches;
    w.nBranches = 0;
    {
        Branch& whole = branches[w.newBranch()];
        std::vector<std::int32_t>& all = whole.pix;
        all.resize(n);
        for (std::int32_t i = 0; i < n; ++i)
            all[i] = i;
        if (freeze) whole.frozen = singlePeak(all);
    }
    std::vector<std::int32_t>& cur = w.cur; // indices into branches
    std::vector<std::int32_t>& next = w.next;
    cur.assign(1, 0);

    std::vector<Run>& subRuns = w.subRuns;
    std::vector<std::int32_t>& runStart = w.runStart;
    std::vector<std::int32_t>& abovePix = w.abovePix;
    std::vector<std::int32_t>& compArea = w.compArea;
    std::vector<std::int32_t>& parent = w.parent;
    std::vector<std::int32_t>& lab = w.lab;
    std::vector<double>& compFlux = w.compFlux;
    const auto minPix = 2 * static_cast<std::int64_t>(p.minArea);
    for (int k = 1; k < nLevels; ++k) {
        const double tk = tLevel[k];
        next.clear();
        for (const std::int32_t bi : cur) {
            if (branches[bi].frozen) {
                next.push_back(bi);
                continue;
            }
            subRuns.clear();
            runStart.clear();
            {
                // A pixel extends the last run when it follows the last pixel above tk in the region's raster
                // order and in its row (leftOf): the region's pixel left of it is the one before it.
                const Branch& o = branches[bi];
                const std::vector<std::int32_t>& scan = o.workIsPix ? o.pix : o.work;
                abovePix.resize(scan.size());
                std::int32_t* above = abovePix.data();
                std::size_t nAbove = 0;
                std::int32_t last = -2;
                for (const std::int32_t i : scan) {
                    if (!(static_cast<double>(fs[i]) > tk)) continue;
                    if (i == last + 1 && leftOf[i]) {
                        subRuns.back().x1 = xs[i];
                    } else {
                        subRuns.push_back({ys[i], xs[i], xs[i]});
                        runStart.push_back(static_cast<std::int32_t>(nAbove));
                    }
                    above[nAbove++] = i;
                    last = i;
                }
                abovePix.resize(nAbove);
            }
            runStart.push_back(static_cast<std::int32_t>(abovePix.size()));
            // Not split at this level: it is re-examined at the next one from the pixels above tk.
            auto keep = [&](bool frozen) {
                Branch& o = branches[bi];
                if (increasing) {
                    o.frozen = frozen;
                    if (abovePix.size() < (o.workIsPix ? o.pix.size() : o.work.size())) {
                        o.work.swap(abovePix);
                        o.workIsPix = false;
                    }
                }
                next.push_back(bi);
            };
            if (static_cast<std::int64_t>(abovePix.size()) < minPix) {
                keep(true);
                continue;
            }
            std::int32_t nComp = 0;
            labelRunsInto(subRuns.data(), subRuns.size(), parent, lab, nComp);
            if (nComp < 2) {
                keep(false);
                continue;
            }
            compArea.assign(nComp, 0);
            compFlux.assign(nComp, 0.0);
            for (std::size_t r = 0; r < subRuns.size(); ++r) {
                compArea[lab[r]] += runStart[r + 1] - runStart[r];
                for (std::int32_t q = runStart[r]; q < runStart[r + 1]; ++q)
                    compFlux[lab[r]] += fs[abovePix[q]];
            }
            int nSig = 0;
            for (std::int32_t c = 0; c < nComp; ++c)
                if (compArea[c] >= p.minArea && compFlux[c] > minFlux) ++nSig;
            if (nSig < 2) {
                keep(false);
                continue;
            }
            for (std::int32_t c = 0; c < nComp; ++c) {
                if (!(compArea[c] >= p.minArea && compFlux[c] > minFlux)) continue;
                const std::int32_t bp = w.newBranch();
                std::vector<std::int32_t>& part = branches[bp].pix;
                part.reserve(compArea[c]);
                for (std::size_t r = 0; r < subRuns.size(); ++r)
                    if (lab[r] == c)
                        for (std::int32_t q = runStart[r]; q < runStart[r + 1]; ++q)
                            part.push_back(abovePix[q]);
                if (freeze) branches[bp].frozen = singlePeak(part);
                next.push_back(bp);
            }
        }
        if (static_cast<int>(next.size()) > p.deblendMaxChildren) {
            out.overflow = true;
            break;
        }
        cur.swap(next);
    }

    if (cur.size() < 2) {
        out.children.push_back(root);
        return;
    }
    out.split = true;

    // Owners: cores first, then the remaining pixels by the highest Gaussian.
    const auto nChildren = static_cast<std::int32_t>(cur.size());
    std::vector<std::int32_t>& owner = w.owner;
    owner.assign(n, -1);
    std::vector<Gaussian2d>& model = w.model;
    model.assign(nChildren, Gaussian2d{});
    for (std::int32_t c = 0; c < nChildren; ++c) {
        const std::vector<std::int32_t>& core = branches[cur[c]].pix;
        for (std::int32_t i : core)
            owner[i] = c;
        model[c] = fitCore(core, xs, ys, fs);
    }
    for (std::int32_t i = 0; i < n; ++i) {
        if (owner[i] >= 0) continue;
        double best = -std::numeric_limits<double>::infinity();
        std::int32_t bestC = 0;
        for (std::int32_t c = 0; c < nChildren; ++c) {
            const Gaussian2d& g = model[c];
            const double dx = xs[i] - g.mx, dy = ys[i] - g.my;
            const double v = g.logAmp - 0.5 * (g.cxx * dx * dx + g.cyy * dy * dy + g.cxy * dx * dy);
            if (v > best) {
                best = v;
                bestC = c;
            }
        }
        owner[i] = bestC;
    }

    out.children.assign(nChildren, {});
    for (std::int32_t i = 0; i < n; ++i) {
        auto& runs = out.children[owner[i]];
        if (!runs.empty() && runs.back().y == ys[i] && runs.back().x1 == xs[i] - 1)
            runs.back().x1 = xs[i];
        else
            runs.push_back({ys[i], xs[i], xs[i]});
    }
}

} // namespace gpuphot::detail
