#include "core/stages/prepare/prepare.hpp"
#include "core/stages/prepare/weight_map.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/masters.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

// ---- JSON -------------------------------------------------------------------------------------------

void to_json(nlohmann::json& j, const PrepareResult& r) {
    j = nlohmann::json{{"steps", r.steps},
                       {"overscanApplied", r.overscanApplied},
                       {"overscanLevel", r.overscanLevel},
                       {"trimmed", r.trimmed},
                       {"trimX0", r.trimX0},
                       {"trimY0", r.trimY0},
                       {"rawWidth", r.rawWidth},
                       {"rawHeight", r.rawHeight},
                       {"bias", r.biasApplied},
                       {"dark", r.darkApplied},
                       {"darkScale", r.darkScale},
                       {"flat", r.flatApplied},
                       {"bleedPixels", r.bleedPixels},
                       {"badPixels", r.badPixels},
                       {"saltPepperPixels", r.saltPepperPixels},
                       {"cosmicPixels", r.cosmicPixels},
                       {"bayer", r.bayerApplied},
                       {"weightMap", r.weightMap},
                       {"weightUnusablePixels", r.weightUnusablePixels}};
}

// ---- sections, overscan, trim ------------------------------------------------------------------------

bool parseFitsSection(const std::string& text, int& x0, int& y0, int& width, int& height) {
    std::string s;
    for (char c : text)
        if (!std::isspace(static_cast<unsigned char>(c))) s += c;
    long a = 0, b = 0, c = 0, d = 0;
    char close = 0;
    if (std::sscanf(s.c_str(), "[%ld:%ld,%ld:%ld%c", &a, &b, &c, &d, &close) != 5 || close != ']')
        return false;
    if (a < 1 || b < 1 || c < 1 || d < 1) return false;
    if (a > b) std::swap(a, b);
    if (c > d) std::swap(c, d);
    x0 = static_cast<int>(a - 1);
    y0 = static_cast<int>(c - 1);
    width = static_cast<int>(b - a + 1);
    height = static_cast<int>(d - c + 1);
    return true;
}

namespace {

std::string describe(const Frame& f) {
    return f.path.empty() ? std::string("the frame") : f.path;
}

struct Section {
    int x0 = 0, y0 = 0, w = 0, h = 0;
};

std::optional<Section> headerSection(const Frame& f, const char* key) {
    const auto s = f.header.getString(key);
    if (!s) return std::nullopt;
    Section sec;
    if (!parseFitsSection(*s, sec.x0, sec.y0, sec.w, sec.h))
        throw InvalidInput(describe(f) + ": " + key + " = '" + *s + "' is not a FITS section [x1:x2,y1:y2]");
    if (sec.x0 + sec.w > f.width() || sec.y0 + sec.h > f.height())
        throw InvalidInput(describe(f) + ": " + key + " = '" + *s + "' lies outside the " +
                           std::to_string(f.width()) + "x" + std::to_string(f.height()) + " image");
    return sec;
}

double medianOfVector(std::vector<float>& v) {
    if (v.empty()) return std::nan("");
    const std::size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + mid, v.end());
    const double hi = v[mid];
    if (v.size() % 2 == 1) return hi;
    return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + mid));
}

std::optional<std::pair<long long, long long>> binningOf(const Header& h) {
    auto bx = h.getInt("XBINNING"), by = h.getInt("YBINNING");
    if (bx && by) return std::make_pair(*bx, *by);
    if (auto s = h.getString("CCDSUM")) {
        long long a = 0, b = 0;
        if (std::sscanf(s->c_str(), "%lld %lld", &a, &b) == 2) return std::make_pair(a, b);
    }
    return std::nullopt;
}

std::string normalisedFilter(std::string s) {
    std::string out;
    for (char c : s)
        if (!std::isspace(static_cast<unsigned char>(c)))
            out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

} // namespace

