#!/usr/bin/env bash
# ThreadSanitizer over the concurrent paths (issue 28 item 6; a long check, not in CI): builds build-tsan
# (CPU backend, GUI on, -DGPUPHOT_TSAN=ON) and runs
#   ui   the workbench's PipelineWorker on its thread (tests/ui/worker_test.cpp, provisional_test.cpp,
#        prepare_worker_test.cpp, the RunScheduler debounce)
#   app  reduce --prefetch N and --concurrent K (in process and in a child, and SIGTERM mid-run), batch
#        reduce -j 2 (also with --db and with a dying worker), gpuphot watch: the gpuphot processes that
#        app_tests start are the build-tsan binaries and inherit TSAN_OPTIONS, so they run instrumented too.
#        Not CliKill.BatchChildrenDieWithTheirParent: it kills at a random moment within the undisturbed
#        run's time, and under TSan's varying slowdown a killed run finished first in one run here (a timing
#        failure, no report); its -j 2 paths run in CliBatch and CliDb.
# Any report, in the test binaries or in a gpuphot child, fails the run: every process writes its reports to
# $BUILD/tsan-logs/report.<pid> (log_path), so that a child's report is seen even where the test accepts the
# child's failure; the script prints them and exits 1.
#
# Compiler: clang 14 with LLVM's OpenMP runtime (libomp) and its Archer tool (libarcher), not gcc 12 with
# libgomp (not tried). libgomp synchronises its team through futexes that ThreadSanitizer does not see, a
# known source of false reports around `#pragma omp parallel` regions (the usual advice is a libgomp
# rebuilt with --disable-linux-futex).
# libomp + Archer tell ThreadSanitizer about the region's fork/join, barriers, tasks and locks (OMPT), so
# races inside and around our parallel loops are reported and the runtime's own synchronisation is not.
# Uninstrumented dependencies (Qt 6, libomp itself, cfitsio, ...): ignore_noninstrumented_modules=1 (as
# Archer asks) drops accesses that their code makes through intercepted calls (malloc, memcpy,
# pthread_mutex_init inside libomp), which ThreadSanitizer cannot order; their locks are still seen.
# Qt's posted-event queue is not (its QMutex is a futex in libQt6Core): tests/sanitize/tsan.supp holds the
# two Qt frames suppressed for that, and why.
# Needs: clang-14, libomp-14-dev (libarcher.so), the project's usual -dev packages.
#
# Usage: bash tests/long/tsan.sh      Env: JOBS (build -j, default 2), BUILD_DIR (default build-tsan),
#        GTEST_FILTER_UI / GTEST_FILTER_APP (override the filters below), OMP_NUM_THREADS (default 2).
# Builds go through `flock /tmp/build.lock` so that they never run beside another build on a shared machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build-tsan}
JOBS=${JOBS:-2}
LLVM=/usr/lib/llvm-14
start=$(date +%s)
# -O1 -g1 as tests/sanitize/run.sh: fast to compile on 2 cores, line tables for the reports; no NDEBUG.
flock /tmp/build.lock env CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPHOT_TSAN=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DGPUPHOT_WITH_GUI=ON -DGPUPHOT_WITH_CUDA=OFF -DGPUPHOT_BUILD_TESTS=ON \
    >/dev/null || { echo "tsan: configure failed"; exit 1; }
flock /tmp/build.lock cmake --build "$BUILD" --target ui_tests app_tests gpuphot gpuphot-testhooks -j"$JOBS" ||
    { echo "tsan: build failed"; exit 1; }
built=$(date +%s)

LOGS=$PWD/$BUILD/tsan-logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
# halt_on_error: the first report ends the process (exit 66). second_deadlock_stack: both stacks of a
# lock-order inversion. Suppressions: dependencies only, each entry explained in the file.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/tests/sanitize/tsan.supp:log_path=$LOGS/report"
# Archer: libomp's ThreadSanitizer annotations (see above). Loaded explicitly, not left to the search path.
export OMP_TOOL_LIBRARIES=$LLVM/lib/libarcher.so
# Two threads: this machine (and CI) have 2 cores; two is also the least that has anything to race.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export QT_QPA_PLATFORM=offscreen

UI_FILTER=${GTEST_FILTER_UI:-'PipelineWorker.*:PipelineWorkerProvisional.*:PrepareWorker.*:RunScheduler.*'}
APP_FILTER=${GTEST_FILTER_APP:-'CliPipelined.*:CliWatch.*:CliBatch.*:CliDb.*'}
status=0
"$BUILD/tests/ui_tests" --gtest_filter="$UI_FILTER" --gtest_brief=1 || { echo "tsan: ui_tests failed"; status=1; }
ui_done=$(date +%s)
"$BUILD/tests/app_tests" --gtest_filter="$APP_FILTER" --gtest_brief=1 || { echo "tsan: app_tests failed"; status=1; }
end=$(date +%s)

reports=$(find "$LOGS" -type f | wc -l)
if [ "$reports" -gt 0 ]; then
    status=1
    for f in "$LOGS"/*; do
        echo "---- $f"
        cat "$f"
    done
fi
# build: configure + build, waiting for /tmp/build.lock included.
echo "tsan: build $((built - start)) s, ui_tests $((ui_done - built)) s, app_tests $((end - ui_done)) s," \
     "total $((end - start)) s; $reports report(s); status $status"
exit $status
