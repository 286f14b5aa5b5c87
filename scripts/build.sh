#!/usr/bin/env bash
# Configure + build into ${BUILD_DIR:-build}. Extra args go to cmake configure.
# TARGETS="fp8kv ..." builds only those targets (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GEN=""; command -v ninja >/dev/null && GEN="-G Ninja"
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" $GEN -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >/dev/null
else
  cmake -S . -B "$BUILD_DIR" "$@" >/dev/null
fi
# shellcheck disable=SC2086  # TARGETS is a list
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" ${TARGETS:+--target $TARGETS}
