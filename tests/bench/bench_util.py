"""Shared helpers for the benchmark drivers: run a program on N ranks with
tessel-launch and collect the JSON records rank 0 prints."""
import json
import re
import subprocess
import sys
import time


def run_ranks(launcher, nproc, program, env=None):
    """Runs `program` (a list) on `nproc` ranks; returns rank 0's JSON lines."""
    cmd = [launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--"] + program
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"benchmark failed: {' '.join(cmd)}\n{out.stdout}")
    records = []
    for line in out.stdout.splitlines():
        m = re.match(r"\[rank 0\] (\{.*\})$", line)
        if m:
            records.append(json.loads(m.group(1)))
    return records


def wall_seconds(launcher, nproc, program):
    """Wall time of `program` (a list) on `nproc` ranks, start-up included."""
    cmd = [launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--"] + program
    start = time.monotonic()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}")
    return time.monotonic() - start


def seconds_per_step(launcher, nproc, program, short, long):
    """Per-step time of a training program taking --steps: the difference
    between a long and a short run over the extra steps, so start-up,
    rendezvous, tracing and the first step's caches do not count."""
    return (wall_seconds(launcher, nproc, program + [f"--steps={long}"]) -
            wall_seconds(launcher, nproc, program + [f"--steps={short}"])) / (long - short)


def keep_fastest(best, records, key_fields):
    """Keeps, per key, the record with the lowest "us"."""
    for rec in records:
        key = tuple(rec[f] for f in key_fields)
        if key not in best or rec["us"] < best[key]["us"]:
            best[key] = rec


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def print_table(title, header, rows, markdown):
    print(title)
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
