"""Step time of the small GPT (examples/train_gpt) run three ways in the
same invocation, alternating so machine load affects all three:

  eager      the step dispatched op by op (no --graph)
  in-order   graph mode, the compiled step run op after op on one thread
             (--graph --schedule in_order)
  actors     graph mode on the actor runtime: compute and communication
             threads, the pipeline schedule (--graph --schedule 1f1b)

on one process and on 4 processes in several layouts. Per-step time is the
difference between a long and a short run over the extra steps (start-up,
tracing and compiling do not count), best of --rounds.

  python3 tests/bench/gpt_executors_bench.py --launcher build/tools/tessel-launch \\
      --program build/examples/train_gpt
"""
import argparse

from bench_util import print_table, seconds_per_step

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
parser.add_argument("--layouts", default="1,dp2xtp2,dp2xpp2,pp4",
                    help="comma-separated: 1, dp2xtp2, tp2xpp2, dp2xpp2, pp4")
parser.add_argument("--short", type=int, default=5)
parser.add_argument("--long", type=int, default=35)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--markdown", action="store_true")
args = parser.parse_args()

# name: (processes, flags); pipelines split the batch of 8 into 8 micro-batches.
LAYOUTS = {
    "1": (1, []),
    "dp2xtp2": (4, ["--tp=2"]),
    "tp2xpp2": (4, ["--tp=2", "--pp=2", "--micro_batches=8"]),
    "dp2xpp2": (4, ["--pp=2", "--micro_batches=8"]),
    "pp4": (4, ["--pp=4", "--layers=4", "--micro_batches=8"]),
}
MODES = {"eager": [], "in-order": ["--graph", "--schedule=in_order"], "actors": ["--graph", "--schedule=1f1b"]}

rows = []
for name in args.layouts.split(","):
    nproc, flags = LAYOUTS[name]
    best = {}
    for _ in range(args.rounds):
        for mode, mode_flags in MODES.items():
            per_step = seconds_per_step(args.launcher, nproc, [args.program] + flags + mode_flags, args.short,
                                        args.long)
            best[mode] = min(best.get(mode, float("inf")), per_step)
    rows.append([name, str(nproc)] + [f"{best[m] * 1e3:.1f}" for m in MODES] +
                [f"{best['eager'] / best['actors']:.2f}x", f"{best['in-order'] / best['actors']:.2f}x"])
    print(f"{name}: " + ", ".join(f"{m} {best[m] * 1e3:.1f} ms" for m in MODES), flush=True)
print_table("Small-GPT step time (ms, best of rounds)",
            ["layout", "processes", "eager", "in-order", "actors", "eager/actors", "in-order/actors"], rows,
            args.markdown)
