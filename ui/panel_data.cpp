#include "ui/panel_data.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/model/flags.hpp"
#include "core/model/header.hpp"
#include "core/stages/aperture/aperture_overlap.hpp"
#include "core/wcs/wcs.hpp"
#include "ui/snapshot.hpp"

namespace gpuphot::ui {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kMagErrToSnr = 1.0857362047581294; // 2.5 / ln 10

std::string format(const char* fmt, double a) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, a);
    return buf;
}

void finiteRange(MapData& m) {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (double v : m.values)
        if (std::isfinite(v)) {
            lo = std::min(lo, v);
            hi = std::max(hi, v);
        }
    if (lo > hi) lo = hi = 0.0;
    m.minValue = lo;
    m.maxValue = hi;
}

} // namespace

// ---- zero point ------------------------------------------------------------------------------------

ZeroPointPlotData zeroPointPlotData(const Snapshot& s) {
    ZeroPointPlotData d;
    const PipelineResult& r = s.result;
    const ZeroPointResult& z = r.zeropoint;
    if (!s.reference) {
        d.why = "no reference catalog";
        return d;
    }
    if (!r.calibrationRan) {
        d.why = r.calibrationProblem.empty() ? std::string("calibration did not run")
                                             : "calibration did not run: " + r.calibrationProblem;
        return d;
    }
    if (z.nCandidates == 0 || z.sourceIndex.empty()) {
        d.why = "no calibrators" + (z.message.empty() ? std::string() : ": " + z.message);
        return d;
    }
    const ReferenceCatalog& ref = *s.reference;
    d.fitOk = z.ok;
    d.zp = z.zp;
    d.zpErr = z.zpErr;
    d.colourTerm = z.colourTermFitted ? z.colourTerm : 0.0;
    d.colourTermFitted = z.colourTermFitted;
    d.scatter = z.scatter;
    const std::size_t nSrc = r.magInst.size();
    for (std::size_t k = 0; k < z.sourceIndex.size(); ++k) {
        const int i = z.sourceIndex[k];
        if (i < 0 || static_cast<std::size_t>(i) >= nSrc ||
            static_cast<std::size_t>(i) >= r.crossmatch.refIndex.size())
            continue;
        const int ri = r.crossmatch.refIndex[i];
        if (ri < 0 || static_cast<std::size_t>(ri) >= ref.size()) continue;
        const double colour = ri < static_cast<int>(ref.color.size()) ? ref.color[ri] : kNaN;
        const double raw = ref.mag[ri] - r.magInst[i];
        const bool used = z.ok && k < z.used.size() && z.used[k];
        ZeroPointPoints& p = used ? d.used : d.clipped;
        p.sourceIndex.push_back(i);
        p.refMag.push_back(ref.mag[ri]);
        p.colour.push_back(colour);
        p.offsetRaw.push_back(raw);
        p.offset.push_back(d.colourTermFitted ? raw - d.colourTerm * colour : raw);
        p.residual.push_back(k < z.residual.size() ? z.residual[k] : kNaN);
        if (std::isfinite(colour)) d.hasColour = true;
    }
    d.available = d.used.size() + d.clipped.size() > 0;
    if (!d.available) {
        d.why = "no calibrators";
        return d;
    }
    char buf[256];
    if (z.ok) {
        if (z.colourTermFitted)
            std::snprintf(buf, sizeof buf,
                          "zp %.4f ± %.4f, colour term %.4f ± %.4f, %d of %d used, scatter %.3f", z.zp,
                          z.zpErr, z.colourTerm, z.colourTermErr, z.nUsed, z.nCandidates, z.scatter);
        else
            std::snprintf(buf, sizeof buf, "zp %.4f ± %.4f, %d of %d used, scatter %.3f", z.zp, z.zpErr,
                          z.nUsed, z.nCandidates, z.scatter);
        d.summary = buf;
    } else {
        d.summary = "zero point failed: " + z.message;
    }
    return d;
}

