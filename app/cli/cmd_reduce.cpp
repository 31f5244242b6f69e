// gpuphot reduce: detection, PSF and aperture photometry of frames into calibrated catalogs.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <sstream>

#include "app/cli/commands.hpp"
#include "core/catalog/reference_catalog.hpp"
#include "core/catalog/tycho2_index.hpp"
#include "core/io/fits_image.hpp"
#include "core/pipeline/pointing.hpp"
#include "core/wcs/wcs.hpp"
#include "core/io/target_list.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

// The Tycho-2 stars around a frame: centre and radius from its header WCS (half diagonal + 10%), or from
// its pointing keywords when the WCS is missing or ignored (radius: the astrometric search radius plus
// the half diagonal at the largest scale searched).
ReferenceCatalog tycho2ForFrame(const std::string& path, const ReduceOptions& ro, const std::vector<std::string>& files) {
    const Header h = readHeader(path, ro.read.hdu);
    long long w = 0, hgt = 0;
    for (const HduSummary& s : listHdus(path))
        if (s.type == "IMAGE" && s.axes.size() == 2 &&
            (ro.read.hdu.empty() ? true : (ro.read.hdu == std::to_string(s.index) || ro.read.hdu == s.extname))) {
            w = s.axes[0];
            hgt = s.axes[1];
            break;
        }
    if (w <= 0 || hgt <= 0) return {};
    const double halfDiag = 0.5 * std::hypot(static_cast<double>(w), static_cast<double>(hgt));
    std::optional<Wcs> wcs;
    if (!ro.ignoreHeaderWcs) {
        try {
            wcs = Wcs::tryFromHeader(h);
        } catch (const InvalidInput&) {
        }
    }
    if (wcs) {
        const auto [ra, dec] = wcs->pixelToWorld(0.5 * (w - 1), 0.5 * (hgt - 1));
        const double scale = wcs->pixelScaleArcsec(0.5 * (w - 1), 0.5 * (hgt - 1));
        if (std::isfinite(ra) && std::isfinite(dec) && scale > 0)
            return loadTycho2Region(ra, dec, 1.1 * halfDiag * scale / 3600.0 + 0.05, files);
    }
    const auto p = framePointing(h);
    if (!p) return {};
    const double radius = ro.config.astrometry.searchRadiusDeg + halfDiag * ro.config.astrometry.scaleHigh / 3600.0;
    return loadTycho2Region(p->ra, p->dec, std::min(radius, 30.0), files);
}

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
    bool noTycho2 = false;
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
    // Without --ref: Tycho-2 from Debian's astrometry-data-tycho2 index files, cut per frame.
    std::vector<std::string> tycho2Files;
    const char* noTycho2Env = std::getenv("GPUPHOT_NO_TYCHO2");
    if (o.reference.empty() && !o.noTycho2 && !(noTycho2Env && *noTycho2Env)) tycho2Files = findTycho2IndexFiles();
    if (!o.reference.empty()) {
        reference = readReferenceCatalog(o.reference, parseRefColumnMap(o.refColumns));
        ro.reference = &reference;
        if (o.common.verbosity > 1)
            std::printf("reference %s: %zu stars (%zu rows skipped: NaN position or magnitude)\n", o.reference.c_str(),
                        reference.size(), reference.skippedNonFinite);
    } else if (!tycho2Files.empty()) {
        if (o.common.verbosity > 0)
            std::fprintf(stderr, "gpuphot: note: no --ref: calibrating against Tycho-2 (%zu index files of "
                                 "astrometry-data-tycho2; --no-tycho2 to skip)\n", tycho2Files.size());
    } else if (o.common.verbosity > 0) {
        std::fprintf(stderr, "gpuphot: note: no --ref catalog and no Tycho-2 index files (Debian package "
                             "astrometry-data-tycho2): no crossmatch or zero point (mag_cal is NaN)\n");
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
            ReferenceCatalog tycho2;
            if (!tycho2Files.empty()) {
                tycho2 = tycho2ForFrame(frame, ro, tycho2Files);
                ro.reference = tycho2.size() ? &tycho2 : nullptr;
                if (!ro.reference && o.common.verbosity > 0)
                    std::fprintf(stderr, "gpuphot: note: %s: no Tycho-2 stars for this frame (no WCS or pointing "
                                         "keywords, or none in the field): no calibration\n", frame.c_str());
            }
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
    sub->add_flag("--no-tycho2", o->noTycho2,
                  "Without --ref, do not calibrate against Tycho-2 (astrometry-data-tycho2 index files)");
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
