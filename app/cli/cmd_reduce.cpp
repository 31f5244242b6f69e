// gpuphot reduce: detection, PSF and aperture photometry of frames into calibrated catalogs.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <sstream>

#include "app/cli/commands.hpp"
#include "core/catalog/reference_catalog.hpp"
#include "core/io/target_list.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

struct ReduceCli {
    CommonOptions common;
    std::vector<std::string> frames;
    std::string hdu;
    std::vector<std::string> formats, maps;
    std::optional<double> gain, readNoise, saturation, exptime;
    std::optional<double> threshold;
    std::optional<int> minArea;
    std::vector<double> radii;
    std::string reference, refColumns;
    std::string targets;
    bool writeSolved = false, ignoreHeaderWcs = false;
    std::optional<double> scaleLow, scaleHigh;
    bool dumpConfig = false;
};

std::vector<std::string> splitList(const std::vector<std::string>& items) {
    std::vector<std::string> out;
    for (const auto& item : items) {
        std::stringstream ss(item);
        std::string part;
        while (std::getline(ss, part, ','))
            if (!part.empty()) out.push_back(part);
    }
    return out;
}

int run(ReduceCli& o) {
    PipelineConfig config = loadConfig(o.common);
    if (o.gain) config.instrument.gain = o.gain;
    if (o.readNoise) config.instrument.readNoise = o.readNoise;
    if (o.saturation) config.instrument.saturation = o.saturation;
    if (o.exptime) config.instrument.exptime = o.exptime;
    if (o.threshold) config.detection.threshold = *o.threshold;
    if (o.minArea) config.detection.minArea = *o.minArea;
    if (!o.radii.empty()) config.aperture.radii = o.radii;
    if (o.scaleLow) config.astrometry.scaleLow = *o.scaleLow;
    if (o.scaleHigh) config.astrometry.scaleHigh = *o.scaleHigh;
    if (!(config.astrometry.scaleLow > 0.0) || !(config.astrometry.scaleHigh >= config.astrometry.scaleLow) ||
        !std::isfinite(config.astrometry.scaleHigh))
        throw InvalidInput("reduce: --scale-low/--scale-high must satisfy 0 < low <= high (arcsec/px), got " +
                           std::to_string(config.astrometry.scaleLow) + " and " +
                           std::to_string(config.astrometry.scaleHigh));
    if (o.dumpConfig) {
        std::cout << nlohmann::json(config).dump(2) << "\n";
        return 0;
    }
    if (o.frames.empty()) throw InvalidInput("reduce: no frame given (gpuphot reduce FRAME.fits ...)");

    ReduceOptions ro;
    ro.read.hdu = o.hdu;
    ro.config = config;
    ro.output.outdir = o.common.outdir;
    ro.output.formats = splitList(o.formats);
    ro.output.maps = splitList(o.maps);
    ro.output.writeSolved = o.writeSolved;
    ro.ignoreHeaderWcs = o.ignoreHeaderWcs;
    validateOutputOptions(ro.output);
    TargetList targets;
    if (!o.targets.empty()) {
        targets = readTargetList(o.targets);
        ro.targets = &targets;
        if (o.common.verbosity > 1) std::printf("targets %s: %zu positions\n", o.targets.c_str(), targets.size());
    }
    if (o.writeSolved && o.reference.empty() && o.common.verbosity > 0)
        std::fprintf(stderr, "gpuphot: note: --write-solved needs --ref REFCAT to fit a WCS against\n");

    ReferenceCatalog reference;
    if (!o.reference.empty()) {
        reference = readReferenceCatalog(o.reference, parseRefColumnMap(o.refColumns));
        ro.reference = &reference;
        if (o.common.verbosity > 1)
            std::printf("reference %s: %zu stars (%zu rows skipped: NaN position or magnitude)\n", o.reference.c_str(),
                        reference.size(), reference.skippedNonFinite);
    } else if (o.common.verbosity > 0) {
        std::fprintf(stderr, "gpuphot: note: no --ref catalog: no crossmatch or zero point (mag_cal is NaN)\n");
    }
    RunContext ctx = makeRunContext(o.common);
    const bool tty = stderrIsTty() && o.common.verbosity > 0;
    std::mutex progressMutex;
    if (tty)
        ctx.progress = [&](const std::string& stage, double fraction) {
            std::lock_guard lock(progressMutex);
            std::fprintf(stderr, "\r  %-12s %3d%%", stage.c_str(), static_cast<int>(fraction * 100 + 0.5));
            std::fflush(stderr);
        };
    int failed = 0, uncalibrated = 0;
    for (const auto& frame : o.frames) {
        try {
            const ReduceSummary s = reduceFrame(frame, ro, ctx);
            if (tty) std::fprintf(stderr, "\r%40s\r", "");
            for (const auto& w : s.warnings) std::fprintf(stderr, "gpuphot: warning: %s: %s\n", frame.c_str(), w.c_str());
            uncalibrated += s.calibrationFailed;
            if (o.common.verbosity > 0) {
                const std::string catalog = s.report["outputs"].value("catalog", std::string());
                std::printf("%s: %zu sources, FWHM %.2f px, %.2f s -> %s\n", frame.c_str(), s.sources,
                            s.report.value("fwhm", nlohmann::json(0.0)).is_number() ? s.report["fwhm"].get<double>() : 0.0,
                            s.seconds, catalog.c_str());
                if (s.report["zp"].is_number())
                    std::printf("  zero point %.4f +- %.4f mag from %d stars\n", s.report["zp"].get<double>(),
                                s.report["zp_err"].get<double>(), s.report["calibration"]["calibrators"].get<int>());
                if (o.common.verbosity > 1)
                    for (const auto& st : ctx.records) std::printf("  %-24s %8.3f s\n", st.stage.c_str(), st.seconds);
            }
        } catch (const Cancelled&) {
            throw;
        } catch (const Error& e) {
            if (o.frames.size() == 1) throw;
            if (tty) std::fprintf(stderr, "\r%40s\r", "");
            std::fprintf(stderr, "gpuphot: error: %s\n", e.what());
            ++failed;
        }
    }
    // 1: a frame failed; 4: every frame was reduced but at least one could not be calibrated.
    return failed ? 1 : (uncalibrated ? 4 : 0);
}

} // namespace

