#include "core/io/ds9_regions.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>

#include "core/catalog/table.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/text_catalog.hpp"
#include "core/model/flags.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

Ds9RegionError::Ds9RegionError(const std::string& message, int line)
    : InvalidInput(line > 0 ? "DS9 regions line " + std::to_string(line) + ": " + message : message),
      m_line(line) {}

namespace {

constexpr double kDegPerRad = 180.0 / std::numbers::pi;

std::string trim(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
        s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
        s.remove_suffix(1);
    return std::string(s);
}

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

bool isSky(RegionSystem s) {
    return s == RegionSystem::Fk5 || s == RegionSystem::Icrs;
}

// One line into its statements (split at ';' outside parentheses and braces) and the properties after the
// first '#' outside them (which belong to the last statement).
void splitLine(const std::string& line, std::vector<std::string>& statements, std::string& properties) {
    statements.clear();
    properties.clear();
    std::string cur;
    int depth = 0;
    for (std::size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (c == '{' || c == '(') { // no quotes: '"' is the arcsec unit inside the parentheses
            ++depth;
        } else if ((c == '}' || c == ')') && depth > 0) {
            --depth;
        } else if (c == ';' && depth == 0) {
            statements.push_back(trim(cur));
            cur.clear();
            continue;
        } else if (c == '#' && depth == 0) {
            properties = trim(std::string_view(line).substr(i + 1));
            break;
        }
        cur += c;
    }
    statements.push_back(trim(cur));
}

// text={...}, text="..." or text='...' and color=NAME out of `props`; the rest stays in `props`.
std::string takeProperty(std::string& props, const std::string& key, int line) {
    std::string low = lower(props);
    std::size_t at = 0;
    while ((at = low.find(key + "=", at)) != std::string::npos) {
        if (at == 0 || std::isspace(static_cast<unsigned char>(low[at - 1]))) break;
        at += key.size() + 1;
    }
    if (at == std::string::npos) return {};
    std::size_t v = at + key.size() + 1, end = v;
    std::string value;
    const char open = v < props.size() ? props[v] : '\0';
    if (open == '{' || open == '"' || open == '\'') {
        const char close = open == '{' ? '}' : open;
        end = props.find(close, v + 1);
        if (end == std::string::npos)
            throw Ds9RegionError(key + "= has no closing " + std::string(1, close), line);
        value = props.substr(v + 1, end - v - 1);
        ++end;
    } else {
        while (end < props.size() && !std::isspace(static_cast<unsigned char>(props[end])))
            ++end;
        value = props.substr(v, end - v);
    }
    props = trim(props.substr(0, at) + " " + props.substr(end));
    return value;
}

double parsePlain(const std::string& token, int line, const char* what) {
    double v = 0;
    if (!parseNumber(token, v) || !std::isfinite(v))
        throw Ds9RegionError(std::string("'") + token + "' is not a number (" + what + ")", line);
    return v;
}

// "10:00:24.5", "10h00m24.5s", "-02:12:00", "-2d12m00s" -> the value in the unit of its first field.
bool parseSexagesimal(std::string token, double& value) {
    if (token.find_first_of(":hdm") == std::string::npos) return false;
    for (char& c : token)
        if (c == 'h' || c == 'd' || c == 'm' || c == ':') c = ' ';
    if (!token.empty() && token.back() == 's') token.pop_back();
    std::istringstream in(token);
    std::string field;
    double parts[3] = {0, 0, 0};
    int n = 0;
    while (in >> field) {
        if (n == 3 || !parseNumber(field, parts[n])) return false;
        ++n;
    }
    if (n < 2) return false;
    const bool negative = token.find('-') != std::string::npos;
    value = std::fabs(parts[0]) + parts[1] / 60.0 + parts[2] / 3600.0;
    if (negative) value = -value;
    return true;
}

double parseCoordinate(const std::string& token, RegionSystem system, bool ra, int line) {
    if (!isSky(system)) return parsePlain(token, line, "position");
    double v = 0;
    if (parseSexagesimal(token, v)) return ra ? v * 15.0 : v;
    std::string t = token;
    if (!t.empty() && (t.back() == 'd' || t.back() == 'D')) t.pop_back();
    return parsePlain(t, line, ra ? "RA" : "Dec");
}

RegionSize parseSize(std::string token, RegionSystem system, int line) {
    RegionSize s{0.0, isSky(system)};
    double scale = 1.0;
    const char unit = token.empty() ? '\0' : token.back();
    if (unit == '"')
        scale = 1.0 / 3600.0, s.sky = true;
    else if (unit == '\'')
        scale = 1.0 / 60.0, s.sky = true;
    else if (unit == 'd')
        s.sky = true;
    else if (unit == 'i' || unit == 'p')
        s.sky = false;
    if (std::string("\"'dip").find(unit) != std::string::npos && unit != '\0') token.pop_back();
    s.value = parsePlain(token, line, "size") * scale;
    if (s.value < 0) throw Ds9RegionError("negative size " + token, line);
    return s;
}

std::vector<std::string> splitArguments(const std::string& args) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : args) {
        if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
            if (!cur.empty()) out.push_back(cur), cur.clear();
        } else {
            cur += c;
        }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}

