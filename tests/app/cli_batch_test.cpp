// gpuphot reduce with many frames: one JSON line per frame, a bad frame fails alone, re-runs skip complete
// frames (--force redoes), -j 2 gives the catalogs -j 1 gives, a worker that dies costs only its frame,
// and list files, directories and globs as inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/frame_status.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

constexpr int kFrames = 4;

// Four small simulated frames (different seeds), simulated once; the directory holds only the frames.
const TempDir& frameDir() {
    static TempDir sim("gpuphot_batch_sim");
    static TempDir frames("gpuphot_batch_frames");
    static bool done = [] {
        for (int i = 1; i <= kFrames; ++i) {
            const std::string name = "f" + std::to_string(i);
            const CliResult r = runCli("simulate --size 256x256 --stars 60 --seed " + std::to_string(10 + i) +
                                       " -o " + sim.str() + " --name " + name + " -q");
            EXPECT_EQ(r.exitCode, 0) << r.err;
            fs::copy_file(sim / (name + ".fits"), frames / (name + ".fits"));
        }
        return true;
    }();
    (void)done;
    return frames;
}

std::string frame(int i) { return frameDir() / ("f" + std::to_string(i) + ".fits"); }

std::string allFrames() {
    std::string s;
    for (int i = 1; i <= kFrames; ++i) s += frame(i) + " ";
    return s;
}

// Status lines by frame path; a frame listed twice fails the test.
std::map<std::string, nlohmann::json> byFrame(const std::vector<nlohmann::json>& lines) {
    std::map<std::string, nlohmann::json> out;
    for (const auto& j : lines) {
        const std::string f = j.value("frame", "");
        EXPECT_FALSE(out.count(f)) << "two lines for " << f;
        out[f] = j;
    }
    return out;
}

// Every column of two catalogs compared bitwise (memcmp of the doubles), plus the row count.
void expectSameCatalog(const std::string& a, const std::string& b) {
    const Table ta = readFitsTable(a), tb = readFitsTable(b);
    ASSERT_EQ(ta.rows(), tb.rows()) << a;
    ASSERT_EQ(ta.columns().size(), tb.columns().size());
    for (std::size_t c = 0; c < ta.columns().size(); ++c) {
        const std::string name = ta.columns()[c].name;
        const auto da = ta.doubles(name), db = tb.doubles(name);
        ASSERT_EQ(da.size(), db.size());
        EXPECT_EQ(0, std::memcmp(da.data(), db.data(), da.size() * sizeof(double))) << a << " column " << name;
    }
}

} // namespace

