#include "core/pipeline/sextractor_config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/pipeline/pipeline_config.hpp"
#include "core/util/errors.hpp"
#include "core/util/text.hpp"

namespace gpuphot {

namespace {

// SExtractor 2.25's defaults of the keys that map onto our stages: what it does when a .sex leaves them out.
const std::vector<std::pair<std::string, std::string>>& sextractorDefaults() {
    static const std::vector<std::pair<std::string, std::string>> d{
        {"DETECT_TYPE", "CCD"},
        {"DETECT_MINAREA", "5"},
        {"THRESH_TYPE", "RELATIVE"},
        {"DETECT_THRESH", "1.5"},
        {"ANALYSIS_THRESH", "1.5"},
        {"FILTER", "Y"},
        {"DEBLEND_NTHRESH", "32"},
        {"DEBLEND_MINCONT", "0.005"},
        {"CLEAN", "Y"},
        {"CLEAN_PARAM", "1.0"},
        {"WEIGHT_TYPE", "NONE"},
        {"PHOT_APERTURES", "5"},
        {"PHOT_AUTOPARAMS", "2.5,3.5"},
        {"SATUR_KEY", "SATURATE"},
        {"GAIN_KEY", "GAIN"},
        {"BACK_TYPE", "AUTO"},
        {"BACK_SIZE", "64"},
        {"BACK_FILTERSIZE", "3"},
        {"BACK_FILTTHRESH", "0.0"},
        {"BACKPHOTO_TYPE", "GLOBAL"},
        {"PIXEL_SCALE", "1.0"},
        {"CATALOG_NAME", "test.cat"},
        {"CATALOG_TYPE", "ASCII_HEAD"},
        {"PARAMETERS_NAME", "default.param"},
        {"MAG_ZEROPOINT", "0.0"},
        {"PHOT_FLUXFRAC", "0.5"},
    };
    return d;
}

// SExtractor's default.conv: used when FILTER is Y and no FILTER_NAME is given.
ConvFilter defaultConv() {
    ConvFilter f;
    f.kernel = {1, 2, 1, 2, 4, 2, 1, 2, 1};
    f.width = f.height = 3;
    return f;
}

// Keys whose only effect is on columns, files or modes gpuphot does not produce (the value that makes
// them matter is named: "" any value is inert).
const std::map<std::string, std::string>& inertKeys() {
    static const std::map<std::string, std::string> k{
        {"MEMORY_OBJSTACK", ""}, {"MEMORY_PIXSTACK", ""}, {"MEMORY_BUFSIZE", ""}, {"VERBOSE_TYPE", ""},
        {"NTHREADS", ""},        {"HEADER_SUFFIX", ""},   {"XML_NAME", ""},       {"XSL_URL", ""},
        {"STARNNW_NAME", ""},    {"SEEING_FWHM", ""},     {"MAG_GAMMA", ""},      {"PHOT_PETROPARAMS", ""},
        {"FLAG_IMAGE", ""},      {"FLAG_TYPE", ""},       {"ASSOC_NAME", ""},     {"ASSOC_DATA", ""},
        {"ASSOC_PARAMS", ""},    {"ASSOC_RADIUS", ""},    {"ASSOC_TYPE", ""},     {"ASSOCSELEC_TYPE", ""},
        {"CHECKIMAGE_NAME", ""}, {"BACK_VALUE", ""},      {"DGEO_IMAGE", ""},     {"WEIGHT_IMAGE", ""},
        {"WEIGHT_GAIN", ""},     {"RESCALE_WEIGHTS", ""}, {"WEIGHT_THRESH", ""},  {"INTERP_TYPE", ""},
        {"INTERP_MAXXLAG", ""},  {"INTERP_MAXYLAG", ""},  {"FITS_UNSIGNED", ""},
    };
    return k;
}

struct Reader {
    const SextractorSettings& s;
    std::string where(const std::string& key) const {
        return key + (s.path.empty() ? std::string(" (command line)") : " in " + s.path);
    }
    std::vector<std::string> list(const std::string& key, const std::string& v) const {
        std::vector<std::string> out;
        std::string cur;
        for (char c : v + ",") {
            if (c == ',' || c == ' ' || c == '\t') {
                if (!cur.empty()) out.push_back(cur);
                cur.clear();
            } else {
                cur += c;
            }
        }
        if (out.empty()) throw InvalidInput(where(key) + ": no value");
        return out;
    }
    double number(const std::string& key, const std::string& t) const {
        char* end = nullptr;
        const double v = std::strtod(t.c_str(), &end);
        if (t.empty() || *end != '\0' || !std::isfinite(v))
            throw InvalidInput(where(key) + ": '" + t + "' is not a number");
        return v;
    }
    int integer(const std::string& key, const std::string& t) const {
        const double v = number(key, t);
        if (v != std::floor(v) || std::fabs(v) > 1e9)
            throw InvalidInput(where(key) + ": '" + t + "' is not an integer");
        return static_cast<int>(v);
    }
    bool yesNo(const std::string& key, const std::string& t) const {
        if (t == "Y" || t == "y") return true;
        if (t == "N" || t == "n") return false;
        throw InvalidInput(where(key) + ": '" + t + "' is neither Y nor N");
    }
    std::string upper(const std::string& t) const {
        std::string u = t;
        for (char& c : u)
            c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return u;
    }
};

std::string num(double v) {
    std::ostringstream o;
    o << v;
    return o.str();
}

} // namespace

const std::string* SextractorSettings::find(const std::string& key) const {
    for (auto it = entries.rbegin(); it != entries.rend(); ++it)
        if (it->first == key) return &it->second;
    return nullptr;
}

SextractorSettings readSextractorSettings(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw InvalidInput("cannot read SExtractor configuration " + path);
    SextractorSettings s;
    s.path = path;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        ++n;
        const auto hash = line.find('#');
        const std::string t = trimmed(hash == std::string::npos ? line : line.substr(0, hash));
        if (t.empty()) continue;
        const auto sp = t.find_first_of(" \t");
        const std::string key = t.substr(0, sp), value = sp == std::string::npos ? "" : trimmed(t.substr(sp));
        if (!isUpperCaseName(key))
            throw InvalidInput(path + " line " + std::to_string(n) + ": '" + key +
                               "' is not a SExtractor key");
        s.entries.emplace_back(key, value);
    }
    return s;
}

