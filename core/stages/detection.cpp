#include "core/stages/detection.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "core/model/flags.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background.hpp"
#include "core/stages/convolution.hpp"
#include "core/stages/detection_internal.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

void to_json(nlohmann::json& j, const DetectionParams& p) {
    j = nlohmann::json{{"threshold", p.threshold},
                       {"thresholdIsAbsolute", p.thresholdIsAbsolute},
                       {"minArea", p.minArea},
                       {"filter", p.filter},
                       {"filterFwhm", p.filterFwhm},
                       {"filterKernel", p.filterKernel},
                       {"filterKernelWidth", p.filterKernelWidth},
                       {"deblendLevels", p.deblendLevels},
                       {"deblendContrast", p.deblendContrast},
                       {"deblendMaxChildren", p.deblendMaxChildren},
                       {"clean", p.clean},
                       {"cleanParam", p.cleanParam},
                       {"gain", p.gain},
                       {"windowSigmaFactor", p.windowSigmaFactor},
                       {"windowMinSigma", p.windowMinSigma},
                       {"windowMaxIterations", p.windowMaxIterations},
                       {"windowTolerance", p.windowTolerance}};
    // JSON has no infinity: an absent saturation level means none.
    if (std::isfinite(p.saturationLevel)) j["saturationLevel"] = p.saturationLevel;
}

void from_json(const nlohmann::json& j, DetectionParams& p) {
    const DetectionParams d;
    p.threshold = j.value("threshold", d.threshold);
    p.thresholdIsAbsolute = j.value("thresholdIsAbsolute", d.thresholdIsAbsolute);
    p.minArea = j.value("minArea", d.minArea);
    p.filter = j.value("filter", d.filter);
    p.filterFwhm = j.value("filterFwhm", d.filterFwhm);
    p.filterKernel = j.value("filterKernel", d.filterKernel);
    p.filterKernelWidth = j.value("filterKernelWidth", d.filterKernelWidth);
    p.deblendLevels = j.value("deblendLevels", d.deblendLevels);
    p.deblendContrast = j.value("deblendContrast", d.deblendContrast);
    p.deblendMaxChildren = j.value("deblendMaxChildren", d.deblendMaxChildren);
    p.clean = j.value("clean", d.clean);
    p.cleanParam = j.value("cleanParam", d.cleanParam);
    p.gain = j.value("gain", d.gain);
    p.saturationLevel = j.contains("saturationLevel") && !j.at("saturationLevel").is_null()
                            ? j.at("saturationLevel").get<double>()
                            : d.saturationLevel;
    p.windowSigmaFactor = j.value("windowSigmaFactor", d.windowSigmaFactor);
    p.windowMinSigma = j.value("windowMinSigma", d.windowMinSigma);
    p.windowMaxIterations = j.value("windowMaxIterations", d.windowMaxIterations);
    p.windowTolerance = j.value("windowTolerance", d.windowTolerance);
}

