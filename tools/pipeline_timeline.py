#!/usr/bin/env python3
"""Draws a pipeline from the actor runtime's timelines and measures its bubble.

Input: the timeline_rank<r>.json files a run writes with --timeline_dir (the
Chrome-trace JSON of each rank's last step; Perfetto opens them too). Output:
a PNG with one row per rank, labelled with its stage: forward units (F<k>)
blue, backward units (B<k>) green, the weight-gradient units of a
zero-bubble schedule (W<k>) purple, the micro-batch written on each (under an
interleaved schedule each model chunk a lighter shade, F<k>c<c>); the
stretches of a unit in which the rank computed nothing (an op waiting for
another stage's data) hatched grey, so a wait shows as a wait; and under
them a thin row of the rank's communication (layout changes, gradient
buckets in orange, sends and receives). Gaps in the rows are the bubble.

The bubble fraction of a rank is the share of the pipeline's span (the first
unit to begin on any rank to the last to end) in which its compute stream
ran nothing; it is printed per rank with their mean, next to the ideal
(p - 1) / (m + p - 1) of p stages and m micro-batches with even stages,
(p - 1) / (3m + p - 1) for a schedule with W units (F, B and W of one
cost), or (p - 1) / (v m + p - 1) for v model chunks per stage (the
interleaved schedule's bubble of (p - 1) / (v m) of the ideal step), and
the bubble of the same units replayed in their order with the compute
they took and transfers that take no time (replayed_bubble: the theory of
this run's uneven stages; what the measured bubble has beyond it, the
runtime added).
Under data parallelism it also prints how long each rank reduced gradient
buckets and how much of that ran while its backward units computed.

  python3 tools/pipeline_timeline.py timelines/ --out pipeline.png
"""
import argparse
import glob
import json
import os
import sys


def load(paths):
    ranks = {}
    for path in paths:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        spans = [e for e in events if e.get("ph") == "X"]
        step = next(e for e in spans if e["name"] == "step" and e["tid"] == 2)
        rank = step["pid"]
        ranks[rank] = {
            "stage": step["args"]["stage"],
            "stages": step["args"]["stages"],
            "micro_batches": step["args"]["micro_batches"],
            "schedule": step["args"]["schedule"],
            "chunks": step["args"].get("chunks", 1),
            "units": [e for e in spans if e["tid"] == 2 and e["name"] != "step"],
            "compute": [e for e in spans if e["tid"] == 0],
            "communication": [e for e in spans if e["tid"] == 1],
        }
    return ranks


def busy_time(events, lo, hi):
    """Time within [lo, hi] covered by at least one event."""
    total, end = 0, lo
    for e in sorted(events, key=lambda e: e["ts"]):
        start, stop = max(e["ts"], end), min(e["ts"] + e["dur"], hi)
        if stop > start:
            total += stop - start
            end = stop
    return total


def merged(events):
    """The events' [start, end) intervals, overlaps joined, in order."""
    out = []
    for e in sorted(events, key=lambda e: e["ts"]):
        start, end = e["ts"], e["ts"] + e["dur"]
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def waits(unit, busy, shortest):
    """The stretches of `unit` in which its rank's compute stream ran nothing
    (`busy`: merged compute intervals), longer than `shortest`: a unit spans
    its first op to its last, and an op that needs another stage's data
    waits for it inside that span."""
    lo, hi = unit["ts"], unit["ts"] + unit["dur"]
    gaps, at = [], lo
    for start, end in busy:
        if end <= at:
            continue
        if start >= hi:
            break
        if start - at > shortest:
            gaps.append((at, start))
        at = max(at, end)
    if hi - at > shortest:
        gaps.append((at, hi))
    return gaps


def span(ranks):
    """(first unit's start on any rank, last unit's end), in us."""
    units = [u for r in ranks.values() for u in r["units"]]
    return min(u["ts"] for u in units), max(u["ts"] + u["dur"] for u in units)


def bubbles(ranks):
    """Each rank's share of the span in which its compute stream ran nothing."""
    lo, hi = span(ranks)
    return {rank: 1 - busy_time(r["compute"], lo, hi) / (hi - lo) for rank, r in sorted(ranks.items())}


