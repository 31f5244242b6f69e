#pragma once
// Target lists for forced photometry (`gpuphot reduce --targets FILE`): positions an observer wants
// measured whether or not they were detected.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuphot {

struct TargetList {
    std::vector<std::string> name; // the name/id column as text, else the 1-based row number
    std::vector<double> ra, dec;   // degrees (ICRS as the file gives them)
    std::string path;
    std::string raColumn, decColumn, nameColumn; // columns used ("" for name: none)
    std::size_t size() const { return ra.size(); }
};

// Reads a FITS table (first table HDU), an ECSV or a CSV/blank-separated text file. Columns, matched
// case-insensitively: ra (RA, RA_DEG, RADEG, RAJ2000, _RAJ2000, RA_ICRS, ALPHA_J2000) and dec (DEC,
// DEC_DEG, DECDEG, DEJ2000, DECJ2000, _DEJ2000, DE_ICRS, DELTA_J2000), or one column coord (COORD,
// COORDS, COORDINATES, POSITION, RADEC) holding both as "hh:mm:ss.s +dd:mm:ss"; optional name (NAME,
// TARGET, OBJECT, ID, SOURCE_ID). Numeric columns are degrees; text values are decimal degrees or
// sexagesimal (RA in hours "hh:mm:ss.s", Dec in degrees "+dd:mm:ss"; ':' or blanks or h/m/s/d
// separate the fields). Throws IoError for a missing/unreadable file, InvalidInput naming the file
// (and row, 1-based) for a missing column, an unparseable or out-of-range position, or no rows.
TargetList readTargetList(const std::string& path);

// "12:34:56.7", "-05 06 07", "12h34m56.7s", "+5d06m07s" -> 12.5824..., -5.1019... (the unit of the first
// field: hours or degrees, as the caller knows). nullopt when the text is not sexagesimal.
std::optional<double> parseSexagesimalAngle(std::string_view text);

} // namespace gpuphot
