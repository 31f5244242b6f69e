#include "app/cli/prepare_options.hpp"

#include <memory>

#include <CLI/CLI.hpp>

#include "core/pipeline/prepare_inputs.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/stages/prepare/prepare.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {

void addPrepareOptions(CLI::App& sub, PrepareCliOptions& o) {
    const char* group = "Frame preparation";
    sub.add_option("--bias", o.bias, "Master bias FITS (gpuphot master bias), subtracted")->group(group);
    sub.add_option("--dark", o.dark, "Master dark FITS, subtracted after scaling by EXPTIME")->group(group);
    sub.add_option("--flat", o.flat, "Master flat FITS (median 1), divided; its FILTER must match")
        ->group(group);
    sub.add_option("--bpm", o.bpm, "Bad-pixel mask FITS (non-zero = bad): masked, never interpolated")
        ->group(group);
    sub.add_option("--weight", o.weight,
                   "Weight map FITS of the frame's size (--weight-type, default map_weight): its noise in "
                   "detection thresholds and flux errors, unusable pixels masked")
        ->group(group);
    sub.add_flag("--no-overscan", o.noOverscan,
                 "Do not subtract the overscan (BIASSEC) or trim (TRIMSEC/DATASEC)")
        ->group(group);
}

void applyPrepareOptions(const PrepareCliOptions& o, ReduceOptions& ro) {
    PrepareParams& p = ro.config.prepare;
    if (o.noOverscan) {
        p.overscan = false;
        p.trim = false;
    }
    if (!o.weight.empty() && p.weightType == "none") p.weightType = "map_weight";
    if (o.bias.empty() && o.dark.empty() && o.flat.empty() && o.bpm.empty() && o.weight.empty()) return;
    auto inputs = std::make_shared<PrepareInputs>(loadPrepareInputs(o.bias, o.dark, o.flat, o.bpm, p));
    if (!o.weight.empty()) loadWeightMap(*inputs, o.weight);
    ro.prepare = inputs.get();
    ro.prepareStorage = std::move(inputs);
}

} // namespace gpuphot::cli
