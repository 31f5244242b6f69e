// gpuphot submit slurm and gpuphot status without a cluster: the files a submission writes (dry run), the
// errors (no frames, no sbatch, sbatch failing), and a whole submission against stand-in sbatch/squeue/
// sacct scripts that run the array elements of job.sh one after another as Slurm would (with the same
// SLURM_ARRAY_* variables). The real-Slurm test is tests/slurm/slurm_test.sh (ctest label slurm).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/app/cli_run.hpp"

using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {

void writeFile(const fs::path& p, const std::string& text, bool executable = false) {
    std::ofstream(p) << text;
    if (executable) fs::permissions(p, fs::perms::owner_all, fs::perm_options::add);
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    std::string l;
    while (std::getline(ss, l))
        if (!l.empty()) out.push_back(l);
    return out;
}

// A bin directory with stand-ins for Slurm's tools. sbatch runs every element of the script's
// --array=0-N range in order (JOB 4242), writing each element's output where --output says.
struct FakeSlurm {
    TempDir bin{"gpuphot_fake_slurm"};
    explicit FakeSlurm(const std::string& sacctOutput = "", bool sbatchFails = false) {
        if (sbatchFails) {
            writeFile(bin.path / "sbatch",
                      "#!/bin/bash\necho 'sbatch: error: Batch job submission failed: Invalid account' "
                      ">&2\nexit 1\n",
                      true);
        } else {
            writeFile(bin.path / "sbatch",
                      "#!/bin/bash\n"
                      "script=\"${@: -1}\"\n"
                      "last=$(sed -n 's/^#SBATCH --array=0-\\([0-9]*\\).*/\\1/p' \"$script\")\n"
                      "out=$(sed -n 's/^#SBATCH --output=//p' \"$script\")\n"
                      "for i in $(seq 0 \"$last\"); do\n"
                      "  o=${out//%A/4242}; o=${o//%a/$i}\n"
                      "  SLURM_ARRAY_JOB_ID=4242 SLURM_ARRAY_TASK_ID=$i bash \"$script\" >\"$o\" 2>&1\n"
                      "done\n"
                      "echo '4242;testcluster'\n",
                      true);
        }
        writeFile(bin.path / "squeue", "#!/bin/bash\nexit 0\n", true);
        writeFile(bin.path / "sacct", "#!/bin/bash\nprintf '%s' '" + sacctOutput + "'\n", true);
    }
    std::string env() const { return "GPUPHOT_NO_TYCHO2=1 PATH=" + bin.str() + ":/usr/bin:/bin"; }
};

// Two small simulated frames of the same field and a file that is not FITS (simulated once).
struct Frames {
    TempDir dir{"gpuphot_submit_frames"};
    std::string f1 = dir / "f1.fits", f2 = dir / "f2.fits", bad = dir / "bad.fits", ref = dir / "f1.ref.fits";
    Frames() {
        const CliResult r =
            runCli("simulate --size 256x256 --stars 60 --seed 11 -o " + dir.str() + " --name f1 -q");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        fs::copy_file(f1, f2);
        writeFile(bad, "not a FITS file\n");
    }
};
const Frames& frames() {
    static Frames f;
    return f;
}

} // namespace

TEST(CliSubmitSlurm, DryRunWritesFramesListAndAnArrayScript) {
    const Frames& f = frames();
    TempDir out("gpuphot_submit_dry");
    const CliResult r = runCli("submit slurm " + f.f1 + " " + f.bad + " -o " + out.str() + " --ref " + f.ref +
                               " --gpus-per-task 2 --partition gpu --max-parallel 1 --time 5:00"
                               " --cpus-per-task 3 --dry-run -- --formats ecsv --threshold 4");
    ASSERT_EQ(r.exitCode, 0) << r.err;
    const auto list = lines(slurp(out.path / "slurm/frames.txt"));
    ASSERT_EQ(list.size(), 2u) << "the arguments after -- are not frames";
    EXPECT_EQ(list[0], f.f1);
    EXPECT_EQ(list[1], f.bad);
    const std::string script = slurp(out.path / "slurm/job.sh");
    const std::vector<std::string> wanted = {"#SBATCH --array=0-1%1\n",
                                             "#SBATCH --gres=gpu:2\n",
                                             "#SBATCH --partition=gpu\n",
                                             "#SBATCH --time=5:00\n",
                                             "#SBATCH --cpus-per-task=3\n",
                                             "#SBATCH --output=" + out.str() + "/slurm/%A_%a.out\n",
                                             std::string("'") + GPUPHOT_CLI + "' 'reduce' '-o' '" +
                                                 out.str() + "'",
                                             "'--ref' '" + f.ref + "'",
                                             "'--formats' 'ecsv' '--threshold' '4'",
                                             "--jsonl \"$STATUS\"",
                                             "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.jsonl"};
    for (const auto& want : wanted)
        EXPECT_NE(script.find(want), std::string::npos) << "job.sh lacks: " << want << "\n" << script;
    EXPECT_EQ(std::system(("bash -n " + (out / "slurm/job.sh")).c_str()), 0) << "job.sh is not valid bash";
    EXPECT_FALSE(fs::exists(out.path / "slurm/job_id")) << "a dry run submits nothing";
}

