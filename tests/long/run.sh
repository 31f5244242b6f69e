#!/usr/bin/env bash
# The long checks: what CI runs only in a short form. Run from the repository root after
# `bash packaging/dev.sh build`; prints each check's summary line and exits non-zero on a failure.
#   bash tests/long/run.sh [BUILD_DIR]        (default build)
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
status=0
check() { # check NAME command...
    local name=$1; shift
    echo "== $name"
    if ! "$@"; then
        echo "== $name: FAILED"
        status=1
    fi
}
# 20 SIGKILLs of a `reduce -j 2` parent at random moments (CI: 3).
check "batch children die with their parent (20 kills)" \
    env GPUPHOT_KILL_TRIALS=20 "$build/tests/app_tests" --gtest_filter='CliKill.BatchChildrenDieWithTheirParent'
# reduce of an 8192² frame with every map under address-space limits from far too small to enough, with 1
# and 2 threads (CI: a 2048² frame): each run succeeds or exits 10 saying "out of memory", never aborts.
check "out of memory is a clean error (8192², 7 limits x 2 thread counts)" \
    env GPUPHOT_OOM_SIDE=8192 GPUPHOT_OOM_LIMITS_MB="1024 1536 2048 3072 4096 6144 16384" \
    "$build/tests/app_tests" --gtest_filter='CliOom.*'
# ThreadSanitizer in its own build-tsan (clang 14 + libomp; ~23 min to build from scratch, ~2 min to run on
# 2 cores): the workbench's PipelineWorker, reduce --prefetch / --concurrent, batch -j 2 and watch, the
# gpuphot children instrumented too (CI: none).
check "ThreadSanitizer: worker, --prefetch, --concurrent, -j 2, watch" bash tests/long/tsan.sh
# The container images: packaging/Dockerfile built with podman and the demo reduced in it, the Apptainer
# definition's %post run in a Debian 12 chroot (root, network to the Debian mirror; ~20 min on 2 cores).
check "container images built, the demo reduced in them" bash tests/long/container.sh "$build"
exit $status
