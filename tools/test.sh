#!/usr/bin/env bash
# Builds tessel and runs every test: unit, multi-process (through
# tessel-launch), process-level failure checks and the install check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
build_dir=${TESSEL_BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
