// gpuphot-testhooks (tests only, never installed): the fault injection of test_hooks.hpp from the
// environment.
#include <cstdlib>

#include "app/cli/test_hooks.hpp"

namespace gpuphot::cli {

namespace {
std::string text(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}
} // namespace

const CliTestHooks& cliTestHooks() {
    static const CliTestHooks hooks = [] {
        CliTestHooks h;
        h.slowFrameMs = std::atol(text("GPUPHOT_TEST_SLOW_FRAME_MS").c_str());
        h.crashFrame = text("GPUPHOT_TEST_CRASH_FRAME");
        h.batchChildAbortOn = text("GPUPHOT_TEST_BATCH_CHILD_ABORT_ON");
        const long long n = std::atoll(text("GPUPHOT_TEST_CUDA_FAIL_ALLOC").c_str());
        h.cudaFailAfterAllocs = n > 0 ? static_cast<std::size_t>(n) : 0;
        h.dbKillAfterRows = std::atol(text("GPUPHOT_TEST_DB_KILL_AFTER_ROWS").c_str());
        h.dbMaxPageCount = std::atol(text("GPUPHOT_TEST_DB_MAX_PAGES").c_str());
        h.calibrationBeside = text("GPUPHOT_TEST_CALIBRATION_BESIDE") == "1";
        return h;
    }();
    return hooks;
}

} // namespace gpuphot::cli
