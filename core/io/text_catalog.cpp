#include "core/io/text_catalog.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <utility>
#include <variant>

#include "core/io/atomic_file.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;

// Streams text to a temporary file and renames it on finish(); nothing appears under the final name
// when an exception leaves early.
class TextOut {
public:
    explicit TextOut(const std::string& path) : m_out(path) {
        m_file = std::fopen(m_out.tempPath().c_str(), "wb");
        if (!m_file) throw IoError("cannot write " + path + ": " + std::strerror(errno));
        m_buf.reserve(1 << 20);
    }
    ~TextOut() {
        if (m_file) std::fclose(m_file);
    }
    std::string& buffer() { return m_buf; }
    void flushIfLarge() {
        if (m_buf.size() > (1u << 20)) flush();
    }
    void finish() {
        flush();
        const int rc = std::fclose(m_file);
        m_file = nullptr;
        if (rc != 0) throw IoError("cannot write " + m_out.finalPath() + ": " + std::strerror(errno));
        m_out.commit();
    }

private:
    void flush() {
        if (!m_buf.empty() && std::fwrite(m_buf.data(), 1, m_buf.size(), m_file) != m_buf.size())
            throw IoError("cannot write " + m_out.finalPath() + ": " + std::strerror(errno));
        m_buf.clear();
    }
    AtomicOutput m_out;
    std::FILE* m_file = nullptr;
    std::string m_buf;
};

template <class T> void appendNumber(std::string& out, T v) {
    if constexpr (std::is_floating_point_v<T>) {
        if (std::isnan(v)) {
            out += "nan";
            return;
        }
        if (std::isinf(v)) {
            out += v > 0 ? "inf" : "-inf";
            return;
        }
    }
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

// `s` as it is, or when `quote`, in double quotes with inner quotes doubled (line breaks turned into blanks
// when `flattenLines`).
void appendMaybeQuoted(std::string& out, const std::string& s, bool quote, bool flattenLines) {
    if (!quote) {
        out += s;
        return;
    }
    out += '"';
    for (char c : s) {
        if (c == '"') out += '"';
        out += (flattenLines && (c == '\n' || c == '\r')) ? ' ' : c;
    }
    out += '"';
}

// ECSV / whitespace-delimited: quote when empty or when blanks, quotes or a leading '#' are present.
void appendEcsvString(std::string& out, const std::string& s) {
    const bool quote = s.empty() || s.front() == '#' || s.find_first_of(" \t\"\n\r") != std::string::npos;
    appendMaybeQuoted(out, s, quote, true);
}

// RFC 4180.
void appendCsvString(std::string& out, const std::string& s) {
    const bool quote = s.find_first_of(",\"\n\r") != std::string::npos ||
                       (!s.empty() && (s.front() == ' ' || s.back() == ' ' || s.front() == '#'));
    appendMaybeQuoted(out, s, quote, false);
}

void appendCell(std::string& out, const Column& c, std::size_t row, bool csv) {
    std::visit(
        [&](const auto& v) {
            using T = typename std::decay_t<decltype(v)>::value_type;
            if constexpr (std::is_same_v<T, std::string>) {
                csv ? appendCsvString(out, v[row]) : appendEcsvString(out, v[row]);
            } else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int16_t>) {
                appendNumber(out, static_cast<int>(v[row]));
            } else {
                appendNumber(out, v[row]);
            }
        },
        c.data);
}

// The line of column names (ECSV: blank-separated, ECSV quoting; CSV: commas, RFC 4180 quoting).
void appendNames(std::string& b, const Table& table, bool csv) {
    for (std::size_t i = 0; i < table.columns().size(); ++i) {
        if (i) b += csv ? ',' : ' ';
        csv ? appendCsvString(b, table.columns()[i].name) : appendEcsvString(b, table.columns()[i].name);
    }
    b += '\n';
}

bool isStringColumn(const Column& c) {
    return std::holds_alternative<std::vector<std::string>>(c.data);
}