// ---- astrometry ------------------------------------------------------------------------------------

AstrometryPlotData astrometryPlotData(const Snapshot& s) {
    AstrometryPlotData d;
    const PipelineResult& r = s.result;
    const AstrometryResult& a = r.astrometry;
    if (s.frame) {
        d.width = s.frame->width();
        d.height = s.frame->height();
    }
    if (!s.reference) {
        d.why = "no reference catalog";
        return d;
    }
    if (!s.config.fitAstrometry) {
        d.why = "astrometry did not run (switched off)";
        return d;
    }
    if (!a.ok) {
        d.why = a.message.empty() ? std::string("astrometry did not run") : "astrometry failed: " + a.message;
        return d;
    }
    const ReferenceCatalog& ref = *s.reference;
    const Sources& src = r.detection.sources;
    for (std::size_t k = 0; k < a.sourceIndex.size(); ++k) {
        const int i = a.sourceIndex[k];
        const int ri = k < a.refIndex.size() ? a.refIndex[k] : -1;
        if (i < 0 || static_cast<std::size_t>(i) >= src.size() || ri < 0 ||
            static_cast<std::size_t>(ri) >= ref.size())
            continue;
        double rx = kNaN, ry = kNaN;
        if (!a.wcs.worldToPixel(ref.ra[ri], ref.dec[ri], rx, ry)) rx = ry = kNaN;
        const bool used = k < a.used.size() && a.used[k];
        AstrometryPoints& p = used ? d.used : d.clipped;
        p.sourceIndex.push_back(i);
        p.x.push_back(src.x[i]);
        p.y.push_back(src.y[i]);
        p.dRa.push_back(k < a.dxArcsec.size() ? a.dxArcsec[k] : kNaN);
        p.dDec.push_back(k < a.dyArcsec.size() ? a.dyArcsec[k] : kNaN);
        p.dxPx.push_back(src.x[i] - rx);
        p.dyPx.push_back(src.y[i] - ry);
    }
    d.rmsArcsec = a.rmsArcsec;
    d.rmsPx = a.rmsPx;
    d.nUsed = a.nUsed;
    d.nMatched = a.nMatched;
    d.sipOrder = a.sipOrder;
    d.method = a.method;
    d.available = d.used.size() + d.clipped.size() > 0;
    if (!d.available) {
        d.why = "astrometry kept no matches";
        return d;
    }
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s, SIP order %d, rms %.3f\" (%.3f px), %d of %d matches used",
                  a.method.c_str(), a.sipOrder, a.rmsArcsec, a.rmsPx, a.nUsed, a.nMatched);
    d.summary = buf;
    return d;
}

double autoVectorExaggeration(const AstrometryPlotData& d, double fraction) {
    double s2 = 0.0;
    std::size_t n = 0;
    for (const AstrometryPoints* p : {&d.used, &d.clipped})
        for (std::size_t k = 0; k < p->size(); ++k)
            if (std::isfinite(p->dxPx[k]) && std::isfinite(p->dyPx[k])) {
                s2 += p->dxPx[k] * p->dxPx[k] + p->dyPx[k] * p->dyPx[k];
                ++n;
            }
    const double rms = n ? std::sqrt(s2 / static_cast<double>(n)) : 0.0;
    const double side = std::max(d.width, d.height);
    if (!(rms > 0.0) || !(side > 0.0)) return 1.0;
    // a round number: 1, 2, 5 x 10^k
    const double raw = fraction * side / rms;
    const double p10 = std::pow(10.0, std::floor(std::log10(raw)));
    const double m = raw / p10;
    return (m < 2.0 ? 1.0 : m < 5.0 ? 2.0 : 5.0) * p10;
}

// ---- S/N -------------------------------------------------------------------------------------------

