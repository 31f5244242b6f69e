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

#include "core/pipeline/param_table.hpp"
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
        {"MASK_TYPE", "CORRECT"},
        {"WEIGHT_TYPE", "NONE"},
        {"WEIGHT_IMAGE", "weight.fits"},
        {"RESCALE_WEIGHTS", "Y"},
        {"WEIGHT_GAIN", "Y"},
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
                throw InvalidInput(path +
                                   ": a filter starts with CONV NORM or CONV NONORM (other filters are "
                                   "SExtractor's neural-network retinas, which gpuphot does not run)");
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

// Whether a file of that name exists; false also when the name cannot be looked up (too long, no
// permission): the reading that follows then says what is wrong with it, as a typed error.
bool fileExists(const std::filesystem::path& p) {
    std::error_code ec;
    return std::filesystem::exists(p, ec) && !ec;
}

std::string resolveBeside(const std::string& name, const std::string& sexPath) {
    namespace fs = std::filesystem;
    if (fileExists(name) || sexPath.empty()) return name;
    const fs::path beside = fs::path(sexPath).parent_path() / name;
    return fileExists(beside) ? beside.string() : name;
}

// FLAG_IMAGE, FLAG_TYPE -> the catalog's flag images, when its parameters ask for IMAFLAGS_ISO or
// NIMAFLAGS_ISO (as SExtractor reads them only then): each found as given or beside the file.
void applyFlagImageKeys(const Reader& r, std::map<std::string, std::string>& v, std::set<std::string>& done,
                        SextractorCatalogOptions& cat) {
    const bool asked = std::any_of(cat.params.begin(), cat.params.end(), [](const SextractorParam& p) {
        return p.name == "IMAFLAGS_ISO" || p.name == "NIMAFLAGS_ISO";
    });
    cat.flagImages.clear();
    cat.flagTypes.clear();
    if (!asked) return;
    done.insert("FLAG_IMAGE");
    done.insert("FLAG_TYPE");
    for (const std::string& f : r.list("FLAG_IMAGE", v.count("FLAG_IMAGE") ? v["FLAG_IMAGE"] : "flag.fits")) {
        cat.flagImages.push_back(resolveBeside(f, r.s.path));
        if (!fileExists(cat.flagImages.back()))
            throw InvalidInput(r.where("FLAG_IMAGE") + ": " + f + " not found (as given or beside the file)");
    }
    for (const std::string& t : r.list("FLAG_TYPE", v.count("FLAG_TYPE") ? v["FLAG_TYPE"] : "OR"))
        cat.flagTypes.push_back(r.upper(t));
    while (cat.flagTypes.size() < cat.flagImages.size())
        cat.flagTypes.push_back(cat.flagTypes.back());
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
    if (!fileExists(param)) {
        m.writesCatalog = false;
        m.differences.push_back("PARAMETERS_NAME " + v["PARAMETERS_NAME"] +
                                ": not found (as given or beside the configuration): no SExtractor catalog "
                                "written (give --param FILE)");
        return;
    }
    cat.params = readSextractorParams(param);
    applyFlagImageKeys(r, v, done, cat);
    if (cat.params.empty()) {
        m.writesCatalog = false;
        m.differences.push_back("PARAMETERS_NAME " + v["PARAMETERS_NAME"] +
                                " names no parameter: no SExtractor catalog written");
        return;
    }
    checkSextractorCatalog(cat);
}

// The merged key values and the record of which keys a handler consumed, shared by the stage handlers.
struct KeyState {
    const Reader r;
    SextractorMapping& m;
    std::map<std::string, std::string> v; // every key's value (the last one given, else SExtractor's default)
    std::vector<std::string> order;       // the keys given, in the order first given
    std::set<std::string> done;           // the keys consumed by a handler