def replayed_bubble(ranks):
    """The bubble of the same run replayed with nothing but its units'
    compute: each rank runs its units in the order it ran them, each taking
    the time its ops computed (waits inside a unit left out), a unit
    starting once its rank is free and what it needs from other stages is
    done (F<k> of virtual stage v after F<k> of v - 1; the first backward
    unit of v, B<k> or else W<k>, after B<k> of v + 1), with transfers
    taking no time. Stages of uneven cost and the schedule's own order are
    in it; the runtime's overheads (transfers, waits for a peer, ops of the
    step) are not, so the measured bubble less this one is what the runtime
    adds. Returns the mean over the ranks of 1 - busy / span."""
    kinds = {"forward": "F", "backward": "B", "weight": "W"}
    order, work = {}, {}  # per rank: its units' keys in run order; per key: compute time
    for rank, r in ranks.items():
        stages = r["stages"]
        keys = []
        for u in sorted(r["units"], key=lambda u: u["ts"]):
            a = u["args"]
            keys.append((kinds[u["cat"]], a["chunk"] * stages + r["stage"], a["micro_batch"]))
        order[rank] = keys
        for e in r["compute"]:
            a = e.get("args", {})
            if e.get("cat") not in kinds or a.get("micro_batch", -1) < 0:
                continue
            key = (kinds[e["cat"]], a["chunk"] * stages + r["stage"], a["micro_batch"])
            work[key] = work.get(key, 0) + e["dur"]
    virtual = max(v for keys in order.values() for _, v, _ in keys) + 1
    have = {key for keys in order.values() for key in keys}

    def needs(key):
        kind, v, k = key
        if kind == "F":
            return [("F", v - 1, k)] if v > 0 else []
        if kind == "W" and ("B", v, k) in have:
            return [("B", v, k)]
        return [("B", v + 1, k) if ("B", v + 1, k) in have else ("W", v + 1, k)] if v + 1 < virtual else \
            [("F", v, k)]

    done, free, at = {}, {rank: 0 for rank in order}, {rank: 0 for rank in order}
    while any(at[rank] < len(keys) for rank, keys in order.items()):
        moved = False
        for rank, keys in order.items():
            while at[rank] < len(keys):
                key = keys[at[rank]]
                before = needs(key)
                if not all(n in done for n in before):
                    break
                start = max([free[rank]] + [done[n] for n in before])
                done[key] = free[rank] = start + work.get(key, 0)
                at[rank] += 1
                moved = True
        if not moved:
            raise ValueError("the units' order waits on itself: " +
                             ", ".join(f"rank {r} at {order[r][at[r]][0]}{order[r][at[r]][2]} of stage "
                                       f"{order[r][at[r]][1]}" for r in order if at[r] < len(order[r])))
    span_us = max(free.values())
    busy = {rank: sum(work.get(key, 0) for key in keys) for rank, keys in order.items()}
    return sum(1 - busy[rank] / span_us for rank in order) / len(order)


def ideal_bubble(p, m, v=1, split=False):
    """The theory's share of the span with even stages: (p-1)/(3m+p-1) with
    W units, else (p-1)/(vm+p-1) (v = 1: GPipe's and 1F1B's)."""
    return (p - 1) / (3 * m + p - 1) if split else (p - 1) / (v * m + p - 1)


def overlap_time(events, others):
    """Time of `events` during which some event of `others` ran too."""
    return sum(busy_time(others, e["ts"], e["ts"] + e["dur"]) for e in events)


def is_gradient_bucket(event):
    """A fused gradient reduction (buckets of one micro-batch fuse forward
    reductions, such as the loss's, instead)."""
    return event["name"] == "all_reduce_bucket" and event["cat"] == "step"


def gradient_reduction(rank):
    """(ms reducing gradient buckets, ms of that while backward computed)."""
    buckets = [e for e in rank["communication"] if is_gradient_bucket(e)]
    backward = [e for e in rank["compute"] if e["cat"] in ("backward", "weight")]
    return sum(e["dur"] for e in buckets) / 1e3, overlap_time(buckets, backward) / 1e3