namespace {

using detail::Run;

void validate(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
              const DetectionParams& p) {
    auto sizeOf = [](int w, int h) { return std::to_string(w) + "x" + std::to_string(h); };
    const std::string size = sizeOf(image.width, image.height);
    if (image.empty()) throw InvalidInput("detection: the image is empty");
    if (bkg.level.width() != image.width || bkg.level.height() != image.height)
        throw InvalidInput("detection: background level map is " +
                           sizeOf(bkg.level.width(), bkg.level.height()) + ", the image " + size);
    if (bkg.rms.width() != image.width || bkg.rms.height() != image.height)
        throw InvalidInput("detection: background rms map is " + sizeOf(bkg.rms.width(), bkg.rms.height()) +
                           ", the image " + size);
    if (!mask.empty() && (mask.width != image.width || mask.height != image.height))
        throw InvalidInput("detection: mask is " + sizeOf(mask.width, mask.height) + ", the image " + size);
    if (!(p.threshold > 0.0) || !std::isfinite(p.threshold))
        throw InvalidInput("detection: threshold must be positive (got " + std::to_string(p.threshold) + ")");
    if (p.minArea < 1)
        throw InvalidInput("detection: minArea must be >= 1 (got " + std::to_string(p.minArea) + ")");
    if (p.deblendLevels < 1 || p.deblendLevels > 1024)
        throw InvalidInput("detection: deblendLevels must be in 1..1024 (got " +
                           std::to_string(p.deblendLevels) + ")");
    if (!(p.deblendContrast >= 0.0) || p.deblendContrast > 1.0)
        throw InvalidInput("detection: deblendContrast must be in [0, 1] (got " +
                           std::to_string(p.deblendContrast) + ")");
    if (p.deblendMaxChildren < 2) throw InvalidInput("detection: deblendMaxChildren must be >= 2");
    if (p.clean && !(p.cleanParam > 0.0)) throw InvalidInput("detection: cleanParam must be positive");
    if (!(p.gain >= 0.0)) throw InvalidInput("detection: gain must be >= 0 (0: no Poisson term)");
    if (p.filter && !p.filterKernel.empty()) {
        if (p.filterKernelWidth <= 0 || p.filterKernel.size() % p.filterKernelWidth != 0)
            throw InvalidInput("detection: filterKernel size " + std::to_string(p.filterKernel.size()) +
                               " is not a multiple of filterKernelWidth " +
                               std::to_string(p.filterKernelWidth));
    }
}

// Background-subtracted pixels and per-pixel state.
void prepare(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
             const DetectionParams& p, Image<float>& sub, Image<std::uint8_t>& state, int threads) {
    const int w = image.width, h = image.height;
    sub = Image<float>(w, h, Image<float>::NoInit{});
    state = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
    const bool hasMask = !mask.empty();
    const auto sat = static_cast<float>(p.saturationLevel);
    const bool hasSat = std::isfinite(p.saturationLevel);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int y = 0; y < h; ++y) {
        const float* in = image.row(y);
        const float* lv = bkg.level.row(y);
        const float* rm = bkg.rms.row(y);
        const std::uint8_t* mk = hasMask ? mask.row(y) : nullptr;
        float* out = sub.row(y);
        std::uint8_t* st = state.row(y);
        for (int x = 0; x < w; ++x) {
            const std::uint8_t mb = mk ? mk[x] : 0;
            std::uint8_t s = 0;
            if (!std::isfinite(in[x]) || !std::isfinite(lv[x]) || !std::isfinite(rm[x]) ||
                (mb & (MaskNonFinite | MaskOutside)))
                s |= detail::StateInvalid | detail::StateBad;
            if (mb & (MaskBad | MaskCosmicRay)) s |= detail::StateBad;
            if ((mb & MaskSaturated) || (hasSat && in[x] >= sat)) s |= detail::StateSaturated;
            out[x] = (s & detail::StateBad) ? 0.0f : in[x] - lv[x];
            st[x] = s;
        }
    }
}

// Runs of above-threshold pixels in raster order; rows are scanned in parallel in fixed blocks.
std::vector<Run> thresholdRuns(const detail::DetectionImages& im, int threads) {
    constexpr int kBlock = 64;
    const int nBlocks = (im.height + kBlock - 1) / kBlock;
    std::vector<std::vector<Run>> blocks(nBlocks);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int b = 0; b < nBlocks; ++b) {
        auto& out = blocks[b];
        const int y1 = std::min(im.height, (b + 1) * kBlock);
        for (int y = b * kBlock; y < y1; ++y) {
            const float* d = im.det.row(y);
            const float* r = im.rms.row(y);
            const std::uint8_t* s = im.state.row(y);
            int x = 0;
            while (x < im.width) {
                auto isAbove = [&](int xx) {
                    const double t = im.absolute ? im.threshold : im.threshold * static_cast<double>(r[xx]);
                    return !(s[xx] & detail::StateInvalid) && static_cast<double>(d[xx]) > t;
                };
                if (!isAbove(x)) {
                    ++x;
                    continue;
                }
                const int x0 = x;
                while (x < im.width && isAbove(x))
                    ++x;
                out.push_back({y, x0, x - 1});
            }
        }
    }
    std::size_t total = 0;
    for (const auto& b : blocks)
        total += b.size();
    std::vector<Run> runs;
    runs.reserve(total);
    for (const auto& b : blocks)
        runs.insert(runs.end(), b.begin(), b.end());
    return runs;
}

