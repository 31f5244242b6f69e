// gpuphot simulate: a star field with known truth (N.fits, N.truth.fits, N.ref.fits).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/commands.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_mosaic.hpp"
#include "core/sim/sim_series.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::cli {
namespace {

struct SimulateOptions {
    CommonOptions common;
    std::string size;
    int stars = 0;
    std::uint64_t seed = 0;
    double fwhm = 0.0;
    std::string name = "sim";
    int bitpix = -32;
    bool noNoise = false;
    double wcsOffset = 0.0, wcsRotation = 0.0, wcsScaleError = 0.0;
    bool noWcs = false;
    bool dumpConfig = false;
    int galaxies = 0;
    std::string psf;
    double sky = 0.0, zeroPoint = 0.0, fwhmCorner = 1.0, refMagLimit = 0.0, refMargin = 0.0;
    std::vector<std::string> sets;
    bool raw = false;   // --raw: raw-detector preset and NAME.bias_NN/dark_NN/flat_NN.fits
    int rawCount = 5;
    int series = 0;                  // --series N: a night of N exposures (NAME_NNNN.fits, NAME.series.json)
    std::vector<std::string> seriesSets;
    int mosaic = 0; // --mosaic N: one exposure of N CCDs (NAME.fits MEF, NAME.mosaic.json)
    std::vector<std::string> mosaicSets;
};

// --raw preset (before --config and --set, so both override it): a camera with a bias pattern, an
// overscan, dark current with hot pixels and a vignetted flat with pixel-to-pixel response.
nlohmann::json rawPreset() {
    return {{"bias", 1000.0},          {"biasRowAmplitude", 2.0}, {"biasColumnAmplitude", 3.0},
            {"overscan", 32},          {"darkCurrent", 0.5},      {"darkHotPixels", 50},
            {"flatVignetting", 0.15},  {"flatPixelSigma", 0.01}};
}

nlohmann::json readJsonFile(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw IoError(path + ": cannot open the configuration file");
    try {
        nlohmann::json j = nlohmann::json::parse(in, nullptr, true, /*ignore_comments=*/true);
        // A combined configuration may keep the simulator's parameters under "simulate".
        if (j.is_object() && j.contains("simulate") && j["simulate"].is_object()) return j["simulate"];
        return j;
    } catch (const nlohmann::json::parse_error& e) {
        throw InvalidInput(path + ": not valid JSON: " + e.what());
    }
}

void parseSize(const std::string& s, SimParams& p) {
    const auto x = s.find_first_of("xX");
    try {
        std::size_t used = 0;
        if (x == std::string::npos) {
            p.width = p.height = std::stoi(s, &used);
            if (used != s.size()) throw std::invalid_argument(s);
        } else {
            p.width = std::stoi(s.substr(0, x), &used);
            if (used != x) throw std::invalid_argument(s);
            p.height = std::stoi(s.substr(x + 1), &used);
            if (used != s.size() - x - 1) throw std::invalid_argument(s);
        }
    } catch (const std::logic_error&) {
        throw InvalidInput("--size '" + s + "': expected WIDTHxHEIGHT (e.g. 4096x4096) or one number");
    }
}

// --set key=value: value parsed as JSON when it is JSON (numbers, true/false, "strings"), else a string.
void applySet(const std::string& kv, nlohmann::json& j) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw InvalidInput("--set '" + kv + "': expected KEY=VALUE");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    nlohmann::json v = nlohmann::json::parse(value, nullptr, false);
    j[key] = v.is_discarded() ? nlohmann::json(value) : v;
}

