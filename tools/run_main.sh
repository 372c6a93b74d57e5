#!/usr/bin/env bash
# The main job: builds tessel, then trains the tiny GPT of
# configs/gpt2_tiny.prototxt on the bundled corpus (data/tiny_corpus) with 4
# processes — tensor parallel 2 x pipeline parallel 2, 1F1B, graph mode —
# and draws its loss curves. The run's resolved config, metrics.jsonl and
# curves.png land in output/gpt2_tiny/. Extra arguments go to tessel-train
# (e.g. --set train.train_iter=100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
build_dir=${TESSEL_BUILD_DIR:-build}
"$build_dir/tools/tessel-launch" --nproc_per_node 4 --master_port 0 -- \
  "$build_dir/tools/tessel-train" --config configs/gpt2_tiny.prototxt "$@"
# The curves go where the metrics went: the config's output_dir, or the one
# a --set train.output_dir=... (also --set=...) gave instead.
out_dir=output/gpt2_tiny
for arg in "$@"; do
  case "$arg" in
    train.output_dir=* | --set=train.output_dir=*) out_dir=${arg#*train.output_dir=} ;;
  esac
done
if /usr/bin/python3 -c "import matplotlib" 2> /dev/null; then
  /usr/bin/python3 tools/plot_metrics.py "$out_dir"
fi
