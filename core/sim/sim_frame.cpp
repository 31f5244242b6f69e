#include "core/sim/sim_frame.hpp"

#include <cmath>

#include "core/sim/simulator.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

Frame frameFromSimulation(const SimResult& sim, bool maskDefects) {
    Frame f;
    f.pixels = sim.image;
    f.header = sim.header;
    f.instrument = readInstrument(f.header);
    f.path = "simulated";
    const int w = f.pixels.width(), h = f.pixels.height();
    f.mask = Image<std::uint8_t>(w, h, Image<std::uint8_t>::NoInit{});
    const bool haveDefects = maskDefects && sim.defects.width() == w && sim.defects.height() == h;
    const double sat = f.instrument.saturation;
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const float v = f.pixels(x, y);
            std::uint8_t m = !std::isfinite(v) ? MaskNonFinite : (v >= sat ? MaskSaturated : 0);
            if (haveDefects) m |= sim.defects(x, y);
            f.mask(x, y) = m;
        }
    std::string why;
    if (auto wcs = Wcs::tryFromHeader(f.header, &why))
        f.wcs = std::make_shared<const Wcs>(std::move(*wcs));
    else
        f.wcsProblem = why;
    return f;
}

} // namespace gpuphot