// --series N: the field p observed N times (core/sim/sim_series.hpp); --series-set changes the night.
int runSeries(const SimulateOptions& o, const SimParams& p) {
    nlohmann::json k = SimSeriesParams{};
    k["frames"] = o.series;
    for (const auto& s : o.seriesSets) applySet(s, k);
    const SimSeriesParams sp = k.get<SimSeriesParams>();
    RunContext ctx;
    ctx.backend = Backend::Cpu;
    ctx.threads = o.common.threads;
    const bool tty = o.common.verbosity >= 1 && stderrIsTty();
    const auto t0 = std::chrono::steady_clock::now();
    const SimSeriesTruth t = writeSimulatedSeries(p, sp, o.common.outdir, o.name, o.bitpix, &ctx, [&](int done, int n) {
        if (tty) std::fprintf(stderr, "\rsimulate series: %d / %d exposures", done, n);
        if (tty && done == n) std::fprintf(stderr, "\n");
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.common.verbosity >= 1) {
        const std::string base = (o.common.outdir.empty() ? std::string(".") : o.common.outdir) + "/" + o.name;
        std::printf("wrote %d exposures %s_0001.fits ... and %s.series.json in %.1f s\n", sp.frames, base.c_str(),
                    base.c_str(), secs);
        for (const auto& v : t.variables)
            std::printf("variable %s: truth id %lld at RA %.6f Dec %.6f, mag %.3f\n", v.kind.c_str(),
                        static_cast<long long>(v.id), v.ra, v.dec, v.mag);
    }
    return 0;
}

// --mosaic N: an exposure of N CCDs of the field p's parameters (core/sim/sim_mosaic.hpp); --mosaic-set
// changes the mosaic. Progress: a line per CCD with -v, else a counter on a terminal.
int runMosaic(const SimulateOptions& o, const SimParams& p) {
    nlohmann::json k = MosaicSimParams{};
    k["ccds"] = o.mosaic;
    for (const auto& s : o.mosaicSets)
        applySet(s, k);
    MosaicSimParams mp = k.get<MosaicSimParams>();
    mp.ccd = p;
    RunContext ctx;
    ctx.backend = Backend::Cpu;
    ctx.threads = o.common.threads;
    const bool tty = o.common.verbosity == 1 && stderrIsTty();
    const auto t0 = std::chrono::steady_clock::now();
    const MosaicTruth t =
        writeSimulatedMosaic(mp, o.common.outdir, o.name, o.bitpix, &ctx, [&](const MosaicCcd& c, int n) {
            if (o.common.verbosity >= 2)
                std::printf("%s (HDU %d, %s): gain %.3f e-/ADU, ZP offset %+.4f mag%s, rotation %+.4f deg, "
                            "centre RA %.5f Dec %+.5f\n",
                            c.extname.c_str(), c.hdu,
                            ("R" + std::to_string(c.row + 1) + "C" + std::to_string(c.column + 1)).c_str(),
                            c.gain, c.zpOffset, c.bad ? " (bad CCD)" : "", c.rotation, c.ra, c.dec);
            if (o.common.verbosity >= 2) std::fflush(stdout);
            if (tty) std::fprintf(stderr, "\rsimulate mosaic: %d / %d CCDs", c.number, n);
            if (tty && c.number == n) std::fprintf(stderr, "\n");
        });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.common.verbosity >= 1) {
        const std::string base =
            (o.common.outdir.empty() ? std::string(".") : o.common.outdir) + "/" + o.name;
        std::printf("wrote %s.fits (%d CCDs of %d x %d in %d x %d, BITPIX %s, %d stars per CCD, seed %llu), "
                    ".ref.fits (%zu rows), .truth.fits (%zu rows), .mosaic.json in %.1f s (%d threads)\n",
                    base.c_str(), mp.ccds, p.width, p.height, t.columns, t.rows,
                    o.bitpix == -32 ? "-32" : "16 unsigned", p.stars, static_cast<unsigned long long>(p.seed),
                    t.referenceRows, t.truthRows, secs, ctx.threadCount());
    }
    return 0;
}

