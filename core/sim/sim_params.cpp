#include "core/sim/sim_params.hpp"

#include <cmath>
#include <set>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

// Calls f(name, member) for every field, in declaration order (one list for to_json and from_json).
template <class P, class F> void visitFields(P& p, F&& f) {
    f("width", p.width);
    f("height", p.height);
    f("stars", p.stars);
    f("seed", p.seed);
    f("fieldSeed", p.fieldSeed);
    f("magBright", p.magBright);
    f("magFaint", p.magFaint);
    f("lfSlope", p.lfSlope);
    f("zeroPoint", p.zeroPoint);
    f("colourMean", p.colourMean);
    f("colourSigma", p.colourSigma);
    f("colourTerm", p.colourTerm);
    f("clusters", p.clusters);
    f("clusterRadius", p.clusterRadius);
    f("clusterFraction", p.clusterFraction);
    f("psf", p.psf);
    f("moffatBeta", p.moffatBeta);
    f("fwhm", p.fwhm);
    f("fwhmCornerFactor", p.fwhmCornerFactor);
    f("fwhmGradientX", p.fwhmGradientX);
    f("fwhmGradientY", p.fwhmGradientY);
    f("ellipticity", p.ellipticity);
    f("ellipticityCorner", p.ellipticityCorner);
    f("psfAngle", p.psfAngle);
    f("psfAngleRadial", p.psfAngleRadial);
    f("renderThreshold", p.renderThreshold);
    f("maxStampRadius", p.maxStampRadius);
    f("galaxies", p.galaxies);
    f("galaxyMagBright", p.galaxyMagBright);
    f("galaxyMagFaint", p.galaxyMagFaint);
    f("galaxyReMin", p.galaxyReMin);
    f("galaxyReMax", p.galaxyReMax);
    f("galaxySersicMin", p.galaxySersicMin);
    f("galaxySersicMax", p.galaxySersicMax);
    f("sky", p.sky);
    f("skyGradientX", p.skyGradientX);
    f("skyGradientY", p.skyGradientY);
    f("skyCorner", p.skyCorner);
    f("gain", p.gain);
    f("readNoise", p.readNoise);
    f("bias", p.bias);
    f("saturation", p.saturation);
    f("noise", p.noise);
    f("hotPixels", p.hotPixels);
    f("hotPixelMin", p.hotPixelMin);
    f("hotPixelMax", p.hotPixelMax);
    f("cosmicRays", p.cosmicRays);
    f("cosmicRayLengthMax", p.cosmicRayLengthMax);
    f("cosmicRayCharge", p.cosmicRayCharge);
    f("badColumns", p.badColumns);
    f("frameType", p.frameType);
    f("detectorSeed", p.detectorSeed);
    f("biasRowAmplitude", p.biasRowAmplitude);
    f("biasColumnAmplitude", p.biasColumnAmplitude);
    f("prescan", p.prescan);
    f("overscan", p.overscan);
    f("darkCurrent", p.darkCurrent);
    f("darkHotPixels", p.darkHotPixels);
    f("darkHotMin", p.darkHotMin);
    f("darkHotMax", p.darkHotMax);
    f("flatVignetting", p.flatVignetting);
    f("flatPixelSigma", p.flatPixelSigma);
    f("flatLevel", p.flatLevel);
    f("exptime", p.exptime);
    f("filter", p.filter);
    f("mjd", p.mjd);
    f("airmass", p.airmass);
    f("object", p.object);
    f("ra", p.ra);
    f("dec", p.dec);
    f("pixelScale", p.pixelScale);
    f("rotation", p.rotation);
    f("flipParity", p.flipParity);
    f("sipOrder", p.sipOrder);
    f("sipStrength", p.sipStrength);
    f("writeWcs", p.writeWcs);
    f("headerSip", p.headerSip);
    f("wcsOffset", p.wcsOffset);
    f("wcsOffsetAngle", p.wcsOffsetAngle);
    f("wcsRotation", p.wcsRotation);
    f("wcsScaleError", p.wcsScaleError);
    f("refMagLimit", p.refMagLimit);
    f("refMargin", p.refMargin);
    f("refMagErrFloor", p.refMagErrFloor);
    f("refMagErrAtLimit", p.refMagErrAtLimit);
    f("refPosErr", p.refPosErr);
    f("properMotions", p.properMotions);
    f("pmSigma", p.pmSigma);
    f("refEpoch", p.refEpoch);
    f("offsetX", p.offsetX);
    f("offsetY", p.offsetY);
    f("scintillation", p.scintillation);
    f("writeSite", p.writeSite);
    f("siteLatitude", p.siteLatitude);
    f("siteLongitude", p.siteLongitude);
    f("siteElevation", p.siteElevation);
}

