// `gpuphot reduce --sex FILE [-KEY value ...]`: a SExtractor configuration on the command line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/app/cli_run.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

struct SexFiles {
    TempDir dir{"gpuphot_cli_sex"};
    std::string sex;
    SexFiles() {
        std::ofstream(dir / "tuned.conv") << "CONV NORM\n1 2 1\n2 4 2\n1 2 1\n";
        sex = (dir / "tuned.sex");
        std::ofstream(sex) << "DETECT_MINAREA 4\nDETECT_THRESH 2.0\nFILTER_NAME tuned.conv\n"
                              "PHOT_APERTURES 6,10\nBACK_SIZE 32\nSTRANGE_KEY 1\n";
    }
};

} // namespace

TEST(CliSextractor, ConfigAndUpperCaseOverridesReachTheStages) {
    const SexFiles f;
    const CliResult r =
        runCli("reduce x.fits --sex " + f.sex + " -DETECT_THRESH 3.5 -BACK_FILTERSIZE 5 --dump-config");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const nlohmann::json c = nlohmann::json::parse(r.out);
    EXPECT_EQ(c["detection"]["minArea"], 4);
    EXPECT_EQ(c["detection"]["threshold"], 3.5) << "the -KEY value override wins over the file";
    EXPECT_EQ(c["detection"]["filterKernelWidth"], 3);
    EXPECT_EQ(c["aperture"]["radii"], nlohmann::json::array({3.0, 5.0}));
    EXPECT_EQ(c["background"]["meshSize"], 32);
    EXPECT_EQ(c["background"]["filterSize"], 5);
    EXPECT_NE(r.err.find("STRANGE_KEY 1"), std::string::npos) << "unsupported keys are listed: " << r.err;
    // gpuphot's own lower-case options still win over the SExtractor file
    const CliResult own = runCli("reduce x.fits --sex " + f.sex + " --minarea 7 --dump-config -q");
    ASSERT_EQ(own.exitCode, 0) << own.err;
    EXPECT_EQ(nlohmann::json::parse(own.out)["detection"]["minArea"], 7);
    EXPECT_TRUE(own.err.empty()) << "-q: no warning";
}

TEST(CliSextractor, BadFilesAreInputErrors) {
    const SexFiles f;
    const CliResult missing = runCli("reduce x.fits --sex " + (f.dir / "absent.sex") + " --dump-config");
    EXPECT_EQ(missing.exitCode, 2);
    EXPECT_NE(missing.err.find("absent.sex"), std::string::npos) << missing.err;
    std::ofstream(f.dir / "bad.sex") << "DETECT_MINAREA lots\n";
    const CliResult bad = runCli("reduce x.fits --sex " + (f.dir / "bad.sex") + " --dump-config");
    EXPECT_EQ(bad.exitCode, 2);
    EXPECT_NE(bad.err.find("DETECT_MINAREA"), std::string::npos) << bad.err;
}

TEST(CliSextractor, ReducesAFrame) {
    const SexFiles f;
    TempDir out("gpuphot_cli_sex_out");
    ASSERT_EQ(runCli("simulate --size 256x256 --stars 40 --seed 3 -o " + out.str() + " --name s -q").exitCode,
              0);
    const CliResult r = runCli("reduce " + (out / "s.fits") + " --sex " + f.sex + " -o " + out.str() + " -q");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_TRUE(fs::exists(out / "s.cat.fits"));
    const nlohmann::json rep = nlohmann::json::parse(slurp(out / "s.report.json"));
    EXPECT_EQ(rep["aperture"]["radii"], nlohmann::json::array({3.0, 5.0}));
}