std::size_t maskBleedTrails(const ImageView& px, Image<std::uint8_t>& mask, double saturation,
                            double fraction, int grow) {
    if (!std::isfinite(saturation) || saturation <= 0.0) return 0;
    const int w = px.width, h = px.height;
    // Columns holding a saturated pixel (a row-wise scan, branch-free, rows split over the threads; trails
    // only matter there).
    std::vector<std::uint8_t> hasSat(w, 0);
    ParallelErrors errors;
#pragma omp parallel
    {
        std::vector<std::uint8_t> local;
        errors.run([&] { local.assign(w, 0); });
        const bool ok = !errors.failed();
#pragma omp for schedule(static) nowait
        for (int y = 0; y < h; ++y) {
            if (!ok) continue;
            const std::uint8_t* m = mask.row(y);
            for (int x = 0; x < w; ++x)
                local[x] |= static_cast<std::uint8_t>(m[x] & MaskSaturated);
        }
#pragma omp critical(gpuphot_bleed_columns)
        if (ok)
            for (int x = 0; x < w; ++x)
                hasSat[x] |= local[x];
    }
    errors.rethrow();
    std::vector<int> cols;
    for (int x = 0; x < w; ++x)
        if (hasSat[x]) cols.push_back(x);
    const float level = static_cast<float>(fraction * saturation);
    std::size_t added = 0;
#pragma omp parallel for schedule(dynamic, 4) reduction(+ : added)
    for (std::ptrdiff_t ci = 0; ci < static_cast<std::ptrdiff_t>(cols.size()); ++ci)
        errors.run([&] {
            const int x = cols[ci];
            std::vector<std::uint8_t> sat(h, 0);
            for (int y = 0; y < h; ++y)
                sat[y] = (mask(x, y) & MaskSaturated) ? 1 : 0;
            // Runs above `level` that touch a saturated pixel.
            std::vector<std::uint8_t> trail(sat);
            int y = 0;
            while (y < h) {
                if (!(px(x, y) >= level || sat[y])) {
                    ++y;
                    continue;
                }
                int e = y;
                bool touches = false;
                while (e < h && (px(x, e) >= level || sat[e]))
                    touches |= sat[e++] != 0;
                if (touches)
                    for (int k = y; k < e; ++k)
                        trail[k] = 1;
                y = e;
            }
            // Grow along the column.
            std::vector<std::uint8_t> grown(trail);
            for (int k = 0; k < h; ++k)
                if (trail[k])
                    for (int d = std::max(0, k - grow); d <= std::min(h - 1, k + grow); ++d)
                        grown[d] = 1;
            for (int k = 0; k < h; ++k)
                if (grown[k] && !(mask(x, k) & MaskSaturated)) {
                    mask(x, k) |= MaskSaturated;
                    ++added;
                }
        });
    errors.rethrow();
    return added;
}

