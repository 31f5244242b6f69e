// The pipelined long-lived worker (--prefetch N: frame N+1 read and frame N-1 written while frame N is in
// its stages; --concurrent K: K frames in their stages at once, each with its own RunContext) against the
// sequential one (--prefetch 0): the same output bytes, status lines in input order, a bad frame in the
// middle fails alone, and a SIGTERM mid-run leaves no half-written output (a re-run then completes with
// the same catalogs).
#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/io/atomic_file.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/frame_status.hpp"
#include "tests/app/cli_run.hpp"

using namespace gpuphot;
using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

// Six small simulated frames (different seeds) and, third in the list, a text file named .fits.
const TempDir& inputDir() {
    static TempDir sim("gpuphot_pipe_sim");
    static TempDir frames("gpuphot_pipe_frames");
    static bool done = [] {
        for (int i = 1; i <= 6; ++i) {
            const std::string name = "p" + std::to_string(i);
            const CliResult r = runCli("simulate --size 200x200 --stars 50 --seed " + std::to_string(40 + i) +
                                       " -o " + sim.str() + " --name " + name + " -q");
            EXPECT_EQ(r.exitCode, 0) << r.err;
            fs::copy_file(sim / (name + ".fits"), frames / (name + ".fits"));
        }
        std::ofstream(frames / "p2bad.fits") << "this is not a FITS file\n";
        return true;
    }();
    (void)done;
    return frames;
}

// Input order: p1 p2 p2bad p3 p4 p5 p6.
std::vector<std::string> inputs() {
    const fs::path d = inputDir().path;
    return {d / "p1.fits", d / "p2.fits", d / "p2bad.fits", d / "p3.fits",
            d / "p4.fits", d / "p5.fits", d / "p6.fits"};
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v)
        s += x + " ";
    return s;
}

std::vector<char> bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every output file but the report (which holds timings) is byte for byte the same in both directories;
// the reports agree on everything but timings, memory, host and dates.
void expectSameOutputs(const fs::path& a, const fs::path& b, std::size_t frames = 6) {
    std::size_t compared = 0;
    for (const auto& e : fs::directory_iterator(a)) {
        const std::string name = e.path().filename().string();
        if (name == "gpuphot.jsonl") continue;
        ASSERT_TRUE(fs::exists(b / name)) << name;
        if (name.ends_with(".report.json")) {
            std::ifstream ia(e.path()), ib(b / name);
            const auto ja = nlohmann::json::parse(ia), jb = nlohmann::json::parse(ib);
            for (const char* key : {"counts", "zeropoint", "fwhm", "background"})
                if (ja.contains(key)) EXPECT_EQ(ja[key], jb[key]) << name << " " << key;
            continue;
        }
        EXPECT_TRUE(bytes(e.path()) == bytes(b / name)) << name << " differs";
        ++compared;
    }
    EXPECT_GE(compared, frames * 2); // catalogs and ecsv at least
    std::size_t inB = 0;
    for (const auto& e : fs::directory_iterator(b))
        inB += e.path().filename() != "gpuphot.jsonl";
    std::size_t inA = 0;
    for (const auto& e : fs::directory_iterator(a))
        inA += e.path().filename() != "gpuphot.jsonl";
    EXPECT_EQ(inA, inB);
}

// The status lines: one per input, in input order, the bad frame failed and the rest ok.
void expectLinesInOrder(const fs::path& jsonl) {
    std::size_t malformed = 99;
    const auto lines = readJsonLines(jsonl, &malformed);
    EXPECT_EQ(malformed, 0u);
    const auto in = inputs();
    ASSERT_EQ(lines.size(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ(lines[i].value("frame", ""), in[i]) << "line " << i;
        const bool bad = in[i].find("p2bad") != std::string::npos;
        EXPECT_EQ(lines[i].value("status", ""), bad ? "failed" : "ok") << lines[i].dump();
        if (bad) EXPECT_EQ(lines[i].value("exit_code", 0), 2) << lines[i].dump();
    }
}

const std::string kOptions = " --formats ecsv,csv --maps bkg,seg -q --threads 2";

} // namespace

