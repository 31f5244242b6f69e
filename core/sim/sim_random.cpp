#include "core/sim/sim_random.hpp"

#include <math.h>

namespace gpuphot::sim {

double CounterRng::poisson(double mu) {
    if (!(mu > 0.0)) return 0.0;
    if (mu < 10.0) {
        // Multiplication of uniforms (Knuth): exact, fast for small means.
        const double limit = std::exp(-mu);
        double prod = uniform();
        double k = 0.0;
        while (prod > limit) {
            prod *= uniform();
            k += 1.0;
        }
        return k;
    }
    // PTRS: transformed rejection with squeeze (W. Hoermann, Insurance: Mathematics and Economics 12,
    // 1993, 39-45), exact for mu >= 10.
    const double smu = std::sqrt(mu);
    const double b = 0.931 + 2.53 * smu;
    const double a = -0.059 + 0.02483 * b;
    const double invAlpha = 1.1239 + 1.1328 / (b - 3.4);
    const double vr = 0.9277 - 3.6224 / (b - 2.0);
    const double logMu = std::log(mu);
    for (;;) {
        const double u = uniform() - 0.5;
        const double v = uniform();
        const double us = 0.5 - std::fabs(u);
        const double k = std::floor((2.0 * a / us + b) * u + mu + 0.43);
        if (us >= 0.07 && v <= vr) return k;
        if (k < 0.0 || (us < 0.013 && v > us)) continue;
        int sign = 0;
        const double lg = ::lgamma_r(k + 1.0, &sign); // reentrant: no global signgam
        if (std::log(v) + std::log(invAlpha) - std::log(a / (us * us) + b) <= -mu + k * logMu - lg) return k;
    }
}

} // namespace gpuphot::sim
