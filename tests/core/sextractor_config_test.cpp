// SExtractor configuration files read onto a PipelineConfig (core/pipeline/sextractor_config.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/sextractor_config.hpp"
#include "core/util/errors.hpp"
#include "tests/test_support.hpp"

using namespace gpuphot;

namespace {

std::string write(const test::TempDir& dir, const std::string& name, const std::string& text) {
    const std::string p = (dir / name);
    std::ofstream(p) << text;
    return p;
}

bool listed(const std::vector<std::string>& v, const std::string& prefix) {
    return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.rfind(prefix, 0) == 0; });
}

SextractorMapping applyText(const test::TempDir& dir, const std::string& text, PipelineConfig& c) {
    return applySextractorSettings(readSextractorSettings(write(dir, "t.sex", text)), c);
}

} // namespace

TEST(SextractorConfig, KeysMapOntoTheStages) {
    test::TempDir dir("gpuphot_sex");
    write(dir, "wide.conv", "CONV NONORM\n# a 3x3 box of 2s: sum 18\n2 2 2\n2 2 2\n2 2 2\n");
    PipelineConfig c;
    const SextractorMapping m = applyText(dir,
                                          "# tuned at the telescope\n"
                                          "DETECT_MINAREA   2        # px\n"
                                          "DETECT_THRESH    2.7\n"
                                          "ANALYSIS_THRESH  2.7\n"
                                          "FILTER           Y\n"
                                          "FILTER_NAME      wide.conv\n"
                                          "DEBLEND_NTHRESH  16\n"
                                          "DEBLEND_MINCONT  0.01\n"
                                          "CLEAN            N\n"
                                          "CLEAN_PARAM      1.5\n"
                                          "WEIGHT_TYPE      BACKGROUND\n"
                                          "PHOT_APERTURES   4,8, 12\n"
                                          "PHOT_AUTOPARAMS  2.0, 4.0\n"
                                          "SATUR_KEY        SATLEV\n"
                                          "GAIN_KEY         EGAIN\n"
                                          "BACK_SIZE        128,96\n"
                                          "BACK_FILTERSIZE  5\n"
                                          "BACK_FILTTHRESH  0.5\n"
                                          "BACKPHOTO_TYPE   GLOBAL\n"
                                          "CATALOG_NAME     night.ldac\n"
                                          "CATALOG_TYPE     fits_ldac\n",
                                          c);
    const DetectionParams& d = c.detection;
    EXPECT_EQ(d.minArea, 2);
    EXPECT_DOUBLE_EQ(d.threshold, 2.7 / 18.0) << "NONORM: the normalised kernel with threshold / sum";
    EXPECT_FALSE(d.thresholdIsAbsolute);
    EXPECT_TRUE(d.filter);
    EXPECT_EQ(d.filterKernelWidth, 3);
    EXPECT_EQ(d.filterKernel, std::vector<float>(9, 2.0f));
    EXPECT_EQ(d.deblendLevels, 16);
    EXPECT_DOUBLE_EQ(d.deblendContrast, 0.01);
    EXPECT_FALSE(d.clean);
    EXPECT_DOUBLE_EQ(d.cleanParam, 1.5);
    EXPECT_EQ(c.aperture.radii, (std::vector<double>{2.0, 4.0, 6.0})) << "diameters become radii";
    EXPECT_FALSE(c.aperture.radiiInFwhm);
    EXPECT_DOUBLE_EQ(c.aperture.kronFactor, 2.0);
    EXPECT_TRUE(c.aperture.kronPixelCentres) << "SExtractor sums whole pixels in the Kron ellipse";
    EXPECT_TRUE(c.aperture.centreOnBarycentre) << "apertures about X_IMAGE, Y_IMAGE";
    EXPECT_DOUBLE_EQ(c.aperture.kronMinRadius, 4.0);
    EXPECT_FALSE(c.aperture.useLocalSky);
    EXPECT_EQ(c.keywords.saturation, std::vector<std::string>{"SATLEV"});
    EXPECT_EQ(c.keywords.gain, std::vector<std::string>{"EGAIN"});
    EXPECT_EQ(c.background.meshSize, 128);
    EXPECT_EQ(c.background.meshHeight, 96);
    EXPECT_EQ(c.background.filterSize, 5);
    EXPECT_EQ(c.background.filterHeight, 0);
    EXPECT_DOUBLE_EQ(c.background.filterThreshold, 0.5);
    EXPECT_TRUE(c.background.sextractorSpline);
    EXPECT_EQ(m.catalog.name, "night.ldac");
    EXPECT_EQ(m.catalog.type, "FITS_LDAC");
    EXPECT_FALSE(m.writesCatalog) << "SExtractor's default.param is not beside the file";
    PipelineConfig c2;
    const SextractorMapping absent = applyText(dir, "PARAMETERS_NAME absent.param\n", c2);
    EXPECT_FALSE(absent.writesCatalog);
    EXPECT_TRUE(listed(absent.differences, "PARAMETERS_NAME absent.param: not found")) << absent.warning();
    EXPECT_TRUE(listed(m.differences, "PARAMETERS_NAME default.param")) << m.warning();
    EXPECT_FALSE(listed(m.differences, "WEIGHT_TYPE")) << "BACKGROUND is what the detection does";
    EXPECT_FALSE(c.background.uniformRms) << "WEIGHT_TYPE BACKGROUND: the RMS map";
    EXPECT_EQ(c.prepare.weightType, "none");
    EXPECT_TRUE(d.sextractorIso) << "SExtractor's isophotal barycentre, shape and area";
    EXPECT_FALSE(listed(m.differences, "ANALYSIS_THRESH"));
    EXPECT_TRUE(listed(m.applied, "DETECT_MINAREA 2 -> detection.minArea = 2"));
}

