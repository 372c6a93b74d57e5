#!/usr/bin/env bash
# The main job: builds tessel, runs the examples on 4 ranks (global tensors,
# boxing on a 2x2 mesh, the seed parallel layers), trains the small GPT for
# 20 steps under dp 2 x tp 2, then the all-reduce and transformer-stack
# benchmarks against PyTorch. (Config-driven model-zoo training with
# tessel-train and bundled data is the next step.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
build_dir=${TESSEL_BUILD_DIR:-build}
"$build_dir/tools/tessel-launch" --nproc_per_node 4 --master_port 0 -- \
  "$build_dir/examples/global_random_demo" --rows 7 --cols 5
"$build_dir/tools/tessel-launch" --nproc_per_node 4 --master_port 0 -- "$build_dir/examples/boxing_demo"
"$build_dir/tools/tessel-launch" --nproc_per_node 2 --master_port 0 -- "$build_dir/examples/linear_col_parallel"
"$build_dir/tools/tessel-launch" --nproc_per_node 4 --master_port 0 -- "$build_dir/examples/mlp_2d"
"$build_dir/tools/tessel-launch" --nproc_per_node 4 --master_port 0 -- "$build_dir/examples/train_gpt" --tp 2 --steps 20
/usr/bin/python3 tests/bench/allreduce_vs_torch.py --build "$build_dir" --nproc 4 --rounds 1 --seconds_per_size 0.2
/usr/bin/python3 tests/bench/transformer_vs_torch.py --build "$build_dir" --rounds 1
