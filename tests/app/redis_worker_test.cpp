// gpuphot enqueue / worker / results against a real redis-server on 127.0.0.1 (a random free port, no
// persistence), started and stopped by PID here; skipped when redis-server is not installed or gpuphot
// was built without hiredis. Two workers share 20 frames and a bad FITS file; one is SIGKILLed while it
// holds a job: every frame must appear in the results exactly once as ok, nothing pending, no half-written
// outputs. A frame that crashes every worker that takes it ends in the dead-letter stream.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <netinet/in.h>
#include <set>
#include <sstream>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/io/atomic_file.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

bool onPath(const std::string& program) {
    return std::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

int freePort() {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    ::close(s);
    return port;
}

// fork + exec with extra environment variables; stdout and stderr go to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
            const std::string& log) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::setpgid(0, 0);
        for (const auto& [k, v] : env)
            ::setenv(k.c_str(), v.c_str(), 1);
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::close(fd);
        }
        std::vector<char*> args;
        for (const auto& a : argv)
            args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        ::execvp(args[0], args.data());
        ::_exit(127);
    }
    return pid;
}

// Waits for `pid` at most `timeout`; returns the wait status, or -1 on time-out (the process is left).
int waitFor(pid_t pid, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        if (r < 0) return -2;
        std::this_thread::sleep_for(20ms);
    }
    return -1;
}

void killAndReap(pid_t pid) {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
}

// Kills (SIGKILL) and reaps, at scope exit, the children it lists that are still running, so a failed
// assertion leaves no worker behind. Only this process's unreaped children are touched.
struct Reaper {
    std::vector<pid_t> pids;
    ~Reaper() {
        for (pid_t p : pids) {
            int status = 0;
            if (p > 0 && ::waitpid(p, &status, WNOHANG) == 0) killAndReap(p);
        }
    }
};

std::string shellOut(const std::string& cmd) {
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
        char buf[4096];
        std::size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
            out.append(buf, n);
        ::pclose(p);
    }
    return out;
}

std::vector<nlohmann::json> jsonLines(const std::string& text) {
    std::vector<nlohmann::json> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
        if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
}

class RedisWorker : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (!onPath("redis-server") || !onPath("redis-cli")) return;
        s_dir = new TempDir("gpuphot_redis");
        s_port = freePort();
        s_pid =
            spawn({"redis-server", "--port", std::to_string(s_port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--daemonize", "no", "--dir", s_dir->str(), "--loglevel", "warning"},
                  {}, s_dir->file("redis.log"));
        for (int i = 0; i < 250; ++i) {
            if (cli("PING").find("PONG") != std::string::npos) return;
            std::this_thread::sleep_for(20ms);
        }
        killAndReap(s_pid);
        s_pid = -1;
    }
    static void TearDownTestSuite() {
        if (s_pid > 0) {
            ::kill(s_pid, SIGTERM);
            if (waitFor(s_pid, 5000ms) == -1) killAndReap(s_pid);
        }
        s_pid = -1;
        delete s_dir;
        s_dir = nullptr;
    }
    void SetUp() override {
        if (s_pid <= 0) GTEST_SKIP() << "redis-server / redis-cli not installed (Debian redis-server)";
        const CliResult r = runCli("results --redis 127.0.0.1:" + std::to_string(s_port) + " --summary");
        if (r.err.find("no Redis support") != std::string::npos)
            GTEST_SKIP() << "gpuphot built without hiredis";
        ASSERT_EQ(r.exitCode, 0) << r.err;
    }

    static std::string cli(const std::string& args) {
        return shellOut("redis-cli -p " + std::to_string(s_port) + " --raw " + args + " 2>&1");
    }
    static std::string redis() { return "127.0.0.1:" + std::to_string(s_port); }
    static long long number(const std::string& text) { return std::atoll(text.c_str()); }
    std::vector<std::string> workerArgs(const std::string& prefix, const std::string& name) const {
        return {GPUPHOT_CLI_TESTHOOKS, "worker", "--redis",   redis(), "--stream-prefix", prefix,
                "--name",    name,     "--backend", "cpu",   "--threads",       "1"};
    }

    static inline TempDir* s_dir = nullptr;
    static inline int s_port = -1;
    static inline pid_t s_pid = -1;
};

// A small simulated frame copied under many names (distinct stems, same pixels: fast to make).
std::vector<std::string> makeFrames(const TempDir& dir, int n) {
    const CliResult r =
        runCli("simulate --size 192x192 --stars 40 --seed 3 -q -o " + dir.str() + " --name sim");
    EXPECT_EQ(r.exitCode, 0) << r.err;
    std::vector<std::string> frames;
    for (int i = 0; i < n; ++i) {
        char name[32];
        std::snprintf(name, sizeof name, "f%02d.fits", i);
        fs::copy_file(dir / "sim.fits", dir / name);
        frames.push_back(dir / name);
    }
    return frames;
}

