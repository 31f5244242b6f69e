#include "core/pipeline/exposure.hpp"

#include "core/util/json_number.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <strings.h>
#include <thread>

#include "core/catalog/table.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/model/flags.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/report.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/pipeline/sextractor_catalog.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace fs = std::filesystem;

std::string outputToken(int hdu, const std::string& extname, bool nameRepeats) {
    if (extname.empty()) return "hdu" + std::to_string(hdu);
    std::string t = extname;
    for (char& c : t)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) c = '_';
    return nameRepeats ? t + "_hdu" + std::to_string(hdu) : t;
}

std::vector<ExposureExtension> imageExtensions(const std::string& path) {
    std::vector<ExposureExtension> out;
    for (const HduSummary& s : listHdus(path)) {
        if (s.type != "IMAGE" || s.axes.size() != 2 || s.axes[0] <= 0 || s.axes[1] <= 0) continue;
        ExposureExtension e;
        e.hdu = s.index;
        e.extname = s.extname;
        e.width = s.axes[0];
        e.height = s.axes[1];
        e.compressed = s.compressed;
        out.push_back(std::move(e));
    }
    for (ExposureExtension& e : out) {
        const auto same = std::count_if(out.begin(), out.end(), [&](const ExposureExtension& o) {
            return !e.extname.empty() && strcasecmp(o.extname.c_str(), e.extname.c_str()) == 0;
        });
        e.token = outputToken(e.hdu, e.extname, same > 1);
    }
    return out;
}

namespace {

bool allDigits(const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(),
                                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

std::string trimmed(std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
        s.pop_back();
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
        s.erase(0, 1);
    return s;
}

std::vector<std::string> splitComma(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string part;
    while (std::getline(ss, part, ','))
        out.push_back(trimmed(part));
    return out;
}

// "A-B" with A <= B, both numbers.
bool isRange(const std::string& s, int* first = nullptr, int* last = nullptr) {
    const auto dash = s.find('-');
    if (dash == std::string::npos || dash == 0) return false;
    const std::string a = s.substr(0, dash), b = s.substr(dash + 1);
    if (!allDigits(a) || !allDigits(b) || a.size() > 6 || b.size() > 6) return false;
    if (first) *first = std::stoi(a);
    if (last) *last = std::stoi(b);
    return true;
}

bool isAuxiliaryPlane(const std::string& extname) {
    static const char* names[] = {"ERR",      "DQ",  "WHT", "WEIGHT", "MASK", "BPM", "VAR",
                                  "VARIANCE", "RMS", "SIG", "EXP",    "CON",  "CTX"};
    return std::any_of(std::begin(names), std::end(names),
                       [&](const char* n) { return strcasecmp(extname.c_str(), n) == 0; });
}

std::vector<ExposureExtension> selected(const std::string& path, const std::vector<ExposureExtension>& all,
                                        const std::string& spec) {
    if (strcasecmp(trimmed(spec).c_str(), "all") == 0) return all;
    std::vector<ExposureExtension> out;
    std::set<int> seen;
    auto take = [&](const ExposureExtension& e) {
        if (seen.insert(e.hdu).second) out.push_back(e);
    };
    for (const std::string& item : splitComma(spec)) {
        int first = 0, last = 0;
        if (isRange(item, &first, &last)) {
            if (first > last) throw InvalidInput(path + ": --hdu range " + item + " runs backwards");
            bool any = false;
            for (const ExposureExtension& e : all)
                if (e.hdu >= first && e.hdu <= last) take(e), any = true;
            if (!any) throw InvalidInput(path + ": --hdu " + item + " holds no image extension with data");
            continue;
        }
        auto match = std::find_if(all.begin(), all.end(), [&](const ExposureExtension& e) {
            return allDigits(item) ? std::to_string(e.hdu) == item
                                   : strcasecmp(e.extname.c_str(), item.c_str()) == 0;
        });
        if (item.empty() || match == all.end())
            throw InvalidInput(path + ": --hdu " + spec + ": '" + item +
                               "' is not an image extension with data (gpuphot info lists them)");
        take(*match);
    }
    return out;
}

} // namespace

bool isExposureSelection(const std::string& hduSpec) {
    const std::string s = trimmed(hduSpec);
    if (strcasecmp(s.c_str(), "all") == 0) return true;
    const std::vector<std::string> items = splitComma(s);
    if (items.size() == 2 && !allDigits(items[0]) && !isRange(items[0]) && allDigits(items[1]))
        return false; // EXTNAME,EXTVER
    return items.size() > 1 || (items.size() == 1 && isRange(items[0]));
}

std::vector<ExposureExtension> exposureExtensions(const std::string& path, const std::string& hduSpec) {
    if (const auto b = path.find('['); b != std::string::npos && path.back() == ']') return {};
    if (!trimmed(hduSpec).empty() && !isExposureSelection(hduSpec)) return {};
    const std::vector<ExposureExtension> all = imageExtensions(path);
    if (!trimmed(hduSpec).empty()) return selected(path, all, hduSpec);
    std::vector<ExposureExtension> science;
    for (const ExposureExtension& e : all)
        if (!isAuxiliaryPlane(e.extname)) science.push_back(e);
    return science.size() > 1 ? science : std::vector<ExposureExtension>{};
}

namespace {

double median(std::vector<double> v) {
    if (v.empty()) return std::nan("");
    const std::size_t m = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m), v.end());
    const double hi = v[m];
    if (v.size() % 2) return hi;
    return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m)));
}

} // namespace

