#include "core/io/fits_ldac.hpp"

#include <fitsio.h>

#include <cstring>

#include "core/io/atomic_file.hpp"
#include "core/io/cfitsio_util.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int status) {
    throw IoError("cannot write FITS_LDAC catalog " + path + ": " + what + ": " + cfitsioText(status));
}

int cfitsioType(char type) {
    switch (type) {
    case 'D':
        return TDOUBLE;
    case 'E':
        return TFLOAT;
    case 'J':
        return TINT;
    default:
        return TSHORT;
    }
}

const void* firstValue(const LdacColumn& c, std::size_t offset) {
    switch (c.type) {
    case 'D':
        return c.d.data() + offset;
    case 'E':
        return c.e.data() + offset;
    case 'J':
        return c.j.data() + offset;
    default:
        return c.i.data() + offset;
    }
}

std::string tdim(const std::vector<long>& dims) {
    std::string s = "(";
    for (std::size_t k = 0; k < dims.size(); ++k)
        s += (k ? ", " : "") + std::to_string(dims[k]);
    return s + ")";
}

// LDAC_IMHEAD: the header's cards as one string of 80-character records, END last.
void writeImageHeader(fitsfile* f, const std::string& path, const Header& header) {
    std::string cards = header.toFitsString();
    cards += "END";
    cards.resize((cards.size() + 79) / 80 * 80, ' ');
    const long ncards = static_cast<long>(cards.size() / 80);
    std::string type = "Field Header Card", form = std::to_string(cards.size()) + "A";
    char* pType = type.data();
    char* pForm = form.data();
    char extname[] = "LDAC_IMHEAD";
    int status = 0;
    if (fits_create_tbl(f, BINARY_TBL, 1, 1, &pType, &pForm, nullptr, extname, &status))
        fail(path, "LDAC_IMHEAD", status);
    // TDIM1 after the data: CFITSIO would take (80, n) for n strings of 80 characters and write only one.
    char* text = cards.data();
    fits_write_col(f, TSTRING, 1, 1, 1, 1, &text, &status);
    const std::string dim = tdim({80, ncards});
    fits_write_key_str(f, "TDIM1", dim.c_str(), "", &status);
    if (status) fail(path, "LDAC_IMHEAD", status);
}

void checkColumns(const std::string& path, const std::vector<LdacColumn>& columns, std::size_t rows) {
    for (const LdacColumn& c : columns) {
        if (std::strchr("DEJI", c.type) == nullptr || c.type == '\0')
            throw InvalidInput("FITS_LDAC column " + c.name + ": unknown type");
        if (c.values() != rows * static_cast<std::size_t>(c.repeat()))
            throw InvalidInput("cannot write FITS_LDAC catalog " + path + ": column " + c.name + " holds " +
                               std::to_string(c.values()) + " values, expected " +
                               std::to_string(rows * static_cast<std::size_t>(c.repeat())));
    }
}

void writeObjects(fitsfile* f, const std::string& path, const std::vector<LdacColumn>& columns,
                  std::size_t rows) {
    std::vector<std::string> type, form, unit;
    for (const LdacColumn& c : columns) {
        type.push_back(c.name);
        form.push_back(std::to_string(c.repeat()) + c.type);
        unit.push_back(c.unit);
    }
    std::vector<char*> pType, pForm, pUnit;
    for (std::size_t k = 0; k < columns.size(); ++k) {
        pType.push_back(type[k].data());
        pForm.push_back(form[k].data());
        pUnit.push_back(unit[k].data());
    }
    char extname[] = "LDAC_OBJECTS";
    int status = 0;
    if (fits_create_tbl(f, BINARY_TBL, static_cast<LONGLONG>(rows), static_cast<int>(columns.size()),
                        pType.data(), pForm.data(), pUnit.data(), extname, &status))
        fail(path, "LDAC_OBJECTS", status);
    for (std::size_t k = 0; k < columns.size(); ++k) {
        const std::string n = std::to_string(k + 1);
        if (columns[k].dims.size() > 1)
            fits_write_key_str(f, ("TDIM" + n).c_str(), tdim(columns[k].dims).c_str(), "", &status);
        if (!columns[k].comment.empty())
            fits_write_key_str(f, ("TCOMM" + n).c_str(), columns[k].comment.c_str(), "", &status);
        if (status) fail(path, "column " + columns[k].name, status);
    }
    long chunk = 0;
    if (fits_get_rowsize(f, &chunk, &status)) fail(path, "row size", status);
    chunk = std::max(chunk, 1L);
    for (std::size_t first = 0; first < rows; first += static_cast<std::size_t>(chunk)) {
        const std::size_t n = std::min(static_cast<std::size_t>(chunk), rows - first);
        for (std::size_t k = 0; k < columns.size(); ++k) {
            const LdacColumn& c = columns[k];
            const std::size_t rep = static_cast<std::size_t>(c.repeat());
            fits_write_col(f, cfitsioType(c.type), static_cast<int>(k) + 1, static_cast<LONGLONG>(first) + 1,
                           1, static_cast<LONGLONG>(n * rep), const_cast<void*>(firstValue(c, first * rep)),
                           &status);
            if (status) fail(path, "column " + c.name, status);
        }
    }
}

} // namespace

long LdacColumn::repeat() const {
    long r = 1;
    for (long d : dims)
        r *= d;
    return r;
}

std::size_t LdacColumn::values() const {
    switch (type) {
    case 'D':
        return d.size();
    case 'E':
        return e.size();
    case 'J':
        return j.size();
    default:
        return i.size();
    }
}

void writeFitsLdac(const std::string& path, const Header& imageHeader, const std::vector<LdacColumn>& columns,
                   std::size_t rows) {
    checkColumns(path, columns, rows);
    AtomicOutput out(path);
    FitsHandle h;
    int status = 0;
    if (fits_create_diskfile(&h.f, out.tempPath().c_str(), &status)) fail(path, "create", status);
    if (fits_create_img(h.f, BYTE_IMG, 0, nullptr, &status)) fail(path, "primary HDU", status);
    writeImageHeader(h.f, path, imageHeader);
    writeObjects(h.f, path, columns, rows);
    status = h.close();
    if (status) fail(path, "close", status);
    out.commit();
}

void writeFitsLdac(const std::string& path, const std::vector<LdacPart>& parts) {
    for (const LdacPart& p : parts)
        checkColumns(path, p.columns, p.rows);
    AtomicOutput out(path);
    FitsHandle h;
    int status = 0;
    if (fits_create_diskfile(&h.f, out.tempPath().c_str(), &status)) fail(path, "create", status);
    if (fits_create_img(h.f, BYTE_IMG, 0, nullptr, &status)) fail(path, "primary HDU", status);
    for (const LdacPart& p : parts) {
        writeImageHeader(h.f, path, p.imageHeader);
        writeObjects(h.f, path, p.columns, p.rows);
    }
    status = h.close();
    if (status) fail(path, "close", status);
    out.commit();
}

} // namespace gpuphot
