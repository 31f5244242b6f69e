#include "core/stages/detection/detection.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "core/model/flags.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/convolution.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/stages/detection/detection_window.hpp"
#include "core/util/background_release.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot {

std::string detail::inputProblem(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                 const DetectionParams& p) {
    auto sizeOf = [](int w, int h) { return std::to_string(w) + "x" + std::to_string(h); };
    const std::string size = sizeOf(image.width, image.height);
    if (image.empty()) return "detection: the image is empty";
    if (!bkg.hasFullMaps() && bkg.level.empty() && bkg.rms.empty() && bkg.sampler) {
        if (bkg.sampler->width() != image.width || bkg.sampler->height() != image.height)
            return "detection: background is " + sizeOf(bkg.sampler->width(), bkg.sampler->height()) +
                   ", the image " + size;
    } else {
        if (bkg.level.width() != image.width || bkg.level.height() != image.height)
            return "detection: background level map is " + sizeOf(bkg.level.width(), bkg.level.height()) +
                   ", the image " + size;
        if (bkg.rms.width() != image.width || bkg.rms.height() != image.height)
            return "detection: background rms map is " + sizeOf(bkg.rms.width(), bkg.rms.height()) +
                   ", the image " + size;
    }
    if (!mask.empty() && (mask.width != image.width || mask.height != image.height))
        return "detection: mask is " + sizeOf(mask.width, mask.height) + ", the image " + size;
    if (!(p.threshold > 0.0) || !std::isfinite(p.threshold))
        return "detection: threshold must be positive (got " + std::to_string(p.threshold) + ")";
    if (p.minArea < 1) return "detection: minArea must be >= 1 (got " + std::to_string(p.minArea) + ")";
    if (p.deblendLevels < 1 || p.deblendLevels > 1024)
        return "detection: deblendLevels must be in 1..1024 (got " + std::to_string(p.deblendLevels) + ")";
    if (!(p.deblendContrast >= 0.0) || p.deblendContrast > 1.0)
        return "detection: deblendContrast must be in [0, 1] (got " + std::to_string(p.deblendContrast) + ")";
    if (p.deblendMaxChildren < 2) return "detection: deblendMaxChildren must be >= 2";
    if (!(p.windowMaxSigma >= 0.0) || (p.windowMaxSigma > 0.0 && p.windowMaxSigma < p.windowMinSigma))
        return "detection: windowMaxSigma must be 0 (no ceiling) or >= windowMinSigma (got " +
               std::to_string(p.windowMaxSigma) + ")";
    if (p.clean && !(p.cleanParam > 0.0)) return "detection: cleanParam must be positive";
    if (!(p.gain >= 0.0)) return "detection: gain must be >= 0 (0: no Poisson term)";
    if (p.filter && !p.filterKernel.empty()) {
        if (p.filterKernelWidth <= 0 || p.filterKernel.size() % p.filterKernelWidth != 0)
            return "detection: filterKernel size " + std::to_string(p.filterKernel.size()) +
                   " is not a multiple of filterKernelWidth " + std::to_string(p.filterKernelWidth);
    }
    return {};
}

