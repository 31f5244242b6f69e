#include "core/stages/prepare/bayer.hpp"

#include <cctype>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "core/model/frame.hpp"
#include "core/model/header.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {
namespace {

std::string upperTrimmed(std::string_view text) {
    std::string s;
    for (char c : text)
        if (!std::isspace(static_cast<unsigned char>(c)))
            s += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

CfaColour colourOf(char c) {
    return c == 'R' ? CfaColour::Red : (c == 'G' ? CfaColour::Green : CfaColour::Blue);
}

// File offsets (dx, dy) within a 2x2 cell of the pixels an output uses. Green: lower file row first.
std::vector<std::pair<int, int>> cellPixels(const CfaLayout& layout, CfaOutput output, int height) {
    std::vector<std::pair<int, int>> out;
    for (int dy = 0; dy < 2; ++dy)
        for (int dx = 0; dx < 2; ++dx) {
            const CfaColour c = layout.colourAt(dx, dy, height);
            const bool use = output == CfaOutput::Luminance ||
                             (output == CfaOutput::Red && c == CfaColour::Red) ||
                             (output == CfaOutput::Green && c == CfaColour::Green) ||
                             (output == CfaOutput::Blue && c == CfaColour::Blue);
            if (use) out.emplace_back(dx, dy);
        }
    return out;
}

// 2^(p+q-1) for the SIP rescaling.
double sipScale(int p, int q) {
    return std::ldexp(1.0, p + q - 1);
}

} // namespace

CfaColour CfaLayout::colourAt(int x, int y, int height) const {
    const int py = topDown ? y : (height - 1 - y);
    const int i = ((py + yOffset) % 2 + 2) % 2, j = ((x + xOffset) % 2 + 2) % 2;
    return colourOf(pattern[static_cast<std::size_t>(2 * i + j)]);
}

std::optional<std::string> normaliseCfaPattern(std::string_view text) {
    const std::string s = upperTrimmed(text);
    if (s == "RGGB" || s == "BGGR" || s == "GRBG" || s == "GBRG") return s;
    return std::nullopt;
}

CfaOutput parseCfaOutput(const std::string& text) {
    const std::string s = upperTrimmed(text);
    if (s == "LUM" || s == "LUMINANCE" || s == "L") return CfaOutput::Luminance;
    if (s == "R" || s == "RED") return CfaOutput::Red;
    if (s == "G" || s == "GREEN") return CfaOutput::Green;
    if (s == "B" || s == "BLUE") return CfaOutput::Blue;
    throw InvalidInput("colour-filter array: unknown output '" + text + "' (expected lum, r, g or b)");
}

std::optional<CfaLayout> cfaLayoutFromHeader(const Header& header, const BayerParams& params) {
    CfaLayout layout;
    if (params.pattern.empty() && header.has("CFAOUT")) return std::nullopt; // binned already
    if (!params.pattern.empty()) {
        auto p = normaliseCfaPattern(params.pattern);
        if (!p)
            throw InvalidInput("colour-filter array: unknown pattern '" + params.pattern +
                               "' (expected RGGB, BGGR, GRBG or GBRG)");
        layout.pattern = *p;
    } else {
        std::optional<std::string> p;
        if (auto v = header.getString("BAYERPAT")) {
            p = normaliseCfaPattern(*v);
            if (!p)
                throw InvalidInput("colour-filter array: BAYERPAT = '" + *v +
                                   "' is not RGGB, BGGR, GRBG or GBRG");
        } else if (auto f = header.getString("FILTER")) {
            p = normaliseCfaPattern(*f);
        }
        if (!p) return std::nullopt;
        layout.pattern = *p;
    }
    const std::string order = upperTrimmed(params.rowOrder);
    if (order == "TOP-DOWN")
        layout.topDown = true;
    else if (order == "BOTTOM-UP")
        layout.topDown = false;
    else if (order == "AUTO" || order.empty()) {
        if (auto r = header.getString("ROWORDER")) {
            const std::string v = upperTrimmed(*r);
            if (v == "TOP-DOWN")
                layout.topDown = true;
            else if (v != "BOTTOM-UP")
                throw InvalidInput("colour-filter array: ROWORDER = '" + *r +
                                   "' (expected TOP-DOWN or BOTTOM-UP)");
        }
    } else {
        throw InvalidInput("colour-filter array: unknown row order '" + params.rowOrder +
                           "' (expected auto, bottom-up or top-down)");
    }
    layout.xOffset =
        params.xOffset >= 0 ? params.xOffset : static_cast<int>(header.getInt("XBAYROFF").value_or(0));
    layout.yOffset =
        params.yOffset >= 0 ? params.yOffset : static_cast<int>(header.getInt("YBAYROFF").value_or(0));
    return layout;
}

Image<float> cfaSuperPixels(const ImageView& pixels, const CfaLayout& layout, CfaOutput output,
                            bool luminanceMean, RunContext& ctx) {
    if (pixels.width < 2 || pixels.height < 2)
        throw InvalidInput("colour-filter array: image " + std::to_string(pixels.width) + " x " +
                           std::to_string(pixels.height) + " is smaller than one 2x2 cell");
    // CUDA backend: kernels/prepare/bayer.cu, bitwise equal.
    if (ctx.backend == Backend::Cuda && cudaStages().cfaSuperPixels)
        return cudaStages().cfaSuperPixels(pixels, layout, output, luminanceMean, ctx);
    const int w = pixels.width / 2, h = pixels.height / 2;
    const auto use = cellPixels(layout, output, pixels.height);
    Image<float> out(w, h, Image<float>::NoInit{});
#pragma omp parallel for schedule(static) num_threads(ctx.threadCount())
    for (int y = 0; y < h; ++y) {
        const float* r0 = pixels.row(2 * y);
        const float* r1 = pixels.row(2 * y + 1);
        float* o = out.row(y);
        if (output == CfaOutput::Luminance) {
            for (int x = 0; x < w; ++x) {
                const float s = (r0[2 * x] + r0[2 * x + 1]) + (r1[2 * x] + r1[2 * x + 1]);
                o[x] = luminanceMean ? 0.25f * s : s;
            }
        } else if (output == CfaOutput::Green) {
            const float* ra = use[0].second ? r1 : r0;
            const float* rb = use[1].second ? r1 : r0;
            const int da = use[0].first, db = use[1].first;
            for (int x = 0; x < w; ++x)
                o[x] = 0.5f * (ra[2 * x + da] + rb[2 * x + db]);
        } else {
            const float* ra = use[0].second ? r1 : r0;
            const int da = use[0].first;
            for (int x = 0; x < w; ++x)
                o[x] = ra[2 * x + da];
        }
    }
    return out;
}

Image<std::uint8_t> cfaSuperPixelMask(const MaskView& mask, const CfaLayout& layout, CfaOutput output,
                                      int width, int height) {
    const int w = width / 2, h = height / 2;
    Image<std::uint8_t> out(w, h, std::uint8_t{0});
    if (mask.empty()) return out;
    if (mask.width != width || mask.height != height)
        throw InvalidInput("colour-filter array: mask size differs from the image");
    const auto use = cellPixels(layout, output, height);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            std::uint8_t m = 0;
            for (auto [dx, dy] : use)
                m |= mask(2 * x + dx, 2 * y + dy);
            out(x, y) = m;
        }
    return out;
}

