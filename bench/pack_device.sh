#!/usr/bin/env bash
# Builds gpuphot and kernels_tests with the CUDA backend here (no GPU needed) and copies them, with their
# non-glibc shared libraries (ldd), into .device/ (ignored by git) for a GPU machine that has only the
# driver: there, bench/gpu_session.sh runs them (LD_LIBRARY_PATH=.device/lib).
#   bench/pack_device.sh [BUILD_DIR] [DEST]   (defaults build-cuda, .device; DEST must start with .device)
# Environment: TARGETS (default "gpuphot kernels_tests") are built in BUILD_DIR; the gpuphot and
# kernels_tests among them are packed. bench_sep (sep's C core, the peer of the GPU benchmarks) is packed
# too, with libsep (ldd): SEP_BENCH=PATH names a built one (e.g. build-sepbench/bench/bench_sep), else it is
# built in BUILD_DIR when that build has the target (libsep-dev found); SEP_BENCH=none leaves it out.
# bench/peers.py travels beside gpu_session.sh (source-extractor runs there only where it is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
DEST=${2:-.device}
TARGETS=${TARGETS:-gpuphot gpuphot-testhooks kernels_tests}
case "$DEST" in .device*) ;; *) echo "DEST must start with .device (git-ignored)" >&2; exit 2 ;; esac
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -f "$BUILD/build.ninja" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DGPUPHOT_WITH_CUDA=ON -DGPUPHOT_WITH_GUI=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release
fi
SEP_BENCH=${SEP_BENCH:-}
if [ -z "$SEP_BENCH" ] && grep -q '^build bench/bench_sep:' "$BUILD/build.ninja"; then
    TARGETS="$TARGETS bench_sep"
    SEP_BENCH="$BUILD/bench/bench_sep"
fi
# shellcheck disable=SC2086
cmake --build "$BUILD" --target $TARGETS -j"$(nproc)"
rm -rf "$DEST"
mkdir -p "$DEST"/bin "$DEST"/lib
case " $TARGETS " in *" gpuphot "*)
    cp "$BUILD/app/gpuphot" "$DEST"/bin/ 2>/dev/null \
        || cp "$(find "$BUILD" -name gpuphot -type f -perm -u+x | head -1)" "$DEST"/bin/ ;;
esac
case " $TARGETS " in *" kernels_tests "*) cp "$BUILD/tests/kernels_tests" "$DEST"/bin/ ;; esac
case " $TARGETS " in *" gpuphot-testhooks "*) cp "$BUILD/app/gpuphot-testhooks" "$DEST"/bin/ ;; esac
case "$SEP_BENCH" in
    ""|none) echo "bench_sep not packed (SEP_BENCH=${SEP_BENCH:-unset}; no bench_sep target in $BUILD)" ;;
    *) cp "$SEP_BENCH" "$DEST"/bin/bench_sep ;;
esac
# Shared libraries except glibc itself and the driver (libcuda comes with the machine); libstdc++ and
# libgomp travel, so the binaries do not depend on the versions installed there.
for exe in "$DEST"/bin/*; do
    ldd "$exe" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
        *) cp -L "$lib" "$DEST"/lib/ ;;
    esac
done
cp bench/gpu_session.sh bench/peers.py "$DEST"/
du -sh "$DEST"
ls "$DEST"/lib