void addSextractorOverride(SextractorSettings& s, const std::string& key, const std::string& value) {
    if (!isUpperCaseName(key))
        throw InvalidInput("-" + key + ": SExtractor keys are upper case (e.g. -DETECT_THRESH 3)");
    s.entries.emplace_back(key, trimmed(value));
}

ConvFilter readConvFilter(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw InvalidInput("cannot read filter " + path);
    ConvFilter f;
    std::string line;
    bool header = false;
    while (std::getline(in, line)) {
        const auto hash = line.find('#');
        const std::string t = trimmed(hash == std::string::npos ? line : line.substr(0, hash));
        if (t.empty()) continue;
        if (!header) {
            if (t == "CONV NORM")
                f.normalise = true;
            else if (t == "CONV NONORM")
                f.normalise = false;
            else
                throw InvalidInput(path + ": a filter starts with CONV NORM or CONV NONORM");
            header = true;
            continue;
        }
        std::istringstream row(t);
        std::vector<float> values;
        std::string word;
        while (row >> word) {
            char* end = nullptr;
            const double v = std::strtod(word.c_str(), &end);
            if (*end != '\0' || !std::isfinite(v))
                throw InvalidInput(path + ": '" + word + "' is not a number");
            values.push_back(static_cast<float>(v));
        }
        if (f.width == 0) f.width = static_cast<int>(values.size());
        if (static_cast<int>(values.size()) != f.width)
            throw InvalidInput(path + ": rows of " + std::to_string(f.width) + " and " +
                               std::to_string(values.size()) + " numbers");
        f.kernel.insert(f.kernel.end(), values.begin(), values.end());
        ++f.height;
    }
    if (!header || f.height == 0) throw InvalidInput(path + ": no filter rows");
    if (f.width % 2 == 0 || f.height % 2 == 0)
        throw InvalidInput(path + ": a " + std::to_string(f.width) + "x" + std::to_string(f.height) +
                           " filter (gpuphot needs odd sizes)");
    return f;
}

std::string SextractorMapping::warning() const {
    std::string w;
    if (!unsupported.empty()) {
        w += "SExtractor keys not supported (ignored):";
        for (const auto& u : unsupported)
            w += "\n  " + u;
    }
    if (!differences.empty()) {
        if (!w.empty()) w += "\n";
        w += "SExtractor semantics not reproduced exactly:";
        for (const auto& d : differences)
            w += "\n  " + d;
    }
    return w;
}

