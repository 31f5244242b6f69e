// gpuphot info FILE: the HDUs of a FITS file and, for the selected image, its size, pixel statistics,
// instrument facts (with the keyword each came from) and WCS. --json for machine-readable output.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/commands.hpp"
#include "core/io/fits_image.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot::cli {
namespace {

struct InfoOptions {
    std::string file;
    std::string hdu;
    std::string config;
    bool json = false;
    int verbosity = 1;
    std::optional<double> gain, readNoise, saturation, exptime;
};

struct PixelStats {
    std::size_t finite = 0, nonFinite = 0, bad = 0, saturated = 0;
    double min = std::nan(""), max = std::nan(""), mean = std::nan(""), median = std::nan("");
};

// Order-preserving map of a float onto an unsigned integer (for exact selection by histogram).
std::uint32_t floatKey(float v) {
    std::uint32_t b = 0;
    std::memcpy(&b, &v, 4);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

float keyFloat(std::uint32_t k) {
    const std::uint32_t b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float v = 0;
    std::memcpy(&v, &b, 4);
    return v;
}

// The finite value of 0-based rank `rank` in sorted order: two histogram passes over the high and low
// 16 bits of the keys (exact, no copy of the frame).
float selectRank(const ImageView& img, std::size_t rank) {
    std::vector<std::size_t> hist(65536);
    auto pass = [&](auto&& visit) {
        for (int y = 0; y < img.height; ++y) {
            const float* r = img.row(y);
            for (int x = 0; x < img.width; ++x)
                if (std::isfinite(r[x])) visit(floatKey(r[x]));
        }
    };
    auto find = [&](std::size_t& k) {
        std::uint32_t bin = 0;
        for (; bin < 65536; ++bin) {
            if (k < hist[bin]) break;
            k -= hist[bin];
        }
        return bin;
    };
    pass([&](std::uint32_t key) { ++hist[key >> 16]; });
    const std::uint32_t high = find(rank);
    std::fill(hist.begin(), hist.end(), 0);
    pass([&](std::uint32_t key) {
        if ((key >> 16) == high) ++hist[key & 0xffffu];
    });
    const std::uint32_t low = find(rank);
    return keyFloat((high << 16) | low);
}

PixelStats pixelStats(const Frame& fr) {
    PixelStats s;
    double sum = 0.0;
    float lo = INFINITY, hi = -INFINITY;
    for (int y = 0; y < fr.height(); ++y) {
        const float* p = fr.pixels.row(y);
        const std::uint8_t* m = fr.mask.row(y);
        for (int x = 0; x < fr.width(); ++x) {
            if (m[x] & MaskBad) ++s.bad;
            if (m[x] & MaskSaturated) ++s.saturated;
            if (!std::isfinite(p[x])) {
                ++s.nonFinite;
                continue;
            }
            ++s.finite;
            sum += p[x];
            lo = std::min(lo, p[x]);
            hi = std::max(hi, p[x]);
        }
    }
    if (s.finite == 0) return s;
    s.min = lo;
    s.max = hi;
    s.mean = sum / static_cast<double>(s.finite);
    const std::size_t n = s.finite;
    s.median =
        n % 2 ? selectRank(fr.view(), n / 2)
              : 0.5 * (static_cast<double>(selectRank(fr.view(), n / 2 - 1)) + selectRank(fr.view(), n / 2));
    return s;
}

std::string bitpixLabel(int equivBitpix) {
    switch (equivBitpix) {
    case 10:
        return "8 (signed)";
    case 20:
        return "16 (unsigned)";
    case 40:
        return "32 (unsigned)";
    case 80:
        return "64 (unsigned)";
    }
    return std::to_string(equivBitpix);
}

std::string axesLabel(const HduSummary& h) {
    if (h.axes.empty()) return h.type == "IMAGE" ? "no data" : "-";
    std::string s;
    if (h.type != "IMAGE")
        return std::to_string(h.axes[0]) + " cols x " + std::to_string(h.axes.size() > 1 ? h.axes[1] : 0) +
               " rows";
    for (std::size_t i = 0; i < h.axes.size(); ++i)
        s += (i ? " x " : "") + std::to_string(h.axes[i]);
    return s;
}

bool isImageWithData(const HduSummary& h) {
    if (h.type != "IMAGE" || h.axes.empty()) return false;
    for (long long a : h.axes)
        if (a <= 0) return false;
    return true;
}

std::string fmt(double v, const char* f = "%.6g") {
    if (std::isnan(v)) return "n/a";
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

nlohmann::json numberOrNull(double v) {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json instrumentJson(const Instrument& i) {
    using nlohmann::json;
    return json{{"gain", {{"value", i.gain}, {"unit", "e-/ADU"}, {"source", i.gainSource}}},
                {"readNoise", {{"value", i.readNoise}, {"unit", "e-"}, {"source", i.readNoiseSource}}},
                {"saturation",
                 {{"value", numberOrNull(i.saturation)}, {"unit", "ADU"}, {"source", i.saturationSource}}},
                {"exptime", {{"value", numberOrNull(i.exptime)}, {"unit", "s"}, {"source", i.exptimeSource}}},
                {"filter", i.filter},
                {"object", i.object},
                {"dateObs", i.dateObs},
                {"mjdStart", numberOrNull(i.mjdStart)},
                {"mjdMid", numberOrNull(i.mjdMid)},
                {"airmass", numberOrNull(i.airmass)}};
}

int run(const InfoOptions& o) {
    FrameReadOptions read;
    read.hdu = o.hdu;
    if (!o.config.empty()) {
        const PipelineConfig cfg = loadPipelineConfig(o.config);
        read.keywords = cfg.keywords;
        read.overrides = cfg.instrument;
    }
    if (o.gain) read.overrides.gain = o.gain;
    if (o.readNoise) read.overrides.readNoise = o.readNoise;
    if (o.saturation) read.overrides.saturation = o.saturation;
    if (o.exptime) read.overrides.exptime = o.exptime;

    const std::vector<HduSummary> hdus = listHdus(o.file);
    const bool anyImage = std::any_of(hdus.begin(), hdus.end(), isImageWithData);
    std::optional<Frame> frame;
    if (!o.hdu.empty() || anyImage) frame = readFrame(o.file, read);
    std::optional<PixelStats> stats;
    if (frame) stats = pixelStats(*frame);

    if (o.json) {
        using nlohmann::json;
        json j;
        j["file"] = o.file;
        json list = json::array();
        for (const auto& h : hdus)
            list.push_back({{"index", h.index},
                            {"type", h.type},
                            {"extname", h.extname},
                            {"bitpix", h.bitpix},
                            {"axes", h.axes},
                            {"compressed", h.compressed}});
        j["hdus"] = list;
        if (frame) {
            const Frame& f = *frame;
            json img{{"hdu", f.hdu},
                     {"extname", f.extname},
                     {"width", f.width()},
                     {"height", f.height()},
                     {"bitpix", f.bitpix}};
            img["stats"] = {{"min", numberOrNull(stats->min)},
                            {"max", numberOrNull(stats->max)},
                            {"median", numberOrNull(stats->median)},
                            {"mean", numberOrNull(stats->mean)},
                            {"finite", stats->finite},
                            {"nonFinite", stats->nonFinite},
                            {"blank", stats->bad},
                            {"saturated", stats->saturated}};
            img["instrument"] = instrumentJson(f.instrument);
            if (f.wcs)
                img["wcs"] = {{"projection", f.wcs->projectionCode()},
                              {"summary", f.wcs->summary(f.width(), f.height())},
                              {"pixelScaleArcsec", numberOrNull(f.wcs->pixelScaleArcsec(
                                                       0.5 * (f.width() - 1), 0.5 * (f.height() - 1)))}};
            else
                img["wcs"] = {{"problem", f.wcsProblem.empty() ? "no WCS keywords" : f.wcsProblem}};
            j["image"] = img;
        } else {
            j["image"] = nullptr;
        }
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }

    if (o.verbosity == 0) {
        if (frame)
            std::printf("%s: HDU %d%s %d x %d BITPIX %d, WCS %s\n", o.file.c_str(), frame->hdu,
                        frame->extname.empty() ? "" : (" (" + frame->extname + ")").c_str(), frame->width(),
                        frame->height(), frame->bitpix,
                        frame->wcs ? frame->wcs->projectionCode().c_str() : "none");
        else
            std::printf("%s: no image HDU with data\n", o.file.c_str());
        return 0;
    }

    std::printf("%s: %zu HDU%s (numbered from 0, as --hdu takes them)\n", o.file.c_str(), hdus.size(),
                hdus.size() == 1 ? "" : "s");
    std::printf("  %-4s %-9s %-16s %-14s %-22s %s\n", "HDU", "TYPE", "EXTNAME", "BITPIX", "SIZE",
                "COMPRESSED");
    for (const auto& h : hdus)
        std::printf("  %-4d %-9s %-16s %-14s %-22s %s\n", h.index, h.type.c_str(),
                    h.extname.empty() ? "-" : h.extname.c_str(),
                    // an image HDU without data (the empty primary of a .fz file) has no pixel type
                    h.type == "IMAGE" && !h.axes.empty() ? bitpixLabel(h.bitpix).c_str() : "-",
                    axesLabel(h).c_str(), h.compressed ? "yes (tiles)" : "no");
    if (!frame) {
        std::printf("\nno image HDU with data\n");
        return 0;
    }
    const Frame& f = *frame;
    const PixelStats& s = *stats;
    std::printf("\nimage      HDU %d%s: %d x %d pixels, BITPIX %d\n", f.hdu,
                f.extname.empty() ? "" : (" (" + f.extname + ")").c_str(), f.width(), f.height(), f.bitpix);
    std::printf("pixels     min %s  max %s  median %s  mean %s  (over %zu finite pixels)\n",
                fmt(s.min).c_str(), fmt(s.max).c_str(), fmt(s.median).c_str(), fmt(s.mean).c_str(), s.finite);
    std::printf("masked     %zu NaN/Inf (of which %zu BLANK), %zu saturated\n", s.nonFinite, s.bad,
                s.saturated);
    const Instrument& i = f.instrument;
    std::printf("instrument\n");
    std::printf("  gain         %-22s [%s]\n", (fmt(i.gain) + " e-/ADU").c_str(), i.gainSource.c_str());
    std::printf("  read noise   %-22s [%s]\n", (fmt(i.readNoise) + " e-").c_str(), i.readNoiseSource.c_str());
    std::printf("  saturation   %-22s [%s]\n",
                std::isinf(i.saturation) ? "none" : (fmt(i.saturation) + " ADU").c_str(),
                i.saturationSource.c_str());
    std::printf("  exptime      %-22s [%s]\n",
                std::isnan(i.exptime) ? "unknown" : (fmt(i.exptime) + " s").c_str(), i.exptimeSource.c_str());
    std::printf("  filter       %s\n", i.filter.empty() ? "-" : i.filter.c_str());
    std::printf("  object       %s\n", i.object.empty() ? "-" : i.object.c_str());
    std::printf("  date-obs     %s\n", i.dateObs.empty() ? "-" : i.dateObs.c_str());
    std::printf("  mjd          start %s  mid %s\n", fmt(i.mjdStart, "%.6f").c_str(),
                fmt(i.mjdMid, "%.6f").c_str());
    std::printf("  airmass      %s\n", fmt(i.airmass, "%.4f").c_str());
    if (f.wcs)
        std::printf("wcs        %s\n", f.wcs->summary(f.width(), f.height()).c_str());
    else
        std::printf("wcs        none: %s\n", f.wcsProblem.empty() ? "no WCS keywords" : f.wcsProblem.c_str());
    if (o.verbosity >= 2) {
        std::printf("\nheader (%zu cards)\n", f.header.size());
        for (const auto& c : f.header.cards())
            std::printf("%s\n", Header::formatCard(c).c_str());
    }
    return 0;
}

} // namespace

Command registerInfo(CLI::App& app) {
    auto o = std::make_shared<InfoOptions>();
    auto* sub = app.add_subcommand(
        "info", "Describe a FITS file: HDUs, image size, pixel statistics, instrument, WCS");
    sub->add_option("file", o->file, "FITS file (also .fz, .gz, file.fits[EXT])")->required();
    sub->add_option("--hdu", o->hdu, "HDU by 0-based number or EXTNAME (default: first image with data)");
    sub->add_flag("--json", o->json, "Machine-readable output (JSON on stdout)");
    sub->add_option("--config", o->config, "JSON configuration (its instrument keyword map and overrides)");
    sub->add_option("--gain", o->gain, "Gain in e-/ADU (overrides the header)");
    sub->add_option("--rdnoise", o->readNoise, "Read noise in e- (overrides the header)");
    sub->add_option("--saturation", o->saturation, "Saturation level in ADU (overrides the header)");
    sub->add_option("--exptime", o->exptime, "Exposure time in s (overrides the header)");
    sub->add_flag_callback(
        "-v,--verbose", [o] { o->verbosity = 2; }, "Also print the header cards");
    sub->add_flag_callback(
        "-q,--quiet", [o] { o->verbosity = 0; }, "One line per file");
    return {sub, [o] { return run(*o); }};
}

} // namespace gpuphot::cli