    // SExtractor's defaults first, then the file and the overrides: the last value of a key counts.
    KeyState(const SextractorSettings& s, SextractorMapping& mapping) : r{s}, m(mapping) {
        for (const auto& [k, val] : sextractorDefaults())
            v[k] = val;
        for (const auto& [k, val] : s.entries) {
            if (std::find(order.begin(), order.end(), k) == order.end()) order.push_back(k);
            v[k] = val;
        }
    }
    const std::string& get(const std::string& k) {
        done.insert(k);
        return v[k];
    }
    void applied(const std::string& k, const std::string& what) {
        m.applied.push_back(k + " " + v[k] + " -> " + what);
    }
    void unsupported(const std::string& k) {
        done.insert(k);
        m.unsupported.push_back(k + " " + v[k]);
    }
};

// DETECT_TYPE, DETECT_MINAREA, DETECT_MAXAREA, THRESH_TYPE, DETECT_THRESH (sigma, ADU or mag/arcsec^2),
// ANALYSIS_THRESH -> detection's area and threshold.
void applyDetectKeys(KeyState& k, DetectionParams& d) {
    const Reader& r = k.r;
    if (r.upper(k.get("DETECT_TYPE")) != "CCD") k.unsupported("DETECT_TYPE");
    d.minArea = r.integer("DETECT_MINAREA", k.get("DETECT_MINAREA"));
    k.applied("DETECT_MINAREA", "detection.minArea = " + std::to_string(d.minArea));
    if (k.v.count("DETECT_MAXAREA") && r.number("DETECT_MAXAREA", k.get("DETECT_MAXAREA")) > 0)
        k.unsupported("DETECT_MAXAREA");
    const std::string tt = r.upper(k.get("THRESH_TYPE"));
    if (tt != "RELATIVE" && tt != "ABSOLUTE")
        throw InvalidInput(r.where("THRESH_TYPE") + ": RELATIVE or ABSOLUTE");
    d.thresholdIsAbsolute = tt == "ABSOLUTE";
    const std::vector<std::string> thr = r.list("DETECT_THRESH", k.get("DETECT_THRESH"));
    if (thr.size() > 2)
        throw InvalidInput(r.where("DETECT_THRESH") + ": " + std::to_string(thr.size()) +
                           " values; one (sigma or ADU) or two (mag/arcsec^2 and its zero point)");
    if (thr.size() == 2) { // surface brightness: mu mag/arcsec^2 with its zero point
        const double scale = r.number("PIXEL_SCALE", k.get("PIXEL_SCALE"));
        if (!(scale > 0.0))
            throw InvalidInput(r.where("DETECT_THRESH") +
                               ": a threshold in mag/arcsec^2 needs PIXEL_SCALE > 0");
        const double mu = r.number("DETECT_THRESH", thr[0]), zp = r.number("DETECT_THRESH", thr[1]);
        d.threshold = std::pow(10.0, -0.4 * (mu - zp)) * scale * scale;
        d.thresholdIsAbsolute = true;
    } else {
        d.threshold = r.number("DETECT_THRESH", thr[0]);
    }
    if (k.get("ANALYSIS_THRESH") != k.v["DETECT_THRESH"])
        k.m.differences.push_back("ANALYSIS_THRESH " + k.v["ANALYSIS_THRESH"] +
                                  ": gpuphot measures on the detection isophote (DETECT_THRESH " +
                                  k.v["DETECT_THRESH"] + ")");
}

