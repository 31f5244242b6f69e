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

// The region's detection threshold t0 (its lowest pixel threshold), filtered peak and filtered flux.
struct RegionLevels {
    double t0 = std::numeric_limits<double>::infinity();
    double fmax = -std::numeric_limits<double>::infinity();
    double rootFlux = 0.0;
};

// Materialise the region's n pixels in raster order into w.xs, w.ys, w.fs and w.leftOf (pixel i - 1 is the
// left neighbour of pixel i), with the region's levels.
RegionLevels materialise(const std::vector<Run>& root, const DetectionImages& im, std::int32_t n,
                         DeblendScratch& w) {
    std::vector<std::int32_t>& xs = w.xs;
    std::vector<std::int32_t>& ys = w.ys;
    std::vector<float>& fs = w.fs;
    std::vector<std::uint8_t>& leftOf = w.leftOf;
    xs.resize(n);
    ys.resize(n);
    fs.resize(n);
    leftOf.resize(n);
    RegionLevels lv;
    std::int32_t i = 0;
    for (const Run& r : root) {
        for (std::int32_t x = r.x0; x <= r.x1; ++x, ++i) {
            const float d = im.detAt(x, r.y);
            leftOf[i] = i > 0 && ys[i - 1] == r.y && xs[i - 1] == x - 1 ? 1 : 0;
            xs[i] = x;
            ys[i] = r.y;
            fs[i] = d;
            lv.t0 = std::min(lv.t0, im.thresholdAt(x, r.y));
            lv.fmax = std::max(lv.fmax, static_cast<double>(d));
            lv.rootFlux += d;
        }
    }
    return lv;
}

// The levels' thresholds t_k = t0 (fmax / t0)^(k / nLevels) into tLevel (entry 0 unused); returns whether
// they increase with k.
bool levelThresholds(std::vector<double>& tLevel, int nLevels, double t0, double fmax) {
    tLevel.assign(static_cast<std::size_t>(nLevels), 0.0);
    bool increasing = true;
    for (int k = 1; k < nLevels; ++k) {
        tLevel[k] = t0 * std::pow(fmax / t0, static_cast<double>(k) / nLevels);
        if (k > 1 && !(tLevel[k] >= tLevel[k - 1])) increasing = false;
    }
    return increasing;
}