namespace {

using detail::Run;

void validate(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
              const DetectionParams& p) {
    const std::string why = detail::inputProblem(image, mask, bkg, p);
    if (!why.empty()) throw InvalidInput(why);
}

// Background-subtracted pixels and per-pixel state of one row.
struct PrepareInputs {
    const ImageView* image;
    const MaskView* mask;
    const BackgroundResult* bkg;
    bool hasSat;
    float sat;
    const BackgroundSampler* sampler; // the maps' rows when bkg keeps no full maps (else null)
};

// Row y of the rms map: the full map's row, or the sampler's evaluated into buf (width floats).
inline const float* rmsRow(const BackgroundResult& bkg, int y, float* buf) {
    if (!bkg.rms.empty()) return bkg.rms.row(y);
    bkg.sampler->row(y, nullptr, buf);
    return buf;
}

// lvBuf, rmBuf: scratch rows (width floats) used when in.sampler is set.
inline void prepareRow(const PrepareInputs& in, int y, float* out, std::uint8_t* st, float* lvBuf,
                       float* rmBuf) {
    const int w = in.image->width;
    const float* px = in.image->row(y);
    const float* lv = lvBuf;
    const float* rm = rmBuf;
    if (in.sampler) {
        in.sampler->row(y, lvBuf, rmBuf);
    } else {
        lv = in.bkg->level.row(y);
        rm = in.bkg->rms.row(y);
    }
    const std::uint8_t* mk = in.mask->empty() ? nullptr : in.mask->row(y);
    const bool hasSat = in.hasSat;
    const float sat = in.sat;
    for (int x = 0; x < w; ++x) {
        const std::uint8_t mb = mk ? mk[x] : 0;
        std::uint8_t s = 0;
        if (!std::isfinite(px[x]) || !std::isfinite(lv[x]) || !std::isfinite(rm[x]) ||
            (mb & (MaskNonFinite | MaskOutside)))
            s |= detail::StateInvalid | detail::StateBad;
        if (mb & (MaskBad | MaskCosmicRay)) s |= detail::StateBad;
        if ((mb & MaskSaturated) || (hasSat && px[x] >= sat)) s |= detail::StateSaturated;
        out[x] = (s & detail::StateBad) ? 0.0f : px[x] - lv[x];
        if (st) st[x] = s;
    }
}

PrepareInputs prepareInputs(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                            const DetectionParams& p) {
    return {&image,
            &mask,
            &bkg,
            std::isfinite(p.saturationLevel),
            static_cast<float>(p.saturationLevel),
            bkg.hasFullMaps() ? nullptr : bkg.sampler.get()};
}

// Background-subtracted pixels and per-pixel state.
void prepare(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
             const DetectionParams& p, Image<float>& sub, Image<std::uint8_t>& state, int threads) {
    const int w = image.width, h = image.height;
    sub = Image<float>(w, h, Image<float>::NoInit{});
    state = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
    const PrepareInputs in = prepareInputs(image, mask, bkg, p);
    ParallelErrors errors;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> lv, rm;
        errors.run([&] {
            lv.resize(in.sampler ? w : 0);
            rm.resize(in.sampler ? w : 0);
        });
#pragma omp for schedule(static)
        for (int y = 0; y < h; ++y)
            errors.run([&] { prepareRow(in, y, sub.row(y), state.row(y), lv.data(), rm.data()); });
    }
    errors.rethrow();
}

// Appends the runs of above-threshold pixels of row y (d: detection row, r: rms row, s: state row).
// above: scratch of at least w + 8 bytes.
inline void rowRuns(int y, int w, const float* d, const float* r, const std::uint8_t* s, double threshold,
                    bool absolute, std::uint8_t* above, std::vector<Run>& out) {
    if (absolute) {
        for (int x = 0; x < w; ++x)
            above[x] = static_cast<std::uint8_t>(!(s[x] & detail::StateInvalid) &
                                                 (static_cast<double>(d[x]) > threshold));
    } else {
        for (int x = 0; x < w; ++x)
            above[x] = static_cast<std::uint8_t>(
                !(s[x] & detail::StateInvalid) &
                (static_cast<double>(d[x]) > threshold * static_cast<double>(r[x])));
    }
    std::memset(above + w, 0, 8);
    int x = 0;
    while (x < w) {
        // Skip eight background pixels at a time.
        std::uint64_t word;
        std::memcpy(&word, above + x, 8);
        if (word == 0) {
            x += 8;
            continue;
        }
        if (!above[x]) {
            ++x;
            continue;
        }
        const int x0 = x;
        while (x < w && above[x])
            ++x;
        out.push_back({y, x0, x - 1});
    }
}

// The runs of all row blocks, block after block (raster order when each block is).
std::vector<Run> concatenated(const std::vector<std::vector<Run>>& blocks) {
    std::size_t total = 0;
    for (const auto& b : blocks)
        total += b.size();
    std::vector<Run> runs;
    runs.reserve(total);
    for (const auto& b : blocks)
        runs.insert(runs.end(), b.begin(), b.end());
    return runs;
}

