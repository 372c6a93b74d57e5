"""Runs tessel's and PyTorch's gloo all-reduce benchmarks on the same ranks,
sizes and machine, alternating them --rounds times and keeping each one's
best time per size (this machine is noisy), and prints the comparison.

    python3 tests/bench/allreduce_vs_torch.py --build build [--nproc 4] [--markdown]
"""
import argparse
import os

from bench_util import human_bytes, keep_fastest, print_table, run_ranks

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--build", default="build", help="tessel build directory")
parser.add_argument("--nproc", type=int, default=4)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--max_bytes", type=int, default=64 << 20)
parser.add_argument("--seconds_per_size", type=float, default=0.5)
parser.add_argument("--markdown", action="store_true", help="print a markdown table for docs/benchmarks.md")
args = parser.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
launcher = os.path.join(args.build, "tools", "tessel-launch")
common = ["--max_bytes", str(args.max_bytes), "--seconds_per_size", str(args.seconds_per_size)]
programs = {
    "tessel": [os.path.join(args.build, "tests", "bench", "allreduce_bench")] +
              [f"--{a.lstrip('-')}={b}" for a, b in zip(common[::2], common[1::2])],
    "torch-gloo": ["/usr/bin/python3", os.path.join(here, "torch_allreduce_bench.py")] + common,
}

best = {}  # (impl, bytes) -> record with the lowest time
for _ in range(args.rounds):
    for impl, prog in programs.items():
        keep_fastest(best, run_ranks(launcher, args.nproc, prog), ("impl", "bytes"))

sizes = sorted({b for (_, b) in best})
header = ["size", "tessel us", "torch-gloo us", "tessel busbw GB/s", "torch busbw GB/s", "speed vs torch"]
rows = []
for b in sizes:
    t, r = best[("tessel", b)], best[("torch-gloo", b)]
    rows.append([human_bytes(b), f"{t['us']:.1f}", f"{r['us']:.1f}", f"{t['busbw_gbps']:.3f}",
                 f"{r['busbw_gbps']:.3f}", f"{r['us'] / t['us']:.2f}x"])
print_table(f"all-reduce, f32 sum, {args.nproc} ranks on loopback (Gloo TCP), best of {args.rounds} rounds\n"
            "speed vs torch = torch time / tessel time (> 1: tessel is faster)", header, rows, args.markdown)
