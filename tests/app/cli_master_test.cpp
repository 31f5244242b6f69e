// gpuphot simulate --raw and gpuphot master end to end through the binary: the raw frame carries its
// sections and a cosmic-ray truth mask, masters come out trimmed with the simulator's detector truth
// (hot pixels in the bad-pixel mask, flat median 1), bad inputs are clear errors, and (once reduce has
// the options) a reduction with the masters reaches the true zero point.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/catalog/table.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/sim/simulator.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

struct RawSet {
    TempDir dir{"gpuphot_master_cli"};
    bool ok = false;
    std::string files(const std::string& type) const {
        std::string s;
        for (int i = 1; i <= 3; ++i) s += " " + (dir / ("field." + type + "_0" + std::to_string(i) + ".fits"));
        return s;
    }
};

const RawSet& rawSet() {
    static const std::unique_ptr<RawSet> s = [] {
        auto g = std::make_unique<RawSet>();
        const CliResult r = runCli("simulate --raw --raw-count 3 --size 300x240 --stars 150 --seed 8 "
                                   "--set magFaint=18.5 --set cosmicRays=15 -q -o " + g->dir.str() + " --name field");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        g->ok = r.exitCode == 0;
        return g;
    }();
    return *s;
}

TEST(CliMaster, SimulateRawWritesSectionsCalibrationFramesAndCosmicRayTruth) {
    const RawSet& s = rawSet();
    ASSERT_TRUE(s.ok);
    const Header h = readHeader(s.dir / "field.fits");
    EXPECT_EQ(h.getString("TRIMSEC").value_or(""), "[1:300,1:240]");
    EXPECT_EQ(h.getString("BIASSEC").value_or(""), "[301:332,1:240]");
    EXPECT_EQ(h.getString("IMAGETYP").value_or(""), "Light Frame");
    const Frame f = readFrame(s.dir / "field.fits");
    EXPECT_EQ(f.width(), 332);
    for (const char* type : {"bias", "dark", "flat"})
        for (int i = 1; i <= 3; ++i)
            EXPECT_TRUE(fs::exists(s.dir / ("field." + std::string(type) + "_0" + std::to_string(i) + ".fits")));
    EXPECT_EQ(readHeader(s.dir / "field.bias_01.fits").getDouble("EXPTIME").value_or(-1.0), 0.0);
    EXPECT_EQ(readHeader(s.dir / "field.flat_02.fits").getString("IMAGETYP").value_or(""), "Flat Field");
    // Cosmic-ray truth: every flagged pixel is brighter than the truth-free rendering would allow.
    const Frame cr = readFrame(s.dir / "field.crmask.fits");
    ASSERT_EQ(cr.width(), f.width());
    std::size_t n = 0, bright = 0;
    for (int y = 0; y < cr.height(); ++y)
        for (int x = 0; x < cr.width(); ++x)
            if (cr.pixels(x, y) != 0.0f) {
                ++n;
                bright += f.pixels(x, y) > 1000.0f + 300.0f + 500.0f; // bias + sky + far above the noise
            }
    EXPECT_GT(n, 15u);
    EXPECT_GT(bright, n * 9 / 10);
}