// Runs of above-threshold pixels in raster order; rows are scanned in parallel in fixed blocks.
std::vector<Run> thresholdRuns(const detail::DetectionImages& im, int threads) {
    constexpr int kBlock = 64;
    const int nBlocks = (im.height + kBlock - 1) / kBlock;
    std::vector<std::vector<Run>> blocks(nBlocks);
    ParallelErrors errors;
#pragma omp parallel num_threads(threads)
    {
        std::vector<std::uint8_t> above;
        std::vector<float> rmBuf;
        errors.run([&] {
            above.resize(static_cast<std::size_t>(im.width) + 8);
            rmBuf.resize(im.rms.data ? 0 : im.width);
        });
#pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < nBlocks; ++b)
            errors.run([&] {
                const int y1 = std::min(im.height, (b + 1) * kBlock);
                for (int y = b * kBlock; y < y1; ++y) {
                    const float* rm = im.rms.data ? im.rms.row(y) : rmBuf.data();
                    if (!im.rms.data) im.rmsSampler->row(y, nullptr, rmBuf.data());
                    rowRuns(y, im.width, im.det.row(y), rm, im.state.row(y), im.threshold, im.absolute,
                            above.data(), blocks[b]);
                }
            });
    }
    errors.rethrow();
    return concatenated(blocks);
}