TEST(SextractorConfig, AbsentKeysTakeSextractorsDefaults) {
    test::TempDir dir("gpuphot_sex");
    PipelineConfig c;
    const SextractorMapping m = applyText(dir, "# nothing but a comment\n", c);
    EXPECT_EQ(c.detection.minArea, 5);
    EXPECT_DOUBLE_EQ(c.detection.threshold, 1.5);
    EXPECT_EQ(c.detection.filterKernel, (std::vector<float>{1, 2, 1, 2, 4, 2, 1, 2, 1})) << "default.conv";
    EXPECT_EQ(c.detection.deblendLevels, 32);
    EXPECT_EQ(c.aperture.radii, std::vector<double>{2.5}) << "PHOT_APERTURES 5 (a diameter)";
    EXPECT_FALSE(c.aperture.useLocalSky) << "BACKPHOTO_TYPE GLOBAL";
    EXPECT_EQ(c.background.meshSize, 64);
    EXPECT_TRUE(m.unsupported.empty());
    EXPECT_TRUE(c.background.uniformRms) << "WEIGHT_TYPE NONE: one global RMS";
    EXPECT_FALSE(listed(m.differences, "WEIGHT_TYPE")) << m.warning();
    EXPECT_TRUE(m.weightImage.empty());
}

TEST(SextractorConfig, OverridesWinAndUnsupportedKeysAreListedOnce) {
    test::TempDir dir("gpuphot_sex");
    SextractorSettings s = readSextractorSettings(
        write(dir, "t.sex",
              "DETECT_THRESH 1.5\nBACK_TYPE MANUAL\nBACK_VALUE 100\nDETECT_TYPE PHOTO\n"
              "PARAMETERS_NAME my.param\nSOME_FUTURE_KEY 3\nMAG_ZEROPOINT 25\n"
              "MEMORY_PIXSTACK 300000\nFILTER N\n"));
    addSextractorOverride(s, "DETECT_THRESH", "4");
    addSextractorOverride(s, "DETECT_MINAREA", " 9 ");
    addSextractorOverride(s, "CATALOG_TYPE", "FITS_LDAC");
    write(dir, "my.param", "NUMBER\n# a comment\nFLUX_APER(1)\n\nVIGNET(25,25)\n");
    EXPECT_THROW(addSextractorOverride(s, "detect_thresh", "4"), InvalidInput);
    PipelineConfig c;
    const SextractorMapping m = applySextractorSettings(s, c);
    EXPECT_DOUBLE_EQ(c.detection.threshold, 4.0);
    EXPECT_EQ(c.detection.minArea, 9);
    EXPECT_FALSE(c.detection.filter);
    EXPECT_TRUE(m.writesCatalog);
    EXPECT_EQ(m.catalog.type, "FITS_LDAC");
    EXPECT_EQ(m.catalog.name, "test.cat") << "SExtractor's default CATALOG_NAME";
    EXPECT_DOUBLE_EQ(m.catalog.magZeropoint, 25.0);
    ASSERT_EQ(m.catalog.params.size(), 3u) << "PARAMETERS_NAME found beside the file";
    EXPECT_EQ(m.catalog.params[2].text(), "VIGNET(25,25)");
    ASSERT_TRUE(c.background.manualLevel.has_value()) << "BACK_TYPE MANUAL";
    EXPECT_DOUBLE_EQ(*c.background.manualLevel, 100.0);
    for (const char* k : {"DETECT_TYPE PHOTO", "SOME_FUTURE_KEY 3"})
        EXPECT_EQ(std::count(m.unsupported.begin(), m.unsupported.end(), std::string(k)), 1) << k << "\n"
                                                                                             << m.warning();
    EXPECT_FALSE(listed(m.unsupported, "MEMORY_PIXSTACK")) << "no effect on the results: not a warning";
    EXPECT_TRUE(listed(m.applied, "MEMORY_PIXSTACK 300000 -> no effect here"));
    EXPECT_NE(m.warning().find("SOME_FUTURE_KEY"), std::string::npos);
}

