#include "core/catalog/reference_catalog.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

std::string trimmed(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
        s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
        s.remove_suffix(1);
    return std::string(s);
}

// The column of `available` called `name`: exact match first, then case-insensitive. "" if none.
std::string findColumn(const std::vector<std::string>& available, std::string_view name) {
    for (const auto& a : available)
        if (a == name) return a;
    const std::string l = lower(name);
    for (const auto& a : available)
        if (lower(a) == l) return a;
    return {};
}

std::string firstOf(const std::vector<std::string>& available, const std::vector<std::string>& candidates) {
    for (const auto& c : candidates)
        if (auto f = findColumn(available, c); !f.empty()) return f;
    return {};
}

std::string joinNames(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names)
        s += (s.empty() ? "" : ", ") + n;
    return s.empty() ? "none" : s;
}

const std::vector<std::string> kRa = {"RA",          "RA_ICRS",        "RAJ2000", "_RAJ2000",
                                      "ALPHA_J2000", "ALPHAWIN_J2000", "RA_DEG",  "RADEG"};
const std::vector<std::string> kDec = {"DEC",         "DE_ICRS",        "DEJ2000", "_DEJ2000", "DECJ2000",
                                       "DELTA_J2000", "DELTAWIN_J2000", "DEC_DEG", "DECDEG"};
const std::vector<std::string> kMag = {"mag",     "phot_g_mean_mag", "G", "Gmag", "r", "rmag", "r_mag",
                                       "VT",      "VTmag",           "V", "Vmag", "R", "Rmag", "MAG",
                                       "MAG_AUTO"};
const std::vector<std::string> kColor = {"bp_rp"};
const std::vector<std::string> kPmRa = {"pmra", "pmRA", "pm_ra", "pmRAcosDE"};
const std::vector<std::string> kPmDec = {"pmdec", "pmDE", "pm_dec"};
const std::vector<std::string> kId = {"source_id", "id", "objid", "object_id"};
const std::vector<std::string> kEpoch = {"ref_epoch", "epoch"};

// Column names resolved against one file's columns.
struct Resolved {
    std::string ra, dec, mag, magErr, magFoe, colorA, colorB, pmRa, pmDec, id, epoch;
    bool idExplicit = false;

    std::vector<std::string> all() const {
        std::vector<std::string> v;
        for (const std::string* s :
             {&ra, &dec, &mag, &magErr, &magFoe, &colorA, &colorB, &pmRa, &pmDec, &id, &epoch})
            if (!s->empty() && std::find(v.begin(), v.end(), *s) == v.end()) v.push_back(*s);
        return v;
    }
};

Resolved resolve(const std::vector<std::string>& available, const RefColumnMap& map,
                 const std::string& path) {
    auto missing = [&](const std::string& role, const std::string& name) -> InvalidInput {
        return InvalidInput("reference catalog " + path + ": no column '" + name + "' (" + role +
                            "); available columns: " + joinNames(available));
    };
    auto required = [&](const std::string& given, const std::vector<std::string>& candidates,
                        const std::string& role, const std::string& key) {
        if (!given.empty()) {
            auto f = findColumn(available, given);
            if (f.empty()) throw missing(role, given);
            return f;
        }
        auto f = firstOf(available, candidates);
        if (f.empty())
            throw InvalidInput("reference catalog " + path + ": no " + role + " column found (looked for " +
                               joinNames(candidates) + "); available columns: " + joinNames(available) +
                               "; name it with " + key + "=COLUMN");
        return f;
    };
    auto optional = [&](const std::string& given, const std::vector<std::string>& candidates,
                        const std::string& role) -> std::string {
        if (lower(given) == "none") return {};
        if (!given.empty()) {
            auto f = findColumn(available, given);
            if (f.empty()) throw missing(role, given);
            return f;
        }
        return firstOf(available, candidates);
    };

    Resolved r;
    r.ra = required(map.ra, kRa, "RA", "ra");
    r.dec = required(map.dec, kDec, "Dec", "dec");
    r.mag = required(map.mag, kMag, "magnitude", "mag");
    if (lower(map.magErr) != "none") {
        if (!map.magErr.empty()) {
            r.magErr = optional(map.magErr, {}, "magnitude error");
        } else {
            r.magErr = firstOf(available, {"e_" + r.mag, r.mag + "_err", r.mag + "_error", "err_" + r.mag});
            const std::string lm = lower(r.mag);
            if (r.magErr.empty() && lm.size() > 9 && lm.substr(lm.size() - 9) == "_mean_mag") // Gaia
                r.magFoe = findColumn(available, r.mag.substr(0, r.mag.size() - 3) + "flux_over_error");
        }
    }
    if (!map.color.empty() && lower(map.color) != "none") {
        if (auto f = findColumn(available, map.color); !f.empty()) {
            r.colorA = f;
        } else {
            for (std::size_t p = map.color.find('-'); p != std::string::npos;
                 p = map.color.find('-', p + 1)) {
                auto a = findColumn(available, trimmed(map.color.substr(0, p)));
                auto b = findColumn(available, trimmed(map.color.substr(p + 1)));
                if (!a.empty() && !b.empty()) {
                    r.colorA = a;
                    r.colorB = b;
                    break;
                }
            }
            if (r.colorA.empty())
                throw InvalidInput(
                    "reference catalog " + path + ": colour '" + map.color +
                    "' is neither a column nor a difference of two columns (\"A-B\"); available columns: " +
                    joinNames(available));
        }
    } else if (map.color.empty()) {
        r.colorA = firstOf(available, kColor);
    }
    r.pmRa = optional(map.pmRa, kPmRa, "proper motion in RA");
    r.pmDec = optional(map.pmDec, kPmDec, "proper motion in Dec");
    r.idExplicit = !map.id.empty() && lower(map.id) != "none";
    r.id = optional(map.id, kId, "id");
    if (!map.epochExplicit) r.epoch = firstOf(available, kEpoch);
    return r;
}

