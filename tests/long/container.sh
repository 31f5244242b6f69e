#!/usr/bin/env bash
# Builds the images the project ships and runs the demo reduction in each (docs/PACKAGING.md):
#  1. packaging/Dockerfile with podman, on a Debian 12 base made here with debootstrap (the CPU image;
#     the CUDA bases are not reachable without a registry), then `gpuphot simulate` and `gpuphot reduce`
#     in the container, whose catalog must have as many rows as the host build's for the same frame;
#  2. packaging/gpuphot.def without Apptainer (not in Debian): its header's Debian release bootstrapped
#     with debootstrap, its %files copied, its %post run in a chroot, then its %test and the demo there.
# Needs root, network access to the Debian mirror, podman, runc and debootstrap
# (apt-get install podman runc debootstrap). Usage (repository root, after a build):
#   bash tests/long/container.sh [BUILD_DIR]          Env: CONTAINER_WORK (default /var/tmp/gpuphot-containers)
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$PWD
build=$(realpath "${1:-build}")
work=${CONTAINER_WORK:-/var/tmp/gpuphot-containers}
def=packaging/gpuphot.def
mkdir -p "$work"
start=$(date +%s)

for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || { echo "container: $tool is missing (apt-get install $tool)"; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "container: run as root (debootstrap, chroot and rootful podman)"; exit 2; }

field() { sed -n "s/^$1: *//p" "$def" | head -n1; }
section() { awk -v s="%$1" '$1 == s { on = 1; next } /^%/ { on = 0 } on' "$def"; }
release=$(field OSVersion)
mirror=$(field MirrorURL)
[ "$(field Bootstrap)" = debootstrap ] && [ -n "$release" ] && [ -n "$mirror" ] ||
    { echo "container: $def must bootstrap with debootstrap and name OSVersion and MirrorURL"; exit 1; }

# One minimal Debian root for both checks, made once and kept in $work.
rootfs=$work/rootfs-$release
if [ ! -x "$rootfs/bin/sh" ]; then
    rm -rf "$rootfs.tmp"
    debootstrap --variant=minbase "$release" "$rootfs.tmp" "$mirror" >"$work/debootstrap.log"
    mv "$rootfs.tmp" "$rootfs"
fi

# The demo frame and the host build's catalog of it: the reference the images must reproduce.
host=$work/host
rm -rf "$host" && mkdir -p "$host"
"$build/app/gpuphot" simulate --config resources/demo/simulate.json -o "$host" --name demo -q
"$build/app/gpuphot" reduce "$host/demo.fits" --ref "$host/demo.ref.fits" -o "$host" --formats ecsv -q
rows() { grep -c -v -E '^(#|[A-Za-z_])' "$1"; }
want=$(rows "$host/demo.cat.ecsv")
[ "$want" -gt 100 ] || { echo "container: the host's demo catalog has only $want rows"; exit 1; }

check_demo() { # check_demo NAME DIR: the demo's outputs in DIR, as many catalog rows as the host's
    local got
    [ -s "$2/demo.cat.fits" ] && [ -s "$2/demo.report.json" ] || { echo "$1: no catalog in $2"; return 1; }
    got=$(rows "$2/demo.cat.ecsv")
    [ "$got" = "$want" ] || { echo "$1: $got catalog rows, the host build gives $want"; return 1; }
    echo "$1: demo reduced, $got rows as on the host"
}

# --- 1. the Dockerfile with podman ------------------------------------------------------------------
# Podman's default limits (1048576 open files, 32768 processes) can exceed this machine's hard limits,
# which a container may not raise, and runc is the runtime that runs on a cgroup v1/v2 hybrid: the
# limits (each the lower of the two) and the runtime go in a private containers.conf.
lower() { if [ "$1" = unlimited ] || { [ "$2" != unlimited ] && [ "$2" -lt "$1" ]; }; then echo "$2"; else echo "$1"; fi; }
nofile=$(lower "$(ulimit -Hn)" 1048576)
nproc=$(lower "$(ulimit -Hu)" 32768)
export CONTAINERS_CONF=$work/containers.conf
cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
base=localhost/gpuphot-base:$release
tar -C "$rootfs" -c . | podman import -q - "$base" >/dev/null
limits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
podman build -q --network host "${limits[@]}" -f packaging/Dockerfile \
    --build-arg BUILD_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" -t localhost/gpuphot:cpu . \
    >"$work/podman-build.log" 2>&1 || { tail -30 "$work/podman-build.log"; exit 1; }
built=$(date +%s)
out=$work/podman-demo
rm -rf "$out" && mkdir -p "$out"
run=(podman run --rm --network none "${limits[@]}" -v "$out:/data" localhost/gpuphot:cpu)
"${run[@]}" simulate --config /opt/gpuphot/share/gpuphot/simulate.json -o /data --name demo -q
"${run[@]}" reduce /data/demo.fits --ref /data/demo.ref.fits -o /data --formats ecsv -q
check_demo "Dockerfile (podman, $release)" "$out"
echo "image: $(podman image inspect localhost/gpuphot:cpu --format '{{.Size}}') bytes, build $((built - start)) s"

# --- 2. the Apptainer definition in a chroot --------------------------------------------------------
deb=$(ls "$build"/gpuphot_*_amd64.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
    (cd "$build" && cpack -G DEB >/dev/null)
    deb=$(ls "$build"/gpuphot_*_amd64.deb | head -n1)
fi
stage=$work/apptainer-stage
root=$work/apptainer-root
rm -rf "$stage" "$root" && mkdir -p "$stage"
cp "$deb" "$stage/gpuphot.deb"
cp -a "$rootfs" "$root"
cleanup() { umount "$root/proc" "$root/dev" 2>/dev/null || true; }
trap cleanup EXIT
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# %files: "source destination", the source relative to where `apptainer build` runs.
while read -r from to; do
    [ -n "$from" ] || continue
    mkdir -p "$root$(dirname "$to")"
    cp "$stage/$from" "$root$to"
done < <(section files)
section post >"$root/tmp/post.sh"
chroot "$root" /bin/sh -e /tmp/post.sh >"$work/apptainer-post.log" 2>&1 || { tail -30 "$work/apptainer-post.log"; exit 1; }
section test >"$root/tmp/test.sh"
chroot "$root" /bin/sh -e /tmp/test.sh
mkdir -p "$root/data"
chroot "$root" gpuphot simulate --config /usr/share/gpuphot/simulate.json -o /data --name demo -q
chroot "$root" gpuphot reduce /data/demo.fits --ref /data/demo.ref.fits -o /data --formats ecsv -q
check_demo "gpuphot.def (%post in a $release chroot)" "$root/data"
echo "container: done in $(($(date +%s) - start)) s"
