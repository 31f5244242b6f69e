#!/usr/bin/env bash
# Builds gpuphot and kernels_tests with the CUDA backend here (no GPU needed) and copies them, with their
# non-glibc shared libraries (ldd), into .device/ (ignored by git) for a GPU machine that has only the
# driver: there, bench/gpu_session.sh runs them (LD_LIBRARY_PATH=.device/lib).
#   bench/pack_device.sh [BUILD_DIR] [DEST]   (defaults build-cuda, .device; DEST must start with .device)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
DEST=${2:-.device}
case "$DEST" in .device*) ;; *) echo "DEST must start with .device (git-ignored)" >&2; exit 2 ;; esac
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -f "$BUILD/build.ninja" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DGPUPHOT_WITH_CUDA=ON -DGPUPHOT_WITH_GUI=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD" --target gpuphot kernels_tests -j"$(nproc)"
rm -rf "$DEST"
mkdir -p "$DEST"/bin "$DEST"/lib
cp "$BUILD/app/gpuphot" "$DEST"/bin/ 2>/dev/null || cp "$(find "$BUILD" -name gpuphot -type f -perm -u+x | head -1)" "$DEST"/bin/
cp "$BUILD/tests/kernels_tests" "$DEST"/bin/
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
cp bench/gpu_session.sh "$DEST"/
du -sh "$DEST"
ls "$DEST"/lib
