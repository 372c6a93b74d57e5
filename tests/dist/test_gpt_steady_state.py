"""A long eager run of the small GPT under tp2 reaches a steady state: after
warm-up, the dispatch caches (SBP signatures, boxing plans) stop growing and
stay under their stated capacities, and rank 0's resident memory stays within
5%. (Per-step attributes such as the learning rate, the step and the
clipping scale do not key the caches.) The 10,000-step version of this run
is in docs/benchmarks.md; CI runs --steps (default 400)."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
parser.add_argument("--steps", type=int, default=400)
args = parser.parse_args()

every = max(args.steps // 8, 1)
code, out, secs = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--max_run_s", "1200", "--",
                       args.program, "--tp=2", f"--steps={args.steps}", f"--report_memory_every={every}"],
                      timeout=1300)
check(f"tp2 ran {args.steps} steps ({secs:.1f} s)", code == 0, out[-3000:])
rows = [tuple(int(v) for v in m) for m in re.findall(
    r"\[rank 0\] step (\d+) memory rss_kib (\d+) signatures (\d+)/(\d+) boxing_plans (\d+)/(\d+)", out)]
check("memory reported 8 times", len(rows) == 8, out[-3000:])
if len(rows) == 8:
    for step, rss, sigs, sig_cap, plans, plan_cap in rows:
        print(f"step {step}: rss {rss} KiB, signatures {sigs}/{sig_cap}, boxing plans {plans}/{plan_cap}")
    warm = rows[1]  # after the first report: caches filled, allocator settled
    check("signature cache within its capacity", all(r[2] <= r[3] for r in rows))
    check("boxing-plan cache within its capacity", all(r[4] <= r[5] for r in rows))
    check("signature cache stops growing after warm-up", all(r[2] == warm[2] for r in rows[1:]),
          str([r[2] for r in rows]))
    check("boxing-plan cache stops growing after warm-up", all(r[4] == warm[4] for r in rows[1:]),
          str([r[4] for r in rows]))
    worst = max(abs(r[1] - warm[1]) / warm[1] for r in rows[1:])
    check(f"resident memory flat within 5% after warm-up (worst {worst * 100:.2f}%)", worst <= 0.05,
          str([r[1] for r in rows]))
finish()