struct ShapeSpec {
    const char* name;
    RegionShape shape;
    int sizes; // sizes after the centre
};
constexpr ShapeSpec kShapes[] = {{"circle", RegionShape::Circle, 1},
                                 {"box", RegionShape::Box, 2},
                                 {"polygon", RegionShape::Polygon, 0},
                                 {"point", RegionShape::Point, 0},
                                 {"ellipse", RegionShape::Ellipse, 2}};

void checkArgumentCount(RegionShape shape, int sizes, std::size_t n, const std::string& name, int line) {
    const bool angled = shape == RegionShape::Box || shape == RegionShape::Ellipse;
    const std::size_t need = 2 + static_cast<std::size_t>(sizes);
    bool ok = n == need || (angled && n == need + 1);
    if (shape == RegionShape::Polygon) ok = n >= 6 && n % 2 == 0;
    if (!ok)
        throw Ds9RegionError(
            name + " with " + std::to_string(n) + " arguments (expected " +
                (shape == RegionShape::Polygon
                     ? std::string("an even number, at least 6")
                     : std::to_string(need) + (angled ? " or " + std::to_string(need + 1) : "")) +
                ")",
            line);
}

void parseArguments(Region& r, const std::vector<std::string>& args, int sizes, int line) {
    const std::size_t nPoints = r.shape == RegionShape::Polygon ? args.size() : 2;
    for (std::size_t i = 0; i < nPoints; ++i)
        r.points.push_back(parseCoordinate(args[i], r.system, i % 2 == 0, line));
    for (int k = 0; k < sizes; ++k)
        r.sizes.push_back(parseSize(args[2 + static_cast<std::size_t>(k)], r.system, line));
    if (args.size() > nPoints + static_cast<std::size_t>(sizes)) {
        std::string a = args.back();
        if (!a.empty() && a.back() == 'd') a.pop_back();
        r.angle = parsePlain(a, line, "angle");
    }
}

