"""Eager step time of the small GPT (train_gpt) against a baseline build of
tessel, both measured in this run, alternating, so machine load affects both.

The per-step time is the difference between a long and a short run divided
by the extra steps, so start-up, rendezvous and the first step's caches do
not count. Example (the baseline built from an older commit):

  python3 tests/bench/gpt_step_vs_baseline.py --launcher build/tools/tessel-launch \\
      --program build/examples/train_gpt --baseline /tmp/old/build/examples/train_gpt
"""
import argparse

from bench_util import seconds_per_step

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True, help="train_gpt of this build")
parser.add_argument("--baseline", required=True, help="train_gpt of the build to compare with")
parser.add_argument("--layouts", default="dp2xtp2,tp2,dp2", help="comma-separated: tp2, dp2, dp2xtp2, tp4")
parser.add_argument("--short", type=int, default=5)
parser.add_argument("--long", type=int, default=35)
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()

LAYOUTS = {"tp2": (2, 2), "dp2": (2, 1), "dp2xtp2": (4, 2), "tp4": (4, 4)}

print("| layout | ranks | baseline ms/step | this build ms/step | speed-up |")
print("| --- | --- | --- | --- | --- |")
for name in args.layouts.split(","):
    nproc, tp = LAYOUTS[name]
    best = {}
    for _ in range(args.rounds):
        for which, program in (("baseline", args.baseline), ("this", args.program)):
            per_step = seconds_per_step(args.launcher, nproc, [program, f"--tp={tp}"], args.short, args.long)
            best[which] = min(best.get(which, float("inf")), per_step)
    print(f"| {name} | {nproc} | {best['baseline'] * 1e3:.1f} | {best['this'] * 1e3:.1f} | "
          f"{best['baseline'] / best['this']:.2f}x |", flush=True)
