// Crash safety of `gpuphot reduce` (docs/RELIABILITY.md): SIGKILL at 50 seeded random moments spread
// over a run's measured duration never leaves a partial file under a final name; what a killed run
// leaves are hidden temporaries of the documented form, which the next run in that directory removes;
// and a re-run completes with the same outputs as an undisturbed run.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kOutputs = {"k.cat.fits", "k.report.json", "k.cat.ecsv", "k.cat.csv",
                                           "k.reg",      "k.bkg.fits",    "k.seg.fits", "k.resid.fits"};

// Starts `gpuphot reduce` on `frame` into `outdir` (stdout/stderr to /dev/null); returns its pid.
pid_t spawnReduce(const std::string& frame, const std::string& outdir) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        const int devnull = ::open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            ::dup2(devnull, 1);
            ::dup2(devnull, 2);
        }
        ::setenv("GPUPHOT_NO_TYCHO2", "1", 1);
        ::execl(GPUPHOT_CLI, GPUPHOT_CLI, "reduce", frame.c_str(), "-o", outdir.c_str(), "--maps", "bkg,seg,resid",
                "--formats", "ecsv,csv,reg", "--threads", "2", "-q", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    return pid;
}

int waitExit(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

std::vector<std::string> dataLines(const fs::path& p) {
    std::ifstream in(p);
    std::vector<std::string> out;
    std::string line;
    while (std::getline(in, line))
        if (line.empty() || line[0] != '#') out.push_back(line);
    return out;
}

bool sameImage(const Frame& a, const Frame& b) {
    if (a.width() != b.width() || a.height() != b.height()) return false;
    const float* pa = a.pixels.data();
    const float* pb = b.pixels.data();
    for (std::size_t i = 0; i < a.pixels.pixelCount(); ++i)
        if (!(pa[i] == pb[i] || (std::isnan(pa[i]) && std::isnan(pb[i])))) return false;
    return true;
}

// The outputs of an undisturbed run, to compare every file a killed run leaves against.
struct Reference {
    std::size_t rows = 0;
    std::map<std::string, std::vector<std::string>> text; // data lines of ecsv/csv/reg
    std::map<std::string, Frame> maps;
};

// Checks that `p` (a final name) is complete: readable and equal to the undisturbed run's file.
void expectComplete(const fs::path& p, const Reference& ref) {
    const std::string name = p.filename().string();
    SCOPED_TRACE(name);
    try {
        if (name == "k.cat.fits") {
            EXPECT_EQ(readFitsTable(p.string()).rows(), ref.rows);
        } else if (name == "k.report.json") {
            const auto j = nlohmann::json::parse(slurp(p));
            EXPECT_EQ(j["counts"]["sources"].get<std::size_t>(), ref.rows);
        } else if (ref.text.count(name)) {
            EXPECT_EQ(dataLines(p), ref.text.at(name));
        } else if (ref.maps.count(name)) {
            EXPECT_TRUE(sameImage(readFrame(p.string()), ref.maps.at(name)));
        } else {
            ADD_FAILURE() << "unexpected final name " << p;
        }
    } catch (const std::exception& e) {
        ADD_FAILURE() << "partial or unreadable file under a final name: " << p << ": " << e.what();
    }
}

} // namespace