int runSimulate(const SimulateOptions& o, const std::vector<const CLI::Option*>& given) {
    auto isGiven = [&](const char* name) {
        for (const CLI::Option* opt : given)
            if (opt->check_name(name) && opt->count() > 0) return true;
        return false;
    };
    // Defaults, then --config, then the explicit options, then --set.
    nlohmann::json j = SimParams{};
    if (o.mosaic > 0) {
        if (o.raw || o.series > 0)
            throw InvalidInput("simulate: --mosaic does not combine with --raw or --series");
        j["width"] = MosaicSimParams{}.ccd.width; // a mosaic's CCD size unless --size, --config or --set say
        j["height"] = MosaicSimParams{}.ccd.height;
    }
    if (o.raw) j.update(rawPreset());
    if (!o.common.config.empty()) j.update(readJsonFile(o.common.config));
    SimParams p = j.get<SimParams>();
    if (!o.size.empty()) parseSize(o.size, p);
    if (isGiven("--stars")) p.stars = o.stars;
    if (isGiven("--seed")) p.seed = o.seed;
    if (isGiven("--fwhm")) p.fwhm = o.fwhm;
    if (isGiven("--galaxies")) p.galaxies = o.galaxies;
    if (isGiven("--psf")) p.psf = o.psf;
    if (isGiven("--sky")) p.sky = o.sky;
    if (isGiven("--zp")) p.zeroPoint = o.zeroPoint;
    if (isGiven("--fwhm-corner")) p.fwhmCornerFactor = o.fwhmCorner;
    if (isGiven("--ref-mag-limit")) p.refMagLimit = o.refMagLimit;
    if (isGiven("--ref-margin")) p.refMargin = o.refMargin;
    if (o.noNoise) p.noise = false;
    if (isGiven("--wcs-offset")) p.wcsOffset = o.wcsOffset;
    if (isGiven("--wcs-rotation")) p.wcsRotation = o.wcsRotation;
    if (isGiven("--wcs-scale-error")) p.wcsScaleError = o.wcsScaleError;
    if (o.noWcs) p.writeWcs = false;
    if (!o.sets.empty()) {
        nlohmann::json k = p;
        for (const auto& s : o.sets) applySet(s, k);
        p = k.get<SimParams>();
    }
    validate(p);
    SimulateOptions opts = o;
    if (o.mosaic > 0 && !isGiven("--bitpix")) opts.bitpix = 16; // a mosaic is written as a camera writes it
    if (o.dumpConfig) {
        std::printf("%s\n", nlohmann::json(p).dump(2).c_str());
        return 0;
    }
    if (o.mosaic > 0) return runMosaic(opts, p);

    if (o.series > 0) return runSeries(o, p);

    RunContext ctx;
    ctx.backend = Backend::Cpu; // the simulator runs on the CPU
    ctx.threads = o.common.threads;
    const bool progress = o.common.verbosity >= 1 && stderrIsTty() && static_cast<double>(p.width) * p.height >= 4.0e6;
    std::mutex progressMutex;
    int lastPercent = -1;
    if (progress)
        ctx.progress = [&](const std::string& stage, double f) {
            const int pc = static_cast<int>(f * 100.0);
            std::lock_guard<std::mutex> lock(progressMutex);
            if (pc == lastPercent) return;
            lastPercent = pc;
            const int bar = pc / 4;
            std::fprintf(stderr, "\r%s [%-25s] %3d%%", stage.c_str(), std::string(bar, '#').c_str(), pc);
            std::fflush(stderr);
        };

    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const SimResult r = simulateField(p, &ctx);
    if (progress) std::fprintf(stderr, "\n");
    const auto t1 = Clock::now();
    writeSimulation(r, o.common.outdir, o.name, o.bitpix);
    std::vector<std::string> calibration;
    if (o.raw) calibration = writeCalibrationFrames(p, o.common.outdir, o.name, o.rawCount, o.bitpix, &ctx);
    const auto t2 = Clock::now();
    const double simS = std::chrono::duration<double>(t1 - t0).count();
    const double writeS = std::chrono::duration<double>(t2 - t1).count();

    if (o.common.verbosity >= 1) {
        const std::string base = (o.common.outdir.empty() ? std::string(".") : o.common.outdir) + "/" + o.name;
        std::printf("wrote %s.fits (%d x %d, BITPIX %s, %d stars, %d galaxies, seed %llu)\n", base.c_str(), p.width,
                    p.height, o.bitpix == -32 ? "-32" : "16 unsigned", p.stars, p.galaxies,
                    static_cast<unsigned long long>(p.seed));
        std::printf("wrote %s.truth.fits (%zu rows), %s.ref.fits (%zu rows)\n", base.c_str(), r.truth.rows(),
                    base.c_str(), r.reference.rows());
        if (!calibration.empty())
            std::printf("wrote %zu calibration frames (%d bias, %d dark, %d flat): %s ... %s\n", calibration.size(),
                        o.rawCount, o.rawCount, o.rawCount, calibration.front().c_str(), calibration.back().c_str());
        if (p.cosmicRays > 0) std::printf("wrote %s.crmask.fits (cosmic-ray truth)\n", base.c_str());
        std::printf("time: simulate %.2f s, write %.2f s, total %.2f s (%d threads)\n", simS, writeS, simS + writeS,
                    ctx.threadCount());
    }
    if (o.common.verbosity >= 2) {
        std::printf("true zero point %.4f, FWHM %.2f px (corner factor %.2f), sky %.1f ADU, %s WCS\n", p.zeroPoint,
                    p.fwhm, p.fwhmCornerFactor, p.sky,
                    !p.writeWcs ? "no" : (p.wcsOffset != 0 || p.wcsRotation != 0 || p.wcsScaleError != 0) ? "wrong" : "true");
    }
    return 0;
}

} // namespace

