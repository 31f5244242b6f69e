#include "core/io/cfitsio_util.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include <zlib.h>

#include "core/util/errors.hpp"

namespace gpuphot {

FitsHandle::~FitsHandle() {
    if (f) {
        int st = 0;
        fits_close_file(f, &st);
        fits_clear_errmsg();
    }
}

int FitsHandle::close() {
    int st = 0;
    if (f) fits_close_file(f, &st);
    f = nullptr;
    return st;
}

std::string cfitsioText(int status) {
    char text[FLEN_STATUS] = {};
    fits_get_errstatus(status, text);
    std::string msg = text;
    std::vector<std::string> stack;
    char m[FLEN_ERRMSG] = {};
    while (fits_read_errmsg(m))
        stack.emplace_back(m);
    if (!stack.empty()) {
        msg += " [CFITSIO:";
        const std::size_t first = stack.size() > 3 ? stack.size() - 3 : 0;
        for (std::size_t i = first; i < stack.size(); ++i) {
            std::string s = stack[i];
            while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())))
                s.pop_back();
            msg += (i == first ? " " : "; ") + s;
        }
        msg += "]";
    }
    return msg;
}

namespace {

// The keywords that fix an HDU's structure (FITS 4.0 sections 4.4.1, 7.2.1, 7.3.1): integers.
bool isStructuralKey(const std::string& key) {
    if (key == "BITPIX" || key == "NAXIS" || key == "PCOUNT" || key == "GCOUNT" || key == "TFIELDS")
        return true;
    return key.size() > 5 && key.rfind("NAXIS", 0) == 0 &&
           key.find_first_not_of("0123456789", 5) == std::string::npos;
}

// An optional sign and one or more digits, nothing else.
bool isPlainInteger(const std::string& word) {
    const std::size_t start = !word.empty() && (word[0] == '+' || word[0] == '-') ? 1 : 0;
    return word.size() > start && word.find_first_not_of("0123456789", start) == std::string::npos;
}

} // namespace

void checkHeadersCfitsioCanParse(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    in.seekg(0, std::ios::end);
    const long long size = static_cast<long long>(in.tellg());
    constexpr long long kBlock = 2880;
    char block[kBlock];
    long long pos = 0;
    // A last header block cut short is scanned too (padded with blanks): CFITSIO reads such a header, and
    // a fuzz input whose ZTILE2 = 0 sat in a truncated block divided by zero (found by the CI fuzz run).
    for (int hdu = 0; hdu < 100000 && pos < size; ++hdu) {
        long long bitpix = 0, naxis = 0, pcount = 0, gcount = 1, product = 1;
        bool end = false, zimage = false;
        std::string
            badTile; // "ZTILEn = v" / "ZNAXISn = v" not a positive integer, checked for ZIMAGE headers
        while (!end) {
            if (pos >= size) return;
            in.seekg(pos);
            const long long avail = std::min(kBlock, size - pos);
            std::memset(block, ' ', sizeof block);
            if (!in.read(block, avail)) return;
            if (pos == 0 && std::memcmp(block, "SIMPLE  =", 9) != 0) return; // not plain FITS
            pos += kBlock;
            for (int c = 0; c < 36 && !end; ++c) {
                const std::string card(block + 80 * c, 80);
                std::string key = card.substr(0, 8);
                while (!key.empty() && key.back() == ' ')
                    key.pop_back();
                if (key == "END") {
                    end = true;
                    break;
                }
                if (card[8] != '=') continue;
                std::string value = card.substr(9);
                const auto first = value.find_first_not_of(' ');
                value = first == std::string::npos ? std::string() : value.substr(first);
                while (!value.empty() && value.back() == ' ')
                    value.pop_back();
                if (key.rfind("TTYPE", 0) == 0 && !value.empty() && value[0] != '\'' && value.size() >= 69)
                    throw InvalidInput(path + ": HDU " + std::to_string(hdu) + ": header keyword " + key +
                                       " has an unquoted value of " + std::to_string(value.size()) +
                                       " characters (a column name must be a quoted string)");
                // CFITSIO 4.2.0 divides by ZTILEn when it moves to a tile-compressed image (in
                // imcomp_get_compressed_image_par): ZTILE2 = 0 killed the process with SIGFPE (found by the
                // CI fuzz run). A tile size must be a positive integer. (value still
                // holds the comment: the logical or number is its first word)
                const std::string word = value.substr(0, value.find_first_of(" /"));
                if (key == "ZIMAGE") zimage = word == "T";
                // The same for a ZTILEn or ZNAXISn that is not a plain integer ("ZTILE1 = è 1" repeated after
                // a valid ZTILE1 also ended in SIGFPE, found by the CI fuzz run).
                const bool tileKey = key.size() > 5 && key.rfind("ZTILE", 0) == 0 &&
                                     key.find_first_not_of("0123456789", 5) == std::string::npos;
                const bool axisKey = key.size() > 6 && key.rfind("ZNAXIS", 0) == 0 &&
                                     key.find_first_not_of("0123456789", 6) == std::string::npos;
                if ((tileKey || axisKey) && badTile.empty() &&
                    (!isPlainInteger(word) || std::strtoll(word.c_str(), nullptr, 10) < 1))
                    badTile = key + " = " + word.substr(0, 20);
                // CFITSIO 4.2.0 answers a mandatory structural keyword that is not an integer ("NAXIS2 = $
                // 3") with NOT_POS_INT and leaves state behind: the next open of the same file in the process
                // read garbage and asked calloc for gigabytes (found by the CI fuzz run). Such a value is
                // refused here, before CFITSIO parses the header.
                if (isStructuralKey(key) && !isPlainInteger(word))
                    throw InvalidInput(path + ": HDU " + std::to_string(hdu) + ": header keyword " + key +
                                       " = " + value.substr(0, 20) +
                                       " is not an integer (a mandatory FITS keyword)");
                const long long v = std::strtoll(value.c_str(), nullptr, 10);
                if (key == "BITPIX")
                    bitpix = v;
                else if (key == "NAXIS")
                    naxis = v;
                else if (key == "PCOUNT")
                    pcount = v;
                else if (key == "GCOUNT")
                    gcount = v;
                else if (key.rfind("NAXIS", 0) == 0 && key.size() > 5) {
                    if (v < 0 || (v > 0 && product > (1LL << 50) / v)) return;
                    product *= v;
                }
            }
        }
        if (zimage && !badTile.empty())
            throw InvalidInput(path + ": HDU " + std::to_string(hdu) + ": malformed tile-compressed image: " +
                               badTile + " (tile sizes and image axes must be positive integers)");
        if (naxis == 0) product = 0;
        const long long bytes = std::llabs(bitpix) / 8;
        if (naxis < 0 || pcount < 0 || gcount < 0 || bytes > 8 || product + pcount > (1LL << 50)) return;
        const long long data = bytes * gcount * (pcount + product);
        pos += (data + kBlock - 1) / kBlock * kBlock;
    }
}

