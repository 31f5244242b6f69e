#include "core/sim/psf_profile.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gpuphot::sim {
namespace {

constexpr double kPi = std::numbers::pi;
constexpr double kDeg = kPi / 180.0;

// Largest fraction of a star's flux that the continuous cut may fold into the rest of its profile.
// The cut at the surface-brightness threshold alone lies closer in for fainter stars, so their
// profiles would be more concentrated than the bright ones' (by 0.2 % at 3,000 ADU, beta 3): an
// aperture correction measured on bright stars would then make faint stars too bright. Below this
// bound the profile's shape no longer depends on the star's flux to within 0.1 mmag.
constexpr double kMaxFoldedFraction = 1e-4;

// Fraction of the flux moved by the cut at rho^2 = u: the wing beyond it plus the pedestal g(rho_max)
// subtracted inside (both relative to the untruncated integral).
double foldedFraction(ProfileKind kind, double beta, double u) {
    if (kind == ProfileKind::Moffat)
        return std::pow(1.0 + u, 1.0 - beta) + (beta - 1.0) * u * std::pow(1.0 + u, -beta);
    return std::exp(-0.5 * u) * (1.0 + 0.5 * u);
}

// Smallest rho^2 (within [0, uMax]) whose folded fraction is at most kMaxFoldedFraction (bisection:
// the fraction falls monotonically with u).
double foldBoundRho2(ProfileKind kind, double beta, double uMax) {
    if (foldedFraction(kind, beta, uMax) > kMaxFoldedFraction) return uMax;
    double lo = 0.0, hi = uMax;
    for (int i = 0; i < 60 && hi - lo > 1e-6 * hi; ++i) {
        const double mid = 0.5 * (lo + hi);
        (foldedFraction(kind, beta, mid) > kMaxFoldedFraction ? lo : hi) = mid;
    }
    return hi;
}

// Gauss-Legendre nodes and weights on [-0.5, 0.5] (weights sum to 1).
constexpr double kGl2x[2] = {-0.28867513459481287, 0.28867513459481287};
constexpr double kGl2w[2] = {0.5, 0.5};
constexpr double kGl3x[3] = {-0.38729833462074170, 0.0, 0.38729833462074170};
constexpr double kGl3w[3] = {5.0 / 18.0, 8.0 / 18.0, 5.0 / 18.0};
constexpr double kGl4x[4] = {-0.43056815579702629, -0.16999052179242813, 0.16999052179242813,
                             0.43056815579702629};
constexpr double kGl4w[4] = {0.17392742256872693, 0.32607257743127307, 0.32607257743127307,
                             0.17392742256872693};

template <int N>
double productRule(const Profile& p, double cx, double cy, double h, const double (&x)[N],
                   const double (&w)[N]) {
    double sum = 0.0;
    for (int j = 0; j < N; ++j) {
        double row = 0.0;
        for (int i = 0; i < N; ++i)
            row += w[i] * p.value(cx + h * x[i], cy + h * x[j]);
        sum += w[j] * row;
    }
    return sum * h * h;
}

// Sersic b_n (Ciotti & Bertin 1999 asymptotic series; good to 1e-6 for n > 0.36).
double sersicBn(double n) {
    return 2.0 * n - 1.0 / 3.0 + 4.0 / (405.0 * n) + 46.0 / (25515.0 * n * n) +
           131.0 / (1148175.0 * n * n * n);
}

void setOrientation(Profile& p, double angleDeg) {
    p.cosT = std::cos(angleDeg * kDeg);
    p.sinT = std::sin(angleDeg * kDeg);
}

} // namespace

double moffatAlpha(double fwhm, double beta) {
    return fwhm / (2.0 * std::sqrt(std::pow(2.0, 1.0 / beta) - 1.0));
}
double gaussianSigma(double fwhm) {
    return fwhm / (2.0 * std::sqrt(2.0 * std::log(2.0)));
}

