#pragma once
// The masters and the bad-pixel mask of frame preparation, read from their files. The prepare stage
// (core/stages/prepare/) opens no file: the pipeline's front ends read the inputs here once and hand
// them to every frame (ReduceOptions::prepareInputs, the workbench's worker).
#include <string>

#include "core/stages/prepare/prepare.hpp"

namespace gpuphot {

// Reads the masters and the bad-pixel mask (empty paths: not used), then completes them
// (completePrepareInputs: sizes, the dark's EXPTIME, the bad pixels found in the masters). Throws
// IoError / InvalidInput naming the file.
PrepareInputs loadPrepareInputs(const std::string& bias, const std::string& dark, const std::string& flat,
                                const std::string& bpm, const PrepareParams& params = {});

// Reads an external weight map (--weight, SExtractor's WEIGHT_IMAGE) into in.weight, as it is: frame
// preparation reads it with PrepareParams::weightType. Throws IoError / InvalidInput naming the file.
void loadWeightMap(PrepareInputs& in, const std::string& path);

} // namespace gpuphot
