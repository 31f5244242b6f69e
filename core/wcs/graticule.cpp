// makeGraticule: sample the region's sky extent, pick round steps, trace each line densely through the WCS
// and keep the pieces inside the region (graticule.hpp).
#include "core/wcs/graticule.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "core/wcs/wcs.hpp"

namespace gpuphot {
namespace {

constexpr int kGrid = 17;     // samples per side of the region when finding its extent
constexpr int kSamples = 256; // points along each line

double wrap180(double d) {
    d = std::fmod(d + 180.0, 360.0);
    return (d < 0 ? d + 360.0 : d) - 180.0;
}

// The smallest step of `steps` (ascending, deg) that puts at most `lines` lines across `span`.
double roundStep(double span, int lines, const std::vector<double>& steps) {
    for (double s : steps)
        if (span / s <= lines) return s;
    return steps.back();
}

std::vector<double> raSteps() { // seconds, minutes and hours of time, in deg
    std::vector<double> out;
    for (double s : {0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0})
        out.push_back(s * 15.0 / 3600.0);
    for (double m : {1.0, 2.0, 5.0, 10.0, 15.0, 30.0})
        out.push_back(m * 15.0 / 60.0);
    for (double h : {1.0, 2.0, 3.0, 4.0, 6.0})
        out.push_back(h * 15.0);
    return out;
}

std::vector<double> decSteps() { // arcseconds, arcminutes and degrees, in deg
    std::vector<double> out;
    for (double s : {1.0, 2.0, 5.0, 10.0, 15.0, 30.0})
        out.push_back(s / 3600.0);
    for (double m : {1.0, 2.0, 5.0, 10.0, 15.0, 30.0})
        out.push_back(m / 60.0);
    for (double d : {1.0, 2.0, 5.0, 10.0, 15.0, 30.0})
        out.push_back(d);
    return out;
}

// The sky extent of the region: RA relative to its centre (unwrapped, deg), Dec; a pole inside the
// region makes every RA present.
struct Extent {
    double ra0 = NAN, raLo = NAN, raHi = NAN, decLo = NAN, decHi = NAN;
};

Extent extentOf(const Wcs& wcs, const GraticuleRegion& r) {
    std::vector<double> x, y;
    for (int j = 0; j < kGrid; ++j)
        for (int i = 0; i < kGrid; ++i) {
            x.push_back(r.x0 + (r.x1 - r.x0) * i / (kGrid - 1));
            y.push_back(r.y0 + (r.y1 - r.y0) * j / (kGrid - 1));
        }
    std::vector<double> ra(x.size()), dec(x.size());
    wcs.pixelToWorld(x, y, ra, dec);
    Extent e;
    const auto [cra, cdec] = wcs.pixelToWorld(0.5 * (r.x0 + r.x1), 0.5 * (r.y0 + r.y1));
    if (!std::isfinite(cra) || !std::isfinite(cdec)) return e;
    e.ra0 = cra;
    e.raLo = e.decLo = INFINITY;
    e.raHi = e.decHi = -INFINITY;
    for (std::size_t k = 0; k < ra.size(); ++k) {
        if (!std::isfinite(ra[k]) || !std::isfinite(dec[k])) continue;
        const double d = wrap180(ra[k] - cra);
        e.raLo = std::min(e.raLo, d);
        e.raHi = std::max(e.raHi, d);
        e.decLo = std::min(e.decLo, dec[k]);
        e.decHi = std::max(e.decHi, dec[k]);
    }
    for (double pole : {90.0, -90.0}) {
        const auto [px, py] = wcs.worldToPixel(0.0, pole);
        if (px >= r.x0 && px <= r.x1 && py >= r.y0 && py <= r.y1) {
            e.raLo = -180.0;
            e.raHi = 180.0;
            (pole > 0 ? e.decHi : e.decLo) = pole;
        }
    }
    return e;
}

bool inside(const GraticuleRegion& r, double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && x >= r.x0 && x <= r.x1 && y >= r.y0 && y <= r.y1;
}

// One line traced through `n` sky points: the pieces inside the region, and the label's place.
void trace(const Wcs& wcs, const GraticuleRegion& r, const std::vector<double>& ra,
           const std::vector<double>& dec, GraticuleLine& line) {
    std::vector<double> x(ra.size()), y(ra.size());
    wcs.worldToPixel(ra, dec, x, y);
    const double jump = 0.5 * std::max(r.x1 - r.x0, r.y1 - r.y0); // a projection's seam, not a line
    std::vector<double>* piece = nullptr;
    for (std::size_t k = 0; k < x.size(); ++k) {
        if (!inside(r, x[k], y[k])) {
            piece = nullptr;
            continue;
        }
        if (piece && std::hypot(x[k] - piece->end()[-2], y[k] - piece->end()[-1]) > jump) piece = nullptr;
        if (!piece) piece = &line.pieces.emplace_back();
        piece->push_back(x[k]);
        piece->push_back(y[k]);
    }
    std::erase_if(line.pieces, [](const std::vector<double>& p) { return p.size() < 4; });
    if (line.pieces.empty()) return;
    // The label at the piece end nearest the bottom edge (meridians) or the left edge (parallels).
    double best = INFINITY;
    for (const auto& p : line.pieces)
        for (std::size_t at : {std::size_t{0}, p.size() - 2}) {
            const double d = line.meridian ? p[at + 1] - r.y0 : p[at] - r.x0;
            if (d < best) {
                best = d;
                line.labelX = p[at];
                line.labelY = p[at + 1];
            }
        }
}

// Sexagesimal with the fields the step needs: unit ("h" or "d"), minutes and seconds marks.
std::string sexagesimal(double v, double stepInUnits, const char* unit, const char* minute,
                        const char* second, bool sign) {
    const char* s = v < 0 ? "-" : (sign ? "+" : "");
    v = std::fabs(v);
    const double stepSec = stepInUnits * 3600.0;
    const int decimals = stepSec < 0.999 ? 1 : 0;
    const double scale = decimals ? 10.0 : 1.0;
    long long t = std::llround(v * 3600.0 * scale); // in tenths or whole seconds
    const long long perUnit = static_cast<long long>(3600 * scale),
                    perMin = static_cast<long long>(60 * scale);
    const long long units = t / perUnit;
    t -= units * perUnit;
    const long long mins = t / perMin;
    t -= mins * perMin;
    char buf[64];
    if (stepSec >= 3599.0)
        std::snprintf(buf, sizeof buf, "%s%lld%s", s, units, unit);
    else if (stepSec >= 59.0)
        std::snprintf(buf, sizeof buf, "%s%lld%s%02lld%s", s, units, unit, mins, minute);
    else if (!decimals)
        std::snprintf(buf, sizeof buf, "%s%lld%s%02lld%s%02lld%s", s, units, unit, mins, minute, t, second);
    else
        std::snprintf(buf, sizeof buf, "%s%lld%s%02lld%s%04.1f%s", s, units, unit, mins, minute, t / scale,
                      second);
    return buf;
}

} // namespace

std::string raLabel(double raDeg, double stepDeg) {
    double ra = std::fmod(raDeg, 360.0);
    if (ra < 0) ra += 360.0;
    return sexagesimal(ra / 15.0, stepDeg / 15.0, "h", "m", "s", false);
}

std::string decLabel(double decDeg, double stepDeg) {
    return sexagesimal(decDeg, stepDeg, "d", "'", "\"", true);
}

Graticule makeGraticule(const Wcs& wcs, const GraticuleRegion& region, int lines) {
    Graticule g;
    lines = std::max(lines, 1);
    const Extent e = extentOf(wcs, region);
    if (!std::isfinite(e.raLo) || !std::isfinite(e.decLo)) return g;
    g.raStep = roundStep(std::max(e.raHi - e.raLo, 1e-9), lines, raSteps());
    g.decStep = roundStep(std::max(e.decHi - e.decLo, 1e-9), lines, decSteps());
    // Meridians: from decLo to decHi (a little beyond, so that they reach the edges).
    const double decPad = 0.05 * (e.decHi - e.decLo);
    const double dLo = std::max(-90.0, e.decLo - decPad), dHi = std::min(90.0, e.decHi + decPad);
    const double raLo = e.ra0 + e.raLo, raHi = e.ra0 + e.raHi;
    for (double k = std::ceil(raLo / g.raStep); k * g.raStep <= raHi + 1e-12; k += 1.0) {
        GraticuleLine line;
        line.meridian = true;
        line.value = std::fmod(k * g.raStep + 720.0, 360.0);
        line.label = raLabel(line.value, g.raStep);
        std::vector<double> ra(kSamples, line.value), dec(kSamples);
        for (int i = 0; i < kSamples; ++i)
            dec[i] = dLo + (dHi - dLo) * i / (kSamples - 1);
        trace(wcs, region, ra, dec, line);
        if (!line.pieces.empty()) g.lines.push_back(std::move(line));
        if (g.lines.size() > static_cast<std::size_t>(4 * lines)) break;
    }
    // Parallels: across the RA extent (a little beyond).
    const double raPad = 0.05 * (e.raHi - e.raLo);
    for (double k = std::ceil(e.decLo / g.decStep); k * g.decStep <= e.decHi + 1e-12; k += 1.0) {
        GraticuleLine line;
        line.value = std::clamp(k * g.decStep, -90.0, 90.0);
        line.label = decLabel(line.value, g.decStep);
        std::vector<double> ra(kSamples), dec(kSamples, line.value);
        for (int i = 0; i < kSamples; ++i)
            ra[i] = raLo - raPad + (raHi - raLo + 2 * raPad) * i / (kSamples - 1);
        trace(wcs, region, ra, dec, line);
        if (!line.pieces.empty()) g.lines.push_back(std::move(line));
    }
    return g;
}

} // namespace gpuphot