struct Object {
    std::vector<Run> runs;
    std::uint32_t flags = 0; // FlagBlended, FlagDeblendOverflow
};

} // namespace

DetectionResult cpu::detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& p, RunContext& ctx) {
    validate(image, mask, bkg, p);
    const int threads = ctx.threadCount();
    const int w = image.width, h = image.height;

    // 1. Background subtraction, pixel states, matched filter.
    Image<float> sub;
    Image<std::uint8_t> state;
    prepare(image, mask, bkg, p, sub, state, threads);
    Image<float> filtered;
    if (p.filter) {
        if (!p.filterKernel.empty()) {
            std::vector<float> k = p.filterKernel;
            double sum = 0.0;
            for (float v : k)
                sum += v;
            if (sum != 0.0)
                for (float& v : k)
                    v = static_cast<float>(v / sum);
            const int kw = p.filterKernelWidth;
            convolve2d(sub.view(), k, kw, static_cast<int>(k.size()) / kw, filtered, threads);
        } else {
            convolveSeparable(sub.view(), gaussianKernel1d(p.filterFwhm), filtered, threads);
        }
    }
    detail::DetectionImages im;
    im.width = w;
    im.height = h;
    im.sub = sub.view();
    im.det = p.filter ? filtered.view() : sub.view();
    im.rms = bkg.rms.view();
    im.state = state.view();
    im.threshold = p.threshold;
    im.absolute = p.thresholdIsAbsolute;
    ctx.report("detection", 0.2);
    ctx.checkCancelled();

    // 2. Thresholding; the per-object half is shared with the CUDA backend.
    return detail::detectFromRuns(thresholdRuns(im, threads), im, p, ctx);
}