Region parseShape(std::string stmt, RegionSystem system, int line) {
    Region r;
    r.system = system;
    r.line = line;
    if (!stmt.empty() && (stmt[0] == '-' || stmt[0] == '+')) {
        r.exclude = stmt[0] == '-';
        stmt = trim(std::string_view(stmt).substr(1));
    }
    std::size_t k = 0;
    while (k < stmt.size() && std::isalpha(static_cast<unsigned char>(stmt[k])))
        ++k;
    const std::string name = lower(stmt.substr(0, k));
    const ShapeSpec* spec = nullptr;
    for (const ShapeSpec& s : kShapes)
        if (name == s.name) spec = &s;
    if (!spec)
        throw Ds9RegionError(
            "unsupported region or keyword '" + stmt.substr(0, std::max<std::size_t>(k, 1)) + "'", line);
    r.shape = spec->shape;
    std::string args = trim(std::string_view(stmt).substr(k));
    if (!args.empty() && args.front() == '(') {
        const std::size_t close = args.find(')');
        if (close == std::string::npos) throw Ds9RegionError(name + ": no closing ')'", line);
        if (!trim(std::string_view(args).substr(close + 1)).empty())
            throw Ds9RegionError(name + ": unexpected text after ')'", line);
        args = args.substr(1, close - 1);
    }
    const std::vector<std::string> a = splitArguments(args);
    checkArgumentCount(r.shape, spec->sizes, a.size(), name, line);
    parseArguments(r, a, spec->sizes, line);
    return r;
}

// A system keyword: true (and `system` set) for a supported one; throws for a known unsupported one.
bool parseSystem(const std::string& stmt, RegionSystem& system, int line) {
    const std::string s = lower(stmt);
    if (s == "image")
        system = RegionSystem::Image;
    else if (s == "physical")
        system = RegionSystem::Physical;
    else if (s == "fk5" || s == "j2000")
        system = RegionSystem::Fk5;
    else if (s == "icrs")
        system = RegionSystem::Icrs;
    else if (s == "fk4" || s == "b1950" || s == "galactic" || s == "ecliptic" || s == "linear" ||
             s == "amplifier" || s == "detector" || s.rfind("wcs", 0) == 0)
        throw Ds9RegionError("coordinate system '" + stmt + "' is not supported (image, physical, fk5, icrs)",
                             line);
    else
        return false;
    return true;
}

void setProperties(Region& r, std::string props, int line) {
    r.text = takeProperty(props, "text", line);
    r.color = takeProperty(props, "color", line);
    r.properties = props;
}

struct ParseState {
    RegionFile file;
    RegionSystem system = RegionSystem::Physical; // DS9's default before any system line
    std::vector<std::string> statements;
    std::string props;
};

void parseLine(ParseState& st, const std::string& raw, int line) {
    const std::string t = trim(raw);
    if (t.empty()) return;
    if (t.front() == '#') {
        st.file.comments.push_back(t.substr(1));
        return;
    }
    splitLine(t, st.statements, st.props);
    for (std::size_t i = 0; i < st.statements.size(); ++i) {
        const std::string& stmt = st.statements[i];
        const bool last = i + 1 == st.statements.size();
        if (stmt.empty()) continue;
        if (lower(stmt.substr(0, 7)) == "global " || lower(stmt) == "global") {
            st.file.global = trim(std::string_view(stmt).substr(6));
            continue;
        }
        if (parseSystem(stmt, st.system, line)) continue;
        Region r = parseShape(stmt, st.system, line);
        if (last) setProperties(r, st.props, line);
        st.file.regions.push_back(std::move(r));
    }
}

const char* systemName(RegionSystem s) {
    switch (s) {
    case RegionSystem::Image:
        return "image";
    case RegionSystem::Physical:
        return "physical";
    case RegionSystem::Fk5:
        return "fk5";
    case RegionSystem::Icrs:
        return "icrs";
    }
    return "image";
}

const char* shapeName(RegionShape s) {
    for (const ShapeSpec& spec : kShapes)
        if (spec.shape == s) return spec.name;
    return "circle";
}

std::string formatSize(const RegionSize& s, RegionSystem system) {
    if (s.sky) return formatNumber(s.value * 3600.0) + "\"";
    return formatNumber(s.value) + (isSky(system) ? "i" : "");
}

void appendProperty(std::string& props, const char* key, const std::string& value, bool braces) {
    if (value.empty()) return;
    if (!props.empty()) props += ' ';
    props += key;
    props += braces ? "={" : "=";
    props += value;
    if (braces) props += '}';
}