// The numbers of a block of rows as text, each formatted once for the ECSV and the CSV file alike
// (string cells differ in quoting, so they are quoted by each file's writer).
class CellBlock {
public:
    void format(const Table& table, std::size_t begin, std::size_t end) {
        m_text.clear();
        m_end.clear();
        m_begin = begin;
        for (std::size_t r = begin; r < end; ++r)
            for (const Column& c : table.columns()) {
                if (!isStringColumn(c)) appendCell(m_text, c, r, true);
                m_end.push_back(static_cast<std::uint32_t>(m_text.size()));
            }
    }
    // Rows [begin, end) of the block, one line each.
    void appendRows(std::string& b, const Table& table, bool csv) const {
        const auto& cols = table.columns();
        const std::size_t n = cols.size(), rows = n ? m_end.size() / n : 0;
        std::uint32_t start = 0;
        for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t c = 0; c < n; ++c) {
                if (c) b += csv ? ',' : ' ';
                const std::uint32_t stop = m_end[i * n + c];
                if (isStringColumn(cols[c]))
                    appendCell(b, cols[c], m_begin + i, csv);
                else
                    b.append(m_text, start, stop - start);
                start = stop;
            }
            b += '\n';
        }
    }

private:
    std::string m_text;
    std::vector<std::uint32_t> m_end; // per cell, row-major: where its text ends
    std::size_t m_begin = 0;
};

void checkLengths(const std::string& path, const Table& table) {
    for (const Column& c : table.columns())
        if (c.size() != table.rows())
            throw InvalidInput("cannot write " + path + ": column '" + c.name + "' has " +
                               std::to_string(c.size()) + " rows, expected " + std::to_string(table.rows()));
}

// A whole decimal integer, optionally with a leading '+'.
bool parseInteger(std::string_view s, long long& value) {
    if (s.empty()) return false;
    const char* b = s.data() + (s.front() == '+' ? 1 : 0);
    const auto r = std::from_chars(b, s.data() + s.size(), value);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// YAML double-quoted scalar (JSON-compatible escapes).
std::string yamlQuote(std::string_view s) {
    std::string out = "\"";
    for (char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += ch;
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += ch;
        }
    }
    return out + "\"";
}

bool isPlainYamlKey(std::string_view s) {
    if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s.front())) || s.front() == '_')) return false;
    return std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
    });
}

std::string yamlKey(std::string_view s) {
    return isPlainYamlKey(s) ? std::string(s) : yamlQuote(s);
}

// A FITS card value as a YAML scalar: strings quoted, T/F as booleans, numbers as YAML 1.1 numbers
// (PyYAML needs a '.' and a signed exponent to see a float).
std::string yamlValue(const std::string& fitsValue) {
    std::string v = fitsValue;
    while (!v.empty() && v.back() == ' ')
        v.pop_back();
    while (!v.empty() && v.front() == ' ')
        v.erase(v.begin());
    if (v.empty()) return "null";
    if (v.front() == '\'') {
        // Header stores non-finite numbers as 'NaN', 'Inf', '-Inf' (FITS has no literal for them).
        const std::string u = unquoteFitsString(v);
        if (u == "NaN") return ".nan";
        if (u == "Inf") return ".inf";
        if (u == "-Inf") return "-.inf";
        return yamlQuote(u);
    }
    if (v == "T") return "true";
    if (v == "F") return "false";
    auto num = parseFitsNumber(v);
    if (!num) return yamlQuote(v);
    const bool isInt = v.find_first_of(".eEdD") == std::string::npos;
    if (isInt) {
        long long i = 0;
        if (parseInteger(v, i)) return std::to_string(i);
    }
    if (std::isnan(*num)) return ".nan";
    if (std::isinf(*num)) return *num > 0 ? ".inf" : "-.inf";
    std::string s;
    appendNumber(s, *num);
    const auto e = s.find('e');
    std::string mant = s.substr(0, e), exp = e == std::string::npos ? "" : s.substr(e);
    if (mant.find('.') == std::string::npos) mant += ".0";
    return mant + exp; // to_chars writes exponents with a sign
}

const char* ecsvDatatype(const Column& c) {
    switch (c.data.index()) {
    case 0:
        return "float64";
    case 1:
        return "float32";
    case 2:
        return "int64";
    case 3:
        return "int32";
    case 4:
        return "int16";
    case 5:
        return "uint8";
    default:
        return "string";
    }
}

