#include "core/pipeline/sextractor_catalog.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "core/catalog/table.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_ldac.hpp"
#include "core/model/flags.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/sextractor_window.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/util/text.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr float kVignetBlank = -1e30f; // SExtractor's value for VIGNET pixels off the frame or masked
constexpr double kMagBad = 99.0;       // SExtractor's magnitude (and error) of a non-positive flux

// What one parameter needs to be computed.
struct Inputs {
    const Frame& frame;
    const PipelineResult& r;
    const Table& cat;
    const SextractorCatalogOptions& o;
    std::size_t n;

    std::vector<double> col(const std::string& name) const {
        return cat.find(name) ? cat.doubles(name) : std::vector<double>(n, kNan);
    }
    int apertures() const {
        int k = 0;
        while (cat.find("flux_aper_" + std::to_string(k + 1)))
            ++k;
        return k;
    }
    // The pixel minus the background (NaN stays NaN; masked pixels are not checked).
    double skySubtracted(int x, int y) const { return frame.pixels(x, y) - r.background.levelAt(x, y); }
    // FLAG_IMAGE's composite flag and its pixel count per object and flag image, made on first use.
    const std::vector<std::vector<std::pair<std::uint32_t, std::int32_t>>>& imageFlags() const;
    mutable std::vector<std::vector<std::pair<std::uint32_t, std::int32_t>>> flagCache;
    mutable bool flagsMade = false;
    // SExtractor's windowed measurement of every object (sextractor_window.hpp), made on first use.
    const std::vector<SextractorWindow>& windows() const;
    mutable std::vector<SextractorWindow> windowCache;
    mutable bool windowsMade = false;
};

using Fill = std::function<void(const Inputs&, LdacColumn&)>;

// How a parameter takes a size: none, a vector length (FLUX_APER(n)) or a 2-d size (VIGNET(w,h)).
enum class Shape { Scalar, Vector, Image };

struct Builder {
    char type;
    const char* unit;
    const char* comment;
    Shape shape;
    Fill fill;
};

void putValues(LdacColumn& c, const std::vector<double>& v) {
    if (c.type == 'D')
        c.d = v;
    else if (c.type == 'E')
        c.e.assign(v.begin(), v.end());
    else if (c.type == 'J')
        for (double x : v)
            c.j.push_back(std::isfinite(x) ? static_cast<std::int32_t>(std::lround(x)) : 0);
    else
        for (double x : v)
            c.i.push_back(std::isfinite(x) ? static_cast<std::int16_t>(std::lround(x)) : 0);
}

Fill copyOf(std::string name) {
    return [name](const Inputs& in, LdacColumn& c) { putValues(c, in.col(name)); };
}

// The catalog's instrumental magnitudes (catalog_builder) plus MAG_ZEROPOINT, and their errors, with
// SExtractor's 99 where they are undefined (a flux <= 0).
std::vector<double> magnitudes(const std::vector<double>& flux, double zp) {
    std::vector<double> m(flux.size());
    for (std::size_t i = 0; i < flux.size(); ++i) {
        const double mag = instrumentalMag(flux[i]);
        m[i] = std::isnan(mag) ? kMagBad : zp + mag;
    }
    return m;
}

std::vector<double> magErrors(const std::vector<double>& flux, const std::vector<double>& err) {
    std::vector<double> m(flux.size());
    for (std::size_t i = 0; i < flux.size(); ++i) {
        const double e = magError(flux[i], err[i]);
        m[i] = std::isnan(e) ? kMagBad : e;
    }
    return m;
}

// Vector parameters of the apertures: FLUX_APER(n) holds apertures 1..n; without a size, aperture 1.
Fill apertures(std::function<std::vector<double>(const Inputs&, int k)> perAperture) {
    return [perAperture](const Inputs& in, LdacColumn& c) {
        const long n = c.dims.empty() ? 1 : c.dims[0];
        if (n > in.apertures())
            throw InvalidInput("SExtractor parameter " + c.name + "(" + std::to_string(n) + ") asks for " +
                               std::to_string(n) + " apertures; PHOT_APERTURES (or --aper) gives " +
                               std::to_string(in.apertures()));
        std::vector<std::vector<double>> v;
        for (int k = 1; k <= n; ++k)
            v.push_back(perAperture(in, k));
        std::vector<double> flat(in.n * static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < in.n; ++i)
            for (long k = 0; k < n; ++k)
                flat[i * static_cast<std::size_t>(n) + static_cast<std::size_t>(k)] = v[k][i];
        putValues(c, flat);
    };
}

std::string aper(const char* what, int k) {
    return std::string(what) + "_aper_" + std::to_string(k);
}

// Sky coordinates of catalog columns (1-based pixels) through the fitted WCS, else the header's.
Fill world(const char* xName, const char* yName, bool dec) {
    return [=](const Inputs& in, LdacColumn& c) {
        const Wcs* wcs = in.r.fittedWcs ? in.r.fittedWcs.get() : in.frame.wcs.get();
        std::vector<double> x = in.col(xName), y = in.col(yName), ra(in.n, kNan), de(in.n, kNan);
        for (std::size_t i = 0; i < in.n; ++i) {
            x[i] -= 1.0;
            y[i] -= 1.0;
        }
        if (wcs) wcs->pixelToWorld(x, y, ra, de);
        putValues(c, dec ? de : ra);
    };
}

// Position error ellipse from the independent x and y errors (gpuphot measures no covariance).
Fill errorEllipse(int which) {
    return [which](const Inputs& in, LdacColumn& c) {
        const std::vector<double> ex = in.col("x_err"), ey = in.col("y_err");
        std::vector<double> v(in.n);
        for (std::size_t i = 0; i < in.n; ++i) {
            if (which == 0)
                v[i] = std::max(ex[i], ey[i]);
            else if (which == 1)
                v[i] = std::min(ex[i], ey[i]);
            else
                v[i] = ex[i] >= ey[i] ? 0.0 : 90.0;
        }
        putValues(c, v);
    };
}

