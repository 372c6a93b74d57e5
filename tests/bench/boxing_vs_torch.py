"""Boxing on 4 ranks next to PyTorch's gloo collectives, in one run:
bytes each rank actually sent vs the planner's prediction, and time vs
torch (best of --rounds, alternating the two).

    python3 tests/bench/boxing_vs_torch.py --build build [--markdown]
"""
import argparse
import os

from bench_util import human_bytes, keep_fastest, print_table, run_ranks

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--build", default="build")
parser.add_argument("--nproc", type=int, default=4)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--sizes_mib", default="1,64")
parser.add_argument("--seconds_per_case", type=float, default=1.0)
parser.add_argument("--markdown", action="store_true")
args = parser.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
launcher = os.path.join(args.build, "tools", "tessel-launch")
flags = [f"--sizes_mib={args.sizes_mib}", f"--seconds_per_case={args.seconds_per_case}"]
programs = [
    [os.path.join(args.build, "tests", "bench", "boxing_bench")] + flags,
    ["/usr/bin/python3", os.path.join(here, "torch_boxing_bench.py"), "--sizes_mib", args.sizes_mib,
     "--seconds_per_case", str(args.seconds_per_case)],
]
best = {}
for _ in range(args.rounds):
    for prog in programs:
        keep_fastest(best, run_ranks(launcher, args.nproc, prog), ("impl", "case", "bytes"))

header = ["case", "size", "tessel step", "sent B/rank", "predicted B/rank", "sent/predicted", "tessel ms",
          "torch-gloo ms", "speed vs torch"]
rows = []
for (impl, case, nbytes), t in sorted(best.items(), key=lambda kv: (kv[0][2], kv[0][1])):
    if impl != "tessel":
        continue
    r = best[("torch-gloo", case, nbytes)]
    rows.append([case, human_bytes(nbytes), t["plan"], f"{t['sent_per_rank']:.0f}", f"{t['predicted_per_rank']:.0f}",
                 f"{t['sent_per_rank'] / max(t['predicted_per_rank'], 1):.3f}", f"{t['us'] / 1e3:.2f}",
                 f"{r['us'] / 1e3:.2f}", f"{r['us'] / t['us']:.2f}x"])
print_table(f"boxing on {args.nproc} ranks (f32, loopback Gloo TCP), best of {args.rounds} rounds\n"
            "sent = bytes written by the process per conversion (/proc/self/io wchar, max over ranks); "
            "speed vs torch = torch time / tessel time", header, rows, args.markdown)
