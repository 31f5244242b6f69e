#include "core/wcs/tan_sip.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>

#include "core/model/header.hpp"

namespace gpuphot {
namespace {
constexpr double kDeg = std::numbers::pi / 180.0;

// Calls term(k, up, vq) for SIP's monomials u^p v^q (p + q <= order) in the order p, then q: k the
// coefficient's index p * (order + 1) + q, up = u^p and vq = v^q as the running products make them. Every
// sum below adds c[k] * up * vq in this order, so one polynomial or two at once give the same bits.
template <class Term> void forEachMonomial(int order, double u, double v, Term&& term) {
    double up = 1.0;
    for (int p = 0; p <= order; ++p) {
        double vq = 1.0;
        for (int q = 0; q + p <= order; ++q) {
            term(p * (order + 1) + q, up, vq);
            vq *= v;
        }
        up *= u;
    }
}

double evalPoly(const std::vector<double>& c, int order, double u, double v) {
    if (order <= 0 || c.empty()) return 0.0;
    double sum = 0.0;
    forEachMonomial(order, u, v, [&](int k, double up, double vq) { sum += c[k] * up * vq; });
    return sum;
}

// evalPoly(a, ...) and evalPoly(b, ...) in one pass over the monomials (the same bits as the two calls).
void evalPolyPair(const std::vector<double>& a, const std::vector<double>& b, int order, double u, double v,
                  double& sa, double& sb) {
    double suma = 0.0, sumb = 0.0; // locals: sa and sb may alias the coefficients
    const double* ca = a.data();
    const double* cb = b.data();
    forEachMonomial(order, u, v, [&](int k, double up, double vq) {
        suma += ca[k] * up * vq;
        sumb += cb[k] * up * vq;
    });
    sa = suma;
    sb = sumb;
}
} // namespace

bool tanProjectSinCos(double ra0, double sinDec0, double cosDec0, double ra, double sinDec, double cosDec,
                      double& xi, double& eta) {
    const double dra = (ra - ra0) * kDeg, cosDra = std::cos(dra);
    const double cosc = sinDec0 * sinDec + cosDec0 * cosDec * cosDra;
    if (cosc <= 0.0) return false;
    xi = cosDec * std::sin(dra) / cosc / kDeg;
    eta = (cosDec0 * sinDec - sinDec0 * cosDec * cosDra) / cosc / kDeg;
    return true;
}

void sinCosDeg(double deg, double& s, double& c) {
    const double r = deg * kDeg;
    s = std::sin(r);
    c = std::cos(r);
}

bool tanProject(double ra0, double dec0, double ra, double dec, double& xi, double& eta) {
    double s0 = 0, c0 = 0, s = 0, c = 0;
    sinCosDeg(dec0, s0, c0);
    sinCosDeg(dec, s, c);
    return tanProjectSinCos(ra0, s0, c0, ra, s, c, xi, eta);
}

void tanDeproject(double ra0, double dec0, double xi, double eta, double& ra, double& dec) {
    const double x = xi * kDeg, y = eta * kDeg, d0 = dec0 * kDeg;
    const double denom = std::cos(d0) - y * std::sin(d0);
    double a = std::atan2(x, denom) / kDeg + ra0;
    a = std::fmod(a, 360.0);
    if (a < 0) a += 360.0;
    ra = a;
    dec = std::atan2(std::sin(d0) + y * std::cos(d0), std::sqrt(x * x + denom * denom)) / kDeg;
}

double angularSeparationDeg(double ra1, double dec1, double ra2, double dec2) {
    const double d1 = dec1 * kDeg, d2 = dec2 * kDeg;
    const double sdd = std::sin((d2 - d1) / 2), sdr = std::sin((ra2 - ra1) * kDeg / 2);
    const double h = sdd * sdd + std::cos(d1) * std::cos(d2) * sdr * sdr;
    return 2.0 * std::asin(std::min(1.0, std::sqrt(h))) / kDeg;
}

void TanSip::setSipOrder(int order) {
    sipOrder = order;
    const int n = order > 0 ? (order + 1) * (order + 1) : 0;
    a.assign(n, 0.0);
    b.assign(n, 0.0);
}

void TanSip::distort(double u, double v, double& du, double& dv) const {
    if (sipOrder > 0 && !a.empty() && !b.empty()) {
        evalPolyPair(a, b, sipOrder, u, v, du, dv);
        return;
    }
    du = evalPoly(a, sipOrder, u, v);
    dv = evalPoly(b, sipOrder, u, v);
}

void TanSip::pixelToWorld(double x, double y, double& ra, double& dec) const {
    const double u = x + 1.0 - crpix[0], v = y + 1.0 - crpix[1];
    double du = 0, dv = 0;
    distort(u, v, du, dv);
    const double uu = u + du, vv = v + dv;
    const double xi = cd[0][0] * uu + cd[0][1] * vv;
    const double eta = cd[1][0] * uu + cd[1][1] * vv;
    tanDeproject(crval[0], crval[1], xi, eta, ra, dec);
}

bool TanSip::worldToPixel(double ra, double dec, double& x, double& y) const {
    double xi = 0, eta = 0;
    if (!tanProject(crval[0], crval[1], ra, dec, xi, eta)) return false;
    standardToPixel(xi, eta, x, y);
    return true;
}

void TanSip::standardToPixel(double xi, double eta, double& x, double& y) const {
    const double det = cd[0][0] * cd[1][1] - cd[0][1] * cd[1][0];
    const double U = (cd[1][1] * xi - cd[0][1] * eta) / det;
    const double V = (-cd[1][0] * xi + cd[0][0] * eta) / det;
    double u = U, v = V;
    if (sipInvOrder > 0) {
        double du = 0.0, dv = 0.0;
        if (!ap.empty() && !bp.empty()) {
            evalPolyPair(ap, bp, sipInvOrder, U, V, du, dv);
        } else {
            du = evalPoly(ap, sipInvOrder, U, V);
            dv = evalPoly(bp, sipInvOrder, U, V);
        }
        u = U + du;
        v = V + dv;
    }
    if (sipOrder > 0) {
        // Newton iterations on u + A(u,v) = U, v + B(u,v) = V (numerical Jacobian).
        for (int it = 0; it < 50; ++it) {
            double du, dv;
            distort(u, v, du, dv);
            const double fu = u + du - U, fv = v + dv - V;
            if (std::fabs(fu) < 1e-12 && std::fabs(fv) < 1e-12) break;
            const double h = 1e-4;
            double du1, dv1, du2, dv2;
            distort(u + h, v, du1, dv1);
            distort(u, v + h, du2, dv2);
            const double j00 = 1 + (du1 - du) / h, j10 = (dv1 - dv) / h;
            const double j01 = (du2 - du) / h, j11 = 1 + (dv2 - dv) / h;
            const double jd = j00 * j11 - j01 * j10;
            u -= (j11 * fu - j01 * fv) / jd;
            v -= (-j10 * fu + j00 * fv) / jd;
        }
    }
    x = u + crpix[0] - 1.0;
    y = v + crpix[1] - 1.0;
}

std::optional<TanSip> tanSipFromHeaderExact(const Header& h) {
    const auto t1 = h.getString("CTYPE1"), t2 = h.getString("CTYPE2");
    if (!t1 || !t2) return std::nullopt;
    const bool sip = *t1 == "RA---TAN-SIP" && *t2 == "DEC--TAN-SIP";
    if (!sip && !(*t1 == "RA---TAN" && *t2 == "DEC--TAN")) return std::nullopt;
    for (const char* k : {"CUNIT1", "CUNIT2"})
        if (const auto u = h.getString(k); u && !u->empty() && *u != "deg") return std::nullopt;
    if (const auto lp = h.getDouble("LONPOLE"); lp && *lp != 180.0) return std::nullopt;
    for (const HeaderCard& c : h.cards()) {
        const std::string& k = c.key;
        // PVi_m / PSi_m (projection parameters), distortion tables and polynomials other than SIP.
        if ((k.size() > 2 && (k[0] == 'P') && (k[1] == 'V' || k[1] == 'S') && std::isdigit(k[2])) ||
            k.rfind("CPDIS", 0) == 0 || k.rfind("CQDIS", 0) == 0 || k.rfind("DP", 0) == 0 ||
            k.rfind("DQ", 0) == 0 || k.rfind("CTYPE3", 0) == 0 || (k == "WCSAXES" && c.value != "2"))
            return std::nullopt;
    }
    TanSip w;
    const auto c1 = h.getDouble("CRPIX1"), c2 = h.getDouble("CRPIX2");
    const auto v1 = h.getDouble("CRVAL1"), v2 = h.getDouble("CRVAL2");
    if (!c1 || !c2 || !v1 || !v2) return std::nullopt;
    w.crpix[0] = *c1;
    w.crpix[1] = *c2;
    w.crval[0] = *v1;
    w.crval[1] = *v2;
    const bool hasCd = h.has("CD1_1") || h.has("CD1_2") || h.has("CD2_1") || h.has("CD2_2");
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
            const std::string ij = std::to_string(i + 1) + "_" + std::to_string(j + 1);
            if (hasCd) {
                w.cd[i][j] = h.getDouble("CD" + ij).value_or(0.0);
            } else {
                const double pc = h.getDouble("PC" + ij).value_or(i == j ? 1.0 : 0.0);
                const auto cdelt = h.getDouble("CDELT" + std::to_string(i + 1));
                if (!cdelt) return std::nullopt;
                w.cd[i][j] = *cdelt * pc;
            }
        }
    if (!(w.cd[0][0] * w.cd[1][1] - w.cd[0][1] * w.cd[1][0] != 0.0)) return std::nullopt;
    if (!sip) return w;
    auto readPoly = [&](const char* name, std::vector<double>& c, int& order) {
        const auto o = h.getInt(std::string(name) + "_ORDER");
        if (!o) return false;
        if (*o < 0 || *o > 9) return false;
        order = static_cast<int>(*o);
        c.assign(static_cast<std::size_t>((order + 1) * (order + 1)), 0.0);
        for (int p = 0; p <= order; ++p)
            for (int q = 0; p + q <= order; ++q)
                if (const auto v =
                        h.getDouble(std::string(name) + "_" + std::to_string(p) + "_" + std::to_string(q)))
                    c[static_cast<std::size_t>(p * (order + 1) + q)] = *v;
        return true;
    };
    int aOrder = 0, bOrder = 0;
    if (!readPoly("A", w.a, aOrder) || !readPoly("B", w.b, bOrder) || aOrder != bOrder) return std::nullopt;
    w.sipOrder = aOrder;
    // TanSip's SIP has no constant or linear forward terms (the convention; WCSLIB would apply them).
    for (int p = 0; p <= aOrder; ++p)
        for (int q = 0; p + q <= aOrder && p + q < 2; ++q)
            if (w.a[static_cast<std::size_t>(p * (aOrder + 1) + q)] != 0.0 ||
                w.b[static_cast<std::size_t>(p * (aOrder + 1) + q)] != 0.0)
                return std::nullopt;
    int apOrder = 0, bpOrder = 0;
    std::vector<double> ap, bp;
    if (readPoly("AP", ap, apOrder) && readPoly("BP", bp, bpOrder) && apOrder == bpOrder) {
        w.sipInvOrder = apOrder;
        w.ap = std::move(ap);
        w.bp = std::move(bp);
    }
    if (w.sipOrder == 0) w.sipInvOrder = 0;
    return w;
}

