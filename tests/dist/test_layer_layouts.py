"""Every parallel layer (vocab-parallel embedding, attention, MLP, transformer
layer, LM logits + parallel cross-entropy) under tp2, tp4 and dp2 x tp2
matches its single-rank result: outputs, input gradients and gathered
parameter gradients within 1e-5 (relative to each value and the tensor's
mean magnitude)."""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
args = parser.parse_args()


def read(path):
    tensors, lines = {}, open(path).read().splitlines()
    for i in range(0, len(lines), 2):
        name, _ = lines[i].split()
        tensors[name] = [float(v) for v in lines[i + 1].split()]
    return tensors


def rel_error(got, want):
    mean = max(sum(abs(v) for v in want) / max(len(want), 1), 1e-12)
    return max((abs(a - b) / (abs(b) + mean) for a, b in zip(got, want)), default=0.0)


with tempfile.TemporaryDirectory() as tmp:
    dumps = {}
    for name, (nproc, tp) in {"1x1": (1, 1), "tp2": (2, 2), "tp4": (4, 4), "dp2xtp2": (4, 2)}.items():
        path = os.path.join(tmp, name + ".txt")
        code, out, _ = run([args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "200",
                            "--", args.program, f"--tp={tp}", f"--out={path}"], timeout=240)
        check(f"{name}: ran", code == 0, out)
        dumps[name] = read(path) if code == 0 else {}
    ref = dumps["1x1"]
    check("single rank dumped every layer", len(ref) >= 20, str(list(ref)))
    for name in ("tp2", "tp4", "dp2xtp2"):
        for key, want in ref.items():
            got = dumps[name].get(key)
            ok = got is not None and len(got) == len(want) and rel_error(got, want) <= 1e-5
            check(f"{name}: {key}", ok, f"  worst {rel_error(got, want) if got else 'missing'}")
finish()
