#include "core/io/target_list.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/util/errors.hpp"
#include "core/util/text.hpp"

namespace gpuphot {
namespace {

std::string_view trim(std::string_view s) {
    return trimView(s);
}

const Column* firstColumn(const Table& t, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (const Column* c = t.find(n)) return c;
    return nullptr;
}

bool isFits(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError("targets file " + path + ": cannot be opened");
    char head[9] = {};
    in.read(head, 9);
    const auto n = in.gcount();
    if (n >= 2 && static_cast<unsigned char>(head[0]) == 0x1f && static_cast<unsigned char>(head[1]) == 0x8b)
        return true; // gzip: only FITS is read compressed
    return n == 9 && std::string_view(head, 9) == "SIMPLE  =";
}

// One value of a position column in degrees: numbers as they are; text as decimal degrees or
// sexagesimal (RA in hours).
double angleOf(const Column& c, std::size_t row, bool isRa, const std::string& path) {
    if (!std::holds_alternative<std::vector<std::string>>(c.data)) return c.asDouble(row);
    const std::string_view text = trim(c.as<std::string>()[row]);
    double v;
    if (parseNumber(text, v)) return v;
    if (auto s = parseSexagesimalAngle(text)) return isRa ? *s * 15.0 : *s;
    throw InvalidInput("targets file " + path + ", row " + std::to_string(row + 1) + ": column " + c.name +
                       " value '" + std::string(text) + "' is neither degrees nor sexagesimal");
}

// "hh:mm:ss.s +dd:mm:ss" (or "hh mm ss.s +dd mm ss", or two decimal numbers) -> (ra, dec) in degrees.
bool splitCoord(std::string_view text, double& ra, double& dec) {
    std::vector<std::string_view> tokens;
    text = trim(text);
    std::size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ','))
            ++i;
        std::size_t j = i;
        while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j])) && text[j] != ',')
            ++j;
        if (j > i) tokens.push_back(text.substr(i, j - i));
        i = j;
    }
    std::string raText, decText;
    auto join = [&](std::size_t from, std::size_t to) {
        std::string s;
        for (std::size_t k = from; k < to; ++k)
            s += std::string(tokens[k]) + (k + 1 < to ? " " : "");
        return s;
    };
    if (tokens.size() == 2) {
        raText = tokens[0];
        decText = tokens[1];
    } else if (tokens.size() == 6) {
        raText = join(0, 3);
        decText = join(3, 6);
    } else {
        return false;
    }
    double a, b;
    if (parseNumber(raText, a) && parseNumber(decText, b)) {
        ra = a;
        dec = b;
        return true;
    }
    const auto sa = parseSexagesimalAngle(raText), sd = parseSexagesimalAngle(decText);
    if (!sa || !sd) return false;
    ra = *sa * 15.0;
    dec = *sd;
    return true;
}

std::string nameOf(const Column& c, std::size_t row) {
    if (std::holds_alternative<std::vector<std::string>>(c.data))
        return std::string(trim(c.as<std::string>()[row]));
    const double v = c.asDouble(row);
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15)
        return std::to_string(static_cast<long long>(v));
    return formatNumber(v);
}

} // namespace

std::optional<double> parseSexagesimalAngle(std::string_view text) {
    text = trim(text);
    double sign = 1.0;
    if (!text.empty() && (text.front() == '+' || text.front() == '-')) {
        sign = text.front() == '-' ? -1.0 : 1.0;
        text.remove_prefix(1);
    }
    double parts[3] = {0.0, 0.0, 0.0};
    int n = 0;
    bool separated = false; // at least one separator: a bare number is not sexagesimal
    std::size_t i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
            if (n == 3) return std::nullopt;
            std::size_t j = i;
            while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.'))
                ++j;
            double v;
            if (!parseNumber(text.substr(i, j - i), v)) return std::nullopt;
            parts[n++] = v;
            i = j;
        } else if (c == ':' || c == ' ' || c == '\t' || c == 'h' || c == 'm' || c == 's' || c == 'd' ||
                   c == '\'' || c == '"' ||
                   static_cast<unsigned char>(c) >= 0x80) { // 0x80+: the bytes of a UTF-8 degree sign
            separated = true;
            ++i;
        } else {
            return std::nullopt;
        }
    }
    if (n < 2 || !separated || parts[1] >= 60.0 || parts[2] >= 60.0) return std::nullopt;
    return sign * (parts[0] + parts[1] / 60.0 + parts[2] / 3600.0);
}

TargetList readTargetList(const std::string& path) {
    Table t = isFits(path) ? readFitsTable(path) : readCsv(path);
    TargetList out;
    out.path = path;
    const Column* ra =
        firstColumn(t, {"ra", "ra_deg", "radeg", "raj2000", "_raj2000", "ra_icrs", "alpha_j2000"});
    const Column* dec = firstColumn(
        t, {"dec", "dec_deg", "decdeg", "dej2000", "decj2000", "_dej2000", "de_icrs", "delta_j2000"});
    const Column* coord = firstColumn(t, {"coord", "coords", "coordinates", "position", "radec"});
    const Column* name = firstColumn(t, {"name", "target", "object", "id", "source_id"});
    if (!(ra && dec) && !coord) {
        std::string names;
        for (const auto& c : t.columns())
            names += (names.empty() ? "" : ", ") + c.name;
        throw InvalidInput("targets file " + path + ": no ra/dec (or coord) columns; the table has: " +
                           (names.empty() ? std::string("no columns") : names));
    }
    const std::size_t n = t.rows();
    if (n == 0) throw InvalidInput("targets file " + path + ": no rows");
    out.ra.resize(n);
    out.dec.resize(n);
    out.name.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        const std::string where = "targets file " + path + ", row " + std::to_string(i + 1);
        if (ra && dec) {
            out.ra[i] = angleOf(*ra, i, true, path);
            out.dec[i] = angleOf(*dec, i, false, path);
        } else if (!std::holds_alternative<std::vector<std::string>>(coord->data) ||
                   !splitCoord(coord->as<std::string>()[i], out.ra[i], out.dec[i])) {
            throw InvalidInput(where + ": column " + coord->name + " is not \"hh:mm:ss.s +dd:mm:ss\"");
        }
        if (!std::isfinite(out.ra[i]) || !std::isfinite(out.dec[i]))
            throw InvalidInput(where + ": RA or Dec is missing (NaN)");
        if (out.ra[i] < 0.0 || out.ra[i] >= 360.0 || std::fabs(out.dec[i]) > 90.0)
            throw InvalidInput(where + ": RA " + formatNumber(out.ra[i]) + ", Dec " +
                               formatNumber(out.dec[i]) +
                               " out of range (0 <= RA < 360, |Dec| <= 90 degrees)");
        out.name[i] = name ? nameOf(*name, i) : std::to_string(i + 1);
    }
    out.raColumn = ra && dec ? ra->name : coord->name;
    out.decColumn = ra && dec ? dec->name : coord->name;
    out.nameColumn = name ? name->name : "";
    return out;
}

} // namespace gpuphot