def shade(colour, chunk, chunks):
    """`colour` lightened for later model chunks (chunk 0 as is)."""
    if chunks <= 1 or chunk == 0:
        return colour
    mix = 0.55 * chunk / (chunks - 1)
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02X}" for c in rgb)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", help="timeline JSON files, or directories holding timeline_rank*.json")
    parser.add_argument("--out", default="pipeline.png", help="the PNG to write")
    parser.add_argument("--title", default="", help="the chart's title (default: schedule, stages, micro-batches)")
    args = parser.parse_args()
    paths = []
    for p in args.inputs:
        paths += sorted(glob.glob(os.path.join(p, "timeline_rank*.json"))) if os.path.isdir(p) else [p]
    if not paths:
        sys.exit(f"no timelines in {args.inputs}: run with --timeline_dir first")
    ranks = load(paths)

    units = [u for r in ranks.values() for u in r["units"]]
    lo, hi = span(ranks)
    any_rank = next(iter(ranks.values()))
    p, m, v = any_rank["stages"], any_rank["micro_batches"], any_rank["chunks"]
    split = any(u["name"].startswith("W") for u in units)
    ideal = ideal_bubble(p, m, v, split)
    formula = "(p-1)/(3m+p-1)" if split else "(p-1)/(vm+p-1)" if v > 1 else "(p-1)/(m+p-1)"
    by_rank = bubbles(ranks)
    for rank, r in sorted(ranks.items()):
        reducing, overlapped = gradient_reduction(r)
        print(f"rank {rank} (stage {r['stage']}): bubble {100 * by_rank[rank]:.1f}%" +
              (f"; gradient buckets {reducing:.1f} ms, {overlapped:.1f} ms of it during backward"
               if reducing else ""))
    mean = sum(by_rank.values()) / len(by_rank)
    print(f"bubble fraction {100 * mean:.1f}% over {p} stages" + (f" of {v} chunks" if v > 1 else "") +
          f" x {m} micro-batches ({any_rank['schedule']}); ideal {formula} = {100 * ideal:.1f}%")
    print(f"replayed with this run's unit times and instant transfers (stages as uneven as they ran): "
          f"{100 * replayed_bubble(ranks):.1f}%")
    if v > 1:
        # Narayanan et al. state it against the ideal step rather than the span.
        measured = mean / (1 - mean)
        print(f"as a fraction of the busy time: {100 * measured:.1f}%; ideal (p-1)/(vm) = "
              f"{100 * (p - 1) / (v * m):.1f}%")
    if split:
        # ZB-H1's bubble with the measured mean unit costs (Qi et al.):
        # (p - 1)(T_F + T_B - T_W) of a step of m(T_F + T_B + T_W) plus it.
        cost = {}
        for kind in "FBW":
            spans = [u["dur"] for u in units if u["name"].startswith(kind)]
            cost[kind] = sum(spans) / len(spans) if spans else 0.0
        idle = (p - 1) * max(cost["F"] + cost["B"] - cost["W"], 0.0)
        work = m * (cost["F"] + cost["B"] + cost["W"])
        print(f"mean unit ms: F {cost['F'] / 1e3:.1f}, B {cost['B'] / 1e3:.1f}, W {cost['W'] / 1e3:.1f}; "
              f"ZB-H1 with these costs: {100 * idle / (work + idle):.1f}%")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    order = sorted(ranks, key=lambda k: (ranks[k]["stage"], k))
    fig, ax = plt.subplots(figsize=(12, 0.9 * len(order) + 2.0))
    shortest = 0.002 * (hi - lo)  # waits shorter than this would not show anyway
    for row, rank in enumerate(order):
        r = ranks[rank]
        y = len(order) - 1 - row
        busy = merged(r["compute"])
        for u in r["units"]:
            colour = shade({"F": "#4C72B0", "B": "#55A868", "W": "#8172B3"}[u["name"][0]],
                           u["args"].get("chunk", 0), v)
            ax.broken_barh([((u["ts"] - lo) / 1e3, u["dur"] / 1e3)], (y + 0.25, 0.6),
                           facecolors=colour, edgecolor="white", linewidth=0.5)
            gaps = waits(u, busy, shortest)
            if gaps:
                ax.broken_barh([((a - lo) / 1e3, (b - a) / 1e3) for a, b in gaps], (y + 0.25, 0.6),
                               facecolors="#EEEEEE", edgecolor=colour, linewidth=0.5, hatch="///")
            # The label goes on the longest stretch of work.
            work = [(a, b) for a, b in zip([u["ts"]] + [b for _, b in gaps], [a for a, _ in gaps] +
                                           [u["ts"] + u["dur"]]) if b > a]
            a, b = max(work, key=lambda ab: ab[1] - ab[0]) if work else (u["ts"], u["ts"] + u["dur"])
            ax.text(((a + b) / 2 - lo) / 1e3, y + 0.55, str(u["args"]["micro_batch"]), ha="center",
                    va="center", fontsize=7, color="white")
        for buckets, colour in ((False, "#C44E52"), (True, "#DD8452")):
            ax.broken_barh([((e["ts"] - lo) / 1e3, max(e["dur"], 1) / 1e3) for e in r["communication"]
                            if is_gradient_bucket(e) == buckets], (y + 0.02, 0.16),
                           facecolors=colour)
    ax.set_yticks([len(order) - 1 - i + 0.5 for i in range(len(order))])
    ax.set_yticklabels([f"rank {k} (stage {ranks[k]['stage']})" for k in order])
    ax.set_xlabel("ms since the first unit began")
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_title(args.title or f"{any_rank['schedule']}: {p} stages" + (f" of {v} chunks" if v > 1 else "") +
                 f" x {m} micro-batches, bubble {100 * mean:.0f}% (ideal {100 * ideal:.0f}%)")
    handles = [Patch(color="#4C72B0", label="forward"),
               Patch(color="#55A868", label="backward (input gradients)" if split else "backward")]
    if v > 1:
        handles += [Patch(color=shade("#4C72B0", c, v), label=f"chunk {c}") for c in range(1, v)]
    if split:
        handles.append(Patch(color="#8172B3", label="weight gradients"))
    handles += [Patch(facecolor="#EEEEEE", edgecolor="#4C72B0", hatch="///", label="waiting inside a unit"),
                Patch(color="#C44E52", label="communication"), Patch(color="#DD8452", label="gradient buckets")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(handles), fontsize=8,
              frameon=False)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
