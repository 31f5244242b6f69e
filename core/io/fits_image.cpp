#include "core/io/fits_image.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include <fitsio.h>

#include "core/io/atomic_file.hpp"
#include "core/io/cfitsio_util.hpp"
#include "core/io/fits_raw_read.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {
namespace {
namespace fs = std::filesystem;

// Frames larger than this many pixels are refused as absurd (16 GiB of float32 pixels).
constexpr long long kMaxPixels = 1LL << 32;

struct Opened {
    FitsHandle h;
    bool extendedSyntax = false; // the path carried a CFITSIO "[...]" suffix that chose the HDU
};

// Opens `path` for reading with typed errors: IoError when it is missing or unreadable, InvalidInput when
// it is not FITS. A path that does not exist but whose part before '[' does is passed to CFITSIO as
// extended file-name syntax ("file.fits[SCI]", "file.fits[1][*,*,2]").
void openForRead(const std::string& path, Opened& out) {
    fits_clear_errmsg();
    std::error_code ec;
    std::string openName = path;
    std::vector<unsigned char> head; // the file's first bytes (not read for extended syntax)
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) {
        const auto br = path.find('[');
        if (br != std::string::npos && br > 0 && path.back() == ']' &&
            fs::is_regular_file(path.substr(0, br), ec)) {
            out.extendedSyntax = true;
        } else {
            throw IoError(path + ": no such file");
        }
    } else {
        if (fs::is_directory(st)) throw IoError(path + ": is a directory, not a FITS file");
        if (!std::ifstream(path, std::ios::binary))
            throw IoError(path + ": cannot open for reading: " + std::strerror(errno));
        head = fileHead(path, 80);
        if (head.empty()) throw InvalidInput(path + ": empty file, not a FITS file");
        if (compressionOf(head.data(), head.size()).empty() &&
            !(head.size() >= 9 && std::memcmp(head.data(), "SIMPLE  =", 9) == 0))
            throw InvalidInput(path + ": not a FITS file (it does not start with a SIMPLE card)");
    }
    int status = 0;
    if (out.extendedSyntax)
        fits_open_file(&out.h.f, openName.c_str(), READONLY, &status);
    else
        status = openFitsForReading(openName, out.h, head); // no extended syntax; header checks first
    if (status) {
        out.h.f = nullptr;
        const std::string why = cfitsioText(status);
        if (out.extendedSyntax)
            throw InvalidInput(path +
                               ": cannot open with the HDU or image section given in brackets: " + why);
        if (status == READ_ERROR || status == FILE_NOT_OPENED) throw IoError(path + ": cannot read: " + why);
        if (status == END_OF_FILE) throw IoError(path + ": truncated file: " + why);
        throw InvalidInput(path + ": not a valid FITS file: " + why);
    }
}

const char* hduTypeName(int type) {
    switch (type) {
    case IMAGE_HDU:
        return "IMAGE";
    case BINARY_TBL:
        return "BINTABLE";
    case ASCII_TBL:
        return "TABLE";
    }
    return "UNKNOWN";
}

std::vector<long long> imageAxes(fitsfile* f, int& status) {
    int naxis = 0;
    fits_get_img_dim(f, &naxis, &status);
    if (status || naxis <= 0) return {};
    std::vector<long long> axes(static_cast<std::size_t>(naxis));
    fits_get_img_sizell(f, naxis, axes.data(), &status);
    return axes;
}

bool hasData(const std::vector<long long>& axes) {
    if (axes.empty()) return false;
    return std::all_of(axes.begin(), axes.end(), [](long long a) { return a > 0; });
}

int currentHdu(fitsfile* f) {
    int n = 0;
    fits_get_hdu_num(f, &n);
    return n - 1;
}