TEST(CliBatch, OneBadFrameFailsAloneAndEveryFrameHasOneJsonLine) {
    TempDir out("gpuphot_batch_out");
    const std::string bad = out / "bad.fits"; // a text file named .fits
    {
        std::ofstream f(bad);
        f << "this is not a FITS file\n";
    }
    const CliResult r = runCli("reduce " + frame(1) + " " + bad + " " + frame(2) + " " + frame(3) + " -o " + out.str());
    EXPECT_EQ(r.exitCode, 1) << r.err;
    EXPECT_NE(r.err.find("bad.fits"), std::string::npos) << "the bad frame is reported: " << r.err;
    // More than one frame: the JSON lines go to OUTDIR/gpuphot.jsonl by default.
    std::size_t malformed = 99;
    const auto lines = readJsonLines(out / "gpuphot.jsonl", &malformed);
    EXPECT_EQ(malformed, 0u);
    ASSERT_EQ(lines.size(), 4u);
    const auto m = byFrame(lines);
    ASSERT_TRUE(m.count(bad));
    EXPECT_EQ(m.at(bad)["status"], "failed");
    EXPECT_NE(m.at(bad)["exit_code"].get<int>(), 0);
    EXPECT_FALSE(m.at(bad).value("error", "").empty());
    EXPECT_FALSE(fs::exists(out / "bad.cat.fits"));
    for (int i = 1; i <= 3; ++i) {
        const auto& j = m.at(frame(i));
        EXPECT_EQ(j["status"], "ok") << j.dump();
        EXPECT_EQ(j["exit_code"], 0);
        const std::string cat = out / ("f" + std::to_string(i) + ".cat.fits");
        EXPECT_EQ(j["outputs"]["catalog"].get<std::string>(), cat);
        // The line's counts are the catalog's.
        EXPECT_EQ(j["sources"].get<std::size_t>(), readFitsTable(cat).rows());
        EXPECT_GT(j["fwhm"].get<double>(), 1.0);
    }
    // The summary table names every frame with its status.
    EXPECT_NE(r.out.find("f2.fits"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("failed"), std::string::npos) << r.out;
}

TEST(CliBatch, RerunSkipsCompleteFramesAndForceRedoesThem) {
    TempDir out("gpuphot_batch_rerun");
    ASSERT_EQ(runCli("reduce " + allFrames() + " -q -o " + out.str() + " --jsonl " + (out / "1.jsonl")).exitCode, 0);
    const auto reportTime = fs::last_write_time(out / "f1.report.json");
    const CliResult again = runCli("reduce " + allFrames() + " -q -o " + out.str() + " --jsonl " + (out / "2.jsonl"));
    EXPECT_EQ(again.exitCode, 0) << again.err;
    const auto second = readJsonLines(out / "2.jsonl");
    ASSERT_EQ(second.size(), static_cast<std::size_t>(kFrames));
    for (const auto& j : second) {
        EXPECT_EQ(j["status"], "skipped") << j.dump();
        EXPECT_TRUE(fs::exists(j["report"].get<std::string>()));
    }
    EXPECT_EQ(fs::last_write_time(out / "f1.report.json"), reportTime) << "a skipped frame is not rewritten";

    // A frame newer than its outputs is redone; the others are still skipped.
    fs::last_write_time(out / "f1.report.json", reportTime - std::chrono::hours(1));
    const auto third = byFrame([&] {
        EXPECT_EQ(runCli("reduce " + allFrames() + " -q -o " + out.str() + " --jsonl " + (out / "3.jsonl")).exitCode, 0);
        return readJsonLines(out / "3.jsonl");
    }());
    EXPECT_EQ(third.at(frame(1))["status"], "ok");
    EXPECT_EQ(third.at(frame(2))["status"], "skipped");

    const CliResult forced = runCli("reduce " + allFrames() + " --force -q -o " + out.str() + " --jsonl " + (out / "4.jsonl"));
    EXPECT_EQ(forced.exitCode, 0) << forced.err;
    const auto fourth = readJsonLines(out / "4.jsonl");
    ASSERT_EQ(fourth.size(), static_cast<std::size_t>(kFrames));
    for (const auto& j : fourth) EXPECT_EQ(j["status"], "ok") << j.dump();
}

TEST(CliBatch, TwoWorkerProcessesGiveTheCatalogsOfOne) {
    TempDir one("gpuphot_batch_j1"), two("gpuphot_batch_j2");
    const CliResult r1 = runCli("reduce " + allFrames() + " -j 1 -q -o " + one.str());
    const CliResult r2 = runCli("reduce " + allFrames() + " -j 2 -q -o " + two.str());
    ASSERT_EQ(r1.exitCode, 0) << r1.err;
    ASSERT_EQ(r2.exitCode, 0) << r2.err;
    const auto lines = readJsonLines(two / "gpuphot.jsonl");
    ASSERT_EQ(lines.size(), static_cast<std::size_t>(kFrames));
    for (const auto& j : lines) EXPECT_EQ(j["status"], "ok");
    for (int i = 1; i <= kFrames; ++i) {
        const std::string cat = "f" + std::to_string(i) + ".cat.fits";
        expectSameCatalog(one / cat, two / cat);
    }
}

TEST(CliBatch, AWorkerThatDiesCostsOnlyItsFrame) {
    TempDir out("gpuphot_batch_crash");
    // Test hook (gpuphot-testhooks): a batch child aborts (SIGABRT, as a crash) on a frame whose name
    // contains "f2".
    const CliResult r = runCli("reduce " + allFrames() + " -j 2 -q -o " + out.str(),
                               "GPUPHOT_NO_TYCHO2=1 GPUPHOT_TEST_BATCH_CHILD_ABORT_ON=f2", GPUPHOT_CLI_TESTHOOKS);
    EXPECT_EQ(r.exitCode, 1) << r.err;
    const auto m = byFrame(readJsonLines(out / "gpuphot.jsonl"));
    ASSERT_EQ(m.size(), static_cast<std::size_t>(kFrames));
    EXPECT_EQ(m.at(frame(2))["status"], "failed");
    EXPECT_NE(m.at(frame(2)).value("error", "").find("signal"), std::string::npos) << m.at(frame(2)).dump();
    EXPECT_FALSE(fs::exists(out / "f2.cat.fits"));
    EXPECT_FALSE(fs::exists(out / "f2.report.json"));
    for (int i : {1, 3, 4}) {
        EXPECT_EQ(m.at(frame(i))["status"], "ok") << m.at(frame(i)).dump();
        EXPECT_TRUE(fs::exists(out / ("f" + std::to_string(i) + ".report.json")));
    }
    // No half-written file under a final name, and no temporary left behind by the dead worker's frame.
    for (const auto& e : fs::directory_iterator(out.path))
        EXPECT_EQ(e.path().filename().string().rfind("f2.", 0), std::string::npos) << e.path();
}

TEST(CliBatch, ListFileDirectoryAndQuotedGlobAsInputs) {
    TempDir out("gpuphot_batch_inputs");
    const std::string list = out / "frames.txt";
    {
        std::ofstream f(list);
        f << "# tonight's frames\n" << frame(3) << "\n\n  " << frame(1) << "  # first one\n";
    }
    CliResult r = runCli("reduce @" + list + " -q -o " + out.str() + " --jsonl " + (out / "list.jsonl"));
    ASSERT_EQ(r.exitCode, 0) << r.err;
    auto m = byFrame(readJsonLines(out / "list.jsonl"));
    EXPECT_EQ(m.size(), 2u);
    EXPECT_TRUE(m.count(frame(1)) && m.count(frame(3)));

    r = runCli("reduce --list " + list + " -q -o " + out.str() + " --jsonl " + (out / "list2.jsonl"));
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_EQ(readJsonLines(out / "list2.jsonl").size(), 2u);

    r = runCli("reduce " + frameDir().str() + " --force -q -o " + out.str() + " --jsonl " + (out / "dir.jsonl"));
    ASSERT_EQ(r.exitCode, 0) << r.err;
    m = byFrame(readJsonLines(out / "dir.jsonl"));
    EXPECT_EQ(m.size(), static_cast<std::size_t>(kFrames));
    for (int i = 1; i <= kFrames; ++i) EXPECT_TRUE(m.count(fs::path(frame(i)).string())) << frame(i);

    r = runCli("reduce '" + (frameDir() / "f[12].fits") + "' -q -o " + out.str() + " --jsonl " + (out / "glob.jsonl"));
    ASSERT_EQ(r.exitCode, 0) << r.err;
    m = byFrame(readJsonLines(out / "glob.jsonl"));
    EXPECT_EQ(m.size(), 2u);
    EXPECT_TRUE(m.count(frame(1)) && m.count(frame(2)));

    r = runCli("reduce '" + (frameDir() / "nothing*.fits") + "' -q -o " + out.str());
    EXPECT_EQ(r.exitCode, 2) << "a glob matching nothing is an input error";
    EXPECT_NE(r.err.find("nothing*"), std::string::npos) << r.err;
}

TEST(CliBatch, OneFrameWithJsonlWritesOneLineAndKeepsTheExitCode) {
    TempDir out("gpuphot_batch_one");
    CliResult r = runCli("reduce " + frame(4) + " -q -o " + out.str() + " --jsonl " + (out / "s.jsonl"));
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const auto lines = readJsonLines(out / "s.jsonl");
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["status"], "ok");
    EXPECT_FALSE(fs::exists(out / "gpuphot.jsonl")) << "one frame without --jsonl writes no JSON lines";
    r = runCli("reduce " + (out / "missing.fits") + " -q -o " + out.str() + " --jsonl " + (out / "s.jsonl"));
    EXPECT_NE(r.exitCode, 0);
    EXPECT_NE(r.exitCode, 1) << "a single frame keeps the CLI's exit code for its error (2 or 3)";
    const auto after = readJsonLines(out / "s.jsonl");
    ASSERT_EQ(after.size(), 2u);
    EXPECT_EQ(after[1]["status"], "failed");
    EXPECT_EQ(after[1]["exit_code"].get<int>(), r.exitCode);
}