// SExtractor's APERT_PB (FLAGS 16) of its AUTO measurement: the box of the ellipse of 6 isophotal sigmas
// (KRON_NSIG) about the barycentre, rounded as SExtractor does, leaves the frame.
bool autoBoxLeavesFrame(double x, double y, double a, double b, double thetaDeg, int width, int height) {
    if (!std::isfinite(x) || !std::isfinite(y) || !std::isfinite(a) || !std::isfinite(b)) return false;
    constexpr double kKronNSigma = 6.0;
    const double t = thetaDeg * 3.14159265358979323846 / 180.0, c = std::cos(t), s = std::sin(t);
    const double dx = kKronNSigma * std::sqrt(a * a * c * c + b * b * s * s);
    const double dy = kKronNSigma * std::sqrt(a * a * s * s + b * b * c * c);
    return std::lround(x - dx) < 0 || std::lround(x + dx) + 1 > width || std::lround(y - dy) < 0 ||
           std::lround(y + dy) + 1 > height;
}

// SExtractor's CROWDED (FLAGS 1): more than 10 % of the pixels of the ellipse of 6 isophotal sigmas about
// the barycentre (in the frame) belong to other objects or are unusable.
bool crowdedAsSextractor(const Inputs& in, const Image<std::int32_t>& seg, std::int32_t own, double x,
                         double y, double a, double b, double thetaDeg) {
    if (!std::isfinite(x) || !std::isfinite(y) || !(a > 0.0) || !(b > 0.0)) return false;
    const double t = thetaDeg * 3.14159265358979323846 / 180.0, c = std::cos(t), s = std::sin(t);
    const double cxx = c * c / (a * a) + s * s / (b * b), cyy = s * s / (a * a) + c * c / (b * b);
    const double cxy = 2.0 * c * s * (1.0 / (a * a) - 1.0 / (b * b));
    const double dxl = 6.0 * std::sqrt(a * a * c * c + b * b * s * s),
                 dyl = 6.0 * std::sqrt(a * a * s * s + b * b * c * c);
    const int x0 = std::max(0, static_cast<int>(std::lround(x - dxl))),
              x1 = std::min(in.frame.width(), static_cast<int>(std::lround(x + dxl)) + 1);
    const int y0 = std::max(0, static_cast<int>(std::lround(y - dyl))),
              y1 = std::min(in.frame.height(), static_cast<int>(std::lround(y + dyl)) + 1);
    std::size_t area = 0, others = 0;
    for (int py = y0; py < y1; ++py)
        for (int px = x0; px < x1; ++px) {
            const double dx = px - x, dy = py - y;
            if (cxx * dx * dx + cyy * dy * dy + cxy * dx * dy > 36.0) continue;
            ++area;
            const std::int32_t id = seg.empty() ? 0 : seg(px, py);
            if ((id != 0 && id != own) || in.frame.mask(px, py) != 0 ||
                !std::isfinite(in.frame.pixels(px, py)))
                ++others;
        }
    return area > 0 && static_cast<float>(others) / static_cast<float>(area) > 0.1f;
}

// SExtractor's FLAGS: 1 its CROWDED rule (crowdedAsSextractor); 2, 4, 8, 16 gpuphot's bits 1..4, and 16
// also where an AUTO box or a window reaches the frame's edge (as SExtractor's APERT_PB); 64 gpuphot's
// deblend overflow.
std::vector<double> sextractorFlags(const Inputs& in) {
    const std::vector<double> f = in.col("flags"), x = in.col("x_iso"), y = in.col("y_iso"), a = in.col("a"),
                              b = in.col("b"), theta = in.col("theta"), id = in.col("id");
    const std::vector<SextractorWindow>& win = in.windows();
    const Image<std::int32_t>& seg = in.r.detection.segmentation.host();
    std::vector<double> out(in.n);
#pragma omp parallel for schedule(dynamic, 64)
    for (std::size_t i = 0; i < in.n; ++i) {
        const auto bits = static_cast<std::uint32_t>(std::isfinite(f[i]) ? f[i] : 0.0);
        const bool edge = win[i].truncated || autoBoxLeavesFrame(x[i] - 1.0, y[i] - 1.0, a[i], b[i], theta[i],
                                                                 in.frame.width(), in.frame.height());
        const bool crowded = crowdedAsSextractor(in, seg, static_cast<std::int32_t>(id[i]), x[i] - 1.0,
                                                 y[i] - 1.0, a[i], b[i], theta[i]);
        out[i] = (crowded ? 1u : 0u) | (bits & 30u) | ((bits & FlagDeblendOverflow) ? 64u : 0u) |
                 (edge ? 16u : 0u);
    }
    return out;
}

// Radii of the circles around the windowed centroid holding the fractions `fracs` of FLUX_AUTO (written
// to out[0..fracs.size()), NaN when FLUX_AUTO <= 0): one circular growth curve of the background-
// subtracted pixels, cut in 3 x 3 sub-pixels and binned by distance out to rmax.
void fluxRadius(const Inputs& in, double cx, double cy, double rmax, double total,
                const std::vector<double>& fracs, double* out) {
    if (!(total > 0) || !std::isfinite(cx) || !std::isfinite(cy)) {
        std::fill(out, out + fracs.size(), kNan);
        return;
    }
    constexpr int kBins = 200, kSub = 3;
    const double dr = rmax / kBins;
    std::vector<double> bin(kBins + 1, 0.0);
    const Frame& f = in.frame;
    const int x0 = std::max(0, static_cast<int>(std::floor(cx - rmax))),
              x1 = std::min(f.width() - 1, static_cast<int>(std::ceil(cx + rmax)));
    const int y0 = std::max(0, static_cast<int>(std::floor(cy - rmax))),
              y1 = std::min(f.height() - 1, static_cast<int>(std::ceil(cy + rmax)));
    for (int y = y0; y <= y1; ++y)
        for (int x = x0; x <= x1; ++x) {
            const double v = in.skySubtracted(x, y);
            if (!std::isfinite(v) || f.mask(x, y) != 0) continue;
            for (int sy = 0; sy < kSub; ++sy)
                for (int sx = 0; sx < kSub; ++sx) {
                    const double px = x - 0.5 + (sx + 0.5) / kSub - cx, py = y - 0.5 + (sy + 0.5) / kSub - cy;
                    const double d = std::hypot(px, py);
                    if (d < rmax) bin[static_cast<std::size_t>(d / dr)] += v / (kSub * kSub);
                }
        }
    for (std::size_t q = 0; q < fracs.size(); ++q) {
        const double want = fracs[q] * total;
        out[q] = rmax;
        double cum = 0.0;
        for (int k = 0; k < kBins; ++k) {
            const double b = bin[static_cast<std::size_t>(k)], next = cum + b;
            if (next >= want && b > 0) {
                out[q] = dr * (k + (want - cum) / b);
                break;
            }
            cum = next;
        }
    }
}