TEST(CliPipelined, PrefetchGivesTheBytesOfTheSequentialWorkerInProcessAndInAChild) {
    TempDir seq("gpuphot_pipe_seq"), inproc("gpuphot_pipe_inproc"), child("gpuphot_pipe_child");
    const std::string frames = joined(inputs());
    // Sequential: one child process, one frame at a time.
    const CliResult s = runCli("reduce " + frames + "-j 1 --prefetch 0 -o " + seq.str() + kOptions);
    // Pipelined, in this process (the default with one worker) and in a -j 1 child.
    const CliResult p = runCli("reduce " + frames + "--prefetch 2 -o " + inproc.str() + kOptions);
    const CliResult c = runCli("reduce " + frames + "-j 1 --prefetch 1 -o " + child.str() + kOptions);
    for (const CliResult* r : {&s, &p, &c}) {
        EXPECT_EQ(r->exitCode, 1) << "one frame failed: " << r->err;
        EXPECT_NE(r->err.find("p2bad.fits"), std::string::npos) << r->err;
    }
    EXPECT_FALSE(fs::exists(inproc / "p2bad.cat.fits"));
    expectLinesInOrder(inproc / "gpuphot.jsonl");
    expectSameOutputs(seq.path, inproc.path);
    expectSameOutputs(seq.path, child.path);
    // The children answer in the order they were sent; the parent writes lines as frames finish, and
    // with one child that is input order too.
    expectLinesInOrder(child / "gpuphot.jsonl");
}

// K compute threads: the bad frame (third) fails at once while the two before it are still in their stages,
// so it is held back; lines and outputs still come in input order and with the sequential bytes.
TEST(CliPipelined, ConcurrentComputeGivesTheBytesOfTheSequentialWorkerInProcessAndInAChild) {
    TempDir seq("gpuphot_conc_seq"), k3("gpuphot_conc_k3"), k3p0("gpuphot_conc_k3p0");
    TempDir k3p2("gpuphot_conc_k3p2"), child("gpuphot_conc_child");
    const std::string frames = joined(inputs());
    const CliResult s = runCli("reduce " + frames + "--prefetch 0 -o " + seq.str() + kOptions);
    const CliResult a = runCli("reduce " + frames + "--concurrent 3 --prefetch 1 -o " + k3.str() + kOptions);
    // --prefetch 0 with K > 1: still K frames in their stages (the reader feeds them).
    const CliResult b =
        runCli("reduce " + frames + "--concurrent 3 --prefetch 0 -o " + k3p0.str() + kOptions);
    // --prefetch 2 with K = 3: frames read two ahead while three are in their stages.
    const CliResult d =
        runCli("reduce " + frames + "--concurrent 3 --prefetch 2 -o " + k3p2.str() + kOptions);
    // A batch child gets --concurrent from the parent (and more frames sent ahead).
    const CliResult c = runCli("reduce " + frames + "-j 1 --concurrent 2 -o " + child.str() + kOptions);
    for (const CliResult* r : {&s, &a, &b, &c, &d}) {
        EXPECT_EQ(r->exitCode, 1) << "one frame failed: " << r->err;
        EXPECT_NE(r->err.find("p2bad.fits"), std::string::npos) << r->err;
    }
    for (const TempDir* d : {&seq, &k3, &k3p0, &k3p2, &child}) {
        EXPECT_FALSE(fs::exists(*d / "p2bad.cat.fits"));
        expectLinesInOrder(*d / "gpuphot.jsonl");
    }
    expectSameOutputs(seq.path, k3.path);
    expectSameOutputs(seq.path, k3p0.path);
    expectSameOutputs(seq.path, k3p2.path);
    expectSameOutputs(seq.path, child.path);
    const CliResult bad = runCli("reduce " + frames + "--concurrent 0 -o " + k3.str() + kOptions);
    EXPECT_NE(bad.exitCode, 0);
    EXPECT_NE(bad.err.find("--concurrent"), std::string::npos) << bad.err;
}

// K compute threads share the cores: a frame's report says its context's share (all cores over K, rounded
// up) where no --threads was given, and --threads N as given.
TEST(CliPipelined, ConcurrentFramesShareTheCores) {
    TempDir shared("gpuphot_conc_share"), given("gpuphot_conc_given");
    const auto in = inputs();
    const std::string two = in[0] + " " + in[1] + " ";
    const CliResult a = runCli("reduce " + two + "--concurrent 2 -q --formats csv -o " + shared.str());
    const CliResult b =
        runCli("reduce " + two + "--concurrent 2 --threads 3 -q --formats csv -o " + given.str());
    ASSERT_EQ(a.exitCode, 0) << a.err;
    ASSERT_EQ(b.exitCode, 0) << b.err;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (const char* stem : {"p1", "p2"}) {
        std::ifstream ra(shared / (std::string(stem) + ".report.json")),
            rb(given / (std::string(stem) + ".report.json"));
        const auto ja = nlohmann::json::parse(ra), jb = nlohmann::json::parse(rb);
        EXPECT_EQ(ja.value("threads", -1), (cores + 1) / 2) << stem;
        EXPECT_EQ(jb.value("threads", -1), 3) << stem;
    }
}

