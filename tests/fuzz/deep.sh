#!/bin/bash
# The deep fuzz run (docs/RELIABILITY.md, "Deep runs"): each libFuzzer target for FUZZ_DEEP_RUNS inputs in
# total (default 10^6), spread over FUZZ_DEEP_JOBS processes that share one growing corpus (libFuzzer
# reloads it), then one pass over that corpus to measure the edge coverage it reaches. CI runs the short,
# fixed-seed gate instead (tests/fuzz/run.sh); this is the nightly-style check, meant for a many-core
# machine.
# Usage: tests/fuzz/deep.sh [target ...]            (default: every target tests/fuzz/run.sh knows)
# Env:   FUZZ_BIN (the built targets, default build-fuzz/tests/fuzz; tests/fuzz/run.sh builds them),
#        FUZZ_DEEP_RUNS (default 1000000), FUZZ_DEEP_JOBS (default nproc), FUZZ_DEEP_SEED (default 1),
#        FUZZ_WORK (default build-fuzz/fuzz-deep: corpora, logs, reproducers, summary.txt),
#        FUZZ_DEEP_LEAKS: "each" (default: LeakSanitizer after every input, with the full-stack unwinder
#        that the WCSLIB suppression needs for the reader targets) or "replay" (the mutation run without
#        leak checks and with ASan's fast unwinder, several times faster on the reader targets; then the
#        whole grown corpus is replayed with leak checks and the full unwinder, and a leak there fails the
#        run). ASan and UBSan check every input either way; "replay" misses a leak that only an input
#        which added no coverage would show.
# Exit status: non-zero when any process finds a crash, leak, timeout or OOM (reproducers in
# FUZZ_WORK/<target>/), or runs fewer inputs than asked.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${FUZZ_BIN:-build-fuzz/tests/fuzz}
RUNS=${FUZZ_DEEP_RUNS:-1000000}
JOBS=${FUZZ_DEEP_JOBS:-$(nproc)}
SEED=${FUZZ_DEEP_SEED:-1}
WORK=${FUZZ_WORK:-build-fuzz/fuzz-deep}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(fuzz_fits_reader fuzz_header_wcs fuzz_refcat fuzz_config fuzz_tile_image
    fuzz_gzip_fits fuzz_targets fuzz_sextractor fuzz_results_db)
# As tests/fuzz/run.sh: the sanitizers' reports are findings; one OpenMP thread per process. The LSan
# suppressions match function names: on a machine without llvm-symbolizer, point ASAN_SYMBOLIZER_PATH at
# a copy of binutils' addr2line (named addr2line).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
asan_options() {
    case $1 in
        fuzz_header_wcs | fuzz_fits_reader | fuzz_gzip_fits) echo "$ASAN_OPTIONS:fast_unwind_on_malloc=0" ;;
        *) echo "$ASAN_OPTIONS" ;;
    esac
}
LEAKS=${FUZZ_DEEP_LEAKS:-each}
case "$LEAKS" in each | replay) ;; *) echo "FUZZ_DEEP_LEAKS must be each or replay" >&2; exit 2 ;; esac
# The mutation run's options: as asan_options, or without leak checks (fast unwinder) with "replay".
run_options() {
    if [ "$LEAKS" = replay ]; then echo "${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}"; else asan_options "$1"; fi
}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}
export OMP_NUM_THREADS=1
mkdir -p "$WORK"
summary=$WORK/summary.txt
: >"$summary"
status=0
per=$(((RUNS + JOBS - 1) / JOBS))
for t in "${TARGETS[@]}"; do
    name=${t#fuzz_}
    dir=$WORK/$t
    rm -rf "$dir" && mkdir -p "$dir/corpus"
    seeds=("tests/fuzz/corpus/$name")
    [ -d "tests/fuzz/regressions/$name" ] && seeds+=("tests/fuzz/regressions/$name")
    start=$(date +%s)
    pids=()
    for ((j = 0; j < JOBS; j++)); do
        ASAN_OPTIONS=$(run_options "$t") "$BIN/$t" "$dir/corpus" "${seeds[@]}" -runs="$per" -seed=$((SEED * 1000 + j)) -rss_limit_mb=2048 \
            -malloc_limit_mb=1024 -timeout=20 -max_len=65536 -print_final_stats=1 -reload=10 \
            -artifact_prefix="$dir/" >"$dir/log.$j" 2>&1 &
        pids+=($!)
    done
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
    secs=$(($(date +%s) - start))
    execs=$(cat "$dir"/log.* | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s += $1} END {print s + 0}')
    # The coverage the grown corpus reaches in the code under test: one pass, no mutation, with leak checks
    # (the check of "replay"; LeakSanitizer also reports at exit what the whole pass leaked).
    replay=0
    ASAN_OPTIONS=$(asan_options "$t") "$BIN/$t" -runs=0 "$dir/corpus" "${seeds[@]}" -max_len=65536 -rss_limit_mb=2048 \
        -timeout=20 >"$dir/replay.log" 2>&1 || replay=1
    cov=$(sed -n 's/.*INITED cov: \([0-9]*\) ft: \([0-9]*\) corp: \([0-9]*\).*/\1 \2 \3/p' "$dir/replay.log" | tail -1)
    read -r edges features units <<<"${cov:-? ? ?}"
    artifacts=$(find "$dir" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' -o -maxdepth 1 \
        -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
    line="$t: $execs inputs in $secs s ($JOBS processes, leaks: $LEAKS), cov $edges ft $features, corpus $units, findings $artifacts"
    [ "$replay" = 0 ] || line="$line, the corpus replay FAILED ($dir/replay.log)"
    echo "$line" | tee -a "$summary"
    if [ "$failed" -gt 0 ] || [ "$artifacts" -gt 0 ] || [ "$execs" -lt "$RUNS" ] || [ "$replay" != 0 ]; then
        status=1
        for f in "$dir"/log.*; do
            grep -q -E 'ERROR|SUMMARY|deadly' "$f" && { echo "-- $f"; grep -E -A25 'ERROR|deadly' "$f" | head -60; }
        done
    fi
done
exit $status
