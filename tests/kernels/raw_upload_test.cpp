// The read phase's raw upload (kernels/frame_upload.hpp): the device frame and mask converted on
// the GPU from the file's raw chunks are bitwise readFrame's host floats and mask for every BITPIX (with
// and without BSCALE/BZERO/BLANK), odd sizes and chunks that split rows; the frame cache adopts them (no
// second upload); the pipeline's catalog is the same with the raw upload on, off (GPUPHOT_RAW_UPLOAD=0) and
// on the CPU backend; compressed files keep the host path and the float upload. Memory: the chunk sizes
// against the frame, the upload counted in every context's GPU memory budget (a small --gpu-mem-limit:
// the read steps aside, the catalog unchanged, the high water within the limit), the pinned buffers from
// the warm-up, and an allocation failure injected at each of the read's allocations (host path).
#include <fitsio.h>
#include <gtest/gtest.h>
#include <omp.h>

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
#include "core/stages/background/background.hpp"
#include "kernels/device_context.hpp"
#include "kernels/frame_upload.hpp"
#include "tests/kernels/cuda_test_util.hpp"
#include "tests/same_table.hpp"

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
            // 0: rawUploadChunkBytes (64 KiB or the whole frame); 1000 / 4096 bytes: chunks inside rows.
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

struct EnvGuard {
    EnvGuard(const char* name, const char* value) : n(name) { ::setenv(name, value, 1); }
    ~EnvGuard() { ::unsetenv(n); }
    const char* n;
};

// readFramePhase + computeFramePhase in ctx; `uploaded`: whether the read's upload was ready.
Table reduceOnce(const std::string& path, RunContext& ctx, bool* uploaded = nullptr) {
    ReduceOptions ro;
    ro.write = false;
    LoadedFrame loaded = readFramePhase(path, ro);
    auto* up = dynamic_cast<cuda::RawFrameUpload*>(loaded.deviceUpload.get());
    if (uploaded) *uploaded = up != nullptr && up->ready();
    ComputedFrame c = computeFramePhase(std::move(loaded), ro, ctx);
    return std::move(c.catalog);
}

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
    // Frame uploads the stages made (the raw upload adopted: none).
    auto run = [&](const std::string& path, RunContext& ctx, bool expectUpload, bool expectStageUpload) {
        bool uploaded = false;
        Table t = reduceOnce(path, ctx, &uploaded);
        EXPECT_EQ(uploaded, expectUpload) << path;
        if (ctx.backend == Backend::Cuda) {
            const std::uint64_t n = cuda::DeviceContext::of(ctx).uploads();
            if (expectStageUpload) {
                EXPECT_GE(n, 1u) << path;
            } else {
                EXPECT_EQ(n, 0u) << path;
            }
        }
        return t;
    };
    RunContext on = cudatest::cudaContext(), off = cudatest::cudaContext(), cpu = cudatest::cpuContext();
    RunContext onPacked = cudatest::cudaContext();
    const Table tOn = run(plain, on, true, false);
    Table tOff, tCpu, tPacked;
    {
        EnvGuard e("GPUPHOT_RAW_UPLOAD", "0");
        const BackendTuning t = BackendTuning::fromEnvironment();
        EXPECT_FALSE(t.rawUpload);
        armRawUpload(t.rawUpload); // as startDeviceWarmUp does with the context's tuning
        EXPECT_FALSE(rawUploadEnabled());
        tOff = run(plain, off, false, true);
        armRawUpload(true);
    }
    EXPECT_TRUE(rawUploadEnabled());
    tCpu = run(plain, cpu, true, false); // read with the upload (armed), dropped by the CPU backend
    tPacked = run(packed, onPacked, false, true);
    EXPECT_GT(tOn.rows(), 100u);
    test::expectSameTable(tOn, tOff);
    test::expectSameTable(tOn, tCpu);
    test::expectSameTable(tOn, tPacked);
    armRawUpload(false);
    fs::remove_all(dir);
}

// ---- memory: the budget, the host bound, the warm-up and allocation failures -----------------------------

// The reader chunks hold about the frame's raw bytes: no more chunks than readers for frames up to
// readers x 8 MiB, 64 KiB to 8 MiB each, never more than the frame. Host code: runs without a device.
TEST(RawUpload, ChunksHoldAboutTheFrame) {
    const std::size_t KiB = 1024, MiB = 1024 * KiB;
    for (const int threads : {1, 2, 16, 64}) {
        for (const std::size_t raw : {std::size_t(1), 37 * 23 * 2 * KiB / KiB, 100 * KiB, 8 * MiB, 8 * MiB + 1,
                                      75 * MiB, 302 * MiB, 1210 * MiB}) {
            SCOPED_TRACE(std::to_string(threads) + " readers, " + std::to_string(raw) + " raw bytes");
            const std::size_t c = cuda::rawUploadChunkBytes(raw, threads);
            const std::size_t t = static_cast<std::size_t>(threads);
            EXPECT_LE(c, 8 * MiB);
            EXPECT_LE(c, raw);
            EXPECT_TRUE(c >= 64 * KiB || c == raw);
            const std::size_t chunks = (raw + c - 1) / c;
            if (raw <= t * 8 * MiB) {
                EXPECT_LE(chunks, t);
            }
            // The pinned buffers (one chunk per reader) against the frame's raw bytes.
            EXPECT_LE(t * c, std::max(raw, t * 64 * KiB) + t * 64 * KiB);
        }
    }
}

