// gpuphot watch: frames present at start, a frame written slowly in two halves and one arriving by rename
// are each reduced once; the half-written state never gives a failure; SIGTERM stops it cleanly.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/frame_status.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

// Three small simulated frames, simulated once (w1..w3.fits in their own directory).
const TempDir& simDir() {
    static TempDir sim("gpuphot_watch_sim");
    static bool done = [] {
        for (int i = 1; i <= 3; ++i) {
            const CliResult r = runCli("simulate --size 256x256 --stars 50 --seed " + std::to_string(30 + i) +
                                       " -o " + sim.str() + " --name w" + std::to_string(i) + " -q");
            EXPECT_EQ(r.exitCode, 0) << r.err;
        }
        return true;
    }();
    (void)done;
    return sim;
}

void sleepSeconds(double s) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

std::string readAll(const std::string& path) {
    return slurp(path);
}

} // namespace

TEST(CliWatch, ReducesPresentSlowlyWrittenAndRenamedFramesOnceEach) {
    const TempDir& sim = simDir();
    TempDir watch("gpuphot_watch_in"), out("gpuphot_watch_out");
    fs::copy_file(sim / "w1.fits", watch / "w1.fits"); // present at start
    const std::string log = out / "watch.log";
    const pid_t pid =
        startCli("watch " + watch.str() + " -o " + out.str() + " --settle 0.3 --timeout 60", log);
    for (int i = 0; i < 200 && readAll(log).find("watching") == std::string::npos; ++i)
        sleepSeconds(0.05);

    // w2: written in two halves with a pause longer than --settle in between (a slow camera).
    const std::string bytes = readAll(sim / "w2.fits");
    {
        std::ofstream f(watch / "w2.fits", std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
    }
    sleepSeconds(1.2);
    {
        std::ofstream f(watch / "w2.fits", std::ios::binary | std::ios::app);
        f.write(bytes.data() + bytes.size() / 2,
                static_cast<std::streamsize>(bytes.size() - bytes.size() / 2));
    }
    // w3: written under a hidden temporary name, then renamed into place.
    fs::copy_file(sim / "w3.fits", watch / ".w3.fits.part");
    fs::rename(watch / ".w3.fits.part", watch / "w3.fits");

    // Stop it (SIGTERM, after the current frame) once three lines are in, or after 30 s.
    for (int i = 0; i < 600 && readJsonLines(out / "gpuphot.jsonl").size() < 3; ++i)
        sleepSeconds(0.05);
    sleepSeconds(0.5); // a fourth (duplicate) line would come now
    ::kill(pid, SIGTERM);
    const int rc = waitCli(pid, 30.0);
    EXPECT_EQ(rc, 0) << readAll(log);
    const auto lines = readJsonLines(out / "gpuphot.jsonl");
    std::map<std::string, int> count;
    for (const auto& j : lines) {
        EXPECT_EQ(j["status"], "ok") << "no failure line, not even for the half-written state: " << j.dump();
        ++count[fs::path(j.value("frame", "")).filename().string()];
    }
    EXPECT_EQ(lines.size(), 3u) << readAll(log);
    for (const char* f : {"w1.fits", "w2.fits", "w3.fits"})
        EXPECT_EQ(count[f], 1) << f << " reduced once";
    // The slowly written frame was reduced from its complete bytes: its catalog is the one of the original.
    TempDir refOut("gpuphot_watch_ref");
    ASSERT_EQ(runCli("reduce " + (sim / "w2.fits") + " -q -o " + refOut.str()).exitCode, 0);
    const Table a = readFitsTable(out / "w2.cat.fits"), b = readFitsTable(refOut / "w2.cat.fits");
    ASSERT_EQ(a.rows(), b.rows());
    for (const auto& c : a.columns()) {
        const auto da = a.doubles(c.name), db = b.doubles(c.name);
        EXPECT_EQ(0, std::memcmp(da.data(), db.data(), da.size() * sizeof(double))) << c.name;
    }
    for (const char* f : {"w1", "w2", "w3"})
        EXPECT_TRUE(fs::exists(out / (std::string(f) + ".cat.fits"))) << f;
    // One line per frame on stdout.
    const std::string text = readAll(log);
    for (const char* f : {"w1.fits:", "w2.fits:", "w3.fits:"})
        EXPECT_NE(text.find(f), std::string::npos) << text;
}

TEST(CliWatch, OnceReducesPresentFramesThenSkipsThemAndSigtermStopsCleanly) {
    const TempDir& sim = simDir();
    TempDir watch("gpuphot_watch_once"), out("gpuphot_watch_once_out");
    fs::copy_file(sim / "w1.fits", watch / "w1.fits");
    {
        std::ofstream f(watch / "notes.txt");
        f << "not a frame\n";
    }
    const std::string db = out / "night.sqlite";
    CliResult r = runCli("watch " + watch.str() + " -o " + out.str() + " --settle 0.1 --once -q --db " + db);
    ASSERT_EQ(r.exitCode, 0) << r.err;
    auto lines = readJsonLines(out / "gpuphot.jsonl");
    ASSERT_EQ(lines.size(), 1u) << "only files matching --pattern '*.fits'";
    EXPECT_EQ(lines[0]["status"], "ok");
    // --db: the frame is in the database too.
    r = runCli("query --db " + db + " --format csv frames");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    EXPECT_NE(r.out.find("w1.fits"), std::string::npos) << r.out;
    // Same skip rule as reduce: outputs complete and newer than the frame.
    r = runCli("watch " + watch.str() + " -o " + out.str() + " --settle 0.1 --once -q");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    lines = readJsonLines(out / "gpuphot.jsonl");
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(lines[1]["status"], "skipped");

    // SIGTERM: stops after the current frame with exit status 0.
    const std::string log = out / "term.log";
    const pid_t pid = startCli("watch " + watch.str() + " -o " + out.str() + " --timeout 30", log);
    // Wait until it is watching (its signal handlers are in place by then).
    for (int i = 0; i < 200 && readAll(log).find("watching") == std::string::npos; ++i)
        sleepSeconds(0.05);
    ::kill(pid, SIGTERM);
    EXPECT_EQ(waitCli(pid, 10.0), 0) << readAll(log);
}

TEST(CliWatch, CompleteFitsCheckSeesTruncation) {
    const TempDir& sim = simDir();
    TempDir dir("gpuphot_watch_trunc");
    const std::string bytes = readAll(sim / "w1.fits");
    EXPECT_TRUE(fitsFileComplete(sim / "w1.fits"));
    for (std::size_t cut : {std::size_t{100}, std::size_t{2880}, bytes.size() / 2, bytes.size() - 1}) {
        std::ofstream(dir / "cut.fits", std::ios::binary)
            .write(bytes.data(), static_cast<std::streamsize>(cut));
        std::string why;
        EXPECT_FALSE(fitsFileComplete(dir / "cut.fits", &why)) << cut;
        EXPECT_FALSE(why.empty());
    }
    std::ofstream(dir / "text.fits") << "SIMPLE = nonsense\n";
    EXPECT_FALSE(fitsFileComplete(dir / "text.fits"));
    // A catalog cut inside its table's header: CFITSIO sees the primary HDU only, which is whole.
    const TempDir out("gpuphot_watch_trunc_cat");
    const CliResult r = runCli("reduce " + (sim / "w1.fits") + " -o " + out.str() + " -q");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const std::string cat = readAll(out / "w1.cat.fits");
    EXPECT_TRUE(fitsFileComplete(out / "w1.cat.fits"));
    ASSERT_EQ(cat.compare(2880, 8, "XTENSION"), 0);
    std::ofstream(dir / "cut.cat.fits", std::ios::binary).write(cat.data(), 2880 + 1000);
    std::string why;
    EXPECT_FALSE(fitsFileComplete(dir / "cut.cat.fits", &why));
    EXPECT_NE(why.find("no complete header"), std::string::npos) << why;
}

// SIGTERM while frames wait read ahead of the stages (--prefetch 2): the frame in its stages is finished,
// the frames read ahead are not reduced (no line, no outputs).
TEST(CliWatch, SigtermFinishesTheCurrentFrameAndDropsTheFramesReadAhead) {
    TempDir sim("gpuphot_watch_stop_sim"), watch("gpuphot_watch_stop"), out("gpuphot_watch_stop_out");
    // Frames slow enough (a second or more each on 2 cores) that the signal lands while the second is in
    // its stages and the third and fourth are read ahead.
    for (int i = 1; i <= 4; ++i) {
        const std::string name = "s" + std::to_string(i);
        const CliResult r = runCli("simulate --size 2048x2048 --stars 3000 --seed " + std::to_string(40 + i) +
                                   " -o " + sim.str() + " --name " + name + " -q");
        ASSERT_EQ(r.exitCode, 0) << r.err;
        fs::copy_file(sim / (name + ".fits"), watch / (name + ".fits"));
    }
    const std::string log = out / "watch.log";
    const pid_t pid = startCli("watch " + watch.str() + " -o " + out.str() +
                                   " --settle 0 --prefetch 2 --threads 2 --timeout 120",
                               log);
    for (int i = 0; i < 1200 && readJsonLines(out / "gpuphot.jsonl").empty(); ++i)
        sleepSeconds(0.025);
    ::kill(pid, SIGTERM);
    EXPECT_EQ(waitCli(pid, 60.0), 0) << readAll(log);
    const auto lines = readJsonLines(out / "gpuphot.jsonl");
    ASSERT_GE(lines.size(), 1u) << readAll(log);
    EXPECT_LE(lines.size(), 2u) << "the first frame, and the one in its stages at the signal: "
                                << readAll(log);
    std::size_t catalogs = 0;
    for (int i = 1; i <= 4; ++i)
        catalogs += fs::exists(out / ("s" + std::to_string(i) + ".cat.fits"));
    EXPECT_EQ(catalogs, lines.size()) << "no outputs of a frame that gave no line";
    for (const auto& j : lines)
        EXPECT_EQ(j["status"], "ok") << j.dump();
}

// A frame reported failed while incomplete and reduced once complete counts by its latest line: the
// summary says ok and the exit status is 0.
TEST(CliWatch, FrameThatFailedWhileIncompleteAndThenSucceededCountsAsOk) {
    const TempDir& sim = simDir();
    TempDir watch("gpuphot_watch_late"), out("gpuphot_watch_late_out");
    const std::string bytes = readAll(sim / "w1.fits");
    std::ofstream(watch / "late.fits", std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
    const std::string log = out / "watch.log";
    const pid_t pid = startCli(
        "watch " + watch.str() + " -o " + out.str() + " --settle 0.1 --rescan 0.2 --timeout 60", log);
    // Unchanged and invalid for max(10 x settle, 5 s): one failed line.
    for (int i = 0; i < 400 && readJsonLines(out / "gpuphot.jsonl").empty(); ++i)
        sleepSeconds(0.05);
    ASSERT_EQ(readJsonLines(out / "gpuphot.jsonl").size(), 1u) << readAll(log);
    std::ofstream(watch / "late.fits", std::ios::binary | std::ios::app)
        .write(bytes.data() + bytes.size() / 2,
               static_cast<std::streamsize>(bytes.size() - bytes.size() / 2));
    for (int i = 0; i < 400 && readJsonLines(out / "gpuphot.jsonl").size() < 2; ++i)
        sleepSeconds(0.05);
    ::kill(pid, SIGTERM);
    EXPECT_EQ(waitCli(pid, 30.0), 0) << readAll(log);
    const auto lines = readJsonLines(out / "gpuphot.jsonl");
    ASSERT_EQ(lines.size(), 2u) << readAll(log);
    EXPECT_EQ(lines[0]["status"], "failed");
    EXPECT_EQ(lines[1]["status"], "ok");
    EXPECT_NE(readAll(log).find("1 frames: 1 ok, 0 skipped, 0 failed"), std::string::npos) << readAll(log);
}