// With --ref and the calibration beside the stages (the CUDA backend's way, here on the CPU backend through
// gpuphot-testhooks), each frame's compute thread leaves the end of its calibration, its catalog table and
// report to a finishing thread and takes the next frame: the outputs are the bytes of frames reduced one
// at a time without it, the zero points those of the sequential run, and the lines in input order.
TEST(CliPipelined, FramesFinishedBesideTheNextFramesStagesGiveTheSequentialBytes) {
    TempDir sim("gpuphot_fin_sim"), frames("gpuphot_fin_frames");
    TempDir seq("gpuphot_fin_seq"), k1("gpuphot_fin_k1"), k3("gpuphot_fin_k3");
    for (int i = 1; i <= 3; ++i) {
        const std::string name = "c" + std::to_string(i);
        ASSERT_EQ(runCli("simulate --size 640x640 --stars 500 --seed " + std::to_string(60 + i) + " -q -o " +
                         sim.str() + " --name " + name)
                      .exitCode,
                  0);
    }
    // Five frames, all calibrated against c1's reference (c2 and c3 are other fields: their calibration
    // fails, a warning in their reports, and they still give the same bytes).
    std::string list;
    for (const char* name : {"c1", "c2", "c1b", "c3", "c1c"}) {
        const std::string from = std::string(name).substr(0, 2);
        fs::copy_file(sim / (from + ".fits"), frames / (std::string(name) + ".fits"));
        list += frames / (std::string(name) + ".fits") + " ";
    }
    const std::string opts = "--ref " + sim / "c1.ref.fits" + " --formats ecsv -q --threads 2";
    const std::string beside = "GPUPHOT_NO_TYCHO2=1 GPUPHOT_TEST_CALIBRATION_BESIDE=1";
    const CliResult s = runCli("reduce " + list + "--prefetch 0 -o " + seq.str() + " " + opts);
    const CliResult a =
        runCli("reduce " + list + "--prefetch 1 -o " + k1.str() + " " + opts, beside, GPUPHOT_CLI_TESTHOOKS);
    const CliResult b = runCli("reduce " + list + "--concurrent 3 --prefetch 1 -o " + k3.str() + " " + opts,
                               beside, GPUPHOT_CLI_TESTHOOKS);
    for (const CliResult* r : {&s, &a, &b})
        EXPECT_TRUE(r->exitCode == 0 || r->exitCode == 4) << r->exitCode << " " << r->err;
    for (const char* stem : {"c1", "c1b", "c1c"}) {
        std::ifstream rs(seq / (std::string(stem) + ".report.json")),
            rb(k3 / (std::string(stem) + ".report.json"));
        const auto js = nlohmann::json::parse(rs), jb = nlohmann::json::parse(rb);
        ASSERT_TRUE(js.contains("zp") && js["zp"].is_number()) << stem << " " << js.dump().substr(0, 400);
        for (const char* key : {"zp", "zp_err", "calibration", "astrometry"})
            EXPECT_EQ(js[key], jb[key]) << stem << " " << key;
    }
    expectSameOutputs(seq.path, k1.path, 5);
    expectSameOutputs(seq.path, k3.path, 5);
    const auto lines = readJsonLines(k3 / "gpuphot.jsonl");
    ASSERT_EQ(lines.size(), 5u);
    for (std::size_t i = 0; i < lines.size(); ++i)
        EXPECT_NE(lines[i]
                      .value("frame", "")
                      .find(std::vector<std::string>{"c1.", "c2.", "c1b.", "c3.", "c1c."}[i]),
                  std::string::npos)
            << lines[i].dump();
}