// The memory held outside the contexts (the raw upload's) counts in every live context's budget: in its
// allocations, available() and high-water mark; a reservation that does not fit a budget is refused.
TEST(RawUpload, OutsideReservationCountsInEveryContextsBudget) {
    REQUIRE_DEVICE();
    const std::size_t MiB = std::size_t(1) << 20;
    cuda::DeviceContext a(8 * MiB), b(4 * MiB);
    const int dev = a.device();
    const std::size_t before = cuda::heldOutside(dev);
    ASSERT_EQ(before, 0u);
    void* p = a.allocate(3 * MiB);
    void* q = b.allocate(1 * MiB);
    EXPECT_FALSE(cuda::reserveOutside(dev, 3 * MiB + 1)); // b: 1 + 3 MiB + 1 > 4 MiB
    EXPECT_EQ(cuda::heldOutside(dev), 0u);
    ASSERT_TRUE(cuda::reserveOutside(dev, 2 * MiB));
    EXPECT_EQ(cuda::heldOutside(dev), 2 * MiB);
    EXPECT_EQ(a.available(), 3 * MiB);
    EXPECT_EQ(b.available(), 1 * MiB);
    EXPECT_EQ(a.highWater(), 5 * MiB);
    EXPECT_EQ(b.highWater(), 3 * MiB);
    EXPECT_THROW(b.allocate(1 * MiB + 1), DeviceOutOfMemory);
    EXPECT_EQ(b.inUse(), 1 * MiB);
    // Taken over by a context: the total is unchanged, the context's in-use grows.
    ASSERT_TRUE(b.takeOverOutside(1 * MiB));
    EXPECT_EQ(cuda::heldOutside(dev), 1 * MiB);
    EXPECT_EQ(b.inUse(), 2 * MiB);
    EXPECT_FALSE(b.takeOverOutside(3 * MiB)); // more than the budget: nothing changes
    EXPECT_EQ(b.inUse(), 2 * MiB);
    cuda::releaseOutside(dev, 1 * MiB);
    EXPECT_EQ(cuda::heldOutside(dev), 0u);
    EXPECT_EQ(b.available(), 2 * MiB);
    b.release(q, 1 * MiB); // (the taken-over MiB was never allocated here: only the count goes back)
    a.release(p, 3 * MiB);
    EXPECT_EQ(a.inUse(), 0u);
}

fs::path simFrame(const fs::path& dir, int w, int h, int stars, std::uint64_t seed) {
    const SimResult sim = cudatest::simulateSmall(w, h, stars, seed);
    writeSimulation(sim, dir.string(), "sim" + std::to_string(seed), kBitpixUInt16);
    return dir / ("sim" + std::to_string(seed) + ".fits");
}

// Under a small --gpu-mem-limit the read's upload (device frame, mask, reader slots) is counted in the
// context's budget: it steps aside (host path) when it does not fit, and the stages plan with what is left;
// the catalog is the same as the CPU backend's and no stage's pool high-water mark (which includes what the
// upload held) exceeds the limit.
TEST(RawUpload, SmallGpuMemLimitKeepsTheReadWithinTheBudget) {
    REQUIRE_DEVICE();
    warmUp();
    const fs::path dir = tempDir();
    const int W = 420, H = 380;
    const std::string path = simFrame(dir, W, H, 300, 23).string();
    armRawUpload(true);
    RunContext cpu = cudatest::cpuContext();
    const Table ref = reduceOnce(path, cpu);
    ASSERT_GT(ref.rows(), 100u);
    const std::size_t npix = std::size_t(W) * H;
    // The device frame alone (4 B/px) does not fit / the frame and mask fit but not the reader slots as
    // well / everything fits (the stages then plan with the adopted frame in the budget).
    const std::size_t slots =
        static_cast<std::size_t>(omp_get_max_threads()) * cuda::rawUploadChunkBytes(npix * 2, omp_get_max_threads());
    struct Limit {
        const char* name;
        std::size_t bytes;
        bool uploaded;
    };
    const Limit limits[] = {{"under the frame", npix * 3, false},
                            {"frame and mask, not the slots", npix * 5 + slots / 2, false},
                            {"frame, mask and slots", npix * 5 + slots + (std::size_t(64) << 10), true},
                            {"four frames", npix * 20 + slots, true}};
    for (const Limit& l : limits) {
        SCOPED_TRACE(std::string(l.name) + ": " + std::to_string(l.bytes) + " bytes");
        RunContext g = cudatest::cudaContext();
        g.gpuMemLimit = l.bytes;
        auto& dc = cuda::DeviceContext::of(g); // live (as after the warm-up) while the frame is read
        bool uploaded = false;
        const Table t = reduceOnce(path, g, &uploaded);
        EXPECT_EQ(uploaded, l.uploaded);
        test::expectSameTable(ref, t);
        ASSERT_FALSE(g.records.empty());
        for (const StageRecord& r : g.records) {
            SCOPED_TRACE(r.stage);
            EXPECT_LE(r.deviceHighWater, l.bytes);
        }
        EXPECT_LE(dc.highWater(), l.bytes);
        EXPECT_EQ(cuda::heldOutside(dc.device()), 0u); // nothing left outside the contexts
    }
    armRawUpload(false);
    fs::remove_all(dir);
}

