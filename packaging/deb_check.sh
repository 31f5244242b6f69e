#!/usr/bin/env bash
# CI step: build the Debian packages from a configured build directory, install them with dpkg -i,
# check that the installed programs run, and remove them again.  Usage: packaging/deb_check.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== packaging: cpack -G DEB in $build"
(cd "$out" && cpack --config "$build/CPackConfig.cmake" -G DEB >cpack.log 2>&1) || { cat "$out/cpack.log"; exit 1; }
ls -l "$out"/*.deb
for deb in "$out"/*.deb; do dpkg-deb --info "$deb" | sed -n '/Package:/p;/Depends:/p'; done
echo "== dpkg -i"
$SUDO dpkg -i "$out"/*.deb
status=0
installed=$(command -v gpuphot || true)
if [ "$installed" != /usr/bin/gpuphot ]; then echo "gpuphot not installed in /usr/bin (found: $installed)"; status=1; fi
/usr/bin/gpuphot --version || status=1
/usr/bin/gpuphot simulate --help >/dev/null || status=1
if [ -e /usr/bin/gpuphot-studio ]; then
  QT_QPA_PLATFORM=offscreen /usr/bin/gpuphot-studio --version || status=1
  test -f /usr/share/applications/gpuphot-studio.desktop || { echo "desktop file missing"; status=1; }
  test -f /usr/share/icons/hicolor/scalable/apps/gpuphot-studio.svg || { echo "icon missing"; status=1; }
fi
echo "== dpkg -r"
$SUDO dpkg -r gpuphot-studio gpuphot >/dev/null 2>&1 || $SUDO dpkg -r gpuphot >/dev/null
[ $status = 0 ] && echo "== .deb packages built, installed, ran and removed"
exit $status