// FLUX_RADIUS(n): the first n PHOT_FLUXFRAC fractions, out to the Kron ellipse's major axis (3 px at least).
void fillFluxRadius(const Inputs& in, LdacColumn& c) {
    const long n = c.dims.empty() ? 1 : c.dims[0];
    if (n > static_cast<long>(in.o.fluxFrac.size()))
        throw InvalidInput("SExtractor parameter FLUX_RADIUS(" + std::to_string(n) + ") asks for " +
                           std::to_string(n) + " fractions; PHOT_FLUXFRAC gives " +
                           std::to_string(in.o.fluxFrac.size()));
    const std::vector<double> fracs(in.o.fluxFrac.begin(), in.o.fluxFrac.begin() + n);
    const std::vector<double> x = in.col("x"), y = in.col("y"), a = in.col("a"), kron = in.col("kron_radius"),
                              total = in.col("flux_auto");
    std::vector<double> flat(in.n * static_cast<std::size_t>(n));
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 64)
    for (std::size_t i = 0; i < in.n; ++i)
        errors.run([&] {
            double rmax = std::isfinite(kron[i]) && std::isfinite(a[i]) ? kron[i] * a[i] : kNan;
            if (!std::isfinite(rmax) || rmax < 3.0) rmax = 3.0;
            fluxRadius(in, x[i] - 1.0, y[i] - 1.0, rmax, total[i], fracs,
                       flat.data() + i * static_cast<std::size_t>(n));
        });
    errors.rethrow();
    putValues(c, flat);
}

// Each object's window from its isophotal barycentre, with FLUX_RADIUS(0.5) as the half-light radius; the
// pixels' variance is the background RMS map's (the global RMS with WEIGHT_TYPE NONE, a weight map's).
const std::vector<SextractorWindow>& Inputs::windows() const {
    if (windowsMade) return windowCache;
    const std::vector<double> xi = col("x_iso"), yi = col("y_iso"), x = col("x"), y = col("y"), a = col("a"),
                              kron = col("kron_radius"), total = col("flux_auto");
    windowCache.assign(n, SextractorWindow{kNan, kNan, kNan, kNan, kNan, kNan, kNan, false});
    const Image<std::int32_t>& seg = r.detection.segmentation.host();
    const bool blank = o.maskType != "NONE" && !seg.empty();
    // Object `own`'s pixels: masked, NaN and (unless MASK_TYPE NONE) other objects' are unusable.
    auto pixelOf = [this, &seg, blank](std::int32_t own) -> WindowPixel {
        return [this, &seg, blank, own](int px, int py, double& v, double& var) {
            v = skySubtracted(px, py);
            const double rms = r.background.rmsAt(px, py);
            var = rms * rms;
            const bool foreign = blank && seg(px, py) != 0 && seg(px, py) != own;
            return std::isfinite(v) && std::isfinite(var) && frame.mask(px, py) == 0 && !foreign;
        };
    };
    const std::vector<double> id = col("id");
    const bool mirror = o.maskType == "CORRECT";
    // SExtractor's GAIN 0 (no photon noise) where the header has no gain
    const double gain =
        frame.instrument.gainSource != "default" && frame.instrument.gain > 0.0 ? frame.instrument.gain : 0.0;
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 64)
    for (std::size_t i = 0; i < n; ++i)
        errors.run([&] {
            double rmax = std::isfinite(kron[i]) && std::isfinite(a[i]) ? kron[i] * a[i] : kNan;
            if (!std::isfinite(rmax) || rmax < 3.0) rmax = 3.0;
            double hl = kNan;
            fluxRadius(*this, x[i] - 1.0, y[i] - 1.0, rmax, total[i], {0.5}, &hl);
            if (!(hl > 0.0) || !std::isfinite(xi[i]) || !std::isfinite(yi[i])) return;
            const auto own = std::isfinite(id[i]) ? static_cast<std::int32_t>(id[i]) : 0;
            windowCache[i] = sextractorWindow(pixelOf(own), frame.width(), frame.height(), xi[i] - 1.0,
                                              yi[i] - 1.0, hl, gain, mirror);
        });
    errors.rethrow();
    windowsMade = true;
    return windowCache;
}

// One object's composite of the non-zero flag values `v` (SExtractor's getflags; AND over the non-zero
// values, where SExtractor's starts from 0 and so always gives 0) and how many pixels it rests on: all the
// non-zero ones (OR, AND), those equal to the result (MIN, MAX, MOST).
std::pair<std::uint32_t, std::int32_t> compositeFlag(std::vector<std::uint32_t>& v, const std::string& type) {
    if (v.empty()) return {0u, 0};
    const auto n = static_cast<std::int32_t>(v.size());
    if (type == "OR" || type == "AND") {
        std::uint32_t f = type == "OR" ? 0u : ~0u;
        for (const std::uint32_t x : v)
            f = type == "OR" ? (f | x) : (f & x);
        return {f, n};
    }
    std::sort(v.begin(), v.end());
    if (type == "MIN" || type == "MAX") {
        const std::uint32_t f = type == "MIN" ? v.front() : v.back();
        return {f, static_cast<std::int32_t>(std::count(v.begin(), v.end(), f))};
    }
    std::uint32_t best = v.front(); // MOST: the most frequent value (ties: the smallest)
    std::int32_t bestCount = 0;
    for (std::size_t i = 0; i < v.size();) {
        std::size_t j = i;
        while (j < v.size() && v[j] == v[i])
            ++j;
        if (static_cast<std::int32_t>(j - i) > bestCount) {
            best = v[i];
            bestCount = static_cast<std::int32_t>(j - i);
        }
        i = j;
    }
    return {best, bestCount};
}