// Background subtraction, pixel states, the separable matched filter and thresholding in one pass
// over blocks of rows: each block keeps a ring of 2r+1 horizontally filtered rows and recomputes the
// r rows of background-subtracted pixels above and below it (the same numbers its neighbours store), so
// no full-frame intermediate beyond sub, state and filtered is needed and every pixel is read once.
// The operation order of every output is that of prepare + convolveSeparable + thresholdRuns.
// filtered: null without a filter (det = sub).
std::vector<Run> fusedPass(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                           const DetectionParams& p, const std::vector<float>& k1d, Image<float>& sub,
                           Image<std::uint8_t>& state, Image<float>* filtered, int threads) {
    const int w = image.width, h = image.height;
    sub = Image<float>(w, h, Image<float>::NoInit{});
    state = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
    if (filtered) {
        *filtered = Image<float>(w, h, Image<float>::NoInit{});
    }
    const PrepareInputs in = prepareInputs(image, mask, bkg, p);
    const int n = static_cast<int>(k1d.size());
    const int r = n / 2;
    const float* k = k1d.data();
    constexpr int kBlock = 64;
    const int nBlocks = (h + kBlock - 1) / kBlock;
    std::vector<std::vector<Run>> blocks(nBlocks);
    ParallelErrors errors;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> ring, halo;
        std::vector<std::uint8_t> above;
        // Scratch rows for the maps when they are evaluated from the sampler.
        std::vector<float> lvBuf, rmBuf, rmRow;
        errors.run([&] {
            ring.resize(filtered ? static_cast<std::size_t>(n) * w : 0);
            halo.resize(filtered ? w : 0);
            above.resize(static_cast<std::size_t>(w) + 8);
            lvBuf.resize(in.sampler ? w : 0);
            rmBuf.resize(in.sampler ? w : 0);
            rmRow.resize(in.sampler ? w : 0);
        });
        // Horizontal pass of one row: acc = 0; acc += k[j] * src(x + j - r), j = 0..n-1, taps outside
        // the row skipped (interior pixels: one tap at a time over the row, the same order per pixel).
        auto hconv = [&](const float* src, float* dst) {
            const int xa = std::min(r, w), xb = std::max(xa, w - r);
            for (int x = 0; x < xa; ++x) {
                float acc = 0.0f;
                const int j0 = std::max(0, r - x), j1 = std::min(n, w + r - x);
                for (int j = j0; j < j1; ++j)
                    acc += k[j] * src[x + j - r];
                dst[x] = acc;
            }
            for (int x = xa; x < xb; ++x)
                dst[x] = 0.0f;
            for (int j = 0; j < n; ++j) {
                const float kj = k[j];
                const float* sj = src + (j - r);
#pragma omp simd
                for (int x = xa; x < xb; ++x)
                    dst[x] += kj * sj[x];
            }
            for (int x = xb; x < w; ++x) {
                float acc = 0.0f;
                const int j0 = std::max(0, r - x), j1 = std::min(n, w + r - x);
                for (int j = j0; j < j1; ++j)
                    acc += k[j] * src[x + j - r];
                dst[x] = acc;
            }
        };
#pragma omp for schedule(dynamic, 1)
        for (int b = 0; b < nBlocks; ++b)
            errors.run([&] {
                const int y0 = b * kBlock, y1 = std::min(h, y0 + kBlock);
                auto& out = blocks[b];
                if (!filtered) {
                    for (int y = y0; y < y1; ++y) {
                        prepareRow(in, y, sub.row(y), state.row(y), lvBuf.data(), rmBuf.data());
                        rowRuns(y, w, sub.row(y), in.sampler ? rmBuf.data() : bkg.rms.row(y), state.row(y),
                                p.threshold, p.thresholdIsAbsolute, above.data(), out);
                    }
                    return;
                }
                int next = std::max(0, y0 - r); // next row to subtract and filter horizontally
                for (int y = y0; y < y1; ++y) {
                    const int need = std::min(h - 1, y + r);
                    for (; next <= need; ++next) {
                        const bool own = next >= y0 && next < y1;
                        float* src = own ? sub.row(next) : halo.data();
                        prepareRow(in, next, src, own ? state.row(next) : nullptr, lvBuf.data(),
                                   rmBuf.data());
                        hconv(src, ring.data() + static_cast<std::size_t>(next % n) * w);
                    }
                    // Vertical pass, rows y - r .. y + r in order.
                    float* dst = filtered->row(y);
                    for (int x = 0; x < w; ++x)
                        dst[x] = 0.0f;
                    const int j0 = std::max(0, r - y), j1 = std::min(n, h + r - y);
                    for (int j = j0; j < j1; ++j) {
                        const float kj = k[j];
                        const float* src = ring.data() + static_cast<std::size_t>((y + j - r) % n) * w;
#pragma omp simd
                        for (int x = 0; x < w; ++x)
                            dst[x] += kj * src[x];
                    }
                    rowRuns(y, w, dst, in.sampler ? rmsRow(bkg, y, rmRow.data()) : bkg.rms.row(y),
                            state.row(y), p.threshold, p.thresholdIsAbsolute, above.data(), out);
                }
            });
    }
    errors.rethrow();
    return concatenated(blocks);
}

// body(i) for i = 0..n-1 on `threads` OpenMP threads in dynamic chunks (each i writes only its own slot).
template <class Body> void parallelEach(std::size_t n, int threads, int chunk, const Body& body) {
    const auto count = static_cast<std::int64_t>(n);
    ParallelErrors errors;
#pragma omp parallel for num_threads(threads) schedule(dynamic, chunk)
    for (std::int64_t i = 0; i < count; ++i)
        errors.run([&] { body(i); });
    errors.rethrow();
}

// Progress between the steps, and the cancel check that goes with it.
void stepDone(const RunContext& ctx, double fraction) {
    ctx.report("detection", fraction);
    ctx.checkCancelled();
}

} // namespace