TEST(CliSubmitSlurm, ClearErrors) {
    const Frames& f = frames();
    TempDir out("gpuphot_submit_err");
    CliResult r = runCli("submit slurm -o " + out.str());
    EXPECT_EQ(r.exitCode, 2);
    EXPECT_NE(r.err.find("no frames"), std::string::npos) << r.err;
    r = runCli("submit slurm " + (out / "nosuch.fits") + " -o " + out.str());
    EXPECT_EQ(r.exitCode, 2);
    EXPECT_NE(r.err.find("nosuch.fits: no such frame"), std::string::npos) << r.err;
    // No sbatch on PATH.
    TempDir emptyBin("gpuphot_submit_nobin");
    r = runCli("submit slurm " + f.f1 + " -o " + out.str(), "PATH=" + emptyBin.str());
    EXPECT_EQ(r.exitCode, 3);
    EXPECT_NE(r.err.find("sbatch: not found on PATH"), std::string::npos) << r.err;
    // sbatch refusing the job: its stderr is shown.
    FakeSlurm failing("", true);
    r = runCli("submit slurm " + f.f1 + " -o " + out.str(), failing.env());
    EXPECT_EQ(r.exitCode, 3);
    EXPECT_NE(r.err.find("Invalid account"), std::string::npos) << r.err;
}

TEST(CliSubmitSlurm, EveryElementReducesItsFrameAndStatusCollectsTheLines) {
    const Frames& f = frames();
    TempDir out("gpuphot_submit_run");
    FakeSlurm slurm("4242_1|FAILED|1:0\n");
    CliResult r = runCli("submit slurm " + f.f1 + " " + f.bad + " " + f.f2 + " -o " + out.str() + " --ref " +
                             f.ref + " --wait --poll 0.1",
                         slurm.env());
    EXPECT_EQ(r.exitCode, 1) << "one frame failed\n" << r.out << r.err;
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(lines(r.out)[0], "4242") << "the job id comes first, without sbatch's cluster suffix";
    EXPECT_EQ(lines(slurp(out.path / "slurm/job_id"))[0], "4242");
    for (const char* name : {"f1.cat.fits", "f2.cat.fits", "f1.report.json", "f2.report.json"})
        EXPECT_TRUE(fs::exists(out.path / name)) << name;
    EXPECT_FALSE(fs::exists(out.path / "bad.cat.fits"));
    for (int t = 0; t < 3; ++t)
        EXPECT_TRUE(fs::exists(out.path / ("slurm/status/4242_" + std::to_string(t) + ".jsonl"))) << t;

    r = runCli("status " + out.str() + " --json", slurm.env());
    EXPECT_EQ(r.exitCode, 1);
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["totals"]["ok"], 2);
    EXPECT_EQ(j["totals"]["failed"], 1);
    EXPECT_EQ(j["totals"]["missing"], 0);
    ASSERT_EQ(j["frames"].size(), 3u);
    EXPECT_EQ(j["frames"][1]["frame"], f.bad);
    EXPECT_EQ(j["frames"][1]["status"], "failed");
    EXPECT_TRUE(j["frames"][0]["line"]["zp"].is_number()) << "--ref reached reduce";
    EXPECT_GT(j["frames"][2]["line"]["sources"].get<int>(), 20);

    // The text table names every frame and the totals.
    r = runCli("status " + out.str(), slurm.env());
    EXPECT_NE(r.out.find("f1.fits"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("3 frames: 2 ok"), std::string::npos) << r.out;

    // A frame whose element left no line is missing; sacct's state for its element is reported.
    fs::remove(out.path / "slurm/status/4242_1.jsonl");
    r = runCli("status " + out.str() + " --json", slurm.env());
    EXPECT_EQ(r.exitCode, 1);
    j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["totals"]["missing"], 1);
    EXPECT_EQ(j["frames"][1]["status"], "missing");
    EXPECT_EQ(j["frames"][1]["slurm"], "FAILED (exit 1:0)");
    EXPECT_EQ(j["slurm_source"], "sacct");

    // Without frames.txt the frames are those of the lines; the latest line per frame (by its time) wins.
    fs::remove(out.path / "slurm/frames.txt");
    r = runCli("status " + out.str() + " --json --no-slurm", slurm.env());
    EXPECT_EQ(r.exitCode, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out)["totals"]["ok"], 2);
    writeFile(
        out.path / "gpuphot.jsonl",
        nlohmann::json({{"frame", f.f1}, {"status", "failed"}, {"time", "2000-01-01T00:00:00Z"}}).dump() +
            "\n" +
            nlohmann::json({{"frame", f.f2}, {"status", "failed"}, {"time", "2999-01-01T00:00:00Z"}}).dump() +
            "\n{\"frame\": \"truncated\n");
    r = runCli("status " + out.str() + " --json --no-slurm", slurm.env());
    EXPECT_EQ(r.exitCode, 1);
    j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["totals"]["ok"], 1);
    EXPECT_EQ(j["totals"]["failed"], 1);
    EXPECT_EQ(j["totals"]["malformed_lines"], 1);
}