namespace {

std::string resolveBeside(const std::string& name, const std::string& sexPath) {
    namespace fs = std::filesystem;
    if (fs::exists(name) || sexPath.empty()) return name;
    const fs::path beside = fs::path(sexPath).parent_path() / name;
    return fs::exists(beside) ? beside.string() : name;
}

// CATALOG_NAME, CATALOG_TYPE, PARAMETERS_NAME, MAG_ZEROPOINT, PHOT_FLUXFRAC -> m.catalog. PARAMETERS_NAME
// is looked for as given, then beside the file; when it is not there (a .sex is often passed on without
// its default.param) the SExtractor catalog is left out, said in a difference, and the reduction goes on.
void applyCatalogKeys(const Reader& r, std::map<std::string, std::string>& v, std::set<std::string>& done,
                      SextractorMapping& m) {
    for (const char* k :
         {"CATALOG_NAME", "CATALOG_TYPE", "PARAMETERS_NAME", "MAG_ZEROPOINT", "PHOT_FLUXFRAC"})
        done.insert(k);
    SextractorCatalogOptions& cat = m.catalog;
    cat.name = trimmed(v["CATALOG_NAME"]);
    cat.type = r.upper(trimmed(v["CATALOG_TYPE"]));
    cat.magZeropoint = r.number("MAG_ZEROPOINT", v["MAG_ZEROPOINT"]);
    cat.fluxFrac.clear();
    for (const std::string& f : r.list("PHOT_FLUXFRAC", v["PHOT_FLUXFRAC"])) {
        cat.fluxFrac.push_back(r.number("PHOT_FLUXFRAC", f));
        if (!(cat.fluxFrac.back() > 0.0 && cat.fluxFrac.back() < 1.0))
            throw InvalidInput(r.where("PHOT_FLUXFRAC") + ": fractions between 0 and 1");
    }
    m.writesCatalog = cat.type != "NONE";
    if (!m.writesCatalog) return;
    const std::string param = resolveBeside(trimmed(v["PARAMETERS_NAME"]), r.s.path);
    if (!std::filesystem::exists(param)) {
        m.writesCatalog = false;
        m.differences.push_back("PARAMETERS_NAME " + v["PARAMETERS_NAME"] +
                                ": not found (as given or beside the configuration): no SExtractor catalog "
                                "written (give --param FILE)");
        return;
    }
    cat.params = readSextractorParams(param);
    if (cat.params.empty()) {
        m.writesCatalog = false;
        m.differences.push_back("PARAMETERS_NAME " + v["PARAMETERS_NAME"] +
                                " names no parameter: no SExtractor catalog written");
        return;
    }
    checkSextractorCatalog(cat);
}

} // namespace

