#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU, a CUDA 13
# runtime and PyTorch (python3) but no build of tessel: it unpacks the
# bundle tools/gpu_bundle.sh made (build/gpu_bundle/tessel_gpu.tar.xz) and
# runs, with TESSEL_REQUIRE_GPU=1 so that nothing passes by skipping:
#   the CUDA runtime tests, every op's parity on the GPU (f32, bf16, f16)
#   against PyTorch, the multi-tensor kernels, NCCL on one rank,
#   test_train_cuda.py (tessel-train on the GPU against the CPU), an op
#   profile from CUDA events, and with --bench the GPT-2 medium and Llama 1B
#   benchmarks (tessel alone; --peers adds PyTorch eager and torch.compile).
# Each step's log and a summary (GPU, driver, pass/fail and seconds per step)
# go to $OUT (or /tmp/gpu_check); the exit code is the number of failed steps.
#
#   bash tools/gpu_bundle.sh                          # here, after tools/build.sh
#   bash tools/gpu_check.sh [--bench] [--peers] [--only=op_parity,...]   # there
# (--only runs the named steps alone: a rerun after a fix.)
set -uo pipefail
cd "$(dirname "$0")/.."
bench=0 peers=0 only=
for a in "$@"; do
  case "$a" in
    --bench) bench=1 ;;
    --peers) bench=1 peers=1 ;;
    --only=*) only=,${a#--only=}, ;;
    *) echo "gpu_check: unknown argument $a (expected --bench, --peers or --only=STEP,...)" >&2; exit 2 ;;
  esac
done
bundle=${TESSEL_GPU_BUNDLE:-build/gpu_bundle/tessel_gpu.tar.xz}
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
summary=$out/summary.txt
[ -f "$bundle" ] || { echo "gpu_check: no bundle at $bundle; run tools/gpu_bundle.sh where tessel builds" >&2; exit 2; }
work=$(mktemp -d /tmp/tessel_gpu.XXXXXX)
tar -C "$work" -xJf "$bundle"
bin=$work/bin

# The CUDA libraries tessel links or opens (the runtime; cuBLAS, cuBLASLt and NCCL):
# the toolkit's, or the ones PyTorch's wheels bring.
cuda_dirs=()
for lib in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
  found=$(find /usr/local/cuda/ /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu/ /opt /usr/local/lib \
    -maxdepth 8 -name "$lib" 2> /dev/null | head -n 1)
  [ -n "$found" ] && cuda_dirs+=("$(dirname "$found")")
done
cuda_path=$(printf '%s\n' "${cuda_dirs[@]}" | awk '!seen[$0]++' | paste -sd: -)
export LD_LIBRARY_PATH=$work/lib${cuda_path:+:$cuda_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TESSEL_REQUIRE_GPU=1 TESSEL_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1
export TESSEL_TORCH_PYTHON=${TESSEL_TORCH_PYTHON:-$(command -v python3)}

{
  echo "tessel GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), checkout $(git rev-parse --short HEAD 2> /dev/null || echo '?')" \
    "with $(git status --porcelain 2> /dev/null | wc -l) changed files"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2> /dev/null |
    sed 's/^/GPU: /'
  echo "PyTorch: $($TESSEL_TORCH_PYTHON -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1)"
  echo "CUDA libraries from: ${cuda_path:-(none found)}"
} | tee "$summary"

failed=0
step() {  # step NAME COMMAND...: runs it, logs to $out/NAME.log, one summary line
  local name=$1
  shift
  [ -z "$only" ] || [[ $only == *,$name,* ]] || return 0
  local start=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local code=$?
  local verdict=PASS
  [ $code -eq 0 ] || { verdict="FAIL (exit $code)"; failed=$((failed + 1)); }
  printf '%-14s %-16s %4d s   %s\n' "$name" "$verdict" $((SECONDS - start)) \
    "$(grep -E '^\[  PASSED  \]|^[0-9]+ passed, [0-9]+ failed|^\| tessel|tessel op profile \(' "$out/$name.log" |
      sed 's/^\[rank 0\] //' | tail -n 3 | paste -sd' ' -)" |
    tee -a "$summary"
}

launch=("$bin/tessel-launch" --master_port 0 --max_run_s 300)
step cuda_runtime "$bin/cuda_unit_tests"
step op_parity "$bin/ops_unit_tests"
step multi_tensor "$bin/cuda_ops_unit_tests"
step nccl_1rank "${launch[@]}" --nproc_per_node 1 -- "$bin/nccl_test"
step train_cuda python3 tests/dist/test_train_cuda.py --launcher "$bin/tessel-launch" --program "$bin/tessel-train" \
  --source "$PWD"
# Each op's GPU time from CUDA events (TESSEL_PROFILE_OPS=events), printed at exit.
profile() {
  TESSEL_PROFILE_OPS=events "${launch[@]}" --nproc_per_node 1 -- "$bin/tessel-train" \
    --config configs/gpt2_tiny.prototxt --set train.dist.device=cuda --set train.graph.enabled=false \
    --set train.dist.tensor_parallel_size=1 --set train.dist.pipeline_parallel_size=1 \
    --set train.train_iter=20 --set evaluation.enabled=false --set "train.output_dir=$work/profile" &&
    grep -q "GPU time between events" "$out/profile_events.log"
}
step profile_events profile
if [ $bench -eq 1 ]; then
  skip=eager,compile
  [ $peers -eq 1 ] && skip=
  step gpt2_medium python3 tests/bench/gpt2_gpu_vs_torch.py --train "$bin/tessel-train" --precision bf16 \
    --batch 8 ${skip:+--skip $skip}
  step llama_1b python3 tests/bench/gpt2_gpu_vs_torch.py --train "$bin/tessel-train" --model llama \
    --precision bf16 --batch 8 ${skip:+--skip $skip}
fi
echo "failed steps: $failed" | tee -a "$summary"
rm -rf "$work"
exit $failed