// w.isMax: the region's local maxima, pixels that no 8-neighbour of the region exceeds (found through an
// index of the region's bounding box).
void markLocalMaxima(const std::vector<Run>& root, std::int32_t n, DeblendScratch& w) {
    const std::vector<std::int32_t>& xs = w.xs;
    const std::vector<std::int32_t>& ys = w.ys;
    const std::vector<float>& fs = w.fs;
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
    std::vector<std::uint8_t>& isMax = w.isMax;
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

// Whether pix holds at most one of the region's local maxima (such a branch never splits).
bool singlePeak(const std::vector<std::int32_t>& pix, const std::vector<std::uint8_t>& isMax) {
    int count = 0;
    for (const std::int32_t i : pix)
        if (isMax[i] && ++count >= 2) return false;
    return true;
}

// What decides the splits of every level.
struct SplitRule {
    std::int64_t minPix; // 2 minArea: fewer pixels above a level cannot make two parts
    int minArea;         // of a part that counts
    double minFlux;      // filtered flux a part that counts must exceed (contrast times the region's flux)
    bool increasing; // the thresholds increase: a branch's working list shrinks to its pixels above a level
    bool freeze;     // freeze a new branch holding at most one local maximum
};

// Branch bi's pixels above tk (from its working list) as runs in w.subRuns; the pixels in w.abovePix, run r's
// from w.runStart[r] to w.runStart[r + 1].
void scanAbove(DeblendScratch& w, std::int32_t bi, double tk) {
    w.subRuns.clear();
    w.runStart.clear();
    {
        // A pixel extends the last run when it follows the last pixel above tk in the region's raster
        // order and in its row (leftOf): the region's pixel left of it is the one before it.
        const Branch& o = w.branches[bi];
        const std::vector<std::int32_t>& scan = o.workIsPix ? o.pix : o.work;
        w.abovePix.resize(scan.size());
        std::int32_t* above = w.abovePix.data();
        std::size_t nAbove = 0;
        std::int32_t last = -2;
        for (const std::int32_t i : scan) {
            if (!(static_cast<double>(w.fs[i]) > tk)) continue;
            if (i == last + 1 && w.leftOf[i]) {
                w.subRuns.back().x1 = w.xs[i];
            } else {
                w.subRuns.push_back({w.ys[i], w.xs[i], w.xs[i]});
                w.runStart.push_back(static_cast<std::int32_t>(nAbove));
            }
            above[nAbove++] = i;
            last = i;
        }
        w.abovePix.resize(nAbove);
    }
    w.runStart.push_back(static_cast<std::int32_t>(w.abovePix.size()));
}

// Branch bi is not split at this level: it goes on to the next one, re-examined there from its pixels above
// this level's threshold (w.abovePix), or frozen.
void keepBranch(DeblendScratch& w, std::int32_t bi, bool frozen, bool increasing) {
    Branch& o = w.branches[bi];
    if (increasing) {
        o.frozen = frozen;
        if (w.abovePix.size() < (o.workIsPix ? o.pix.size() : o.work.size())) {
            o.work.swap(w.abovePix);
            o.workIsPix = false;
        }
    }
    w.next.push_back(bi);
}

// Each significant part of the scan (at least minArea pixels and flux above minFlux) becomes a new branch,
// in order of the parts, appended to w.next.
void addParts(DeblendScratch& w, std::int32_t nComp, const SplitRule& rule) {
    for (std::int32_t c = 0; c < nComp; ++c) {
        if (!(w.compArea[c] >= rule.minArea && w.compFlux[c] > rule.minFlux)) continue;
        const std::int32_t bp = w.newBranch();
        std::vector<std::int32_t>& part = w.branches[bp].pix;
        part.reserve(w.compArea[c]);
        for (std::size_t r = 0; r < w.subRuns.size(); ++r)
            if (w.lab[r] == c)
                for (std::int32_t q = w.runStart[r]; q < w.runStart[r + 1]; ++q)
                    part.push_back(w.abovePix[q]);
        if (rule.freeze) w.branches[bp].frozen = singlePeak(part, w.isMax);
        w.next.push_back(bp);
    }
}

// Branch bi at threshold tk: replaced in w.next by its parts above tk when at least two of them count,
// else kept.
void splitBranch(DeblendScratch& w, std::int32_t bi, double tk, const SplitRule& rule) {
    scanAbove(w, bi, tk);
    if (static_cast<std::int64_t>(w.abovePix.size()) < rule.minPix) {
        keepBranch(w, bi, true, rule.increasing);
        return;
    }
    std::int32_t nComp = 0;
    labelRunsInto(w.subRuns.data(), w.subRuns.size(), w.parent, w.lab, nComp);
    if (nComp < 2) {
        keepBranch(w, bi, false, rule.increasing);
        return;
    }
    w.compArea.assign(nComp, 0);
    w.compFlux.assign(nComp, 0.0);
    for (std::size_t r = 0; r < w.subRuns.size(); ++r) {
        w.compArea[w.lab[r]] += w.runStart[r + 1] - w.runStart[r];
        for (std::int32_t q = w.runStart[r]; q < w.runStart[r + 1]; ++q)
            w.compFlux[w.lab[r]] += w.fs[w.abovePix[q]];
    }
    int nSig = 0;
    for (std::int32_t c = 0; c < nComp; ++c)
        if (w.compArea[c] >= rule.minArea && w.compFlux[c] > rule.minFlux) ++nSig;
    if (nSig < 2) {
        keepBranch(w, bi, false, rule.increasing);
        return;
    }
    addParts(w, nComp, rule);
}

// Re-threshold the branches of w.cur at every level in turn, leaving the final branches in w.cur; returns
// true (deblending overflow) when a level gives more than maxChildren branches, w.cur then being the
// previous level's.
bool descendLevels(DeblendScratch& w, int nLevels, int maxChildren, const SplitRule& rule) {
    for (int k = 1; k < nLevels; ++k) {
        const double tk = w.tLevel[k];
        w.next.clear();
        for (const std::int32_t bi : w.cur) {
            if (w.branches[bi].frozen) {
                w.next.push_back(bi);
                continue;
            }
            splitBranch(w, bi, tk, rule);
        }
        if (static_cast<int>(w.next.size()) > maxChildren) return true;
        w.cur.swap(w.next);
    }
    return false;
}

// Owners (w.owner) of the region's n pixels among the children w.cur: cores first, then the remaining pixels
// by the highest Gaussian fitted to a core (ties: the earlier child).
void assignOwners(DeblendScratch& w, std::int32_t n) {
    const std::vector<std::int32_t>& xs = w.xs;
    const std::vector<std::int32_t>& ys = w.ys;
    const auto nChildren = static_cast<std::int32_t>(w.cur.size());
    std::vector<std::int32_t>& owner = w.owner;
    owner.assign(n, -1);
    std::vector<Gaussian2d>& model = w.model;
    model.assign(nChildren, Gaussian2d{});
    for (std::int32_t c = 0; c < nChildren; ++c) {
        const std::vector<std::int32_t>& core = w.branches[w.cur[c]].pix;
        for (std::int32_t i : core)
            owner[i] = c;
        model[c] = fitCore(core, xs, ys, w.fs);
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
}

// The children's runs (raster order) from the owners of the region's n pixels.
void emitChildren(const DeblendScratch& w, std::int32_t n, DeblendOutput& out) {
    out.children.assign(w.cur.size(), {});
    for (std::int32_t i = 0; i < n; ++i) {
        auto& runs = out.children[w.owner[i]];
        if (!runs.empty() && runs.back().y == w.ys[i] && runs.back().x1 == w.xs[i] - 1)
            runs.back().x1 = w.xs[i];
        else
            runs.push_back({w.ys[i], w.xs[i], w.xs[i]});
    }
}

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

    const RegionLevels lv = materialise(root, im, n, w);
    if (!(lv.t0 > 0.0) || !(lv.fmax > lv.t0) || !(lv.rootFlux > 0.0)) {
        out.children.push_back(root);
        return;
    }
    const double minFlux = p.deblendContrast * lv.rootFlux;

    // The levels' thresholds. They increase with k (fmax > t0 > 0), so a pixel below one level's threshold
    // is below every later one: each branch keeps, besides its pixels (its core if it is never split again),
    // the working list of its pixels above the last threshold it was examined at, and the next level scans
    // only those (the same runs, pixels and sums in the same order as a scan of all its pixels). A branch
    // with fewer than 2 minArea pixels above a level never splits again and is not examined any more. Should
    // rounding ever make the thresholds non-increasing, every level scans all the pixels of every branch.
    const bool increasing = levelThresholds(w.tLevel, nLevels, lv.t0, lv.fmax);
    // The region's local maxima: pixels that no 8-neighbour of the region exceeds. A part above a level t_k
    // of a branch holds its largest pixel m; a region neighbour of m above t_k lies in the same branch (the
    // two were above every earlier level, adjacent: never separated) and in the same part, so it is not
    // larger, and the other neighbours are at most t_k: m is such a maximum. So a branch holding at most one
    // never splits: it is frozen at once (with increasing thresholds) instead of being examined at every
    // later level, which gives the same branches (freezeSinglePeak = false examines them; tests compare).
    const bool freeze = freezeSinglePeak && increasing;
    if (freeze) markLocalMaxima(root, n, w);
    w.nBranches = 0;
    {
        Branch& whole = w.branches[w.newBranch()];
        std::vector<std::int32_t>& all = whole.pix;
        all.resize(n);
        for (std::int32_t i = 0; i < n; ++i)
            all[i] = i;
        if (freeze) whole.frozen = singlePeak(all, w.isMax);
    }
    w.cur.assign(1, 0); // indices into branches

    const SplitRule rule{2 * static_cast<std::int64_t>(p.minArea), p.minArea, minFlux, increasing, freeze};
    if (descendLevels(w, nLevels, p.deblendMaxChildren, rule)) out.overflow = true;

    if (w.cur.size() < 2) {
        out.children.push_back(root);
        return;
    }
    out.split = true;
    assignOwners(w, n);
    emitChildren(w, n, out);
}

} // namespace gpuphot::detail
