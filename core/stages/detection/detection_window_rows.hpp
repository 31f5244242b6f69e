#pragma once
// The host's windowed positions a row at a time: the window's weights of a row computed ahead in one
// vectorisable loop (windowExpRow), then the sums in raster order exactly as windowedPosition makes them.
// The same bits as windowedPosition (and so as the CUDA finish step); several times faster where a window
// spans 10^5 pixels (a bright star's bleed trail or a large galaxy reaches the 50 px sigma ceiling).
#include <vector>

#include "core/stages/detection/detection_window.hpp"

namespace gpuphot::detail {

// out[i] = windowExp(x[i]) for x[i] in [-690, 0]; below -690 the value is that of -690 (the window only
// asks for weights inside its circle, where x > -8). No branches: the loop vectorises.
void windowExpRow(const double* x, double* out, int n);

// windowedPosition's result, its weights computed a row at a time into `scratch`.
template <class Img>
WindowResult windowedPositionRows(const WindowObject& m, double halfLight, std::int32_t segId, const Img& img,
                                  const WindowConfig& p, std::vector<double>& scratch) {
    WindowState s = windowStart(m, halfLight, p);
    const int iterations = windowIterations(p);
    for (int it = 0; it < iterations; ++it) {
        int xa = 0, xb = -1, ya = 0, yb = -1;
        if (!windowBox(s, p, xa, xb, ya, yb)) break;
        const int n = xb - xa + 1;
        if (n > 0 && scratch.size() < 2 * static_cast<std::size_t>(n))
            scratch.resize(2 * static_cast<std::size_t>(n));
        double* arg = scratch.data();
        double* w = scratch.data() + (n > 0 ? n : 0);
        const struct {
            const double* w;
            int xa;
            double operator()(double, int xx) const { return w[xx - xa]; }
        } rowWeight{w, xa};
        WindowSums q;
        for (int yy = ya; yy <= yb; ++yy) {
            const auto row = img.row(yy);
            const double dy = yy - s.y;
            for (int i = 0; i < n; ++i) { // windowTerms' r2 and argument
                const double dx = (xa + i) - s.x;
                arg[i] = -(dx * dx + dy * dy) * s.inv2s2;
            }
            windowExpRow(arg, w, n);
            for (int xx = xa; xx <= xb; ++xx) {
                WindowSums t;
                if (windowTerms(s, p, segId, row, xx, yy, rowWeight, t)) windowAdd(q, t);
            }
        }
        if (!windowStep(s, q, p)) break;
    }
    return windowFinish(m, s);
}

} // namespace gpuphot::detail