// Parses "hh:mm:ss.s", "dd mm ss", "12h34m56.7s", "-05d12m30s" (one to three parts).
std::optional<double> parseSexagesimal(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
        s.remove_prefix(1);
    double sign = 1;
    if (!s.empty() && (s.front() == '-' || s.front() == '+')) {
        if (s.front() == '-') sign = -1;
        s.remove_prefix(1);
    }
    double parts[3] = {0, 0, 0};
    int n = 0;
    std::size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && !std::isdigit(static_cast<unsigned char>(s[i])) && s[i] != '.') {
            const char c = s[i];
            if (!(c == ':' || c == ' ' || c == 'h' || c == 'm' || c == 's' || c == 'd' || c == '\'' ||
                  c == '"' || c == '\t' || static_cast<unsigned char>(c) >= 0x80))
                return std::nullopt;
            ++i;
        }
        if (i >= s.size()) break;
        if (n == 3) return std::nullopt;
        std::size_t j = i;
        while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.'))
            ++j;
        double v;
        if (!parseNumber(s.substr(i, j - i), v)) return std::nullopt;
        parts[n++] = v;
        i = j;
    }
    if (n == 0 || parts[1] >= 60 || parts[2] >= 60) return std::nullopt;
    return sign * (parts[0] + parts[1] / 60.0 + parts[2] / 3600.0);
}

bool isMissingText(std::string_view s) {
    static const char* words[] = {"null", "na", "n/a", "--", "masked", "none", "-"};
    if (s.empty()) return true;
    const std::string l = lower(s);
    return std::any_of(std::begin(words), std::end(words), [&](const char* w) { return l == w; });
}

enum class Role { Plain, Ra, Dec };

// A text value as a number; RA/Dec also sexagesimal (RA in hours). nullopt when unparseable.
std::optional<double> textValue(std::string_view s, Role role) {
    double v;
    if (parseNumber(s, v)) return v;
    if (isMissingText(s)) return kNaN;
    if (role != Role::Plain)
        if (auto sx = parseSexagesimal(s)) return role == Role::Ra ? *sx * 15.0 : *sx;
    return std::nullopt;
}

[[noreturn]] void badValue(const std::string& path, const std::string& where, const std::string& column,
                           std::string_view value) {
    throw InvalidInput("reference catalog " + path + ": " + where + ", column '" + column + "': '" +
                       std::string(value) + "' is not a number");
}

// The values of one column of a Table as doubles (strings parsed as text).
std::vector<double> columnValues(const Table& t, const std::string& name, Role role,
                                 const std::string& path) {
    const Column& c = t.at(name);
    if (const auto* s = std::get_if<std::vector<std::string>>(&c.data)) {
        std::vector<double> out(s->size());
        for (std::size_t i = 0; i < s->size(); ++i) {
            auto v = textValue(trimmed((*s)[i]), role);
            if (!v) badValue(path, "row " + std::to_string(i + 1), name, (*s)[i]);
            out[i] = *v;
        }
        return out;
    }
    return t.doubles(name);
}

// Raw per-row values gathered from either file type.
struct RawColumns {
    std::vector<double> ra, dec, mag, magErr, magFoe, colorA, colorB, pmRa, pmDec, epoch;
    std::vector<std::int64_t> id;
    bool idUsable = false;
    std::size_t rows = 0;
};

