"""The small GPT trained eagerly for 20 steps gives the same losses (1e-5
relative) under layouts 1x1x1, dp2, tp2, pp2, dp2 x tp2, tp2 x pp2 and tp4,
and the loss falls; in graph mode (--graph: the step captured once, then run)
it gives them too under 1x1x1, dp2 x tp2 and tp2 x pp2; and with gradient
accumulation over 4 micro-batches (--micro_batches 4: a loop eagerly, a
graph rewrite in graph mode) under dp2 x tp2; and in graph mode with
activation checkpointing (--activation_checkpoint) under tp2 x pp2 and,
with 4 micro-batches, dp2 x tp2. (Graph mode runs on the actor runtime's
default 1F1B schedule; with one micro-batch its stages still run one after
another. test_pipeline_schedules.py covers the pipelines.)"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
args = parser.parse_args()

# name: (ranks, tp, pp, graph mode, micro-batches[, activation checkpointing]); dp is derived.
layouts = {"1x1x1": (1, 1, 1, False, 1), "dp2": (2, 1, 1, False, 1), "tp2": (2, 2, 1, False, 1),
           "pp2": (2, 1, 2, False, 1), "dp2xtp2": (4, 2, 1, False, 1), "tp2xpp2": (4, 2, 2, False, 1),
           "tp4": (4, 4, 1, False, 1), "graph 1x1x1": (1, 1, 1, True, 1), "graph dp2xtp2": (4, 2, 1, True, 1),
           "graph tp2xpp2": (4, 2, 2, True, 1), "dp2xtp2 4 micro-batches": (4, 2, 1, False, 4),
           "graph dp2xtp2 4 micro-batches": (4, 2, 1, True, 4),
           "graph tp2xpp2 activation checkpointing": (4, 2, 2, True, 1, True),
           "graph dp2xtp2 4 micro-batches activation checkpointing": (4, 2, 1, True, 4, True)}
losses = {}
for name, (nproc, tp, pp, graph, micro_batches, *checkpoint) in layouts.items():
    code, out, secs = run([args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "200",
                           "--", args.program, f"--tp={tp}", f"--pp={pp}", "--steps=20",
                           f"--micro_batches={micro_batches}"]
                          + (["--graph"] if graph else []) + (["--activation_checkpoint"] if checkpoint else []),
                          timeout=240)
    check(f"{name}: training ran ({secs:.1f} s)", code == 0, out)
    losses[name] = [float(v) for v in re.findall(r"\[rank 0\] step \d+ loss ([0-9.]+)", out)]
    check(f"{name}: 20 losses", len(losses[name]) == 20, out)

ref = losses["1x1x1"]
print("1x1x1 losses:", " ".join(f"{v:.5f}" for v in ref))
check("the loss falls", len(ref) == 20 and ref[-1] < ref[0] - 0.3, str(ref))
for name, values in losses.items():
    worst = max((abs(a - b) / abs(b) for a, b in zip(values, ref)), default=float("inf"))
    check(f"{name}: losses match 1x1x1 within 1e-5 relative (worst {worst:.2e})", len(values) == 20 and worst <= 1e-5)
finish()
