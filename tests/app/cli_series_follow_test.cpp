// gpuphot series DIR --follow: catalogs that appear in DIR are appended to the running series (a catalog
// still being written is not taken), the files equal those of one `series` call per catalog, and SIGTERM
// stops it cleanly.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/io/fits_table.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

// Five reduced catalogs of a simulated night (n_0001.cat.fits ...) and a target list of two bright
// stars, made once.
const TempDir& nightDir() {
    static TempDir dir("gpuphot_follow_night");
    static bool done = [] {
        const std::string d = dir.str();
        CliResult r = runCli("simulate --series 5 --size 256x256 --stars 80 --seed 41 -o " + d +
                             "/sim --name n -q --set writeSite=true");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        std::string frames;
        for (int i = 1; i <= 5; ++i)
            frames += " " + d + "/sim/n_000" + std::to_string(i) + ".fits";
        r = runCli("reduce" + frames + " --ref " + d + "/sim/n_0001.ref.fits -o " + d + "/red -q");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        const Table cat = readFitsTable(d + "/red/n_0001.cat.fits");
        std::vector<std::size_t> order(cat.rows());
        for (std::size_t i = 0; i < order.size(); ++i)
            order[i] = i;
        const std::vector<double> flux = cat.doubles("flux_opt"), ra = cat.doubles("ra"),
                                  dec = cat.doubles("dec");
        std::sort(order.begin(), order.end(), [&](auto a, auto b) { return flux[a] > flux[b]; });
        std::ofstream t(d + "/targets.csv");
        t << "name,ra,dec\n";
        for (int k = 0; k < 2; ++k)
            t << "t" << k << ',' << ra[order[k + 3]] << ',' << dec[order[k + 3]] << '\n';
        return true;
    }();
    (void)done;
    return dir;
}

std::string catalog(int i) {
    return nightDir().file("red/n_000" + std::to_string(i) + ".cat.fits");
}

int countLines(const std::string& text, const std::string& prefix) {
    int n = 0;
    for (std::size_t at = 0; (at = text.find("\n" + prefix, at)) != std::string::npos; ++at)
        ++n;
    return n + (text.rfind(prefix, 0) == 0 ? 1 : 0);
}

bool waitForLines(const std::string& log, const std::string& prefix, int n, double seconds) {
    for (int i = 0; i < seconds * 20; ++i) {
        if (countLines(slurp(log), prefix) >= n) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
}

} // namespace

TEST(CliSeriesFollow, AppendsNewCatalogsLikeSeparateCallsAndStopsOnSigterm) {
    const TempDir& night = nightDir();
    TempDir in("gpuphot_follow_in"), out("gpuphot_follow_out"), ref("gpuphot_follow_ref");
    for (int i = 1; i <= 3; ++i)
        fs::copy_file(catalog(i), in / fs::path(catalog(i)).filename().string());
    const std::string targets = night / "targets.csv", log = out / "follow.log";
    const pid_t pid = startCli("series " + in.str() + " --targets " + targets + " -o " + out.str() +
                                   " --follow --settle 0.2 --timeout 60",
                               log);
    ASSERT_TRUE(waitForLines(log, "series: 3 frames", 1, 30)) << slurp(log);

    // n_0004 written in two halves: the half-written catalog is not taken.
    const std::string bytes = slurp(catalog(4));
    {
        std::ofstream f(in / "n_0004.cat.fits", std::ios::binary);
        f.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    EXPECT_EQ(countLines(slurp(log), "series: +"), 0) << slurp(log);
    {
        std::ofstream f(in / "n_0004.cat.fits", std::ios::binary | std::ios::app);
        f.write(bytes.data() + bytes.size() / 2,
                static_cast<std::streamsize>(bytes.size() - bytes.size() / 2));
    }
    ASSERT_TRUE(waitForLines(log, "series: +1 (n_0004.cat.fits)", 1, 30)) << slurp(log);
    // n_0005 under a hidden name, then renamed into place.
    fs::copy_file(catalog(5), in / ".n_0005.part");
    fs::rename(in / ".n_0005.part", in / "n_0005.cat.fits");
    ASSERT_TRUE(waitForLines(log, "series: +1 (n_0005.cat.fits)", 1, 30)) << slurp(log);
    ::kill(pid, SIGTERM);
    EXPECT_EQ(waitCli(pid, 30.0), 0) << slurp(log);

    const nlohmann::json report = nlohmann::json::parse(slurp(out / "series.json"));
    EXPECT_EQ(report["catalogs"].size(), 5u);
    EXPECT_TRUE(report["appended"].get<bool>());
    for (const auto& e : fs::directory_iterator(out.path))
        EXPECT_NE(e.path().extension(), ".tmp") << e.path();

    // The same catalogs, one `series` call each after the first three: the same light curves.
    std::string first;
    for (int i = 1; i <= 3; ++i)
        first += " " + (in / fs::path(catalog(i)).filename().string());
    for (const std::string& args : {first, " " + (in / "n_0004.cat.fits"), " " + (in / "n_0005.cat.fits")}) {
        const CliResult r = runCli("series" + args + " --targets " + targets + " -o " + ref.str() + " -q");
        ASSERT_EQ(r.exitCode, 0) << r.err;
    }
    for (const char* name : {"t0.lc.csv", "t1.lc.csv", "t0.aij.tbl"}) {
        const std::string followed = slurp(out / name), separate = slurp(ref / name);
        EXPECT_FALSE(followed.empty()) << name;
        EXPECT_EQ(followed, separate) << name;
    }
    EXPECT_EQ(countLines(slurp(out / "t0.lc.csv"), "n_000"), 5);
}

TEST(CliSeriesFollow, NeedsADirectory) {
    const TempDir& night = nightDir();
    TempDir out("gpuphot_follow_nodir");
    const CliResult r = runCli("series " + catalog(1) + " --targets " + (night / "targets.csv") + " -o " +
                               out.str() + " --follow --timeout 5 -q");
    EXPECT_EQ(r.exitCode, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("--follow"), std::string::npos) << r.err;
}

// A stop between series.json and the state (the state is written last) leaves series.json listing a
// catalog the state lacks: the next call appends it again instead of losing it.
TEST(CliSeriesFollow, CatalogsOnlySeriesJsonListsAreAppendedAgain) {
    const TempDir& night = nightDir();
    TempDir out("gpuphot_follow_stale");
    const std::string targets = night / "targets.csv";
    const auto series = [&](const std::string& cats) {
        const CliResult r = runCli("series" + cats + " --targets " + targets + " -o " + out.str() + " -q");
        EXPECT_EQ(r.exitCode, 0) << r.err;
    };
    series(" " + catalog(1) + " " + catalog(2) + " " + catalog(3));
    fs::copy_file(out / "series.state", out / "old.state");
    series(" " + catalog(4));
    // The state of three catalogs back, older than series.json (which lists four).
    fs::rename(out / "old.state", out / "series.state");
    fs::last_write_time(out / "series.state",
                        fs::last_write_time(out / "series.json") - std::chrono::seconds(10));
    series(" " + catalog(5));
    const nlohmann::json report = nlohmann::json::parse(slurp(out / "series.json"));
    ASSERT_EQ(report["catalogs"].size(), 5u) << report["catalogs"].dump();
    EXPECT_TRUE(report["appended"].get<bool>());
    EXPECT_EQ(countLines(slurp(out / "t0.lc.csv"), "n_000"), 5);
}