TEST(CliKill, SigkillNeverLeavesAPartialOutputAndAReRunCompletes) {
    TempDir dir("gpuphot_kill");
    ASSERT_EQ(runCli("simulate --size 1024x1024 --stars 400 --seed 9 -q -o " + dir.str() + " --name k").exitCode, 0);
    const std::string frame = dir / "k.fits";
    const fs::path refDir = dir.path / "ref", out = dir.path / "out";
    fs::create_directories(refDir);
    fs::create_directories(out);

    // The undisturbed run: its duration spreads the kill times, its files are the truth.
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(waitExit(spawnReduce(frame, refDir.string())), 0);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Reference ref;
    ref.rows = readFitsTable((refDir / "k.cat.fits").string()).rows();
    ASSERT_GT(ref.rows, 100u);
    for (const char* t : {"k.cat.ecsv", "k.cat.csv", "k.reg"}) ref.text[t] = dataLines(refDir / t);
    for (const char* m : {"k.bkg.fits", "k.seg.fits", "k.resid.fits"}) ref.maps[m] = readFrame((refDir / m).string());

    std::mt19937 rng(20261130);
    std::uniform_real_distribution<double> when(0.0, 1.1 * seconds);
    int killed = 0, finished = 0, sawTemporaries = 0, sawPartialSets = 0;
    for (int i = 0; i < 50; ++i) {
        SCOPED_TRACE("kill " + std::to_string(i));
        // Each run starts without final outputs (so what it leaves is its own); the temporaries of earlier
        // killed runs stay, for this run to clean up.
        for (const auto& f : kOutputs) fs::remove(out / f);
        const double delay = when(rng);
        const pid_t pid = spawnReduce(frame, out.string());
        std::this_thread::sleep_for(std::chrono::duration<double>(delay));
        const bool wasRunning = ::kill(pid, SIGKILL) == 0;
        const int rc = waitExit(pid);
        if (rc == -SIGKILL && wasRunning)
            ++killed;
        else {
            EXPECT_EQ(rc, 0) << "a run that was not killed must succeed";
            ++finished;
        }
        std::set<std::string> present;
        bool temporaries = false;
        for (const auto& e : fs::directory_iterator(out)) {
            const std::string name = e.path().filename().string();
            if (name[0] == '.') {
                EXPECT_TRUE(isAtomicTemporaryName(name)) << "unrecognisable leftover " << name;
                temporaries = true;
                continue;
            }
            present.insert(name);
            expectComplete(e.path(), ref);
        }
        sawTemporaries += temporaries;
        // The report is written last: with it, every output is there.
        if (present.count("k.report.json")) {
            EXPECT_EQ(present.size(), kOutputs.size());
        }
        sawPartialSets += !present.empty() && present.size() < kOutputs.size();
    }
    std::printf("[ kill ] run %.2f s; %d killed, %d finished before the kill; temporaries left by %d kills, "
                "incomplete output sets (complete files only) after %d\n",
                seconds, killed, finished, sawTemporaries, sawPartialSets);
    EXPECT_GT(killed, 15) << "most kills must land inside the run (spread over 1.1 x its measured duration)";

    // The re-run completes, replaces everything, and removes the stale temporaries of the killed runs.
    ASSERT_EQ(waitExit(spawnReduce(frame, out.string())), 0);
    std::size_t finals = 0;
    for (const auto& e : fs::directory_iterator(out)) {
        const std::string name = e.path().filename().string();
        EXPECT_NE(name[0], '.') << "stale temporary not removed by the re-run: " << name;
        if (name[0] == '.') continue;
        ++finals;
        expectComplete(e.path(), ref);
    }
    EXPECT_EQ(finals, kOutputs.size());
}

TEST(CliKill, StaleTemporariesOfDeadProcessesAreRemovedOthersAreKept) {
    TempDir dir("gpuphot_kill_tmp");
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string tag;
    for (const char* p = host; *p && tag.size() < 32; ++p) tag += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '-';
    // A pid that is surely dead: a child that has exited and been reaped.
    const pid_t dead = ::fork();
    if (dead == 0) ::_exit(0);
    waitExit(dead);
    const std::string staleName = ".x.cat.fits." + tag + "." + std::to_string(dead) + ".0badf00d.tmp";
    const std::string liveName = ".x.cat.fits." + tag + "." + std::to_string(::getpid()) + ".0badf00d.tmp";
    const std::string otherHost = ".x.cat.fits.elsewhere-host." + std::to_string(dead) + ".0badf00d.tmp";
    const std::string userFile = ".x.cat.fits.notes.tmp"; // not of the form: never touched
    for (const auto& n : {staleName, liveName, otherHost, userFile}) std::ofstream(dir / n) << "partial";
    EXPECT_TRUE(isAtomicTemporaryName(staleName));
    EXPECT_FALSE(isAtomicTemporaryName(userFile));
    EXPECT_FALSE(isAtomicTemporaryName("x.cat.fits"));
    // Writing any output there cleans up once.
    Image<float> img(16, 16, 1.0f);
    writeFitsImage(dir / "x.bkg.fits", img.view(), Header{});
    EXPECT_FALSE(fs::exists(dir / staleName));
    EXPECT_TRUE(fs::exists(dir / liveName)) << "a live process's temporary is never removed";
    EXPECT_TRUE(fs::exists(dir / otherHost)) << "another host's temporary: its pid means nothing here";
    EXPECT_TRUE(fs::exists(dir / userFile));
    EXPECT_EQ(removeStaleTemporaries(dir.str()), 0u);
}