// The pinned reader buffers come from the warm-up (prepareRawUpload) for the frame whose read began:
// the next uploaded read of that size allocates only its device memory; a failure during the warm-up's
// preparation is swallowed and a read still uploads.
TEST(RawUpload, WarmUpAllocatesThePinnedBuffers) {
    REQUIRE_DEVICE();
    warmUp();
    const fs::path dir = tempDir();
    const std::string path = (dir / "warm.fits").string();
    writeCase(path, {16, true, true}, 700, 600, 41);
    const int threads = omp_get_max_threads();
    const std::size_t chunk = cuda::rawUploadChunkBytes(std::size_t(700) * 600 * 2, threads);
    {
        RawImageLayout small, l;
        small.bitpix = l.bitpix = 16;
        small.count = 100 * 100;
        l.count = 700 * 600;
        cuda::RawFrameUpload holder, noted;
        ASSERT_TRUE(holder.begin(small, 100, 100, RawMaskRule{}));
        // A read that begins notes its size for the warm-up, even when it is declined (resources busy).
        EXPECT_FALSE(noted.begin(l, 700, 600, RawMaskRule{}));
    }
    cuda::prepareRawUpload(0);
    EXPECT_GE(cuda::rawUploadPinnedBytes(), static_cast<std::size_t>(threads) * chunk);
    const std::size_t allocations = cuda::rawUploadAllocations();
    cuda::RawFrameUpload up;
    const Frame fr = readFrame(path, {}, &up);
    ASSERT_TRUE(up.ready()) << up.problem();
    EXPECT_EQ(cuda::rawUploadAllocations() - allocations, 3u); // frame, mask, slots: no pinned buffer
    std::vector<float> px;
    std::vector<std::uint8_t> mk;
    download(up, px, mk);
    EXPECT_TRUE(sameBits(px.data(), fr.pixels.data(), px.size(), "pixels"));
    EXPECT_TRUE(sameBits(mk.data(), fr.mask.data(), mk.size(), "mask"));

    // The warm-up's entry prepares nothing once a read has begun (its stages would compete with it).
    const std::size_t pinnedBefore = cuda::rawUploadPinnedBytes(), allocationsBefore = cuda::rawUploadAllocations();
    ASSERT_TRUE(cudaStages().prepareRawUpload);
    cudaStages().prepareRawUpload(0);
    EXPECT_EQ(cuda::rawUploadAllocations(), allocationsBefore);
    EXPECT_EQ(cuda::rawUploadPinnedBytes(), pinnedBefore);

    cuda::setRawUploadFailAfter(1);
    EXPECT_NO_THROW(cuda::prepareRawUpload(0));
    EXPECT_EQ(cuda::rawUploadFailAfter(), 0u);
    cuda::RawFrameUpload after;
    (void)readFrame(path, {}, &after);
    EXPECT_TRUE(after.ready()) << after.problem();
    fs::remove_all(dir);
}

