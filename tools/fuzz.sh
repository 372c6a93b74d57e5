#!/usr/bin/env bash
# Fuzzes every reader of outside bytes with libFuzzer + ASan + UBSan.
#
#   bash tools/fuzz.sh [SECONDS] [TARGET...]     (default: 30 s each, all targets)
#   TESSEL_FUZZ_RUNS=1000000 bash tools/fuzz.sh 600   (each target until 1 M executions, at most 600 s)
#
# Builds build-fuzz/ with Debian's clang (TESSEL_FUZZ=ON), then runs each
# target for SECONDS on a working copy of its seed corpus (tests/fuzz/corpus/
# is only read). Prints executions per target; exits non-zero on any crash,
# leak, timeout or out-of-memory, leaving the reproducer in build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
build_dir=${TESSEL_FUZZ_BUILD_DIR:-build-fuzz}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
mkdir -p "$build_dir"
CC=clang CXX=clang++ cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTESSEL_FUZZ=ON -DTESSEL_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link $san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" > "$build_dir/configure.log"
cmake --build "$build_dir" --target fuzz_targets -j "${TESSEL_JOBS:-$(nproc)}"

targets=("$@")
if ((${#targets[@]} == 0)); then
  for src in tests/fuzz/*_fuzz.cc; do
    name=$(basename "$src" _fuzz.cc)
    targets+=("$name")
  done
fi
status=0
printf '%-16s %12s %10s %8s %s\n' target executions exec/s corpus result
for t in "${targets[@]}"; do
  work="$build_dir/fuzz-work/$t"
  seeds="$PWD/tests/fuzz/corpus/$t"
  mkdir -p "$work/corpus"
  log="$work/log.txt"
  runs=()
  [[ -n "${TESSEL_FUZZ_RUNS:-}" ]] && runs=(-runs="$TESSEL_FUZZ_RUNS")
  if (cd "$work" && ASAN_OPTIONS=detect_leaks=1 "../../tests/fuzz/fuzz_$t" -max_total_time="$seconds" "${runs[@]}" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 corpus "$seeds") > "$log" 2>&1; then
    result=ok
  else
    result="FAILED (see $log)"
    status=1
  fi
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  files=$(find "$work/corpus" -type f | wc -l)
  printf '%-16s %12s %10s %8s %s\n' "$t" "$execs" "$rate" "$files" "$result"
done
exit $status
