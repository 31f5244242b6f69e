// The simulator's geometry: the true TAN-SIP WCS, the (possibly wrong) header WCS, the PSF and sky
// as functions of position, and small time/position helpers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "core/sim/sim_random.hpp"
#include "core/sim/simulator.hpp"

namespace gpuphot {
namespace {
constexpr double kDeg = std::numbers::pi / 180.0;

// Normalised field coordinates: -1 at the left/bottom edge, +1 at the right/top edge; r2 = 1 at corners.
struct FieldPos {
    double xn, yn, r2;
};
FieldPos fieldPos(const SimParams& p, double x, double y) {
    const double hx = 0.5 * p.width, hy = 0.5 * p.height;
    FieldPos f;
    f.xn = (x - (p.width - 1) * 0.5) / hx;
    f.yn = (y - (p.height - 1) * 0.5) / hy;
    f.r2 = 0.5 * (f.xn * f.xn + f.yn * f.yn);
    return f;
}
} // namespace

SimPsf simPsfAt(const SimParams& p, double x, double y) {
    const FieldPos f = fieldPos(p, x, y);
    SimPsf s;
    s.fwhm = p.fwhm * (1.0 + (p.fwhmCornerFactor - 1.0) * f.r2) * (1.0 + p.fwhmGradientX * f.xn + p.fwhmGradientY * f.yn);
    s.ellipticity = p.ellipticity + (p.ellipticityCorner - p.ellipticity) * f.r2;
    if (p.psfAngleRadial) {
        const double dx = x - (p.width - 1) * 0.5, dy = y - (p.height - 1) * 0.5;
        s.angle = (dx == 0.0 && dy == 0.0) ? p.psfAngle : std::atan2(dy, dx) / kDeg;
    } else {
        s.angle = p.psfAngle;
    }
    return s;
}

double simSkyAt(const SimParams& p, double x, double y) {
    const FieldPos f = fieldPos(p, x, y);
    return p.sky + 0.5 * p.skyGradientX * f.xn + 0.5 * p.skyGradientY * f.yn + p.skyCorner * f.r2;
}

TanSip makeTrueWcs(const SimParams& p) {
    TanSip w;
    w.crpix[0] = 0.5 * (p.width + 1) + p.offsetX; // the field centre, 1-based (the frame's unless jittered)
    w.crpix[1] = 0.5 * (p.height + 1) + p.offsetY;
    w.crval[0] = p.ra;
    w.crval[1] = p.dec;
    // +y points to position angle `rotation` (east of north); +x to PA rotation - 90 (east left) or + 90.
    const double s = p.pixelScale / 3600.0, c = std::cos(p.rotation * kDeg), n = std::sin(p.rotation * kDeg);
    const double parity = p.flipParity ? 1.0 : -1.0;
    w.cd[0][0] = parity * s * c;
    w.cd[1][0] = -parity * s * n;
    w.cd[0][1] = s * n;
    w.cd[1][1] = s * c;
    if (p.sipOrder < 2 || p.sipStrength <= 0.0) return w;

    // Random low-order terms plus, at order 3, a radial (pincushion) term; scaled so that the largest
    // displacement on the frame's border equals sipStrength px.
    w.setSipOrder(p.sipOrder);
    sim::SimRng rng(fieldSeedOf(p), 11);
    const double hx = 0.5 * p.width, hy = 0.5 * p.height, l = std::hypot(hx, hy);
    for (int i = 0; i <= 2; ++i) {
        w.coeffA(i, 2 - i) = rng.normal() / (l * l);
        w.coeffB(i, 2 - i) = rng.normal() / (l * l);
    }
    if (p.sipOrder >= 3) {
        const double k = 1.5 / (l * l * l);
        for (int i = 0; i <= 3; ++i) {
            w.coeffA(i, 3 - i) = 0.3 * rng.normal() / (l * l * l);
            w.coeffB(i, 3 - i) = 0.3 * rng.normal() / (l * l * l);
        }
        w.coeffA(3, 0) += k; // u (u^2 + v^2)
        w.coeffA(1, 2) += k;
        w.coeffB(2, 1) += k; // v (u^2 + v^2)
        w.coeffB(0, 3) += k;
    }
    double maxShift = 0.0;
    for (int i = 0; i <= 16; ++i) { // sample the border
        const double t = -1.0 + i / 8.0;
        const double pts[4][2] = {{t * hx, -hy}, {t * hx, hy}, {-hx, t * hy}, {hx, t * hy}};
        for (const auto& pt : pts) {
            double du, dv;
            w.distort(pt[0], pt[1], du, dv);
            maxShift = std::max(maxShift, std::hypot(du, dv));
        }
    }
    if (maxShift > 0.0) {
        for (double& v : w.a) v *= p.sipStrength / maxShift;
        for (double& v : w.b) v *= p.sipStrength / maxShift;
    }
    return w;
}

TanSip makeHeaderWcs(const SimParams& p, const TanSip& truth) {
    TanSip h = truth;
    if (p.wcsOffset != 0.0) offsetPosition(truth.crval[0], truth.crval[1], p.wcsOffset, p.wcsOffsetAngle, h.crval[0], h.crval[1]);
    // Rotating the sky direction of every pixel axis by +phi (towards east) and scaling it.
    const double phi = p.wcsRotation * kDeg, f = 1.0 + p.wcsScaleError;
    const double m[2][2] = {{std::cos(phi), std::sin(phi)}, {-std::sin(phi), std::cos(phi)}};
    for (int j = 0; j < 2; ++j) {
        const double c0 = truth.cd[0][j], c1 = truth.cd[1][j];
        h.cd[0][j] = f * (m[0][0] * c0 + m[0][1] * c1);
        h.cd[1][j] = f * (m[1][0] * c0 + m[1][1] * c1);
    }
    if (!p.headerSip) {
        h.sipOrder = 0;
        h.sipInvOrder = 0;
        h.a.clear();
        h.b.clear();
        h.ap.clear();
        h.bp.clear();
    }
    return h;
}

void offsetPosition(double ra, double dec, double distArcmin, double paDeg, double& raOut, double& decOut) {
    const double d = distArcmin / 60.0 * kDeg, pa = paDeg * kDeg, d0 = dec * kDeg;
    const double sd = std::sin(d0) * std::cos(d) + std::cos(d0) * std::sin(d) * std::cos(pa);
    const double dec2 = std::asin(std::clamp(sd, -1.0, 1.0));
    const double dra = std::atan2(std::sin(pa) * std::sin(d) * std::cos(d0), std::cos(d) - std::sin(d0) * sd);
    double r = std::fmod(ra + dra / kDeg, 360.0);
    if (r < 0.0) r += 360.0;
    raOut = r;
    decOut = dec2 / kDeg;
}

std::string mjdToIso(double mjd) {
    using namespace std::chrono;
    const double dayFloor = std::floor(mjd);
    long long ms = std::llround((mjd - dayFloor) * 86400000.0);
    long long day = static_cast<long long>(dayFloor);
    if (ms >= 86400000LL) {
        ms -= 86400000LL;
        ++day;
    }
    const year_month_day ymd{sys_days{days{day - 40587}}}; // MJD 40587 = 1970-01-01
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02lld:%02lld:%06.3f", static_cast<int>(ymd.year()),
                  static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()), ms / 3600000,
                  (ms / 60000) % 60, (ms % 60000) / 1000.0);
    return buf;
}

} // namespace gpuphot