// Moves to the HDU named by `spec` ("" = first image HDU with data, a 0-based number, or
// EXTNAME[,EXTVER]) and returns its 0-based index. `fallbackPrimary`: with "" and no image with data,
// use the primary HDU instead of failing (header-only files).
int selectHdu(fitsfile* f, const std::string& path, std::string spec, bool fallbackPrimary) {
    int status = 0, type = 0;
    while (!spec.empty() && std::isspace(static_cast<unsigned char>(spec.back())))
        spec.pop_back();
    while (!spec.empty() && std::isspace(static_cast<unsigned char>(spec.front())))
        spec.erase(spec.begin());
    if (spec.empty()) {
        int count = 0;
        for (int i = 1;; ++i) {
            fits_movabs_hdu(f, i, &type, &status);
            if (status == END_OF_FILE || status == BAD_HDU_NUM) {
                fits_clear_errmsg();
                status = 0;
                break;
            }
            if (status)
                throw InvalidInput(path + ": cannot read HDU " + std::to_string(i - 1) + ": " +
                                   cfitsioText(status));
            ++count;
            if (type != IMAGE_HDU) continue;
            if (hasData(imageAxes(f, status))) return i - 1;
            if (status)
                throw InvalidInput(path + ": cannot read HDU " + std::to_string(i - 1) + ": " +
                                   cfitsioText(status));
        }
        if (fallbackPrimary) {
            fits_movabs_hdu(f, 1, &type, &status);
            if (status) throw InvalidInput(path + ": " + cfitsioText(status));
            return 0;
        }
        throw InvalidInput(path + ": no image HDU with data (the file has " + std::to_string(count) + " HDU" +
                           (count == 1 ? "" : "s") + ")");
    }
    if (std::all_of(spec.begin(), spec.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
        if (spec.size() > 6) throw InvalidInput(path + ": HDU " + spec + " does not exist");
        const int n = std::stoi(spec);
        fits_movabs_hdu(f, n + 1, &type, &status);
        if (status) {
            fits_clear_errmsg();
            int total = 0, st2 = 0;
            fits_get_num_hdus(f, &total, &st2);
            fits_clear_errmsg();
            if (status == END_OF_FILE || status == BAD_HDU_NUM)
                throw InvalidInput(path + ": HDU " + spec + " does not exist (the file has " +
                                   std::to_string(total) + " HDUs, numbered from 0)");
            throw InvalidInput(path + ": cannot read HDU " + spec + ": " + cfitsioText(status));
        }
        return n;
    }
    std::string name = spec;
    int version = 0;
    if (auto comma = spec.find(','); comma != std::string::npos) {
        name = spec.substr(0, comma);
        const std::string v = spec.substr(comma + 1);
        try {
            version = std::stoi(v);
        } catch (const std::exception&) {
            throw InvalidInput(path + ": bad HDU selector '" + spec + "' (expected NAME or NAME,VERSION)");
        }
    }
    fits_movnam_hdu(f, ANY_HDU, name.data(), version, &status);
    if (status) {
        const std::string why = cfitsioText(status);
        if (status == BAD_HDU_NUM) throw InvalidInput(path + ": no HDU with EXTNAME '" + spec + "'");
        throw InvalidInput(path + ": cannot select HDU '" + spec + "': " + why);
    }
    return currentHdu(f);
}

bool isCompressed(fitsfile* f) {
    int st = 0;
    const int c = fits_is_compressed_image(f, &st);
    fits_clear_errmsg();
    return st == 0 && c != 0;
}

bool isNumbered(const std::string& k, const char* prefix) {
    const std::size_t n = std::strlen(prefix);
    return k.size() > n && k.compare(0, n, prefix) == 0 &&
           std::all_of(k.begin() + static_cast<std::ptrdiff_t>(n), k.end(),
                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// The image header of a tile-compressed HDU from its binary-table header: Z-keywords become the image's
// structural keywords, the table's and the compression's own keywords go. (CFITSIO's
// fits_convert_hdr2str does this too, but fails on valid files whose BSCALE/BZERO precede ZIMAGE, as
// astropy writes them.)
Header imageHeaderFromCompressed(const Header& table) {
    Header out;
    const bool primary = table.has("ZSIMPLE");
    if (primary)
        out.setRaw("SIMPLE", "T", "conforms to FITS standard");
    else
        out.setRaw("XTENSION", "'IMAGE   '", "image extension");
    const auto zcard = [&](const char* key) { return table.find(key); };
    if (const HeaderCard* c = zcard("ZBITPIX")) out.setRaw("BITPIX", c->value, "data type of the image");
    if (const HeaderCard* c = zcard("ZNAXIS")) out.setRaw("NAXIS", c->value, "number of data axes");
    const long long naxis = table.getInt("ZNAXIS").value_or(0);
    for (long long i = 1; i <= naxis && i < 1000; ++i)
        if (const HeaderCard* c = table.find("ZNAXIS" + std::to_string(i)))
            out.setRaw("NAXIS" + std::to_string(i), c->value, "length of data axis " + std::to_string(i));
    if (primary) {
        if (const HeaderCard* c = zcard("ZEXTEND")) out.setRaw("EXTEND", c->value);
    } else {
        const HeaderCard* pc = zcard("ZPCOUNT");
        const HeaderCard* gc = zcard("ZGCOUNT");
        out.setRaw("PCOUNT", pc ? pc->value : "0", "required keyword; must = 0");
        out.setRaw("GCOUNT", gc ? gc->value : "1", "required keyword; must = 1");
    }
    static const char* drop[] = {"SIMPLE",  "XTENSION", "BITPIX",   "NAXIS",    "PCOUNT",   "GCOUNT",
                                 "EXTEND",  "TFIELDS",  "THEAP",    "CHECKSUM", "DATASUM",  "ZIMAGE",
                                 "ZSIMPLE", "ZTENSION", "ZEXTEND",  "ZBITPIX",  "ZNAXIS",   "ZPCOUNT",
                                 "ZGCOUNT", "ZCMPTYPE", "ZMASKCMP", "ZQUANTIZ", "ZDITHER0", "ZBLANK",
                                 "ZSCALE",  "ZZERO",    "ZBLOCKED", "ZHECKSUM", "ZDATASUM", "END"};
    static const char* dropNumbered[] = {"NAXIS", "ZNAXIS", "ZTILE", "ZNAME", "ZVAL",  "TTYPE", "TFORM",
                                         "TUNIT", "TDIM",   "TNULL", "TSCAL", "TZERO", "TDISP"};
    for (const auto& c : table.cards()) {
        if (std::any_of(std::begin(drop), std::end(drop), [&](const char* d) { return c.key == d; }))
            continue;
        if (std::any_of(std::begin(dropNumbered), std::end(dropNumbered),
                        [&](const char* d) { return isNumbered(c.key, d); }))
            continue;
        if (c.key == "COMMENT" || c.key == "HISTORY" || c.key.empty() || !out.has(c.key))
            out.setRaw(c.key, c.value, c.comment); // commentary cards append, in order
    }
    if (const HeaderCard* c = table.find("ZHECKSUM")) out.setRaw("CHECKSUM", c->value, c->comment);
    if (const HeaderCard* c = table.find("ZDATASUM")) out.setRaw("DATASUM", c->value, c->comment);
    return out;
}

Header readCurrentHeader(fitsfile* f, const std::string& path) {
    char* text = nullptr;
    int nkeys = 0, status = 0;
    fits_hdr2str(f, 0, nullptr, 0, &text, &nkeys, &status);
    if (status) {
        if (text) {
            int s2 = 0;
            fits_free_memory(text, &s2);
        }
        throw InvalidInput(path + ": cannot read the header: " + cfitsioText(status));
    }
    Header h = Header::fromFitsString(std::string_view(text, std::strlen(text)));
    fits_free_memory(text, &status);
    return isCompressed(f) ? imageHeaderFromCompressed(h) : h;
}

// The header of the current HDU, with the primary's cards appended when INHERIT = T.
Header readHeaderWithInherit(fitsfile* f, const std::string& path, int hduIndex) {
    Header h = readCurrentHeader(f, path);
    if (hduIndex > 0 && h.getBool("INHERIT").value_or(false)) {
        int status = 0, type = 0;
        fits_movabs_hdu(f, 1, &type, &status);
        if (status) throw InvalidInput(path + ": cannot read the primary header: " + cfitsioText(status));
        const Header primary = readCurrentHeader(f, path);
        fits_movabs_hdu(f, hduIndex + 1, &type, &status);
        if (status) throw InvalidInput(path + ": " + cfitsioText(status));
        h.inheritFrom(primary);
    }
    return h;
}

// The string value of `key` in the current HDU, trailing blanks trimmed; empty when it is missing.
std::string readKeyString(fitsfile* f, const char* key) {
    char value[FLEN_VALUE] = {};
    int st = 0;
    fits_read_key(f, TSTRING, key, value, nullptr, &st);
    if (st) {
        fits_clear_errmsg();
        return {};
    }
    std::string s = value;
    while (!s.empty() && s.back() == ' ')
        s.pop_back();
    return s;
}

std::string readExtname(fitsfile* f) {
    return readKeyString(f, "EXTNAME");
}

long long readKeyLL(fitsfile* f, const char* key, long long fallback) {
    long long v = 0;
    int st = 0;
    fits_read_key(f, TLONGLONG, key, &v, nullptr, &st);
    if (st) {
        fits_clear_errmsg();
        return fallback;
    }
    return v;
}

// The pixels of tile `index` (0-based, in the order of the tile table's rows): tiles at the far edge of
// an axis are cut by the image.
long long pixelsOfTile(const std::vector<long long>& axes, const std::vector<long long>& tileSize,
                       long long index) {
    long long pixels = 1;
    for (std::size_t i = 0; i < axes.size(); ++i) {
        const long long across = (axes[i] + tileSize[i] - 1) / tileSize[i];
        const long long at = index % across;
        index /= across;
        pixels *= std::min(tileSize[i], axes[i] - at * tileSize[i]);
    }
    return pixels;
}

// The extent along NAXIS1 of tile `index`: the tile's row length, cut by the image at the far edge.
long long rowLengthOfTile(const std::vector<long long>& axes, const std::vector<long long>& tileSize,
                          long long index) {
    const long long across = (axes[0] + tileSize[0] - 1) / tileSize[0];
    return std::min(tileSize[0], axes[0] - index % across * tileSize[0]);
}

// A RICE_1 image's parameters as CFITSIO 4.2.0 reads them: ZVAL1 is the block size and ZVAL2 the bytes
// per pixel, whatever ZNAME1/ZNAME2 say; a missing or non-int value takes the default, and a block size
// below 16 with more than 8 bytes per pixel is taken as the two written the wrong way round.
struct RiceParams {
    int blockSize = 32;
    int bytePix = 4;
};

RiceParams readRiceParams(fitsfile* f) {
    auto intKey = [&](const char* key, int fallback) {
        const long long v = readKeyLL(f, key, LLONG_MIN);
        return v < INT_MIN || v > INT_MAX ? fallback : static_cast<int>(v);
    };
    RiceParams p{intKey("ZVAL1", 32), intKey("ZVAL2", 4)};
    if (p.blockSize < 16 && p.bytePix > 8) std::swap(p.blockSize, p.bytePix);
    return p;
}

// The codecs whose COMPRESSED_DATA tiles are walked before CFITSIO decodes them (by ZCMPTYPE, as
// imcomp_get_compressed_image_par reads it).
enum class TileCodec { Other, Gzip, Rice, Hcompress, Plio };

TileCodec tileCodecOf(const std::string& zcmptype) {
    if (zcmptype.rfind("GZIP_", 0) == 0) return TileCodec::Gzip;
    if (zcmptype == "RICE_1" || zcmptype == "RICE_ONE") return TileCodec::Rice;
    if (zcmptype == "HCOMPRESS_1") return TileCodec::Hcompress;
    if (zcmptype == "PLIO_1") return TileCodec::Plio;
    return TileCodec::Other;
}

// The COMPRESSED_DATA tiles of a RICE_1, HCOMPRESS_1 or PLIO_1 image, read as CFITSIO reads them before
// decoding (fits_read_col as TBYTE, or TSHORT for PLIO_1, whatever the column's type), one after the other
// in `bytes` or `words`.
struct CodedTiles {
    struct Tile {
        long long row = 0;
        std::size_t start = 0, count = 0;
    };
    TileCodec codec = TileCodec::Other;
    std::vector<Tile> tiles;
    std::vector<unsigned char> bytes;
    std::vector<short> words;

    void read(fitsfile* f, int column, long long row, long long count, int& status) {
        Tile t{row, codec == TileCodec::Plio ? words.size() : bytes.size(), static_cast<std::size_t>(count)};
        int anyNull = 0;
        if (codec == TileCodec::Plio) {
            words.resize(t.start + t.count);
            fits_read_col(f, TSHORT, column, row, 1, count, nullptr, words.data() + t.start, &anyNull,
                          &status);
        } else {
            bytes.resize(t.start + t.count);
            fits_read_col(f, TBYTE, column, row, 1, count, nullptr, bytes.data() + t.start, &anyNull,
                          &status);
        }
        if (!status) tiles.push_back(t);
    }
};

// Walks every coded tile in parallel (each walk costs about as much as CFITSIO's decoding of the tile)
// and throws InvalidInput for the first bad one.
void checkCodedTiles(fitsfile* f, const CodedTiles& coded, const std::vector<long long>& axes,
                     const std::vector<long long>& tileSize,
                     const std::function<void(long long, const std::string&)>& refuse) {
    if (coded.tiles.empty()) return;
    const RiceParams rice = readRiceParams(f);
    const int zbitpix = static_cast<int>(readKeyLL(f, "ZBITPIX", 0));
    long long firstBad = LLONG_MAX;
    std::string why;
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 8)
    for (std::size_t i = 0; i < coded.tiles.size(); ++i)
        errors.run([&] {
            const CodedTiles::Tile& t = coded.tiles[i];
            const long long pixels = pixelsOfTile(axes, tileSize, t.row - 1);
            std::string problem;
            if (coded.codec == TileCodec::Rice) {
                problem = riceTileProblem(coded.bytes.data() + t.start, t.count, pixels, rice.bytePix,
                                          rice.blockSize);
            } else if (coded.codec == TileCodec::Hcompress) {
                const long long nx = rowLengthOfTile(axes, tileSize, t.row - 1);
                problem =
                    hcompressTileProblem(coded.bytes.data() + t.start, t.count, nx, pixels / nx, zbitpix);
            } else {
                problem = plioTileProblem(coded.words.data() + t.start, t.count, pixels);
            }
            if (problem.empty()) return;
#pragma omp critical(gpuphot_tile_check)
            if (t.row < firstBad) {
                firstBad = t.row;
                why = std::move(problem);
            }
        });
    errors.rethrow();
    if (firstBad != LLONG_MAX) refuse(firstBad, why);
}

// Checks every tile of a tile-compressed image before CFITSIO decodes any, since CFITSIO 4.2.0 trusts
// them (each finding by tests/fuzz/fuzz_fits_reader, or heasarc/cfitsio issue #131):
// - every variable-length descriptor (element count, heap offset) must lie inside the heap: CFITSIO
//   allocates the compressed tile's buffer from the count before reading it (a 9 kB file asked for 1.9 GB);
// - GZIP tiles (ZCMPTYPE GZIP_1/GZIP_2, or GZIP_COMPRESSED_DATA, which holds the tiles that could not be
//   quantized under any ZCMPTYPE) must inflate to a complete stream within the tile's pixel bytes
//   (gzipTileProblem);
// - RICE_1, HCOMPRESS_1 and PLIO_1 tiles must decode within their data, and HCOMPRESS_1 tiles must be
//   of the tile's size (riceTileProblem, hcompressTileProblem, plioTileProblem), walked in parallel.
void checkTileStreams(fitsfile* f, const std::string& where, long long rows, long long heap,
                      const std::vector<long long>& axes, const std::vector<long long>& tileSize,
                      long long tilePixels) {
    const TileCodec codec = tileCodecOf(readKeyString(f, "ZCMPTYPE"));
    auto refuse = [&](long long row, const std::string& column, const std::string& why) {
        throw InvalidInput(where + ": malformed tile-compressed image (tile " + std::to_string(row) +
                           " of column " + column + ": " + why + ")");
    };
    CodedTiles coded;
    coded.codec = codec;
    std::vector<unsigned char> tileBytes;
    int ncols = 0, status = 0;
    fits_get_num_cols(f, &ncols, &status);
    for (int c = 1; c <= ncols && !status; ++c) {
        int typecode = 0;
        long long repeat = 0, width = 0;
        fits_get_coltypell(f, c, &typecode, &repeat, &width, &status);
        if (status || typecode >= 0) continue; // fixed-size column
        const long long elem = std::max(1LL, width);
        const std::string name = readKeyString(f, ("TTYPE" + std::to_string(c)).c_str());
        const bool gzipColumn =
            -typecode == TBYTE &&
            (name == "GZIP_COMPRESSED_DATA" || (codec == TileCodec::Gzip && name == "COMPRESSED_DATA"));
        const bool codedColumn =
            name == "COMPRESSED_DATA" &&
            (codec == TileCodec::Rice || codec == TileCodec::Hcompress || codec == TileCodec::Plio);
        for (long long r = 1; r <= rows && !status; ++r) {
            long long count = 0, offset = 0;
            fits_read_descriptll(f, c, r, &count, &offset, &status);
            const long long bytes = -typecode == TBIT ? (count + 7) / 8 : count;
            if (!status && (count < 0 || offset < 0 || offset > heap || bytes > (heap - offset) / elem))
                throw InvalidInput(where + ": malformed tile-compressed image (tile " + std::to_string(r) +
                                   " of column " + std::to_string(c) + " points outside the heap)");
            if (status || !(gzipColumn || codedColumn) || count == 0) continue;
            if (codedColumn) {
                coded.read(f, c, r, count, status);
                continue;
            }
            tileBytes.resize(static_cast<std::size_t>(count));
            int anyNull = 0;
            fits_read_col(f, TBYTE, c, r, 1, count, nullptr, tileBytes.data(), &anyNull, &status);
            if (status) break;
            const std::string why =
                gzipTileProblem(tileBytes.data(), tileBytes.size(), static_cast<std::size_t>(tilePixels) * 8);
            if (!why.empty()) refuse(r, name, why);
        }
    }
    if (status) throw InvalidInput(where + ": malformed tile-compressed image: " + cfitsioText(status));
    checkCodedTiles(f, coded, axes, tileSize,
                    [&](long long row, const std::string& why) { refuse(row, "COMPRESSED_DATA", why); });
}

// Checks the image's size against the data the file actually holds before anything is allocated.
void checkDataSize(fitsfile* f, const std::string& path, int hdu, const std::vector<long long>& axes,
                   int rawBitpix, bool compressed) {
    long long headStart = 0, dataStart = 0, dataEnd = 0;
    int status = 0;
    fits_get_hduaddrll(f, &headStart, &dataStart, &dataEnd, &status);
    if (status) throw InvalidInput(path + ": HDU " + std::to_string(hdu) + ": " + cfitsioText(status));
    const long long fileSize = f->Fptr->filesize; // physical size (for .gz: the decompressed size in memory)
    const std::string where = path + ": HDU " + std::to_string(hdu);
    long long need = 0;
    if (compressed) {
        // The compressed image is a binary table: one row per tile, plus the heap.
        const long long rowBytes = readKeyLL(f, "NAXIS1", -1), rows = readKeyLL(f, "NAXIS2", -1);
        const long long heap = readKeyLL(f, "PCOUNT", 0);
        if (rowBytes < 0 || rows < 0 || heap < 0)
            throw InvalidInput(where + ": malformed tile-compressed image (bad NAXIS1/NAXIS2/PCOUNT)");
        long long tiles = 1, tilePixels = 1;
        std::vector<long long> tileSize;
        for (std::size_t i = 0; i < axes.size(); ++i) {
            const std::string key = "ZTILE" + std::to_string(i + 1);
            const long long t = readKeyLL(f, key.c_str(), i == 0 ? axes[0] : 1);
            if (t <= 0) throw InvalidInput(where + ": malformed tile-compressed image (" + key + " <= 0)");
            tiles *= (axes[i] + t - 1) / t;
            tilePixels *= std::min(t, axes[i]); // axes were bounded by the caller
            tileSize.push_back(t);
        }
        if (tiles != rows)
            throw InvalidInput(where + ": inconsistent tile-compressed image: its size (" +
                               std::to_string(axes[0]) + " x " +
                               std::to_string(axes.size() > 1 ? axes[1] : 1) + ") needs " +
                               std::to_string(tiles) + " tiles, the table has " + std::to_string(rows));
        if (rowBytes > 0 && rows > (LLONG_MAX / 2) / rowBytes)
            throw InvalidInput(where + ": absurd tile table size");
        need = dataStart + rowBytes * rows + heap;
        if (need <= fileSize) {
            checkTileStreams(f, where, rows, heap, axes, tileSize, tilePixels);
        }
    } else {
        long long n = 1;
        for (long long a : axes)
            n *= a; // axes were bounded by the caller
        need = dataStart + n * (std::abs(rawBitpix) / 8);
    }
    if (need > fileSize)
        throw IoError(where + ": truncated file: the header promises " + std::to_string(need - dataStart) +
                      " bytes of data, the file holds " +
                      std::to_string(std::max(0LL, fileSize - dataStart)));
    // CFITSIO reads whole 2880-byte blocks: a file without the final padding cannot be read either.
    const long long padded = (need + 2879) / 2880 * 2880;
    if (padded > fileSize)
        throw IoError(where + ": truncated file: the last 2880-byte FITS block is incomplete (" +
                      std::to_string(fileSize) + " bytes, the standard requires " + std::to_string(padded) +
                      ")");
}

} // namespace

Frame readFrame(const std::string& path, const FrameReadOptions& options) {
    return readFrame(path, options, nullptr);
}

Frame readFrame(const std::string& path, const FrameReadOptions& options, RawChunkSink* sink) {
    Opened op;
    openForRead(path, op);
    fitsfile* f = op.h.f;
    int hdu = 0;
    if (op.extendedSyntax && options.hdu.empty())
        hdu = currentHdu(f);
    else
        hdu = selectHdu(f, path, options.hdu, false);

    const std::string where = path + ": HDU " + std::to_string(hdu);
    int type = 0, status = 0;
    fits_get_hdu_type(f, &type, &status);
    const std::string extname = readExtname(f);
    const std::string whereName = extname.empty() ? where : where + " (" + extname + ")";
    if (status) throw InvalidInput(where + ": " + cfitsioText(status));
    if (type != IMAGE_HDU)
        throw InvalidInput(whereName + " is a " + (type == BINARY_TBL ? "binary table" : "table") +
                           ", not an image");
    const std::vector<long long> axes = imageAxes(f, status);
    if (status) throw InvalidInput(whereName + ": " + cfitsioText(status));
    if (axes.empty()) throw InvalidInput(whereName + " has no data (NAXIS = 0)");
    for (std::size_t i = 0; i < axes.size(); ++i)
        if (axes[i] <= 0)
            throw InvalidInput(whereName + ": zero-size axis (NAXIS" + std::to_string(i + 1) + " = " +
                               std::to_string(axes[i]) + ")");
    if (axes.size() == 1)
        throw InvalidInput(whereName + ": 1-D data (NAXIS1 = " + std::to_string(axes[0]) +
                           "); an image needs 2 axes");
    for (std::size_t i = 2; i < axes.size(); ++i)
        if (axes[i] > 1)
            throw InvalidInput(whereName + ": " + std::to_string(axes.size()) + "-D data (NAXIS" +
                               std::to_string(i + 1) + " = " + std::to_string(axes[i]) +
                               "): a cube; select a plane with CFITSIO's image-section syntax, e.g. '" +
                               path + "[" + std::to_string(hdu) + "][*,*,1:1]'");
    if (axes[0] > INT_MAX || axes[1] > INT_MAX || axes[0] > kMaxPixels / axes[1])
        throw InvalidInput(whereName + ": absurd image size " + std::to_string(axes[0]) + " x " +
                           std::to_string(axes[1]));

    int rawBitpix = 0;
    fits_get_img_type(f, &rawBitpix, &status);
    if (status) throw InvalidInput(whereName + ": " + cfitsioText(status));
    const bool compressed = isCompressed(f);
    checkDataSize(f, path, hdu, axes, rawBitpix, compressed);

    Frame frame;
    frame.path = path;
    frame.hdu = hdu;
    frame.extname = extname;
    frame.bitpix = rawBitpix;
    frame.header = readHeaderWithInherit(f, path, hdu);
    try {
        frame.instrument = readInstrument(frame.header, options.keywords, options.overrides);
    } catch (const InvalidInput& e) {
        throw InvalidInput(whereName + ": " + e.what());
    }

    const int w = static_cast<int>(axes[0]), h = static_cast<int>(axes[1]);
    const long long npix = static_cast<long long>(w) * h;
    frame.pixels = Image<float>(w, h, Image<float>::Recycled{});
    frame.mask = Image<std::uint8_t>(w, h, Image<std::uint8_t>::Recycled{});
    // Straight into the float buffer: CFITSIO converts (and applies BSCALE/BZERO) chunk by chunk. With a
    // NaN null value, BLANK pixels of integer images (and NaN/Inf of float images) come back as NaN.
    // Uncompressed images: the raw bytes read and converted by several threads (fits_raw_read.hpp), the
    // same floats as CFITSIO's conversion.
    const std::optional<RawImageLayout> raw =
        op.extendedSyntax || options.cfitsioOnly ? std::nullopt : rawImageLayout(f, path, npix);
    float nulval = std::numeric_limits<float>::quiet_NaN();
    int anynul = 0;
    const bool integerData = rawBitpix > 0;
    const std::uint8_t nullBits = integerData ? (MaskBad | MaskNonFinite) : MaskNonFinite;
    const RawMaskRule rule{frame.instrument.saturation, nullBits, MaskSaturated};
    if (raw) {
        RawChunkSink* const to = sink && sink->begin(*raw, w, h, rule) ? sink : nullptr;
        readRawImage(path, *raw, frame.pixels.data(), 0, 0, to, frame.mask.data(), rule);
    } else
        fits_read_img(f, TFLOAT, 1, npix, &nulval, frame.pixels.data(), &anynul, &status);
    if (status == NUM_OVERFLOW) { // -64 data beyond the float range: +-Inf (masked), as the raw read
        status = 0;
        fits_clear_errmsg();
    }
    if (status) {
        const std::string why = cfitsioText(status);
        if (status == END_OF_FILE || status == READ_ERROR)
            throw IoError(whereName + ": cannot read the pixel data (truncated file?): " + why);
        throw InvalidInput(whereName + ": cannot decode the pixel data: " + why);
    }

    if (!raw) { // the raw read masks each chunk as it converts it
        const std::size_t n = static_cast<std::size_t>(npix), piece = std::size_t(1) << 20;
        const long long pieces = static_cast<long long>((n + piece - 1) / piece);
#pragma omp parallel for schedule(static)
        for (long long k = 0; k < pieces; ++k) {
            const std::size_t at = static_cast<std::size_t>(k) * piece;
            maskPixels(frame.pixels.data() + at, std::min(piece, n - at), rule, frame.mask.data() + at);
        }
    }

    std::string why;
    try {
        if (auto wcs = Wcs::tryFromHeader(frame.header, &why))
            frame.wcs = std::make_shared<const Wcs>(std::move(*wcs));
        else
            frame.wcsProblem = why;
    } catch (const std::exception& e) {
        frame.wcsProblem = e.what();
        frame.wcsBroken = true;
    }
    return frame;
}

std::vector<HduSummary> listHdus(const std::string& path) {
    Opened op;
    openForRead(path, op);
    fitsfile* f = op.h.f;
    std::vector<HduSummary> out;
    for (int i = 1;; ++i) {
        int type = 0, status = 0;
        fits_movabs_hdu(f, i, &type, &status);
        if (status == END_OF_FILE || status == BAD_HDU_NUM) {
            fits_clear_errmsg();
            break;
        }
        if (status)
            throw InvalidInput(path + ": cannot read HDU " + std::to_string(i - 1) + ": " +
                               cfitsioText(status));
        HduSummary s;
        s.index = i - 1;
        s.type = hduTypeName(type);
        s.extname = readExtname(f);
        if (type == IMAGE_HDU) {
            fits_get_img_equivtype(f, &s.bitpix, &status);
            s.axes = imageAxes(f, status);
            s.compressed = isCompressed(f);
        } else {
            int ncols = 0;
            long long nrows = 0;
            fits_get_num_cols(f, &ncols, &status);
            fits_get_num_rowsll(f, &nrows, &status);
            s.axes = {ncols, nrows};
        }
        if (status) fits_clear_errmsg();
        out.push_back(std::move(s));
    }
    return out;
}

Header readHeader(const std::string& path, const std::string& hdu) {
    Opened op;
    openForRead(path, op);
    int index = 0;
    if (op.extendedSyntax && hdu.empty())
        index = currentHdu(op.h.f);
    else
        index = selectHdu(op.h.f, path, hdu, true);
    return readHeaderWithInherit(op.h.f, path, index);
}

// ---- writing -------------------------------------------------------------------------------------

namespace {

bool isStructuralKey(const std::string& k) {
    static const char* exact[] = {"SIMPLE",   "BITPIX",   "NAXIS",    "EXTEND",   "BZERO",    "BSCALE",
                                  "BLANK",    "PCOUNT",   "GCOUNT",   "XTENSION", "END",      "CHECKSUM",
                                  "DATASUM",  "ZIMAGE",   "ZBITPIX",  "ZNAXIS",   "ZCMPTYPE", "ZQUANTIZ",
                                  "ZDITHER0", "ZSIMPLE",  "ZEXTEND",  "ZBLOCKED", "ZPCOUNT",  "ZGCOUNT",
                                  "ZHECKSUM", "ZDATASUM", "ZTENSION", "ZBLANK",   "ZSCALE",   "ZZERO"};
    for (const char* e : exact)
        if (k == e) return true;
    auto numbered = [&](const char* prefix) {
        const std::size_t n = std::strlen(prefix);
        return k.size() > n && k.compare(0, n, prefix) == 0 &&
               std::all_of(k.begin() + static_cast<std::ptrdiff_t>(n), k.end(),
                           [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    };
    return numbered("NAXIS") || numbered("ZNAXIS") || numbered("ZTILE") || numbered("ZNAME") ||
           numbered("ZVAL");
}

bool endsWith(const std::string& s, const char* suffix) {
    const std::size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

void writeHeaderCards(fitsfile* f, const Header& header, int& status) {
    for (const auto& c : header.cards()) {
        if (status) return;
        if (isStructuralKey(c.key)) continue;
        if (c.key == "COMMENT") {
            fits_write_comment(f, c.comment.c_str(), &status);
        } else if (c.key == "HISTORY") {
            fits_write_history(f, c.comment.c_str(), &status);
        } else if (c.key.size() <= 8 && !c.value.empty() && c.value.front() == '\'' &&
                   10 + c.value.size() > 80) {
            // A string too long for one card: CFITSIO's CONTINUE convention.
            const std::string v = unquoteFitsString(c.value);
            fits_update_key_longstr(f, c.key.c_str(), v.c_str(), c.comment.c_str(), &status);
        } else {
            const std::string card = Header::formatCard(c);
            fits_write_record(f, card.c_str(), &status);
        }
    }
}

// Creates `path` (atomically) with one 2-D image of CFITSIO image type `imgType`, writes the header cards,
// an optional BLANK, then calls `writeData`.
void writeImageFile(const std::string& path, int width, int height, const Header& header, int imgType,
                    std::optional<long long> blank, const std::function<void(fitsfile*, int&)>& writeData) {
    if (width <= 0 || height <= 0)
        throw InvalidInput("cannot write " + path + ": empty image (" + std::to_string(width) + " x " +
                           std::to_string(height) + ")");
    if (endsWith(path, ".gz"))
        throw InvalidInput("cannot write " + path +
                           ": gzip output is not supported (write .fits or .fits.fz)");
    AtomicOutput out(path);
    FitsHandle h;
    int status = 0;
    fits_clear_errmsg();
    fits_create_file(&h.f, ("!" + out.tempPath()).c_str(), &status);
    if (status) {
        h.f = nullptr;
        throw IoError("cannot write " + path + ": " + cfitsioText(status));
    }
    if (endsWith(path, ".fz")) {
        // Tile compression: Rice for integers; floats losslessly (GZIP_2, no quantisation), because a
        // photometry pipeline must not silently round its pixels.
        if (imgType < 0) {
            fits_set_compression_type(h.f, GZIP_2, &status);
            fits_set_quantize_level(h.f, 0.0f, &status);
        } else {
            fits_set_compression_type(h.f, RICE_1, &status);
        }
    }
    long naxes[2] = {width, height};
    fits_create_img(h.f, imgType, 2, naxes, &status);
    writeHeaderCards(h.f, header, status);
    if (blank)
        fits_write_key_lng(h.f, "BLANK", static_cast<LONGLONG>(*blank), "value of undefined pixels", &status);
    if (!status) writeData(h.f, status);
    int closeStatus = 0;
    fits_close_file(h.f, &closeStatus);
    h.f = nullptr;
    if (status || closeStatus) {
        const std::string why = cfitsioText(status ? status : closeStatus);
        throw IoError("cannot write " + path + ": " + why);
    }
    out.commit();
}

// Writes rows of `view` converted by `conv` into buffers of T, a few rows per call.
template <class T, class Src, class Conv>
void writeRows(fitsfile* f, int datatype, const ImageViewT<Src>& view, Conv conv, int& status) {
    const int rowsPerChunk = std::max(1, (1 << 20) / std::max(1, view.width));
    std::vector<T> buf(static_cast<std::size_t>(rowsPerChunk) * static_cast<std::size_t>(view.width));
    for (int y0 = 0; y0 < view.height && !status; y0 += rowsPerChunk) {
        const int rows = std::min(rowsPerChunk, view.height - y0);
        for (int r = 0; r < rows; ++r) {
            const Src* src = view.row(y0 + r);
            T* dst = buf.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(view.width);
            for (int x = 0; x < view.width; ++x)
                dst[x] = conv(src[x]);
        }
        const long long first = static_cast<long long>(y0) * view.width + 1;
        fits_write_img(f, datatype, first, static_cast<long long>(rows) * view.width, buf.data(), &status);
    }
}

bool anyNaN(const ImageView& v) {
    for (int y = 0; y < v.height; ++y) {
        const float* r = v.row(y);
        for (int x = 0; x < v.width; ++x)
            if (std::isnan(r[x])) return true;
    }
    return false;
}

// Rounds half away from zero and clips to [lo, hi]; NaN becomes `nanValue`.
template <class T> T toInt(float v, double lo, double hi, T nanValue) {
    if (std::isnan(v)) return nanValue;
    const double r = std::round(static_cast<double>(v));
    if (r <= lo) return static_cast<T>(lo);
    if (r >= hi) return static_cast<T>(hi);
    return static_cast<T>(r);
}

template <class T>
void writeIntegerFloat(const std::string& path, const ImageView& image, const Header& header, int imgType,
                       int datatype) {
    const double tmin = static_cast<double>(std::numeric_limits<T>::min());
    const double tmax = static_cast<double>(std::numeric_limits<T>::max());
    // Largest double that converts to T without overflow (2^63 is not representable in int64).
    const double hi = sizeof(T) == 8 ? 9.2233720368547748e18 : tmax;
    const bool nan = anyNaN(image);
    // NaN pixels are written as the type's lowest value, declared as BLANK; other values avoid it.
    const double lo = nan ? tmin + 1 : tmin;
    std::optional<long long> blank;
    if (nan) blank = static_cast<long long>(std::numeric_limits<T>::min());
    const T nanValue = std::numeric_limits<T>::min();
    writeImageFile(path, image.width, image.height, header, imgType, blank, [&](fitsfile* f, int& st) {
        writeRows<T>(
            f, datatype, image, [&](float v) { return toInt<T>(v, lo, hi, nanValue); }, st);
    });
}

} // namespace

void writeFitsImage(const std::string& path, const ImageView& image, const Header& header, int bitpix) {
    switch (bitpix) {
    case -32:
        writeImageFile(path, image.width, image.height, header, FLOAT_IMG, std::nullopt,
                       [&](fitsfile* f, int& st) {
                           writeRows<float>(
                               f, TFLOAT, image, [](float v) { return v; }, st);
                       });
        return;
    case -64:
        writeImageFile(path, image.width, image.height, header, DOUBLE_IMG, std::nullopt,
                       [&](fitsfile* f, int& st) {
                           writeRows<double>(
                               f, TDOUBLE, image, [](float v) { return static_cast<double>(v); }, st);
                       });
        return;
    case 8: {
        // Unsigned bytes: NaN -> BLANK 0, values clipped to 1..255 then.
        const bool nan = anyNaN(image);
        const double lo = nan ? 1.0 : 0.0;
        std::optional<long long> blank;
        if (nan) blank = 0;
        writeImageFile(path, image.width, image.height, header, BYTE_IMG, blank, [&](fitsfile* f, int& st) {
            writeRows<unsigned char>(
                f, TBYTE, image, [&](float v) { return toInt<unsigned char>(v, lo, 255.0, 0); }, st);
        });
        return;
    }
    case 16:
        writeIntegerFloat<std::int16_t>(path, image, header, SHORT_IMG, TSHORT);
        return;
    case 32:
        writeIntegerFloat<std::int32_t>(path, image, header, LONG_IMG, TINT);
        return;
    case 64:
        writeIntegerFloat<std::int64_t>(path, image, header, LONGLONG_IMG, TLONGLONG);
        return;
    case kBitpixUInt16: {
        // BITPIX 16 with BZERO 32768 (CFITSIO writes both). NaN -> physical 0 (raw -32768) declared as
        // BLANK; other values clipped to 1..65535 then.
        const bool nan = anyNaN(image);
        const double lo = nan ? 1.0 : 0.0;
        std::optional<long long> blank;
        if (nan) blank = -32768;
        writeImageFile(path, image.width, image.height, header, USHORT_IMG, blank, [&](fitsfile* f, int& st) {
            writeRows<unsigned short>(
                f, TUSHORT, image, [&](float v) { return toInt<unsigned short>(v, lo, 65535.0, 0); }, st);
        });
        return;
    }
    default:
        throw InvalidInput("cannot write " + path + ": unsupported BITPIX " + std::to_string(bitpix) +
                           " (expected -32, -64, 8, 16, 32, 64 or 20 for unsigned 16-bit)");
    }
}

void writeFitsImage(const std::string& path, const ImageViewT<std::int32_t>& image, const Header& header) {
    writeImageFile(path, image.width, image.height, header, LONG_IMG, std::nullopt,
                   [&](fitsfile* f, int& st) {
                       writeRows<int>(
                           f, TINT, image, [](std::int32_t v) { return static_cast<int>(v); }, st);
                   });
}

void writeFitsImage(const std::string& path, const ImageViewT<std::uint8_t>& image, const Header& header) {
    writeImageFile(path, image.width, image.height, header, BYTE_IMG, std::nullopt,
                   [&](fitsfile* f, int& st) {
                       writeRows<unsigned char>(
                           f, TBYTE, image, [](std::uint8_t v) { return v; }, st);
                   });
}

void writeFitsHeader(const std::string& path, const Header& header) {
    AtomicOutput out(path);
    FitsHandle h;
    int status = 0;
    fits_clear_errmsg();
    fits_create_file(&h.f, ("!" + out.tempPath()).c_str(), &status);
    if (status) {
        h.f = nullptr;
        throw IoError("cannot write " + path + ": " + cfitsioText(status));
    }
    fits_create_img(h.f, BYTE_IMG, 0, nullptr, &status);
    writeHeaderCards(h.f, header, status);
    int closeStatus = 0;
    fits_close_file(h.f, &closeStatus);
    h.f = nullptr;
    if (status || closeStatus)
        throw IoError("cannot write " + path + ": " + cfitsioText(status ? status : closeStatus));
    out.commit();
}

} // namespace gpuphot