SnrPlotData snrPlotData(const Snapshot& s) {
    SnrPlotData d;
    const PipelineResult& r = s.result;
    if (r.magInst.empty() || r.magInst.size() != r.magInstErr.size()) {
        d.why = r.detection.sources.size() == 0 ? "no sources" : "photometry did not run";
        return d;
    }
    const ZeroPointResult& z = r.zeropoint;
    double offset = 0.0;
    d.calibrated = z.ok && std::isfinite(z.zp);
    if (d.calibrated) {
        // the limiting magnitude is calibrated with zp + ct * (median calibrator colour): use the same
        offset = (std::isfinite(z.limitingMag) && std::isfinite(z.limitingMagInst))
                     ? z.limitingMag - z.limitingMagInst
                     : z.zp;
        d.limitingMag = z.limitingMag;
    } else {
        // as the zero-point stage estimates it: sources with none of its excluded flags
        const Sources& src = r.detection.sources;
        std::vector<double> m = r.magInst, e = r.magInstErr;
        if (src.size() == m.size())
            for (std::size_t i = 0; i < m.size(); ++i) {
                const std::uint32_t f =
                    src.flags[i] | (r.aperture.flags.size() == m.size() ? r.aperture.flags[i] : 0u);
                if (f & s.config.zeropoint.excludeFlags) m[i] = e[i] = kNaN;
            }
        d.limitingMag = limitingMagnitudeInst(m, e);
    }
    for (std::size_t i = 0; i < r.magInst.size(); ++i) {
        const double m = r.magInst[i], e = r.magInstErr[i];
        if (!std::isfinite(m) || !(e > 0.0) || !std::isfinite(e)) continue;
        d.sourceIndex.push_back(static_cast<int>(i));
        d.mag.push_back(m + offset);
        d.snr.push_back(kMagErrToSnr / e);
    }
    d.available = !d.mag.empty();
    if (!d.available) {
        d.why = "no source with a measured magnitude";
        return d;
    }
    d.summary =
        std::to_string(d.mag.size()) + " sources, " + (d.calibrated ? "calibrated" : "instrumental") +
        " magnitudes; limiting magnitude (S/N 5) " +
        (std::isfinite(d.limitingMag) ? format("%.2f", d.limitingMag) : std::string("not determinable"));
    return d;
}

// ---- maps ------------------------------------------------------------------------------------------

MapData backgroundMap(const BackgroundResult& bkg, int maxCells) {
    MapData m;
    const Image<float>& level = bkg.level;
    const bool full = level.width() > 0 && level.height() > 0;
    // Without full maps (the CPU backend's lean result) the sampler gives the same pixels, bit for bit.
    const BackgroundSampler* sampler = full ? nullptr : bkg.sampler.get();
    if (full || (sampler && sampler->width() > 0 && sampler->height() > 0)) {
        const int w = full ? level.width() : sampler->width(), h = full ? level.height() : sampler->height();
        const int block = std::max(1, (std::max(w, h) + maxCells - 1) / std::max(1, maxCells));
        m.nx = (w + block - 1) / block;
        m.ny = (h + block - 1) / block;
        // The level map is a smooth spline through the meshes: sampling it at the block centres is as good
        // as averaging and costs O(cells), not O(pixels), on the UI thread (151 MP frames).
        m.values.assign(static_cast<std::size_t>(m.nx) * m.ny, kNaN);
        for (int j = 0; j < m.ny; ++j)
            for (int i = 0; i < m.nx; ++i) {
                const int x = std::min(w - 1, i * block + block / 2),
                          y = std::min(h - 1, j * block + block / 2);
                m.values[static_cast<std::size_t>(j) * m.nx + i] = full ? level(x, y) : sampler->levelAt(x, y);
            }
        m.dx = m.dy = block;
        m.x0 = m.y0 =
            block / 2; // cell (i, j) is the pixel (x0 + i block, y0 + j block) (clamped to the frame)
    } else if (bkg.meshLevel.width() > 0 && bkg.meshLevel.height() > 0) {
        m.nx = bkg.meshLevel.width();
        m.ny = bkg.meshLevel.height();
        m.values.resize(static_cast<std::size_t>(m.nx) * m.ny);
        for (int j = 0; j < m.ny; ++j)
            for (int i = 0; i < m.nx; ++i)
                m.values[static_cast<std::size_t>(j) * m.nx + i] = bkg.meshLevel(i, j);
        m.dx = bkg.meshWidth;
        m.dy = bkg.meshHeight;
        m.x0 = 0.5 * bkg.meshWidth - 0.5;
        m.y0 = 0.5 * bkg.meshHeight - 0.5;
    } else {
        return m;
    }
    finiteRange(m);
    return m;
}