void formatRegion(std::string& out, const Region& r) {
    if (r.exclude) out += '-';
    out += shapeName(r.shape);
    out += '(';
    for (std::size_t i = 0; i < r.points.size(); ++i) {
        if (i) out += ',';
        out += formatNumber(r.points[i]);
    }
    for (const RegionSize& s : r.sizes) {
        out += ',';
        out += formatSize(s, r.system);
    }
    if ((r.shape == RegionShape::Box || r.shape == RegionShape::Ellipse) && r.angle != 0.0) {
        out += ',';
        out += formatNumber(r.angle);
    }
    out += ')';
    std::string props = r.properties;
    appendProperty(props, "color", r.color, false);
    appendProperty(props, "text", r.text, true);
    if (!props.empty()) {
        out += " # ";
        out += props;
    }
    out += '\n';
}

double skyAngleOffset(const Wcs& wcs, double ra, double dec) {
    // DS9 measures a sky region's angle from the direction of decreasing RA (west, +x on a north-up,
    // east-left image): the image angle adds the angle of that direction on the image.
    const double step = 1.0 / 3600.0 / std::max(std::cos(dec / kDegPerRad), 1e-6);
    const auto [x0, y0] = wcs.worldToPixel(ra, dec);
    const auto [x1, y1] = wcs.worldToPixel(ra - step, dec);
    const double a = std::atan2(y1 - y0, x1 - x0) * kDegPerRad;
    return std::isfinite(a) ? a : 0.0;
}

} // namespace

RegionFile parseDs9Regions(const std::string& text) {
    ParseState st;
    std::istringstream in(text);
    std::string line;
    int lineNo = 0;
    while (std::getline(in, line)) {
        ++lineNo;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        parseLine(st, line, lineNo);
    }
    return std::move(st.file);
}

