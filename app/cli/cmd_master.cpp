// gpuphot master bias|dark|flat FILES... -o OUT.fits: combine calibration frames into a master.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/cli/commands.hpp"
#include "core/io/fits_image.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/masters.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

struct MasterOptions {
    std::string type;
    std::vector<std::string> files;
    std::string output;
    std::string method = "median";
    double clipSigma = 3.0;
    std::string bias, dark, bpmOut;
    bool noOverscan = false;
    int threads = 0;
    std::string config;
    int verbosity = 1;
};

int runMaster(const MasterOptions& o) {
    if (o.output.empty()) throw InvalidInput("master: -o OUT.fits is required");
    CombineParams combine;
    combine.method = parseCombineMethod(o.method, "master --method");
    combine.clipSigma = o.clipSigma;
    if (!(combine.clipSigma > 0.0)) throw InvalidInput("master --clip-sigma must be > 0");
    PipelineConfig config = o.config.empty() ? PipelineConfig{} : loadPipelineConfig(o.config);
    PrepareParams prep = config.prepare;
    if (o.noOverscan) prep.overscan = prep.trim = false;
    if (o.type == "bias" && (!o.bias.empty() || !o.dark.empty()))
        throw InvalidInput("master bias: --bias and --dark do not apply to bias frames");
    if (o.type == "dark" && !o.dark.empty()) throw InvalidInput("master dark: --dark does not apply to dark frames");
    if (!o.bpmOut.empty() && o.type == "bias")
        throw InvalidInput("master bias: --bpm-out needs darks (hot pixels) or flats (dead pixels)");

    CommonOptions common;
    common.threads = o.threads;
    common.backend = "cpu";
    RunContext ctx = makeRunContext(common);

    // Masters to apply are read as they are (already trimmed); the inputs are prepared by buildMaster.
    std::optional<Frame> bias, dark;
    if (!o.bias.empty()) bias = readFrame(o.bias);
    if (!o.dark.empty()) dark = readFrame(o.dark);
    std::vector<Frame> frames;
    frames.reserve(o.files.size());
    for (const auto& f : o.files) frames.push_back(readFrame(f));
    const MasterResult r = buildMaster(o.type, frames, combine, prep, bias ? &*bias : nullptr,
                                       dark ? &*dark : nullptr, ctx);
    writeFitsImage(o.output, r.master.pixels.view(), r.master.header, -32);
    if (o.verbosity >= 1)
        std::printf("wrote %s: master %s of %zu frames (%s), %d x %d, median %.6g%s\n", o.output.c_str(),
                    o.type.c_str(), r.combined, combineMethodName(combine.method).c_str(), r.master.width(),
                    r.master.height(), r.median, o.type == "flat" ? " ADU before normalising" : " ADU");
    if (!o.bpmOut.empty()) {
        BadPixelParams bp;
        bp.hotSigma = prep.hotSigma;
        bp.flatLow = prep.flatLow;
        bp.flatHigh = prep.flatHigh;
        const BadPixelResult bad = detectBadPixels(o.type == "dark" ? r.master.view() : ImageView{},
                                                   o.type == "flat" ? r.master.view() : ImageView{}, bp);
        Header h;
        h.set("IMAGETYP", "Bad Pixel Mask", "1 = bad, 0 = good");
        h.set("NHOT", static_cast<long long>(bad.hot), "hot pixels (master dark)");
        h.set("NDEAD", static_cast<long long>(bad.dead), "dead or over-responsive pixels (master flat)");
        if (o.type == "dark") {
            h.set("HOTSIG", bp.hotSigma, "hot: above median + HOTSIG * robust sigma");
            h.set("DARKMED", bad.darkMedian, "[ADU] master dark median");
            h.set("DARKSIG", bad.darkSigma, "[ADU] master dark robust sigma");
        } else {
            h.set("FLATLOW", bp.flatLow, "dead: below FLATLOW * median");
            h.set("FLATHIGH", bp.flatHigh, "bad: above FLATHIGH * median");
        }
        h.addHistory("gpuphot master " + o.type + " --bpm-out from " + o.output);
        writeFitsImage(o.bpmOut, bad.mask.view(), h);
        if (o.verbosity >= 1)
            std::printf("wrote %s: %zu hot, %zu dead pixels\n", o.bpmOut.c_str(), bad.hot, bad.dead);
    }
    return 0;
}

} // namespace

Command registerMaster(CLI::App& app) {
    auto o = std::make_shared<MasterOptions>();
    auto* sub = app.add_subcommand("master", "Combine bias, dark or flat frames into a master calibration frame");
    sub->footer("Each input is overscan-subtracted and trimmed (BIASSEC/TRIMSEC/DATASEC) first. Darks: minus\n"
                "--bias, scaled to the first dark's EXPTIME. Flats: minus --bias and --dark (EXPTIME-scaled),\n"
                "each normalised by its median, combined, normalised to median 1. See docs/CLI.md.");
    sub->add_option("type", o->type, "bias, dark or flat")->required()->check(CLI::IsMember({"bias", "dark", "flat"}));
    sub->add_option("files", o->files, "Input frames (FITS)")->required();
    sub->add_option("-o,--output", o->output, "Output master FITS file")->required();
    sub->add_option("--method", o->method, "Per-pixel combination: median or clipped (sigma-clipped mean)")
        ->check(CLI::IsMember({"median", "clipped"}))
        ->capture_default_str();
    sub->add_option("--clip-sigma", o->clipSigma, "Clipping limit in robust sigmas (--method clipped)")
        ->capture_default_str();
    sub->add_option("--bias", o->bias, "Master bias to subtract (darks, flats)");
    sub->add_option("--dark", o->dark, "Master dark to subtract, scaled by EXPTIME (flats)");
    sub->add_option("--bpm-out", o->bpmOut, "Also write a bad-pixel mask (hot pixels from darks, dead from flats)");
    sub->add_flag("--no-overscan", o->noOverscan, "Do not subtract the overscan or trim the inputs");
    sub->add_option("--threads", o->threads, "CPU threads (0: all cores)")->check(CLI::NonNegativeNumber);
    sub->add_option("--config", o->config, "JSON configuration; its \"prepare\" section applies (docs/CONFIG.md)");
    sub->add_flag_callback("-v,--verbose", [o] { o->verbosity = 2; }, "More output");
    sub->add_flag_callback("-q,--quiet", [o] { o->verbosity = 0; }, "Errors only");
    return {sub, [o] { return runMaster(*o); }};
}

} // namespace gpuphot::cli