namespace detail {

void prepareDetection(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                      const DetectionParams& p, int threads, PreparedDetection& out) {
    const int w = image.width, h = image.height;
    Image<float>& sub = out.sub;
    Image<std::uint8_t>& state = out.state;
    Image<float>& filtered = out.filtered;
    std::vector<Run>& runs = out.runs;
    runs.clear();
    const bool kernel2d = p.filter && !p.filterKernel.empty();
    if (kernel2d) {
        prepare(image, mask, bkg, p, sub, state, threads);
        const std::vector<float> k = normalisedKernel(p.filterKernel);
        const int kw = p.filterKernelWidth;
        convolve2d(sub.view(), k, kw, static_cast<int>(k.size()) / kw, filtered, threads);
    } else {
        std::vector<float> k1d;
        if (p.filter) k1d = gaussianKernel1d(p.filterFwhm);
        runs = fusedPass(image, mask, bkg, p, k1d, sub, state, p.filter ? &filtered : nullptr, threads);
    }
    out.width = w;
    out.height = h;
    out.filter = p.filter;
    out.im = detectionImagesOf(out, bkg, p);
    // The filtered image is read by deblending, measurement and cleaning only: freed before the
    // segmentation map is made.
    if (p.filter) out.im.releasableDet = &filtered;
    if (kernel2d) runs = thresholdRuns(out.im, threads);
}

DetectionImages detectionImagesOf(const PreparedDetection& prep, const BackgroundResult& bkg,
                                  const DetectionParams& p) {
    DetectionImages im;
    im.width = prep.width;
    im.height = prep.height;
    im.sub = prep.sub.view();
    im.det = prep.filter ? prep.filtered.view() : prep.sub.view();
    if (!bkg.rms.empty())
        im.rms = bkg.rms.view();
    else
        im.rmsSampler = bkg.sampler.get();
    im.state = prep.state.view();
    im.threshold = p.threshold;
    im.absolute = p.thresholdIsAbsolute;
    return im;
}

} // namespace detail

DetectionResult cpu::detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                   const DetectionParams& p, RunContext& ctx) {
    validate(image, mask, bkg, p);
    // 1. Background subtraction, pixel states, matched filter, thresholding.
    detail::PreparedDetection prep;
    detail::prepareDetection(image, mask, bkg, p, ctx.threadCount(), prep);
    std::vector<Run> runs = std::move(prep.runs);
    const detail::DetectionImages& im = prep.im;
    stepDone(ctx, 0.2);

    // 2. The per-object half is shared with the CUDA backend.
    DetectionResult result = detail::detectFromRuns(std::move(runs), im, p, ctx);
    // sub and the pixel states (750 MB at 151 MP) freed off the stage's critical path
    releaseInBackground(std::move(prep));
    return result;
}

namespace {
// Whether images made with parameters `a` serve `b`: the same filter and saturation, any threshold.
bool sameInputImages(const DetectionParams& a, const DetectionParams& b) {
    return a.filter == b.filter && (!a.filter || (std::bit_cast<std::uint64_t>(a.filterFwhm) ==
                                                       std::bit_cast<std::uint64_t>(b.filterFwhm) &&
                                                   a.filterKernel == b.filterKernel &&
                                                   a.filterKernelWidth == b.filterKernelWidth)) &&
           std::bit_cast<std::uint64_t>(a.saturationLevel) == std::bit_cast<std::uint64_t>(b.saturationLevel);
}
} // namespace

struct cpu::DetectionInputImages {
    DetectionParams params; // those the images were made with
    detail::PreparedDetection prep;
};

DetectionResult cpu::detectSourcesKeeping(const ImageView& image, const MaskView& mask,
                                          const BackgroundResult& bkg, const DetectionParams& p,
                                          RunContext& ctx, std::shared_ptr<const DetectionInputImages>& kept) {
    validate(image, mask, bkg, p);
    std::vector<Run> runs;
    detail::DetectionImages im;
    if (kept && kept->prep.width == image.width && kept->prep.height == image.height &&
        sameInputImages(kept->params, p)) {
        im = detail::detectionImagesOf(kept->prep, bkg, p); // the kept images, this threshold
        runs = thresholdRuns(im, ctx.threadCount());
    } else {
        auto made = std::make_shared<DetectionInputImages>();
        made->params = p;
        detail::prepareDetection(image, mask, bkg, p, ctx.threadCount(), made->prep);
        runs = std::move(made->prep.runs);
        made->prep.runs = {};
        made->prep.im.releasableDet = nullptr; // kept for the next threshold
        im = made->prep.im;
        kept = std::move(made);
    }
    stepDone(ctx, 0.2);
    return detail::detectFromRuns(std::move(runs), im, p, ctx);
}