namespace detail {

DetectionResult detectFromRuns(std::vector<Run> runs, const DetectionImages& im, const DetectionParams& p,
                               RunContext& ctx) {
    const int threads = ctx.threadCount();
    const int w = im.width, h = im.height;
    DetectionResult result;

    // 2b. 8-connected labelling of the runs.
    std::int32_t nComp = 0;
    const std::vector<std::int32_t> label = detail::labelRuns(runs.data(), runs.size(), nComp);
    std::vector<std::int64_t> compArea(nComp, 0);
    std::vector<std::int32_t> compRuns(nComp, 0);
    for (std::size_t r = 0; r < runs.size(); ++r) {
        compArea[label[r]] += runs[r].x1 - runs[r].x0 + 1;
        ++compRuns[label[r]];
    }
    std::vector<std::int32_t> rootIndex(nComp, -1);
    std::vector<std::vector<Run>> roots;
    for (std::int32_t c = 0; c < nComp; ++c) {
        if (compArea[c] < p.minArea) continue;
        rootIndex[c] = static_cast<std::int32_t>(roots.size());
        roots.emplace_back();
        roots.back().reserve(compRuns[c]);
    }
    for (std::size_t r = 0; r < runs.size(); ++r)
        if (rootIndex[label[r]] >= 0) roots[rootIndex[label[r]]].push_back(runs[r]);
    runs = {};
    result.nBeforeDeblend = roots.size();
    ctx.report("detection", 0.35);
    ctx.checkCancelled();

    // 3. Deblending, per region in parallel; children collected in region order.
    const auto nRoots = static_cast<std::int64_t>(roots.size());
    std::vector<detail::DeblendOutput> deblended(roots.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
    for (std::int64_t i = 0; i < nRoots; ++i)
        detail::deblendObject(roots[i], im, p, deblended[i]);
    std::vector<Object> objects;
    for (std::int64_t i = 0; i < nRoots; ++i) {
        auto& d = deblended[i];
        std::uint32_t fl = (d.split ? FlagBlended : 0u) | (d.overflow ? FlagDeblendOverflow : 0u);
        for (auto& c : d.children)
            objects.push_back({std::move(c), fl});
        d = {};
    }
    roots = {};
    deblended = {};
    result.nDeblended = objects.size();
    ctx.report("detection", 0.6);
    ctx.checkCancelled();

    // 4. Isophotal measurements, cleaning.
    const auto nObj = static_cast<std::int64_t>(objects.size());
    std::vector<detail::IsoMeasure> iso(objects.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (std::int64_t i = 0; i < nObj; ++i)
        iso[i] = detail::measureIsophotal(objects[i].runs, im, p);
    if (p.clean) {
        const std::vector<std::int32_t> target = detail::cleanTargets(iso, im, p, threads);
        std::vector<char> grown(objects.size(), 0);
        for (std::int64_t i = 0; i < nObj; ++i) {
            if (target[i] < 0) continue;
            auto& dst = objects[target[i]].runs;
            dst.insert(dst.end(), objects[i].runs.begin(), objects[i].runs.end());
            objects[i].runs.clear();
            grown[target[i]] = 1;
            ++result.nCleaned;
        }
        std::vector<Object> kept;
        std::vector<detail::IsoMeasure> keptIso;
        kept.reserve(objects.size() - result.nCleaned);
        for (std::int64_t i = 0; i < nObj; ++i) {
            if (target[i] >= 0) continue;
            if (grown[i])
                std::sort(objects[i].runs.begin(), objects[i].runs.end(), [](const Run& a, const Run& b) {
                    return a.y < b.y || (a.y == b.y && a.x0 < b.x0);
                });
            kept.push_back(std::move(objects[i]));
            keptIso.push_back(grown[i] ? detail::measureIsophotal(kept.back().runs, im, p) : iso[i]);
        }
        objects.swap(kept);
        iso.swap(keptIso);
    }
    ctx.report("detection", 0.75);
    ctx.checkCancelled();

    // 5. Final order: first pixel in raster order.
    std::vector<std::int32_t> order(objects.size());
    for (std::size_t i = 0; i < order.size(); ++i)
        order[i] = static_cast<std::int32_t>(i);
    std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
        const Run& ra = objects[a].runs.front();
        const Run& rb = objects[b].runs.front();
        return ra.y < rb.y || (ra.y == rb.y && ra.x0 < rb.x0);
    });

    // 6. Segmentation map, windowed positions, the Sources columns.
    const auto n = static_cast<std::int64_t>(order.size());
    result.segmentation = Image<std::int32_t>(w, h, 0);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (std::int64_t k = 0; k < n; ++k) {
        const auto id = static_cast<std::int32_t>(k + 1);
        for (const Run& r : objects[order[k]].runs) {
            std::int32_t* row = result.segmentation.row(r.y);
            for (std::int32_t x = r.x0; x <= r.x1; ++x)
                row[x] = id;
        }
    }
    Sources& s = result.sources;
    s.resize(static_cast<std::size_t>(n));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (std::int64_t k = 0; k < n; ++k) {
        const Object& o = objects[order[k]];
        const detail::IsoMeasure& m = iso[order[k]];
        const auto id = static_cast<std::int32_t>(k + 1);
        const detail::WindowResult win = detail::measureWindowed(m, o.runs, id, result.segmentation, im, p);
        s.x[k] = win.x;
        s.y[k] = win.y;
        s.xErr[k] = win.xErr;
        s.yErr[k] = win.yErr;
        s.xIso[k] = m.xIso;
        s.yIso[k] = m.yIso;
        s.x2[k] = m.x2;
        s.y2[k] = m.y2;
        s.xy[k] = m.xy;
        s.a[k] = m.a;
        s.b[k] = m.b;
        s.theta[k] = m.theta;
        s.fluxIso[k] = m.flux;
        s.fluxIsoErr[k] = std::sqrt(m.fluxVar);
        s.areaIso[k] = m.area;
        s.peak[k] = m.peak;
        s.xMin[k] = m.xMin;
        s.xMax[k] = m.xMax;
        s.yMin[k] = m.yMin;
        s.yMax[k] = m.yMax;
        s.flags[k] = m.flags | o.flags;
        s.segmentId[k] = id;
    }
    ctx.report("detection", 1.0);
    return result;
}

} // namespace detail

} // namespace gpuphot