TEST(SextractorConfig, MaskTypeChoosesHowNeighbourPixelsAreSummed) {
    test::TempDir dir("gpuphot_sex");
    const std::pair<const char*, NeighbourPixels> cases[] = {
        {"", NeighbourPixels::Correct}, // SExtractor's default
        {"MASK_TYPE NONE\n", NeighbourPixels::None},
        {"MASK_TYPE blank\n", NeighbourPixels::Blank},
        {"MASK_TYPE CORRECT\n", NeighbourPixels::Correct}};
    for (const auto& [text, want] : cases) {
        PipelineConfig c;
        const SextractorMapping m = applyText(dir, std::string("DETECT_THRESH 2\n") + text, c);
        EXPECT_EQ(c.aperture.neighbourPixels, want) << text;
        EXPECT_FALSE(listed(m.unsupported, "MASK_TYPE")) << m.warning();
    }
    EXPECT_EQ(PipelineConfig{}.aperture.neighbourPixels, NeighbourPixels::Sum) << "gpuphot's own default";
    PipelineConfig c;
    EXPECT_THROW(applyText(dir, "MASK_TYPE MIRROR\n", c), InvalidInput);
}

TEST(SextractorConfig, WeightMapsAreReadInPreparation) {
    test::TempDir dir("gpuphot_sex");
    write(dir, "w.fits", "not read here");
    PipelineConfig c;
    const SextractorMapping m = applyText(dir,
                                          "WEIGHT_TYPE MAP_VAR\nWEIGHT_IMAGE w.fits\nWEIGHT_THRESH 40\n"
                                          "RESCALE_WEIGHTS N\nWEIGHT_GAIN N\n",
                                          c);
    EXPECT_EQ(c.prepare.weightType, "map_var");
    EXPECT_DOUBLE_EQ(c.prepare.weightThreshold, 40.0);
    EXPECT_FALSE(c.prepare.rescaleWeights);
    EXPECT_FALSE(c.background.uniformRms);
    EXPECT_EQ(m.weightImage, (dir / "w.fits")) << "WEIGHT_IMAGE found beside the file";
    EXPECT_TRUE(m.unsupported.empty()) << m.warning();
    EXPECT_FALSE(listed(m.differences, "WEIGHT_GAIN")) << m.warning();
    PipelineConfig c2;
    const SextractorMapping g =
        applyText(dir, "WEIGHT_TYPE MAP_WEIGHT,MAP_WEIGHT\nWEIGHT_IMAGE w.fits\n", c2);
    EXPECT_EQ(c2.prepare.weightType, "map_weight");
    EXPECT_TRUE(c2.prepare.rescaleWeights) << "SExtractor's default RESCALE_WEIGHTS Y";
    EXPECT_TRUE(listed(g.differences, "WEIGHT_GAIN Y")) << g.warning();
    PipelineConfig c3;
    EXPECT_THROW(applyText(dir, "WEIGHT_TYPE MAP_RMS\nWEIGHT_IMAGE absent.fits\n", c3), InvalidInput);
    EXPECT_THROW(applyText(dir, "WEIGHT_TYPE MAP_RMS\n", c3), InvalidInput) << "SExtractor's weight.fits";
    EXPECT_THROW(applyText(dir, "WEIGHT_TYPE MAP_SIGMA\nWEIGHT_IMAGE w.fits\n", c3), InvalidInput);
}