void binWcsHeader2x2(Header& header) {
    static const std::regex crpix(R"(CRPIX[12][A-Z]?)"), cd(R"(CD[12]_[12][A-Z]?)"),
        cdelt(R"(CDELT([12])([A-Z]?))"), sip(R"((A|B|AP|BP)_([0-9])_([0-9]))"), dmax(R"((A|B)_DMAX)");
    // Alternate descriptions that use CD: their CDELT (if any) is ignored by WCS readers, keep it as is.
    auto hasCd = [&](const std::string& alt) {
        for (const char* k : {"CD1_1", "CD1_2", "CD2_1", "CD2_2"})
            if (header.has(std::string(k) + alt)) return true;
        return false;
    };
    std::vector<std::pair<std::string, double>> updates;
    for (const HeaderCard& c : header.cards()) {
        std::smatch m;
        const auto v = parseFitsNumber(c.value);
        if (!v) continue;
        if (std::regex_match(c.key, crpix))
            updates.emplace_back(c.key, (*v + 0.5) / 2.0);
        else if (std::regex_match(c.key, cd))
            updates.emplace_back(c.key, *v * 2.0);
        else if (std::regex_match(c.key, m, cdelt) && !hasCd(m[2].str()))
            updates.emplace_back(c.key, *v * 2.0);
        else if (std::regex_match(c.key, m, sip))
            updates.emplace_back(c.key, *v * sipScale(std::stoi(m[2].str()), std::stoi(m[3].str())));
        else if (std::regex_match(c.key, dmax))
            updates.emplace_back(c.key, *v / 2.0);
    }
    for (const auto& [key, value] : updates) {
        const HeaderCard* old = header.find(key);
        const std::string comment = old ? old->comment : std::string();
        header.set(key, value, comment);
    }
}

