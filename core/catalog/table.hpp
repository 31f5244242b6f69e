#pragma once
// Column-oriented tables: named, typed, unit-carrying columns of equal length, plus header keywords.
// The catalog, the simulator's truth and reference tables, and reference catalogs read from disk are
// all Tables; the writers (FITS binary table, ECSV, CSV) and readers live in core/io/.
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/model/header.hpp"

namespace gpuphot {

using ColumnData = std::variant<std::vector<double>, std::vector<float>, std::vector<std::int64_t>,
                                std::vector<std::int32_t>, std::vector<std::int16_t>, std::vector<std::uint8_t>,
                                std::vector<std::string>>;

struct Column {
    std::string name;
    std::string unit;        // FITS/astropy unit string ("pix", "deg", "mag", "adu", ""), written as TUNITn
    std::string description; // written as a TCOMMn / ECSV description
    ColumnData data;

    std::size_t size() const;
    // Value of row i as double (NaN for strings).
    double asDouble(std::size_t i) const;
    template <class T> const std::vector<T>& as() const { return std::get<std::vector<T>>(data); }
    template <class T> std::vector<T>& as() { return std::get<std::vector<T>>(data); }
};

class Table {
public:
    // Adds (or replaces) a column. Throws InvalidInput when its length differs from the others.
    Column& add(std::string name, ColumnData data, std::string unit = {}, std::string description = {});
    const Column* find(std::string_view name) const;  // case-insensitive
    Column* find(std::string_view name);
    const Column& at(std::string_view name) const;    // throws InvalidInput naming the column
    std::vector<double> doubles(std::string_view name) const; // any numeric column converted to double

    std::size_t rows() const;
    const std::vector<Column>& columns() const { return m_columns; }
    std::vector<Column>& columns() { return m_columns; }

    Header meta;           // header keywords written with the table (ZP, APRAD1.., WCS, version, ...)
    std::string name = "CATALOG"; // EXTNAME for FITS

private:
    std::vector<Column> m_columns;
};

} // namespace gpuphot