TEST_F(RedisWorker, TwoWorkersOneKilledMidFrameEveryFrameOnceNothingPendingNoHalfOutputs) {
    TempDir in("gpuphot_redis_in"), out("gpuphot_redis_out");
    const std::vector<std::string> frames = makeFrames(in, 20);
    { std::ofstream(in / "bad.fits") << "this is not a FITS file\n"; }
    std::string args = "enqueue --redis " + redis() + " --stream-prefix t1 -o " + out.str();
    for (const auto& f : frames)
        args += " " + f;
    args += " " + in / "bad.fits";
    const CliResult enq = runCli(args);
    ASSERT_EQ(enq.exitCode, 0) << enq.err;
    ASSERT_EQ(number(cli("XLEN t1:frames")), 21);

    // A is slow (the sleep is inside the frame, between taking the job and acknowledging it).
    const pid_t a = spawn(workerArgs("t1", "A"), {{"GPUPHOT_TEST_SLOW_FRAME_MS", "400"}}, in / "A.log");
    auto bArgs = workerArgs("t1", "B");
    for (const char* x : {"--claim-idle", "2s", "--exit-when-idle", "1"})
        bArgs.push_back(x);
    const pid_t b = spawn(bArgs, {{"GPUPHOT_TEST_SLOW_FRAME_MS", "100"}}, in / "B.log");
    Reaper reaper{{a, b}};

    // Kill A while it holds a job, after both have produced results.
    std::string killedJob;
    for (int i = 0; i < 1000 && killedJob.empty(); ++i) {
        std::this_thread::sleep_for(10ms);
        if (number(cli("XLEN t1:results")) < 3) continue;
        // A has published at least one result (its consumer name as a field value in the stream).
        const std::string all = cli("XRANGE t1:results - +");
        if (all.find("\nA\n") == std::string::npos) continue;
        const std::string held = cli("XPENDING t1:frames gpuphot-workers - + 10 A");
        if (held.find('-') == std::string::npos) continue;
        ::kill(a, SIGKILL);
        const int aStatus = waitFor(a, 5000ms);
        ASSERT_TRUE(aStatus >= 0 && WIFSIGNALED(aStatus) && WTERMSIG(aStatus) == SIGKILL);
        // What A held when it died (B claims it only after --claim-idle 2s).
        const std::string stillHeld = cli("XPENDING t1:frames gpuphot-workers - + 10 A");
        killedJob = stillHeld.substr(0, stillHeld.find('\n'));
        ASSERT_NE(killedJob.find('-'), std::string::npos) << "A was killed holding no job: " << stillHeld;
    }
    ASSERT_FALSE(killedJob.empty()) << "worker A never held a job";

    const int bStatus = waitFor(b, 40000ms);
    if (bStatus == -1) killAndReap(b);
    ASSERT_NE(bStatus, -1) << "worker B did not finish: " << slurp(in.path / "B.log");
    EXPECT_TRUE(WIFEXITED(bStatus) && WEXITSTATUS(bStatus) == 0) << slurp(in.path / "B.log");

    // Results: through gpuphot results, and the raw stream length through redis-cli.
    const CliResult res = runCli("results --redis " + redis() + " --stream-prefix t1");
    ASSERT_EQ(res.exitCode, 0) << res.err;
    const auto results = jsonLines(res.out);
    EXPECT_EQ(static_cast<long long>(results.size()), number(cli("XLEN t1:results")));
    std::map<std::string, int> ok, failed, any;
    std::map<std::string, std::string> workerOfJob;
    for (const auto& r : results) {
        const std::string f = r.at("frame");
        ++any[f];
        ok[f] += r.at("status") == "ok";
        failed[f] += r.at("status") == "failed";
        workerOfJob[r.at("job")] = r.at("worker");
    }
    for (const auto& f : frames) {
        EXPECT_EQ(ok[f], 1) << f;
        EXPECT_EQ(any[f], 1) << f << " appears more than once";
    }
    EXPECT_EQ(failed[in / "bad.fits"], 1) << "a bad FITS file is a failed result, acknowledged";
    EXPECT_EQ(results.size(), 21u);
    EXPECT_EQ(workerOfJob[killedJob], "B") << "the job A died with was claimed and finished by B";
    EXPECT_GT(
        std::count_if(results.begin(), results.end(), [](const auto& r) { return r.at("worker") == "A"; }),
        0);

    // Nothing pending, nothing dead, nothing in flight.
    EXPECT_EQ(number(cli("XPENDING t1:frames gpuphot-workers")), 0);
    EXPECT_EQ(number(cli("XLEN t1:dead")), 0);
    EXPECT_EQ(number(cli("HLEN t1:inflight")), 0);

    // Outputs: every catalog has its report, every report lists existing outputs, no temporaries.
    std::size_t catalogs = 0;
    for (const auto& e : fs::directory_iterator(out.path)) {
        const std::string name = e.path().filename().string();
        EXPECT_FALSE(isAtomicTemporaryName(name)) << name;
        EXPECT_NE(name.front(), '.') << name;
        if (name.size() > 9 && name.ends_with(".cat.fits")) {
            ++catalogs;
            const std::string stem = name.substr(0, name.size() - 9);
            EXPECT_TRUE(fs::exists(out.path / (stem + ".report.json"))) << name;
        }
    }
    EXPECT_EQ(catalogs, frames.size());
    for (const auto& r : results) {
        if (r.at("status") != "ok") continue;
        for (const auto& [key, path] : r.at("outputs").items()) {
            EXPECT_TRUE(fs::exists(path.get<std::string>())) << path;
        }
    }
}

