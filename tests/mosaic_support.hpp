#pragma once
// The tests' small mosaic exposure: 4 CCDs of width x height in 2 x 2 (gapPx apart), CCD 3 a bad one
// (0.3 mag off), CCD 2 tile-compressed, a binary table extension after the CCDs.
#include "core/sim/sim_mosaic.hpp"

namespace gpuphot::test {

inline MosaicSimParams smallMosaic(int width, int height, int stars, int seed, double gapPx) {
    MosaicSimParams m;
    m.ccd.width = width;
    m.ccd.height = height;
    m.ccd.stars = stars;
    m.ccd.seed = seed;
    m.ccds = 4;
    m.columns = 2;
    m.gapPx = gapPx;
    m.zpSpread = 0.02;
    m.badCcd = 3;
    m.badCcdOffset = 0.3;
    m.compressed = {2};
    m.tableExtension = true;
    return m;
}

} // namespace gpuphot::test