// An allocation failure at each allocation site of the read (device frame, mask, reader slots, pinned
// buffers): the read succeeds on the host path with readFrame's frame, the failure was consumed, and
// nothing stays reserved outside the contexts.
TEST(RawUpload, InjectedAllocationFailureKeepsTheHostPath) {
    REQUIRE_DEVICE();
    warmUp();
    const fs::path dir = tempDir();
    const std::string path = (dir / "inject.fits").string();
    writeCase(path, {16, false, true}, 333, 211, 43);
    const Frame ref = readFrame(path);
    const int dev = [] {
        int d = 0;
        cudaGetDevice(&d);
        return d;
    }();
    // Chunks larger than the pinned buffers held so far, so that every read allocates them again.
    auto nextChunk = [] { return cuda::rawUploadSlotBytes() + (std::size_t(64) << 10); };
    std::size_t count = 0;
    {
        cuda::RawFrameUpload up;
        up.setChunkBytes(nextChunk());
        const std::size_t before = cuda::rawUploadAllocations();
        (void)readFrame(path, {}, &up);
        ASSERT_TRUE(up.ready()) << up.problem();
        count = cuda::rawUploadAllocations() - before;
    }
    ASSERT_GE(count, 4u); // frame, mask, slots, and at least one pinned buffer
    for (std::size_t n = 1; n <= count; ++n) {
        SCOPED_TRACE("allocation " + std::to_string(n) + " of " + std::to_string(count) + " fails");
        {
            cuda::RawFrameUpload up;
            up.setChunkBytes(nextChunk());
            cuda::setRawUploadFailAfter(n);
            Frame fr;
            ASSERT_NO_THROW(fr = readFrame(path, {}, &up));
            EXPECT_EQ(cuda::rawUploadFailAfter(), 0u);
            EXPECT_FALSE(up.ready());
            EXPECT_NE(up.problem().find("injected"), std::string::npos) << up.problem();
            EXPECT_TRUE(cudatest::sameImage(fr.pixels, ref.pixels, "pixels"));
            EXPECT_TRUE(cudatest::sameImage(fr.mask, ref.mask, "mask"));
        }
        EXPECT_EQ(cuda::heldOutside(dev), 0u);
        cuda::setRawUploadFailAfter(0);
        if (::testing::Test::HasFailure()) break;
    }
    fs::remove_all(dir);
}

// The whole reduction with an allocation failure injected at each of the read's upload allocations
// (setRawUploadFailAfter), and, with the upload adopted, at the context's first allocations after it
// (DeviceContext::setFailAfter, the stages' hook): every run ends with the CPU backend's catalog, and
// nothing is left reserved outside the contexts or in use beyond the device caches.
TEST(RawUpload, PipelineWithInjectedAllocationFailures) {
    REQUIRE_DEVICE();
    warmUp();
    const fs::path dir = tempDir();
    const std::string path = simFrame(dir, 300, 260, 150, 29).string();
    armRawUpload(true);
    RunContext cpu = cudatest::cpuContext();
    const Table ref = reduceOnce(path, cpu);
    ASSERT_GT(ref.rows(), 50u);
    std::size_t count = 0;
    {
        RunContext g = cudatest::cudaContext();
        (void)cuda::DeviceContext::of(g);
        const std::size_t before = cuda::rawUploadAllocations();
        bool uploaded = false;
        test::expectSameTable(ref, reduceOnce(path, g, &uploaded));
        ASSERT_TRUE(uploaded);
        count = cuda::rawUploadAllocations() - before;
    }
    ASSERT_GE(count, 3u);
    auto leftOver = [](cuda::DeviceContext& dc) {
        return dc.inUse() - dc.cachedFrameBytes() - dc.cachedBackgroundBytes();
    };
    for (std::size_t n = 1; n <= count; ++n) {
        SCOPED_TRACE("raw upload allocation " + std::to_string(n) + " of " + std::to_string(count) + " fails");
        RunContext g = cudatest::cudaContext();
        auto& dc = cuda::DeviceContext::of(g);
        cuda::setRawUploadFailAfter(n);
        bool uploaded = true;
        Table t;
        ASSERT_NO_THROW(t = reduceOnce(path, g, &uploaded));
        EXPECT_FALSE(uploaded);
        EXPECT_EQ(cuda::rawUploadFailAfter(), 0u);
        cuda::setRawUploadFailAfter(0);
        test::expectSameTable(ref, t);
        EXPECT_EQ(cuda::heldOutside(dc.device()), 0u);
        EXPECT_EQ(leftOver(dc), 0u);
        if (::testing::Test::HasFailure()) break;
    }
    for (std::size_t n : {1, 2, 5}) {
        SCOPED_TRACE("the adopting context's allocation " + std::to_string(n) + " fails");
        RunContext g = cudatest::cudaContext();
        auto& dc = cuda::DeviceContext::of(g);
        dc.setFailAfter(n);
        bool uploaded = false;
        Table t;
        ASSERT_NO_THROW(t = reduceOnce(path, g, &uploaded));
        EXPECT_TRUE(uploaded);
        EXPECT_EQ(dc.failAfter(), 0u);
        test::expectSameTable(ref, t);
        EXPECT_EQ(cuda::heldOutside(dc.device()), 0u);
        EXPECT_EQ(leftOver(dc), 0u);
    }
    armRawUpload(false);
    fs::remove_all(dir);
}

} // namespace
} // namespace gpuphot
