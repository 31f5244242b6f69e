#pragma once
// FITS binary tables through CFITSIO: write a Table as one BINTABLE HDU (after an empty primary HDU),
// read any table HDU (binary or ASCII) back into a Table. Both move data column-wise in blocks of
// CFITSIO's optimal row count, so millions of rows take about a second.
#include <functional>
#include <string>
#include <vector>

#include "core/catalog/table.hpp"

namespace gpuphot {

// Writes `table` to `path` (temporary name, then rename): an empty primary HDU and one BINTABLE with
// EXTNAME = table.name; per column TTYPEn, TFORMn (double D, float E, int64 K, int32 J, int16 I,
// uint8 B, strings A with the longest string's width), TUNITn when the unit is set and TCOMMn when the
// description is set. table.meta's cards go into the table HDU, except the structural keywords
// (XTENSION, BITPIX, NAXISn, PCOUNT, GCOUNT, TFIELDS, EXTNAME, Txxxxn column keywords, CHECKSUM...).
// Long string values use the CONTINUE convention. NaN is written as IEEE NaN.
// Throws IoError naming the file.
void writeFitsTable(const std::string& path, const Table& table);

// Reads one table HDU. hdu: "" = the first table HDU (binary or ASCII); a number = 0-based HDU index
// (as CFITSIO's file.fits[N] and astropy's hdul[N]); else an EXTNAME (case-insensitive).
// Column types: D -> double, E -> float, K -> int64, J -> int32, I -> int16, B -> uint8,
// L (logical) -> uint8 (1 = T, 0 = F or undefined), A -> string (trailing blanks trimmed);
// unsigned variants via TZERO (uint16 -> int32, uint32 -> int64, int8 -> int16) widen to the next type;
// scaled integer columns (TSCAL/TZERO) are returned as double with the scaling applied. Integer TNULL
// values are returned as stored. Vector columns (repeat > 1), bit (X), complex and variable-length
// columns are skipped. TUNITn -> unit, TCOMMn -> description, EXTNAME -> table.name, other
// non-structural cards -> table.meta.
// Throws IoError (missing or unreadable file) or InvalidInput (not FITS, no such HDU, not a table),
// naming the file.
Table readFitsTable(const std::string& path, const std::string& hdu = {});

// As above, reading only the columns that `select` returns (called once with the names of the table's
// readable columns, in file order). Names it returns that are not among them throw InvalidInput.
using FitsColumnSelector = std::function<std::vector<std::string>(const std::vector<std::string>& available)>;
Table readFitsTable(const std::string& path, const std::string& hdu, const FitsColumnSelector& select);

} // namespace gpuphot
