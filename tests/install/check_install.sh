#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds the consumer project
# against it with find_package(tessel), and runs it on 1 and 2 ranks.
set -euo pipefail
build_dir=$1
src_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
launcher=$work/prefix/bin/tessel-launch
test -x "$launcher" || { echo "tessel-launch was not installed"; exit 1; }
test -f "$work/prefix/lib/cmake/tessel/tesselConfig.cmake" || { echo "no package config installed"; exit 1; }
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$src_dir/tests/install/consumer" -B "$work/consumer" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/consumer/consumer"
"$launcher" --nproc_per_node 2 --master_port 0 -- "$work/consumer/consumer"
echo "install check passed: find_package(tessel) from $work/prefix"