void require(bool ok, const std::string& what) {
    if (!ok) throw InvalidInput("simulation parameters: " + what);
}

} // namespace

void validate(const SimParams& p) {
    require(p.width >= 8 && p.height >= 8, "width and height must be at least 8 px");
    require(static_cast<double>(p.width) * p.height <= 4.0e9, "frame larger than 4 gigapixels");
    require(p.stars >= 0 && p.galaxies >= 0 && p.clusters >= 0, "stars, galaxies and clusters must be >= 0");
    require(p.hotPixels >= 0 && p.cosmicRays >= 0 && p.badColumns >= 0, "defect counts must be >= 0");
    require(std::isfinite(p.magBright) && std::isfinite(p.magFaint) && p.magBright <= p.magFaint,
            "magBright must be <= magFaint");
    require(p.galaxyMagBright <= p.galaxyMagFaint, "galaxyMagBright must be <= galaxyMagFaint");
    require(std::isfinite(p.zeroPoint), "zeroPoint must be finite");
    require(p.colourSigma >= 0, "colourSigma must be >= 0");
    require(p.clusterRadius > 0 && p.clusterFraction >= 0 && p.clusterFraction <= 1,
            "clusterRadius must be > 0 and clusterFraction in [0, 1]");
    require(p.psf == "moffat" || p.psf == "gaussian", "psf must be \"moffat\" or \"gaussian\", not \"" + p.psf + "\"");
    require(p.moffatBeta > 1.05, "moffatBeta must be > 1.05");
    require(p.fwhm >= 0.5 && p.fwhm <= 100, "fwhm must be in [0.5, 100] px");
    require(p.fwhmCornerFactor > 0.1 && p.fwhmCornerFactor < 10, "fwhmCornerFactor must be in (0.1, 10)");
    require(std::fabs(p.fwhmGradientX) + std::fabs(p.fwhmGradientY) < 0.9, "|fwhmGradientX| + |fwhmGradientY| must be < 0.9");
    require(p.ellipticity >= 0 && p.ellipticity < 0.9 && p.ellipticityCorner >= 0 && p.ellipticityCorner < 0.9,
            "ellipticities must be in [0, 0.9)");
    require(p.renderThreshold > 0, "renderThreshold must be > 0");
    require(p.maxStampRadius >= 4, "maxStampRadius must be >= 4 px");
    require(p.galaxyReMin > 0 && p.galaxyReMin <= p.galaxyReMax, "galaxyReMin must be in (0, galaxyReMax]");
    require(p.galaxySersicMin >= 0.3 && p.galaxySersicMin <= p.galaxySersicMax && p.galaxySersicMax <= 8,
            "Sersic indices must satisfy 0.3 <= min <= max <= 8");
    require(std::isfinite(p.sky) && std::isfinite(p.bias), "sky and bias must be finite");
    require(p.gain > 0, "gain must be > 0 e-/ADU");
    require(p.readNoise >= 0, "readNoise must be >= 0 e-");
    require(p.hotPixelMin > 0 && p.hotPixelMin <= p.hotPixelMax, "hotPixelMin must be in (0, hotPixelMax]");
    require(p.cosmicRayLengthMax >= 1 && p.cosmicRayCharge > 0, "cosmic-ray length >= 1 px and charge > 0");
    require(p.exptime >= 0, "exptime must be >= 0 s");
    require(p.frameType == "light" || p.frameType == "bias" || p.frameType == "dark" || p.frameType == "flat",
            "frameType must be \"light\", \"bias\", \"dark\" or \"flat\", not \"" + p.frameType + "\"");
    require(p.biasRowAmplitude >= 0 && p.biasColumnAmplitude >= 0, "bias pattern amplitudes must be >= 0 ADU");
    require(p.prescan >= 0 && p.overscan >= 0 && p.prescan + p.overscan <= 4096,
            "prescan and overscan must be in [0, 4096] columns");
    require(p.darkCurrent >= 0 && p.darkHotPixels >= 0 && p.darkHotMin > 0 && p.darkHotMin <= p.darkHotMax,
            "darkCurrent >= 0, darkHotPixels >= 0 and 0 < darkHotMin <= darkHotMax");
    require(p.flatVignetting >= 0 && p.flatVignetting < 0.9, "flatVignetting must be in [0, 0.9)");
    require(p.flatPixelSigma >= 0 && p.flatPixelSigma < 0.2, "flatPixelSigma must be in [0, 0.2)");
    require(p.flatLevel > 0, "flatLevel must be > 0 ADU");
    require(p.dec >= -90 && p.dec <= 90, "dec must be in [-90, 90] deg");
    require(p.pixelScale > 0, "pixelScale must be > 0 arcsec/px");
    require(p.sipOrder == 0 || p.sipOrder == 2 || p.sipOrder == 3, "sipOrder must be 0, 2 or 3");
    require(p.sipStrength >= 0, "sipStrength must be >= 0 px");
    require(p.wcsScaleError > -0.9, "wcsScaleError must be > -0.9");
    require(p.refMargin >= 0 && p.refMargin <= 30, "refMargin must be in [0, 30] deg");
    require(p.refMagErrFloor >= 0 && p.refMagErrAtLimit >= 0 && p.refPosErr >= 0 && p.pmSigma >= 0,
            "reference errors must be >= 0");
    require(std::isfinite(p.offsetX) && std::isfinite(p.offsetY), "offsetX and offsetY must be finite");
    require(p.scintillation >= 0 && p.scintillation < 0.5, "scintillation must be in [0, 0.5)");
    require(p.siteLatitude >= -90 && p.siteLatitude <= 90 && std::fabs(p.siteLongitude) <= 360 &&
                std::isfinite(p.siteElevation), "site latitude must be in [-90, 90] deg, longitude in [-360, 360]");
}

