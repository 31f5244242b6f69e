#pragma once
// The host's windowed positions a row at a time: the window's weights and every pixel's terms of a row
// computed ahead in vectorisable loops (windowExpRow, windowTermsRow), then the sums in raster order exactly
// as windowedPosition makes them. The same bits as windowedPosition (and so as the CUDA finish step);
// several times faster where a window spans 10^5 pixels (a bright star's bleed trail or a large galaxy
// reaches the 50 px sigma ceiling).
#include <cstdint>
#include <vector>

#include "core/stages/detection/detection_window.hpp"

namespace gpuphot::detail {

// out[i] = windowExp(x[i]) for x[i] in [-690, 0]; below -690 the value is that of -690 (the window only
// asks for weights inside its circle, where x > -8). No branches: the loop vectorises.
void windowExpRow(const double* x, double* out, int n);

// One row of a window: pixels xa .. xa + n - 1 of row yy, gathered into contiguous buffers.
struct WindowRowPixels {
    const double* w;           // the window's weights (windowExpRow)
    const float* sub;          // background-subtracted values
    const float* rms;          // background rms
    const std::uint8_t* state; // PixelState bits
    const std::int32_t* seg;   // segmentation map
};
// The terms of windowTerms for each pixel of the row: term[k * n + i] for sw, swx, swy, sex, sey (k = 0..4),
// keep[i] = 1 where windowTerms counts the pixel. The same operations as windowTerms (no branches).
void windowTermsRow(const WindowState& s, const WindowConfig& p, std::int32_t segId, int xa, int yy, int n,
                    const WindowRowPixels& px, double* term, std::uint8_t* keep);

// Buffers of windowedPositionRows, kept between calls (one per thread).
struct WindowRowScratch {
    std::vector<double> d;
    std::vector<float> f;
    std::vector<std::uint8_t> b;
    std::vector<std::int32_t> seg;
};

// windowedPosition's result, its weights and terms computed a row at a time into `scratch`.
template <class Img>
WindowResult windowedPositionRows(const WindowObject& m, double halfLight, std::int32_t segId, const Img& img,
                                  const WindowConfig& p, WindowRowScratch& scratch) {
    WindowState s = windowStart(m, halfLight, p);
    const int iterations = windowIterations(p);
    for (int it = 0; it < iterations; ++it) {
        int xa = 0, xb = -1, ya = 0, yb = -1;
        if (!windowBox(s, p, xa, xb, ya, yb)) break;
        const int n = xb - xa + 1;
        const auto un = static_cast<std::size_t>(n > 0 ? n : 0);
        if (scratch.d.size() < 7 * un) scratch.d.resize(7 * un);
        if (scratch.f.size() < 2 * un) scratch.f.resize(2 * un);
        if (scratch.b.size() < 2 * un) scratch.b.resize(2 * un);
        if (scratch.seg.size() < un) scratch.seg.resize(un);
        double* arg = scratch.d.data();
        double* w = arg + un;
        double* term = w + un;
        float* sub = scratch.f.data();
        float* rms = sub + un;
        std::uint8_t* state = scratch.b.data();
        std::uint8_t* keep = state + un;
        std::int32_t* seg = scratch.seg.data();
        WindowSums q;
        for (int yy = ya; yy <= yb && n > 0; ++yy) {
            const auto row = img.row(yy);
            const double dy = yy - s.y;
            for (int i = 0; i < n; ++i) { // windowTerms' r2 and argument
                const double dx = (xa + i) - s.x;
                arg[i] = -(dx * dx + dy * dy) * s.inv2s2;
            }
            windowExpRow(arg, w, n);
            if constexpr (requires { row.span(xa, n, sub, rms, state, seg); }) {
                row.span(xa, n, sub, rms, state, seg); // the row's own copies, when it has them
            } else {
                for (int i = 0; i < n; ++i) {
                    sub[i] = row.sub(xa + i);
                    rms[i] = row.rms(xa + i);
                    state[i] = row.state(xa + i);
                    seg[i] = row.seg(xa + i);
                }
            }
            windowTermsRow(s, p, segId, xa, yy, n, {w, sub, rms, state, seg}, term, keep);
            for (int i = 0; i < n; ++i) // in raster order, as windowAdd
                if (keep[i]) {
                    q.sw += term[i];
                    q.swx += term[un + i];
                    q.swy += term[2 * un + i];
                    q.sex += term[3 * un + i];
                    q.sey += term[4 * un + i];
                }
        }
        if (!windowStep(s, q, p)) break;
    }
    return windowFinish(m, s);
}

} // namespace gpuphot::detail
