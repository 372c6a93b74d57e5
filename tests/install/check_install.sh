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
# Public headers expose no backend internals: no Gloo include, no internal
# autograd or store headers.
if grep -rln "gloo/" "$work/prefix/include/tessel"; then echo "installed headers include Gloo"; exit 1; fi
for internal in graph/autograd_internal.h core/comm/tcp_store.h core/comm/gloo_communicator.h; do
  if test -e "$work/prefix/include/tessel/$internal"; then echo "internal header installed: $internal"; exit 1; fi
done
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S "$src_dir/tests/install/consumer" -B "$work/consumer" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/consumer/consumer"
"$work/consumer/core_consumer"
"$launcher" --nproc_per_node 2 --master_port 0 -- "$work/consumer/consumer"
echo "install check passed: find_package(tessel) from $work/prefix"