std::string readWholeFile(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw IoError("cannot read " + path + ": no such file");
    if (fs::is_directory(path, ec)) throw IoError("cannot read " + path + ": is a directory");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError("cannot read " + path + ": " + std::strerror(errno));
    std::string text;
    in.seekg(0, std::ios::end);
    text.resize(static_cast<std::size_t>(in.tellg()));
    in.seekg(0);
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    if (!in) throw IoError("cannot read " + path + ": read failed");
    return text;
}

} // namespace

// ---------------------------------------------------------------------------------------------------
bool parseNumber(std::string_view t, double& value) {
    if (!t.empty() && t.front() == '+') t.remove_prefix(1);
    if (t.empty()) return false;
    auto r = std::from_chars(t.data(), t.data() + t.size(), value);
    return r.ec == std::errc() && r.ptr == t.data() + t.size();
}

std::string formatNumber(double v) {
    std::string s;
    appendNumber(s, v);
    return s;
}

std::string formatNumber(float v) {
    std::string s;
    appendNumber(s, v);
    return s;
}

char detectDelimiter(std::string_view line) {
    bool inQuote = false, tab = false;
    for (char c : line) {
        if (c == '"')
            inQuote = !inQuote;
        else if (!inQuote && c == ',')
            return ',';
        else if (!inQuote && c == '\t')
            tab = true;
    }
    return tab ? '\t' : ' ';
}

void splitRecord(std::string_view line, char delim, std::vector<std::string_view>& fields,
                 std::string& scratch) {
    fields.clear();
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool blanks = delim == ' ';
    auto isBlank = [](char c) { return c == ' ' || c == '\t'; };
    // Fast path: no quotes.
    if (line.find('"') == std::string_view::npos) {
        std::size_t i = 0;
        const std::size_t n = line.size();
        if (blanks) {
            while (true) {
                while (i < n && isBlank(line[i]))
                    ++i;
                if (i >= n) break;
                std::size_t j = i;
                while (j < n && !isBlank(line[j]))
                    ++j;
                fields.push_back(line.substr(i, j - i));
                i = j;
            }
            return;
        }
        while (true) {
            std::size_t j = line.find(delim, i);
            if (j == std::string_view::npos) j = n;
            std::string_view f = line.substr(i, j - i);
            while (!f.empty() && isBlank(f.front()))
                f.remove_prefix(1);
            while (!f.empty() && isBlank(f.back()))
                f.remove_suffix(1);
            fields.push_back(f);
            if (j >= n) break;
            i = j + 1;
        }
        return;
    }
    // Quoted fields: unescape into scratch (never longer than the line, so views stay valid).
    scratch.assign(line.size(), '\0');
    std::size_t w = 0, i = 0;
    const std::size_t n = line.size();
    while (true) {
        if (blanks) {
            while (i < n && isBlank(line[i]))
                ++i;
            if (i >= n) break;
        } else {
            while (i < n && isBlank(line[i]) && line[i] != delim)
                ++i;
        }
        const std::size_t start = w;
        if (i < n && line[i] == '"') {
            ++i;
            while (i < n) {
                if (line[i] == '"') {
                    if (i + 1 < n && line[i + 1] == '"') {
                        scratch[w++] = '"';
                        i += 2;
                        continue;
                    }
                    ++i;
                    break;
                }
                scratch[w++] = line[i++];
            }
            // anything after the closing quote up to the delimiter is appended verbatim
            while (i < n && line[i] != delim && !(blanks && isBlank(line[i])))
                scratch[w++] = line[i++];
            fields.emplace_back(scratch.data() + start, w - start);
            if (!blanks) {
                while (i < n && line[i] != delim)
                    ++i;
            }
        } else {
            std::size_t j = i;
            while (j < n && line[j] != delim && !(blanks && isBlank(line[j])))
                ++j;
            std::string_view f = line.substr(i, j - i);
            while (!f.empty() && isBlank(f.back()))
                f.remove_suffix(1);
            fields.push_back(f);
            i = j;
        }
        if (blanks) continue;
        if (i >= n) break;
        ++i; // skip the delimiter
        if (i == n) {
            fields.emplace_back(); // trailing empty field
            break;
        }
    }
}

