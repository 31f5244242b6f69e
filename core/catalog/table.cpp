#include "core/catalog/table.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

bool equalsNoCase(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

std::size_t dataSize(const ColumnData& data) {
    return std::visit([](const auto& v) { return v.size(); }, data);
}

} // namespace

std::size_t Column::size() const {
    return dataSize(data);
}

double Column::asDouble(std::size_t i) const {
    return std::visit(
        [i](const auto& v) -> double {
            using T = typename std::decay_t<decltype(v)>::value_type;
            if constexpr (std::is_same_v<T, std::string>) {
                return std::numeric_limits<double>::quiet_NaN();
            } else {
                return static_cast<double>(v.at(i));
            }
        },
        data);
}

Column& Table::add(std::string name, ColumnData data, std::string unit, std::string description) {
    if (name.empty()) throw InvalidInput("table " + this->name + ": a column needs a name");
    const std::size_t n = dataSize(data);
    Column* existing = find(name);
    for (const Column& c : m_columns) {
        if (&c == existing) continue;
        if (c.size() != n)
            throw InvalidInput("table " + this->name + ": column '" + name + "' has " + std::to_string(n) +
                               " rows but column '" + c.name + "' has " + std::to_string(c.size()));
        break; // all other columns have the same length
    }
    if (existing) {
        existing->name = std::move(name);
        existing->data = std::move(data);
        existing->unit = std::move(unit);
        existing->description = std::move(description);
        return *existing;
    }
    m_columns.push_back(Column{std::move(name), std::move(unit), std::move(description), std::move(data)});
    return m_columns.back();
}

const Column* Table::find(std::string_view name) const {
    for (const Column& c : m_columns)
        if (c.name == name) return &c;
    for (const Column& c : m_columns)
        if (equalsNoCase(c.name, name)) return &c;
    return nullptr;
}

Column* Table::find(std::string_view name) {
    return const_cast<Column*>(static_cast<const Table*>(this)->find(name));
}

const Column& Table::at(std::string_view name) const {
    if (const Column* c = find(name)) return *c;
    std::string available;
    for (const Column& c : m_columns)
        available += (available.empty() ? "" : ", ") + c.name;
    throw InvalidInput("table " + this->name + ": no column '" + std::string(name) +
                       "' (columns: " + (available.empty() ? "none" : available) + ")");
}

std::vector<double> Table::doubles(std::string_view name) const {
    const Column& c = at(name);
    return std::visit(
        [&](const auto& v) -> std::vector<double> {
            using T = typename std::decay_t<decltype(v)>::value_type;
            if constexpr (std::is_same_v<T, std::string>) {
                throw InvalidInput("table " + this->name + ": column '" + c.name +
                                   "' holds strings, not numbers");
            } else {
                return std::vector<double>(v.begin(), v.end());
            }
        },
        c.data);
}

std::size_t Table::rows() const {
    return m_columns.empty() ? 0 : m_columns.front().size();
}

} // namespace gpuphot