MapData psfFieldMap(const PsfResult& psf, PsfMapKind kind, int nx, int ny) {
    MapData m;
    if (!psf.hasModel() || psf.width <= 0 || psf.height <= 0 || nx < 1 || ny < 1) return m;
    m.nx = nx;
    m.ny = ny;
    m.dx = static_cast<double>(psf.width) / nx;
    m.dy = static_cast<double>(psf.height) / ny;
    m.x0 = 0.5 * m.dx - 0.5;
    m.y0 = 0.5 * m.dy - 0.5;
    m.values.resize(static_cast<std::size_t>(nx) * ny);
    for (int j = 0; j < ny; ++j)
        for (int i = 0; i < nx; ++i) {
            const double x = m.xCentre(i), y = m.yCentre(j);
            m.values[static_cast<std::size_t>(j) * nx + i] =
                kind == PsfMapKind::Fwhm ? psf.fwhmAt(x, y) : psf.ellipticityAt(x, y);
        }
    finiteRange(m);
    return m;
}

// ---- PSF panel -------------------------------------------------------------------------------------

int nearestEpsfCell(const PsfResult& psf, double x, double y) {
    int best = -1;
    double bestD = std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < psf.epsf.size(); ++c) {
        const EpsfCell& cell = psf.epsf[c];
        if (cell.image.width() == 0) continue;
        const double d = std::hypot(cell.cx - x, cell.cy - y);
        if (d < bestD) {
            bestD = d;
            best = static_cast<int>(c);
        }
    }
    return best;
}

RadialProfile epsfRadialProfile(const PsfResult& psf, int cellIndex, double x, double y) {
    RadialProfile p;
    if (cellIndex < 0 || static_cast<std::size_t>(cellIndex) >= psf.epsf.size()) return p;
    const EpsfCell& cell = psf.epsf[cellIndex];
    const int os = std::max(1, cell.oversampling);
    for (int j = 0; j < cell.image.height(); ++j)
        for (int i = 0; i < cell.image.width(); ++i) {
            p.r.push_back(std::hypot(i - cell.centreX, j - cell.centreY) / os);
            p.value.push_back(cell.image(i, j));
        }
    if (!psf.hasModel()) return p;
    p.fwhm = psf.fwhmAt(x, y);
    p.ellipticity = psf.ellipticityAt(x, y);
    p.beta = psf.model == PsfModelKind::Moffat ? psf.medianBeta : 0.0;
    if (!(p.fwhm > 0.0)) return p;
    ProfileParams model;
    model.beta = p.beta > 0.0 ? p.beta : 3.0;
    setProfileShape(model, psf.model, p.fwhm, 0.0, 0.0);
    model.amplitude = 1.0;
    const double total = profileFlux(model, psf.model);
    if (!(total > 0.0)) return p;
    model.amplitude = 1.0 / total;
    const double rMax = std::max(1.0, cell.image.width() / (2.0 * os));
    for (double r = 0.0; r <= rMax + 1e-9; r += 0.05) {
        p.modelR.push_back(r);
        p.modelValue.push_back(profileValue(model, psf.model, r, 0.0, 3));
    }
    return p;
}

// ---- source inspector ------------------------------------------------------------------------------

