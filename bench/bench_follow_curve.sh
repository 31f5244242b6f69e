#!/usr/bin/env bash
# Latency of the workbench's light curve while following a folder: from a new frame's arrival in the
# followed folder to its point in the light-curve panel (announced, reduced, catalog written, appended).
# Runs the GUI test that drives it (tests/ui/lightcurve_panel_test.cpp: a simulated night of 400² frames,
# 40 catalogs already in FOLDER/gpuphot) RUNS times under Xvfb and prints each run's figures.
#
#   bench/bench_follow_curve.sh [RUNS] [BUILD_DIR]     (defaults: 5, build)
set -euo pipefail
runs=${1:-5} build=${2:-build}
[[ -x $build/tests/ui_tests ]] || { echo "bench_follow_curve: build $build/tests/ui_tests first" >&2; exit 2; }
for ((k = 0; k < runs; ++k)); do
    xvfb-run -a "$build/tests/ui_tests" --gtest_filter='LightCurvePanel.ANewFrameInTheFollowedFolderAddsAPoint' 2>&1 |
        grep -E "new frame to new point|FAILED" || { echo "bench_follow_curve: the test did not run" >&2; exit 1; }
done