namespace {

// The pids of live `--batch-child` processes whose command line names `outdir` (orphans included: they
// are re-parented, so they are found by what they were started with).
std::vector<pid_t> batchChildrenOf(const std::string& outdir) {
    std::vector<pid_t> out;
    for (const auto& e : fs::directory_iterator("/proc")) {
        const std::string name = e.path().filename().string();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream in(e.path() / "cmdline", std::ios::binary);
        std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        std::ifstream st(e.path() / "stat");
        std::string stat((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
        const auto paren = stat.rfind(')');
        const bool zombie = paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
        if (!zombie && cmd.find("--batch-child") != std::string::npos && cmd.find(outdir) != std::string::npos)
            out.push_back(static_cast<pid_t>(std::stol(name)));
    }
    return out;
}

std::set<std::string> finalNames(const fs::path& dir) {
    std::set<std::string> out;
    if (!fs::exists(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string()[0] != '.') out.insert(e.path().filename().string());
    return out;
}

pid_t spawnBatch(const fs::path& in, const fs::path& out, const std::string& jsonl) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        const int devnull = ::open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            ::dup2(devnull, 1);
            ::dup2(devnull, 2);
        }
        ::setenv("GPUPHOT_NO_TYCHO2", "1", 1);
        ::execl(GPUPHOT_CLI, GPUPHOT_CLI, "reduce", in.c_str(), "-o", out.c_str(), "-j", "2", "--threads", "1",
                "--jsonl", jsonl.c_str(), "-q", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    return pid;
}

} // namespace

// docs/RELIABILITY.md: the children of `reduce -j 2` die with their parent. After a SIGKILL of the parent
// at a random moment no child is alive 1 s later, no output appears afterwards, and a re-run completes
// with every frame once in its status lines. GPUPHOT_KILL_TRIALS sets the number of kills (CI: 3; the
// long checks: 20).
TEST(CliKill, BatchChildrenDieWithTheirParent) {
    TempDir dir("gpuphot_orphans");
    ASSERT_EQ(runCli("simulate --size 1024x1024 --stars 600 --seed 4 -q -o " + dir.str() + " --name b").exitCode, 0);
    const fs::path in = dir.path / "in";
    fs::create_directories(in);
    constexpr int kFrames = 8;
    for (int i = 0; i < kFrames; ++i)
        fs::copy_file(dir.path / "b.fits", in / ("f" + std::to_string(i) + ".fits"));
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(waitExit(spawnBatch(in, dir.path / "ref", (dir.path / "ref.jsonl").string())), 0);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    const char* env = std::getenv("GPUPHOT_KILL_TRIALS");
    const int trials = env && *env ? std::atoi(env) : 3;
    std::mt19937 rng(20261203);
    std::uniform_real_distribution<double> when(0.25 * seconds, 0.75 * seconds);
    int orphansSeen = 0;
    for (int t = 0; t < trials; ++t) {
        SCOPED_TRACE("trial " + std::to_string(t));
        const fs::path out = dir.path / ("out" + std::to_string(t));
        const pid_t parent = spawnBatch(in, out, (dir.path / "killed.jsonl").string());
        std::this_thread::sleep_for(std::chrono::duration<double>(when(rng)));
        ASSERT_EQ(::kill(parent, SIGKILL), 0);
        EXPECT_EQ(waitExit(parent), -SIGKILL);
        const auto atKill = finalNames(out);
        std::this_thread::sleep_for(std::chrono::seconds(1));
        const auto alive = batchChildrenOf(out.string());
        orphansSeen += static_cast<int>(alive.size());
        EXPECT_TRUE(alive.empty()) << alive.size() << " children outlived their parent by 1 s";
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        EXPECT_EQ(finalNames(out), atKill) << "outputs appeared after the parent was killed";
        for (pid_t p : alive) ::kill(p, SIGKILL); // do not let a failure spread to the next trial

        const fs::path rerun = dir.path / ("rerun" + std::to_string(t) + ".jsonl");
        ASSERT_EQ(waitExit(spawnBatch(in, out, rerun.string())), 0);
        std::map<std::string, int> seen;
        std::ifstream lines(rerun);
        for (std::string line; std::getline(lines, line);) {
            const auto j = nlohmann::json::parse(line);
            const std::string status = j.value("status", "");
            EXPECT_TRUE(status == "ok" || status == "skipped") << line;
            ++seen[fs::path(j.value("frame", "")).filename().string()];
        }
        EXPECT_EQ(seen.size(), static_cast<std::size_t>(kFrames));
        for (const auto& [frame, n] : seen)
            EXPECT_EQ(n, 1) << frame << " has " << n << " status lines in the re-run";
        for (int i = 0; i < kFrames; ++i)
            EXPECT_TRUE(fs::exists(out / ("f" + std::to_string(i) + ".report.json"))) << "frame " << i;
    }
    std::printf("[ orphans ] undisturbed -j 2 run %.2f s; %d trials; children alive 1 s after the kill: %d\n",
                seconds, trials, orphansSeen);
}
