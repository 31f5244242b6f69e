// The read phase's raw upload (kernels/frame_upload.hpp, issue 5): the device frame and mask converted on
// the GPU from the file's raw chunks are bitwise readFrame's host floats and mask for every BITPIX (with
// and without BSCALE/BZERO/BLANK), odd sizes and chunks that split rows; the frame cache adopts them (no
// second upload); the pipeline's catalog is the same with the raw upload on, off (GPUPHOT_RAW_UPLOAD=0) and
// on the CPU backend; compressed files keep the host path and the float upload.
#include <fitsio.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "core/io/fits_image.hpp"
#include "core/io/fits_raw_read.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/stages/background.hpp"
#include "kernels/device_context.hpp"
#include "kernels/frame_upload.hpp"
#include "tests/kernels/cuda_test_util.hpp"

namespace gpuphot {
namespace {
namespace fs = std::filesystem;
using cudatest::sameBits;

// A DeviceContext, as the warm-up makes: until one exists a read keeps the host path.
void warmUp() {
    RunContext g = cudatest::cudaContext();
    (void)cuda::DeviceContext::of(g);
}

fs::path tempDir() {
    const fs::path d = fs::temp_directory_path() / ("gpuphot-rawup-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
}

struct Case {
    int bitpix;
    bool scaled;
    bool blank;
};

std::string caseName(const Case& c) {
    return "BITPIX " + std::to_string(c.bitpix) + (c.scaled ? " scaled" : "") + (c.blank ? " BLANK" : "");
}

void check(int status, const char* what) {
    if (status) {
        char text[FLEN_STATUS];
        fits_get_errstatus(status, text);
        FAIL() << what << ": " << text;
    }
}

// A w x h image of random raw values of the case's type (with the extremes, BLANK values, and for IEEE
// data NaN, +-Inf, +-0, subnormals and, for -64, values beyond the float range), written unscaled with
// the case's BSCALE/BZERO/BLANK and a SATURATE level that some pixels reach. `extended`: CFITSIO file
// name suffix (e.g. a tile compression spec).
void writeCase(const std::string& path, const Case& c, int w, int h, std::uint64_t seed,
               const std::string& extended = {}) {
    cudatest::SplitMix64 rng(seed);
    fitsfile* f = nullptr;
    int status = 0;
    fits_create_file(&f, ("!" + path + extended).c_str(), &status);
    long naxes[2] = {w, h};
    fits_create_img(f, c.bitpix, 2, naxes, &status);
    const double scale = c.scaled ? 0.37 : 1.0, zero = c.scaled ? (c.bitpix == 16 ? 32768.0 : -12.5) : 0.0;
    if (c.scaled) {
        fits_update_key_dbl(f, "BSCALE", scale, -12, nullptr, &status);
        fits_update_key_dbl(f, "BZERO", zero, -12, nullptr, &status);
    }
    const long long blank = c.bitpix == 8 ? 7 : c.bitpix == 16 ? -999 : 123456;
    if (c.blank && c.bitpix > 0) fits_update_key_lng(f, "BLANK", blank, nullptr, &status);
    fits_set_bscale(f, 1.0, 0.0, &status); // the values below are the raw ones
    const std::size_t n = static_cast<std::size_t>(w) * h;
    std::vector<double> v(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double u = rng.uniform();
        switch (c.bitpix) {
        case 8:
            v[i] = rng.below(256);
            break;
        case 16:
            v[i] = rng.below(65536) - 32768;
            break;
        case 32:
            v[i] = static_cast<double>(static_cast<std::int32_t>(rng.next()));
            break;
        default:
            v[i] = (u - 0.5) * std::pow(10.0, rng.below(12) - 4);
            break;
        }
        const int special = rng.below(40);
        if (c.bitpix > 0 && c.blank && special == 0) v[i] = static_cast<double>(blank);
        if (c.bitpix > 0 && special == 1) v[i] = c.bitpix == 8 ? 255 : c.bitpix == 16 ? 32767 : 2147483647.0;
        if (c.bitpix > 0 && special == 2) v[i] = c.bitpix == 8 ? 0 : c.bitpix == 16 ? -32768 : -2147483648.0;
        if (c.bitpix < 0) {
            const double sp[] = {std::numeric_limits<double>::quiet_NaN(),
                                 std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity(),
                                 0.0,
                                 -0.0,
                                 1e-40,
                                 -3e-42,
                                 c.bitpix == -64 ? 1e300 : 3e38,
                                 c.bitpix == -64 ? -5e39 : -3e38,
                                 1e-310};
            if (special < 10) v[i] = sp[special];
        }
    }
    // Raw values written as the file's type (fits_write_img converts; no scaling, no null substitution).
    if (c.bitpix == -32) {
        std::vector<float> fv(v.begin(), v.end());
        for (std::size_t i = 0; i < n; ++i)
            if (v[i] == 1e-310) fv[i] = std::numeric_limits<float>::denorm_min();
        fits_write_img(f, TFLOAT, 1, static_cast<LONGLONG>(n), fv.data(), &status);
    } else {
        fits_write_img(f, TDOUBLE, 1, static_cast<LONGLONG>(n), v.data(), &status);
    }
    // Some pixels saturate (the mask rule of readFrame is reproduced on the device).
    const double sat = c.bitpix == 8 ? 200.0 * scale + zero : c.bitpix == 16 ? 20000.0 * scale + zero : 1e3;
    fits_update_key_dbl(f, "SATURATE", sat, -12, nullptr, &status);
    fits_close_file(f, &status);
    check(status, path.c_str());
}

// Device frame and mask of an upload, downloaded.
void download(const cuda::RawFrameUpload& up, std::vector<float>& px, std::vector<std::uint8_t>& mk) {
    const std::size_t n = static_cast<std::size_t>(up.width()) * up.height();
    px.assign(n, 0.0f);
    mk.assign(n, 0);
    ASSERT_EQ(cudaMemcpy(px.data(), up.pixels(), n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(mk.data(), up.mask(), n, cudaMemcpyDeviceToHost), cudaSuccess);
}

TEST(RawUpload, DeviceFrameIsBitwiseTheHostFrame) {
    REQUIRE_DEVICE();
    warmUp();
    const fs::path dir = tempDir();
    const std::vector<Case> cases = {{8, false, false},  {8, true, true},     {16, false, false},
                                     {16, true, false},  {16, false, true},   {16, true, true},
                                     {32, false, false}, {32, true, true},    {-32, false, false},
                                     {-32, true, false}, {-64, false, false}, {-64, true, false}};
    const int sizes[][2] = {{37, 23}, {501, 263}};
    std::uint64_t seed = 1;
    for (const Case& c : cases) {
        for (const auto& sz : sizes) {
            const std::string path = (dir / "case.fits").string();
            writeCase(path, c, sz[0], sz[1], ++seed);
            // 0: the default 8 MiB (one chunk); 1000 / 4096 bytes: chunks that end inside rows.
            for (std::size_t chunk : {std::size_t(0), std::size_t(1000), std::size_t(4096)}) {
                SCOPED_TRACE(caseName(c) + ", " + std::to_string(sz[0]) + "x" + std::to_string(sz[1]) +
                             ", chunk " + std::to_string(chunk));
                cuda::RawFrameUpload up;
                up.setChunkBytes(chunk);
                const Frame fr = readFrame(path, {}, &up);
                ASSERT_TRUE(up.ready()) << up.problem();
                const std::size_t rawBytes = std::size_t(sz[0]) * sz[1] * (std::abs(c.bitpix) / 8);
                if (chunk && rawBytes > chunk) {
                    EXPECT_GT(up.chunks(), 1u);
                }
                std::vector<float> px;
                std::vector<std::uint8_t> mk;
                download(up, px, mk);
                const std::size_t n = px.size();
                EXPECT_TRUE(sameBits(px.data(), fr.pixels.data(), n, "pixels"));
                EXPECT_TRUE(sameBits(mk.data(), fr.mask.data(), n, "mask"));
                // The host frame is CFITSIO's conversion (fits_raw_read_test checks that further).
                std::size_t masked = 0;
                for (std::size_t i = 0; i < n; ++i)
                    masked += fr.mask.data()[i] != 0;
                EXPECT_GT(masked, 0u);
            }
        }
    }
    fs::remove_all(dir);
}

TEST(RawUpload, AdoptedAsFrameCacheWithoutSecondUpload) {
    REQUIRE_DEVICE();
    const fs::path dir = tempDir();
    const std::string path = (dir / "adopt.fits").string();
    writeCase(path, {16, true, true}, 301, 217, 5);
    RunContext g = cudatest::cudaContext(), c = cudatest::cpuContext();
    auto& dc = cuda::DeviceContext::of(g);
    auto up = std::make_shared<cuda::RawFrameUpload>();
    up->setChunkBytes(10000);
    const Frame fr = readFrame(path, {}, up.get());
    ASSERT_TRUE(up->ready()) << up->problem();
    const float* devicePixels = up->pixels();
    const std::uint64_t before = dc.uploads();
    const std::size_t inUse = dc.inUse();
    std::shared_ptr<RawChunkSink> sink = up;
    up.reset();
    ASSERT_TRUE(adoptRawUpload(sink, fr.view(), fr.maskView(), true, g));
    EXPECT_FALSE(sink);
    EXPECT_EQ(dc.inUse(), inUse + fr.pixels.pixelCount() * 5); // counted against the budget
    const auto f = dc.frame(fr.view(), fr.maskView());
    EXPECT_EQ(f.pixels, devicePixels);
    EXPECT_EQ(dc.uploads(), before);
    // The CUDA background on the adopted frame: bitwise the CPU's, and still no upload.
    const BackgroundResult bg = estimateBackground(fr.view(), fr.maskView(), BackgroundParams{}, g);
    const BackgroundResult bc = estimateBackground(fr.view(), fr.maskView(), BackgroundParams{}, c);
    cudatest::expectSameBackground(bc, bg);
    EXPECT_EQ(dc.uploads(), before);

    // Host changes in place after the adoption (preparation's host steps): settled, the stale part is
    // uploaded again from the host.
    auto up4 = std::make_shared<cuda::RawFrameUpload>();
    const Frame fr4 = readFrame(path, {}, up4.get());
    Frame& host = const_cast<Frame&>(fr4);
    std::shared_ptr<RawChunkSink> s4 = up4;
    up4.reset();
    ASSERT_TRUE(adoptRawUpload(s4, host.view(), host.maskView(), true, g));
    const std::uint64_t adoptedUploads = dc.uploads();
    host.mask.data()[17] ^= MaskSaturated; // a mask-only change (as bleed trails)
    settleRawUpload(g, false, true);
    auto f4 = dc.frame(host.view(), host.maskView());
    EXPECT_EQ(dc.uploads(), adoptedUploads); // pixels kept
    std::vector<std::uint8_t> m4(host.mask.pixelCount());
    ASSERT_EQ(cudaMemcpy(m4.data(), f4.mask, m4.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(sameBits(m4.data(), host.mask.data(), m4.size(), "settled mask"));
    settleRawUpload(g, true, true); // no longer the read frame (the mask was re-uploaded): nothing to do
    EXPECT_EQ(dc.frame(host.view(), host.maskView()).pixels, f4.pixels);
    auto up5 = std::make_shared<cuda::RawFrameUpload>();
    const Frame fr5 = readFrame(path, {}, up5.get());
    Frame& host5 = const_cast<Frame&>(fr5);
    std::shared_ptr<RawChunkSink> s5 = up5;
    up5.reset();
    ASSERT_TRUE(adoptRawUpload(s5, host5.view(), host5.maskView(), true, g));
    const std::uint64_t u5 = dc.uploads();
    for (std::size_t i = 0; i < host5.pixels.pixelCount(); ++i)
        host5.pixels.data()[i] -= 3.0f; // as overscan
    settleRawUpload(g, true, false);
    auto f5 = dc.frame(host5.view(), host5.maskView());
    EXPECT_EQ(dc.uploads(), u5 + 1);
    std::vector<float> p5(host5.pixels.pixelCount());
    ASSERT_EQ(cudaMemcpy(p5.data(), f5.pixels, p5.size() * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(sameBits(p5.data(), host5.pixels.data(), p5.size(), "settled pixels"));

    // Not adopted (and nothing leaked) when the budget has no room, or on the CPU backend.
    auto up2 = std::make_shared<cuda::RawFrameUpload>();
    const Frame fr2 = readFrame(path, {}, up2.get());
    ASSERT_TRUE(up2->ready());
    dc.dropFrame();
    dc.dropBackground();
    const std::size_t base = dc.inUse();
    dc.setBudget(base + 1000);
    EXPECT_FALSE(up2->adoptInto(dc, fr2.view(), fr2.maskView(), true));
    EXPECT_EQ(dc.inUse(), base);
    dc.setBudget(0);
    auto up3 = std::make_shared<cuda::RawFrameUpload>();
    const Frame fr3 = readFrame(path, {}, up3.get());
    std::shared_ptr<RawChunkSink> s3 = up3;
    EXPECT_FALSE(adoptRawUpload(s3, fr3.view(), fr3.maskView(), true, c));
    fs::remove_all(dir);
}

TEST(RawUpload, SecondConcurrentReadKeepsTheHostPath) {
    REQUIRE_DEVICE();
    warmUp();
    const fs::path dir = tempDir();
    const std::string path = (dir / "busy.fits").string();
    writeCase(path, {16, false, false}, 64, 48, 9);
    cuda::RawFrameUpload first;
    RawImageLayout l;
    l.bitpix = 16;
    l.count = 64 * 48;
    ASSERT_TRUE(first.begin(l, 64, 48, RawMaskRule{}));
    cuda::RawFrameUpload second;
    const Frame fr = readFrame(path, {}, &second); // declined: the host read alone
    EXPECT_FALSE(second.ready());
    const Frame ref = readFrame(path);
    EXPECT_TRUE(cudatest::sameImage(fr.pixels, ref.pixels, "pixels"));
    fs::remove_all(dir);
}

// Every column of two catalogs, bitwise.
void expectSameTable(const Table& a, const Table& b) {
    ASSERT_EQ(a.columns().size(), b.columns().size());
    ASSERT_EQ(a.rows(), b.rows());
    for (std::size_t k = 0; k < a.columns().size(); ++k) {
        const Column& ca = a.columns()[k];
        const Column& cb = b.columns()[k];
        ASSERT_EQ(ca.name, cb.name);
        ASSERT_EQ(ca.data.index(), cb.data.index()) << ca.name;
        std::visit(
            [&](const auto& va) {
                using V = std::decay_t<decltype(va)>;
                const V& vb = std::get<V>(cb.data);
                if constexpr (std::is_same_v<V, std::vector<std::string>>)
                    EXPECT_EQ(va, vb) << ca.name;
                else
                    EXPECT_TRUE(cudatest::sameVec(va, vb, ca.name));
            },
            ca.data);
    }
}

struct EnvGuard {
    EnvGuard(const char* name, const char* value) : n(name) { ::setenv(name, value, 1); }
    ~EnvGuard() { ::unsetenv(n); }
    const char* n;
};

// The pipeline's catalog with the raw upload on and off (GPUPHOT_RAW_UPLOAD=0) and on the CPU backend;
// uncompressed (16-bit with BZERO, as cameras write) and tile-compressed (host path, float upload).
TEST(RawUpload, PipelineCatalogUnchangedOnOffAndCompressed) {
    REQUIRE_DEVICE();
    warmUp();
    const fs::path dir = tempDir();
    const SimResult sim = cudatest::simulateSmall(420, 380, 300, 17);
    writeSimulation(sim, dir.string(), "sim", kBitpixUInt16);
    const std::string plain = (dir / "sim.fits").string();
    const std::string packed = (dir / "packed.fits").string();
    { // RICE tile compression of the same HDU (lossless for integers)
        fitsfile *in = nullptr, *out = nullptr;
        int status = 0;
        fits_open_file(&in, plain.c_str(), READONLY, &status);
        fits_create_file(&out, ("!" + packed).c_str(), &status);
        fits_set_compression_type(out, RICE_1, &status);
        fits_img_compress(in, out, &status);
        fits_close_file(out, &status);
        fits_close_file(in, &status);
        check(status, packed.c_str());
        ASSERT_TRUE(listHdus(packed).back().compressed);
    }
    armRawUpload(true);
    ReduceOptions ro;
    ro.write = false;
    // Frame uploads the stages made (the raw upload adopted: none).
    auto run = [&](const std::string& path, RunContext& ctx, bool expectUpload, bool expectStageUpload) {
        LoadedFrame loaded = readFramePhase(path, ro);
        auto* up = dynamic_cast<cuda::RawFrameUpload*>(loaded.deviceUpload.get());
        EXPECT_EQ(up != nullptr && up->ready(), expectUpload) << path;
        ComputedFrame c = computeFramePhase(std::move(loaded), ro, ctx);
        if (ctx.backend == Backend::Cuda) {
            const std::uint64_t n = cuda::DeviceContext::of(ctx).uploads();
            if (expectStageUpload) {
                EXPECT_GE(n, 1u) << path;
            } else {
                EXPECT_EQ(n, 0u) << path;
            }
        }
        return std::move(c.catalog);
    };
    RunContext on = cudatest::cudaContext(), off = cudatest::cudaContext(), cpu = cudatest::cpuContext();
    RunContext onPacked = cudatest::cudaContext();
    const Table tOn = run(plain, on, true, false);
    Table tOff, tCpu, tPacked;
    {
        EnvGuard e("GPUPHOT_RAW_UPLOAD", "0");
        EXPECT_FALSE(rawUploadEnabled());
        tOff = run(plain, off, false, true);
    }
    EXPECT_TRUE(rawUploadEnabled());
    tCpu = run(plain, cpu, true, false); // read with the upload (armed), dropped by the CPU backend
    tPacked = run(packed, onPacked, false, true);
    EXPECT_GT(tOn.rows(), 100u);
    expectSameTable(tOn, tOff);
    expectSameTable(tOn, tCpu);
    expectSameTable(tOn, tPacked);
    armRawUpload(false);
    fs::remove_all(dir);
}

} // namespace
} // namespace gpuphot
