#!/usr/bin/env bash
# Configures and builds tessel in ./build (or $TESSEL_BUILD_DIR) with ccache.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TESSEL_BUILD_DIR:-build}
jobs=${TESSEL_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} "$@"
cmake --build "$build_dir" -j "$jobs"
