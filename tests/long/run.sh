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
exit $status