// The flag image as unsigned integers, of the frame's size (else InvalidInput naming it).
Image<std::uint32_t> readFlagImage(const std::string& path, const Frame& frame) {
    const Frame f = readFrame(path);
    if (f.width() != frame.width() || f.height() != frame.height())
        throw InvalidInput("FLAG_IMAGE " + path + " is " + std::to_string(f.width()) + "x" +
                           std::to_string(f.height()) + " px, the frame " + std::to_string(frame.width()) +
                           "x" + std::to_string(frame.height()));
    Image<std::uint32_t> out(f.width(), f.height(), 0u);
    for (std::size_t i = 0; i < f.pixels.pixelCount(); ++i) {
        const float v = f.pixels.data()[i];
        out.data()[i] = std::isfinite(v) && v > 0.0f ? static_cast<std::uint32_t>(std::lround(v)) : 0u;
    }
    return out;
}

const std::vector<std::vector<std::pair<std::uint32_t, std::int32_t>>>& Inputs::imageFlags() const {
    if (flagsMade) return flagCache;
    const Image<std::int32_t>& seg = r.detection.segmentation.host();
    flagCache.assign(o.flagImages.size(), std::vector<std::pair<std::uint32_t, std::int32_t>>(n, {0u, 0}));
    for (std::size_t k = 0; k < o.flagImages.size(); ++k) {
        const Image<std::uint32_t> flags = readFlagImage(o.flagImages[k], frame);
        const std::string type = k < o.flagTypes.size() ? o.flagTypes[k] : "OR";
        std::vector<std::vector<std::uint32_t>> values(n);
        for (int y = 0; y < seg.height(); ++y)
            for (int x = 0; x < seg.width(); ++x) {
                const std::int32_t id = seg(x, y);
                if (id > 0 && static_cast<std::size_t>(id) <= n && flags(x, y) != 0u)
                    values[static_cast<std::size_t>(id - 1)].push_back(flags(x, y));
            }
        for (std::size_t i = 0; i < n; ++i)
            flagCache[k][i] = compositeFlag(values[i], type);
    }
    flagsMade = true;
    return flagCache;
}

// IMAFLAGS_ISO(n) / NIMAFLAGS_ISO(n): the first n flag images' composites, or their pixel counts.
Fill imageFlagColumn(bool count) {
    return [count](const Inputs& in, LdacColumn& c) {
        const long m = c.dims.empty() ? 1 : c.dims[0];
        if (m > static_cast<long>(in.o.flagImages.size()))
            throw InvalidInput("SExtractor parameter " + c.name + " asks for " + std::to_string(m) +
                               " flag images; FLAG_IMAGE gives " + std::to_string(in.o.flagImages.size()));
        const auto& f = in.imageFlags();
        std::vector<double> v(in.n * static_cast<std::size_t>(m));
        for (std::size_t i = 0; i < in.n; ++i)
            for (long k = 0; k < m; ++k)
                v[i * static_cast<std::size_t>(m) + static_cast<std::size_t>(k)] =
                    count ? f[k][i].second : static_cast<double>(f[k][i].first);
        putValues(c, v);
    };
}

// One value of every object's window (1-based positions), NaN where it could not be measured.
Fill windowed(std::function<double(const SextractorWindow&)> of) {
    return [of](const Inputs& in, LdacColumn& c) {
        std::vector<double> v;
        v.reserve(in.n);
        for (const SextractorWindow& w : in.windows())
            v.push_back(of(w));
        putValues(c, v);
    };
}

// Sky coordinates of the windowed positions.
Fill windowedWorld(bool dec) {
    return [dec](const Inputs& in, LdacColumn& c) {
        const Wcs* wcs = in.r.fittedWcs ? in.r.fittedWcs.get() : in.frame.wcs.get();
        std::vector<double> x, y, ra(in.n, kNan), de(in.n, kNan);
        for (const SextractorWindow& w : in.windows()) {
            x.push_back(w.x);
            y.push_back(w.y);
        }
        if (wcs) wcs->pixelToWorld(x, y, ra, de);
        putValues(c, dec ? de : ra);
    };
}

// FWHM_IMAGE: 2 sqrt(A / pi), A the area above half the highest pixel, measured on the bilinear
// interpolation of the background-subtracted pixels (4 x 4 samples per pixel) out to 3 A_IMAGE and
// counted only while it stays connected to the peak (a ring with no sample above half stops it).
double halfMaxFwhm(const Inputs& in, double cx, double cy, double peak, double rmax) {
    if (!(peak > 0) || !std::isfinite(cx) || !std::isfinite(cy)) return kNan;
    const Frame& f = in.frame;
    auto sub = [&](int x, int y) {
        x = std::clamp(x, 0, f.width() - 1);
        y = std::clamp(y, 0, f.height() - 1);
        const double v = in.skySubtracted(x, y);
        return std::isfinite(v) ? v : 0.0;
    };
    constexpr int kSub = 4;
    const int rings = static_cast<int>(std::ceil(rmax * kSub));
    std::vector<int> above(static_cast<std::size_t>(rings) + 1, 0);
    for (int j = -rings; j <= rings; ++j)
        for (int i = -rings; i <= rings; ++i) {
            const double px = cx + (i + 0.5) / kSub, py = cy + (j + 0.5) / kSub;
            const int ring = static_cast<int>(std::hypot(i + 0.5, j + 0.5));
            if (ring > rings) continue;
            const int x0 = static_cast<int>(std::floor(px)), y0 = static_cast<int>(std::floor(py));
            const double tx = px - x0, ty = py - y0;
            const double v = (1 - ty) * ((1 - tx) * sub(x0, y0) + tx * sub(x0 + 1, y0)) +
                             ty * ((1 - tx) * sub(x0, y0 + 1) + tx * sub(x0 + 1, y0 + 1));
            if (v >= 0.5 * peak) ++above[static_cast<std::size_t>(ring)];
        }
    double area = 0.0;
    for (int k = 0; k <= rings && above[static_cast<std::size_t>(k)] > 0; ++k)
        area += above[static_cast<std::size_t>(k)];
    area /= kSub * kSub;
    return 2.0 * std::sqrt(area / M_PI);
}

