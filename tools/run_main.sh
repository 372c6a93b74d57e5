#!/usr/bin/env bash
# The main job: builds tessel and runs the most complete end-to-end program
# there is so far on 4 ranks (random global tensors, boxing on a 2x2 mesh),
# then the all-reduce and transformer-stack benchmarks against PyTorch.
# (Model-zoo training joins this script when the layers and models land.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
build_dir=${TESSEL_BUILD_DIR:-build}
"$build_dir/tools/tessel-launch" --nproc_per_node 4 --master_port 0 -- \
  "$build_dir/examples/global_random_demo" --rows 7 --cols 5
"$build_dir/tools/tessel-launch" --nproc_per_node 4 --master_port 0 -- "$build_dir/examples/boxing_demo"
/usr/bin/python3 tests/bench/allreduce_vs_torch.py --build "$build_dir" --nproc 4 --rounds 1 --seconds_per_size 0.2
/usr/bin/python3 tests/bench/transformer_vs_torch.py --build "$build_dir" --rounds 1
