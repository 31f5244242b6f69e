#include "core/stages/prepare/masters.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"

namespace gpuphot {
namespace {

double medianOf(std::vector<float>& v, std::size_t n) {
    const std::size_t mid = n / 2;
    std::nth_element(v.begin(), v.begin() + mid, v.begin() + n);
    const double hi = v[mid];
    if (n % 2 == 1) return hi;
    const double lo = *std::max_element(v.begin(), v.begin() + mid);
    return 0.5 * (lo + hi);
}

std::string trimmedUpper(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    std::size_t b = 0;
    while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    s = s.substr(b);
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

std::string describe(const Frame& f) { return f.path.empty() ? std::string("(in memory)") : f.path; }

} // namespace

CombineMethod parseCombineMethod(const std::string& name, const std::string& what) {
    if (name == "median") return CombineMethod::Median;
    if (name == "clipped" || name == "mean" || name == "sigma-clip" || name == "clipped-mean")
        return CombineMethod::ClippedMean;
    throw InvalidInput(what + ": combination method must be median or clipped, not '" + name + "'");
}

std::string combineMethodName(CombineMethod m) { return m == CombineMethod::Median ? "median" : "clipped"; }

Image<float> combineImages(const std::vector<ImageView>& images, const CombineParams& p, RunContext& ctx,
                           const std::vector<double>& scales, const std::vector<MaskView>& masks) {
    if (images.empty()) throw InvalidInput("combine: no images");
    const int w = images[0].width, h = images[0].height;
    for (const auto& im : images)
        if (im.width != w || im.height != h) throw InvalidInput("combine: images of different sizes");
    if (!scales.empty() && scales.size() != images.size()) throw InvalidInput("combine: one scale per image");
    if (!masks.empty() && masks.size() != images.size()) throw InvalidInput("combine: one mask per image");
    for (const auto& m : masks)
        if (!m.empty() && (m.width != w || m.height != h)) throw InvalidInput("combine: mask of another size");
    if (p.method == CombineMethod::ClippedMean && !(p.clipSigma > 0.0 && p.clipIterations >= 1))
        throw InvalidInput("combine: clipSigma must be > 0 and clipIterations >= 1");
    const std::size_t n = images.size();
    Image<float> out(w, h, Image<float>::NoInit{});
    ParallelErrors errors;
#pragma omp parallel num_threads(ctx.threadCount())
    {
        std::vector<float> v, work;
        errors.run([&] {
            v.resize(n);
            work.resize(n);
        });
        const bool ok = !errors.failed();
#pragma omp for schedule(static)
        for (int y = 0; y < h; ++y) {
            if (!ok) continue;
            float* o = out.row(y);
            for (int x = 0; x < w; ++x) {
                std::size_t k = 0;
                for (std::size_t i = 0; i < n; ++i) {
                    if (!masks.empty() && !masks[i].empty() && masks[i](x, y) != 0) continue;
                    double val = images[i](x, y);
                    if (!scales.empty()) val *= scales[i];
                    if (std::isfinite(val)) v[k++] = static_cast<float>(val);
                }
                if (k == 0) {
                    o[x] = std::numeric_limits<float>::quiet_NaN();
                    continue;
                }
                if (p.method == CombineMethod::Median || k < 3) {
                    std::copy(v.begin(), v.begin() + k, work.begin());
                    o[x] = static_cast<float>(medianOf(work, k));
                    continue;
                }
                // Sigma clipping around the median with a robust sigma (1.4826 MAD; the standard deviation
                // when the MAD is 0), then the mean of the survivors (summed in input order, in double).
                std::size_t m = k;
                std::vector<float>& keep = v;
                for (int it = 0; it < p.clipIterations && m >= 3; ++it) {
                    std::copy(keep.begin(), keep.begin() + m, work.begin());
                    const double med = medianOf(work, m);
                    for (std::size_t i = 0; i < m; ++i) work[i] = static_cast<float>(std::fabs(keep[i] - med));
                    double sigma = 1.4826 * medianOf(work, m);
                    if (!(sigma > 0.0)) {
                        double s = 0.0, s2 = 0.0;
                        for (std::size_t i = 0; i < m; ++i) {
                            s += keep[i];
                            s2 += static_cast<double>(keep[i]) * keep[i];
                        }
                        sigma = std::sqrt(std::max(0.0, s2 / m - (s / m) * (s / m)));
                    }
                    if (!(sigma > 0.0)) break;
                    std::size_t j = 0;
                    for (std::size_t i = 0; i < m; ++i)
                        if (std::fabs(keep[i] - med) <= p.clipSigma * sigma) keep[j++] = keep[i];
                    if (j == m || j == 0) break;
                    m = j;
                }
                double s = 0.0;
                for (std::size_t i = 0; i < m; ++i) s += keep[i];
                o[x] = static_cast<float>(s / static_cast<double>(m));
            }
        }
    }
    errors.rethrow();
    return out;
}

double robustMedian(const ImageView& image, const MaskView& mask, double* sigma) {
    const std::size_t total = image.pixelCount();
    const std::size_t step = std::max<std::size_t>(1, total / 4000000);
    std::vector<float> v;
    v.reserve(total / step + 1);
    for (std::size_t i = 0; i < total; i += step) {
        const int x = static_cast<int>(i % image.width), y = static_cast<int>(i / image.width);
        const float val = image(x, y);
        if (!std::isfinite(val)) continue;
        if (!mask.empty() && mask(x, y) != 0) continue;
        v.push_back(val);
    }
    if (v.empty()) {
        if (sigma) *sigma = std::nan("");
        return std::nan("");
    }
    const double med = medianOf(v, v.size());
    if (sigma) {
        for (float& x : v) x = static_cast<float>(std::fabs(x - med));
        *sigma = 1.4826 * medianOf(v, v.size());
    }
    return med;
}

BadPixelResult detectBadPixels(const ImageView& dark, const ImageView& flat, const BadPixelParams& p) {
    if (!dark.empty() && !flat.empty() && (dark.width != flat.width || dark.height != flat.height))
        throw InvalidInput("bad-pixel detection: the master dark (" + std::to_string(dark.width) + "x" +
                           std::to_string(dark.height) + ") and flat (" + std::to_string(flat.width) + "x" +
                           std::to_string(flat.height) + ") differ in size");
    BadPixelResult r;
    const ImageView& ref = dark.empty() ? flat : dark;
    if (ref.empty()) return r;
    r.mask = Image<std::uint8_t>(ref.width, ref.height, 0);
    if (!dark.empty()) {
        r.darkMedian = robustMedian(dark, {}, &r.darkSigma);
        // The floor keeps float rounding of a noiseless dark from counting as hot.
        const double floor = 1e-3 * std::max(1.0, std::fabs(r.darkMedian));
        const double cut = r.darkMedian + std::max({p.hotSigma * r.darkSigma, p.hotMinAdu, floor});
        for (int y = 0; y < dark.height; ++y)
            for (int x = 0; x < dark.width; ++x) {
                const float v = dark(x, y);
                if (!std::isfinite(v) || v > cut) {
                    r.mask(x, y) = 1;
                    ++r.hot;
                }
            }
    }
    if (!flat.empty()) {
        const double med = robustMedian(flat);
        const double lo = p.flatLow * med, hi = p.flatHigh * med;
        for (int y = 0; y < flat.height; ++y)
            for (int x = 0; x < flat.width; ++x) {
                const float v = flat(x, y);
                if (!std::isfinite(v) || v < lo || v > hi) {
                    if (!r.mask(x, y)) ++r.dead;
                    r.mask(x, y) = 1;
                }
            }
    }
    return r;
}

namespace {

std::optional<std::pair<long long, long long>> binningOf(const Header& h) {
    auto bx = h.getInt("XBINNING"), by = h.getInt("YBINNING");
    if (bx && by) return std::make_pair(*bx, *by);
    if (auto s = h.getString("CCDSUM")) {
        long long a = 0, b = 0;
        if (std::sscanf(s->c_str(), "%lld %lld", &a, &b) == 2) return std::make_pair(a, b);
    }
    return std::nullopt;
}

} // namespace

MasterResult buildMaster(const std::string& type, std::vector<Frame>& frames, const CombineParams& combine,
                         const PrepareParams& prepare, const Frame* bias, const Frame* dark, RunContext& ctx) {
    if (type != "bias" && type != "dark" && type != "flat")
        throw InvalidInput("master: type must be bias, dark or flat, not '" + type + "'");
    if (frames.empty()) throw InvalidInput("master " + type + ": no input frames");
    auto timer = ctx.time("master " + type);
    const Frame& first = frames.front();
    const auto bin0 = binningOf(first.header);
    const auto filter0 = first.header.getString("FILTER");
    std::vector<PrepareResult> prep;
    for (Frame& f : frames) {
        if (const auto b = binningOf(f.header); b && bin0 && *b != *bin0)
            throw InvalidInput("master " + type + ": " + describe(f) + " has binning " + std::to_string(b->first) +
                               "x" + std::to_string(b->second) + " but " + describe(first) + " has " +
                               std::to_string(bin0->first) + "x" + std::to_string(bin0->second));
        if (type == "flat") {
            const auto fl = f.header.getString("FILTER");
            if (fl && filter0 && trimmedUpper(*fl) != trimmedUpper(*filter0))
                throw InvalidInput("master flat: " + describe(f) + " has FILTER '" + *fl + "' but " + describe(first) +
                                   " has '" + *filter0 + "'");
        }
        prep.push_back(applyOverscanAndTrim(f, prepare, ctx));
        if (f.width() != first.width() || f.height() != first.height())
            throw InvalidInput("master " + type + ": " + describe(f) + " is " + std::to_string(f.width()) + "x" +
                               std::to_string(f.height()) + " but " + describe(first) + " is " +
                               std::to_string(first.width()) + "x" + std::to_string(first.height()));
    }
    const int w = first.width(), h = first.height();
    auto checkSize = [&](const Frame* m, const char* what) {
        if (m && (m->width() != w || m->height() != h))
            throw InvalidInput("master " + type + ": the master " + what + " " + describe(*m) + " is " +
                               std::to_string(m->width()) + "x" + std::to_string(m->height()) + " but " +
                               describe(first) + " is " + std::to_string(w) + "x" + std::to_string(h) +
                               " (after trimming)");
    };
    checkSize(bias, "bias");
    checkSize(dark, "dark");
    auto exptimeOf = [](const Frame& f) { return f.header.getDouble("EXPTIME"); };
    std::optional<double> darkTime;
    if (dark && type == "flat") {
        darkTime = exptimeOf(*dark);
        if (!darkTime || !(*darkTime > 0.0))
            throw InvalidInput("master flat: the master dark " + describe(*dark) + " has no positive EXPTIME");
    }

    // Calibrate each input in place.
    std::vector<double> scales(frames.size(), 1.0);
    const std::optional<double> t0 = exptimeOf(first);
    for (std::size_t i = 0; i < frames.size(); ++i) {
        Frame& f = frames[i];
        double darkScale = 0.0;
        if (darkTime) {
            const auto t = exptimeOf(f);
            if (!t) throw InvalidInput("master flat: " + describe(f) + " has no EXPTIME to scale the dark with");
            darkScale = *t / *darkTime;
        }
        if (type != "bias" && (bias || darkScale > 0.0)) {
#pragma omp parallel for num_threads(ctx.threadCount()) schedule(static)
            for (int y = 0; y < h; ++y) {
                float* px = f.pixels.row(y);
                for (int x = 0; x < w; ++x) {
                    double v = px[x];
                    if (bias) v -= bias->pixels(x, y);
                    if (darkScale > 0.0) v -= darkScale * dark->pixels(x, y);
                    px[x] = static_cast<float>(v);
                }
            }
        }
        if (type == "dark") {
            const auto t = exptimeOf(f);
            if (t && t0 && *t > 0.0) scales[i] = *t0 / *t;
            else if (t.has_value() != t0.has_value() || (t && t0 && *t != *t0))
                throw InvalidInput("master dark: " + describe(f) + " and " + describe(first) +
                                   " need positive EXPTIME keywords to be scaled to one exposure time");
        } else if (type == "flat") {
            const double med = robustMedian(f.view(), f.maskView());
            if (!(med > 0.0))
                throw InvalidInput("master flat: " + describe(f) + " has a non-positive median (" + std::to_string(med) +
                                   " ADU) after calibration");
            scales[i] = 1.0 / med;
        }
    }
    std::vector<ImageView> views;
    std::vector<MaskView> masks;
    for (const Frame& f : frames) {
        views.push_back(f.view());
        // Saturated pixels are excluded from flats; bias/dark use every finite pixel.
        masks.push_back(type == "flat" ? f.maskView() : MaskView{});
    }
    if (type != "flat") masks.clear();
    MasterResult r;
    r.combined = frames.size();
    r.master.pixels = combineImages(views, combine, ctx, scales, masks);
    r.master.mask = Image<std::uint8_t>(w, h, 0);
    if (type == "flat") {
        // Median of the flat-normalised combination in ADU terms: mean of the inputs' medians.
        double sumMed = 0.0;
        for (double s : scales) sumMed += 1.0 / s;
        const double med = robustMedian(r.master.pixels.view());
        if (!(med > 0.0)) throw InvalidInput("master flat: the combined flat has a non-positive median");
        r.median = sumMed / static_cast<double>(scales.size()) * med;
        float* px = r.master.pixels.data();
        const std::size_t total = r.master.pixels.pixelCount();
        for (std::size_t i = 0; i < total; ++i) px[i] = static_cast<float>(px[i] / med);
    } else {
        r.median = robustMedian(r.master.pixels.view());
    }
    for (std::size_t i = 0; i < r.master.pixels.pixelCount(); ++i)
        if (!std::isfinite(r.master.pixels.data()[i])) r.master.mask.data()[i] = MaskNonFinite;

    Header hd = first.header;
    for (const char* k : {"BIASSEC", "TRIMSEC", "DATASEC", "SATURATE", "BZERO", "BSCALE", "BLANK"}) hd.remove(k);
    static const char* kTypes[][2] = {{"bias", "Master Bias"}, {"dark", "Master Dark"}, {"flat", "Master Flat"}};
    for (const auto& t : kTypes)
        if (type == t[0]) hd.set("IMAGETYP", t[1], "frame type");
    hd.set("NCOMBINE", static_cast<long long>(frames.size()), "frames combined");
    hd.set("COMBMETH", combineMethodName(combine.method), "per-pixel combination");
    if (combine.method == CombineMethod::ClippedMean) hd.set("COMBSIG", combine.clipSigma, "clipping limit (sigma)");
    if (prep.front().overscanApplied) hd.set("OVERSCAN", true, "inputs overscan-subtracted");
    if (prep.front().trimmed) hd.set("TRIMMED", true, "inputs trimmed to TRIMSEC/DATASEC");
    if (bias && type != "bias") hd.set("MBIAS", describe(*bias), "master bias subtracted");
    if (dark && type == "flat") hd.set("MDARK", describe(*dark), "master dark subtracted (EXPTIME-scaled)");
    if (type == "flat") hd.set("FLATMED", r.median, "[ADU] median level of the inputs before normalising");
    else hd.set("MEDIAN", r.median, "[ADU] median of the master");
    if (type == "dark" && t0) hd.set("EXPTIME", *t0, "[s] exposure time the master dark is scaled to");
    for (std::size_t i = 0; i < frames.size() && i < 999; ++i) {
        char key[9];
        std::snprintf(key, sizeof key, "IMCMB%03zu", i + 1);
        const std::string name = describe(frames[i]);
        hd.set(key, name.size() > 60 ? name.substr(name.size() - 60) : name, "input frame");
    }
    hd.addHistory("gpuphot master " + type + ": " + std::to_string(frames.size()) + " frames, " +
                  combineMethodName(combine.method));
    r.master.header = std::move(hd);
    r.master.instrument = first.instrument;
    r.master.path = "";
    return r;
}

} // namespace gpuphot