void fillFwhm(const Inputs& in, LdacColumn& c) {
    const std::vector<double> x = in.col("x"), y = in.col("y"), a = in.col("a"), peak = in.col("peak");
    std::vector<double> out(in.n);
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 64)
    for (std::size_t i = 0; i < in.n; ++i)
        errors.run([&] {
            out[i] = halfMaxFwhm(in, x[i] - 1.0, y[i] - 1.0, peak[i],
                                 std::max(3.0, 3.0 * (std::isfinite(a[i]) ? a[i] : 1.0)));
        });
    errors.rethrow();
    putValues(c, out);
}

// VIGNET(w,h): background-subtracted pixels around the pixel nearest the isophotal barycentre;
// off-frame, masked and NaN pixels are -1e30, as SExtractor writes them.
void fillVignet(const Inputs& in, LdacColumn& c) {
    const long w = c.dims[0], h = c.dims[1];
    const std::vector<double> x = in.col("x_iso"), y = in.col("y_iso");
    const Frame& f = in.frame;
    c.e.assign(in.n * static_cast<std::size_t>(w * h), kVignetBlank);
#pragma omp parallel for schedule(dynamic, 64)
    for (std::size_t i = 0; i < in.n; ++i) {
        if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
        const long cx = std::lround(x[i] - 1.0), cy = std::lround(y[i] - 1.0);
        float* out = c.e.data() + i * static_cast<std::size_t>(w * h);
        for (long v = 0; v < h; ++v)
            for (long u = 0; u < w; ++u) {
                const long px = cx - w / 2 + u, py = cy - h / 2 + v;
                if (px < 0 || py < 0 || px >= f.width() || py >= f.height()) continue;
                const int ix = static_cast<int>(px), iy = static_cast<int>(py);
                const float val = static_cast<float>(in.skySubtracted(ix, iy));
                if (std::isfinite(val) && f.mask(ix, iy) == 0) out[v * w + u] = val;
            }
    }
}

