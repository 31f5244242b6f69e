#!/bin/bash
# Builds the libFuzzer targets with clang (-fsanitize=fuzzer,address,undefined; the core is instrumented
# with fuzzer-no-link) in build-fuzz and runs each for FUZZ_SECONDS (default 60) on its seed corpus.
# Usage: tests/fuzz/run.sh [target ...]        (default: all nine)
# Env:   FUZZ_SECONDS (per target), FUZZ_JOBS (build -j, default 2), BUILD_DIR (default build-fuzz),
#        FUZZ_WORK (where the growing corpora and crash files go, default BUILD_DIR/fuzz-work),
#        FUZZ_SEED (libFuzzer -seed; unset: a random seed, as for exploratory runs),
#        FUZZ_RUNS=default (a fixed number of inputs per target, about 60 s each on CI; FUZZ_SECONDS stays
#        the cap) or a number (the same count for every target). With FUZZ_SEED and FUZZ_RUNS set and a fresh
#        FUZZ_WORK, a run is reproducible: the same commit finds the same things (the test command's mode,
#        so CI does not pass or fail by the luck of the draw; long exploratory runs leave both unset).
# Exit status: non-zero when a build fails or any target finds a crash, leak, timeout or OOM (CI gates
# on it: packaging/dev.sh test); the reproducer is FUZZ_WORK/<target>/crash-*, timeout-*, leak-* or
# oom-* (run: BUILD_DIR/tests/fuzz/<target> FILE). Once fixed, it goes to tests/fuzz/regressions/<name>/
# (replayed by every run) and becomes a Reliability.Fuzz* test in tests/core/reliability_test.cpp.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_TARGET=${FUZZ_SECONDS:-60}
JOBS=${FUZZ_JOBS:-2}
BUILD=${BUILD_DIR:-build-fuzz}
WORK=${FUZZ_WORK:-$BUILD/fuzz-work}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(fuzz_fits_reader fuzz_header_wcs fuzz_refcat fuzz_config fuzz_tile_image
    fuzz_gzip_fits fuzz_targets fuzz_sextractor fuzz_results_db)

FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGPUPHOT_FUZZ=ON -DGPUPHOT_WITH_GUI=OFF -DGPUPHOT_WITH_CUDA=OFF -DGPUPHOT_BUILD_TESTS=OFF \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" >/dev/null
cmake --build "$BUILD" --target "${TARGETS[@]}" -j"$JOBS"

# ASan's fast unwinder on malloc: the slow one (fast_unwind_on_malloc=0, full stacks in a leak report)
# more than halves the rate of the reader targets; re-run a finding with it for its whole stack. The
# targets that reach WCSLIB's transforms (header_wcs, and readFrame's in fits_reader and gzip_fits) need
# it for its suppressed leak (tests/fuzz/lsan.supp: WCSLIB has no frame pointers, so the suppression
# matches only a full stack).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
asan_options() {
    case $1 in
        fuzz_header_wcs | fuzz_fits_reader | fuzz_gzip_fits) echo "$ASAN_OPTIONS:fast_unwind_on_malloc=0" ;;
        *) echo "$ASAN_OPTIONS" ;;
    esac
}
# One OpenMP thread: the reader's parallel loops on inputs of a few kB spend more in the runtime's
# spinning than in the code under test (a third of the time with 2 threads).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}
status=0
for t in "${TARGETS[@]}"; do
    name=${t#fuzz_}
    mkdir -p "$WORK/$t/corpus"
    log="$WORK/$t/log.txt"
    echo "== $t: ${SECONDS_PER_TARGET} s"
    # New inputs go to the work corpus; the checked-in seeds and the inputs of past findings
    # (tests/fuzz/regressions/<name>, replayed first, so a regression fails at once) are read only.
    # -rss_limit_mb and -malloc_limit_mb: a single allocation beyond 1 GiB (an absurd NAXIS that slipped
    # through) is a finding.
    extra=()
    [ -n "${FUZZ_SEED:-}" ] && extra+=(-seed="$FUZZ_SEED")
    if [ "${FUZZ_RUNS:-}" = default ]; then
        # 30-60 s each at the rates of a 2-core machine
        case $t in
            fuzz_fits_reader) extra+=(-runs=7000) ;;
            fuzz_header_wcs) extra+=(-runs=18000) ;;
            fuzz_refcat) extra+=(-runs=150000) ;;
            fuzz_config) extra+=(-runs=75000) ;;
            fuzz_tile_image) extra+=(-runs=60000) ;;
            fuzz_gzip_fits) extra+=(-runs=10000) ;;
            fuzz_targets) extra+=(-runs=30000) ;;
            fuzz_sextractor) extra+=(-runs=200000) ;;
            fuzz_results_db) extra+=(-runs=50000) ;;
        esac
    elif [ -n "${FUZZ_RUNS:-}" ]; then
        extra+=(-runs="$FUZZ_RUNS")
    fi
    dirs=("tests/fuzz/corpus/$name")
    [ -d "tests/fuzz/regressions/$name" ] && dirs+=("tests/fuzz/regressions/$name")
    if ! ASAN_OPTIONS=$(asan_options "$t") "$BUILD/tests/fuzz/$t" "$WORK/$t/corpus" "${dirs[@]}" \
            -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=20 \
            -max_len=65536 -print_final_stats=1 -artifact_prefix="$WORK/$t/" "${extra[@]}" >"$log" 2>&1; then
        echo "!! $t failed; the reproducer is in $WORK/$t/ (tail of $log):"
        tail -40 "$log"
        status=1
    fi
    grep -E '^stat::number_of_executed_units|^stat::average_exec_per_sec|^stat::peak_rss_mb' "$log" | tr '\n' ' '
    grep -E '#[0-9]+ +DONE' "$log" | tail -1 || true
done
exit $status
