"""TensorBoard's own reader (the `tensorboard` package from PyPI, installed
into a temporary directory here) reads the scalars tessel-train writes: every
training and evaluation scalar of a short run, at the iterations of
metrics.jsonl and with its values (f32). A copy with one payload byte
flipped loses events, so the records' checksums are what the reader checks."""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dist"))
from harness import check, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launch", required=True)
parser.add_argument("--train", required=True)
parser.add_argument("--source", required=True)
args = parser.parse_args()

work = tempfile.mkdtemp(prefix="tessel_tensorboard_")
deps = os.path.join(work, "pydeps")
pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
                      deps, "tensorboard"], capture_output=True, text=True)
check("pip installs tensorboard", pip.returncode == 0, pip.stderr[-2000:])

out_dir = os.path.join(work, "run")


def train(iterations):
    return run([args.launch, "--nproc_per_node", "2", "--master_port", "0", "--max_run_s", "240", "--",
                args.train, "--config", os.path.join(args.source, "configs", "gpt2_tiny.prototxt"),
                "--set", "train.dist.tensor_parallel_size=1", "--set", "train.dist.pipeline_parallel_size=2",
                "--set", f"train.train_iter={iterations}", "--set", "scheduler.warmup_iter=2", "--set",
                "train.log_period=2", "--set", "evaluation.eval_period=3", "--set", "evaluation.eval_iter=1",
                "--set", f"train.output_dir={out_dir}"], timeout=300)


rc, out, _ = train(6)
check("tessel-train runs 6 iterations", rc == 0, out[-3000:])
event_files = glob.glob(os.path.join(out_dir, "events.out.tfevents.*"))
check("one event file in the output directory", len(event_files) == 1, str(os.listdir(out_dir) if rc == 0 else ""))

metrics = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))] if rc == 0 else []
expected = {}  # tag -> [(step, value)]
for row in metrics:
    if "eval_loss" in row:
        expected.setdefault("eval/loss", []).append((row["iteration"], row["eval_loss"]))
        expected.setdefault("eval/perplexity", []).append((row["iteration"], row["eval_perplexity"]))
        continue
    for key in ("loss", "lr", "grad_norm", "tokens_seen", "samples_per_s", "tokens_per_s", "tflops_per_device", "mfu",
                "time_per_iter_ms", "data_ms", "memory_peak_mib", "memory_reserved_mib", "peak_rss_mib"):
        expected.setdefault(f"train/{key}", []).append((row["iteration"], row[key]))

READER = """
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
"""


def read_scalars(directory):
    proc = subprocess.run([sys.executable, "-c", READER, directory], env=dict(os.environ, PYTHONPATH=deps),
                          capture_output=True, text=True)
    check(f"TensorBoard's EventAccumulator reads {os.path.basename(directory)}", proc.returncode == 0,
          proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}


if pip.returncode == 0 and event_files:
    scalars = read_scalars(out_dir)
    check("TensorBoard sees every scalar tessel logs", sorted(scalars) == sorted(expected),
          f"{sorted(scalars)} vs {sorted(expected)}")
    check("metrics.jsonl has 4 training rows (iterations 1, 2, 4, 6) and 2 evaluations",
          [s for s, _ in expected.get("train/loss", [])] == [1, 2, 4, 6]
          and [s for s, _ in expected.get("eval/loss", [])] == [3, 6], str(expected.get("train/loss")))
    # metrics.jsonl rounds some fields when it prints them: half its last digit.
    rounding = {"train/samples_per_s": 5e-4, "train/tokens_per_s": 0.05, "train/time_per_iter_ms": 5e-4,
                "train/data_ms": 5e-4, "train/peak_rss_mib": 0.05, "train/memory_peak_mib": 0.05,
                "train/memory_reserved_mib": 0.05, "train/tokens_seen": 0.5}
    for tag, rows in sorted(expected.items()):
        got = scalars.get(tag, [])
        same = len(got) == len(rows) and all(
            s == gs and abs(v - gv) <= 1e-6 * abs(v) + rounding.get(tag, 0.0) for (s, v), (gs, gv) in zip(rows, got))
        check(f"{tag}: the steps and values of metrics.jsonl", same, f"{got} vs {rows}")

    # Flip one byte inside the last record's payload: the reader must notice.
    corrupt = os.path.join(work, "corrupt")
    os.makedirs(corrupt)
    data = bytearray(open(event_files[0], "rb").read())
    data[-6] ^= 0x40
    with open(os.path.join(corrupt, os.path.basename(event_files[0])), "wb") as f:
        f.write(data)
    damaged = read_scalars(corrupt)
    check("a flipped byte costs the damaged record (checksums are read)",
          sum(len(v) for v in damaged.values()) < sum(len(v) for v in scalars.values()),
          f"{sum(len(v) for v in damaged.values())} scalars from the damaged copy")

# The same output directory again, afresh (no checkpoint to continue
# from): the first run's log moves to earlier_runs/1, so TensorBoard and
# metrics.jsonl show the new run alone and the old one is kept whole.
if rc == 0:
    first_metrics = open(os.path.join(out_dir, "metrics.jsonl")).read()
    rc2, out2, _ = train(4)
    earlier = os.path.join(out_dir, "earlier_runs", "1")
    check("a second run afresh in the same output directory says it moved the earlier log",
          rc2 == 0 and f"moved it to {earlier}" in out2, out2[-2000:])
    check("earlier_runs/1 holds the first run's metrics.jsonl unchanged and its event file",
          os.path.isfile(os.path.join(earlier, "metrics.jsonl"))
          and open(os.path.join(earlier, "metrics.jsonl")).read() == first_metrics
          and len(glob.glob(os.path.join(earlier, "events.out.tfevents.*"))) == 1, str(os.listdir(out_dir)))
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))] if rc2 == 0 else []
    check("the new metrics.jsonl is the second run's alone (iterations 1, 2, 4)",
          [r["iteration"] for r in rows if "loss" in r] == [1, 2, 4], str(rows)[:2000])
    if pip.returncode == 0:
        again = read_scalars(out_dir)
        check("TensorBoard on the output directory sees the second run alone",
              [s for s, _ in again.get("train/loss", [])] == [1, 2, 4], str(again.get("train/loss")))

shutil.rmtree(work, ignore_errors=True)
finish()