TEST(SextractorConfig, FlagImagesAreReadWhenTheirParametersAreAsked) {
    test::TempDir dir("gpuphot_sex");
    write(dir, "f.param", "NUMBER\nIMAFLAGS_ISO(2)\nNIMAFLAGS_ISO\n");
    write(dir, "plain.param", "NUMBER\n");
    write(dir, "a.fits", "x");
    write(dir, "b.fits", "x");
    PipelineConfig c;
    const SextractorMapping m =
        applyText(dir, "PARAMETERS_NAME f.param\nFLAG_IMAGE a.fits,b.fits\nFLAG_TYPE max\n", c);
    EXPECT_EQ(m.catalog.flagImages, (std::vector<std::string>{dir / "a.fits", dir / "b.fits"}));
    EXPECT_EQ(m.catalog.flagTypes, (std::vector<std::string>{"MAX", "MAX"})) << "one type for every image";
    PipelineConfig c2;
    const SextractorMapping plain =
        applyText(dir, "PARAMETERS_NAME plain.param\nFLAG_IMAGE absent.fits\n", c2);
    EXPECT_TRUE(plain.catalog.flagImages.empty()) << "not read unless IMAFLAGS_ISO is asked for";
    EXPECT_TRUE(listed(plain.applied, "FLAG_IMAGE absent.fits -> no effect here"));
    PipelineConfig c3;
    EXPECT_THROW(applyText(dir, "PARAMETERS_NAME f.param\nFLAG_IMAGE absent.fits\n", c3), InvalidInput);
    EXPECT_THROW(applyText(dir, "PARAMETERS_NAME f.param\nFLAG_IMAGE a.fits\nFLAG_TYPE XOR\n", c3),
                 InvalidInput);
}

TEST(SextractorConfig, SurfaceBrightnessThresholdNeedsAPixelScale) {
    test::TempDir dir("gpuphot_sex");
    PipelineConfig c;
    applyText(dir, "DETECT_THRESH 24.0,30.0\nPIXEL_SCALE 0.5\nFILTER N\n", c);
    EXPECT_TRUE(c.detection.thresholdIsAbsolute);
    EXPECT_NEAR(c.detection.threshold, std::pow(10.0, 2.4) * 0.25, 1e-9); // ADU per pixel
    PipelineConfig c2;
    EXPECT_THROW(applyText(dir, "DETECT_THRESH 24.0,30.0\nPIXEL_SCALE 0\n", c2), InvalidInput);
}