TanSip binTanSip2x2(const TanSip& in) {
    TanSip out = in;
    for (int i = 0; i < 2; ++i) {
        out.crpix[i] = (in.crpix[i] + 0.5) / 2.0;
        for (int j = 0; j < 2; ++j)
            out.cd[i][j] = in.cd[i][j] * 2.0;
    }
    auto scale = [](std::vector<double>& c, int order) {
        for (int p = 0; p <= order; ++p)
            for (int q = 0; q <= order; ++q)
                if (static_cast<std::size_t>(p * (order + 1) + q) < c.size())
                    c[p * (order + 1) + q] *= sipScale(p, q);
    };
    scale(out.a, in.sipOrder);
    scale(out.b, in.sipOrder);
    scale(out.ap, in.sipInvOrder);
    scale(out.bp, in.sipInvOrder);
    return out;
}

Frame binCfaFrame(const Frame& in, const BayerParams& params, RunContext& ctx) {
    const std::string where = in.path.empty() ? std::string("frame") : in.path;
    const auto layout = cfaLayoutFromHeader(in.header, params);
    if (!layout)
        throw InvalidInput(where +
                           ": no colour-filter-array pattern (BAYERPAT or FILTER = RGGB/BGGR/GRBG/GBRG)");
    const CfaOutput output = parseCfaOutput(params.output);

    Frame out;
    out.path = in.path;
    out.hdu = in.hdu;
    out.extname = in.extname;
    out.bitpix = -32;
    out.pixels = cfaSuperPixels(in.view(), *layout, output, params.luminanceMean, ctx);
    out.mask = cfaSuperPixelMask(in.maskView(), *layout, output, in.width(), in.height());

    // Instrument: see bayer.hpp.
    double gainFactor = 1.0, noiseFactor = 1.0, satFactor = 1.0;
    if (output == CfaOutput::Luminance) {
        noiseFactor = 2.0;
        if (params.luminanceMean)
            gainFactor = 4.0;
        else
            satFactor = 4.0;
    } else if (output == CfaOutput::Green) {
        gainFactor = 2.0;
        noiseFactor = std::sqrt(2.0);
    }
    out.instrument = in.instrument;
    out.instrument.gain *= gainFactor;
    out.instrument.readNoise *= noiseFactor;
    out.instrument.saturation *= satFactor;

    out.header = in.header;
    binWcsHeader2x2(out.header);
    const std::string history =
        "gpuphot: 2x2 CFA super-pixels (" + layout->pattern + ", " +
        (layout->topDown ? "top-down" : "bottom-up") + "), output " + params.output +
        (output == CfaOutput::Luminance ? (params.luminanceMean ? " mean" : " sum") : "");
    if (in.instrument.gainSource != "default")
        out.header.set("GAIN", out.instrument.gain, "e-/ADU, after CFA binning");
    if (in.instrument.readNoiseSource != "default")
        out.header.set("RDNOISE", out.instrument.readNoise, "e-, after CFA binning");
    if (in.instrument.saturationSource != "default" && std::isfinite(out.instrument.saturation))
        out.header.set("SATURATE", out.instrument.saturation, "ADU, after CFA binning");
    for (const char* k : {"BAYERPAT", "XBAYROFF", "YBAYROFF"})
        out.header.remove(k);
    out.header.set("CFAOUT", params.output, "CFA super-pixel output (lum, r, g, b)");
    out.header.addHistory(history);

    if (in.wcs) {
        Header wh = in.wcs->toHeader();
        binWcsHeader2x2(wh);
        out.wcs = std::make_shared<const Wcs>(Wcs::fromHeader(wh));
    }
    out.wcsProblem = in.wcsProblem;
    return out;
}

} // namespace gpuphot
