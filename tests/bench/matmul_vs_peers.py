"""CPU matmul: tessel (oneDNN, no environment variables) beside tuned
OpenBLAS (OPENBLAS_CORETYPE=Cooperlake) and PyTorch (same core type, same
thread count), in one run, alternating them --rounds times and keeping each
one's best. The machine is noisy: read the ratios.

    python3 tests/bench/matmul_vs_peers.py --build build [--threads 2] [--markdown]
"""
import argparse
import json
import os
import subprocess

from bench_util import print_table

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--build", default="build")
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--seconds", type=float, default=3.0, help="time per shape per run")
parser.add_argument("--markdown", action="store_true")
args = parser.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "DNNL_", "ONEDNN_"))}
tuned = dict(clean, OPENBLAS_CORETYPE="Cooperlake", OPENBLAS_NUM_THREADS=str(args.threads),
             OMP_NUM_THREADS=str(args.threads))
runs = {
    # tessel gets no environment variables beyond the thread count.
    "tessel": ([os.path.join(args.build, "tests", "bench", "matmul_bench"), str(args.seconds)],
               dict(clean, OMP_NUM_THREADS=str(args.threads))),
    "openblas-tuned": ([os.path.join(args.build, "tests", "bench", "openblas_gemm_bench"), str(args.seconds)], tuned),
    "torch": (["/usr/bin/python3", os.path.join(here, "torch_matmul_bench.py"), str(args.seconds),
               str(args.threads), os.path.join(here, "gemm_shapes.h")], tuned),
}
best = {}
for _ in range(args.rounds):
    for impl, (cmd, env) in runs.items():
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        for line in out.splitlines():
            rec = json.loads(line)
            key = (rec["impl"], rec["shape"])
            best[key] = max(best.get(key, 0), rec["gflops"])

shapes = []
for impl, shape in best:
    if shape not in shapes:
        shapes.append(shape)
rows = []
for s in shapes:
    t, o, p = best[("tessel", s)], best[("openblas-tuned", s)], best[("torch", s)]
    rows.append([s, f"{t:.1f}", f"{o:.1f}", f"{p:.1f}", f"{t / o:.2f}", f"{t / p:.2f}"])
print_table(f"CPU f32 matmul GFLOP/s, {args.threads} threads, best of {args.rounds} rounds",
            ["shape", "tessel", "openblas tuned", "torch", "tessel/openblas", "tessel/torch"], rows, args.markdown)