namespace {
// Reduces twelve frames with `options` (the pipeline's), SIGTERMs the run after two frames, checks that
// only complete outputs exist and that a re-run completes with the catalogs of an undisturbed run.
void sigtermMidRun(const std::vector<std::string>& options) {
    TempDir sim("gpuphot_pipe_term_sim"), out("gpuphot_pipe_term_out"), ref("gpuphot_pipe_term_ref");
    // Twelve copies of a larger frame, so that the run is still busy when the signal comes.
    ASSERT_EQ(
        runCli("simulate --size 640x640 --stars 400 --seed 7 -q -o " + sim.str() + " --name big").exitCode,
        0);
    std::vector<std::string> frames;
    for (int i = 0; i < 12; ++i) {
        const fs::path f = sim / ("t" + std::to_string(10 + i) + ".fits");
        fs::copy_file(sim / "big.fits", f);
        frames.push_back(f);
    }
    fs::remove(sim / "big.fits");
    const std::string jsonl = out / "run.jsonl";
    const pid_t pid = ::fork();
    if (pid == 0) {
        const int devnull = ::open("/dev/null", O_WRONLY);
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
        ::setenv("GPUPHOT_NO_TYCHO2", "1", 1);
        std::vector<std::string> args = {GPUPHOT_CLI, "reduce",    "-o",   out.str(), "--jsonl",
                                         jsonl,       "--formats", "ecsv", "--maps",  "bkg",
                                         "--threads", "2",         "-q"};
        args.insert(args.end(), options.begin(), options.end());
        args.insert(args.end(), frames.begin(), frames.end());
        std::vector<char*> argv;
        for (auto& a : args)
            argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execv(GPUPHOT_CLI, argv.data());
        ::_exit(127);
    }
    // Signal once two frames are done (others are being read, reduced and written at that moment).
    for (int i = 0; i < 3000 && readJsonLines(jsonl).size() < 2; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::size_t before = readJsonLines(jsonl).size();
    EXPECT_LT(before, frames.size()) << "the run ended before the signal: the test proves nothing";

    // Under final names only complete files: every catalog reads, every report lists existing outputs.
    for (const auto& e : fs::directory_iterator(out.path)) {
        const std::string name = e.path().filename().string();
        if (isAtomicTemporaryName(name) || name == "run.jsonl") continue;
        EXPECT_NE(name.front(), '.') << name;
        if (name.ends_with(".cat.fits")) EXPECT_NO_THROW((void)readFitsTable(e.path().string())) << name;
        if (name.ends_with(".report.json")) {
            std::ifstream in(e.path());
            const auto report = nlohmann::json::parse(in);
            for (const auto& [k, v] : report.at("outputs").items())
                if (v.is_string()) EXPECT_TRUE(fs::exists(v.get<std::string>())) << name << " lists " << v;
        }
    }
    // A re-run skips the complete frames, reduces the rest, and leaves the catalogs of an undisturbed run.
    const CliResult again = runCli("reduce " + joined(frames) + "--prefetch 2 -o " + out.str() + " --jsonl " +
                                   (out / "again.jsonl") + " --formats ecsv --maps bkg --threads 2 -q");
    EXPECT_EQ(again.exitCode, 0) << again.err;
    std::size_t skipped = 0;
    for (const auto& j : readJsonLines(out / "again.jsonl")) {
        EXPECT_NE(j.value("status", ""), "failed") << j.dump();
        skipped += j.value("status", "") == "skipped";
    }
    EXPECT_GE(skipped, before);
    ASSERT_EQ(runCli("reduce " + frames[0] + " " + frames.back() + " --prefetch 0 -o " + ref.str() +
                     " --formats ecsv --maps bkg --threads 2 -q")
                  .exitCode,
              0);
    for (const std::string& f : {frames[0], frames.back()}) {
        const std::string stem = fs::path(f).stem().string();
        EXPECT_TRUE(bytes(out / (stem + ".cat.fits")) == bytes(ref / (stem + ".cat.fits"))) << stem;
    }
    for (const auto& e : fs::directory_iterator(out.path))
        EXPECT_FALSE(isAtomicTemporaryName(e.path().filename().string())) << e.path();
}
} // namespace

TEST(CliPipelined, SigtermMidRunLeavesNoHalfWrittenOutputAndARerunCompletes) {
    sigtermMidRun({"--prefetch", "2"});
}

TEST(CliPipelined, SigtermMidRunWithConcurrentComputeLeavesNoHalfWrittenOutput) {
    sigtermMidRun({"--prefetch", "1", "--concurrent", "3"});
}