void to_json(nlohmann::json& j, const SimParams& p) {
    j = nlohmann::json::object();
    visitFields(p, [&j](const char* name, const auto& value) { j[name] = value; });
}

void from_json(const nlohmann::json& j, SimParams& p) {
    if (!j.is_object()) throw InvalidInput("simulation parameters: expected a JSON object");
    std::set<std::string> known;
    visitFields(p, [&](const char* name, auto& value) {
        known.insert(name);
        const auto it = j.find(name);
        if (it == j.end()) return;
        try {
            using T = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<T, bool>) {
                if (!it->is_boolean()) throw InvalidInput("expected true or false");
            } else if constexpr (std::is_integral_v<T>) {
                if (!it->is_number_integer()) throw InvalidInput("expected an integer");
                if constexpr (std::is_unsigned_v<T>)
                    if (it->is_number_integer() && !it->is_number_unsigned())
                        throw InvalidInput("expected a non-negative integer");
            } else if constexpr (std::is_floating_point_v<T>) {
                if (!it->is_number()) throw InvalidInput("expected a number");
            } else {
                if (!it->is_string()) throw InvalidInput("expected a string");
            }
            it->get_to(value);
        } catch (const InvalidInput& e) {
            throw InvalidInput(std::string("simulation parameters: \"") + name + "\": " + e.what());
        }
    });
    for (const auto& [key, value] : j.items())
        if (!known.count(key)) throw InvalidInput("simulation parameters: unknown key \"" + key + "\"");
}

} // namespace gpuphot
