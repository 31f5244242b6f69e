// runDetached (app/cli/detached_exit.hpp): the exit status reaches the waiting process as soon as the
// command returns, before the child's own end; nothing the child does afterwards reaches the parent's
// streams; SIGKILL and SIGTERM of the parent stop the command; and a single-frame `reduce` gives the same
// files and exit codes with the handover as without it.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "app/cli/detached_exit.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

// Polls until pred() holds or `seconds` pass.
template <class Pred> bool eventually(Pred pred, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
}

std::string readAll(int fd) {
    std::string s;
    char buf[256];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;)
        s.append(buf, static_cast<std::size_t>(n));
    return s;
}

// A process (its stdout on `outFd`) that runs `command` through runDetached; after runDetached returns,
// the child (the one that ran the command) waits `lingerMs`, prints "late", marks `dir`/late and ends.
pid_t startDetached(int outFd, const fs::path& dir, int rc, int commandMs, int lingerMs) {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    ::dup2(outFd, 1);
    const pid_t me = ::getpid();
    const int status = cli::runDetached([&] {
        std::ofstream(dir / "pid") << ::getpid();
        std::printf("early\n");
        std::this_thread::sleep_for(std::chrono::milliseconds(commandMs));
        std::ofstream(dir / "ran").put('1');
        return rc;
    });
    if (::getpid() != me) { // the child, after handing its status over
        std::this_thread::sleep_for(std::chrono::milliseconds(lingerMs));
        std::printf("late\n");
        std::fflush(stdout);
        std::ofstream(dir / "late").put('1');
    }
    ::_exit(status);
}

pid_t childPid(const fs::path& dir) {
    pid_t p = 0;
    std::ifstream(dir / "pid") >> p;
    return p;
}

// Running or sleeping: not gone, and not a zombie waiting for whoever reaps orphans.
bool alive(pid_t p) {
    std::ifstream in("/proc/" + std::to_string(p) + "/stat");
    std::string stat;
    if (p <= 0 || !std::getline(in, stat)) return false;
    const std::size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z' &&
           stat[close + 2] != 'X';
}

} // namespace

TEST(DetachedExit, StatusComesBeforeTheChildEndsAndLateOutputGoesNowhere) {
    TempDir dir("gpuphot_detached");
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = startDetached(fds[1], dir.path, 7, 0, 3000);
    ::close(fds[1]);
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 7);
    EXPECT_TRUE(fs::exists(dir.path / "ran"));
    EXPECT_FALSE(fs::exists(dir.path / "late")); // the child still lingers: the status did not wait for it
    // The pipe reaches EOF although the child lives on: it no longer holds the parent's stdout.
    EXPECT_EQ(readAll(fds[0]), "early\n");
    ::close(fds[0]);
    EXPECT_TRUE(eventually([&] { return fs::exists(dir.path / "late"); }, 20.0));
}

namespace {

// Starts a detached command that runs for a minute, sends `sig` to the process waiting for it once the
// command runs, and returns that process's wait status; `child`: the command's process.
int signalWhileRunning(const fs::path& dir, int sig, pid_t& child) {
    const int devnull = ::open("/dev/null", O_WRONLY);
    const pid_t pid = startDetached(devnull, dir, 0, 60000, 0);
    ::close(devnull);
    child = 0;
    if (!eventually([&] { return childPid(dir) > 0; }, 20.0)) ::kill(pid, SIGKILL);
    child = childPid(dir);
    ::kill(pid, sig);
    int st = 0;
    ::waitpid(pid, &st, 0);
    return st;
}

} // namespace

TEST(DetachedExit, SigkillOfTheParentEndsTheCommand) {
    TempDir dir("gpuphot_detached");
    pid_t child = 0;
    const int st = signalWhileRunning(dir.path, SIGKILL, child);
    ASSERT_GT(child, 0);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    EXPECT_TRUE(eventually([&] { return !alive(child); }, 20.0));
    EXPECT_FALSE(fs::exists(dir.path / "ran"));
}

TEST(DetachedExit, SigtermIsPassedOnAndEndsTheParentTheSameWay) {
    TempDir dir("gpuphot_detached");
    pid_t child = 0;
    const int st = signalWhileRunning(dir.path, SIGTERM, child);
    ASSERT_GT(child, 0);
    ASSERT_TRUE(WIFSIGNALED(st));
    EXPECT_EQ(WTERMSIG(st), SIGTERM);
    EXPECT_TRUE(eventually([&] { return !alive(child); }, 20.0));
    EXPECT_FALSE(fs::exists(dir.path / "ran"));
}

TEST(DetachedExit, ReduceGivesTheSameFilesAndExitCodes) {
    TempDir dir("gpuphot_detached");
    ASSERT_EQ(
        runCli("simulate --size 512x512 --stars 150 --seed 4 -q -o " + dir.str() + " --name d").exitCode, 0);
    const std::string frame = (dir.path / "d.fits").string();
    const CliResult off = runCli("reduce " + frame + " -q -o " + (dir.path / "off").string(),
                                 "GPUPHOT_NO_TYCHO2=1 GPUPHOT_DETACHED_EXIT=0");
    const CliResult on = runCli("reduce " + frame + " -q -o " + (dir.path / "on").string(),
                                "GPUPHOT_NO_TYCHO2=1 GPUPHOT_DETACHED_EXIT=1");
    ASSERT_EQ(off.exitCode, 0) << off.err;
    ASSERT_EQ(on.exitCode, 0) << on.err;
    EXPECT_EQ(slurp(dir.path / "on" / "d.cat.fits"), slurp(dir.path / "off" / "d.cat.fits"));
    EXPECT_TRUE(fs::exists(dir.path / "on" / "d.report.json"));
    const CliResult missing = runCli("reduce " + (dir.path / "none.fits").string() + " -q -o " + dir.str(),
                                     "GPUPHOT_NO_TYCHO2=1 GPUPHOT_DETACHED_EXIT=1");
    EXPECT_EQ(missing.exitCode, 3);
    EXPECT_NE(missing.err.find("no such file"), std::string::npos) << missing.err;
}