// ---------------------------------------------------------------------------------------------------
namespace {

void appendEcsvHeader(std::string& b, const Table& table) {
    b += "# %ECSV 1.0\n# ---\n# datatype:\n";
    for (const Column& c : table.columns()) {
        b += "# - {name: " + yamlKey(c.name);
        if (!c.unit.empty()) b += ", unit: " + yamlQuote(c.unit);
        b += std::string(", datatype: ") + ecsvDatatype(c);
        if (!c.description.empty()) b += ", description: " + yamlQuote(c.description);
        b += "}\n";
    }
    std::vector<std::string> comments, history;
    std::string metaLines;
    for (const HeaderCard& card : table.meta.cards()) {
        if (card.key == "COMMENT")
            comments.push_back(card.comment);
        else if (card.key == "HISTORY")
            history.push_back(card.comment);
        else if (!card.key.empty())
            metaLines += "# - {" + yamlKey(card.key) + ": " + yamlValue(card.value) + "}\n";
    }
    auto list = [&](const char* key, const std::vector<std::string>& items) {
        if (items.empty()) return;
        metaLines += std::string("# - ") + key + ":\n";
        for (const std::string& s : items)
            metaLines += "#   - " + yamlQuote(s) + "\n";
    };
    list("comments", comments);
    list("history", history);
    if (!metaLines.empty()) b += "# meta: !!omap\n" + metaLines;
    b += "# schema: astropy-2.0\n";
}

} // namespace

void writeTextTables(const std::string& ecsvPath, const std::string& csvPath, const Table& table) {
    checkLengths(ecsvPath.empty() ? csvPath : ecsvPath, table);
    std::optional<TextOut> ecsv, csv;
    if (!ecsvPath.empty()) {
        ecsv.emplace(ecsvPath);
        appendEcsvHeader(ecsv->buffer(), table);
        appendNames(ecsv->buffer(), table, false);
    }
    if (!csvPath.empty()) {
        csv.emplace(csvPath);
        appendNames(csv->buffer(), table, true);
    }
    constexpr std::size_t kBlockRows = 4096;
    CellBlock cells;
    for (std::size_t begin = 0; begin < table.rows(); begin += kBlockRows) {
        cells.format(table, begin, std::min(table.rows(), begin + kBlockRows));
        for (auto [out, isCsv] : {std::pair{&ecsv, false}, std::pair{&csv, true}})
            if (*out) {
                cells.appendRows((*out)->buffer(), table, isCsv);
                (*out)->flushIfLarge();
            }
    }
    if (ecsv) ecsv->finish();
    if (csv) csv->finish();
}

void writeEcsv(const std::string& path, const Table& table) {
    writeTextTables(path, "", table);
}

void writeCsv(const std::string& path, const Table& table) {
    writeTextTables("", path, table);
}

Table readCsv(const std::string& path) {
    const std::string text = readWholeFile(path);
    std::vector<std::string_view> fields;
    std::string scratch;
    std::vector<std::string> names;
    std::vector<std::vector<std::string>> cells;
    char delim = ',';
    bool haveHeader = false;
    std::size_t lineNo = 0;
    for (std::size_t pos = 0; pos < text.size();) {
        std::size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        std::string_view line(text.data() + pos, end - pos);
        pos = end + 1;
        ++lineNo;
        std::string_view t = line;
        while (!t.empty() && (t.front() == ' ' || t.front() == '\t'))
            t.remove_prefix(1);
        if (t.empty() || t == "\r" || t.front() == '#') continue;
        if (!haveHeader) {
            delim = detectDelimiter(line);
            splitRecord(line, delim, fields, scratch);
            for (auto f : fields)
                names.emplace_back(f);
            cells.resize(names.size());
            haveHeader = true;
            continue;
        }
        splitRecord(line, delim, fields, scratch);
        if (fields.size() != names.size())
            throw InvalidInput("CSV file " + path + " line " + std::to_string(lineNo) + ": " +
                               std::to_string(fields.size()) + " fields, the header has " +
                               std::to_string(names.size()));
        for (std::size_t i = 0; i < fields.size(); ++i)
            cells[i].emplace_back(fields[i]);
    }
    if (!haveHeader) throw InvalidInput("CSV file " + path + " has no header line (empty or only comments)");

    Table table;
    table.name = fs::path(path).stem().string();
    for (std::size_t i = 0; i < names.size(); ++i) {
        auto& col = cells[i];
        bool allInt = !col.empty(), allNum = true;
        for (const std::string& s : col) {
            double d;
            if (s.empty()) {
                allInt = false;
                continue;
            }
            if (!parseNumber(s, d)) {
                allNum = allInt = false;
                break;
            }
            long long v;
            if (allInt && !parseInteger(s, v)) allInt = false;
        }
        std::string name = names[i].empty() ? "col" + std::to_string(i + 1) : names[i];
        if (table.find(name)) name += "_" + std::to_string(i + 1);
        if (allInt) {
            std::vector<std::int64_t> v(col.size());
            for (std::size_t r = 0; r < col.size(); ++r) {
                long long x = 0;
                parseInteger(col[r], x);
                v[r] = x;
            }
            table.add(name, std::move(v));
        } else if (allNum) {
            std::vector<double> v(col.size(), std::numeric_limits<double>::quiet_NaN());
            for (std::size_t r = 0; r < col.size(); ++r)
                if (!col[r].empty()) parseNumber(col[r], v[r]);
            table.add(name, std::move(v));
        } else {
            table.add(name, std::move(col));
        }
    }
    return table;
}

