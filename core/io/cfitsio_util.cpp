#include "core/io/cfitsio_util.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
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

// Keywords CFITSIO 4.2.0 (or this project's readers) converts to integers when a file is opened or read:
// BLANK, THEAP, EXTVER, EXTLEVEL, TNULLn, TBCOLn and the tile-compression keywords. The conversions (ffc2j,
// ffc2ii, ffc2jj, ffc2ujj) write a value they cannot read into an 81-byte message after a 52-67 character
// prefix (heasarc/cfitsio #132): a value of more than 28 characters overflows it, and Debian's fortified
// build aborts the process.
bool isReadAsInteger(const std::string& key) {
    static const char* const exact[] = {"BLANK",  "THEAP",  "EXTVER",   "EXTLEVEL", "ZBITPIX",
                                        "ZNAXIS", "ZBLANK", "ZDITHER0", "ZPCOUNT",  "ZGCOUNT"};
    for (const char* k : exact)
        if (key == k) return true;
    for (const char* prefix : {"TNULL", "TBCOL", "ZNAXIS", "ZTILE", "ZVAL"}) {
        const std::size_t n = std::strlen(prefix);
        if (key.size() > n && key.rfind(prefix, 0) == 0 &&
            key.find_first_not_of("0123456789", n) == std::string::npos)
            return true;
    }
    return false;
}

// What CFITSIO converts of a card's value, as its ffpsvc splits a card: the text inside the quotes of a
// string; a complex value "(...)" up to its closing parenthesis, which may lie in the comment; else
// everything up to the comment's slash, trailing blanks removed ("ZVAL2 = ( x x 4 / bytes (1, 2, 4, or
// 8)" reached ffc2j as a 50-character complex value and overflowed its message; found by the deep fuzz
// run).
std::string valueToken(const std::string& value) {
    if (!value.empty() && value[0] == '\'') {
        const std::size_t close = value.find('\'', 1);
        return value.substr(1, close == std::string::npos ? std::string::npos : close - 1);
    }
    const std::size_t close = value.find(')');
    std::string token = !value.empty() && value[0] == '('
                            ? value.substr(0, close == std::string::npos ? std::string::npos : close + 1)
                            : value.substr(0, value.find('/'));
    while (!token.empty() && token.back() == ' ')
        token.pop_back();
    return token;
}

// An optional sign and one or more digits, nothing else.
bool isPlainInteger(const std::string& word) {
    const std::size_t start = !word.empty() && (word[0] == '+' || word[0] == '-') ? 1 : 0;
    return word.size() > start && word.find_first_not_of("0123456789", start) == std::string::npos;
}

} // namespace