TEST(CliMaster, BuildsTrimmedMastersAndABadPixelMask) {
    const RawSet& s = rawSet();
    ASSERT_TRUE(s.ok);
    const std::string d = s.dir.str();
    CliResult r = runCli("master bias" + s.files("bias") + " -o " + d + "/mbias.fits");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    r = runCli("master dark" + s.files("dark") + " --bias " + d + "/mbias.fits -o " + d + "/mdark.fits --bpm-out " + d +
               "/bpm.fits --method clipped");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    r = runCli("master flat" + s.files("flat") + " --bias " + d + "/mbias.fits --dark " + d + "/mdark.fits -o " + d +
               "/mflat.fits");
    ASSERT_EQ(r.exitCode, 0) << r.err;

    const Frame mb = readFrame(d + "/mbias.fits"), md = readFrame(d + "/mdark.fits"), mf = readFrame(d + "/mflat.fits");
    for (const Frame* m : {&mb, &md, &mf}) {
        EXPECT_EQ(m->width(), 300);
        EXPECT_EQ(m->height(), 240);
        EXPECT_EQ(m->header.getInt("NCOMBINE").value_or(0), 3);
    }
    EXPECT_EQ(mb.header.getString("IMAGETYP").value_or(""), "Master Bias");
    EXPECT_EQ(md.header.getString("COMBMETH").value_or(""), "clipped");

    // Hot pixels: the simulator's, found; nothing else.
    SimParams p;
    p.width = 300;
    p.height = 240;
    p.seed = 8;
    p.darkHotPixels = 50; // the --raw preset
    p.darkCurrent = 0.5;
    const Image<float> rate = simDarkMap(p);
    const Frame bpm = readFrame(d + "/bpm.fits");
    std::size_t truthHot = 0, found = 0, extra = 0;
    for (int y = 0; y < 240; ++y)
        for (int x = 0; x < 300; ++x) {
            const bool isHot = rate(x, y) > 10.0f;
            const bool flagged = bpm.pixels(x, y) != 0.0f;
            truthHot += isHot;
            found += isHot && flagged;
            extra += !isHot && flagged;
        }
    EXPECT_GE(truthHot, 45u);
    EXPECT_EQ(found, truthHot);
    EXPECT_LE(extra, 2u);

    // The flat: median 1, the vignetting (15% at the corners) visible.
    std::vector<float> v(mf.pixels.data(), mf.pixels.data() + mf.pixels.pixelCount());
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    EXPECT_NEAR(v[v.size() / 2], 1.0, 1e-4);
    EXPECT_LT(mf.pixels(2, 2), 0.93f);
    EXPECT_GT(mf.pixels(150, 120), 1.0f);
}

TEST(CliMaster, BadInputsAreClearErrors) {
    const RawSet& s = rawSet();
    ASSERT_TRUE(s.ok);
    const std::string d = s.dir.str();
    // A bias of another size for the darks.
    CliResult r = runCli("simulate --size 100x100 --stars 0 -q -o " + d + " --name small");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    r = runCli("master dark" + s.files("dark") + " --bias " + d + "/small.fits -o " + d + "/x.fits");
    EXPECT_EQ(r.exitCode, 2);
    EXPECT_NE(r.err.find("small.fits"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d + "/x.fits"));
    // Frames of different sizes.
    r = runCli("master bias" + s.files("bias") + " " + d + "/small.fits -o " + d + "/x.fits");
    EXPECT_EQ(r.exitCode, 2);
    EXPECT_NE(r.err.find("small.fits"), std::string::npos) << r.err;
    // Unknown type, missing output.
    EXPECT_NE(runCli("master sky" + s.files("bias") + " -o " + d + "/x.fits").exitCode, 0);
    EXPECT_NE(runCli("master bias" + s.files("bias")).exitCode, 0);
}

TEST(CliMaster, ReduceWithMastersReachesTheTrueZeroPoint) {
    const RawSet& s = rawSet();
    ASSERT_TRUE(s.ok);
    if (runCli("reduce --help").out.find("--flat") == std::string::npos)
        GTEST_SKIP() << "reduce does not have the frame-preparation options yet (app/cli/prepare_options.hpp)";
    const std::string d = s.dir.str();
    ASSERT_EQ(runCli("master bias" + s.files("bias") + " -o " + d + "/rb.fits").exitCode, 0);
    ASSERT_EQ(runCli("master dark" + s.files("dark") + " --bias " + d + "/rb.fits -o " + d + "/rd.fits").exitCode, 0);
    ASSERT_EQ(runCli("master flat" + s.files("flat") + " --bias " + d + "/rb.fits --dark " + d + "/rd.fits -o " + d +
                     "/rf.fits")
                  .exitCode,
              0);
    TempDir out("gpuphot_master_reduce");
    const CliResult r = runCli("reduce " + (s.dir / "field.fits") + " --bias " + d + "/rb.fits --dark " + d +
                               "/rd.fits --flat " + d + "/rf.fits --cosmics --ref " + (s.dir / "field.ref.fits") +
                               " -o " + out.str());
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const Table cat = readFitsTable(out / "field.cat.fits");
    const double simZp = *readHeader(s.dir / "field.fits").getDouble("SIMZP");
    ASSERT_TRUE(cat.meta.getDouble("ZP").has_value());
    EXPECT_NEAR(*cat.meta.getDouble("ZP"), simZp, 0.01);
    const auto report = nlohmann::json::parse(slurp(out.path / "field.report.json"));
    ASSERT_TRUE(report.contains("prepare"));
    EXPECT_TRUE(report["prepare"]["flat"].get<bool>());
    EXPECT_TRUE(report["prepare"]["trimmed"].get<bool>());
}

} // namespace
