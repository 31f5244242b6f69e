// libFuzzer target: the decoders of tile-compressed images (RICE_1, GZIP_1, GZIP_2, PLIO_1, HCOMPRESS_1)
// behind readFrame. The fuzzer mutates the tiles' compressed bytes and a few image parameters; the
// harness wraps them in a well-formed FITS file (primary HDU, then a BINTABLE with ZIMAGE = T and one
// COMPRESSED_DATA column whose heap holds the tiles), so that every input reaches the decoders instead of
// the header checks the file-level target (fuzz_fits_reader) spends most inputs on.
//
// Input: 8 parameter bytes, then one 16-bit little-endian length per tile, then the tiles' bytes in
// order (a tile's length is cut to what is left). Parameters: [0] algorithm, [1] ZBITPIX (8, 16, 32,
// -32, -64), [2] [3] ZNAXIS1/2 (1..48), [4] [5] ZTILE1/2 (at most 8 x 8 tiles), [6] HCOMPRESS smoothing
// and scale, [7] RICE block size. tests/fuzz/make_corpus.py makes the seeds from real compressed images.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/io/fits_image.hpp"
#include "tests/fuzz/fuzz_common.hpp"

namespace {

const char* const kAlgorithms[] = {"RICE_1", "GZIP_1", "GZIP_2", "PLIO_1", "HCOMPRESS_1"};
const int kBitpix[] = {8, 16, 32, -32, -64};

struct Params {
    std::string algorithm;
    int bitpix = 16;
    long n1 = 1, n2 = 1, t1 = 1, t2 = 1;
    int smooth = 0, scale = 0, blockSize = 32;
    long tiles() const { return ((n1 + t1 - 1) / t1) * ((n2 + t2 - 1) / t2); }
};

Params readParams(const std::uint8_t* p) {
    Params r;
    r.algorithm = kAlgorithms[p[0] % 5];
    r.bitpix = kBitpix[p[1] % 5];
    r.n1 = 1 + p[2] % 48;
    r.n2 = 1 + p[3] % 48;
    r.t1 = 1 + p[4] % r.n1;
    r.t2 = 1 + p[5] % r.n2;
    // At most 8 x 8 tiles: widen the tiles until they fit.
    r.t1 = std::max(r.t1, (r.n1 + 7) / 8);
    r.t2 = std::max(r.t2, (r.n2 + 7) / 8);
    r.smooth = p[6] & 1;
    r.scale = (p[6] >> 1) % 4;
    r.blockSize = (p[7] & 1) ? 16 : 32;
    return r;
}

// 80-character cards, padded to 2880-byte blocks.
struct Header {
    std::string text;
    void card(const std::string& key, const std::string& value) {
        char c[81];
        std::snprintf(c, sizeof c, "%-8.8s= %20s", key.c_str(), value.c_str());
        std::string s(c);
        s.resize(80, ' ');
        text += s;
    }
    void str(const std::string& key, const std::string& value) { card(key, "'" + value + "'"); }
    std::string end() {
        std::string s = text + std::string("END").append(77, ' ');
        s.resize((s.size() + 2879) / 2880 * 2880, ' ');
        return s;
    }
};

void putBigEndian32(std::string& out, std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
        out.push_back(static_cast<char>((v >> shift) & 0xff));
}

std::string buildFile(const Params& p, const std::vector<std::string>& tiles) {
    Header primary;
    primary.card("SIMPLE", "T");
    primary.card("BITPIX", "8");
    primary.card("NAXIS", "0");
    primary.card("EXTEND", "T");
    std::size_t heap = 0, longest = 0;
    for (const auto& t : tiles) {
        heap += t.size();
        longest = std::max(longest, t.size());
    }
    Header h;
    h.str("XTENSION", "BINTABLE");
    h.card("BITPIX", "8");
    h.card("NAXIS", "2");
    h.card("NAXIS1", "8");
    h.card("NAXIS2", std::to_string(tiles.size()));
    h.card("PCOUNT", std::to_string(heap));
    h.card("GCOUNT", "1");
    h.card("TFIELDS", "1");
    h.str("TTYPE1", "COMPRESSED_DATA");
    h.str("TFORM1", (p.algorithm == "PLIO_1" ? "1PI(" : "1PB(") + std::to_string(longest) + ")");
    h.card("ZIMAGE", "T");
    h.card("ZBITPIX", std::to_string(p.bitpix));
    h.card("ZNAXIS", "2");
    h.card("ZNAXIS1", std::to_string(p.n1));
    h.card("ZNAXIS2", std::to_string(p.n2));
    h.card("ZTILE1", std::to_string(p.t1));
    h.card("ZTILE2", std::to_string(p.t2));
    h.str("ZCMPTYPE", p.algorithm);
    if (p.algorithm == "RICE_1") {
        h.str("ZNAME1", "BLOCKSIZE");
        h.card("ZVAL1", std::to_string(p.blockSize));
        h.str("ZNAME2", "BYTEPIX");
        h.card("ZVAL2", std::to_string(p.bitpix == 8 ? 1 : p.bitpix == 16 ? 2 : 4));
    } else if (p.algorithm == "HCOMPRESS_1") {
        h.str("ZNAME1", "SCALE");
        h.card("ZVAL1", std::to_string(p.scale));
        h.str("ZNAME2", "SMOOTH");
        h.card("ZVAL2", std::to_string(p.smooth));
    }
    // Floating-point pixels: quantized with one scale for every tile, except GZIP, which may also keep
    // them as they are.
    if (p.bitpix < 0 && p.algorithm.rfind("GZIP", 0) != 0) {
        h.card("ZSCALE", "0.01");
        h.card("ZZERO", "100.0");
        h.str("ZQUANTIZ", "NO_DITHER");
    }
    std::string file = primary.end() + h.end();
    const std::size_t dataStart = file.size();
    std::size_t offset = 0;
    for (const auto& t : tiles) {
        // PLIO's column counts 16-bit elements, the others bytes.
        const std::size_t count = p.algorithm == "PLIO_1" ? t.size() / 2 : t.size();
        putBigEndian32(file, static_cast<std::uint32_t>(count));
        putBigEndian32(file, static_cast<std::uint32_t>(offset));
        offset += t.size();
    }
    for (const auto& t : tiles)
        file += t;
    const std::size_t data = file.size() - dataStart;
    file.resize(dataStart + (data + 2879) / 2880 * 2880, '\0');
    return file;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace gpuphot;
    if (size < 8) return 0;
    const Params p = readParams(data);
    std::size_t at = 8;
    const long n = p.tiles();
    std::vector<std::size_t> lengths(static_cast<std::size_t>(n), 0);
    for (auto& len : lengths) {
        if (at + 2 > size) break;
        len = static_cast<std::size_t>(data[at]) | (static_cast<std::size_t>(data[at + 1]) << 8);
        at += 2;
    }
    std::vector<std::string> tiles;
    for (std::size_t len : lengths) {
        len = std::min(len, size - at);
        if (p.algorithm == "PLIO_1") len &= ~std::size_t(1);
        tiles.emplace_back(reinterpret_cast<const char*>(data + at), len);
        at += len;
    }
    const std::string file = buildFile(p, tiles);
    const std::string path =
        fuzz::writeScratch(reinterpret_cast<const std::uint8_t*>(file.data()), file.size(), ".fits.fz");
    fuzz::readFrameAndTouch(path);
    return 0;
}