Command registerSimulate(CLI::App& app) {
    auto o = std::make_shared<SimulateOptions>();
    auto* sub = app.add_subcommand("simulate",
                                   "Simulate a star field with known truth: NAME.fits, NAME.truth.fits, NAME.ref.fits");
    sub->footer("Order of precedence: defaults < --config FILE.json < explicit options < --set KEY=VALUE.\n"
                "Every parameter (see --dump-config) can be set with --set, e.g. --set fwhmCornerFactor=1.3.");
    addCommonOptions(*sub, o->common);
    std::vector<const CLI::Option*> given;
    sub->add_option("--size", o->size, "Frame size WIDTHxHEIGHT in pixels (e.g. 4096x4096)");
    given.push_back(sub->add_option("--stars", o->stars, "Number of stars")->check(CLI::NonNegativeNumber));
    given.push_back(sub->add_option("--seed", o->seed, "Random seed (same seed: bitwise identical output)"));
    given.push_back(sub->add_option("--fwhm", o->fwhm, "PSF FWHM at the frame centre (px)")->check(CLI::PositiveNumber));
    given.push_back(sub->add_option("--fwhm-corner", o->fwhmCorner, "FWHM(corner) / FWHM(centre)"));
    given.push_back(sub->add_option("--psf", o->psf, "PSF model")->check(CLI::IsMember({"moffat", "gaussian"})));
    given.push_back(sub->add_option("--galaxies", o->galaxies, "Number of galaxies")->check(CLI::NonNegativeNumber));
    given.push_back(sub->add_option("--sky", o->sky, "Sky level at the centre (ADU)"));
    given.push_back(sub->add_option("--zp", o->zeroPoint, "True zero point (mag = -2.5 log10(ADU) + ZP)"));
    given.push_back(sub->add_option("--ref-mag-limit", o->refMagLimit, "Reference catalog limiting magnitude"));
    given.push_back(sub->add_option("--ref-margin", o->refMargin, "Reference catalog margin around the frame (deg)"));
    sub->add_option("--name", o->name, "Output file stem")->capture_default_str();
    given.push_back(
        sub->add_option("--bitpix", o->bitpix,
                        "Image BITPIX: 16 (unsigned, BZERO 32768) or -32 (float); --mosaic: default 16")
            ->check(CLI::IsMember({16, -32}))
            ->capture_default_str());
    sub->add_flag("--no-noise", o->noNoise, "No photon or read noise");
    given.push_back(sub->add_option("--wcs-offset", o->wcsOffset, "Header WCS centre wrong by this much (arcmin)"));
    given.push_back(sub->add_option("--wcs-rotation", o->wcsRotation, "Header WCS rotated by this much (deg)"));
    given.push_back(sub->add_option("--wcs-scale-error", o->wcsScaleError, "Header WCS scale wrong by this fraction"));
    sub->add_flag("--no-wcs", o->noWcs, "No WCS in the header (only RA/DEC pointing keywords)");
    sub->add_option("--set", o->sets, "Set any parameter: KEY=VALUE (JSON value), repeatable");
    sub->add_flag("--raw", o->raw,
                  "Raw camera frame (bias pattern, overscan, dark current, vignetted flat; see docs/CLI.md) and "
                  "NAME.bias_NN/.dark_NN/.flat_NN.fits calibration frames of the same detector");
    sub->add_option("--raw-count", o->rawCount, "Calibration frames of each kind with --raw")
        ->check(CLI::Range(1, 999))
        ->capture_default_str();
    sub->add_option("--series", o->series,
                    "A night of N exposures of the field: NAME_0001.fits ... with truths and NAME.series.json "
                    "(jitter, airmass, clouds, seeing, scintillation, a transit and a sinusoidal variable)")
        ->check(CLI::Range(1, 100000));
    sub->add_option(
        "--series-set", o->seriesSets,
        "Set a series parameter KEY=VALUE (cadence, airmassStart, airmassEnd, extinction, colourExtinction, "
        "transparency, seeing, jitter, telescopeDiameter, transitDepth, transitDuration, transitMid, "
        "transitSnr, sineAmplitude, sinePeriod, sineSnr), repeatable");
    sub->add_option(
           "--mosaic", o->mosaic,
           "One exposure of a mosaic camera with N CCDs: NAME.fits (an image extension per CCD, each with "
           "its own WCS, gain and ZP offset), NAME.ref.fits, NAME.truth.fits and NAME.mosaic.json; --size "
           "is the CCD size (default 2048x4096), --stars per CCD")
        ->check(CLI::Range(1, 999));
    sub->add_option(
        "--mosaic-set", o->mosaicSets,
        "Set a mosaic parameter KEY=VALUE (columns, gapPx, gainSpread, zpSpread, rotationSpreadDeg, "
        "badCcd, badCcdOffset, compressed=[1,2], tableExtension), repeatable");
    sub->add_flag("--dump-config", o->dumpConfig, "Print the resolved parameters as JSON and exit");
    return {sub, [o, given] { return runSimulate(*o, given); }};
}

} // namespace gpuphot::cli
