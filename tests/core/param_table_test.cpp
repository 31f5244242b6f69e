// The parameter tables (core/pipeline/param_table.hpp): every Params field declared, the JSON made from
// them, the checks made when a configuration is read, the stage a change invalidates, docs/CONFIG.md.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "core/pipeline/param_table.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/pipeline_config.hpp"

namespace gpuphot {
namespace {

// The distinct members a table (or the part of it under `prefix.`) names.
std::size_t membersIn(const std::vector<ParamDef>& defs, const std::string& prefix = "") {
    std::set<std::string> members;
    for (const ParamDef& d : defs) {
        if (!prefix.empty() && d.key.rfind(prefix + ".", 0) != 0) continue;
        const std::string rest = prefix.empty() ? d.key : d.key.substr(prefix.size() + 1);
        members.insert(rest.substr(0, rest.find('.')));
    }
    return members.size();
}

TEST(ParamTable, EveryFieldOfEveryParamsStructIsDeclared) {
    EXPECT_EQ(aggregateFieldCount<BackgroundParams>(), membersIn(params::background()));
    EXPECT_EQ(aggregateFieldCount<DetectionParams>(), membersIn(params::detection()));
    EXPECT_EQ(aggregateFieldCount<PsfParams>(), membersIn(params::psf()));
    EXPECT_EQ(aggregateFieldCount<ApertureParams>(), membersIn(params::aperture()));
    EXPECT_EQ(aggregateFieldCount<CrossmatchParams>(), membersIn(params::crossmatch()));
    EXPECT_EQ(aggregateFieldCount<ZeroPointParams>(), membersIn(params::zeropoint()));
    EXPECT_EQ(aggregateFieldCount<AstrometryParams>(), membersIn(params::astrometry()));
    EXPECT_EQ(aggregateFieldCount<PrepareParams>(), membersIn(params::prepare()));
    EXPECT_EQ(aggregateFieldCount<CosmicRayParams>(), membersIn(params::prepare(), "cosmic"));
    EXPECT_EQ(aggregateFieldCount<SaltPepperParams>(), membersIn(params::prepare(), "saltPepperParams"));
    EXPECT_EQ(aggregateFieldCount<BayerParams>(), membersIn(params::prepare(), "bayerParams"));
    EXPECT_EQ(aggregateFieldCount<InstrumentOverrides>(), membersIn(params::instrumentOverrides()));
    EXPECT_EQ(aggregateFieldCount<InstrumentKeywords>(), membersIn(params::instrumentKeywords()));
    EXPECT_EQ(aggregateFieldCount<PipelineConfig>(), membersIn(paramTable()));
}

TEST(ParamTable, FieldCountSeesAnAddedField) {
    struct Two {
        int a = 0;
        double b = 1;
    };
    struct Three {
        int a = 0;
        std::vector<double> b;
        std::string c;
    };
    EXPECT_EQ(aggregateFieldCount<Two>(), 2u);
    EXPECT_EQ(aggregateFieldCount<Three>(), 3u);
    EXPECT_EQ(aggregateFieldCount<PrepareParams>() + 0, membersIn(params::prepare()));
}

TEST(ParamTable, EveryEntryIsDescribed) {
    std::set<std::string> keys;
    for (const ParamDef& d : paramTable()) {
        EXPECT_TRUE(keys.insert(d.key).second) << "declared twice: " << d.key;
        if (d.access == ParamAccess::Internal) continue;
        EXPECT_FALSE(d.help.empty()) << d.key;
        if (d.access == ParamAccess::Editable) {
            EXPECT_FALSE(d.label.empty()) << d.key;
        }
        EXPECT_LE(d.min, d.max) << d.key;
        EXPECT_FALSE(d.group.empty()) << d.key;
    }
}

TEST(ParamTable, JsonRoundTripsAndKeepsItsSpellings) {
    PipelineConfig c;
    c.detection.threshold = 2.25;
    c.aperture.radii = {1.5, 2.5};
    c.zeropoint.magFaint = 18.0;
    c.crossmatch.refMagBright = 9.0;
    c.instrument.gain = 1.7;
    c.keywords.gain = {"EGAIN"};
    c.prepare.cosmic.sigclip = 5.5;
    const nlohmann::json j = c;
    EXPECT_EQ(j.at("zeropoint").at("magBright"), "-inf");     // infinity as a string
    EXPECT_FALSE(j.at("crossmatch").contains("refMagFaint")); // NaN: left out
    EXPECT_TRUE(j.at("aperture").at("saturation").is_null()); // infinity: null
    EXPECT_FALSE(j.at("detection").contains("saturationLevel"));
    EXPECT_FALSE(j.at("aperture").contains("cogStarScale")); // internal
    EXPECT_TRUE(j.at("instrument").is_object());
    const PipelineConfig back = j.get<PipelineConfig>();
    EXPECT_EQ(nlohmann::json(back), j);
    EXPECT_EQ(back.detection.threshold, 2.25);
    EXPECT_EQ(back.prepare.cosmic.sigclip, 5.5);
    EXPECT_EQ(back.keywords.gain, std::vector<std::string>{"EGAIN"});
    EXPECT_EQ(nlohmann::json(PipelineConfig{}).get<PipelineConfig>().zeropoint.magBright,
              -std::numeric_limits<double>::infinity());
}

void expectRejected(const std::string& text, const std::string& named) {
    PipelineConfig c;
    try {
        applyPipelineConfig(c, nlohmann::json::parse(text), "test");
        ADD_FAILURE() << text << " was accepted";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
}

TEST(ParamTable, ReadingChecksKeysTypesRangesAndChoices) {
    expectRejected(R"({"detection": {"treshold": 2}})", "detection.treshold");
    expectRejected(R"({"detection": {"threshold": "high"}})", "detection.threshold");
    expectRejected(R"({"detection": {"minArea": 2.5}})", "detection.minArea");
    expectRejected(R"({"prepare": {"bleedFraction": 1.5}})", "prepare.bleedFraction");
    expectRejected(R"({"prepare": {"bayer": "rgb"}})", "prepare.bayer");
    expectRejected(R"({"aperture": {"skyEstimator": "mode2"}})", "aperture.skyEstimator");
    expectRejected(R"({"crossmatch": {"index": 3}})", "crossmatch.index");
    expectRejected(R"({"zeropoint": {"magBright": "bright"}})", "zeropoint.magBright");
    expectRejected(R"({"prepare": {"cosmic": {"niter": 0}}})", "prepare.cosmic.niter");
    expectRejected(R"({"instrument": {"gain": "x"}})", "instrument.gain");
    expectRejected(R"({"background": 3})", "background");
    // A rejected configuration changes nothing.
    PipelineConfig c;
    EXPECT_THROW(applyPipelineConfig(
                     c, nlohmann::json::parse(R"({"detection": {"threshold": 3, "minArea": -1}})"), "t"),
                 InvalidInput);
    EXPECT_EQ(c.detection.threshold, PipelineConfig{}.detection.threshold);
    // A stage's own from_json checks too.
    EXPECT_THROW(nlohmann::json::parse(R"({"minArea": 0})").get<DetectionParams>(), InvalidInput);
    EXPECT_EQ(nlohmann::json::parse(R"({"minArea": 9})").get<DetectionParams>().minArea, 9);
}

TEST(ParamTable, EachStagesJsonIsItsTables) {
    const nlohmann::json all = PipelineConfig{};
    EXPECT_EQ(nlohmann::json(PipelineConfig{}.psf), all.at("psf"));
    EXPECT_EQ(nlohmann::json(PipelineConfig{}.background), all.at("background"));
    EXPECT_EQ(nlohmann::json(PipelineConfig{}.astrometry), all.at("astrometry"));
    EXPECT_EQ(nlohmann::json(PipelineConfig{}.prepare), all.at("prepare"));
    EXPECT_THROW(nlohmann::json::parse(R"({"meshSize": 0})").get<BackgroundParams>(), InvalidInput);
    EXPECT_THROW(nlohmann::json::parse(R"({"model": "airy"})").get<PsfParams>(), InvalidInput);
    EXPECT_THROW(nlohmann::json::parse(R"({"maxSipOrder": 12})").get<AstrometryParams>(), InvalidInput);
    EXPECT_EQ(nlohmann::json::parse(R"({"polyOrder": 1})").get<PsfParams>().polyOrder, 1);
}

TEST(ParamTable, AChangeReRunsFromTheStageItsTableNames) {
    const PipelineConfig a;
    PipelineConfig b = a;
    EXPECT_EQ(firstAffectedStage(a, b), Stage::Done);
    b.zeropoint.minSnr = 7;
    EXPECT_EQ(firstAffectedStage(a, b), Stage::Calibration);
    b.aperture.cogStep = 0.05;
    EXPECT_EQ(firstAffectedStage(a, b), Stage::Aperture);
    b.defaultFwhm = 4;
    EXPECT_EQ(firstAffectedStage(a, b), Stage::Psf);
    b.detection.windowTolerance = 1e-3;
    EXPECT_EQ(firstAffectedStage(a, b), Stage::Detection);
    PipelineConfig p = a;
    p.prepare.cosmics = true;
    EXPECT_EQ(firstAffectedStage(a, p), Stage::Background);
    PipelineConfig k = a;
    k.keywords.exptime = {"ITIME"};
    EXPECT_EQ(firstAffectedStage(a, k), Stage::Background);
}

TEST(ParamTable, ConfigDocIsWhatTheTablesProduce) {
    const std::string path = std::string(GPUPHOT_TEST_DATA) + "/../../docs/CONFIG.md";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    for (const auto& [group, title] : paramGroups())
        EXPECT_NE(text.find("<!-- params:" + group + " -->"), std::string::npos) << "no table for " << group;
    const std::string expected = regenerateConfigDoc(text);
    if (expected != text) {
        std::ofstream("CONFIG.md.expected") << expected;
        ADD_FAILURE() << "docs/CONFIG.md differs from the parameter tables: the regenerated file is "
                         "CONFIG.md.expected in the test's working directory (copy it over docs/CONFIG.md)";
    }
}

} // namespace
} // namespace gpuphot