namespace {

// The overscan of a frame with BIASSEC (params.overscan): one level, or one per row.
struct OverscanLevels {
    double level = 0.0; // the median of BIASSEC
    std::vector<double>
        rowLevel; // per row of the frame (NaN outside BIASSEC's rows or without finite pixels)
    bool perRow = false;
    double reported = 0.0; // PrepareResult::overscanLevel
    double sub(int y) const { return perRow && std::isfinite(rowLevel[y]) ? rowLevel[y] : level; }
};

std::optional<OverscanLevels> overscanLevels(const Frame& frame, const PrepareParams& params) {
    if (!params.overscan) return std::nullopt;
    const auto b = headerSection(frame, "BIASSEC");
    if (!b) return std::nullopt;
    OverscanLevels o;
    o.perRow = params.overscanMethod == "row";
    o.rowLevel.assign(frame.height(), std::nan(""));
    std::vector<float> all, rowVals;
    for (int y = b->y0; y < b->y0 + b->h; ++y) {
        rowVals.clear();
        for (int x = b->x0; x < b->x0 + b->w; ++x) {
            const float v = frame.pixels(x, y);
            if (std::isfinite(v)) rowVals.push_back(v);
        }
        all.insert(all.end(), rowVals.begin(), rowVals.end());
        if (o.perRow) o.rowLevel[y] = medianOfVector(rowVals);
    }
    o.level = medianOfVector(all);
    if (!std::isfinite(o.level)) throw InvalidInput(describe(frame) + ": BIASSEC holds no finite pixels");
    o.reported = o.level;
    if (o.perRow) {
        std::vector<float> rl;
        for (double v : o.rowLevel)
            if (std::isfinite(v)) rl.push_back(static_cast<float>(v));
        o.reported = medianOfVector(rl);
    }
    return o;
}

// TRIMSEC (else DATASEC) when it cuts the frame (params.trim).
std::optional<Section> trimSection(const Frame& frame, const PrepareParams& params) {
    if (!params.trim) return std::nullopt;
    std::optional<Section> t = headerSection(frame, "TRIMSEC");
    if (!t) t = headerSection(frame, "DATASEC");
    if (t && (t->x0 != 0 || t->y0 != 0 || t->w != frame.width() || t->h != frame.height())) return t;
    return std::nullopt;
}

// The header and WCS of a frame trimmed to t.
void trimHeader(Frame& frame, const Section& t) {
    Header& hd = frame.header;
    if (auto c = hd.getDouble("CRPIX1")) hd.set("CRPIX1", *c - t.x0, "reference pixel (1-based), trimmed");
    if (auto c = hd.getDouble("CRPIX2")) hd.set("CRPIX2", *c - t.y0, "reference pixel (1-based), trimmed");
    hd.set("LTV1", hd.getDouble("LTV1").value_or(0.0) - t.x0, "offset of the trimmed section");
    hd.set("LTV2", hd.getDouble("LTV2").value_or(0.0) - t.y0, "offset of the trimmed section");
    hd.remove("TRIMSEC");
    hd.remove("BIASSEC");
    hd.remove("DATASEC");
    if (frame.wcs || hd.has("CRPIX1")) {
        std::string why;
        if (auto wcs = Wcs::tryFromHeader(hd, &why)) {
            frame.wcs = std::make_shared<const Wcs>(std::move(*wcs));
            frame.wcsProblem.clear();
        } else {
            frame.wcs.reset();
            frame.wcsProblem = why;
        }
    }
}

bool bleedApplies(const Frame& frame, const PrepareParams& params) {
    return params.bleedTrails && std::isfinite(frame.instrument.saturation) &&
           frame.instrument.saturation > 0.0;
}

void ensureMask(Frame& frame) {
    if (frame.mask.width() != frame.width() || frame.mask.height() != frame.height())
        frame.mask = Image<std::uint8_t>(frame.width(), frame.height(), 0);
}

} // namespace

PrepareResult applyOverscanAndTrim(Frame& frame, const PrepareParams& params, RunContext& ctx) {
    PrepareResult r;
    r.rawWidth = frame.width();
    r.rawHeight = frame.height();
    ensureMask(frame);
    if (bleedApplies(frame, params)) {
        r.bleedPixels = maskBleedTrails(frame.view(), frame.mask, frame.instrument.saturation,
                                        params.bleedFraction, params.bleedGrow);
        if (r.bleedPixels > 0) r.steps.push_back("bleed trails");
    }
    const int w = frame.width(), h = frame.height();
    if (const auto o = overscanLevels(frame, params)) {
        r.overscanLevel = o->reported;
#pragma omp parallel for num_threads(ctx.threadCount()) schedule(static)
        for (int y = 0; y < h; ++y) {
            const double sub = o->sub(y);
            float* p = frame.pixels.row(y);
            for (int x = 0; x < w; ++x)
                p[x] = static_cast<float>(p[x] - sub);
        }
        r.overscanApplied = true;
        r.steps.push_back(o->perRow ? "overscan (per row)" : "overscan");
    }
    if (const auto t = trimSection(frame, params)) {
        Image<float> px(t->w, t->h, Image<float>::NoInit{});
        Image<std::uint8_t> m(t->w, t->h, Image<std::uint8_t>::NoInit{});
#pragma omp parallel for num_threads(ctx.threadCount()) schedule(static)
        for (int y = 0; y < t->h; ++y) {
            std::copy(frame.pixels.row(y + t->y0) + t->x0, frame.pixels.row(y + t->y0) + t->x0 + t->w,
                      px.row(y));
            std::copy(frame.mask.row(y + t->y0) + t->x0, frame.mask.row(y + t->y0) + t->x0 + t->w, m.row(y));
        }
        frame.pixels = std::move(px);
        frame.mask = std::move(m);
        r.trimmed = true;
        r.trimX0 = t->x0;
        r.trimY0 = t->y0;
        trimHeader(frame, *t);
        r.steps.push_back("trim");
    }
    return r;
}