int ccdContextDevice(std::size_t k, int gpus, int visible) {
    if (visible <= 0) return -1;
    const int g = gpus > 0 && gpus < visible ? gpus : visible;
    return static_cast<int>(k % static_cast<std::size_t>(g));
}

ExposureCalibration calibrateExposure(const std::vector<CcdZeroPoint>& ccds, const ExposureParams& p) {
    ExposureCalibration cal;
    const std::size_t n = ccds.size();
    cal.offset.assign(n, std::nan(""));
    cal.offsetErr.assign(n, std::nan(""));
    cal.outlier.assign(n, false);
    std::vector<double> zps;
    for (const CcdZeroPoint& c : ccds)
        if (c.ok && std::isfinite(c.zp)) zps.push_back(c.zp);
    if (zps.empty()) return cal;
    // The median of every CCD's zero point: a bad CCD or two cannot move it. The outliers are judged
    // against the robust scatter of the CCDs about it, and that scatter, without them, is its error.
    cal.zp = median(zps);
    std::vector<double> dev;
    for (double z : zps)
        dev.push_back(std::abs(z - cal.zp));
    const double limit = std::max(p.outlierSigma * 1.4826 * median(dev), p.outlierMinMag);
    std::vector<double> keptDev, keptErr;
    for (std::size_t i = 0; i < n; ++i) {
        if (!ccds[i].ok || !std::isfinite(ccds[i].zp)) continue;
        cal.outlier[i] = std::abs(ccds[i].zp - cal.zp) > limit;
        if (!cal.outlier[i])
            keptDev.push_back(std::abs(ccds[i].zp - cal.zp)), keptErr.push_back(ccds[i].zpErr);
    }
    cal.ccdsUsed = static_cast<int>(zps.size());
    cal.scatter = 1.4826 * median(keptDev);
    const double k = static_cast<double>(keptDev.size());
    cal.zpErr = std::hypot(1.2533 * cal.scatter / std::sqrt(k), median(keptErr) / std::sqrt(k));
    for (std::size_t i = 0; i < n; ++i) {
        if (!ccds[i].ok || !std::isfinite(ccds[i].zp)) continue;
        cal.offset[i] = ccds[i].zp - cal.zp;
        cal.offsetErr[i] = ccds[i].zpErr;
    }
    cal.ok = true;
    return cal;
}

void to_json(nlohmann::json& j, const ExposureCcdSummary& c) {
    j = {
        {"hdu", c.hdu}, {"extname", c.extname}, {"token", c.token}, {"width", c.width}, {"height", c.height}};
    j["status"] = c.status;
    if (c.failed()) {
        j["error"] = c.error;
        return;
    }
    j["sources"] = c.sources;
    j["seconds"] = c.seconds;
    j["fwhm"] = finiteOrNull(c.fwhm);
    j["astrometric_rms_arcsec"] = finiteOrNull(c.rms);
    j["zp"] = finiteOrNull(c.zp);
    j["zp_err"] = finiteOrNull(c.zpErr);
    j["calibrators"] = c.calibrators;
    j["gpu"] = c.gpu >= 0 ? nlohmann::json(c.gpu) : nlohmann::json(nullptr);
    j["zp_offset"] = finiteOrNull(c.zpOffset);
    j["zp_offset_err"] = finiteOrNull(c.zpOffsetErr);
    j["zp_outlier"] = c.outlier;
    j["zp_used"] = c.zpUsed;
    j["astrometry"] = c.astrometry;
    j["warnings"] = c.warnings;
}

void from_json(const nlohmann::json& j, ExposureCcdSummary& c) {
    c = {};
    c.hdu = j.value("hdu", -1);
    c.extname = j.value("extname", std::string());
    c.token = j.value("token", std::string());
    c.width = j.value("width", 0LL);
    c.height = j.value("height", 0LL);
    c.status = j.value("status", std::string("failed"));
    c.error = j.value("error", std::string());
    c.sources = j.value("sources", 0LL);
    c.seconds = numberOrNaN(j, "seconds");
    c.fwhm = numberOrNaN(j, "fwhm");
    c.rms = numberOrNaN(j, "astrometric_rms_arcsec");
    c.zp = numberOrNaN(j, "zp");
    c.zpErr = numberOrNaN(j, "zp_err");
    c.calibrators = j.value("calibrators", 0);
    if (const auto g = j.find("gpu"); g != j.end() && g->is_number_integer()) c.gpu = g->get<int>();
    c.zpOffset = numberOrNaN(j, "zp_offset");
    c.zpOffsetErr = numberOrNaN(j, "zp_offset_err");
    c.outlier = j.value("zp_outlier", false);
    c.zpUsed = j.value("zp_used", std::string());
    c.astrometry = j.value("astrometry", std::string());
    if (const auto w = j.find("warnings"); w != j.end() && w->is_array())
        for (const auto& x : *w)
            if (x.is_string()) c.warnings.push_back(x.get<std::string>());
}

} // namespace gpuphot