namespace detail {

DetectedObjects detectObjects(std::vector<Run> runs, const DetectionImages& im, const DetectionParams& p,
                              RunContext& ctx) {
    const int threads = ctx.threadCount();
    DetectedObjects result;
    StepTimer timer;

    // 2b. 8-connected labelling of the runs.
    std::vector<std::vector<Run>> roots;
    {
        const RootRuns rr = labelRoots(runs, p.minArea, threads);
        runs = {};
        roots.resize(rr.size());
        parallelEach(rr.size(), threads, 256, [&](std::int64_t k) {
            roots[k].assign(rr.runs.begin() + rr.start[k], rr.runs.begin() + rr.start[k + 1]);
        });
    }
    result.nBeforeDeblend = roots.size();
    timer.lap("labelling + minimum area (host)");
    ctx.checkCancelled();
    std::size_t nMultiPeak = 0;
    if (timer.on()) {
        for (const auto& r : roots)
            nMultiPeak += detail::peakCount(r, im) >= 2;
        timer.lap("peak count (diagnostic)");
    }
    stepDone(ctx, 0.35);

    // 3. Deblending, per region in parallel; children collected in region order.
    std::vector<detail::DeblendOutput> deblended(roots.size());
    parallelEach(roots.size(), threads, 16,
                 [&](std::int64_t i) { detail::deblendObject(roots[i], im, p, deblended[i]); });
    std::vector<Object> objects;
    for (std::size_t i = 0; i < deblended.size(); ++i) {
        auto& d = deblended[i];
        std::uint32_t fl = (d.split ? FlagBlended : 0u) | (d.overflow ? FlagDeblendOverflow : 0u);
        for (auto& c : d.children)
            objects.push_back({std::move(c), fl});
        d = {};
    }
    roots = {};
    deblended = {};
    result.nDeblended = objects.size();
    timer.lap("deblending (host)");
    ctx.checkCancelled();
    stepDone(ctx, 0.6);

    // 4. Isophotal measurements, cleaning.
    std::vector<detail::IsoMeasure> iso(objects.size());
    parallelEach(objects.size(), threads, 64,
                 [&](std::int64_t i) { iso[i] = detail::measureIsophotal(objects[i].runs, im, p); });
    timer.lap("isophotal measurement (host)");
    ctx.checkCancelled();
    std::vector<std::int32_t> target;
    if (p.clean) {
        std::vector<const std::vector<Run>*> footprints(objects.size());
        for (std::size_t i = 0; i < objects.size(); ++i)
            footprints[i] = &objects[i].runs;
        target = detail::cleanTargets(iso, footprints, im, p, threads);
        timer.lap("CLEAN targets (host)");
    }
    applyClean(std::move(objects), std::move(iso), target, result);
    timer.lap("CLEAN merge (host)");
    if (timer.on()) {
        std::size_t nRuns = 0;
        for (const Object& o : result.objects)
            nRuns += o.runs.size();
        std::fprintf(stderr,
                     "detection timing: %zu roots (%zu with >= 2 peaks), %zu objects after deblending, "
                     "%zu kept, %zu runs\n",
                     result.nBeforeDeblend, nMultiPeak, result.nDeblended, result.objects.size(), nRuns);
    }
    return result;
}

void parallelFor(std::size_t n, int threads, int chunk, const std::function<void(std::int64_t)>& body) {
    parallelEach(n, threads, chunk, body);
}

RootRuns labelRoots(const std::vector<Run>& runs, int minArea, int threads) {
    const BandLabels bl = labelRunsInBands(runs.data(), runs.size(), threads);
    const std::vector<std::int32_t>& label = bl.label;
    const int bands = static_cast<int>(bl.start.size()) - 1;
    std::vector<std::int64_t> compArea(bl.nComponents, 0), compRuns(bl.nComponents, 0);
    // A band counts the components that begin in it; the runs of those that began in an earlier band
    // (few: they cross a seam) are counted and placed after, band by band, which keeps raster order.
    std::vector<std::vector<std::size_t>> carried(bands);
    auto begunIn = [&](int b, std::size_t r) { return label[r] >= bl.firstLabel[b]; };
    auto count = [&](std::size_t r) {
        compArea[label[r]] += runs[r].x1 - runs[r].x0 + 1;
        ++compRuns[label[r]];
    };
#pragma omp parallel for num_threads(bands) schedule(static, 1)
    for (int b = 0; b < bands; ++b)
        for (std::size_t r = bl.start[b]; r < bl.start[b + 1]; ++r) {
            if (begunIn(b, r))
                count(r);
            else
                carried[b].push_back(r);
        }
    for (const auto& band : carried)
        for (std::size_t r : band)
            count(r);
    // Roots in component order; the runs of each keep their raster order.
    RootRuns out;
    std::vector<std::int64_t> fill(bl.nComponents, -1);
    std::int64_t total = 0;
    for (std::int32_t c = 0; c < bl.nComponents; ++c) {
        if (compArea[c] < minArea) continue;
        fill[c] = total;
        total += compRuns[c];
        out.start.push_back(total);
    }
    out.runs = prefaultedVector<Run>(static_cast<std::size_t>(total), threads);
    auto place = [&](std::size_t r) {
        if (fill[label[r]] >= 0) out.runs[fill[label[r]]++] = runs[r];
    };
#pragma omp parallel for num_threads(bands) schedule(static, 1)
    for (int b = 0; b < bands; ++b)
        for (std::size_t r = bl.start[b]; r < bl.start[b + 1]; ++r)
            if (begunIn(b, r)) place(r);
    for (const auto& band : carried)
        for (std::size_t r : band)
            place(r);
    return out;
}

void applyClean(std::vector<Object> objects, std::vector<IsoMeasure> iso,
                const std::vector<std::int32_t>& target, DetectedObjects& result) {
    const auto nObj = static_cast<std::int64_t>(objects.size());
    if (!target.empty()) {
        std::vector<char> grown(objects.size(), 0);
        for (std::int64_t i = 0; i < nObj; ++i) {
            if (target[i] < 0) continue;
            // CLEAN only merges into objects that are themselves kept.
            detail::cleanMerge(iso[target[i]], iso[i]);
            auto& dst = objects[target[i]].runs;
            dst.insert(dst.end(), objects[i].runs.begin(), objects[i].runs.end());
            objects[i].runs.clear();
            grown[target[i]] = 1;
            ++result.nCleaned;
        }
        // The kept objects compacted in place, in order (no new memory to fault in).
        std::size_t k = 0;
        for (std::int64_t i = 0; i < nObj; ++i) {
            if (target[i] >= 0) continue;
            if (grown[i])
                std::sort(objects[i].runs.begin(), objects[i].runs.end(), [](const Run& a, const Run& b) {
                    return a.y < b.y || (a.y == b.y && a.x0 < b.x0);
                });
            if (k != static_cast<std::size_t>(i)) {
                objects[k] = std::move(objects[i]);
                iso[k] = iso[i];
            }
            ++k;
        }
        objects.resize(k);
        iso.resize(k);
    }
    result.objects = std::move(objects);
    result.iso = std::move(iso);
}

// The objects' indices ordered by their first pixel in raster order (y, then x; each object has its own):
// counted into rows, then each row's few sorted by x.
std::vector<std::int32_t> rasterOrder(const std::vector<Object>& objects, int h) {
    std::vector<std::int32_t> start(static_cast<std::size_t>(h) + 1, 0);
    for (const Object& o : objects)
        ++start[static_cast<std::size_t>(o.runs.front().y) + 1];
    for (int y = 0; y < h; ++y)
        start[y + 1] += start[y];
    std::vector<std::int32_t> order(objects.size()), fill(start.begin(), start.end() - 1);
    for (std::size_t i = 0; i < objects.size(); ++i)
        order[fill[objects[i].runs.front().y]++] = static_cast<std::int32_t>(i);
    for (int y = 0; y < h; ++y)
        std::sort(order.begin() + start[y], order.begin() + start[y + 1], [&](std::int32_t a, std::int32_t b) {
            return objects[a].runs.front().x0 < objects[b].runs.front().x0;
        });
    return order;
}

void finishDetection(DetectedObjects found, const DetectionImages& im, const DetectionParams& p,
                     RunContext& ctx, DetectionResult& result) {
    StepTimer timer; // GPUPHOT_DETECTION_TIMING: the host times of the steps below on stderr
    const int threads = ctx.threadCount();
    const int w = im.width, h = im.height;
    result.nBeforeDeblend = found.nBeforeDeblend;
    result.nDeblended = found.nDeblended;
    result.nCleaned = found.nCleaned;
    std::vector<Object>& objects = found.objects;
    const std::vector<detail::IsoMeasure>& iso = found.iso;
    // The filtered image is not read by the steps below: the segmentation map takes over its pages.
    Image<std::int32_t> seg =
        im.releasableDet && im.releasableDet->width() == w && im.releasableDet->height() == h
            ? Image<std::int32_t>::takeOver(std::move(*im.releasableDet))
            : Image<std::int32_t>(w, h, Image<std::int32_t>::NoInit{});
    stepDone(ctx, 0.75);
    timer.lap("finish: segmentation storage (host)");

    // 5. Final order: first pixel in raster order (no two objects share one).
    const std::vector<std::int32_t> order = rasterOrder(objects, h);
    timer.lap("finish: order (host)");

    // 6. Segmentation map, windowed positions, the Sources columns.
    const auto n = static_cast<std::int64_t>(order.size());
    // Zeroed in parallel row blocks (the same zeros as Image(w, h, 0), without a serial fill).
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int y = 0; y < h; ++y)
        std::memset(seg.row(y), 0, sizeof(std::int32_t) * static_cast<std::size_t>(w));
    timer.lap("finish: segmentation zero (host)");
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (std::int64_t k = 0; k < n; ++k) {
        const auto id = static_cast<std::int32_t>(k + 1);
        for (const Run& r : objects[order[k]].runs) {
            std::int32_t* row = seg.row(r.y);
            for (std::int32_t x = r.x0; x <= r.x1; ++x)
                row[x] = id;
        }
    }
    timer.lap("finish: segmentation fill (host)");
    ctx.checkCancelled();
    Sources& s = result.sources;
    s.resize(static_cast<std::size_t>(n), threads);
    ParallelErrors errors;
    // Small chunks: one large object's window (a galaxy, a bright star) can cost as much as hundreds of
    // stars, and chunks of 64 left the other threads idle behind it.
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4)
    for (std::int64_t k = 0; k < n; ++k)
        errors.run([&] {
            if (ctx.cancelRequested()) return; // the result is discarded below
            const Object& o = objects[order[k]];
            const detail::IsoMeasure& m = iso[order[k]];
            const auto id = static_cast<std::int32_t>(k + 1);
            detail::setSourceRow(s, static_cast<std::size_t>(k), m, o.flags,
                                 detail::measureWindowed(m, o.runs, id, seg, im, p));
        });
    errors.rethrow();
    ctx.checkCancelled();
    result.segmentation = SegmentationMap(std::move(seg)); // host-backed
    timer.lap("finish: windowed positions + columns (host)");
    ctx.report("detection", 1.0);
}

DetectionResult detectFromRuns(std::vector<Run> runs, const DetectionImages& im, const DetectionParams& p,
                               RunContext& ctx) {
    DetectionResult result;
    finishDetection(detectObjects(std::move(runs), im, p, ctx), im, p, ctx, result);
    return result;
}

} // namespace detail

// The stage's public entry point: the CUDA engine when the backend is CUDA and the kernels are linked
// (core/pipeline/cuda_stages.hpp), else the CPU engine.
DetectionResult detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& params, RunContext& ctx) {
    if (ctx.backend == Backend::Cuda && cudaStages().detection)
        return cudaStages().detection(image, mask, bkg, params, ctx);
    return cpu::detectSources(image, mask, bkg, params, ctx);
}

} // namespace gpuphot