RawColumns gatherFits(const std::string& path, const RefColumnMap& map, Resolved& res) {
    Table t = readFitsTable(path, map.hdu, [&](const std::vector<std::string>& available) {
        res = resolve(available, map, path);
        return res.all();
    });
    RawColumns raw;
    raw.rows = t.rows();
    auto get = [&](const std::string& name, Role role = Role::Plain) {
        return name.empty() ? std::vector<double>{} : columnValues(t, name, role, path);
    };
    raw.ra = get(res.ra, Role::Ra);
    raw.dec = get(res.dec, Role::Dec);
    raw.mag = get(res.mag);
    raw.magErr = get(res.magErr);
    raw.magFoe = get(res.magFoe);
    raw.colorA = get(res.colorA);
    raw.colorB = get(res.colorB);
    raw.pmRa = get(res.pmRa);
    raw.pmDec = get(res.pmDec);
    raw.epoch = get(res.epoch);
    if (!res.id.empty()) {
        const Column& c = t.at(res.id);
        raw.idUsable = true;
        if (const auto* v64 = std::get_if<std::vector<std::int64_t>>(&c.data)) {
            raw.id = *v64;
        } else if (std::holds_alternative<std::vector<std::string>>(c.data)) {
            const auto& s = c.as<std::string>();
            raw.id.resize(s.size());
            for (std::size_t i = 0; i < s.size() && raw.idUsable; ++i) {
                const std::string v = trimmed(s[i]);
                auto r = std::from_chars(v.data(), v.data() + v.size(), raw.id[i]);
                raw.idUsable = r.ec == std::errc() && r.ptr == v.data() + v.size();
            }
        } else {
            raw.id.resize(t.rows());
            for (std::size_t i = 0; i < t.rows() && raw.idUsable; ++i) {
                const double v = c.asDouble(i);
                raw.idUsable = std::isfinite(v) && std::floor(v) == v && std::fabs(v) < 9.0e18;
                raw.id[i] = raw.idUsable ? static_cast<std::int64_t>(v) : 0;
            }
        }
    }
    return raw;
}

RawColumns gatherText(const std::string& path, const std::string& text, const RefColumnMap& map,
                      Resolved& res) {
    std::vector<std::string_view> fields;
    std::string scratch;
    std::vector<std::string> names;
    char delim = ',';
    std::size_t pos = 0, lineNo = 0;
    // Header: the first line that is neither blank nor a comment.
    while (pos < text.size()) {
        std::size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string_view line(text.data() + pos, end - pos);
        pos = std::min(end + 1, text.size()); // a header without a final newline ends the text
        ++lineNo;
        const std::string t = trimmed(line);
        if (t.empty() || t.front() == '#') continue;
        delim = detectDelimiter(line);
        splitRecord(line, delim, fields, scratch);
        for (auto f : fields)
            names.emplace_back(f);
        break;
    }
    if (names.empty())
        throw InvalidInput("reference catalog " + path + ": no header line (empty or only comments)");
    res = resolve(names, map, path);

    auto index = [&](const std::string& name) -> int {
        if (name.empty()) return -1;
        return static_cast<int>(std::find(names.begin(), names.end(), name) - names.begin());
    };
    struct Target {
        int field;
        std::vector<double>* out;
        Role role;
        const std::string* name;
    };
    RawColumns raw;
    std::vector<Target> targets;
    auto want = [&](const std::string& name, std::vector<double>& out, Role role = Role::Plain) {
        if (int i = index(name); i >= 0) targets.push_back({i, &out, role, &name});
    };
    want(res.ra, raw.ra, Role::Ra);
    want(res.dec, raw.dec, Role::Dec);
    want(res.mag, raw.mag);
    want(res.magErr, raw.magErr);
    want(res.magFoe, raw.magFoe);
    want(res.colorA, raw.colorA);
    want(res.colorB, raw.colorB);
    want(res.pmRa, raw.pmRa);
    want(res.pmDec, raw.pmDec);
    want(res.epoch, raw.epoch);
    const int idField = index(res.id);
    raw.idUsable = idField >= 0;

    // A rough row count to reserve with (avoids repeated growth for millions of rows).
    const std::size_t guess = static_cast<std::size_t>(std::count(
                                  text.begin() + static_cast<std::ptrdiff_t>(pos), text.end(), '\n')) +
                              1;
    for (auto& t : targets)
        t.out->reserve(guess);
    if (raw.idUsable) raw.id.reserve(guess);

    while (pos < text.size()) {
        std::size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string_view line(text.data() + pos, end - pos);
        pos = end + 1;
        ++lineNo;
        std::size_t k = 0;
        while (k < line.size() && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r'))
            ++k;
        if (k == line.size() || line[k] == '#') continue;
        splitRecord(line, delim, fields, scratch);
        if (fields.size() != names.size())
            throw InvalidInput("reference catalog " + path + " line " + std::to_string(lineNo) + ": " +
                               std::to_string(fields.size()) + " fields, the header has " +
                               std::to_string(names.size()));
        for (const Target& t : targets) {
            const std::string_view f = fields[static_cast<std::size_t>(t.field)];
            double v;
            if (parseNumber(f, v)) {
                t.out->push_back(v);
            } else if (auto tv = textValue(f, t.role)) {
                t.out->push_back(*tv);
            } else {
                badValue(path, "line " + std::to_string(lineNo), *t.name, f);
            }
        }
        if (raw.idUsable) {
            const std::string_view f = fields[static_cast<std::size_t>(idField)];
            std::int64_t v = 0;
            auto r = std::from_chars(f.data(), f.data() + f.size(), v);
            raw.idUsable = r.ec == std::errc() && r.ptr == f.data() + f.size();
            raw.id.push_back(v);
        }
        ++raw.rows;
    }
    return raw;
}

bool looksBinary(const std::string& head) {
    return std::any_of(head.begin(), head.end(), [](char c) { return c == '\0'; });
}

} // namespace