TEST(SextractorConfig, BadInputIsRefusedNamingKeyAndFile) {
    test::TempDir dir("gpuphot_sex");
    auto refusal = [&](const std::string& text) {
        PipelineConfig c;
        try {
            applyText(dir, text, c);
        } catch (const InvalidInput& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    const std::string minArea = refusal("DETECT_MINAREA five\n");
    EXPECT_NE(minArea.find("DETECT_MINAREA"), std::string::npos) << minArea;
    EXPECT_NE(minArea.find("t.sex"), std::string::npos) << minArea;
    EXPECT_NE(refusal("CLEAN maybe\n").find("CLEAN"), std::string::npos);
    EXPECT_NE(refusal("detect_thresh 3\n").find("line 1"), std::string::npos);
    EXPECT_NE(refusal("FILTER_NAME nowhere.conv\n").find("nowhere.conv"), std::string::npos);
    EXPECT_NE(refusal("FILTER_NAME psf.fits\n").find("neural-network retina"), std::string::npos);
    EXPECT_NE(refusal("PHOT_APERTURES 5,-2\n").find("PHOT_APERTURES"), std::string::npos);
    const std::string range = refusal("PHOT_AUTOPARAMS 2.5,-1\n"); // the table's range, as --config's
    EXPECT_NE(range.find("PHOT_AUTOPARAMS in "), std::string::npos) << range;
    EXPECT_NE(range.find("aperture.kronMinRadius"), std::string::npos) << range;
    EXPECT_NE(refusal("DEBLEND_MINCONT 5\n").find("DEBLEND_MINCONT"), std::string::npos);
    EXPECT_NE(refusal("BACKPHOTO_TYPE SOMETIMES\n").find("BACKPHOTO_TYPE"), std::string::npos);
    write(dir, "even.conv", "CONV NORM\n1 1\n1 1\n");
    EXPECT_NE(refusal("FILTER_NAME even.conv\n").find("odd sizes"), std::string::npos);
    write(dir, "ragged.conv", "CONV NORM\n1 2 1\n2 4\n1 2 1\n");
    EXPECT_NE(refusal("FILTER_NAME ragged.conv\n").find("rows of"), std::string::npos);
    write(dir, "nohead.conv", "1 2 1\n2 4 2\n1 2 1\n");
    EXPECT_NE(refusal("FILTER_NAME nohead.conv\n").find("CONV NORM"), std::string::npos);
    EXPECT_THROW(readSextractorSettings((dir / "absent.sex")), InvalidInput);
    write(dir, "class.param", "NUMBER\nCLASS_STAR\nMU_MAX\nVIGNET\n");
    const std::string cls = refusal("PARAMETERS_NAME class.param\n");
    EXPECT_NE(cls.find("CLASS_STAR: gpuphot has no star/galaxy classifier"), std::string::npos) << cls;
    EXPECT_NE(cls.find("MU_MAX: not available"), std::string::npos) << cls;
    EXPECT_NE(cls.find("VIGNET: needs a size"), std::string::npos) << cls;
    write(dir, "bad.param", "NUMBER\nFLUX_APER(3\n");
    EXPECT_NE(refusal("PARAMETERS_NAME bad.param\n").find("bad.param:2"), std::string::npos);
    write(dir, "ok.param", "NUMBER\n");
    EXPECT_NE(refusal("PARAMETERS_NAME ok.param\nCATALOG_TYPE FITS_1.0\n").find("CATALOG_TYPE FITS_1.0"),
              std::string::npos);
    EXPECT_NE(refusal("PHOT_FLUXFRAC 0.5,1.5\n").find("PHOT_FLUXFRAC"), std::string::npos);
    const std::string three = refusal("DETECT_THRESH 1.5,24,30\n");
    EXPECT_NE(three.find("DETECT_THRESH"), std::string::npos) << three;
    EXPECT_NE(three.find("3 values"), std::string::npos) << three;
    const std::string noFilter = refusal("FILTER Y\nFILTER_NAME\n");
    EXPECT_NE(noFilter.find("FILTER_NAME"), std::string::npos) << noFilter;
    EXPECT_NE(noFilter.find("no file given"), std::string::npos) << noFilter;
}

// Debian's source-extractor ships its default configuration and filters: they read without error and
// give SExtractor's own settings.
TEST(SextractorConfig, DebiansDefaultFilesRead) {
    const std::filesystem::path share = "/usr/share/source-extractor";
    if (!std::filesystem::exists(share / "default.sex")) GTEST_SKIP() << "source-extractor is not installed";
    PipelineConfig c;
    const SextractorMapping m =
        applySextractorSettings(readSextractorSettings((share / "default.sex").string()), c);
    EXPECT_EQ(c.detection.minArea, 3)
        << "Debian's default.sex (2.12.4's) says 3; SExtractor's built-in default is 5";
    EXPECT_EQ(c.detection.filterKernelWidth, 3);
    EXPECT_FALSE(m.writesCatalog) << "Debian's default.param has every parameter commented out";
    EXPECT_TRUE(listed(m.differences, "PARAMETERS_NAME default.param names no parameter")) << m.warning();
    for (const char* f : {"gauss_4.0_7x7.conv", "tophat_3.0_3x3.conv", "mexhat_2.0_7x7.conv"}) {
        const ConvFilter k = readConvFilter((share / f).string());
        EXPECT_EQ(k.width * k.height, static_cast<int>(k.kernel.size())) << f;
        EXPECT_EQ(k.width % 2, 1) << f;
    }
}
