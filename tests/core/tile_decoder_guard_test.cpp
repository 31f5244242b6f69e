// The HCOMPRESS_1 and PLIO_1 tile checks (core/io/cfitsio_util.hpp) that stand between a crafted file and
// CFITSIO 4.2.0's decoders, which trust the tile's own header (heasarc/cfitsio #131). Truth: CFITSIO's own
// encoders (what every HCOMPRESS or PLIO file in the wild was written by) must pass the checks, and every
// input the checks let through must decode inside its bytes. The decoders run on buffers that end (or
// start) at a page the process may not touch, so that a read or write outside them is a crash in any build,
// not only under AddressSanitizer.
#include <gtest/gtest.h>

#include <fitsio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/io/cfitsio_util.hpp"
#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

// CFITSIO's H-compress and PLIO codecs (exported by libcfitsio; CFITSIO passes a tile's NAXIS1 extent as
// the encoder's second argument).
extern "C" {
int fits_hcompress(int* a, int ny, int nx, int scale, char* output, long* nbytes, int* status);
int fits_hcompress64(long long* a, int ny, int nx, int scale, char* output, long* nbytes, int* status);
int fits_hdecompress(unsigned char* input, int smooth, int* a, int* ny, int* nx, int* scale, int* status);
int fits_hdecompress64(unsigned char* input, int smooth, long long* a, int* ny, int* nx, int* scale,
                       int* status);
int pl_p2li(int* pxsrc, int xs, short* lldst, int npix);
int pl_l2pi(short* ll_src, int xs, int* px_dst, int npix);
}

using namespace gpuphot;
namespace fs = std::filesystem;