Stamp extractStamp(const Frame& frame, double x, double y, int halfSize) {
    Stamp s;
    halfSize = std::max(0, halfSize);
    const int cx = static_cast<int>(std::lround(std::isfinite(x) ? x : 0.0));
    const int cy = static_cast<int>(std::lround(std::isfinite(y) ? y : 0.0));
    s.x0 = cx - halfSize;
    s.y0 = cy - halfSize;
    s.width = s.height = 2 * halfSize + 1;
    s.values.assign(static_cast<std::size_t>(s.width) * s.height, std::numeric_limits<float>::quiet_NaN());
    s.masked.assign(s.values.size(), 1);
    const bool haveMask = frame.mask.width() == frame.width() && frame.mask.height() == frame.height();
    for (int j = 0; j < s.height; ++j)
        for (int i = 0; i < s.width; ++i) {
            const int fx = s.x0 + i, fy = s.y0 + j;
            if (fx < 0 || fy < 0 || fx >= frame.width() || fy >= frame.height()) continue;
            const std::size_t k = static_cast<std::size_t>(j) * s.width + i;
            s.values[k] = frame.pixels(fx, fy);
            s.masked[k] = haveMask ? frame.mask(fx, fy) : 0;
        }
    return s;
}

std::vector<std::uint8_t> asinhStretch(const std::vector<float>& values, double lo, double hi,
                                       double softening) {
    std::vector<std::uint8_t> out(values.size(), 0);
    if (!(softening > 0.0)) softening = 1.0;
    const double top = std::asinh((hi - lo) / softening);
    if (!(top > 0.0)) return out;
    for (std::size_t k = 0; k < values.size(); ++k) {
        const double v = values[k];
        if (!std::isfinite(v)) continue;
        const double t = std::asinh((std::clamp(v, lo, hi) - lo) / softening) / top;
        out[k] = static_cast<std::uint8_t>(std::lround(std::clamp(t, 0.0, 1.0) * 255.0));
    }
    return out;
}

CurveOfGrowth catalogCurveOfGrowth(const PipelineResult& r, int index) {
    CurveOfGrowth c;
    const ApertureResult& ap = r.aperture;
    if (index < 0 || static_cast<std::size_t>(index) >= ap.count) return c;
    for (std::size_t k = 0; k < ap.radii.size() && k < ap.flux.size(); ++k) {
        c.radius.push_back(ap.radii[k]);
        c.flux.push_back(ap.flux[k][index]);
    }
    return c;
}

CurveOfGrowth fineCurveOfGrowth(const Frame& frame, double x, double y, double sky, double rMax,
                                double step) {
    CurveOfGrowth c;
    if (!(step > 0.0) || !(rMax > 0.0) || !std::isfinite(x) || !std::isfinite(y) || !std::isfinite(sky))
        return c;
    const bool haveMask = frame.mask.width() == frame.width() && frame.mask.height() == frame.height();
    const int xa = std::max(0, static_cast<int>(std::floor(x - rMax - 1))),
              xb = std::min(frame.width() - 1, static_cast<int>(std::ceil(x + rMax + 1)));
    const int ya = std::max(0, static_cast<int>(std::floor(y - rMax - 1))),
              yb = std::min(frame.height() - 1, static_cast<int>(std::ceil(y + rMax + 1)));
    const int n = static_cast<int>(std::floor(rMax / step + 1e-9));
    for (int k = 1; k <= n; ++k) {
        const double r = k * step;
        double sum = 0.0;
        for (int py = ya; py <= yb; ++py)
            for (int px = xa; px <= xb; ++px) {
                const float v = frame.pixels(px, py);
                if (!std::isfinite(v)) continue;
                if (haveMask && (frame.mask(px, py) & ~static_cast<std::uint8_t>(MaskSaturated)) != 0)
                    continue;
                const double w = circlePixelOverlap(x, y, r, px, py);
                if (w > 0.0) sum += w * (static_cast<double>(v) - sky);
            }
        c.radius.push_back(r);
        c.flux.push_back(sum);
    }
    return c;
}