// FILTER, FILTER_NAME -> detection's convolution kernel (a NONORM kernel rescales the threshold, so the
// threshold is reported here, once final).
void applyFilterKeys(KeyState& k, DetectionParams& d) {
    const Reader& r = k.r;
    d.filter = r.yesNo("FILTER", k.get("FILTER"));
    if (d.filter) {
        ConvFilter f = defaultConv();
        if (k.v.count("FILTER_NAME")) {
            const std::string name = k.get("FILTER_NAME");
            if (name.empty())
                throw InvalidInput(r.where("FILTER_NAME") +
                                   ": no file given (name a .conv file, or leave the key out for "
                                   "SExtractor's default.conv)");
            if (name.size() > 5 && r.upper(name.substr(name.size() - 5)) == ".FITS")
                throw InvalidInput(r.where("FILTER_NAME") +
                                   ": a FITS filter is SExtractor's neural-network retina (a BP-ANN table), "
                                   "which gpuphot does not run (use a .conv file)");
            f = readConvFilter(resolveBeside(name, r.s.path));
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
            k.m.differences.push_back("FILTER_NAME " + k.v["FILTER_NAME"] +
                                      ": a zero-sum kernel is used as it is");
        k.applied("FILTER_NAME", "detection.filterKernel (" + std::to_string(f.width) + "x" +
                                     std::to_string(f.height) + (f.normalise ? ", NORM" : ", NONORM") + ")");
    }
    k.applied("DETECT_THRESH",
              "detection.threshold = " + num(d.threshold) + (d.thresholdIsAbsolute ? " ADU" : " sigma"));
}

// FILTER_THRESH, DEBLEND_NTHRESH, DEBLEND_MINCONT, CLEAN, CLEAN_PARAM -> detection's deblending
// and cleaning.
void applyDeblendKeys(KeyState& k, DetectionParams& d) {
    const Reader& r = k.r;
    if (k.v.count("FILTER_THRESH") && !trimmed(k.get("FILTER_THRESH")).empty())
        k.unsupported("FILTER_THRESH");
    d.deblendLevels = r.integer("DEBLEND_NTHRESH", k.get("DEBLEND_NTHRESH"));
    d.deblendContrast = r.number("DEBLEND_MINCONT", k.get("DEBLEND_MINCONT"));
    d.clean = r.yesNo("CLEAN", k.get("CLEAN"));
    d.cleanParam = r.number("CLEAN_PARAM", k.get("CLEAN_PARAM"));
    k.applied("DEBLEND_NTHRESH", "detection.deblendLevels");
    k.applied("DEBLEND_MINCONT", "detection.deblendContrast");
    k.applied("CLEAN", "detection.clean");
    k.applied("CLEAN_PARAM", "detection.cleanParam");
    d.sextractorIso = true;   // SExtractor's isophotal barycentre, shape and area
    d.sextractorClean = true; // and its CLEAN order
}

// WEIGHT_TYPE, WEIGHT_IMAGE, WEIGHT_THRESH, RESCALE_WEIGHTS, WEIGHT_GAIN -> the background's RMS: one global
// value (NONE), the mesh map (BACKGROUND) or an external map read in frame preparation (MAP_*).
void applyWeightKeys(KeyState& k, PipelineConfig& c) {
    const Reader& r = k.r;
    const std::vector<std::string> types = r.list("WEIGHT_TYPE", k.get("WEIGHT_TYPE"));
    const std::string wt = r.upper(types[0]);
    if (types.size() > 1 && r.upper(types[1]) != wt)
        k.m.differences.push_back("WEIGHT_TYPE " + k.v["WEIGHT_TYPE"] +
                                  ": one weighting for detection and measurement (the first)");
    c.background.uniformRms = wt == "NONE";
    if (wt == "NONE" || wt == "BACKGROUND") {
        c.prepare.weightType = "none";
        k.applied("WEIGHT_TYPE", std::string("background.uniformRms = ") + (wt == "NONE" ? "true" : "false"));
        return;
    }
    if (wt != "MAP_RMS" && wt != "MAP_VAR" && wt != "MAP_WEIGHT")
        throw InvalidInput(r.where("WEIGHT_TYPE") + ": NONE, BACKGROUND, MAP_RMS, MAP_VAR or MAP_WEIGHT");
    c.prepare.weightType = wt == "MAP_RMS" ? "map_rms" : wt == "MAP_VAR" ? "map_var" : "map_weight";
    k.applied("WEIGHT_TYPE", "prepare.weightType = " + c.prepare.weightType);
    const std::string image = r.list("WEIGHT_IMAGE", k.get("WEIGHT_IMAGE"))[0];
    k.m.weightImage = resolveBeside(image, r.s.path);
    if (!fileExists(k.m.weightImage))
        throw InvalidInput(r.where("WEIGHT_IMAGE") + ": " + image +
                           " not found (as given or beside the file)");
    k.applied("WEIGHT_IMAGE", "the weight map (--weight)");
    if (k.v.count("WEIGHT_THRESH") && !trimmed(k.v["WEIGHT_THRESH"]).empty()) {
        c.prepare.weightThreshold =
            r.number("WEIGHT_THRESH", r.list("WEIGHT_THRESH", k.get("WEIGHT_THRESH"))[0]);
        if (c.prepare.weightThreshold < 0.0) throw InvalidInput(r.where("WEIGHT_THRESH") + ": not negative");
        k.applied("WEIGHT_THRESH", "prepare.weightThreshold");
    }
    c.prepare.rescaleWeights = r.yesNo("RESCALE_WEIGHTS", k.get("RESCALE_WEIGHTS"));
    k.applied("RESCALE_WEIGHTS", "prepare.rescaleWeights");
    if (r.yesNo("WEIGHT_GAIN", k.get("WEIGHT_GAIN")))
        k.m.differences.push_back("WEIGHT_GAIN Y: gpuphot's photon noise uses the frame's gain everywhere, "
                                  "not a gain scaled with the weight");
}

// PHOT_APERTURES, PHOT_AUTOPARAMS, PHOT_AUTOAPERS, BACKPHOTO_TYPE, BACKPHOTO_THICK, MASK_TYPE -> aperture
// photometry.
void applyPhotometryKeys(KeyState& k, ApertureParams& a) {
    const Reader& r = k.r;
    a.radii.clear();
    for (const auto& t : r.list("PHOT_APERTURES", k.get("PHOT_APERTURES"))) {
        const double dia = r.number("PHOT_APERTURES", t);
        if (!(dia > 0.0)) throw InvalidInput(r.where("PHOT_APERTURES") + ": diameters must be positive");
        a.radii.push_back(0.5 * dia);
    }
    a.radiiInFwhm = false;
    k.applied("PHOT_APERTURES", "aperture.radii (half the diameters, px)");
    const std::vector<std::string> kron = r.list("PHOT_AUTOPARAMS", k.get("PHOT_AUTOPARAMS"));
    if (kron.size() != 2) throw InvalidInput(r.where("PHOT_AUTOPARAMS") + ": <Kron_fact>,<min_radius>");
    a.kronFactor = r.number("PHOT_AUTOPARAMS", kron[0]);
    a.kronMinRadius = r.number("PHOT_AUTOPARAMS", kron[1]);
    a.kronPixelCentres = true;   // SExtractor's FLUX_AUTO sums whole pixels
    a.centreOnBarycentre = true; // about X_IMAGE, Y_IMAGE
    k.applied("PHOT_AUTOPARAMS", "aperture.kronFactor, aperture.kronMinRadius, aperture.kronPixelCentres, "
                                 "aperture.centreOnBarycentre");
    if (k.v.count("PHOT_AUTOAPERS")) {
        for (const auto& t : r.list("PHOT_AUTOAPERS", k.get("PHOT_AUTOAPERS")))
            if (r.number("PHOT_AUTOAPERS", t) != 0.0) {
                k.unsupported("PHOT_AUTOAPERS");
                break;
            }
    }
    const std::string bp = r.upper(k.get("BACKPHOTO_TYPE"));
    if (bp == "GLOBAL") {
        a.useLocalSky = false;
        k.applied("BACKPHOTO_TYPE", "aperture.useLocalSky = false");
    } else if (bp == "LOCAL") {
        a.useLocalSky = true;
        k.m.differences.push_back(
            "BACKPHOTO_TYPE LOCAL: gpuphot's local sky is a circular annulus "
            "(aperture.annulusInner/Outer), not SExtractor's rectangle of BACKPHOTO_THICK px");
        if (k.v.count("BACKPHOTO_THICK")) k.done.insert("BACKPHOTO_THICK");
    } else {
        throw InvalidInput(r.where("BACKPHOTO_TYPE") + ": GLOBAL or LOCAL");
    }
    if (k.v.count("BACKPHOTO_THICK") && bp == "GLOBAL") k.done.insert("BACKPHOTO_THICK");
    const std::string mask = r.upper(k.get("MASK_TYPE"));
    if (mask == "NONE")
        a.neighbourPixels = NeighbourPixels::None;
    else if (mask == "BLANK")
        a.neighbourPixels = NeighbourPixels::Blank;
    else if (mask == "CORRECT")
        a.neighbourPixels = NeighbourPixels::Correct;
    else
        throw InvalidInput(r.where("MASK_TYPE") + ": NONE, BLANK or CORRECT");
    k.m.catalog.maskType = mask;
    k.applied("MASK_TYPE", "aperture.neighbourPixels");
}

// SATUR_KEY, GAIN_KEY, SATUR_LEVEL, GAIN, PIXEL_SCALE -> the header keywords of the instrument.
void applyInstrumentKeys(KeyState& k, PipelineConfig& c) {
    c.keywords.saturation = {k.get("SATUR_KEY")};
    c.keywords.gain = {k.get("GAIN_KEY")};
    c.keywords.gainPerAmp.clear();
    k.applied("SATUR_KEY", "keywords.saturation");
    k.applied("GAIN_KEY", "keywords.gain");
    const Reader& r = k.r;
    if (k.v.count("SATUR_LEVEL")) {
        const double sat = r.number("SATUR_LEVEL", k.get("SATUR_LEVEL"));
        if (!(sat > 0.0)) throw InvalidInput(r.where("SATUR_LEVEL") + ": must be > 0");
        c.instrument.saturationIfAbsent = sat;
        k.applied("SATUR_LEVEL",
                  "instrument.saturationIfAbsent (where the header lacks " + k.v["SATUR_KEY"] + ")");
    }
    if (k.v.count("GAIN")) {
        const double gain = r.number("GAIN", k.get("GAIN"));
        if (gain > 0.0) {
            c.instrument.gainIfAbsent = gain;
            k.applied("GAIN", "instrument.gainIfAbsent (where the header lacks " + k.v["GAIN_KEY"] + ")");
        } else if (gain == 0.0) {
            k.m.differences.push_back("GAIN 0 (no photon noise where the header lacks " + k.v["GAIN_KEY"] +
                                      "): gpuphot's own errors then take a gain of 1; the windowed "
                                      "SNR_WIN and FLUXERR_WIN have no photon noise, as SExtractor's");
        } else {
            throw InvalidInput(r.where("GAIN") + ": must be >= 0");
        }
    }
    k.get("PIXEL_SCALE"); // (used by DETECT_THRESH in mag/arcsec^2)
}

// BACK_TYPE, BACK_SIZE, BACK_FILTERSIZE, BACK_FILTTHRESH -> the background mesh (SExtractor's spline).
void applyBackgroundKeys(KeyState& k, BackgroundParams& b) {
    const Reader& r = k.r;
    const std::string bt = r.upper(r.list("BACK_TYPE", k.get("BACK_TYPE"))[0]);
    b.manualLevel.reset();
    if (bt == "MANUAL") {
        if (!k.v.count("BACK_VALUE") || trimmed(k.v["BACK_VALUE"]).empty())
            throw InvalidInput(r.where("BACK_TYPE") + ": MANUAL needs BACK_VALUE");
        b.manualLevel = r.number("BACK_VALUE", r.list("BACK_VALUE", k.get("BACK_VALUE"))[0]);
        k.applied("BACK_TYPE", "background.manualLevel = BACK_VALUE");
    } else if (bt != "AUTO") {
        throw InvalidInput(r.where("BACK_TYPE") + ": AUTO or MANUAL");
    }
    const std::vector<std::string> bs = r.list("BACK_SIZE", k.get("BACK_SIZE"));
    b.meshSize = r.integer("BACK_SIZE", bs[0]);
    b.meshHeight = bs.size() > 1 ? r.integer("BACK_SIZE", bs[1]) : 0;
    const std::vector<std::string> bf = r.list("BACK_FILTERSIZE", k.get("BACK_FILTERSIZE"));
    b.filterSize = r.integer("BACK_FILTERSIZE", bf[0]);
    b.filterHeight = bf.size() > 1 ? r.integer("BACK_FILTERSIZE", bf[1]) : 0;
    b.filterThreshold = r.number("BACK_FILTTHRESH", k.get("BACK_FILTTHRESH"));
    b.sextractorSpline = true;
    k.applied("BACK_SIZE", "background.meshSize, meshHeight");
    k.applied("BACK_FILTERSIZE", "background.filterSize, filterHeight");
    k.applied("BACK_FILTTHRESH", "background.filterThreshold (and background.sextractorSpline = true)");
}

// The catalog keys, then the output modes gpuphot does not produce (CHECKIMAGE_TYPE, WRITE_XML, DGEO_TYPE).
void applyOutputKeys(KeyState& k) {
    const Reader& r = k.r;
    applyCatalogKeys(r, k.v, k.done, k.m);
    if (k.v.count("CHECKIMAGE_TYPE") && r.upper(k.get("CHECKIMAGE_TYPE")) != "NONE")
        k.unsupported("CHECKIMAGE_TYPE");
    if (k.v.count("WRITE_XML") && r.yesNo("WRITE_XML", k.get("WRITE_XML"))) k.unsupported("WRITE_XML");
    if (k.v.count("DGEO_TYPE") && r.upper(k.get("DGEO_TYPE")) != "NONE") k.unsupported("DGEO_TYPE");
}

// The given keys no handler consumed, in the order given: inert ones are noted, the rest unsupported.
void reportRemainingKeys(KeyState& k) {
    for (const std::string& key : k.order) {
        if (k.done.count(key)) continue;
        if (inertKeys().count(key)) // only for columns, files or modes gpuphot does not produce
            k.m.applied.push_back(key + " " + k.v[key] + " -> no effect here");
        else
            k.unsupported(key);
    }
}

// Every parameter a SExtractor key sets must lie in its table's range, as a --config value must: an
// error names the SExtractor key, the file and the parameter.
void checkMappedRanges(const Reader& r, const PipelineConfig& c) {
    for (const ParamDef& def : paramTable()) {
        if (def.sextractor.empty()) continue;
        const std::optional<nlohmann::json> v = encodedParam(def, c);
        if (!v) continue;
        try {
            checkParamValue(def, *v);
        } catch (const InvalidInput& e) {
            const std::string key = def.sextractor.substr(0, def.sextractor.find(' '));
            throw InvalidInput(r.where(key) + ": " + e.what());
        }
    }
}

} // namespace

SextractorMapping applySextractorSettings(const SextractorSettings& s, PipelineConfig& c) {
    SextractorMapping m;
    KeyState k(s, m);
    applyDetectKeys(k, c.detection);
    applyFilterKeys(k, c.detection);
    applyDeblendKeys(k, c.detection);
    applyWeightKeys(k, c);
    applyPhotometryKeys(k, c.aperture);
    applyInstrumentKeys(k, c);
    applyBackgroundKeys(k, c.background);
    applyOutputKeys(k);
    reportRemainingKeys(k);
    checkMappedRanges(k.r, c);
    return m;
}

} // namespace gpuphot