const std::map<std::string, Builder>& builders() {
    using S = Shape;
    static const std::map<std::string, Builder> b = [] {
        std::map<std::string, Builder> m;
        m["NUMBER"] = {'J', "", "Running object number", S::Scalar, copyOf("id")};
        m["X_IMAGE"] = {'D', "pixel", "Object position along x", S::Scalar, copyOf("x_iso")};
        m["Y_IMAGE"] = {'D', "pixel", "Object position along y", S::Scalar, copyOf("y_iso")};
        m["XWIN_IMAGE"] = {'D', "pixel", "Windowed position estimate along x", S::Scalar,
                           windowed([](const SextractorWindow& w) { return w.x + 1.0; })};
        m["YWIN_IMAGE"] = {'D', "pixel", "Windowed position estimate along y", S::Scalar,
                           windowed([](const SextractorWindow& w) { return w.y + 1.0; })};
        m["ERRAWIN_IMAGE"] = {'E', "pixel", "RMS windowed pos error along major axis", S::Scalar,
                              windowed([](const SextractorWindow& w) { return w.errA; })};
        m["ERRBWIN_IMAGE"] = {'E', "pixel", "RMS windowed pos error along minor axis", S::Scalar,
                              windowed([](const SextractorWindow& w) { return w.errB; })};
        m["ERRTHETAWIN_IMAGE"] = {'E', "deg", "Windowed error ellipse pos angle (CCW/x)", S::Scalar,
                                  windowed([](const SextractorWindow& w) { return w.errTheta; })};
        m["FLUX_WIN"] = {'E', "count", "Gaussian-weighted flux", S::Scalar,
                         windowed([](const SextractorWindow& w) { return w.flux; })};
        m["FLUXERR_WIN"] = {'E', "count", "RMS error for WIN flux", S::Scalar,
                            windowed([](const SextractorWindow& w) { return w.fluxErr; })};
        m["ERRA_IMAGE"] = {'E', "pixel", "RMS position error along major axis", S::Scalar, errorEllipse(0)};
        m["ERRB_IMAGE"] = {'E', "pixel", "RMS position error along minor axis", S::Scalar, errorEllipse(1)};
        m["ERRTHETA_IMAGE"] = {'E', "deg", "Error ellipse position angle (CCW/x)", S::Scalar,
                               errorEllipse(2)};
        m["ALPHA_J2000"] = {'D', "deg", "Right ascension of barycenter (J2000)", S::Scalar,
                            world("x_iso", "y_iso", false)};
        m["DELTA_J2000"] = {'D', "deg", "Declination of barycenter (J2000)", S::Scalar,
                            world("x_iso", "y_iso", true)};
        m["X_WORLD"] = {'D', "deg", "Barycenter position along world x axis", S::Scalar,
                        world("x_iso", "y_iso", false)};
        m["Y_WORLD"] = {'D', "deg", "Barycenter position along world y axis", S::Scalar,
                        world("x_iso", "y_iso", true)};
        m["ALPHAWIN_J2000"] = {'D', "deg", "Windowed right ascension (J2000)", S::Scalar,
                               windowedWorld(false)};
        m["DELTAWIN_J2000"] = {'D', "deg", "Windowed declination (J2000)", S::Scalar, windowedWorld(true)};
        m["FLUX_AUTO"] = {'E', "count", "Flux within a Kron-like elliptical aperture", S::Scalar,
                          copyOf("flux_auto")};
        m["FLUXERR_AUTO"] = {'E', "count", "RMS error for AUTO flux", S::Scalar, copyOf("fluxerr_auto")};
        m["MAG_AUTO"] = {'E', "mag", "Kron-like elliptical aperture magnitude", S::Scalar,
                         [](const Inputs& in, LdacColumn& c) {
                             putValues(c, magnitudes(in.col("flux_auto"), in.o.magZeropoint));
                         }};
        m["MAGERR_AUTO"] = {'E', "mag", "RMS error for AUTO magnitude", S::Scalar,
                            [](const Inputs& in, LdacColumn& c) {
                                putValues(c, magErrors(in.col("flux_auto"), in.col("fluxerr_auto")));
                            }};
        m["KRON_RADIUS"] = {'E', "", "Kron apertures in units of A or B", S::Scalar, copyOf("kron_radius")};
        m["FLUX_APER"] = {'E', "count", "Flux vector within fixed circular aperture(s)", S::Vector,
                          apertures([](const Inputs& in, int k) { return in.col(aper("flux", k)); })};
        m["FLUXERR_APER"] = {'E', "count", "RMS error vector for aperture flux(es)", S::Vector,
                             apertures([](const Inputs& in, int k) { return in.col(aper("fluxerr", k)); })};
        m["MAG_APER"] = {'E', "mag", "Fixed aperture magnitude vector", S::Vector,
                         apertures([](const Inputs& in, int k) {
                             return magnitudes(in.col(aper("flux", k)), in.o.magZeropoint);
                         })};
        m["MAGERR_APER"] = {'E', "mag", "RMS error vector for fixed aperture mag.", S::Vector,
                            apertures([](const Inputs& in, int k) {
                                return magErrors(in.col(aper("flux", k)), in.col(aper("fluxerr", k)));
                            })};
        m["FLUX_ISO"] = {'E', "count", "Isophotal flux", S::Scalar, copyOf("flux_iso")};
        m["ISOAREA_IMAGE"] = {'J', "pixel**2", "Isophotal area above Analysis threshold", S::Scalar,
                              copyOf("area_iso")};
        m["FLUX_MAX"] = {'E', "count", "Peak flux above background", S::Scalar, copyOf("peak")};
        m["FLUX_PSF"] = {'E', "count", "Flux from PSF-fitting", S::Scalar, copyOf("flux_psf")};
        m["FLUXERR_PSF"] = {'E', "count", "RMS flux error for PSF-fitting", S::Scalar, copyOf("fluxerr_psf")};
        m["MAG_PSF"] = {'E', "mag", "Magnitude from PSF-fitting", S::Scalar,
                        [](const Inputs& in, LdacColumn& c) {
                            putValues(c, magnitudes(in.col("flux_psf"), in.o.magZeropoint));
                        }};
        m["MAGERR_PSF"] = {'E', "mag", "RMS magnitude error from PSF-fitting", S::Scalar,
                           [](const Inputs& in, LdacColumn& c) {
                               putValues(c, magErrors(in.col("flux_psf"), in.col("fluxerr_psf")));
                           }};
        m["SNR_WIN"] = {'E', "", "Signal-to-noise ratio in a Gaussian window", S::Scalar,
                        windowed([](const SextractorWindow& w) {
                            return w.fluxErr > 0.0 ? w.flux / w.fluxErr : 1e30; // SExtractor's BIG
                        })};
        m["BACKGROUND"] = {
            'E', "count", "Background at centroid position", S::Scalar, [](const Inputs& in, LdacColumn& c) {
                const std::vector<double> x = in.col("x_iso"), y = in.col("y_iso");
                std::vector<double> v(in.n, kNan);
                for (std::size_t i = 0; i < in.n; ++i) {
                    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) continue;
                    const int ix =
                        std::clamp(static_cast<int>(std::lround(x[i] - 1)), 0, in.frame.width() - 1);
                    const int iy =
                        std::clamp(static_cast<int>(std::lround(y[i] - 1)), 0, in.frame.height() - 1);
                    v[i] = in.r.background.levelAt(ix, iy);
                }
                putValues(c, v);
            }};
        m["A_IMAGE"] = {'E', "pixel", "Profile RMS along major axis", S::Scalar, copyOf("a")};
        m["B_IMAGE"] = {'E', "pixel", "Profile RMS along minor axis", S::Scalar, copyOf("b")};
        m["THETA_IMAGE"] = {'E', "deg", "Position angle (CCW/x)", S::Scalar,
                            [](const Inputs& in, LdacColumn& c) {
                                std::vector<double> t = in.col("theta");
                                for (double& v : t)
                                    v = std::remainder(v, 180.0); // (-90, 90]
                                putValues(c, t);
                            }};
        m["ELONGATION"] = {'E', "", "A_IMAGE/B_IMAGE", S::Scalar, [](const Inputs& in, LdacColumn& c) {
                               const std::vector<double> a = in.col("a"), b = in.col("b");
                               std::vector<double> v(in.n);
                               for (std::size_t i = 0; i < in.n; ++i)
                                   v[i] = b[i] > 0 ? a[i] / b[i] : kNan;
                               putValues(c, v);
                           }};
        m["ELLIPTICITY"] = {'E', "", "1 - B_IMAGE/A_IMAGE", S::Scalar, [](const Inputs& in, LdacColumn& c) {
                                const std::vector<double> a = in.col("a"), b = in.col("b");
                                std::vector<double> v(in.n);
                                for (std::size_t i = 0; i < in.n; ++i)
                                    v[i] = a[i] > 0 ? 1.0 - b[i] / a[i] : kNan;
                                putValues(c, v);
                            }};
        m["FLUX_RADIUS"] = {'E', "pixel", "Fraction-of-light radii", S::Vector, fillFluxRadius};
        m["FWHM_IMAGE"] = {'E', "pixel", "FWHM assuming a gaussian core", S::Scalar, fillFwhm};
        m["FLAGS"] = {'I', "", "Extraction flags", S::Scalar,
                      [](const Inputs& in, LdacColumn& c) { putValues(c, sextractorFlags(in)); }};
        m["VIGNET"] = {'E', "count", "Pixel data around detection", S::Image, fillVignet};
        m["IMAFLAGS_ISO"] = {'J', "", "FLAG-image flags OR'ed over the iso. profile", S::Vector,
                             imageFlagColumn(false)};
        m["NIMAFLAGS_ISO"] = {'J', "", "Number of flagged pixels entering IMAFLAGS_ISO", S::Vector,
                              imageFlagColumn(true)};
        return m;
    }();
    return b;
}

