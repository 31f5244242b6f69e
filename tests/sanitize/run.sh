#!/bin/bash
# Builds the core, the CLI and their test suites with AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer on) in build-asan and runs core_tests and app_tests. Any sanitizer report fails the run
# (abort_on_error / halt_on_error), and so does any failing test.
# Usage: tests/sanitize/run.sh            Env: JOBS (build -j, default 2), BUILD_DIR (default build-asan),
#        GTEST_FILTER_CORE / GTEST_FILTER_APP (override the default filters below).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build-asan}
JOBS=${JOBS:-2}
start=$(date +%s)
# -O1 -g1: the usual sanitizer build (fast to compile on 2 cores, line tables for the reports); no
# NDEBUG, so that assert()s are checked too.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPHOT_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DGPUPHOT_WITH_GUI=OFF -DGPUPHOT_WITH_CUDA=OFF >/dev/null
cmake --build "$BUILD" --target core_tests app_tests gpuphot gpuphot-testhooks -j"$JOBS"
built=$(date +%s)

# detect_leaks: LeakSanitizer. abort_on_error: a report is a failure even where the code would go on.
# The gpuphot binary that app_tests run inherits these through the environment.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# Leaks inside dependencies that our code cannot prevent (each entry explained in the file).
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0
# OpenMP's runtime keeps its thread pool until exit; LeakSanitizer does not report it (no suppression
# needed with libgomp). Two threads: CI has 2 cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# Nothing is excluded: the whole non-GUI suite takes ~2.5 min under ASan on 2 cores (docs/RELIABILITY.md,
# "Sanitizer run"). The filters stay as knobs for a quick local run.
CORE_FILTER=${GTEST_FILTER_CORE:-'*'}
APP_FILTER=${GTEST_FILTER_APP:-'*'}
status=0
"$BUILD/tests/core_tests" --gtest_filter="$CORE_FILTER" --gtest_brief=1 || status=1
core_done=$(date +%s)
"$BUILD/tests/app_tests" --gtest_filter="$APP_FILTER" --gtest_brief=1 || status=1
end=$(date +%s)
echo "sanitize: build $((built - start)) s, core_tests $((core_done - built)) s, app_tests $((end - core_done)) s," \
     "total $((end - start)) s; status $status"
exit $status
