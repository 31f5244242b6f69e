#pragma once
// Fault injection for the CLI's own tests (docs/CLI.md §Environment). Only the test build's binary,
// gpuphot-testhooks (app/hooks/from_environment.cpp), reads these from the environment; in gpuphot
// (app/hooks/none.cpp) every field keeps its default and nothing is injected.
#include <cstddef>
#include <string>

namespace gpuphot::cli {

struct CliTestHooks {
    long slowFrameMs = 0;            // GPUPHOT_TEST_SLOW_FRAME_MS: a worker sleeps inside each frame
    std::string crashFrame;          // GPUPHOT_TEST_CRASH_FRAME: a worker aborts on a frame path containing it
    std::string batchChildAbortOn;   // GPUPHOT_TEST_BATCH_CHILD_ABORT_ON: likewise for a `reduce -j` child
    std::size_t cudaFailAfterAllocs = 0; // GPUPHOT_TEST_CUDA_FAIL_ALLOC: RunContext::testHooks
    long dbKillAfterRows = 0;        // GPUPHOT_TEST_DB_KILL_AFTER_ROWS: SIGKILL inside a frame's database write
    long dbMaxPageCount = 0;         // GPUPHOT_TEST_DB_MAX_PAGES: a SQLite store "full" at that many pages
    bool calibrationBeside = false;  // GPUPHOT_TEST_CALIBRATION_BESIDE=1: RunContext::testHooks (CPU backend)
};

const CliTestHooks& cliTestHooks();

} // namespace gpuphot::cli