// ---------------------------------------------------------------------------------------------------
RefColumnMap parseRefColumnMap(const std::string& text) {
    RefColumnMap map;
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t end = text.find(',', start);
        if (end == std::string::npos) end = text.size();
        const std::string item = trimmed(std::string_view(text).substr(start, end - start));
        start = end + 1;
        if (item.empty()) {
            if (end == text.size()) break;
            continue;
        }
        const auto eq = item.find('=');
        if (eq == std::string::npos)
            throw InvalidInput("reference column map '" + text + "': entry '" + item + "' is not KEY=COLUMN");
        const std::string key = lower(trimmed(item.substr(0, eq)));
        const std::string value = trimmed(item.substr(eq + 1));
        if (key == "ra")
            map.ra = value;
        else if (key == "dec")
            map.dec = value;
        else if (key == "mag")
            map.mag = value;
        else if (key == "magerr" || key == "mag_err" || key == "e_mag")
            map.magErr = value;
        else if (key == "color" || key == "colour")
            map.color = value;
        else if (key == "pmra")
            map.pmRa = value;
        else if (key == "pmdec")
            map.pmDec = value;
        else if (key == "id")
            map.id = value;
        else if (key == "hdu")
            map.hdu = value;
        else if (key == "epoch") {
            std::string e = value;
            if (!e.empty() && (e.front() == 'J' || e.front() == 'j')) e.erase(e.begin());
            double v;
            if (!parseNumber(e, v) || !std::isfinite(v))
                throw InvalidInput("reference column map '" + text + "': epoch '" + value +
                                   "' is not a year");
            map.epoch = v;
            map.epochExplicit = true;
        } else {
            throw InvalidInput("reference column map '" + text + "': unknown key '" + key +
                               "' (known: ra, dec, mag, magerr, color, pmra, pmdec, id, hdu, epoch)");
        }
        if (end == text.size()) break;
    }
    return map;
}

