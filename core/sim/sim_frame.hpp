#pragma once
// A simulated field as the Frame a FITS read of its file would give (pixels, mask, header, WCS,
// instrument), without the round trip through a file: for tests, benchmarks and the workbench demo.
#include "core/model/frame.hpp"

namespace gpuphot {

struct SimResult;

// Copies the image (the SimResult stays usable). The mask carries the simulator's known defects
// (hot pixels, bad columns, cosmic rays) only when `maskDefects`; saturated and non-finite pixels
// are always masked, as readFrame does.
Frame frameFromSimulation(const SimResult& sim, bool maskDefects = false);

} // namespace gpuphot