TEST_F(RedisWorker, AFrameThatCrashesEveryWorkerEndsInTheDeadLetterStream) {
    TempDir in("gpuphot_redis_dl_in"), out("gpuphot_redis_dl_out");
    const std::vector<std::string> frames = makeFrames(in, 1);
    fs::copy_file(frames[0], in / "poison.fits");
    ASSERT_EQ(runCli("enqueue -q --redis " + redis() + " --stream-prefix t2 -o " + out.str() + " " +
                     in / "poison.fits" + " " + frames[0])
                  .exitCode,
              0);
    auto args = workerArgs("t2", "C");
    for (const char* x : {"--claim-idle", "300ms", "--max-attempts", "1", "--exit-when-idle", "1"})
        args.push_back(x);
    // First worker: takes the poison first (it was enqueued first) and crashes on it.
    Reaper reaper;
    reaper.pids.push_back(spawn(args, {{"GPUPHOT_TEST_CRASH_FRAME", "/poison.fits"}}, in / "C.log"));
    const int c = waitFor(reaper.pids.back(), 20000ms);
    ASSERT_TRUE(WIFSIGNALED(c)) << "the crash hook should abort the worker: " << slurp(in.path / "C.log");
    EXPECT_EQ(number(cli("XPENDING t2:frames gpuphot-workers")), 1);
    // Second worker (same hook: it must not try the frame again): claims it, finds it delivered
    // --max-attempts times already, dead-letters it, reduces the good frame and exits when idle.
    args[7] = "D";
    reaper.pids.push_back(spawn(args, {{"GPUPHOT_TEST_CRASH_FRAME", "/poison.fits"}}, in / "D.log"));
    const int d = waitFor(reaper.pids.back(), 20000ms);
    ASSERT_TRUE(WIFEXITED(d) && WEXITSTATUS(d) == 0) << slurp(in.path / "D.log");

    const auto dead = jsonLines(runCli("results --dead --redis " + redis() + " --stream-prefix t2").out);
    ASSERT_EQ(dead.size(), 1u);
    EXPECT_EQ(dead[0].at("frame"), in / "poison.fits");
    EXPECT_EQ(dead[0].at("attempts"), 1);
    EXPECT_NE(dead[0].at("error").get<std::string>().find("C (pid"), std::string::npos) << dead[0].dump();
    const auto results = jsonLines(runCli("results --redis " + redis() + " --stream-prefix t2").out);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_EQ(results[0].at("frame"), frames[0]);
    EXPECT_EQ(results[0].at("status"), "ok");
    EXPECT_EQ(number(cli("XPENDING t2:frames gpuphot-workers")), 0);
    EXPECT_FALSE(fs::exists(out.path / "poison.cat.fits"));
}

TEST_F(RedisWorker, SigtermEndsAnIdleWorkerCleanly) {
    TempDir out("gpuphot_redis_term");
    const pid_t w = spawn(workerArgs("t3", "E"), {}, out / "E.log");
    Reaper reaper{{w}};
    for (int i = 0; i < 500 && number(cli("EXISTS t3:frames")) == 0; ++i)
        std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(200ms);
    ::kill(w, SIGTERM);
    const int s = waitFor(w, 5000ms);
    if (s == -1) killAndReap(w);
    ASSERT_NE(s, -1) << "the worker did not stop on SIGTERM";
    EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0) << slurp(out.path / "E.log");
    EXPECT_NE(slurp(out.path / "E.log").find("(signal)"), std::string::npos);
}

TEST(RedisWorkerCli, EnqueueNamesABadAddressAndAMissingFrame) {
    TempDir in("gpuphot_redis_cli");
    const CliResult noFrame = runCli("enqueue --redis 127.0.0.1:1 " + in / "missing.fits");
    EXPECT_EQ(noFrame.exitCode, 2);
    EXPECT_NE(noFrame.err.find("missing.fits"), std::string::npos) << noFrame.err;
    const CliResult badAddr = runCli("worker --redis 127.0.0.1:notaport");
    EXPECT_EQ(badAddr.exitCode, 2);
    EXPECT_NE(badAddr.err.find("notaport"), std::string::npos) << badAddr.err;
    { std::ofstream(in / "x.fits") << "x"; }
    // Nothing listens on port 1: an I/O error naming the address (or, without hiredis, saying so).
    const CliResult refused = runCli("enqueue --redis 127.0.0.1:1 " + in / "x.fits");
    EXPECT_EQ(refused.exitCode, 3);
    EXPECT_TRUE(refused.err.find("127.0.0.1:1") != std::string::npos) << refused.err;
}

} // namespace