namespace {

// The header walk of checkHeadersCfitsioCanParse over `size` bytes that read(pos, out, n) copies out
// (false: unreadable, which ends the walk). Returns the bytes the walked HDUs claim: each header's blocks
// (a header cut short claims its whole block) and its data as the header sizes it; kClaimsTooMuch when a
// header sizes its data beyond 2^50 bytes. CFITSIO's memory driver copies past its buffer when a file
// claims more than it holds (found by the deep fuzz run), so openFitsForReading compares the claim with
// the inflated size of a gzip file.
constexpr long long kClaimsTooMuch = std::numeric_limits<long long>::max();

template <class Read> long long checkHeaderBlocks(const std::string& path, long long size, Read&& read) {
    constexpr long long kBlock = 2880;
    char block[kBlock];
    long long pos = 0, claimed = 0;
    // A last header block cut short is scanned too (padded with blanks): CFITSIO reads such a header, and
    // a fuzz input whose ZTILE2 = 0 sat in a truncated block divided by zero (found by the CI fuzz run).
    for (int hdu = 0; hdu < 100000 && pos < size; ++hdu) {
        long long bitpix = 0, naxis = 0, pcount = 0, gcount = 1, product = 1;
        bool end = false, zimage = false;
        std::string
            badTile; // "ZTILEn = v" / "ZNAXISn = v" not a positive integer, checked for ZIMAGE headers
        std::map<std::string, std::string> znames, zvals; // ZNAMEn (unquoted, upper case) and ZVALn, by n
        bool firstBlock = true, isHdu = false; // isHdu: starts as a primary header or an extension does
        bool eof = false; // the file ends inside this header: its cards are still checked
        while (!end && !eof) {
            const long long avail = std::min(kBlock, size - pos);
            std::memset(block, ' ', sizeof block);
            if (pos >= size || !read(pos, block, avail)) {
                eof = true;
                break;
            }
            if (pos == 0 && std::memcmp(block, "SIMPLE  =", 9) != 0) return claimed; // not plain FITS
            if (firstBlock) isHdu = pos == 0 || std::memcmp(block, "XTENSION=", 9) == 0;
            firstBlock = false;
            pos += kBlock;
            if (isHdu) claimed = std::max(claimed, avail < kBlock ? pos : pos - kBlock + avail);
            for (int c = 0; c < 36 && !end; ++c) {
                const std::string card(block + 80 * c, 80);
                // The name ends at the first blank or '=', as CFITSIO's ffgknm reads it ("END  =" ends a
                // header), and CFITSIO finds a keyword whatever the case of the card's name ("zTILE2").
                std::string key = card.substr(0, std::min<std::size_t>(8, card.find_first_of(" =")));
                if (key == "END") {
                    end = true;
                    break;
                }
                for (char& ch : key)
                    ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
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
                if (key.size() > 5 && key.rfind("ZNAME", 0) == 0) {
                    std::string name = value.substr(0, value.find('/'));
                    name.erase(std::remove_if(name.begin(), name.end(),
                                              [](char ch) { return ch == '\'' || ch == ' '; }),
                               name.end());
                    for (char& ch : name)
                        ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
                    znames[key.substr(5)] = name;
                }
                if (key.size() > 4 && key.rfind("ZVAL", 0) == 0) zvals[key.substr(4)] = word;
                if ((tileKey || axisKey) && badTile.empty() &&
                    (!isPlainInteger(word) || std::strtoll(word.c_str(), nullptr, 10) < 1))
                    badTile = key + " = " + word.substr(0, 20);
                // An integer has at most 20 characters; a longer value would overflow CFITSIO's message
                // buffer when it fails to convert it (found by reading the CFITSIO issue tracker; the
                // regression files are fits_reader/*_ffc2_overflow.fits).
                if (isReadAsInteger(key) && valueToken(value).size() > 20)
                    throw InvalidInput(path + ": HDU " + std::to_string(hdu) + ": header keyword " + key +
                                       " = " + value.substr(0, 20) + "... is not a number (" +
                                       std::to_string(valueToken(value).size()) +
                                       " characters; CFITSIO cannot convert such a value safely)");
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
                    if (v < 0) return claimed;
                    if (v > 0 && product > (1LL << 50) / v) return kClaimsTooMuch;
                    product *= v;
                }
            }
        }
        // CFITSIO 4.2.0 divides by the Rice block size (ZNAMEn = 'BLOCKSIZE', ZVALn) in
        // imcomp_calc_max_elem: ZVAL1 = 0 killed the process with SIGFPE (found by the deep fuzz run).
        for (const auto& [n, name] : znames) {
            const auto it = zvals.find(n);
            const std::string val = it == zvals.end() ? std::string() : it->second;
            if (name == "BLOCKSIZE" && badTile.empty() &&
                (!isPlainInteger(val) || std::strtoll(val.c_str(), nullptr, 10) < 1))
                badTile = "ZVAL" + n + " = " + val.substr(0, 20) + " (the Rice block size)";
        }
        if (zimage && !badTile.empty())
            throw InvalidInput(path + ": HDU " + std::to_string(hdu) +
                               ": malformed tile-compressed image: " + badTile +
                               " (tile sizes, image axes and the Rice block size must be positive integers)");
        if (eof) return claimed;
        if (naxis == 0) product = 0;
        const long long bytes = std::llabs(bitpix) / 8;
        if (naxis < 0 || pcount < 0 || gcount < 0 || bytes > 8) return claimed;
        if (product + pcount > (1LL << 50) || (gcount > 0 && pcount + product > (1LL << 50) / gcount))
            return kClaimsTooMuch;
        const long long data = bytes * gcount * (pcount + product);
        claimed = std::max(claimed, pos + data);
        pos += (data + kBlock - 1) / kBlock * kBlock;
    }
    return claimed;
}

bool isGzip(const unsigned char* head, std::size_t n) {
    return compressionOf(head, n) == "gzip";
}

