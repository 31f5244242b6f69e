#pragma once
// Text forms of a Table: ECSV (astropy's Enhanced CSV 1.0), plain CSV, DS9 region files, and a CSV
// reader. Every writer writes to a temporary name and renames (core/io/atomic_file.hpp).
//
// Numbers are written with the shortest decimal text that reads back to the same value
// (std::to_chars), so a write/read round trip is exact: doubles round-trip as doubles, floats as
// floats (a float column read back as double gives the float's shortest decimal, e.g. 0.1, not
// 0.100000001490116). NaN is written as "nan" and infinities as "inf"/"-inf" in ECSV and CSV.
#include <string>
#include <string_view>
#include <vector>

#include "core/catalog/table.hpp"

namespace gpuphot {

// ECSV 1.0, readable by astropy's Table.read(path, format="ascii.ecsv"): "# %ECSV 1.0", a YAML header
// with one {name, unit, datatype, description} entry per column (datatypes float64, float32, int64,
// int32, int16, uint8, string), table.meta as an ordered mapping (numbers, strings, booleans;
// COMMENT and HISTORY cards as the lists "comments" and "history"), then space-delimited rows.
// Strings that are empty or hold blanks or quotes are double-quoted ("" for a literal quote); astropy
// reads an empty string back as a masked value (ECSV's null). Header values 'NaN'/'Inf' (Header's
// spelling of non-finite numbers) become YAML .nan/.inf.
// Throws IoError naming the file.
void writeEcsv(const std::string& path, const Table& table);

// Plain CSV (RFC 4180): a header row with the column names, then one row per table row; fields
// holding a comma, a quote, a line break or leading/trailing blanks are quoted. No units or meta (use
// ECSV or FITS for those). NaN is written as "nan" (pandas, astropy and readCsv read it as NaN).
void writeCsv(const std::string& path, const Table& table);

// The same table as ECSV and as CSV (either path empty: that file is not written), each number formatted
// once for both: the same files as writeEcsv and writeCsv, in about half their time.
void writeTextTables(const std::string& ecsvPath, const std::string& csvPath, const Table& table);

// Reads a delimited text table: '#' comment lines and blank lines are skipped; the first other line
// is the header with the column names; the delimiter is a comma when the header has one, else a tab
// when it has one, else runs of blanks (so ECSV data also reads, without its units). A column becomes
// int64 when every field is an integer, double when every field is a number, "nan"/"inf" or empty
// (empty -> NaN), else string. Throws IoError (missing/unreadable) or InvalidInput (no header, a row
// with the wrong number of fields: names the file and line).
Table readCsv(const std::string& path);

struct RegionStyle {
    std::string xCol = "x";    // written as given: the catalog's x, y are already 1-based (DS9 image
    std::string yCol = "y";    // coordinates are 1-based too), so no offset is applied here
    std::string aCol;          // when aCol, bCol and thetaCol are all set and a row's a, b are finite
    std::string bCol;          // and positive: ellipse(x, y, a*ellipseScale, b*ellipseScale, theta)
    std::string thetaCol;      // theta in degrees counter-clockwise from +x (DS9's convention too)
    double ellipseScale = 1.0; // e.g. 3 to draw 3 sigma isophotes from SExtractor-like A/B
    double radius = 5.0;       // circle radius in pixels (and fallback for unusable a, b)
    std::string color = "green";
    std::string flagsCol; // when set: rows with flags != 0 are drawn in flaggedColor
    std::string flaggedColor = "red";
    std::string textCol; // when set: text={value} label per region
    int width = 1;       // line width
};

// DS9 region file: "# Region file format: DS9 version 4.1", a global line, "image", then one circle
// or ellipse per row with finite x and y (other rows are skipped). Throws InvalidInput when a named
// column is missing, IoError when the file cannot be written.
void writeDs9Regions(const std::string& path, const Table& table, const RegionStyle& style = {});

// --- helpers shared with the reference-catalog reader ------------------------------------------------

// ',' or '\t' when the header line holds one (outside quotes), else ' ' (runs of blanks).
char detectDelimiter(std::string_view headerLine);

// Splits one record into fields. ',' and '\t': every delimiter separates (empty fields kept), blanks
// around unquoted fields trimmed; ' ': runs of blanks/tabs separate. Double-quoted fields may hold the
// delimiter, "" inside quotes is a literal quote. The views point into `line` or into `scratch`
// (valid until the next call with the same scratch).
void splitRecord(std::string_view line, char delimiter, std::vector<std::string_view>& fields,
                 std::string& scratch);

// Parses a decimal number (leading '+' allowed; "nan", "inf" in any case). False when `text` is not
// entirely a number.
bool parseNumber(std::string_view text, double& value);

// Shortest round-trip decimal text (std::to_chars); "nan", "inf", "-inf" for non-finite values.
std::string formatNumber(double v);
std::string formatNumber(float v);

} // namespace gpuphot