std::vector<std::string> flagNames(std::uint32_t flags) {
    static const char* const names[] = {
        "crowded",          "blended",         "saturated",      "edge",       "aperture_incomplete",
        "bad_pixels",       "aperture_masked", "psf_fit_failed", "sky_failed", "kron_failed",
        "deblend_overflow", "psf_star",        "calibrator",     "astrom_star"};
    std::vector<std::string> out;
    for (int b = 0; b < 32; ++b)
        if (flags & (1u << b))
            out.push_back(b < static_cast<int>(std::size(names)) ? std::string(names[b])
                                                                 : "bit " + std::to_string(b));
    return out;
}

std::string flagsText(std::uint32_t flags) {
    std::string t = std::to_string(flags) + " = ";
    const auto names = flagNames(flags);
    if (names.empty()) return t + "none";
    for (std::size_t k = 0; k < names.size(); ++k)
        t += (k ? " | " : "") + names[k];
    return t;
}

namespace {

std::uint32_t catalogFlags(const PipelineResult& r, std::size_t i) {
    const Sources& s = r.detection.sources;
    std::uint32_t f = s.flags[i];
    if (r.aperture.flags.size() == s.size()) f |= r.aperture.flags[i];
    if (r.psf.flags.size() == s.size()) f |= r.psf.flags[i];
    const auto& a = r.astrometry;
    for (std::size_t k = 0; k < a.sourceIndex.size(); ++k)
        if (a.sourceIndex[k] == static_cast<int>(i) && k < a.used.size() && a.used[k]) f |= FlagAstromStar;
    const auto& z = r.zeropoint;
    for (std::size_t k = 0; k < z.sourceIndex.size(); ++k)
        if (z.sourceIndex[k] == static_cast<int>(i) && k < z.used.size() && z.used[k]) f |= FlagCalibrator;
    return f;
}

std::string fluxText(double f, double e) {
    if (!std::isfinite(f)) return "—";
    char buf[96];
    if (std::isfinite(e))
        std::snprintf(buf, sizeof buf, "%.1f ± %.1f ADU", f, e);
    else
        std::snprintf(buf, sizeof buf, "%.1f ADU", f);
    return buf;
}

std::string magText(double f, double e, double offset = 0.0) {
    if (!(f > 0.0) || !std::isfinite(f)) return "—";
    char buf[96];
    const double m = -2.5 * std::log10(f) + offset;
    if (std::isfinite(e) && e >= 0.0)
        std::snprintf(buf, sizeof buf, "%.4f ± %.4f", m, kMagErrToSnr * e / f);
    else
        std::snprintf(buf, sizeof buf, "%.4f", m);
    return buf;
}

double at(const std::vector<double>& v, std::size_t i) {
    return i < v.size() ? v[i] : kNaN;
}

} // namespace

