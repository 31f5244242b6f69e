// reduce under an address-space limit (ulimit -v): each run either succeeds or ends with the
// out-of-memory status (10) and a message that says so, never an abort, and leaves no file behind.
// The long version (an 8192² frame, more limits and thread counts) is in tests/long/run.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "tests/app/cli_run.hpp"

using namespace gpuphot::test;
namespace fs = std::filesystem;

namespace {
// One frame, simulated once.
const TempDir& frameDir() {
    static TempDir dir("gpuphot_oom_sim");
    static const bool made = [] {
        const int side = std::getenv("GPUPHOT_OOM_SIDE") ? std::atoi(std::getenv("GPUPHOT_OOM_SIDE")) : 2048;
        const CliResult r = runCli("simulate --size " + std::to_string(side) + "x" + std::to_string(side) +
                                   " --stars 3000 --seed 5 -q -o " + dir.str() + " --name big");
        EXPECT_EQ(r.exitCode, 0) << r.err;
        return true;
    }();
    (void)made;
    return dir;
}

std::size_t filesIn(const fs::path& dir) {
    std::size_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        n += e.is_regular_file();
    return n;
}
} // namespace

// AddressSanitizer reserves terabytes of shadow address space at start-up, so a process under ulimit -v
// cannot even start; the sanitizer build leaves this check to the plain build.
#if defined(__SANITIZE_ADDRESS__)
#define GPUPHOT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPUPHOT_TEST_ASAN 1
#endif
#endif

TEST(CliOom, ReduceUnderAnAddressSpaceLimitSucceedsOrSaysOutOfMemory) {
#ifdef GPUPHOT_TEST_ASAN
    GTEST_SKIP() << "AddressSanitizer build: an address-space limit stops the process before main";
#endif
    const fs::path frame = fs::path(frameDir() / "big.fits");
    // From too little to start the reduction to enough for all of it (MiB of address space; a 2048² frame
    // with every map needs about 150).
    const char* limitsEnv = std::getenv("GPUPHOT_OOM_LIMITS_MB");
    const std::string limits = limitsEnv ? limitsEnv : "60 100 150 300 1000";
    int ok = 0, oom = 0;
    std::istringstream in(limits);
    for (long mb; in >> mb;) {
        for (int threads : {1, 2}) {
            TempDir out("gpuphot_oom_out");
            const std::string env = "ulimit -v " + std::to_string(mb * 1024) + "; GPUPHOT_NO_TYCHO2=1";
            const CliResult r =
                runCli("reduce " + frame.string() + " --backend cpu --threads " + std::to_string(threads) +
                           " --maps bkg,rms,seg,psf,resid -q -o " + out.str(),
                       env);
            const std::string what = std::to_string(mb) + " MiB, " + std::to_string(threads) + " threads: ";
            ASSERT_TRUE(r.exitCode == 0 || r.exitCode == 10) << what << "exit " << r.exitCode << "\n"
                                                             << r.err;
            if (r.exitCode == 0) {
                ++ok;
                EXPECT_TRUE(fs::exists(out / "big.cat.fits")) << what;
                continue;
            }
            ++oom;
            EXPECT_NE(r.err.find("out of memory"), std::string::npos) << what << r.err;
            EXPECT_NE(r.err.find("--threads"), std::string::npos) << what << "the advice: " << r.err;
            EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << what << r.err;
            EXPECT_EQ(filesIn(out.path), 0u) << what << "nothing left behind";
        }
    }
    // The limits bracket the need: both outcomes were seen (else the test proves nothing).
    EXPECT_GT(ok, 0) << "no limit was enough: raise the largest in GPUPHOT_OOM_LIMITS_MB";
    EXPECT_GT(oom, 0) << "no limit was too small: lower the smallest";
}