// The whole gzip file at `path` inflated (every member, as gzip -d does; bytes after the last member are
// ignored); IoError for a truncated stream (a file still being written), InvalidInput for a corrupt one. The
// buffer grows with what the stream yields, never from the trailer's size field.
std::vector<unsigned char> inflateGzipFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(path + ": cannot open for reading: " + std::strerror(errno));
    std::vector<unsigned char> packed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw IoError(path + ": cannot read: " + std::strerror(errno));
    std::vector<unsigned char> out(std::max<std::size_t>(packed.size() * 4, 1 << 20));
    z_stream z{};
    if (inflateInit2(&z, 15 + 16) != Z_OK) throw InvalidInput(path + ": zlib could not start inflating");
    z.next_in = packed.data();
    std::size_t used = 0;
    int rc = Z_OK;
    for (;;) {
        if (used == out.size()) out.resize(out.size() * 2);
        z.avail_in =
            static_cast<uInt>(std::min<std::size_t>(packed.size() - (z.next_in - packed.data()), 1u << 30));
        z.next_out = out.data() + used;
        z.avail_out = static_cast<uInt>(std::min<std::size_t>(out.size() - used, 1u << 30));
        const uInt before = z.avail_out;
        rc = inflate(&z, Z_NO_FLUSH);
        used += before - z.avail_out;
        if (rc == Z_STREAM_END) {
            const std::size_t left = packed.size() - static_cast<std::size_t>(z.next_in - packed.data());
            if (!isGzip(z.next_in, left)) break; // the last member
            inflateReset(&z);
        } else if (rc != Z_OK && !(rc == Z_BUF_ERROR && z.avail_out == 0)) {
            break;
        }
    }
    const std::string zlibText = z.msg ? z.msg : "zlib error";
    inflateEnd(&z);
    if (rc == Z_BUF_ERROR) throw IoError(path + ": truncated file: the gzip stream ends early");
    if (rc != Z_STREAM_END) throw InvalidInput(path + ": corrupt gzip data (" + zlibText + ")");
    out.resize(used);
    return out;
}

} // namespace

void checkHeadersCfitsioCanParse(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return;
    in.seekg(0, std::ios::end);
    const long long size = static_cast<long long>(in.tellg());
    checkHeaderBlocks(path, size, [&](long long pos, char* block, long long n) {
        in.seekg(pos);
        return static_cast<bool>(in.read(block, n));
    });
}

void checkHeaderBytesCfitsioCanParse(const std::string& path, const unsigned char* data, std::size_t size) {
    const long long claimed =
        checkHeaderBlocks(path, static_cast<long long>(size), [&](long long pos, char* block, long long n) {
            std::memcpy(block, data + pos, static_cast<std::size_t>(n));
            return true;
        });
    if (claimed > static_cast<long long>(size))
        throw IoError(path + ": truncated file: its headers size it at " +
                      (claimed == kClaimsTooMuch ? std::string("more than 2^50") : std::to_string(claimed)) +
                      " bytes, the inflated gzip stream holds " + std::to_string(size));
}

std::string compressionOf(const unsigned char* head, std::size_t n) {
    if (n < 2) return "";
    if (head[0] == 0x1f && head[1] == 0x8b) return "gzip";
    // CFITSIO recognises these by their first two bytes and decodes them itself, its decoders sizing their
    // buffers from the file's own size fields (a zip header asking for 4 GB; found by fuzz_gzip_fits).
    if (head[0] == 'P' && head[1] == 'K') return "zip";
    if (head[0] == 0x1f && head[1] == 0x9d) return "Unix compress (.Z)";
    if (head[0] == 0x1f && head[1] == 0x1e) return "pack";
    if (head[0] == 0x1f && head[1] == 0xa0) return "LZH";
    if (n >= 3 && head[0] == 'B' && head[1] == 'Z' && head[2] == 'h') return "bzip2";
    return "";
}

std::vector<unsigned char> fileHead(const std::string& path, std::size_t n) {
    std::vector<unsigned char> head(n);
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(head.data()), static_cast<std::streamsize>(n));
    head.resize(in ? n : static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
    return head;
}

int openFitsForReading(const std::string& path, FitsHandle& h) {
    return openFitsForReading(path, h, fileHead(path, 4));
}