Command registerReduce(CLI::App& app) {
    auto o = std::make_shared<ReduceCli>();
    auto* sub = app.add_subcommand("reduce", "Detect and measure sources; write catalog, maps and a JSON report");
    sub->add_option("frames", o->frames, "FITS frames (also .fz, .gz, file.fits[EXT])");
    addCommonOptions(*sub, o->common);
    sub->add_option("--hdu", o->hdu, "HDU by 0-based number or EXTNAME (default: first image with data)");
    sub->add_option("--formats", o->formats, "Extra catalog formats: ecsv,csv,reg")->delimiter(',');
    sub->add_option("--maps", o->maps, "Maps to write: bkg,rms,seg,psf,resid")->delimiter(',');
    sub->add_option("--gain", o->gain, "Gain in e-/ADU (overrides the header)");
    sub->add_option("--rdnoise", o->readNoise, "Read noise in e- (overrides the header)");
    sub->add_option("--saturation", o->saturation, "Saturation level in ADU (overrides the header)");
    sub->add_option("--exptime", o->exptime, "Exposure time in s (overrides the header)");
    sub->add_option("--threshold", o->threshold, "Detection threshold in background sigma (DETECT_THRESH)");
    sub->add_option("--minarea", o->minArea, "Minimum object area in pixels (DETECT_MINAREA)");
    sub->add_option("--aper", o->radii, "Aperture radii in pixels (or FWHM multiples with aperture.radiiInFwhm)")
        ->delimiter(',');
    sub->add_option("--ref", o->reference, "Reference catalog (FITS table or CSV) for crossmatch and zero point");
    sub->add_option("--ref-columns", o->refColumns,
                    "Reference column map, e.g. ra=RA,dec=DEC,mag=phot_g_mean_mag,color=phot_bp_mean_mag-phot_rp_mean_mag");
    sub->add_option("--targets", o->targets,
                    "Forced photometry at these RA/Dec (FITS table, ECSV or CSV; columns ra, dec in degrees or "
                    "sexagesimal, optional name) -> STEM.targets.fits");
    sub->add_flag("--write-solved", o->writeSolved,
                  "Write STEM.solved.fits: the frame with the fitted WCS in its header (needs a verified fit)");
    sub->add_flag("--ignore-header-wcs", o->ignoreHeaderWcs,
                  "Solve as if the header had no WCS (blind, from the pointing keywords)");
    sub->add_option("--scale-low", o->scaleLow, "Lowest pixel scale searched by a blind solve (arcsec/px)");
    sub->add_option("--scale-high", o->scaleHigh, "Highest pixel scale searched by a blind solve (arcsec/px)");
    sub->add_flag("--dump-config", o->dumpConfig, "Print the effective configuration as JSON and exit");
    return {sub, [o] { return run(*o); }};
}

} // namespace gpuphot::cli