// The SExtractor catalog: CATALOG_NAME inside -o, CATALOG_TYPE, --param over PARAMETERS_NAME; with several
// frames each catalog is STEM.CATALOG_NAME; --formats ldac writes STEM.ldac.
TEST(CliSextractor, WritesSextractorCatalogs) {
    const SexFiles f;
    TempDir out("gpuphot_cli_sex_cat");
    for (const char* n : {"a", "b"})
        ASSERT_EQ(
            runCli("simulate --size 256x256 --stars 40 --seed 3 -o " + out.str() + " --name " + n + " -q")
                .exitCode,
            0);
    std::ofstream(f.dir / "my.param") << "NUMBER\nXWIN_IMAGE\nFLUX_APER(2)\nFLAGS\n";
    const std::string one = out / "one";
    const CliResult r = runCli("reduce " + (out / "a.fits") + " --sex " + f.sex + " --param " +
                               (f.dir / "my.param") + " -CATALOG_NAME night.cat -o " + one + " -q");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const std::string text = slurp(fs::path(one) / "night.cat");
    EXPECT_EQ(text.rfind("#   1 NUMBER", 0), 0u)
        << "ASCII_HEAD, SExtractor's default type: " << text.substr(0, 200);
    EXPECT_NE(text.find("#   5 FLAGS"), std::string::npos);
    const nlohmann::json rep = nlohmann::json::parse(slurp(fs::path(one) / "a.report.json"));
    EXPECT_EQ(rep["outputs"]["sextractor"], (fs::path(one) / "night.cat").string());

    const std::string two = out / "two";
    const CliResult both =
        runCli("reduce " + (out / "a.fits") + " " + (out / "b.fits") + " --sex " + f.sex + " --param " +
               (f.dir / "my.param") + " -CATALOG_TYPE FITS_LDAC -CATALOG_NAME c.ldac " +
               "--formats ldac -o " + two + " -q");
    ASSERT_EQ(both.exitCode, 0) << both.err;
    for (const char* n : {"a.c.ldac", "b.c.ldac", "a.ldac", "b.ldac"}) {
        const std::string bytes = slurp(fs::path(two) / n);
        EXPECT_NE(bytes.find("LDAC_IMHEAD"), std::string::npos) << n;
        EXPECT_NE(bytes.find("LDAC_OBJECTS"), std::string::npos) << n;
    }
    EXPECT_FALSE(fs::exists(fs::path(two) / "c.ldac")) << "one name cannot hold two frames";

    std::ofstream(f.dir / "class.param") << "NUMBER\nCLASS_STAR\n";
    const CliResult refused = runCli("reduce " + (out / "a.fits") + " --sex " + f.sex + " --param " +
                                     (f.dir / "class.param") + " -o " + (out / "three") + " -q");
    EXPECT_EQ(refused.exitCode, 2);
    EXPECT_NE(refused.err.find("CLASS_STAR"), std::string::npos) << refused.err;
    EXPECT_FALSE(fs::exists(fs::path(out / "three") / "a.report.json")) << "refused before anything ran";
    const CliResult noParam = runCli("reduce " + (out / "a.fits") + " --sex " + f.sex + " --param " +
                                     (f.dir / "absent.param") + " -o " + (out / "four") + " -q");
    EXPECT_EQ(noParam.exitCode, 2);
    EXPECT_NE(noParam.err.find("absent.param"), std::string::npos) << noParam.err;
}

TEST(CliSextractor, LdacWithoutSexHasScampsColumns) {
    TempDir out("gpuphot_cli_ldac");
    ASSERT_EQ(runCli("simulate --size 256x256 --stars 40 --seed 3 -o " + out.str() + " --name s -q").exitCode,
              0);
    const CliResult r =
        runCli("reduce " + (out / "s.fits") + " --formats ldac --no-tycho2 -o " + out.str() + " -q");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const std::string bytes = slurp(out / "s.ldac");
    for (const char* c : {"XWIN_IMAGE", "ERRAWIN_IMAGE", "ERRTHETAWIN_IMAGE", "FLUX_AUTO", "FLUXERR_AUTO",
                          "FLAGS", "FLUX_RADIUS", "MAG_APER"})
        EXPECT_NE(bytes.find(c), std::string::npos) << c;
    EXPECT_EQ(bytes.find("VIGNET"), std::string::npos) << "VIGNET only when a .param asks for it";
}