// ---------------------------------------------------------------------------------------------------
void writeDs9Regions(const std::string& path, const Table& table, const RegionStyle& style) {
    auto column = [&](const std::string& name, const char* role) -> const Column* {
        if (name.empty()) return nullptr;
        const Column* c = table.find(name);
        if (!c)
            throw InvalidInput("cannot write regions " + path + ": table " + table.name + " has no " + role +
                               " column '" + name + "'");
        return c;
    };
    const Column* xc = column(style.xCol, "x");
    const Column* yc = column(style.yCol, "y");
    if (!xc || !yc)
        throw InvalidInput("cannot write regions " + path + ": x and y column names are required");
    const Column* ac = column(style.aCol, "a");
    const Column* bc = column(style.bCol, "b");
    const Column* tc = column(style.thetaCol, "theta");
    const Column* fc = column(style.flagsCol, "flags");
    const Column* lc = column(style.textCol, "text");
    const bool ellipses = ac && bc && tc;

    TextOut out(path);
    std::string& b = out.buffer();
    b += "# Region file format: DS9 version 4.1\n";
    b += "global color=" + style.color + " dashlist=8 3 width=" + std::to_string(style.width) +
         " font=\"helvetica 10 normal roman\" select=1 highlite=1 dash=0 fixed=0 edit=1 move=1 delete=1"
         " include=1 source=1\n";
    b += "image\n";
    char buf[256];
    for (std::size_t r = 0; r < table.rows(); ++r) {
        const double x = xc->asDouble(r), y = yc->asDouble(r);
        if (!std::isfinite(x) || !std::isfinite(y)) continue;
        bool drewEllipse = false;
        if (ellipses) {
            const double a = ac->asDouble(r) * style.ellipseScale, bb = bc->asDouble(r) * style.ellipseScale;
            double theta = tc->asDouble(r);
            if (std::isfinite(a) && std::isfinite(bb) && a > 0 && bb > 0) {
                if (!std::isfinite(theta)) theta = 0;
                std::snprintf(buf, sizeof buf, "ellipse(%.4f,%.4f,%.4f,%.4f,%.3f)", x, y, a, bb, theta);
                b += buf;
                drewEllipse = true;
            }
        }
        if (!drewEllipse) {
            std::snprintf(buf, sizeof buf, "circle(%.4f,%.4f,%.4f)", x, y, style.radius);
            b += buf;
        }
        std::string extra;
        if (fc) {
            const double f = fc->asDouble(r);
            if (std::isfinite(f) && f != 0) extra += " color=" + style.flaggedColor;
        }
        if (lc) {
            std::string label;
            if (const auto* s = std::get_if<std::vector<std::string>>(&lc->data)) {
                label = (*s)[r];
            } else {
                const double v = lc->asDouble(r);
                label = (std::isfinite(v) && std::floor(v) == v && std::fabs(v) < 1e15)
                            ? std::to_string(static_cast<long long>(v))
                            : formatNumber(v);
            }
            std::replace(label.begin(), label.end(), '{', '(');
            std::replace(label.begin(), label.end(), '}', ')');
            std::replace(label.begin(), label.end(), '\n', ' ');
            if (!label.empty()) extra += " text={" + label + "}";
        }
        if (!extra.empty()) b += " #" + extra;
        b += '\n';
        out.flushIfLarge();
    }
    out.finish();
}

} // namespace gpuphot