double TanSip::pixelScaleArcsec() const {
    return std::sqrt(std::fabs(cd[0][0] * cd[1][1] - cd[0][1] * cd[1][0])) * 3600.0;
}

Header TanSip::toHeader() const {
    Header h;
    const bool sip = sipOrder > 0;
    h.set("WCSAXES", 2, "number of WCS axes");
    h.set("CTYPE1", sip ? "RA---TAN-SIP" : "RA---TAN", "gnomonic projection");
    h.set("CTYPE2", sip ? "DEC--TAN-SIP" : "DEC--TAN", "gnomonic projection");
    h.set("CUNIT1", "deg");
    h.set("CUNIT2", "deg");
    h.set("RADESYS", "ICRS");
    h.set("CRPIX1", crpix[0], "reference pixel (1-based)");
    h.set("CRPIX2", crpix[1], "reference pixel (1-based)");
    h.set("CRVAL1", crval[0], "[deg] RA at reference pixel");
    h.set("CRVAL2", crval[1], "[deg] Dec at reference pixel");
    h.set("CD1_1", cd[0][0], "[deg/px]");
    h.set("CD1_2", cd[0][1], "[deg/px]");
    h.set("CD2_1", cd[1][0], "[deg/px]");
    h.set("CD2_2", cd[1][1], "[deg/px]");
    auto writePoly = [&](const char* name, const std::vector<double>& c, int order) {
        char key[32];
        std::snprintf(key, sizeof key, "%s_ORDER", name);
        h.set(key, order, "SIP polynomial order");
        for (int p = 0; p <= order; ++p)
            for (int q = 0; p + q <= order; ++q) {
                // A_/B_ start at order 2 (SIP convention); the inverse AP_/BP_ may carry every term,
                // including the constant AP_0_0 that worldToPixel evaluates.
                const bool inverse = name[1] == 'P';
                if (!inverse && p + q < 2) continue;
                if (c.size() < static_cast<std::size_t>((order + 1) * (order + 1))) continue;
                const double value = c[p * (order + 1) + q];
                if (value == 0.0) continue;
                std::snprintf(key, sizeof key, "%s_%d_%d", name, p, q);
                h.set(key, value);
            }
    };
    if (sip) {
        writePoly("A", a, sipOrder);
        writePoly("B", b, sipOrder);
        if (sipInvOrder > 0) {
            writePoly("AP", ap, sipInvOrder);
            writePoly("BP", bp, sipInvOrder);
        }
    }
    return h;
}

} // namespace gpuphot