double Profile::value(double dx, double dy) const {
    const double xp = dx * cosT + dy * sinT;
    const double yp = -dx * sinT + dy * cosT;
    const double u = xp * invSa, v = yp * invSb;
    const double r2 = u * u + v * v + soft2;
    if (r2 >= rhoMax2) return 0.0;
    double g;
    switch (kind) {
    case ProfileKind::Moffat: {
        const double t = 1.0 + r2;
        if (betaInt >= 0) { // (1 + r2)^-beta by multiplications for the common beta = 2, 2.5, 3, ...
            double d = 1.0;
            for (int i = 0; i < betaInt; ++i)
                d *= t;
            if (betaHalf) d *= std::sqrt(t);
            g = 1.0 / d;
        } else {
            g = std::pow(t, -beta);
        }
        break;
    }
    case ProfileKind::Gaussian:
        g = std::exp(-0.5 * r2);
        break;
    default:
        g = std::exp(-bn * (std::pow(r2, beta) - 1.0));
        break;
    }
    return amplitude * (g - edge);
}

double Profile::pixel(int ix, int iy) const {
    const double dx = ix - xc, dy = iy - yc;
    const double d2 = dx * dx + dy * dy;
    const double reach = radius + 0.7072;
    if (d2 > reach * reach) return 0.0;
    if (d2 < coreRadius * coreRadius) {
        const double h = 1.0 / coreSub;
        double sum = 0.0;
        for (int b = 0; b < coreSub; ++b)
            for (int a = 0; a < coreSub; ++a)
                sum +=
                    productRule(*this, dx - 0.5 + (a + 0.5) * h, dy - 0.5 + (b + 0.5) * h, h, kGl4x, kGl4w);
        return sum;
    }
    if (d2 < midRadius * midRadius) return productRule(*this, dx, dy, 1.0, kGl3x, kGl3w);
    return productRule(*this, dx, dy, 1.0, kGl2x, kGl2w);
}

Profile makeStar(ProfileKind kind, double x, double y, double flux, double fwhm, double ellipticity,
                 double angleDeg, double beta, double threshold, double maxRadius) {
    Profile p;
    p.kind = kind;
    p.xc = x;
    p.yc = y;
    setOrientation(p, angleDeg);
    const double q = 1.0 - ellipticity; // b/a
    const double fwhmA = fwhm / std::sqrt(q), fwhmB = fwhm * std::sqrt(q);
    double sa, sb; // alpha or sigma along each axis
    if (kind == ProfileKind::Moffat) {
        sa = moffatAlpha(fwhmA, beta);
        sb = moffatAlpha(fwhmB, beta);
        p.beta = beta;
        const double twoBeta = 2.0 * beta;
        if (twoBeta == std::floor(twoBeta) && beta <= 10.0) {
            p.betaInt = static_cast<int>(std::floor(beta));
            p.betaHalf = twoBeta != 2.0 * p.betaInt;
        }
    } else {
        sa = gaussianSigma(fwhmA);
        sb = gaussianSigma(fwhmB);
    }
    p.invSa = 1.0 / sa;
    p.invSb = 1.0 / sb;
    // Truncation: where the untruncated surface brightness reaches the threshold, within
    // [2.5 FWHM_major, maxRadius] along the major axis.
    const double flux0 = std::max(std::fabs(flux), 1e-30);
    double rho2;
    if (kind == ProfileKind::Moffat) {
        const double integral = kPi * sa * sb / (beta - 1.0);
        rho2 = std::pow(std::max(flux0 / (integral * threshold), 1.0), 1.0 / beta) - 1.0;
    } else {
        const double integral = 2.0 * kPi * sa * sb;
        rho2 = 2.0 * std::log(std::max(flux0 / (integral * threshold), 1.0));
    }
    const double rhoMin = 2.5 * fwhmA / sa, rhoMaxCap = std::max(maxRadius, 2.5 * fwhmA) / sa;
    rho2 = std::max(rho2, foldBoundRho2(kind, beta, rhoMaxCap * rhoMaxCap));
    const double rho = std::clamp(std::sqrt(std::max(rho2, 0.0)), rhoMin, rhoMaxCap);
    p.rhoMax2 = rho * rho;
    double integral; // of (g - edge) over rho < rhoMax, in px^2
    if (kind == ProfileKind::Moffat) {
        p.edge = std::pow(1.0 + p.rhoMax2, -beta);
        integral = kPi * sa * sb *
                   ((1.0 - std::pow(1.0 + p.rhoMax2, 1.0 - beta)) / (beta - 1.0) - p.edge * p.rhoMax2);
    } else {
        p.edge = std::exp(-0.5 * p.rhoMax2);
        integral = 2.0 * kPi * sa * sb * ((1.0 - p.edge) - 0.5 * p.edge * p.rhoMax2);
    }
    p.amplitude = flux / integral;
    p.radius = rho * sa;
    p.coreRadius = fwhmA + 1.0;
    p.coreSub = std::clamp(static_cast<int>(std::ceil(3.0 / fwhmB)), 1, 16);
    p.midRadius = 3.0 * fwhmA + 1.0;
    return p;
}

