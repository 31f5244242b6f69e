#pragma once
// External weight maps (SExtractor's WEIGHT_IMAGE with WEIGHT_TYPE MAP_RMS, MAP_VAR or MAP_WEIGHT; gpuphot's
// --weight FILE --weight-type TYPE): the map becomes a relative variance per pixel during frame preparation
// (step 9, prepare.hpp); pixels the map calls unusable are MaskBad. The background stage then replaces its
// RMS map by the square root of that variance, rescaled to the measured background noise unless the map is
// an RMS map or PrepareParams::rescaleWeights is off (core/stages/background/background.hpp,
// applyWeightVariance), so that detection thresholds and flux errors follow the map.
#include <cstddef>
#include <string>

#include "core/model/image.hpp"

namespace gpuphot {

enum class WeightMapType { None, Rms, Variance, Weight };

// "none", "map_rms", "map_var", "map_weight" (SExtractor's names, any case); throws InvalidInput.
WeightMapType parseWeightMapType(const std::string& name);
const char* weightMapTypeName(WeightMapType t);

struct WeightVariance {
    Image<float> variance;    // relative variance; +infinity where unusable
    std::size_t unusable = 0; // pixels set MaskBad here (not already masked)
};

// SExtractor's weight_to_var: an RMS map's square, a variance map as it is, a weight map's inverse.
// Unusable pixels (non-finite values; weight <= max(threshold, 0); RMS or variance <= 0, or >= threshold
// when threshold > 0) get variance +infinity and MaskBad in `mask` (same size as `map`, else InvalidInput).
WeightVariance weightToVariance(const ImageView& map, WeightMapType type, double threshold,
                                Image<std::uint8_t>& mask);

} // namespace gpuphot