// ---- masters ---------------------------------------------------------------------------------------

void completePrepareInputs(PrepareInputs& in, const PrepareParams& params) {
    const CalibrationImage* ref = nullptr;
    for (const auto* m : {&in.bias, &in.dark, &in.flat}) {
        if (!*m) continue;
        if (ref && ((*m)->width() != ref->width() || (*m)->height() != ref->height()))
            throw InvalidInput((*m)->path + " is " + std::to_string((*m)->width()) + "x" +
                               std::to_string((*m)->height()) + " but " + ref->path + " is " +
                               std::to_string(ref->width()) + "x" + std::to_string(ref->height()));
        if (!ref) ref = &**m;
    }
    if (in.dark) {
        const auto t = in.dark->header.getDouble("EXPTIME");
        if (!t || !(*t > 0.0))
            throw InvalidInput(in.dark->path + ": a master dark needs a positive EXPTIME to be scaled");
    }
    if (params.autoBadPixels && (in.dark || in.flat)) {
        BadPixelParams bp;
        bp.hotSigma = params.hotSigma;
        bp.flatLow = params.flatLow;
        bp.flatHigh = params.flatHigh;
        const BadPixelResult found = detectBadPixels(in.dark ? in.dark->pixels.view() : ImageView{},
                                                     in.flat ? in.flat->pixels.view() : ImageView{}, bp);
        in.autoHot = found.hot;
        in.autoDead = found.dead;
        if (in.badPixels.empty()) {
            in.badPixels = found.mask;
            in.badPixelPath = "masters";
        } else if (in.badPixels.width() == found.mask.width() &&
                   in.badPixels.height() == found.mask.height()) {
            for (std::size_t i = 0; i < found.mask.pixelCount(); ++i)
                in.badPixels.data()[i] |= found.mask.data()[i];
        } else {
            throw InvalidInput(in.badPixelPath + " is " + std::to_string(in.badPixels.width()) + "x" +
                               std::to_string(in.badPixels.height()) + " but " + ref->path + " is " +
                               std::to_string(ref->width()) + "x" + std::to_string(ref->height()));
        }
    }
}

// ---- the stage -------------------------------------------------------------------------------------