const std::map<std::string, std::string>& refusedParams() {
    static const std::map<std::string, std::string> r{
        {"CLASS_STAR", "gpuphot has no star/galaxy classifier (SExtractor's neural network)"},
    };
    return r;
}

// The extraction keywords SExtractor adds to LDAC_IMHEAD, as far as gpuphot has their values: PSFEx reads
// SEXBKDEV (the background RMS), SCAMP FITSFILE; the others describe the run.
void addExtractionCards(Header& h, const Frame& frame, const PipelineResult& r) {
    if (!frame.path.empty()) h.set("FITSFILE", frame.path, "File name of the analysed image");
    h.set("FITSEXT", frame.hdu, "FITS Extension number");
    h.set("SEXVERS", "gpuphot " GPUPHOT_VERSION, "Extraction software");
    h.set("SEXBKGND", r.background.globalLevel, "Median background level (ADU)");
    h.set("SEXBKDEV", r.background.globalRms, "Median background RMS (ADU)");
    h.set("SEXNFIN", static_cast<long long>(r.detection.sources.size()), "Final number of extracted sources");
    // SExtractor's GAIN 0 where the header gives none (gpuphot's own errors then take a gain of 1)
    h.set("SEXGAIN", frame.instrument.gainSource == "default" ? 0.0 : frame.instrument.gain,
          "Gain used (e-/ADU)");
    if (std::isfinite(frame.instrument.saturation))
        h.set("SEXSATLV", frame.instrument.saturation, "Saturation level used for flagging (ADU)");
    for (std::size_t k = 0; k < r.aperture.radii.size(); ++k)
        h.set("SEXAPED" + std::to_string(k + 1), 2.0 * r.aperture.radii[k],
              "Fixed photometric aperture (pixels)");
}

// Image header for LDAC_IMHEAD: the frame's cards under a primary image's structural cards, its WCS
// replaced by the verified fitted one when there is one.
Header imageHeader(const Frame& frame, const PipelineResult& r) {
    static const char* structural[] = {"SIMPLE",  "XTENSION", "BITPIX", "NAXIS",  "NAXIS1", "NAXIS2",
                                       "NAXIS3",  "EXTEND",   "PCOUNT", "GCOUNT", "END",    "CHECKSUM",
                                       "DATASUM", "EXTNAME",  "BSCALE", "BZERO",  "BLANK"};
    Header h;
    h.set("SIMPLE", true, "conforms to FITS standard");
    h.set("BITPIX", frame.bitpix, "bits per data value");
    h.set("NAXIS", 2, "number of data axes");
    h.set("NAXIS1", frame.width(), "length of data axis 1");
    h.set("NAXIS2", frame.height(), "length of data axis 2");
    for (const HeaderCard& c : frame.header.cards()) {
        if (std::any_of(std::begin(structural), std::end(structural),
                        [&](const char* s) { return c.key == s; }))
            continue;
        if (c.key.rfind("ZNAXIS", 0) == 0 || c.key.rfind("ZTILE", 0) == 0) continue;
        if (r.fittedWcs && isPrimaryWcsKeyword(c.key)) continue;
        if (c.key == "COMMENT")
            h.addComment(c.comment);
        else if (c.key == "HISTORY")
            h.addHistory(c.comment);
        else
            h.setRaw(c.key, c.value, c.comment);
    }
    if (r.fittedWcs) h.update(r.fittedWcs->toHeader());
    addExtractionCards(h, frame, r);
    return h;
}

std::string asciiValue(const LdacColumn& c, std::size_t k) {
    char buf[64];
    if (c.type == 'D')
        std::snprintf(buf, sizeof buf, "%.10g", c.d[k]);
    else if (c.type == 'E')
        std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(c.e[k]));
    else if (c.type == 'J')
        std::snprintf(buf, sizeof buf, "%d", c.j[k]);
    else
        std::snprintf(buf, sizeof buf, "%d", static_cast<int>(c.i[k]));
    return buf;
}

// ASCII_HEAD: "#   n NAME  comment  [unit]" per parameter (a vector's elements numbered n, n+1, ...,
// named once), then one line per object; ASCII: the lines only.
std::string asciiCatalog(const std::vector<LdacColumn>& cols, std::size_t rows, bool head) {
    std::string s;
    if (head) {
        long index = 1;
        char buf[256];
        for (const LdacColumn& c : cols) {
            std::snprintf(buf, sizeof buf, "# %3ld %-22s %-58s%s%s%s\n", index, c.name.c_str(),
                          c.comment.c_str(), c.unit.empty() ? "" : " [", c.unit.c_str(),
                          c.unit.empty() ? "" : "]");
            s += buf;
            index += c.repeat();
        }
    }
    for (std::size_t i = 0; i < rows; ++i) {
        std::string line;
        for (const LdacColumn& c : cols) {
            const std::size_t rep = static_cast<std::size_t>(c.repeat());
            for (std::size_t k = 0; k < rep; ++k)
                line += (line.empty() ? "" : " ") + asciiValue(c, i * rep + k);
        }
        s += line + "\n";
    }
    return s;
}

} // namespace

std::string SextractorParam::text() const {
    std::string s = name;
    for (std::size_t k = 0; k < dims.size(); ++k)
        s += (k ? "," : "(") + std::to_string(dims[k]);
    return dims.empty() ? s : s + ")";
}