ReferenceCatalog readReferenceCatalog(const std::string& path, const RefColumnMap& map) {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw IoError("cannot read reference catalog " + path + ": no such file");
    if (fs::is_directory(path, ec))
        throw IoError("cannot read reference catalog " + path + ": is a directory");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError("cannot read reference catalog " + path + ": " + std::strerror(errno));
    std::string head(4096, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(in.gcount()));
    if (head.empty()) throw InvalidInput("reference catalog " + path + " is empty");

    const bool fits =
        head.rfind("SIMPLE  =", 0) == 0 || (head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
                                            static_cast<unsigned char>(head[1]) == 0x8b);
    Resolved res;
    RawColumns raw;
    if (fits) {
        in.close();
        raw = gatherFits(path, map, res);
    } else {
        if (looksBinary(head))
            throw InvalidInput("reference catalog " + path +
                               " is neither a FITS file nor a text (CSV) table");
        in.clear(); // the 4 KiB probe may have hit the end of a small file
        in.seekg(0, std::ios::end);
        std::string text(static_cast<std::size_t>(in.tellg()), '\0');
        in.seekg(0);
        in.read(text.data(), static_cast<std::streamsize>(text.size()));
        if (!in) throw IoError("cannot read reference catalog " + path + ": read failed");
        raw = gatherText(path, text, map, res);
    }
    if (!raw.idUsable && res.idExplicit)
        throw InvalidInput("reference catalog " + path + ": id column '" + res.id +
                           "' does not hold integers");

    ReferenceCatalog cat;
    cat.path = path;
    cat.rowsRead = raw.rows;
    cat.epoch = map.epoch;
    cat.columns.ra = res.ra;
    cat.columns.dec = res.dec;
    cat.columns.mag = res.mag;
    cat.columns.magErr = !res.magErr.empty() ? res.magErr : res.magFoe;
    cat.columns.color = res.colorB.empty() ? res.colorA : res.colorA + "-" + res.colorB;
    cat.columns.pmRa = res.pmRa;
    cat.columns.pmDec = res.pmDec;
    cat.columns.id = raw.idUsable ? res.id : std::string();
    cat.columns.hdu = map.hdu;
    cat.columns.epoch = map.epoch;
    cat.columns.epochExplicit = map.epochExplicit;

    if (!raw.epoch.empty()) {
        double e = kNaN;
        bool uniform = true;
        for (double v : raw.epoch) {
            if (!std::isfinite(v)) continue;
            if (std::isnan(e))
                e = v;
            else if (v != e)
                uniform = false;
        }
        if (uniform && std::isfinite(e)) cat.epoch = cat.columns.epoch = e;
    }

    const std::size_t n = raw.rows;
    auto at = [](const std::vector<double>& v, std::size_t i) { return v.empty() ? kNaN : v[i]; };
    constexpr double kMagPerFoe = 1.0857362047581294; // 2.5 / ln(10)
    for (auto* v : {&cat.ra, &cat.dec, &cat.mag, &cat.magErr, &cat.color, &cat.pmRa, &cat.pmDec})
        v->reserve(n);
    cat.id.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double ra = raw.ra[i], dec = raw.dec[i], mag = raw.mag[i];
        if (!std::isfinite(ra) || !std::isfinite(dec) || !std::isfinite(mag)) {
            ++cat.skippedNonFinite;
            continue;
        }
        if (dec < -90.0 || dec > 90.0 || ra < -360.0 || ra > 720.0)
            throw InvalidInput("reference catalog " + path + ": row " + std::to_string(i + 1) + " has RA " +
                               formatNumber(ra) + ", Dec " + formatNumber(dec) +
                               ", outside the range of degrees (columns " + res.ra + ", " + res.dec + ")");
        cat.ra.push_back(ra);
        cat.dec.push_back(dec);
        cat.mag.push_back(mag);
        double err = at(raw.magErr, i);
        if (raw.magErr.empty() && !raw.magFoe.empty()) {
            const double foe = raw.magFoe[i];
            err = (std::isfinite(foe) && foe > 0) ? kMagPerFoe / foe : kNaN;
        }
        cat.magErr.push_back(err);
        cat.color.push_back(raw.colorB.empty() ? at(raw.colorA, i) : at(raw.colorA, i) - at(raw.colorB, i));
        cat.pmRa.push_back(at(raw.pmRa, i));
        cat.pmDec.push_back(at(raw.pmDec, i));
        cat.id.push_back(raw.idUsable ? raw.id[i] : static_cast<std::int64_t>(i + 1));
    }
    if (cat.empty())
        throw InvalidInput("reference catalog " + path + " has no usable rows (" + std::to_string(n) +
                           " rows, " + std::to_string(cat.skippedNonFinite) + " without a finite " + res.ra +
                           ", " + res.dec + " and " + res.mag + ")");
    return cat;
}

void applyProperMotion(ReferenceCatalog& cat, double epoch) {
    const double dt = epoch - cat.epoch;
    constexpr double kMasToDeg = 1.0 / 3.6e6;
    constexpr double kDegToRad = 3.14159265358979323846 / 180.0;
    for (std::size_t i = 0; i < cat.size(); ++i) {
        const double pmRa = cat.pmRa[i], pmDec = cat.pmDec[i];
        if (!std::isfinite(pmRa) || !std::isfinite(pmDec)) continue;
        const double cosDec = std::cos(cat.dec[i] * kDegToRad);
        if (cosDec > 1e-9) cat.ra[i] += pmRa * dt * kMasToDeg / cosDec;
        cat.dec[i] += pmDec * dt * kMasToDeg;
        cat.ra[i] = std::fmod(cat.ra[i], 360.0);
        if (cat.ra[i] < 0) cat.ra[i] += 360.0;
    }
    cat.epoch = epoch;
}

} // namespace gpuphot