Profile makeGalaxy(double x, double y, double flux, double re, double n, double ellipticity, double angleDeg,
                   double softening, double threshold, double maxRadius) {
    Profile p;
    p.kind = ProfileKind::Sersic;
    p.xc = x;
    p.yc = y;
    setOrientation(p, angleDeg);
    const double q = 1.0 - ellipticity;
    p.invSa = 1.0 / re;
    p.invSb = 1.0 / (q * re);
    p.beta = 0.5 / n; // g = exp(-bn ((rho^2)^(1/2n) - 1))
    p.bn = sersicBn(n);
    p.soft2 = (softening / re) * (softening / re);
    auto g = [&p](double r2) { return std::exp(-p.bn * (std::pow(r2, p.beta) - 1.0)); };
    // Truncation radius from the unsoftened profile: I = 2 pi q re^2 n e^bn Gamma(2n) / bn^2n.
    const double total =
        2.0 * kPi * q * re * re * n * std::exp(p.bn + std::lgamma(2.0 * n) - 2.0 * n * std::log(p.bn));
    const double ratio = threshold * total / std::max(std::fabs(flux), 1e-30); // g at the cut
    double rho = ratio < 1.0 ? std::pow(1.0 - std::log(ratio) / p.bn, n) : 0.0;
    rho = std::clamp(rho, 3.0, std::max(std::min(8.0, maxRadius / re), 3.0));
    const double w = rho * rho; // r^2 range (elliptical radius in re units)
    p.rhoMax2 = w + p.soft2;
    p.edge = g(p.rhoMax2);
    // Integral of (g - edge) = 2 pi q re^2 * 1/2 * int_0^w f(s) ds, with s = w t^4 (smooth at 0).
    const int m = 4000;
    double sum = 0.0;
    for (int i = 0; i <= m; ++i) {
        const double t = static_cast<double>(i) / m;
        const double s = w * t * t * t * t;
        const double f = (g(s + p.soft2) - p.edge) * 4.0 * w * t * t * t;
        sum += f * (i == 0 || i == m ? 1.0 : (i % 2 ? 4.0 : 2.0));
    }
    const double integral = kPi * q * re * re * sum / (3.0 * m);
    p.amplitude = flux / integral;
    p.radius = rho * re;
    const double softMinor = std::max(2.355 * softening * q, 0.3);
    p.coreRadius = 2.5 * softening + 2.0;
    p.coreSub = std::clamp(static_cast<int>(std::ceil(3.0 / softMinor)), 1, 16);
    p.midRadius = p.coreRadius + 2.0 * re + 2.0;
    return p;
}

} // namespace gpuphot::sim
