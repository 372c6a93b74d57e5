"""Checkpoint save and load throughput against PyTorch, and the bytes a
resharding load reads per rank.

    python3 tests/bench/checkpoint_io_vs_torch.py --build build [--dir DIR] [--rounds 2] [--markdown]

Saves GPT-2 124M with its AdamW state (1.49 GB of f32) as a tessel
checkpoint on one process and under tp2 x pp2 (4 ranks), and the same
tensors with torch.save on one process; loads each on one process from a
cold page cache (tessel's with Load into the model, PyTorch's with
torch.load); best of --rounds. Then loads the tp2 x pp2 checkpoint under
other layouts, one rank at a time from a cold cache, and reports per rank
the bytes its boxes need and what the kernel read from the disk for it
(/proc/self/io read_bytes). DIR must be on a disk (not tmpfs), or
read_bytes stays 0.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--build", default="build")
parser.add_argument("--dir", default=None, help="scratch directory on a disk (default: BUILD/checkpoint_io)")
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--markdown", action="store_true")
args = parser.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
launcher = os.path.join(args.build, "tools", "tessel-launch")
bench = os.path.join(args.build, "tests", "bench", "checkpoint_io_bench")
scratch = args.dir or os.path.join(args.build, "checkpoint_io")
SAVE = re.compile(r"\[rank (\d+)\] save rank \d+: wrote ([0-9.]+) MB in ([0-9.]+) s")
LOAD = re.compile(r"\[rank (\d+)\] load rank \d+: needed (\d+) bytes, chunks read (\d+) bytes \((\d+) chunks\), "
                  r"disk read (\d+) bytes \(([0-9.]+) x needed\) in ([0-9.]+) s")


def launch(nproc, flags):
    cmd = [launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--", bench] + flags
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}")
    return out.stdout


def save(name, nproc, tp, pp):
    path = os.path.join(scratch, name)
    shutil.rmtree(path, ignore_errors=True)
    out = launch(nproc, ["--mode=save", f"--dir={path}", f"--tp={tp}", f"--pp={pp}"])
    runs = SAVE.findall(out)
    return path, sum(float(mb) for _, mb, _ in runs) * 1e6, max(float(s) for _, _, s in runs)


def load(path, nproc, tp, pp, one_at_a_time):
    out = launch(nproc, ["--mode=load", f"--dir={path}", f"--tp={tp}", f"--pp={pp}"] +
                 (["--one_at_a_time"] if one_at_a_time else []))
    return sorted((int(r), int(need), int(chunks), int(disk), float(s))
                  for r, need, chunks, _, disk, _, s in LOAD.findall(out))


os.makedirs(scratch, exist_ok=True)
best = {}
for _ in range(args.rounds):
    path, nbytes, secs = save("one", 1, 1, 1)
    best["tessel save, 1 process"] = min(best.get("tessel save, 1 process", (nbytes, 1e9)), (nbytes, secs),
                                         key=lambda x: x[1])
    rank = load(path, 1, 1, 1, False)[0]
    best["tessel load, 1 process"] = min(best.get("tessel load, 1 process", (0, 1e9)), (rank[1], rank[4]),
                                         key=lambda x: x[1])
    peer = subprocess.run(["/usr/bin/python3", os.path.join(here, "torch_checkpoint_peer.py"), "--index",
                           os.path.join(path, "iter_0000001", "index.json"), "--out",
                           os.path.join(scratch, "torch.pt")], stdout=subprocess.PIPE, text=True, check=True)
    p = json.loads(peer.stdout.strip().splitlines()[-1])
    best["torch.save, 1 process"] = min(best.get("torch.save, 1 process", (0, 1e9)), (p["bytes"], p["save_s"]),
                                        key=lambda x: x[1])
    best["torch.load, 1 process"] = min(best.get("torch.load, 1 process", (0, 1e9)), (p["bytes"], p["load_s"]),
                                        key=lambda x: x[1])
    path4, nbytes4, secs4 = save("tp2xpp2", 4, 2, 2)
    best["tessel save, tp2 x pp2 (4 ranks)"] = min(best.get("tessel save, tp2 x pp2 (4 ranks)", (0, 1e9)),
                                                   (nbytes4, secs4), key=lambda x: x[1])


def table(header, rows):
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [header] + rows:
            print("  ".join(f"{c:>14}" for c in r))
    print()


rows = []
for name, (nbytes, secs) in best.items():
    rows.append([name, f"{nbytes / 1e9:.2f} GB", f"{secs:.2f} s", f"{nbytes / 1e9 / secs:.2f} GB/s"])
table(["what", "bytes", "best time", "throughput"], rows)
print(f"save: tessel {best['tessel save, 1 process'][1] and best['torch.save, 1 process'][1] / best['tessel save, 1 process'][1]:.2f}x "
      f"torch.save's speed; load: tessel {best['torch.load, 1 process'][1] / best['tessel load, 1 process'][1]:.2f}x "
      "torch.load's (one process each)\n")

rows = []
for label, nproc, tp, pp in [("1 process", 1, 1, 1), ("tp4", 4, 4, 1), ("pp4", 4, 1, 4), ("tp3", 3, 3, 1),
                             ("tp6", 6, 6, 1), ("tp4 x pp2", 8, 4, 2), ("tp2 x pp4", 8, 2, 4)]:
    for r, need, chunks, disk, secs in load(os.path.join(scratch, "tp2xpp2"), nproc, tp, pp, True):
        rows.append([label, str(r), f"{need / 1e6:.1f} MB", f"{chunks / 1e6:.1f} MB", f"{disk / 1e6:.1f} MB",
                     f"{disk / need:.4f}", f"{need / 1e9 / secs:.2f} GB/s"])
table(["loaded as", "rank", "needed", "chunks read", "disk read", "disk / needed", "throughput"], rows)
worst = max(float(r[5]) for r in rows)
print(f"worst disk read / needed over every rank and layout: {worst:.4f}")
shutil.rmtree(scratch, ignore_errors=True)