int openFitsForReading(const std::string& path, FitsHandle& h, const std::vector<unsigned char>& head) {
    const std::string kind = compressionOf(head.data(), head.size());
    if (!kind.empty() && kind != "gzip")
        throw InvalidInput(
            path + ": a " + kind +
            "-compressed file; gpuphot reads FITS files plain, gzip-compressed or tile-compressed "
            "(decompress it first)");
    int status = 0;
    if (kind != "gzip") {
        checkHeadersCfitsioCanParse(path);
        fits_open_diskfile(&h.f, path.c_str(), READONLY, &status);
    } else {
        h.memory = inflateGzipFile(path);
        checkHeaderBytesCfitsioCanParse(path, h.memory.data(), h.memory.size());
        h.memoryAddress = h.memory.data();
        h.memorySize = h.memory.size();
        fits_open_memfile(&h.f, "inflated.fits", READONLY, &h.memoryAddress, &h.memorySize, 0, nullptr,
                          &status);
    }
    if (status) h.f = nullptr;
    return status;
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

namespace {

// The bit reader of CFITSIO's H-decompressor (fits_hdecompress.c: input_bit, input_nbits, input_nybble,
// input_nnybble) over `bytes` bytes: a read at the end yields a zero byte and sets `overrun` (CFITSIO
// would have read beyond its buffer), so that a caller need check only once per bit plane.
struct HcompressBits {
    const unsigned char* data;
    std::size_t bytes, pos;
    std::uint32_t buffer = 0; // bytes read ahead; the low `ahead` bits are not used yet
    int ahead = 0;
    bool overrun = false;

    std::uint32_t nextByte() {
        if (pos >= bytes) {
            overrun = true;
            return 0;
        }
        return data[pos++];
    }
    // The next n bits (1 <= n <= 8): a byte is read only when fewer than n bits are left, so fewer than 8
    // are left after any read (CFITSIO's input_nnybble special-cases 8, which therefore never happens).
    int bits(int n) {
        if (ahead < n) {
            buffer = (buffer << 8) | nextByte();
            ahead += 8;
        }
        ahead -= n;
        return static_cast<int>((buffer >> ahead) & ((1u << n) - 1));
    }
    // n nybbles: a byte for each pair, then a lone nybble by bits(4).
    void nybbles(std::size_t n, unsigned char* out) {
        for (std::size_t i = 0; i + 1 < n; i += 2) {
            buffer = (buffer << 8) | nextByte();
            out[i] = static_cast<unsigned char>((buffer >> (ahead + 4)) & 15);
            out[i + 1] = static_cast<unsigned char>((buffer >> ahead) & 15);
        }
        if (n % 2) out[n - 1] = static_cast<unsigned char>(bits(4));
    }
    // One 4-bit quadtree code in HCOMPRESS's fixed Huffman code of 3 to 6 bits (input_huffman).
    int huffman() {
        static constexpr int kFourBits[] = {3, 5, 10, 12, 15}; // codes 1000 to 1100
        static constexpr int kFiveBits[] = {6, 7, 9, 11, 13};  // codes 11010 to 11110
        int c = bits(3);
        if (c < 4) return 1 << c;
        c = (c << 1) | bits(1);
        if (c < 13) return kFourBits[c - 8];
        c = (c << 1) | bits(1);
        if (c < 31) return kFiveBits[c - 26];
        return bits(1) ? 14 : 0; // 111111, 111110
    }
};

// What the walk knows of the tile's coefficients: which are non-zero (one sign bit each follows the bit
// planes). A bit each, so the walk needs 1/32 of the memory CFITSIO allocates for the tile next.
struct HcompressCoefficients {
    std::vector<bool> nonzero;
    std::size_t count = 0;
    void mark(std::size_t at) {
        if (nonzero[at]) return;
        nonzero[at] = true;
        ++count;
    }
};

// One quadtree-coded bit plane (qtree_decode's loop, qtree_expand, qtree_copy): a code for the whole
// quadrant, then log2n - 1 expansions, each turning every 4-bit code into a 2 x 2 block of bits (highest
// bit top left, rows of ny) and reading a new code for every bit that is set. Leaves the last level's
// codes, (nqx + 1) / 2 rows of (nqy + 1) / 2, in `codes`.
void hcompressQuadtree(HcompressBits& in, std::vector<unsigned char>& codes, int nqx, int nqy, int log2n) {
    codes[0] = static_cast<unsigned char>(in.huffman());
    int nx = 1, ny = 1, restX = nqx, restY = nqy;
    for (int k = 1, c = 1 << log2n; k < log2n; ++k) {
        c >>= 1;
        nx <<= 1;
        ny <<= 1;
        if (restX <= c)
            --nx;
        else
            restX -= c;
        if (restY <= c)
            --ny;
        else
            restY -= c;
        // In place from the end, as CFITSIO does: a code's index is at most that of its bits.
        const int ny2 = (ny + 1) / 2;
        for (int i = nx - 1; i >= 0; --i)
            for (int j = ny - 1; j >= 0; --j) {
                const unsigned code = codes[static_cast<std::size_t>(i / 2) * ny2 + j / 2];
                codes[static_cast<std::size_t>(i) * ny + j] = (code >> (3 - 2 * (i % 2) - j % 2)) & 1;
            }
        for (std::size_t i = static_cast<std::size_t>(nx) * ny; i-- > 0;)
            if (codes[i]) codes[i] = static_cast<unsigned char>(in.huffman());
    }
}

// Marks the coefficients that have this plane's bit set (qtree_bitins): each 4-bit code covers a 2 x 2
// block of the quadrant, highest bit top left, cut at the quadrant's edges.
void hcompressMarkPlane(const std::vector<unsigned char>& codes, int nqx, int nqy, std::size_t first,
                        std::size_t rowLength, HcompressCoefficients& coefficients) {
    const int nqy2 = (nqy + 1) / 2;
    for (int bi = 0; bi < (nqx + 1) / 2; ++bi)
        for (int bj = 0; bj < nqy2; ++bj) {
            const unsigned code = codes[static_cast<std::size_t>(bi) * nqy2 + bj];
            for (int d = 0; d < 4 && code != 0; ++d) {
                const int i = 2 * bi + d / 2, j = 2 * bj + d % 2;
                if (i < nqx && j < nqy && ((code >> (3 - d)) & 1))
                    coefficients.mark(first + static_cast<std::size_t>(i) * rowLength + j);
            }
        }
}

// The bit planes of one quadrant, nqx rows of nqy coefficients from coefficient `first` of the tile
// (rows of `rowLength`), as qtree_decode reads them: why CFITSIO must not, or empty.
std::string hcompressQuadrant(HcompressBits& in, HcompressCoefficients& coefficients, std::size_t first,
                              std::size_t rowLength, int nqx, int nqy, int planes,
                              const std::string& truncated) {
    std::vector<unsigned char> codes(static_cast<std::size_t>((nqx + 1) / 2) * ((nqy + 1) / 2));
    const int nqmax = std::max(nqx, nqy);
    int log2n = 0; // log2(nqmax) rounded up, as CFITSIO computes it wherever nqmax >= 1
    while ((1LL << log2n) < nqmax)
        ++log2n;
    for (int bit = planes - 1; bit >= 0; --bit) {
        const int format = in.bits(4);
        if (format == 0) { // the plane written directly, a nybble for each 2 x 2 block
            in.nybbles(codes.size(), codes.data());
        } else if (format != 0xf) {
            return "its HCOMPRESS bit plane has the unknown format code " + std::to_string(format) +
                   " (corrupt tile)";
        } else if (nqmax == 0) { // CFITSIO would store the first code into its empty scratch array
            return "its HCOMPRESS data quadtree-codes a bit plane of an empty quadrant (corrupt tile)";
        } else {
            hcompressQuadtree(in, codes, nqx, nqy, log2n);
        }
        if (in.overrun) return truncated;
        hcompressMarkPlane(codes, nqx, nqy, first, rowLength, coefficients);
    }
    return {};
}

std::int32_t bigEndian32(const unsigned char* p) {
    return static_cast<std::int32_t>(std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 |
                                     std::uint32_t{p[2]} << 8 | p[3]);
}

// The fixed part of an HCOMPRESS stream (decode in fits_hdecompress.c): why CFITSIO must not decode it,
// or empty. CFITSIO passes its tile sizes to the decoder swapped, so the stream's first size is the rows.
std::string hcompressHeaderProblem(const unsigned char* data, long long tileNx, long long tileNy,
                                   int zbitpix) {
    if (data[0] != 0xDD || data[1] != 0x99)
        return "its HCOMPRESS data does not start with the magic bytes 0xDD 0x99 (corrupt tile)";
    const long long rows = bigEndian32(data + 2), columns = bigEndian32(data + 6);
    if (rows != tileNy || columns != tileNx)
        return "its HCOMPRESS data is for a " + std::to_string(columns) + " x " + std::to_string(rows) +
               " tile, the tile is " + std::to_string(tileNx) + " x " + std::to_string(tileNy) + " pixels";
    if (tileNx * tileNy > INT_MAX)
        return "its " + std::to_string(tileNx * tileNy) +
               " pixels are more than CFITSIO's HCOMPRESS decoder can count";
    if (const std::int32_t scale = bigEndian32(data + 10); scale < 0)
        return "its HCOMPRESS scale " + std::to_string(scale) + " is negative (corrupt tile)";
    const int maxPlanes = zbitpix == BYTE_IMG || zbitpix == SHORT_IMG ? 32 : 64; // the decoder's int size
    for (int q = 0; q < 3; ++q)
        if (data[22 + q] > maxPlanes)
            return "its HCOMPRESS data has " + std::to_string(data[22 + q]) + " bit planes, more than the " +
                   std::to_string(maxPlanes) + " of CFITSIO's decoder for ZBITPIX " + std::to_string(zbitpix);
    return {};
}

} // namespace

std::string hcompressTileProblem(const unsigned char* data, std::size_t bytes, long long tileNx,
                                 long long tileNy, int zbitpix) {
    const std::string truncated = "its HCOMPRESS data ends before the tile's " +
                                  std::to_string(tileNx * tileNy) +
                                  " pixels are decoded (truncated or corrupt tile)";
    constexpr std::size_t kHeader = 2 + 3 * 4 + 8 + 3; // magic, rows, columns, scale, sum, bit planes
    if (bytes < kHeader) return truncated;
    if (std::string why = hcompressHeaderProblem(data, tileNx, tileNy, zbitpix); !why.empty()) return why;
    // dodecode: four quadrants of (up to) half the rows and half the columns each, the two off-diagonal
    // ones sharing a bit plane count; then an end code, then a sign bit for each non-zero coefficient.
    const int nx = static_cast<int>(tileNy), ny = static_cast<int>(tileNx);
    const int nx2 = (nx + 1) / 2, ny2 = (ny + 1) / 2;
    const unsigned char* planes = data + 22;
    const std::size_t row = static_cast<std::size_t>(ny), half = row * nx2;
    struct Quadrant {
        std::size_t first;
        int nqx, nqy, planes;
    };
    const Quadrant quadrants[4] = {{0, nx2, ny2, planes[0]},
                                   {static_cast<std::size_t>(ny2), nx2, ny / 2, planes[1]},
                                   {half, nx / 2, ny2, planes[1]},
                                   {half + ny2, nx / 2, ny / 2, planes[2]}};
    HcompressBits in{data, bytes, kHeader};
    HcompressCoefficients coefficients{std::vector<bool>(row * nx, false)};
    for (const Quadrant& q : quadrants)
        if (std::string why =
                hcompressQuadrant(in, coefficients, q.first, row, q.nqx, q.nqy, q.planes, truncated);
            !why.empty())
            return why;
    const int end = in.bits(4);
    if (in.overrun) return truncated;
    if (end != 0) return "its HCOMPRESS bit planes lack their end code (corrupt tile)";
    // The sign bits start at the next whole byte.
    if ((coefficients.count + 7) / 8 > bytes - in.pos) return truncated;
    return {};
}

std::string plioTileProblem(const short* words, std::size_t count, long long pixels) {
    if (pixels <= 0) return {};
    if (pixels > INT_MAX)
        return "its " + std::to_string(pixels) + " pixels are more than CFITSIO's PLIO decoder can count";
    const long long n = static_cast<long long>(count);
    auto outside = [&](long long word) {
        return "its PLIO line list refers to word " + std::to_string(word) + ", outside the tile's " +
               std::to_string(n) + " words (truncated or corrupt tile)";
    };
    // pl_l2pi's header (words numbered from 1): a positive word 3 is the list's length and instructions
    // start at word 4 (the old format); else words 4 and 5 hold the length and word 2 + 1 is the first.
    if (n < 3) return outside(3);
    long long length = words[2], first = 4;
    if (length <= 0) {
        if (n < 5) return outside(5);
        length = words[4] * 32768LL + words[3];
        first = words[1] + 1LL;
    }
    if (length <= 0)
        return "its PLIO line list length " + std::to_string(length) +
               " is not positive (CFITSIO would leave the tile's pixels unset)";
    long long x = 1; // the next pixel, from 1, as pl_l2pi's x1: it stops once the tile is complete
    for (long long ip = first; ip <= length && x <= pixels; ++ip) {
        if (ip < 1 || ip > n) return outside(ip);
        const int word = words[ip - 1];
        const int opcode = word / 4096, data = word & 4095; // C division: words -4095..-1 are opcode 0
        if (opcode == 0 || opcode == 4 || opcode == 5) {    // a run of zeros or of the current value
            x += data;
        } else if (opcode == 6 || opcode == 7) { // one pixel of the value stepped up or down
            ++x;
        } else if (opcode == 1) { // a new value whose high bits are the next word, which is then skipped
            if (ip + 1 > n) return outside(ip + 1);
            ++ip;
        }
    }
    return {};
}

} // namespace gpuphot
