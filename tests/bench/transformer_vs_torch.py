"""Forward+backward of a 4-layer transformer block stack: tessel beside
PyTorch (same sizes, ops and thread count; OPENBLAS_CORETYPE=Cooperlake for
PyTorch), alternating --rounds times, best of each.

    python3 tests/bench/transformer_vs_torch.py --build build [--markdown]
"""
import argparse
import json
import os
import subprocess

from bench_util import print_table

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--build", default="build")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--markdown", action="store_true")
a = p.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_"))}
sizes = ["--layers=4", "--batch=4", "--seq=128", "--hidden=256", "--heads=4"]
runs = {
    "tessel": ([os.path.join(a.build, "tests", "bench", "transformer_bench")] + sizes,
               dict(clean, OMP_NUM_THREADS=str(a.threads))),
    "torch": (["/usr/bin/python3", os.path.join(here, "torch_transformer_bench.py"), f"--threads={a.threads}"] + sizes,
              dict(clean, OPENBLAS_CORETYPE="Cooperlake", OMP_NUM_THREADS=str(a.threads))),
}
best = {}
for _ in range(a.rounds):
    for impl, (cmd, env) in runs.items():
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        for line in out.strip().splitlines():  # the peer prints each variant, then "torch": the fastest
            rec = json.loads(line)
            key = impl if rec["impl"] in ("torch", "tessel") else rec["impl"]
            best[key] = min(best.get(key, 1e30), rec["ms"])
t, r = best["tessel"], best["torch"]
variants = " / ".join(f"{k[6:]} {v:.1f}" for k, v in best.items() if k.startswith("torch-"))
print_table(f"4-layer transformer blocks (batch 4, seq 128, hidden 256, 4 heads, causal), forward+backward, "
            f"{a.threads} threads, best of {a.rounds} rounds; torch = the faster of its variants",
            ["tessel ms", "torch ms", "torch variants ms", "speed vs torch"],
            [[f"{t:.1f}", f"{r:.1f}", variants, f"{r / t:.2f}x"]], a.markdown)
