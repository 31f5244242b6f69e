#include "core/io/fits_table.hpp"

#include <fitsio.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unistd.h>

#include "core/io/atomic_file.hpp"
#include "core/io/cfitsio_util.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void throwWrite(const std::string& path, const std::string& what, int status) {
    throw IoError("cannot write FITS table " + path + ": " + what + ": " + cfitsioText(status));
}

std::string upper(std::string_view s) {
    std::string out(s);
    for (char& c : out)
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

// Keywords that describe the table's layout: CFITSIO writes them (or they are per-column keywords
// tied to column numbers), so they never travel through Table::meta.
bool isStructuralKey(std::string_view key) {
    static const char* fixed[] = {"SIMPLE",  "XTENSION", "BITPIX",   "NAXIS",  "PCOUNT",   "GCOUNT",
                                  "TFIELDS", "EXTEND",   "EXTNAME",  "THEAP",  "CHECKSUM", "DATASUM",
                                  "END",     "CONTINUE", "LONGSTRN", "BSCALE", "BZERO",    "BLANK"};
    for (const char* f : fixed)
        if (key == f) return true;
    auto prefixedNumber = [&](std::string_view prefix) {
        if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return false;
        return std::all_of(key.begin() + static_cast<std::ptrdiff_t>(prefix.size()), key.end(),
                           [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
    };
    static const char* perColumn[] = {"NAXIS", "TTYPE", "TFORM", "TUNIT", "TCOMM", "TNULL", "TSCAL", "TZERO",
                                      "TDIM",  "TDISP", "TBCOL", "TUCD",  "TLMIN", "TLMAX", "TDMIN", "TDMAX",
                                      "TCTYP", "TCUNI", "TCRVL", "TCDLT", "TCRPX", "TCROT"};
    for (const char* p : perColumn)
        if (prefixedNumber(p)) return true;
    return false;
}

struct ColumnSpec {
    int colnum = 0; // 1-based
    std::string name;
    int readType = 0;      // CFITSIO datatype code used for fits_read_col
    long width = 0;        // strings
    int kind = 0;          // index into ColumnData's alternatives
    bool rawFloat = false; // stored as E or D (not a scaled integer)
};

// ColumnData alternatives, in variant order.
enum Kind { kDouble = 0, kFloat, kInt64, kInt32, kInt16, kUInt8, kString };

bool classify(int rawType, int eqType, long repeat, long width, ColumnSpec& spec) {
    const bool rawFloat = rawType == TFLOAT || rawType == TDOUBLE;
    spec.rawFloat = rawFloat;
    if (eqType == TSTRING) {
        if (repeat <= 0 || width < repeat) return false; // arrays of substrings are skipped
        spec.readType = TSTRING;
        spec.kind = kString;
        spec.width = width;
        return true;
    }
    if (repeat != 1) return false;
    switch (eqType) {
    case TDOUBLE:
        spec.readType = TDOUBLE;
        spec.kind = kDouble;
        return true;
    case TFLOAT:
        spec.readType = rawFloat ? TFLOAT : TDOUBLE; // scaled integers are returned as double
        spec.kind = rawFloat ? kFloat : kDouble;
        return true;
    case TLONGLONG:
        spec.readType = TLONGLONG;
        spec.kind = kInt64;
        return true;
    case TULONG:
    case TUINT:
        spec.readType = TLONGLONG;
        spec.kind = kInt64;
        return true;
    case TULONGLONG:
        spec.readType = TDOUBLE;
        spec.kind = kDouble;
        return true;
    case TLONG:
    case TINT:
        spec.readType = TINT;
        spec.kind = kInt32;
        return true;
    case TUSHORT:
        spec.readType = TINT;
        spec.kind = kInt32;
        return true;
    case TSHORT:
        spec.readType = TSHORT;
        spec.kind = kInt16;
        return true;
    case TSBYTE:
        spec.readType = TSHORT;
        spec.kind = kInt16;
        return true;
    case TBYTE:
        spec.readType = TBYTE;
        spec.kind = kUInt8;
        return true;
    case TLOGICAL:
        spec.readType = TLOGICAL;
        spec.kind = kUInt8;
        return true;
    default:
        return false; // bit, complex, variable-length
    }
}

ColumnData makeData(int kind, std::size_t n) {
    switch (kind) {
    case kDouble:
        return std::vector<double>(n);
    case kFloat:
        return std::vector<float>(n);
    case kInt64:
        return std::vector<std::int64_t>(n);
    case kInt32:
        return std::vector<std::int32_t>(n);
    case kInt16:
        return std::vector<std::int16_t>(n);
    case kUInt8:
        return std::vector<std::uint8_t>(n);
    default:
        return std::vector<std::string>(n);
    }
}

bool isNumber(const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(),
                                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// Moves to the requested HDU; throws InvalidInput when it is missing or not a table.
void moveToTable(fitsfile* f, const std::string& path, const std::string& hdu) {
    int status = 0, type = 0, nhdu = 0;
    if (fits_get_num_hdus(f, &nhdu, &status))
        throw IoError("cannot read FITS table " + path + ": " + cfitsioText(status));
    if (hdu.empty()) {
        for (int i = 1; i <= nhdu; ++i) {
            if (fits_movabs_hdu(f, i, &type, &status))
                throw IoError("cannot read FITS table " + path + ": HDU " + std::to_string(i - 1) + ": " +
                              cfitsioText(status));
            if (type == BINARY_TBL || type == ASCII_TBL) return;
        }
        throw InvalidInput("FITS file " + path + " has no table HDU (" + std::to_string(nhdu) +
                           " HDU(s), none of them a binary or ASCII table)");
    }
    if (isNumber(hdu)) {
        const long index = std::stol(hdu);
        if (index >= nhdu)
            throw InvalidInput("FITS file " + path + " has no HDU " + hdu + " (it has " +
                               std::to_string(nhdu) + ", numbered from 0)");
        if (fits_movabs_hdu(f, static_cast<int>(index) + 1, &type, &status))
            throw IoError("cannot read FITS table " + path + ": HDU " + hdu + ": " + cfitsioText(status));
    } else {
        char name[FLEN_VALUE] = {};
        std::strncpy(name, hdu.c_str(), sizeof name - 1);
        if (fits_movnam_hdu(f, ANY_HDU, name, 0, &status)) {
            fits_clear_errmsg();
            throw InvalidInput("FITS file " + path + " has no HDU with EXTNAME '" + hdu + "'");
        }
        fits_get_hdu_type(f, &type, &status);
    }
    if (type != BINARY_TBL && type != ASCII_TBL)
        throw InvalidInput("HDU " + hdu + " of FITS file " + path + " is not a table");
}

Header readTableHeader(fitsfile* f, const std::string& path) {
    int status = 0, nkeys = 0;
    char* text = nullptr;
    if (fits_hdr2str(f, 0, nullptr, 0, &text, &nkeys, &status))
        throw IoError("cannot read FITS table header of " + path + ": " + cfitsioText(status));
    Header raw = Header::fromFitsString(std::string_view(text, static_cast<std::size_t>(nkeys) * 80));
    fits_free_memory(text, &status);
    Header out;
    for (const HeaderCard& c : raw.cards()) {
        if (c.key == "CONTINUE") continue;
        std::string value = c.value;
        // Long strings (CONTINUE convention): let CFITSIO reassemble them.
        if (value.size() >= 3 && value.back() == '\'' && value[value.size() - 2] == '&' &&
            c.key.size() <= 8) {
            char* longValue = nullptr;
            char comment[FLEN_COMMENT] = {};
            int s = 0;
            if (fits_read_key_longstr(f, c.key.c_str(), &longValue, comment, &s) == 0 && longValue) {
                value = quoteFitsString(longValue);
                fits_free_memory(longValue, &s);
            }
            fits_clear_errmsg();
        }
        out.setRaw(c.key, value, c.comment); // commentary cards are appended, others unique
    }
    return out;
}

// Bytes a column's value takes in a row (TFORM as writeFitsTable declares it).
std::size_t fieldWidth(const Column& c) {
    return std::visit(
        [](const auto& v) -> std::size_t {
            using T = typename std::decay_t<decltype(v)>::value_type;
            if constexpr (std::is_same_v<T, std::string>) {
                std::size_t w = 1;
                for (const std::string& s : v)
                    w = std::max(w, s.size());
                return w;
            } else {
                return sizeof(T);
            }
        },
        c.data);
}

template <class T> void storeBigEndian(unsigned char* out, T value) {
    if constexpr (sizeof(T) == 1) {
        std::memcpy(out, &value, 1);
    } else if constexpr (sizeof(T) == 2) {
        std::uint16_t u;
        std::memcpy(&u, &value, 2);
        u = __builtin_bswap16(u);
        std::memcpy(out, &u, 2);
    } else if constexpr (sizeof(T) == 4) {
        std::uint32_t u;
        std::memcpy(&u, &value, 4);
        u = __builtin_bswap32(u);
        std::memcpy(out, &u, 4);
    } else {
        static_assert(sizeof(T) == 8);
        std::uint64_t u;
        std::memcpy(&u, &value, 8);
        u = __builtin_bswap64(u);
        std::memcpy(out, &u, 8);
    }
}

// Rows [first, first + n) as the FITS binary table stores them (big-endian; strings blank-padded, as
// CFITSIO pads them), in parallel blocks of rows, each column visited once per block.
void encodeRows(const std::vector<Column>& cols, const std::vector<std::size_t>& offsets,
                std::size_t rowBytes, std::size_t first, std::size_t n, unsigned char* out) {
    constexpr std::int64_t kBlock = 2048;
    const auto blocks = static_cast<std::int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(dynamic, 1)
    for (std::int64_t b = 0; b < blocks; ++b) {
        const std::size_t r0 = static_cast<std::size_t>(b * kBlock), r1 = std::min(n, r0 + kBlock);
        for (std::size_t c = 0; c < cols.size(); ++c) {
            unsigned char* field = out + offsets[c];
            const std::size_t width = (c + 1 < cols.size() ? offsets[c + 1] : rowBytes) - offsets[c];
            std::visit(
                [&](const auto& v) {
                    using T = typename std::decay_t<decltype(v)>::value_type;
                    for (std::size_t r = r0; r < r1; ++r) {
                        unsigned char* at = field + r * rowBytes;
                        if constexpr (std::is_same_v<T, std::string>) {
                            const std::string& text = v[first + r];
                            const std::size_t len = strnlen(text.c_str(), width);
                            std::memcpy(at, text.data(), len);
                            std::memset(at + len, ' ', width - len);
                        } else {
                            storeBigEndian(at, v[first + r]);
                        }
                    }
                },
                cols[c].data);
        }
    }
}

// The table's rows written in chunks of about 16 MB, each encoded in parallel and handed to CFITSIO as
// bytes (which writes large blocks straight to the file).
void writeRows(fitsfile* f, const std::string& path, const std::vector<Column>& cols, std::size_t nrows) {
    std::vector<std::size_t> offsets;
    std::size_t rowBytes = 0;
    for (const Column& c : cols) {
        offsets.push_back(rowBytes);
        rowBytes += fieldWidth(c);
    }
    int status = 0;
    long naxis1 = 0;
    if (fits_read_key(f, TLONG, "NAXIS1", &naxis1, nullptr, &status)) throwWrite(path, "NAXIS1", status);
    if (static_cast<std::size_t>(naxis1) != rowBytes)
        throw IoError("cannot write FITS table " + path + ": row of " + std::to_string(naxis1) +
                      " bytes, expected " + std::to_string(rowBytes));
    if (rowBytes == 0) return;
    const std::size_t chunkRows = std::max<std::size_t>(1, (std::size_t{16} << 20) / rowBytes);
    std::vector<unsigned char> buffer(std::min(nrows, chunkRows) * rowBytes);
    for (std::size_t first = 0; first < nrows; first += chunkRows) {
        const std::size_t n = std::min(chunkRows, nrows - first);
        encodeRows(cols, offsets, rowBytes, first, n, buffer.data());
        if (fits_write_tblbytes(f, static_cast<LONGLONG>(first) + 1, 1, static_cast<LONGLONG>(n * rowBytes),
                                buffer.data(), &status))
            throwWrite(path, "rows", status);
    }
}

template <class T> T* dataPtr(ColumnData& data) {
    return std::get<std::vector<T>>(data).data();
}

} // namespace

// ---------------------------------------------------------------------------------------------------
void writeFitsTable(const std::string& path, const Table& table) {
    const auto& cols = table.columns();
    const std::size_t nrows = table.rows();
    for (const Column& c : cols)
        if (c.size() != nrows)
            throw InvalidInput("cannot write FITS table " + path + ": column '" + c.name + "' has " +
                               std::to_string(c.size()) + " rows, expected " + std::to_string(nrows));

    AtomicOutput out(path);
    FitsHandle h;
    int status = 0;
    if (fits_create_diskfile(&h.f, out.tempPath().c_str(), &status)) throwWrite(path, "create", status);
    if (fits_create_img(h.f, BYTE_IMG, 0, nullptr, &status)) throwWrite(path, "primary HDU", status);

    std::vector<std::string> ttype, tform, tunit;
    for (const Column& c : cols) {
        ttype.push_back(c.name);
        tunit.push_back(c.unit);
        std::visit(
            [&](const auto& v) {
                using T = typename std::decay_t<decltype(v)>::value_type;
                if constexpr (std::is_same_v<T, double>)
                    tform.push_back("D");
                else if constexpr (std::is_same_v<T, float>)
                    tform.push_back("E");
                else if constexpr (std::is_same_v<T, std::int64_t>)
                    tform.push_back("K");
                else if constexpr (std::is_same_v<T, std::int32_t>)
                    tform.push_back("J");
                else if constexpr (std::is_same_v<T, std::int16_t>)
                    tform.push_back("I");
                else if constexpr (std::is_same_v<T, std::uint8_t>)
                    tform.push_back("B");
                else {
                    std::size_t w = 1;
                    for (const std::string& s : v)
                        w = std::max(w, s.size());
                    tform.push_back(std::to_string(w) + "A");
                }
            },
            c.data);
    }
    std::vector<char*> pType, pForm, pUnit;
    for (std::size_t i = 0; i < cols.size(); ++i) {
        pType.push_back(ttype[i].data());
        pForm.push_back(tform[i].data());
        pUnit.push_back(tunit[i].data());
    }
    std::string extname = table.name;
    if (fits_create_tbl(h.f, BINARY_TBL, static_cast<LONGLONG>(nrows), static_cast<int>(cols.size()),
                        pType.data(), pForm.data(), pUnit.data(), extname.empty() ? nullptr : extname.data(),
                        &status))
        throwWrite(path, "create table", status);

    for (std::size_t i = 0; i < cols.size(); ++i) {
        if (cols[i].description.empty()) continue;
        const std::string key = "TCOMM" + std::to_string(i + 1);
        if (fits_write_key_longstr(h.f, key.c_str(), cols[i].description.c_str(), "", &status))
            throwWrite(path, key, status);
    }

    for (const HeaderCard& c : table.meta.cards()) {
        if (isStructuralKey(c.key)) continue;
        if (c.key == "COMMENT") {
            fits_write_comment(h.f, c.comment.c_str(), &status);
        } else if (c.key == "HISTORY") {
            fits_write_history(h.f, c.comment.c_str(), &status);
        } else if (c.key.size() <= 8 && !c.value.empty() && c.value.front() == '\'' &&
                   10 + c.value.size() > 80) {
            fits_write_key_longstr(h.f, c.key.c_str(), unquoteFitsString(c.value).c_str(), c.comment.c_str(),
                                   &status);
        } else {
            const std::string card = Header::formatCard(c);
            fits_write_record(h.f, card.c_str(), &status);
        }
        if (status) throwWrite(path, "header card " + c.key, status);
    }

    writeRows(h.f, path, cols, nrows);
    status = h.close();
    if (status) throwWrite(path, "close", status);
    out.commit();
}

namespace {

// The columns `select` asks for, in its order, each once: by exact name, else by name up to case.
std::vector<ColumnSpec> selectColumns(std::vector<ColumnSpec> specs, const FitsColumnSelector& select,
                                      const std::string& path) {
    std::vector<std::string> available;
    for (const ColumnSpec& s : specs)
        available.push_back(s.name);
    const std::vector<std::string> wanted = select(available);
    std::vector<ColumnSpec> chosen;
    for (const std::string& w : wanted) {
        auto it = std::find_if(specs.begin(), specs.end(), [&](const ColumnSpec& s) { return s.name == w; });
        if (it == specs.end())
            it = std::find_if(specs.begin(), specs.end(),
                              [&](const ColumnSpec& s) { return upper(s.name) == upper(w); });
        if (it == specs.end())
            throw InvalidInput("FITS table " + path + " has no readable column '" + w + "'");
        if (std::none_of(chosen.begin(), chosen.end(),
                         [&](const ColumnSpec& s) { return s.colnum == it->colnum; }))
            chosen.push_back(*it);
    }
    return chosen;
}

} // namespace

// ---------------------------------------------------------------------------------------------------
Table readFitsTable(const std::string& path, const std::string& hdu) {
    return readFitsTable(path, hdu, FitsColumnSelector{});
}

Table readFitsTable(const std::string& path, const std::string& hdu, const FitsColumnSelector& select) {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw IoError("cannot read FITS table " + path + ": no such file");
    if (fs::is_directory(path, ec)) throw IoError("cannot read FITS table " + path + ": is a directory");
    if (::access(path.c_str(), R_OK) != 0)
        throw IoError("cannot read FITS table " + path + ": permission denied");

    FitsHandle h;
    int status = openFitsForReading(path, h);
    if (status) {
        throw InvalidInput("cannot read " + path + " as FITS: " + cfitsioText(status));
    }
    moveToTable(h.f, path, hdu);

    int ncols = 0;
    LONGLONG nrows = 0;
    if (fits_get_num_cols(h.f, &ncols, &status) || fits_get_num_rowsll(h.f, &nrows, &status))
        throw IoError("cannot read FITS table " + path + ": " + cfitsioText(status));

    Header header = readTableHeader(h.f, path);
    Table table;
    table.name = header.getString("EXTNAME").value_or("");

    std::vector<ColumnSpec> specs;
    for (int c = 1; c <= ncols; ++c) {
        int rawType = 0, eqType = 0;
        long repeat = 0, width = 0;
        if (fits_get_coltype(h.f, c, &rawType, &repeat, &width, &status) ||
            fits_get_eqcoltype(h.f, c, &eqType, &repeat, &width, &status))
            throw IoError("cannot read FITS table " + path + ": column " + std::to_string(c) + ": " +
                          cfitsioText(status));
        ColumnSpec spec;
        spec.colnum = c;
        spec.name = header.getString("TTYPE" + std::to_string(c)).value_or("col" + std::to_string(c));
        if (spec.name.empty()) spec.name = "col" + std::to_string(c);
        if (classify(rawType, eqType, repeat, width, spec)) specs.push_back(std::move(spec));
    }

    if (select) specs = selectColumns(std::move(specs), select, path);

    const std::size_t n = static_cast<std::size_t>(nrows);
    std::vector<ColumnData> data;
    data.reserve(specs.size());
    for (const ColumnSpec& s : specs)
        data.push_back(makeData(s.kind, n));

    long chunk = 0;
    if (fits_get_rowsize(h.f, &chunk, &status))
        throw IoError("cannot read FITS table " + path + ": " + cfitsioText(status));
    chunk = std::max(chunk, 1L);
    std::vector<char> strBuf;
    std::vector<char*> strPtrs;
    const double nanValue = std::numeric_limits<double>::quiet_NaN();
    for (std::size_t first = 0; first < n; first += static_cast<std::size_t>(chunk)) {
        const std::size_t m = std::min(static_cast<std::size_t>(chunk), n - first);
        const LONGLONG row = static_cast<LONGLONG>(first) + 1;
        for (std::size_t i = 0; i < specs.size(); ++i) {
            const ColumnSpec& s = specs[i];
            int anynul = 0;
            auto get = [&](int type, void* nulval, void* dst) {
                fits_read_col(h.f, type, s.colnum, row, 1, static_cast<LONGLONG>(m), nulval, dst, &anynul,
                              &status);
            };
            switch (s.kind) {
            // Float columns are read without null checking, so that NaN, Inf and denormals come back as
            // stored; scaled integer columns (read as double) turn TNULL values into NaN.
            case kDouble:
                get(TDOUBLE, s.rawFloat ? nullptr : const_cast<double*>(&nanValue),
                    dataPtr<double>(data[i]) + first);
                break;
            case kFloat:
                get(TFLOAT, nullptr, dataPtr<float>(data[i]) + first);
                break;
            case kInt64:
                get(TLONGLONG, nullptr, dataPtr<std::int64_t>(data[i]) + first);
                break;
            case kInt32:
                get(TINT, nullptr, dataPtr<std::int32_t>(data[i]) + first);
                break;
            case kInt16:
                get(TSHORT, nullptr, dataPtr<std::int16_t>(data[i]) + first);
                break;
            case kUInt8:
                if (s.readType == TLOGICAL) {
                    char nul = 0;
                    get(TLOGICAL, &nul, dataPtr<std::uint8_t>(data[i]) + first);
                } else {
                    get(TBYTE, nullptr, dataPtr<std::uint8_t>(data[i]) + first);
                }
                break;
            default: {
                const std::size_t w = static_cast<std::size_t>(s.width) + 1;
                strBuf.assign(m * w, '\0');
                strPtrs.resize(m);
                for (std::size_t k = 0; k < m; ++k)
                    strPtrs[k] = strBuf.data() + k * w;
                char nul[1] = {'\0'};
                get(TSTRING, nul, strPtrs.data());
                auto& v = std::get<std::vector<std::string>>(data[i]);
                for (std::size_t k = 0; k < m; ++k) {
                    std::string str(strPtrs[k]);
                    while (!str.empty() && str.back() == ' ')
                        str.pop_back();
                    v[first + k] = std::move(str);
                }
            }
            }
            if (status)
                throw IoError("cannot read FITS table " + path + ": column " + s.name + ", rows " +
                              std::to_string(first + 1) + "-" + std::to_string(first + m) + ": " +
                              cfitsioText(status));
        }
    }

    for (std::size_t i = 0; i < specs.size(); ++i) {
        const std::string num = std::to_string(specs[i].colnum);
        // Names equal up to case would replace each other in a Table: keep both.
        if (table.find(specs[i].name)) specs[i].name += "_" + num;
        table.add(specs[i].name, std::move(data[i]), header.getString("TUNIT" + num).value_or(""),
                  header.getString("TCOMM" + num).value_or(""));
    }
    for (const HeaderCard& c : header.cards()) {
        if (isStructuralKey(c.key)) continue;
        if (c.key == "COMMENT")
            table.meta.addComment(c.comment);
        else if (c.key == "HISTORY")
            table.meta.addHistory(c.comment);
        else if (!c.key.empty())
            table.meta.setRaw(c.key, c.value, c.comment);
    }
    return table;
}

} // namespace gpuphot