namespace {

// `bytes` of memory placed against an inaccessible page: after it (atEnd) or before it.
class Guarded {
public:
    Guarded(std::size_t bytes, bool atEnd) : bytes_(bytes) {
        page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        const std::size_t inner = (bytes + page_ - 1) / page_ * page_ + page_;
        total_ = inner + 2 * page_;
        base_ = static_cast<unsigned char*>(
            mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        mprotect(base_, page_, PROT_NONE);
        mprotect(base_ + page_ + inner, page_, PROT_NONE);
        data_ = atEnd ? base_ + page_ + inner - bytes : base_ + page_;
    }
    ~Guarded() { munmap(base_, total_); }
    Guarded(const Guarded&) = delete;
    Guarded& operator=(const Guarded&) = delete;
    template <class T> T* as() { return reinterpret_cast<T*>(data_); }

private:
    std::size_t bytes_, page_ = 0, total_ = 0;
    unsigned char* base_ = nullptr;
    unsigned char* data_ = nullptr;
};

// A tile of nx (along NAXIS1) x ny pixels: noise, a smooth ramp, a flat field or a star on a sky.
std::vector<long long> tilePixels(int nx, int ny, int kind, long long range, std::mt19937& rng) {
    std::vector<long long> px(static_cast<std::size_t>(nx) * ny);
    for (int y = 0; y < ny; ++y)
        for (int x = 0; x < nx; ++x) {
            long long v = 0;
            if (kind == 0) v = static_cast<long long>(rng() % static_cast<std::uint64_t>(range)) - range / 2;
            if (kind == 1) v = (x * 7 + y * 3) % range;
            if (kind == 2) v = range / 3;
            if (kind == 3)
                v = 100 + static_cast<long long>(rng() % 9) +
                    ((x - nx / 2) * (x - nx / 2) + (y - ny / 2) * (y - ny / 2) < 4 ? range / 2 : 0);
            px[static_cast<std::size_t>(y) * nx + x] = v;
        }
    return px;
}

// CFITSIO's encoder as its tile writer calls it: 32-bit for 8- and 16-bit images, else 64-bit.
std::vector<unsigned char> hcompressed(std::vector<long long> px, int nx, int ny, int scale, bool wide) {
    std::vector<char> out(px.size() * 16 + 1024);
    long nbytes = static_cast<long>(out.size());
    int status = 0;
    if (wide) {
        fits_hcompress64(px.data(), nx, ny, scale, out.data(), &nbytes, &status);
    } else {
        std::vector<int> a(px.begin(), px.end());
        fits_hcompress(a.data(), nx, ny, scale, out.data(), &nbytes, &status);
    }
    EXPECT_EQ(status, 0);
    out.resize(status ? 0 : static_cast<std::size_t>(nbytes));
    return {out.begin(), out.end()};
}

// CFITSIO's decoder on `stream` placed against a guard page (after or before it), decoding into a tile
// buffer of exactly nx x ny pixels, also guarded. Returns CFITSIO's status; a stray access crashes.
int hdecompressedGuarded(const std::vector<unsigned char>& stream, int nx, int ny, bool wide, bool atEnd) {
    Guarded in(stream.size(), atEnd);
    if (!stream.empty()) std::memcpy(in.as<unsigned char>(), stream.data(), stream.size());
    const std::size_t pixels = static_cast<std::size_t>(nx) * ny;
    int status = 0, dnx = 0, dny = 0, scale = 0;
    if (wide) {
        Guarded out(pixels * sizeof(long long), true);
        fits_hdecompress64(in.as<unsigned char>(), 0, out.as<long long>(), &dnx, &dny, &scale, &status);
    } else {
        Guarded out(pixels * sizeof(int), true);
        fits_hdecompress(in.as<unsigned char>(), 0, out.as<int>(), &dnx, &dny, &scale, &status);
    }
    return status;
}

std::string hcompressProblem(const std::vector<unsigned char>& s, int nx, int ny, bool wide) {
    return hcompressTileProblem(s.data(), s.size(), nx, ny, wide ? LONG_IMG : SHORT_IMG);
}

struct TileShape {
    int nx, ny;
};
constexpr TileShape kShapes[] = {{1, 1},  {2, 3},  {5, 4},    {16, 16}, {17, 9},
                                 {64, 4}, {4, 33}, {100, 37}, {3, 128}};

} // namespace

TEST(TileDecoderGuard, HcompressCheckAcceptsEveryStreamCfitsioWritesAndNoPrefixOfOne) {
    std::mt19937 rng(20261204);
    int streams = 0;
    for (bool wide : {false, true})
        for (const TileShape& t : kShapes)
            for (int kind = 0; kind < 4; ++kind)
                for (int scale : {0, 3}) {
                    SCOPED_TRACE(std::to_string(t.nx) + " x " + std::to_string(t.ny) + ", kind " +
                                 std::to_string(kind) + ", scale " + std::to_string(scale) +
                                 (wide ? ", 64-bit" : ", 32-bit"));
                    const long long range = wide ? (1LL << 40) : 60000;
                    const auto s =
                        hcompressed(tilePixels(t.nx, t.ny, kind, range, rng), t.nx, t.ny, scale, wide);
                    ASSERT_FALSE(s.empty());
                    ++streams;
                    ASSERT_EQ(hcompressProblem(s, t.nx, t.ny, wide), "");
                    EXPECT_EQ(hdecompressedGuarded(s, t.nx, t.ny, wide, true), 0);
                    // The stream is only valid for its own tile size (the decoder takes it from the stream).
                    EXPECT_NE(hcompressProblem(s, t.nx + 1, t.ny, wide), "");
                    if (t.nx != t.ny) {
                        EXPECT_NE(hcompressProblem(s, t.ny, t.nx, wide), "");
                    }
                    const std::size_t step = s.size() > 400 ? s.size() / 97 : 1;
                    for (std::size_t keep = 0; keep < s.size(); keep += step) {
                        const std::vector<unsigned char> cut(s.begin(), s.begin() + keep);
                        EXPECT_NE(hcompressProblem(cut, t.nx, t.ny, wide), "")
                            << keep << " of " << s.size() << " bytes";
                    }
                }
    EXPECT_EQ(streams, 2 * 9 * 4 * 2);
}

TEST(TileDecoderGuard, WhateverTheHcompressCheckAcceptsDecodesInsideItsBuffers) {
    // Random damage to valid streams, cut or not: every stream the check lets through is decoded by
    // CFITSIO against guard pages with no stray access (a crash fails the test).
    std::mt19937 rng(131);
    int accepted = 0, refused = 0;
    for (bool wide : {false, true})
        for (const TileShape& t : {TileShape{16, 16}, TileShape{17, 9}, TileShape{4, 33}})
            for (int kind = 0; kind < 4; ++kind) {
                const auto s = hcompressed(tilePixels(t.nx, t.ny, kind, wide ? 1LL << 40 : 60000, rng), t.nx,
                                           t.ny, kind % 2 ? 2 : 0, wide);
                ASSERT_GT(s.size(), 25u);
                for (int trial = 0; trial < 150; ++trial) {
                    auto bad = s;
                    const int edits = 1 + static_cast<int>(rng() % 3);
                    for (int k = 0; k < edits; ++k) {
                        const std::size_t at = 25 + rng() % (bad.size() - 25); // past the sizes, mostly
                        bad[trial % 10 == 0 ? rng() % 25 : at] = static_cast<unsigned char>(rng());
                    }
                    if (rng() % 3 == 0) bad.resize(rng() % bad.size());
                    if (hcompressProblem(bad, t.nx, t.ny, wide).empty()) {
                        ++accepted;
                        (void)hdecompressedGuarded(bad, t.nx, t.ny, wide, true);
                    } else {
                        ++refused;
                    }
                }
            }
    EXPECT_GT(accepted, 100);
    EXPECT_GT(refused, 100);
}

TEST(TileDecoderGuard, HcompressHeaderFieldsTheDecoderTrustsAreChecked) {
    std::mt19937 rng(5);
    const auto s = hcompressed(tilePixels(16, 8, 1, 60000, rng), 16, 8, 0, false);
    auto with = [&](std::size_t at, unsigned char v) {
        auto b = s;
        b[at] = v;
        return hcompressProblem(b, 16, 8, false);
    };
    EXPECT_NE(with(0, 0xDE).find("magic"), std::string::npos);
    EXPECT_NE(with(5, 9).find("tile"), std::string::npos) << "rows";
    EXPECT_NE(with(9, 99).find("tile"), std::string::npos) << "columns";
    EXPECT_NE(with(10, 0x80).find("scale"), std::string::npos);
    EXPECT_NE(with(22, 33).find("bit planes"), std::string::npos) << "more planes than 32-bit ints hold";
    EXPECT_EQ(hcompressTileProblem(s.data(), s.size(), 16, 8, BYTE_IMG), "");
}

namespace {

std::vector<short> plioEncoded(const std::vector<int>& px) {
    std::vector<int> copy = px;
    std::vector<short> out(px.size() * 3 + 64);
    const int words = pl_p2li(copy.data(), 1, out.data(), static_cast<int>(px.size()));
    EXPECT_GT(words, 0);
    out.resize(static_cast<std::size_t>(std::max(words, 0)));
    return out;
}

// pl_l2pi on `list` against a guard page on the side `atEnd` says, into exactly `pixels` guarded ints.
std::vector<int> plioDecodedGuarded(const std::vector<short>& list, int pixels, bool atEnd) {
    Guarded in(list.size() * sizeof(short), atEnd);
    if (!list.empty()) std::memcpy(in.as<short>(), list.data(), list.size() * sizeof(short));
    Guarded out(static_cast<std::size_t>(pixels) * sizeof(int), true);
    std::memset(out.as<int>(), 0, static_cast<std::size_t>(pixels) * sizeof(int));
    pl_l2pi(in.as<short>(), 1, out.as<int>(), pixels);
    return {out.as<int>(), out.as<int>() + pixels};
}

std::vector<int> maskPixels(int n, int kind, std::mt19937& rng) {
    std::vector<int> px(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
        if (kind == 0) px[i] = static_cast<int>(rng() % 3 == 0 ? rng() % (1 << 24) : 0);
        if (kind == 1) px[i] = i / 7 % 2 ? 5 : 0;
        if (kind == 2) px[i] = static_cast<int>(rng() % 2);
        if (kind == 3) px[i] = i % 100 < 40 ? 0 : 1000 + i % 3;
    }
    return px;
}

} // namespace

TEST(TileDecoderGuard, PlioCheckAcceptsEveryListCfitsioWritesAndDecodesItExactly) {
    std::mt19937 rng(24);
    for (int n : {1, 7, 100, 4096, 10000})
        for (int kind = 0; kind < 4; ++kind) {
            SCOPED_TRACE(std::to_string(n) + " pixels, kind " + std::to_string(kind));
            const auto px = maskPixels(n, kind, rng);
            const auto list = plioEncoded(px);
            ASSERT_EQ(plioTileProblem(list.data(), list.size(), n), "");
            EXPECT_EQ(plioDecodedGuarded(list, n, true), px);
            EXPECT_EQ(plioDecodedGuarded(list, n, false), px);
            // Lists shorter than their header says are refused.
            for (std::size_t keep = 0; keep + 1 < list.size(); keep += 1 + list.size() / 50)
                EXPECT_NE(plioTileProblem(list.data(), keep, n), "") << keep << " of " << list.size();
        }
}

TEST(TileDecoderGuard, WhateverThePlioCheckAcceptsDecodesInsideItsBuffers) {
    std::mt19937 rng(77);
    int accepted = 0, refused = 0;
    for (int kind = 0; kind < 4; ++kind) {
        const int n = 300;
        const auto list = plioEncoded(maskPixels(n, kind, rng));
        for (int trial = 0; trial < 300; ++trial) {
            auto bad = list;
            for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
                bad[rng() % bad.size()] = static_cast<short>(trial % 4 == 0 ? rng() % 16 : rng());
            if (rng() % 3 == 0) bad.resize(1 + rng() % bad.size());
            if (plioTileProblem(bad.data(), bad.size(), n).empty()) {
                ++accepted;
                (void)plioDecodedGuarded(bad, n, true);
                (void)plioDecodedGuarded(bad, n, false);
            } else {
                ++refused;
            }
        }
    }
    EXPECT_GT(accepted, 100);
    EXPECT_GT(refused, 100);
}

namespace {

// A CFITSIO-written tile-compressed image read back by readFrame: the checks pass on real files, tiles cut
// by the image's edges included.
void roundTrip(const fs::path& path, int type, int bitpix, int w, int h, long tileW, long tileH, float scale,
               int smooth) {
    std::mt19937 rng(static_cast<unsigned>(w * 31 + h + type));
    std::vector<int> px(static_cast<std::size_t>(w) * h);
    const int top = bitpix == BYTE_IMG ? 255 : bitpix == SHORT_IMG ? 30000 : 1 << 23;
    for (int i = 0; i < w * h; ++i)
        px[i] = i % w < w / 3 ? 100 + static_cast<int>(rng() % 20) : static_cast<int>(rng() % top);
    int status = 0;
    fitsfile* f = nullptr;
    fits_create_file(&f, ("!" + path.string()).c_str(), &status);
    fits_set_compression_type(f, type, &status);
    long tile[2] = {tileW, tileH};
    fits_set_tile_dim(f, 2, tile, &status);
    if (type == HCOMPRESS_1) {
        fits_set_hcomp_scale(f, scale, &status);
        fits_set_hcomp_smooth(f, smooth, &status);
    }
    long axes[2] = {w, h};
    fits_create_img(f, bitpix, 2, axes, &status);
    std::vector<unsigned char> px8(px.begin(), px.end());
    std::vector<short> px16(px.begin(), px.end());
    const long n = static_cast<long>(px.size());
    if (bitpix == BYTE_IMG)
        fits_write_img(f, TBYTE, 1, n, px8.data(), &status);
    else if (bitpix == SHORT_IMG)
        fits_write_img(f, TSHORT, 1, n, px16.data(), &status);
    else
        fits_write_img(f, TINT, 1, n, px.data(), &status);
    fits_close_file(f, &status);
    ASSERT_EQ(status, 0) << path;
    const Frame fr = readFrame(path.string());
    ASSERT_EQ(fr.width(), w);
    ASSERT_EQ(fr.height(), h);
    if (scale == 0) {
        for (int i = 0; i < w * h; ++i)
            ASSERT_EQ(fr.pixels.data()[i], static_cast<float>(px[i])) << path << " pixel " << i;
    }
}

} // namespace

TEST(TileDecoderGuard, CfitsioWrittenHcompressAndPlioFilesReadWithTheirEdgeTiles) {
    test::TempDir dir("gpuphot_guard");
    int k = 0;
    for (int bitpix : {BYTE_IMG, SHORT_IMG, LONG_IMG}) {
        for (auto [w, h, tw, th] :
             {std::array<long, 4>{70, 45, 70, 16}, {70, 45, 32, 20}, {33, 100, 33, 100}, {128, 64, 64, 64}}) {
            SCOPED_TRACE("BITPIX " + std::to_string(bitpix) + ", " + std::to_string(w) + " x " +
                         std::to_string(h) + " in tiles of " + std::to_string(tw) + " x " +
                         std::to_string(th));
            roundTrip(dir / ("h" + std::to_string(k++) + ".fits"), HCOMPRESS_1, bitpix, int(w), int(h), tw,
                      th, 0, 0);
            roundTrip(dir / ("h" + std::to_string(k++) + ".fits"), HCOMPRESS_1, bitpix, int(w), int(h), tw,
                      th, 4, 1);
            roundTrip(dir / ("p" + std::to_string(k++) + ".fits"), PLIO_1, bitpix, int(w), int(h), tw * th, 1,
                      0, 0);
        }
    }
}

TEST(TileDecoderGuard, FuzzRegressionsForCfitsioHcompressAndPlioDecodersAreRefusedNamingTheTile) {
    const std::string dir = std::string(GPUPHOT_TEST_DATA) + "/../fuzz/regressions/fits_reader/";
    struct Case {
        const char* file;
        const char* says;
    } cases[] = {{"hcompress_nx_ny_beyond_tile.fits", "HCOMPRESS data is for a"},
                 {"hcompress_truncated_stream.fits", "HCOMPRESS data ends"},
                 {"plio_first_instruction_before_tile.fits", "PLIO line list refers to word"},
                 {"plio_first_instruction_beyond_tile.fits", "PLIO line list refers to word"}};
    for (const Case& c : cases) {
        SCOPED_TRACE(c.file);
        ASSERT_TRUE(fs::exists(dir + c.file));
        std::string msg;
        try {
            (void)readFrame(dir + c.file);
        } catch (const InvalidInput& e) {
            msg = e.what();
        }
        EXPECT_NE(msg.find(c.file), std::string::npos) << msg;
        EXPECT_NE(msg.find("tile "), std::string::npos) << msg;
        EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    }
}

// Why the checks exist: CFITSIO's decoders, given what the checks refuse, touch memory outside the tile.
TEST(TileDecoderGuardDeathTest, CfitsioDecodersGoOutsideTheTileOnWhatTheChecksRefuse) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    std::mt19937 rng(3);
    // A stream for a 16 x 16 tile, decoded into an 8 x 8 tile's buffer (the stream's sizes win).
    const auto s = hcompressed(tilePixels(16, 16, 0, 60000, rng), 16, 16, 0, false);
    ASSERT_NE(hcompressProblem(s, 8, 8, false), "");
    EXPECT_DEATH((void)hdecompressedGuarded(s, 8, 8, false, true), "");
    // A line list whose header claims more words than the tile holds.
    auto list = plioEncoded(maskPixels(4096, 0, rng));
    ASSERT_GT(list.size(), 100u);
    list.resize(40);
    ASSERT_NE(plioTileProblem(list.data(), list.size(), 4096), "");
    EXPECT_DEATH((void)plioDecodedGuarded(list, 4096, true), "");
}