namespace {

// The part of a calibration image that lines up with the (trimmed) frame of w x h pixels.
template <class T>
ImageViewT<T> aligned(const Image<T>& img, const std::string& what, const Frame& frame, int w, int h,
                      const PrepareResult& r) {
    ImageViewT<T> v = img.view();
    if (v.width == w && v.height == h) return v;
    if (r.trimmed && v.width == r.rawWidth && v.height == r.rawHeight)
        return {v.data + static_cast<std::ptrdiff_t>(r.trimY0) * v.stride + r.trimX0, w, h, v.stride};
    throw InvalidInput(describe(frame) + " is " + std::to_string(w) + "x" + std::to_string(h) +
                       (r.trimmed ? " (trimmed)" : "") + " but " + what + " is " + std::to_string(v.width) +
                       "x" + std::to_string(v.height));
}

void checkCompatible(const Frame& frame, const CalibrationImage& c, const char* role) {
    const auto fb = binningOf(frame.header), cb = binningOf(c.header);
    if (fb && cb && *fb != *cb)
        throw InvalidInput(describe(frame) + " has binning " + std::to_string(fb->first) + "x" +
                           std::to_string(fb->second) + " but the master " + role + " " + c.path + " has " +
                           std::to_string(cb->first) + "x" + std::to_string(cb->second));
}

// Steps 4-5's inputs checked and aligned with the (trimmed) w x h frame; r: the trim so far. Fills
// r.darkScale.
PrepareCalibration calibrationViews(const Frame& frame, int w, int h, const PrepareInputs* inputs,
                                    PrepareResult& r) {
    PrepareCalibration cal;
    if (!inputs) return cal;
    if (inputs->bias) {
        checkCompatible(frame, *inputs->bias, "bias");
        const std::string what = "the master bias " + inputs->bias->path;
        cal.bias = aligned(inputs->bias->pixels, what, frame, w, h, r);
        cal.biasMask = aligned(inputs->bias->mask, what, frame, w, h, r);
    }
    if (inputs->dark) {
        checkCompatible(frame, *inputs->dark, "dark");
        const std::string what = "the master dark " + inputs->dark->path;
        cal.dark = aligned(inputs->dark->pixels, what, frame, w, h, r);
        cal.darkMask = aligned(inputs->dark->mask, what, frame, w, h, r);
        const auto td = inputs->dark->header.getDouble("EXPTIME");
        double tf = frame.instrument.exptime;
        if (!std::isfinite(tf)) tf = frame.header.getDouble("EXPTIME").value_or(std::nan(""));
        if (!td || !(*td > 0.0))
            throw InvalidInput("the master dark " + inputs->dark->path + " has no positive EXPTIME");
        if (!std::isfinite(tf) || tf < 0.0)
            throw InvalidInput(describe(frame) + " has no EXPTIME to scale the master dark " +
                               inputs->dark->path);
        r.darkScale = tf / *td;
    }
    if (inputs->flat) {
        checkCompatible(frame, *inputs->flat, "flat");
        const auto ff = frame.header.getString("FILTER"), cf = inputs->flat->header.getString("FILTER");
        if (ff && cf && normalisedFilter(*ff) != normalisedFilter(*cf))
            throw InvalidInput(describe(frame) + " has FILTER '" + *ff + "' but the master flat " +
                               inputs->flat->path + " has FILTER '" + *cf + "'");
        const std::string what = "the master flat " + inputs->flat->path;
        cal.flat = aligned(inputs->flat->pixels, what, frame, w, h, r);
        cal.flatMask = aligned(inputs->flat->mask, what, frame, w, h, r);
    }
    if (!inputs->badPixels.empty())
        cal.badPixels =
            aligned(inputs->badPixels, "the bad-pixel mask " + inputs->badPixelPath, frame, w, h, r);
    cal.darkScale = r.darkScale;
    return cal;
}

bool anyCalibration(const PrepareCalibration& c) {
    return !c.bias.empty() || !c.dark.empty() || !c.flat.empty() || !c.badPixels.empty();
}

// Steps 4-5 on the host: returns the pixels newly set MaskBad.
std::size_t calibrateOnHost(Frame& frame, const PrepareCalibration& c, RunContext& ctx) {
    const int w = frame.width(), h = frame.height();
    const double ds = c.darkScale;
    const float minFlat = c.minFlat;
    std::size_t bad = 0;
#pragma omp parallel for num_threads(ctx.threadCount()) schedule(static) reduction(+ : bad)
    for (int y = 0; y < h; ++y) {
        float* p = frame.pixels.row(y);
        std::uint8_t* m = frame.mask.row(y);
        const float* b = c.bias.empty() ? nullptr : c.bias.row(y);
        const float* d = c.dark.empty() ? nullptr : c.dark.row(y);
        const float* f = c.flat.empty() ? nullptr : c.flat.row(y);
        const std::uint8_t* bm = c.biasMask.empty() ? nullptr : c.biasMask.row(y);
        const std::uint8_t* dm = c.darkMask.empty() ? nullptr : c.darkMask.row(y);
        const std::uint8_t* fm = c.flatMask.empty() ? nullptr : c.flatMask.row(y);
        const std::uint8_t* bp = c.badPixels.empty() ? nullptr : c.badPixels.row(y);
        for (int x = 0; x < w; ++x) {
            bool isBad = (bp && bp[x]) || (bm && bm[x]) || (dm && dm[x]) || (fm && fm[x]);
            float v = p[x];
            if (b) v -= b[x];
            if (d) v = static_cast<float>(v - ds * d[x]);
            if (f) {
                if (std::isfinite(f[x]) && f[x] > minFlat)
                    v /= f[x];
                else
                    isBad = true;
            }
            p[x] = v;
            if (isBad && !(m[x] & MaskBad)) {
                m[x] |= MaskBad;
                ++bad;
            }
        }
    }
    return bad;
}

// Steps 1-5 on the device in one pass (CUDA backend): the same checks, levels and sections as the host
// path, computed on the host; the pixels never visit the host in between. False when the device had no
// room (the frame is unchanged but for an empty mask made full-size): the host path runs then.
bool prepareOnDevice(Frame& frame, const PrepareInputs* inputs, const PrepareParams& params, RunContext& ctx,
                     PrepareResult& out, PrepareCalibration& cal, std::size_t& bad) {
    PrepareResult r;
    r.rawWidth = frame.width();
    r.rawHeight = frame.height();
    ensureMask(frame);
    PrepareDeviceJob job;
    job.bleed = bleedApplies(frame, params);
    if (job.bleed) {
        job.bleedLevel = static_cast<float>(params.bleedFraction * frame.instrument.saturation);
        job.bleedGrow = params.bleedGrow;
    }
    const auto o = overscanLevels(frame, params);
    if (o) {
        job.overscan = true;
        job.overscanRows.resize(frame.height());
        for (int y = 0; y < frame.height(); ++y)
            job.overscanRows[y] = o->sub(y);
    }
    const auto t = trimSection(frame, params);
    job.outWidth = t ? t->w : frame.width();
    job.outHeight = t ? t->h : frame.height();
    if (t) {
        job.outX0 = t->x0;
        job.outY0 = t->y0;
        r.trimmed = true;
        r.trimX0 = t->x0;
        r.trimY0 = t->y0;
    }
    cal = calibrationViews(frame, job.outWidth, job.outHeight, inputs, r);
    cal.minFlat = static_cast<float>(params.minFlat);
    cal.keepOnDevice = !params.saltPepper && !params.cosmics && params.bayer == "none" &&
                       !(inputs && !inputs->weight.empty());
    job.calibrate = anyCalibration(cal);
    job.cal = cal;
    bad = 0;
    if (job.bleed || job.overscan || t || job.calibrate) {
        const PrepareDeviceResult res = cudaStages().prepareFrame(frame.pixels, frame.mask, job, ctx);
        if (!res.done) return false;
        bad = res.badPixels;
        r.bleedPixels = res.bleedPixels;
    }
    if (r.bleedPixels > 0) r.steps.push_back("bleed trails");
    if (o) {
        r.overscanApplied = true;
        r.overscanLevel = o->reported;
        r.steps.push_back(o->perRow ? "overscan (per row)" : "overscan");
    }
    if (t) {
        trimHeader(frame, *t);
        r.steps.push_back("trim");
    }
    out = std::move(r);
    return true;
}

// Step 9: the weight map's relative variance onto the frame, its unusable pixels MaskBad.
void attachWeightMap(Frame& frame, const PrepareInputs& inputs, const PrepareParams& params,
                     PrepareResult& r) {
    const WeightMapType type = parseWeightMapType(params.weightType);
    if (type == WeightMapType::None)
        throw InvalidInput("weight map " + inputs.weightPath +
                           ": say how to read it (--weight-type map_rms, map_var or map_weight)");
    if (inputs.weight.width() != frame.width() || inputs.weight.height() != frame.height())
        throw InvalidInput("weight map " + inputs.weightPath + " is " +
                           std::to_string(inputs.weight.width()) + "x" +
                           std::to_string(inputs.weight.height()) + " px, the prepared frame " +
                           std::to_string(frame.width()) + "x" + std::to_string(frame.height()));
    WeightVariance wv = weightToVariance(inputs.weight.view(), type, params.weightThreshold, frame.mask);
    frame.weightVariance = std::make_shared<const Image<float>>(std::move(wv.variance));
    frame.weightRescale = type != WeightMapType::Rms && params.rescaleWeights;
    r.weightMap = inputs.weightPath.empty() ? std::string("(in memory)") : inputs.weightPath;
    r.weightUnusablePixels = wv.unusable;
    r.steps.push_back("weight map");
}

} // namespace

