#pragma once
// The frame-preparation options of `gpuphot reduce` (and everything that shares the reduce options):
// --bias --dark --flat --bpm (master frames and a bad-pixel mask, loaded once for every frame),
// --weight (an RMS, variance or weight map read with --weight-type), --no-overscan (it overrides config
// "prepare"; --cosmics, --salt-pepper and --bayer are parameter flags,
// app/cli/param_flags.hpp).
#include <string>

namespace CLI {
class App;
}

namespace gpuphot {
struct ReduceOptions;
}

namespace gpuphot::cli {

struct PrepareCliOptions {
    std::string bias, dark, flat, bpm; // paths ("" : none)
    std::string weight;                // --weight: external weight map ("" : none)
    bool noOverscan = false;
};

void addPrepareOptions(CLI::App& sub, PrepareCliOptions& o);
// Applies the options to ro.config.prepare and loads the masters (ro.prepare / ro.prepareStorage).
// Throws IoError / InvalidInput naming the file.
void applyPrepareOptions(const PrepareCliOptions& o, ReduceOptions& ro);

} // namespace gpuphot::cli