RegionFile readDs9Regions(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError("cannot read DS9 regions " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    try {
        return parseDs9Regions(ss.str());
    } catch (const Ds9RegionError& e) {
        throw Ds9RegionError(path + ": " + e.what(), e.line());
    }
}

std::string formatDs9Regions(const RegionFile& file) {
    std::string out = "# Region file format: DS9 version 4.1\n";
    for (const std::string& c : file.comments)
        if (trim(c).rfind("Region file format", 0) != 0) out += "#" + c + "\n";
    if (!file.global.empty()) out += "global " + file.global + "\n";
    const RegionSystem* current = nullptr;
    for (const Region& r : file.regions) {
        if (!current || *current != r.system) out += std::string(systemName(r.system)) + "\n";
        current = &r.system;
        formatRegion(out, r);
    }
    return out;
}

void writeDs9RegionFile(const std::string& path, const RegionFile& file) {
    writeTextFileAtomic(path, formatDs9Regions(file));
}

RegionFile catalogRegions(const Table& table, const Wcs* wcs, const CatalogRegionOptions& options) {
    const Column* xc = table.find("x");
    const Column* yc = table.find("y");
    if (!xc || !yc) throw InvalidInput("catalog regions: table " + table.name + " has no x or y column");
    const Column* idc = table.find(options.idCol);
    const Column* fc = table.find(options.flagsCol);
    RegionFile file;
    file.global = "color=" + options.cleanColor + " width=1 font=\"helvetica 10 normal roman\"";
    file.comments.push_back(std::string(" ") + (table.name.empty() ? "catalog" : table.name) +
                            ": green clean, yellow blended or crowded, red saturated or truncated");
    for (std::size_t i = 0; i < table.rows(); ++i) {
        const double x = xc->asDouble(i), y = yc->asDouble(i);
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        Region r;
        r.points = {x, y};
        r.sizes = {{options.radiusPixels, false}};
        if (wcs) {
            const auto [ra, dec] = wcs->pixelToWorld(x - 1.0, y - 1.0);
            const double scale = wcs->pixelScaleArcsec(x - 1.0, y - 1.0);
            if (std::isfinite(ra) && std::isfinite(dec) && std::isfinite(scale)) {
                r.system = RegionSystem::Fk5;
                r.points = {ra, dec};
                r.sizes = {{options.radiusPixels * scale / 3600.0, true}};
            }
        }
        const auto flags = fc ? static_cast<std::uint32_t>(fc->asDouble(i)) : 0u;
        if (flags & (FlagSaturated | FlagEdge | FlagApertureIncomplete))
            r.color = options.saturatedColor;
        else if (flags & (FlagBlended | FlagCrowded))
            r.color = options.blendedColor;
        if (idc) r.text = formatNumber(idc->asDouble(i));
        file.regions.push_back(std::move(r));
    }
    return file;
}

PixelRegion toPixels(const Region& region, const Wcs* wcs) {
    const bool skyPos = isSky(region.system);
    const bool skySize =
        std::any_of(region.sizes.begin(), region.sizes.end(), [](const RegionSize& s) { return s.sky; });
    if ((skyPos || skySize) && !wcs)
        throw InvalidInput("a region in " + std::string(systemName(region.system)) +
                           (skyPos ? "" : " with sizes on the sky") + " needs a WCS (the frame has none)");
    PixelRegion p;
    p.shape = region.shape;
    p.exclude = region.exclude;
    p.angle = region.angle;
    for (std::size_t i = 0; i + 1 < region.points.size(); i += 2) {
        double x = region.points[i] - 1.0, y = region.points[i + 1] - 1.0;
        if (skyPos) std::tie(x, y) = wcs->worldToPixel(region.points[i], region.points[i + 1]);
        if (!std::isfinite(x) || !std::isfinite(y))
            throw InvalidInput("a region position does not transform to the frame's pixels");
        p.points.push_back(x);
        p.points.push_back(y);
    }
    if (skyPos && !region.points.empty()) p.angle += skyAngleOffset(*wcs, region.points[0], region.points[1]);
    for (const RegionSize& s : region.sizes) {
        double v = s.value;
        if (s.sky) v = v * 3600.0 / wcs->pixelScaleArcsec(p.points[0], p.points[1]);
        if (!std::isfinite(v)) throw InvalidInput("a region size does not transform to pixels");
        p.sizes.push_back(v);
    }
    return p;
}

bool contains(const PixelRegion& r, double x, double y) {
    if (r.points.size() < 2) return false;
    const double dx = x - r.points[0], dy = y - r.points[1];
    const double c = std::cos(r.angle / kDegPerRad), s = std::sin(r.angle / kDegPerRad);
    const double u = dx * c + dy * s, v = -dx * s + dy * c; // in the shape's own axes
    switch (r.shape) {
    case RegionShape::Circle:
        return dx * dx + dy * dy <= r.sizes[0] * r.sizes[0];
    case RegionShape::Ellipse:
        return r.sizes[0] > 0 && r.sizes[1] > 0 &&
               (u / r.sizes[0]) * (u / r.sizes[0]) + (v / r.sizes[1]) * (v / r.sizes[1]) <= 1.0;
    case RegionShape::Box:
        return std::fabs(u) <= 0.5 * r.sizes[0] && std::fabs(v) <= 0.5 * r.sizes[1];
    case RegionShape::Point:
        return false;
    case RegionShape::Polygon: {
        bool inside = false; // even-odd rule
        const std::size_t n = r.points.size() / 2;
        for (std::size_t i = 0, j = n - 1; i < n; j = i++) {
            const double xi = r.points[2 * i], yi = r.points[2 * i + 1];
            const double xj = r.points[2 * j], yj = r.points[2 * j + 1];
            if ((yi > y) != (yj > y) && x < (xj - xi) * (y - yi) / (yj - yi) + xi) inside = !inside;
        }
        return inside;
    }
    }
    return false;
}

} // namespace gpuphot