std::vector<DetailRow> sourceDetails(const Snapshot& s, int index) {
    std::vector<DetailRow> rows;
    const PipelineResult& r = s.result;
    const Sources& src = r.detection.sources;
    if (index < 0 || static_cast<std::size_t>(index) >= src.size()) return rows;
    const std::size_t i = static_cast<std::size_t>(index);
    char buf[160];
    auto add = [&](std::string label, std::string value) {
        rows.push_back({std::move(label), std::move(value)});
    };
    add("id", std::to_string(index + 1));
    std::snprintf(buf, sizeof buf, "%.3f, %.3f", src.x[i] + 1.0, src.y[i] + 1.0);
    add("x, y (1-based)", buf);
    const Wcs* wcs =
        r.fittedWcs ? r.fittedWcs.get() : (s.frame && s.frame->wcs ? s.frame->wcs.get() : nullptr);
    if (wcs) {
        try {
            const auto [ra, dec] = wcs->pixelToWorld(src.x[i], src.y[i]);
            std::snprintf(buf, sizeof buf, "%.6f, %+.6f", ra, dec);
            add("RA, Dec (deg)", buf);
        } catch (const std::exception&) {
        }
    }
    std::snprintf(buf, sizeof buf, "a %.2f, b %.2f px, θ %.1f°", src.a[i], src.b[i], src.theta[i]);
    add("shape", buf);
    if (r.psf.fwhm.size() == src.size() && std::isfinite(r.psf.fwhm[i])) {
        std::snprintf(buf, sizeof buf, "%.2f px, e %.3f", r.psf.fwhm[i], at(r.psf.ellipticity, i));
        add("PSF FWHM (model)", buf);
    }
    add("flux_iso", fluxText(src.fluxIso[i], at(src.fluxIsoErr, i)));
    add("peak", fluxText(src.peak[i], kNaN));
    const ApertureResult& ap = r.aperture;
    if (ap.count == src.size()) {
        for (std::size_t k = 0; k < ap.radii.size(); ++k) {
            std::snprintf(buf, sizeof buf, "aperture r = %.2f px", ap.radii[k]);
            add(buf, fluxText(ap.flux[k][i], ap.fluxErr[k][i]) + "; mag " +
                         magText(ap.flux[k][i], ap.fluxErr[k][i]));
        }
        add("flux_auto", fluxText(at(ap.fluxAuto, i), at(ap.fluxAutoErr, i)) + "; mag " +
                             magText(at(ap.fluxAuto, i), at(ap.fluxAutoErr, i)));
        std::snprintf(buf, sizeof buf, "flux_opt (r = %.2f px)", at(ap.radiusOpt, i));
        add(buf, fluxText(at(ap.fluxOpt, i), at(ap.fluxOptErr, i)));
        std::snprintf(buf, sizeof buf, "%.2f ± %.2f ADU/px", at(ap.sky, i), at(ap.skyRms, i));
        add("local sky", buf);
    }
    if (r.psf.fluxPsf.size() == src.size())
        add("flux_psf", fluxText(r.psf.fluxPsf[i], at(r.psf.fluxPsfErr, i)));
    const double mi = at(r.magInst, i), me = at(r.magInstErr, i);
    if (std::isfinite(mi)) {
        std::snprintf(buf, sizeof buf, "%.4f ± %.4f (S/N %.1f)", mi, me, me > 0 ? kMagErrToSnr / me : kNaN);
        add("mag_inst (flux_opt)", buf);
        if (r.zeropoint.ok) {
            double ct = 0.0;
            if (r.zeropoint.colourTermFitted && s.reference && i < r.crossmatch.refIndex.size() &&
                r.crossmatch.refIndex[i] >= 0) {
                const double c = at(s.reference->color, static_cast<std::size_t>(r.crossmatch.refIndex[i]));
                ct = std::isfinite(c) ? r.zeropoint.colourTerm * c : 0.0;
            }
            std::snprintf(buf, sizeof buf, "%.4f ± %.4f", mi + r.zeropoint.zp + ct,
                          std::hypot(me, r.zeropoint.zpErr));
            add("mag_cal", buf);
        }
    }
    if (s.reference && i < r.crossmatch.refIndex.size() && r.crossmatch.refIndex[i] >= 0) {
        const std::size_t ri = static_cast<std::size_t>(r.crossmatch.refIndex[i]);
        std::snprintf(buf, sizeof buf, "id %lld, mag %.3f, sep %.2f\"",
                      static_cast<long long>(ri < s.reference->id.size() ? s.reference->id[ri] : -1),
                      at(s.reference->mag, ri), at(r.crossmatch.separationArcsec, i));
        add("reference", buf);
    }
    add("flags", flagsText(catalogFlags(r, i)));
    return rows;
}

// ---- header view -----------------------------------------------------------------------------------

bool headerCardMatches(const HeaderCard& card, const std::string& filter) {
    if (filter.empty()) return true;
    auto lower = [](std::string t) {
        for (char& c : t)
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return t;
    };
    const std::string f = lower(filter);
    return lower(card.key).find(f) != std::string::npos || lower(card.value).find(f) != std::string::npos ||
           lower(card.comment).find(f) != std::string::npos;
}

} // namespace gpuphot::ui