double CalibrationImage::sectionMedian(const ImageView& section) const {
    const std::array<std::ptrdiff_t, 4> key{section.data - pixels.data(), section.width, section.height,
                                            static_cast<std::ptrdiff_t>(section.stride)};
    std::lock_guard<std::mutex> lock(medians->mutex);
    for (const auto& [k, v] : medians->values)
        if (k == key) return v;
    const double m = robustMedian(section);
    medians->values.emplace_back(key, m);
    return m;
}

PrepareResult prepareFrame(Frame& frame, const PrepareInputs* inputs, const PrepareParams& params,
                           RunContext& ctx) {
    const double rawSaturation = frame.instrument.saturation;
    PrepareResult r;
    PrepareCalibration cal;
    std::size_t bad = 0;
    // CUDA backend: steps 1-5 on the device (kernels/prepare/prepare.cu), the host path when it has no room.
    const bool onDevice = ctx.backend == Backend::Cuda && cudaStages().prepareFrame != nullptr &&
                          prepareOnDevice(frame, inputs, params, ctx, r, cal, bad);
    if (!onDevice) {
        r = applyOverscanAndTrim(frame, params, ctx);
        ctx.checkCancelled();
        cal = calibrationViews(frame, frame.width(), frame.height(), inputs, r);
        cal.minFlat = static_cast<float>(params.minFlat);
        if (anyCalibration(cal)) bad = calibrateOnHost(frame, cal, ctx);
    }
    ctx.checkCancelled();
    double pedestal = r.overscanLevel;
    const bool anyCal = anyCalibration(cal);
    if (anyCal) {
        r.badPixels = bad;
        r.biasApplied = !cal.bias.empty();
        r.darkApplied = !cal.dark.empty();
        r.flatApplied = !cal.flat.empty();
        if (r.biasApplied) r.steps.push_back("bias");
        if (r.darkApplied) r.steps.push_back("dark");
        if (r.flatApplied) r.steps.push_back("flat");
        if (!cal.badPixels.empty()) r.steps.push_back("bad pixels");
        if (r.biasApplied) pedestal += inputs->bias->sectionMedian(cal.bias);
        if (r.darkApplied) pedestal += r.darkScale * inputs->dark->sectionMedian(cal.dark);
    }
    // The saturation level in prepared ADU (the mask keeps the authoritative saturated pixels).
    if (std::isfinite(rawSaturation) && (r.overscanApplied || anyCal)) {
        double fl = 1.0;
        if (!cal.flat.empty()) fl = inputs->flat->sectionMedian(cal.flat);
        frame.instrument.saturation = (rawSaturation - pedestal) / (fl > 0.0 ? fl : 1.0);
    }
    ctx.checkCancelled();

    if (params.saltPepper) {
        const SaltPepperResult sp =
            saltPepperMask(frame.view(), frame.maskView(), params.saltPepperParams, ctx);
        std::size_t n = 0;
        for (std::size_t i = 0; i < sp.mask.pixelCount(); ++i)
            if (sp.mask.data()[i]) {
                if (!(frame.mask.data()[i] & sp.mask.data()[i])) ++n;
                frame.mask.data()[i] |= sp.mask.data()[i];
            }
        r.saltPepperPixels = n;
        r.steps.push_back("salt-and-pepper");
    }
    if (params.bayer != "none") {
        // Colour-filter-array frames: calibrated first (per raw pixel), then 2x2 super-pixels (pixels, mask
        // OR-ed, WCS, gain/read noise/saturation adjusted), then the cosmic-ray search on the binned frame.
        BayerParams bp = params.bayerParams;
        bp.output = params.bayer;
        frame = binCfaFrame(frame, bp, ctx);
        r.bayerApplied = true;
        r.steps.push_back("bayer " + params.bayer);
    }
    if (params.cosmics) {
        const CosmicRayResult cr =
            detectCosmicRays(frame.view(), frame.maskView(), frame.instrument, params.cosmic, ctx);
        for (std::size_t i = 0; i < cr.mask.pixelCount(); ++i)
            frame.mask.data()[i] |= cr.mask.data()[i];
        r.cosmicPixels = cr.crPixels;
        r.steps.push_back("cosmic rays");
    }
    if (inputs && !inputs->weight.empty()) attachWeightMap(frame, *inputs, params, r);
    return r;
}

} // namespace gpuphot