std::vector<SextractorParam> parseSextractorParams(const std::string& text, const std::string& origin) {
    std::vector<SextractorParam> out;
    std::istringstream in(text);
    std::string line;
    for (int lineNo = 1; std::getline(in, line); ++lineNo) {
        if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
        line = trimmed(line);
        if (line.empty()) continue;
        auto bad = [&](const std::string& why) {
            return InvalidInput(origin + ":" + std::to_string(lineNo) + ": '" + line + "': " + why);
        };
        SextractorParam p;
        const auto open = line.find('(');
        p.name = trimmed(line.substr(0, open));
        if (!isUpperCaseName(p.name))
            throw bad("a parameter is an upper-case name, optionally with (n) or (w,h)");
        if (open != std::string::npos) {
            const auto close = line.find(')', open);
            if (close == std::string::npos || !trimView(line.substr(close + 1)).empty())
                throw bad("unbalanced parentheses");
            std::stringstream sizes(line.substr(open + 1, close - open - 1));
            for (std::string part; std::getline(sizes, part, ',');) {
                char* end = nullptr;
                const std::string t = trimmed(part);
                const long v = std::strtol(t.c_str(), &end, 10);
                if (t.empty() || *end != '\0' || v <= 0 || v > 4096) throw bad("sizes are positive integers");
                p.dims.push_back(v);
            }
            if (p.dims.empty() || p.dims.size() > 2) throw bad("one or two sizes in parentheses");
        }
        out.push_back(std::move(p));
    }
    return out;
}

std::vector<SextractorParam> readSextractorParams(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw InvalidInput("cannot read SExtractor parameter file " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return parseSextractorParams(ss.str(), path);
}

const std::vector<std::string>& supportedSextractorParams() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const auto& [k, b] : builders())
            v.push_back(k);
        return v;
    }();
    return names;
}

void checkSextractorCatalog(const SextractorCatalogOptions& o) {
    std::string problems;
    auto add = [&](const std::string& p) { problems += "\n  " + p; };
    if (o.type != "FITS_LDAC" && o.type != "ASCII_HEAD" && o.type != "ASCII")
        add("CATALOG_TYPE " + o.type + ": gpuphot writes FITS_LDAC, ASCII_HEAD and ASCII");
    if (o.name.empty() || o.name.find('/') != std::string::npos)
        add("CATALOG_NAME '" + o.name + "': a file name (the catalog goes into -o's directory)");
    for (const SextractorParam& p : o.params) {
        const auto b = builders().find(p.name);
        if (b == builders().end()) {
            const auto r = refusedParams().find(p.name);
            add(p.text() + ": " +
                (r != refusedParams().end() ? r->second : std::string("not available in gpuphot")));
            continue;
        }
        const Shape s = b->second.shape;
        if (s == Shape::Scalar && !p.dims.empty()) add(p.text() + ": takes no size");
        if (s == Shape::Vector && p.dims.size() > 1) add(p.text() + ": takes one size");
        if (s == Shape::Image && p.dims.size() != 2) add(p.text() + ": needs a size (w,h)");
        if ((p.name == "IMAFLAGS_ISO" || p.name == "NIMAFLAGS_ISO") && o.flagImages.empty())
            add(p.text() + ": needs FLAG_IMAGE");
    }
    for (const std::string& t : o.flagTypes)
        if (t != "OR" && t != "AND" && t != "MIN" && t != "MAX" && t != "MOST")
            add("FLAG_TYPE " + t + ": OR, AND, MIN, MAX or MOST");
    if (!problems.empty()) throw InvalidInput("SExtractor catalog cannot be written as asked:" + problems);
}

std::vector<LdacColumn> sextractorColumns(const Frame& frame, const PipelineResult& r, const Table& catalog,
                                          const SextractorCatalogOptions& o) {
    checkSextractorCatalog(o);
    const Inputs in{frame, r, catalog, o, catalog.rows(), {}, false, {}, false}; // the caches empty
    std::vector<LdacColumn> cols;
    for (const SextractorParam& p : o.params) {
        const Builder& b = builders().at(p.name);
        LdacColumn c;
        c.name = p.name;
        c.unit = b.unit;
        c.comment = b.comment;
        c.type = b.type;
        c.dims = p.dims;
        if (b.shape == Shape::Vector && c.dims.size() == 1 && c.dims[0] == 1) c.dims.clear();
        b.fill(in, c);
        cols.push_back(std::move(c));
    }
    return cols;
}

void writeSextractorCatalog(const std::string& path, const Frame& frame, const PipelineResult& r,
                            const Table& catalog, const SextractorCatalogOptions& o) {
    const std::vector<LdacColumn> cols = sextractorColumns(frame, r, catalog, o);
    if (o.type == "FITS_LDAC")
        writeFitsLdac(path, imageHeader(frame, r), cols, catalog.rows());
    else
        writeTextFileAtomic(path, asciiCatalog(cols, catalog.rows(), o.type == "ASCII_HEAD"));
}

LdacPart sextractorPart(const Frame& frame, const PipelineResult& r, const Table& catalog,
                        const SextractorCatalogOptions& o) {
    return {imageHeader(frame, r), sextractorColumns(frame, r, catalog, o), catalog.rows()};
}

void writeSextractorCatalog(const std::string& path, const std::vector<LdacPart>& parts,
                            const SextractorCatalogOptions& o) {
    if (o.type == "FITS_LDAC") return writeFitsLdac(path, parts);
    if (parts.empty()) return writeTextFileAtomic(path, "");
    std::vector<LdacColumn> cols = parts.front().columns;
    std::size_t rows = parts.front().rows;
    for (std::size_t k = 1; k < parts.size(); ++k) {
        const LdacPart& p = parts[k];
        if (p.columns.size() != cols.size())
            throw InvalidInput(path + ": the images' catalog columns differ");
        for (std::size_t c = 0; c < cols.size(); ++c) {
            const LdacColumn& from = p.columns[c];
            cols[c].d.insert(cols[c].d.end(), from.d.begin(), from.d.end());
            cols[c].e.insert(cols[c].e.end(), from.e.begin(), from.e.end());
            cols[c].j.insert(cols[c].j.end(), from.j.begin(), from.j.end());
            cols[c].i.insert(cols[c].i.end(), from.i.begin(), from.i.end());
        }
        rows += p.rows;
    }
    writeTextFileAtomic(path, asciiCatalog(cols, rows, o.type == "ASCII_HEAD"));
}

} // namespace gpuphot
