"""tools/pipeline_timeline.py's replay of a run (replayed_bubble) on
timelines written out by hand: with even units it gives the schedule's
theory (1F1B's (p - 1) / (m + p - 1), ZB-H1's (p - 1) / (3m + p - 1) in
tessel's order of W units), with a stage twice as slow the bubble worked out
by hand, and an order that waits on itself is named, not looped on."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dist"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
from harness import check, finish  # noqa: E402
from pipeline_timeline import ideal_bubble, replayed_bubble  # noqa: E402

CATS = {"F": "forward", "B": "backward", "W": "weight"}


def timelines(orders, cost):
    """orders: per stage, unit names ("F0", "B3", ...) in run order; cost:
    (stage, kind) -> us. The units sit back to back (their times do not
    matter to the replay, only their order and their ops' compute)."""
    ranks = {}
    for stage, names in enumerate(orders):
        units, compute, ts = [], [], 0
        for name in names:
            kind, k = name[0], int(name[1:])
            args = {"stage": stage, "micro_batch": k, "chunk": 0}
            units.append({"name": name, "cat": CATS[kind], "ts": ts, "dur": cost[stage, kind], "args": args})
            # Two ops per unit, so a unit's work is their sum.
            for half in (0, 1):
                compute.append({"name": "op", "cat": CATS[kind], "ts": ts + half * cost[stage, kind] // 2,
                                "dur": cost[stage, kind] // 2, "args": args})
            ts += cost[stage, kind]
        compute.append({"name": "adamw_update", "cat": "step", "ts": ts, "dur": 5, "args": {"micro_batch": -1}})
        ranks[stage] = {"stage": stage, "stages": len(orders), "units": units, "compute": compute}
    return ranks


even = {(s, kind): 1000 for s in range(2) for kind in "FBW"}
one_f_one_b = [["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"], ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]]
got = replayed_bubble(timelines(one_f_one_b, even))
check(f"1F1B, 2 stages, 4 micro-batches, even units: the theory's 20.0% ({100 * got:.2f}%)",
      abs(got - ideal_bubble(2, 4)) < 1e-9)

zb_h1 = [["F0", "F1", "B0", "W0", "F2", "B1", "W1", "F3", "B2", "W2", "B3", "W3"],
         ["F0", "B0", "F1", "B1", "W0", "F2", "B2", "W1", "F3", "B3", "W2", "W3"]]
got = replayed_bubble(timelines(zb_h1, even))
check(f"ZB-H1, 2 stages, 4 micro-batches, even units: the theory's {100 * ideal_bubble(2, 4, split=True):.2f}% "
      f"({100 * got:.2f}%)", abs(got - ideal_bubble(2, 4, split=True)) < 1e-9)

# A first stage without B units (it sends no gradient back): its W<k>
# waits for B<k> of the next stage.
no_b = [["F0", "F1", "W0", "F2", "W1", "F3", "W2", "W3"], zb_h1[1]]
cost = dict(even)
cost[0, "W"] = 2000  # its B and W in one
got = replayed_bubble(timelines(no_b, cost))
# Stage 0: F0 0-1, F1 1-2, W0 3-5 (after B0 of stage 1, 2-3), F2 5-6, W1 6-8 (B1 4-5), F3 8-9, W2 9-11
# (B2 7-8), W3 11-13 (B3 10-11); stage 1: F0 1-2, B0 2-3, F1 3-4, B1 4-5, W0 5-6, F2 6-7, B2 7-8, W1 8-9,
# F3 9-10, B3 10-11, W2 11-12, W3 12-13. Both busy 12 of 13.
check(f"a first stage whose backward is all W waits for the next stage's B: 1/13 ({100 * got:.2f}%)",
      abs(got - 1 / 13) < 1e-9)

# Stage 1 twice as slow: stage 0 F0 0-1, F1 1-2, B0 5-6, B1 9-10; stage 1 F0 1-3, B0 3-5, F1 5-7, B1 7-9.
slow = {(0, "F"): 1000, (0, "B"): 1000, (1, "F"): 2000, (1, "B"): 2000}
got = replayed_bubble(timelines([["F0", "F1", "B0", "B1"], ["F0", "B0", "F1", "B1"]], slow))
check(f"1F1B, 2 micro-batches, the second stage twice as slow: (0.6 + 0.2) / 2 ({got:.4f})", abs(got - 0.4) < 1e-9)

try:
    replayed_bubble(timelines([["B0", "F0"], ["F0", "B0"]], even))
    check("an order that waits on itself is named", False)
except ValueError as e:
    check(f"an order that waits on itself is named ({e})", "waits on itself" in str(e) and "rank 0" in str(e))
finish()