SextractorMapping applySextractorSettings(const SextractorSettings& s, PipelineConfig& c) {
    SextractorMapping m;
    const Reader r{s};
    // SExtractor's defaults first, then the file and the overrides: the last value of a key counts.
    std::map<std::string, std::string> v;
    std::vector<std::string> order;
    for (const auto& [k, val] : sextractorDefaults())
        v[k] = val;
    for (const auto& [k, val] : s.entries) {
        if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
        v[k] = val;
    }
    std::set<std::string> done;
    auto get = [&](const std::string& k) -> const std::string& {
        done.insert(k);
        return v[k];
    };
    auto applied = [&](const std::string& k, const std::string& what) {
        m.applied.push_back(k + " " + v[k] + " -> " + what);
    };
    auto unsupported = [&](const std::string& k) {
        done.insert(k);
        m.unsupported.push_back(k + " " + v[k]);
    };

    DetectionParams& d = c.detection;
    if (r.upper(get("DETECT_TYPE")) != "CCD") unsupported("DETECT_TYPE");
    d.minArea = r.integer("DETECT_MINAREA", get("DETECT_MINAREA"));
    applied("DETECT_MINAREA", "detection.minArea = " + std::to_string(d.minArea));
    if (v.count("DETECT_MAXAREA") && r.number("DETECT_MAXAREA", get("DETECT_MAXAREA")) > 0)
        unsupported("DETECT_MAXAREA");
    const std::string tt = r.upper(get("THRESH_TYPE"));
    if (tt != "RELATIVE" && tt != "ABSOLUTE")
        throw InvalidInput(r.where("THRESH_TYPE") + ": RELATIVE or ABSOLUTE");
    d.thresholdIsAbsolute = tt == "ABSOLUTE";
    const std::vector<std::string> thr = r.list("DETECT_THRESH", get("DETECT_THRESH"));
    if (thr.size() == 2) { // surface brightness: mu mag/arcsec^2 with its zero point
        const double scale = r.number("PIXEL_SCALE", get("PIXEL_SCALE"));
        if (!(scale > 0.0))
            throw InvalidInput(r.where("DETECT_THRESH") +
                               ": a threshold in mag/arcsec^2 needs PIXEL_SCALE > 0");
        const double mu = r.number("DETECT_THRESH", thr[0]), zp = r.number("DETECT_THRESH", thr[1]);
        d.threshold = std::pow(10.0, -0.4 * (mu - zp)) * scale * scale;
        d.thresholdIsAbsolute = true;
    } else {
        d.threshold = r.number("DETECT_THRESH", thr[0]);
    }
    if (get("ANALYSIS_THRESH") != v["DETECT_THRESH"])
        m.differences.push_back("ANALYSIS_THRESH " + v["ANALYSIS_THRESH"] +
                                ": gpuphot measures on the detection isophote (DETECT_THRESH " +
                                v["DETECT_THRESH"] + ")");

    d.filter = r.yesNo("FILTER", get("FILTER"));
    if (d.filter) {
        ConvFilter f = defaultConv();
        if (v.count("FILTER_NAME")) {
            const std::string name = get("FILTER_NAME");
            if (name.size() > 5 && r.upper(name.substr(name.size() - 5)) == ".FITS")
                throw InvalidInput(r.where("FILTER_NAME") +
                                   ": FITS filters are not supported (use a .conv file)");
            f = readConvFilter(resolveBeside(name, s.path));
        }
        double sum = 0.0;
        for (float x : f.kernel)
            sum += x;
        d.filterKernel = f.kernel;
        d.filterKernelWidth = f.width;
        // gpuphot normalises every kernel of non-zero sum; SExtractor's NONORM compares the unnormalised
        // convolution with the threshold, the same as the normalised one with threshold / sum
        if (!f.normalise && sum != 0.0) d.threshold /= sum;
        if (sum == 0.0)
            m.differences.push_back("FILTER_NAME " + v["FILTER_NAME"] +
                                    ": a zero-sum kernel is used as it is");
        applied("FILTER_NAME", "detection.filterKernel (" + std::to_string(f.width) + "x" +
                                   std::to_string(f.height) + (f.normalise ? ", NORM" : ", NONORM") + ")");
    }
    applied("DETECT_THRESH",
            "detection.threshold = " + num(d.threshold) + (d.thresholdIsAbsolute ? " ADU" : " sigma"));
    if (v.count("FILTER_THRESH") && !trimmed(get("FILTER_THRESH")).empty()) unsupported("FILTER_THRESH");
    d.deblendLevels = r.integer("DEBLEND_NTHRESH", get("DEBLEND_NTHRESH"));
    d.deblendContrast = r.number("DEBLEND_MINCONT", get("DEBLEND_MINCONT"));
    d.clean = r.yesNo("CLEAN", get("CLEAN"));
    d.cleanParam = r.number("CLEAN_PARAM", get("CLEAN_PARAM"));
    applied("DEBLEND_NTHRESH", "detection.deblendLevels");
    applied("DEBLEND_MINCONT", "detection.deblendContrast");
    applied("CLEAN", "detection.clean");
    applied("CLEAN_PARAM", "detection.cleanParam");
    if (v.count("MASK_TYPE") && r.upper(get("MASK_TYPE")) != "CORRECT") unsupported("MASK_TYPE");

    const std::string wt = r.upper(get("WEIGHT_TYPE"));
    if (wt == "NONE")
        m.differences.push_back("WEIGHT_TYPE NONE: gpuphot thresholds against the background RMS map "
                                "(SExtractor's WEIGHT_TYPE BACKGROUND), not one global RMS");
    else if (wt != "BACKGROUND")
        unsupported("WEIGHT_TYPE");

    // photometry
    ApertureParams& a = c.aperture;
    a.radii.clear();
    for (const auto& t : r.list("PHOT_APERTURES", get("PHOT_APERTURES"))) {
        const double dia = r.number("PHOT_APERTURES", t);
        if (!(dia > 0.0)) throw InvalidInput(r.where("PHOT_APERTURES") + ": diameters must be positive");
        a.radii.push_back(0.5 * dia);
    }
    a.radiiInFwhm = false;
    applied("PHOT_APERTURES", "aperture.radii (half the diameters, px)");
    const std::vector<std::string> kron = r.list("PHOT_AUTOPARAMS", get("PHOT_AUTOPARAMS"));
    if (kron.size() != 2) throw InvalidInput(r.where("PHOT_AUTOPARAMS") + ": <Kron_fact>,<min_radius>");
    a.kronFactor = r.number("PHOT_AUTOPARAMS", kron[0]);
    a.kronMinRadius = r.number("PHOT_AUTOPARAMS", kron[1]);
    applied("PHOT_AUTOPARAMS", "aperture.kronFactor, aperture.kronMinRadius");
    if (v.count("PHOT_AUTOAPERS")) {
        for (const auto& t : r.list("PHOT_AUTOAPERS", get("PHOT_AUTOAPERS")))
            if (r.number("PHOT_AUTOAPERS", t) != 0.0) {
                unsupported("PHOT_AUTOAPERS");
                break;
            }
    }
    const std::string bp = r.upper(get("BACKPHOTO_TYPE"));
    if (bp == "GLOBAL") {
        a.useLocalSky = false;
        applied("BACKPHOTO_TYPE", "aperture.useLocalSky = false");
    } else if (bp == "LOCAL") {
        a.useLocalSky = true;
        m.differences.push_back(
            "BACKPHOTO_TYPE LOCAL: gpuphot's local sky is a circular annulus "
            "(aperture.annulusInner/Outer), not SExtractor's rectangle of BACKPHOTO_THICK px");
        if (v.count("BACKPHOTO_THICK")) done.insert("BACKPHOTO_THICK");
    } else {
        throw InvalidInput(r.where("BACKPHOTO_TYPE") + ": GLOBAL or LOCAL");
    }
    if (v.count("BACKPHOTO_THICK") && bp == "GLOBAL") done.insert("BACKPHOTO_THICK");

    // instrument
    c.keywords.saturation = {get("SATUR_KEY")};
    c.keywords.gain = {get("GAIN_KEY")};
    c.keywords.gainPerAmp.clear();
    applied("SATUR_KEY", "keywords.saturation");
    applied("GAIN_KEY", "keywords.gain");
    if (v.count("SATUR_LEVEL"))
        m.differences.push_back("SATUR_LEVEL " + get("SATUR_LEVEL") +
                                ": SExtractor's value where the header lacks " + v["SATUR_KEY"] +
                                "; gpuphot then has no saturation level (give --saturation)");
    if (v.count("GAIN"))
        m.differences.push_back("GAIN " + get("GAIN") + ": SExtractor's value where the header lacks " +
                                v["GAIN_KEY"] + "; gpuphot then takes gain 1 (give --gain)");
    get("PIXEL_SCALE"); // (used by DETECT_THRESH in mag/arcsec^2)

    // background
    BackgroundParams& b = c.background;
    if (r.upper(get("BACK_TYPE")) != "AUTO") unsupported("BACK_TYPE");
    const std::vector<std::string> bs = r.list("BACK_SIZE", get("BACK_SIZE"));
    b.meshSize = r.integer("BACK_SIZE", bs[0]);
    b.meshHeight = bs.size() > 1 ? r.integer("BACK_SIZE", bs[1]) : 0;
    const std::vector<std::string> bf = r.list("BACK_FILTERSIZE", get("BACK_FILTERSIZE"));
    b.filterSize = r.integer("BACK_FILTERSIZE", bf[0]);
    b.filterHeight = bf.size() > 1 ? r.integer("BACK_FILTERSIZE", bf[1]) : 0;
    b.filterThreshold = r.number("BACK_FILTTHRESH", get("BACK_FILTTHRESH"));
    b.sextractorSpline = true;
    applied("BACK_SIZE", "background.meshSize, meshHeight");
    applied("BACK_FILTERSIZE", "background.filterSize, filterHeight");
    applied("BACK_FILTTHRESH", "background.filterThreshold (and background.sextractorSpline = true)");

    applyCatalogKeys(r, v, done, m);
    if (v.count("CHECKIMAGE_TYPE") && r.upper(get("CHECKIMAGE_TYPE")) != "NONE")
        unsupported("CHECKIMAGE_TYPE");
    if (v.count("WRITE_XML") && r.yesNo("WRITE_XML", get("WRITE_XML"))) unsupported("WRITE_XML");
    if (v.count("DGEO_TYPE") && r.upper(get("DGEO_TYPE")) != "NONE") unsupported("DGEO_TYPE");

    for (const std::string& k : order) {
        if (done.count(k)) continue;
        if (inertKeys().count(k)) // only for columns, files or modes gpuphot does not produce
            m.applied.push_back(k + " " + v[k] + " -> no effect here");
        else
            unsupported(k);
    }
    return m;
}

} // namespace gpuphot