std::string gzipTileProblem(const unsigned char* data, std::size_t bytes, std::size_t maxOut) {
    z_stream z{};
    if (inflateInit2(&z, 15 + 16) != Z_OK) return "zlib could not start inflating"; // gzip only, as CFITSIO
    struct End {
        z_stream& z;
        ~End() { inflateEnd(&z); }
    } end{z};
    unsigned char scratch[16384];
    std::size_t fed = 0;
    for (;;) {
        if (z.avail_in == 0 && fed < bytes) { // zlib counts input in 32 bits: feed it in slices
            const std::size_t slice = std::min<std::size_t>(bytes - fed, 1u << 30);
            z.next_in = const_cast<unsigned char*>(data + fed);
            z.avail_in = static_cast<uInt>(slice);
            fed += slice;
        }
        z.next_out = scratch;
        z.avail_out = sizeof scratch;
        const int err = inflate(&z, Z_NO_FLUSH);
        if (z.total_out > maxOut)
            return "its GZIP data expands beyond the tile's " + std::to_string(maxOut) + " bytes";
        if (err == Z_STREAM_END) return {};
        if (err == Z_BUF_ERROR && z.avail_in == 0 && fed == bytes)
            return "its GZIP data ends before the end of the compressed stream (truncated tile)";
        if (err != Z_OK && err != Z_BUF_ERROR)
            return std::string("its GZIP data is corrupt (zlib: ") +
                   (z.msg ? std::string(z.msg) : "error " + std::to_string(err)) + ")";
    }
}

std::string riceTileProblem(const unsigned char* data, std::size_t bytes, long long pixels, int bytePix,
                            int blockSize) {
    if (pixels <= 0) return {};
    if (blockSize <= 0) return "its Rice BLOCKSIZE " + std::to_string(blockSize) + " is not positive";
    // CFITSIO's constants for each pixel size: FS bits, the FS that marks direct coding, bits per pixel.
    const int fsBits = bytePix == 1 ? 3 : bytePix == 2 ? 4 : 5;
    const int fsMax = bytePix == 1 ? 6 : bytePix == 2 ? 14 : 25;
    const int directBits = 1 << fsBits;
    const std::size_t head = bytePix == 1 ? 1 : bytePix == 2 ? 2 : 4; // the first pixel, uncoded
    auto truncated = [&] {
        return "its Rice data ends before the tile's " + std::to_string(pixels) +
               " pixels are decoded (truncated or corrupt tile)";
    };
    if (bytes < head + 1) return truncated();
    std::size_t pos = head;
    std::uint32_t b = data[pos++]; // the decoder's bit buffer and how many of its bits are unread
    int nbits = 8;
    // Tops the buffer up to at least `need` unread bits, as the decoder does: false past the end.
    auto fill = [&](int need) {
        for (nbits -= need; nbits < 0; nbits += 8) {
            if (pos >= bytes) return false;
            b = (b << 8) | data[pos++];
        }
        return true;
    };
    auto low = [](int n) { return (std::uint32_t{1} << n) - 1; }; // 0 <= n <= 7 wherever it is used
    for (long long i = 0; i < pixels;) {
        if (!fill(fsBits)) return truncated();
        const int fs = static_cast<int>(b >> nbits) - 1;
        b &= low(nbits);
        const long long end = std::min(i + blockSize, pixels);
        if (fs < 0) { // a block of equal pixels: no bits
            i = end;
        } else if (fs == fsMax) { // directly coded differences: whole bytes, then the low nbits
            for (; i < end; ++i) {
                const std::size_t whole = static_cast<std::size_t>((directBits - nbits) / 8);
                const std::size_t more = whole + (nbits > 0 ? 1 : 0);
                if (bytes - pos < more) return truncated();
                pos += more;
                b = nbits > 0 ? data[pos - 1] & low(nbits) : 0;
            }
        } else { // Rice codes: a unary run of zeros, a one, then fs bits
            for (; i < end; ++i) {
                while (b == 0) {
                    if (pos >= bytes) return truncated();
                    nbits += 8;
                    b = data[pos++];
                }
                nbits = std::bit_width(b) - 1; // the leading one's position; the zeros above it are read
                b ^= std::uint32_t{1} << nbits;
                if (!fill(fs)) return truncated();
                b &= low(nbits);
            }
        }
    }
    return {};
}

} // namespace gpuphot
