#!/usr/bin/env bash
# Packs the CUDA build's binaries for a device call: gpu/bin.tar.xz (stripped, xz; ~4 MB, so the
# call stays far under the 64 MiB it may carry). gpu/ is ignored by git; name it in `carry`.
#   bash tools/device/pack.sh [BUILD_DIR]      (default build-cuda)
#   PACK_BINS="qflash_lab_gemv_q4" bash tools/device/pack.sh   (a subset: e.g. after building only the
#   lab target, for STEPS="labq4"; the default packs every binary below)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-build-cuda}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
STAGE=$(mktemp -d)
mkdir -p "$STAGE/bin" "$ROOT/gpu"
for b in ${PACK_BINS:-qflash qflash_tests qflash_e2e_tests qflash_gemv_bench qflash_lab_gemv_tc qflash_lab_gemv_fma qflash_lab_gemv_q4 qflash_gemm_bench qflash_gdn_bench}; do
  cp "$BUILD/$b" "$STAGE/bin/"
done
strip "$STAGE"/bin/qflash*
(cd "$ROOT" && echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src bench tests || echo +dirty)") >"$STAGE/bin/COMMIT"
# The source path compiled into the test binaries (they read fixtures under it); session.sh links it.
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" >"$STAGE/bin/SOURCE_DIR"
tar -C "$STAGE" -cf - bin | xz -9 -T2 >"$ROOT/gpu/bin.tar.xz.tmp"
mv "$ROOT/gpu/bin.tar.xz.tmp" "$ROOT/gpu/bin.tar.xz"
rm -rf "$STAGE"
ls -la "$ROOT/gpu/bin.tar.xz"
