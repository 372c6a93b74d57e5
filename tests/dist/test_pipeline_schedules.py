"""The actor runtime's pipelines on the small GPT (train_gpt --graph):

- losses equal the in-order executor's and eager mode's (1e-5 relative) for 3
  steps under pp2, pp4, dp2 x pp2 and tp2 x pp2, with 4 and 8 micro-batches,
  for each schedule (1f1b, gpipe, zb_h1);
- on 4 stages with 8 micro-batches each rank's order of forwards (F),
  backwards (B) and, under zb_h1, weight-gradient units (W) is the
  schedule's (computed here from the definitions), no 1F1B stage s holds
  more than p - s micro-batches, no ZB-H1 stage more than p, GPipe's stage 0
  holds 8, and 1F1B's stage 0 peaks lower in memory than GPipe's;
- under dp2 x pp2 the last stage reduces gradient buckets before its last
  backward ends (from the timelines; the overlap is printed);
- 1, p - 1 and p + 1 micro-batches on 4 stages run under 1F1B and give the
  in-order executor's losses;
- interleaved 1F1B with 2 model chunks per stage (virtual stages) under pp2,
  pp4, dp2 x pp2 and tp2 x pp2 gives the losses of 1F1B on the same layers
  and of the in-order executor, each rank runs the schedule's order, and
  stage 0 holds the micro-batches its warm-up says; a micro-batch count
  that is not a multiple of the stages, and a schedule of one chunk with
  two, are refused before the first step."""
import argparse
import glob
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, run  # noqa: E402
from pipeline_orders import interleaved, reference  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
from pipeline_timeline import gradient_reduction, is_gradient_bucket, load  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
args = parser.parse_args()


def train(nproc, flags, graph=True, schedule="in_order"):
    cmd = [args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "100", "--",
           args.program, "--steps=3"] + flags
    if graph:
        cmd += ["--graph", f"--schedule={schedule}", "--print_actions"]
    code, out, secs = run(cmd, timeout=130)
    losses = [float(v) for v in re.findall(r"\[rank 0\] step \d+ loss ([0-9.]+)", out)]
    return code, out, secs, losses


def same(a, b):
    return len(a) == len(b) > 0 and all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(a, b))


# pp4 runs 128-token sequences: its stage 0's peak memory is compared
# between schedules, and with 32 tokens the micro-batches' activations were
# about the size of what varies with thread timing (receive buffers in
# flight), so the comparison could go either way under load.
layouts = {"pp2": (2, ["--pp=2"]), "pp4": (4, ["--pp=4", "--layers=4", "--seq=128"]), "dp2xpp2": (4, ["--pp=2"]),
           "tp2xpp2": (4, ["--tp=2", "--pp=2"])}
for name, (nproc, flags) in layouts.items():
    for m in (4, 8):
        base = flags + [f"--micro_batches={m}"]
        code, out, secs, eager = train(nproc, base, graph=False)
        check(f"{name} m={m}: eager ran ({secs:.1f} s)", code == 0 and len(eager) == 3, out)
        code, out, secs, in_order = train(nproc, base)
        check(f"{name} m={m}: in-order executor equals eager ({secs:.1f} s)", code == 0 and same(in_order, eager),
              f"{in_order} vs {eager}\n{out}")
        for schedule in ("1f1b", "gpipe", "zb_h1"):
            code, out, secs, losses = train(nproc, base, schedule=schedule)
            check(f"{name} m={m} {schedule}: losses equal the in-order executor's ({secs:.1f} s)",
                  code == 0 and same(losses, in_order), f"{losses} vs {in_order}\n{out}")
            if name != "pp4" or m != 8:
                continue
            # Step 2's report of each rank: stage, actions, micro-batches in flight, peak bytes.
            reports = {int(r): (int(s), a.split(), int(f), int(b)) for r, s, a, f, b in re.findall(
                r"step 2 rank (\d+) stage (\d+) actions ([FBW0-9 ]+) in_flight (\d+) peak_bytes (\d+)", out)}
            check(f"pp4 m=8 {schedule}: every rank reported its actions", sorted(reports) == [0, 1, 2, 3], out)
            for rank, (stage, actions, in_flight, peak) in sorted(reports.items()):
                want = reference(schedule, 4, stage, 8)
                check(f"pp4 m=8 {schedule} stage {stage}: {' '.join(actions)}", actions == want,
                      f"expected {' '.join(want)}")
                bound = {"gpipe": 8, "1f1b": 4 - stage, "zb_h1": 4}[schedule]
                check(f"pp4 m=8 {schedule} stage {stage}: {in_flight} micro-batches in flight, at most {bound}",
                      in_flight <= bound and (stage != 0 or in_flight == bound))
                print(f"pp4 m=8 {schedule} stage {stage}: peak {peak} bytes")
            if schedule == "zb_h1":
                continue
            if schedule == "1f1b":
                one_f_one_b_peak = reports.get(0, (0, [], 0, 0))[3]
            else:
                gpipe_peak = reports.get(0, (0, [], 0, 0))[3]
                check(f"pp4 m=8: stage 0 peaks lower under 1f1b ({one_f_one_b_peak} B) than gpipe ({gpipe_peak} B)",
                      0 < one_f_one_b_peak < gpipe_peak)

# dp2 x pp2: the data-parallel gradient buckets are reduced while the last
# backward still computes (from the timelines; buckets of 0.1 MiB, as the
# small GPT's whole gradient would fill one bucket of the default size).
with tempfile.TemporaryDirectory() as timelines:
    code, out, secs, _ = train(4, ["--pp=2", "--micro_batches=4", "--grad_bucket_mb=0.1",
                                   f"--timeline_dir={timelines}"], schedule="1f1b")
    ranks = load(sorted(glob.glob(os.path.join(timelines, "timeline_rank*.json"))))
    check(f"dp2xpp2 timelines: every rank wrote one ({secs:.1f} s)", code == 0 and sorted(ranks) == [0, 1, 2, 3],
          out)
    total_overlap = 0
    for rank, r in sorted(ranks.items()):
        reducing, overlapped = gradient_reduction(r)
        total_overlap += overlapped
        print(f"dp2xpp2 rank {rank} (stage {r['stage']}): gradient buckets {reducing:.1f} ms, "
              f"{overlapped:.1f} ms during backward")
        if r["stage"] == 1:
            # The order, not the timing (4 processes share 2 cores here): the
            # communication stream reduces its first bucket before it sends
            # the last backward's gradient to stage 0.
            names = [(is_gradient_bucket(e), e["cat"], e["name"]) for e in sorted(r["communication"],
                                                                              key=lambda e: e["ts"])]
            first_bucket = next((i for i, n in enumerate(names) if n[0]), None)
            last_backward_send = max((i for i, n in enumerate(names) if n[1:] == ("backward", "send")),
                                     default=None)
            check(f"dp2xpp2 rank {rank}: the first gradient bucket is reduced before the last backward's send",
                  None not in (first_bucket, last_backward_send) and first_bucket < last_backward_send,
                  f"bucket at {first_bucket}, send at {last_backward_send} in {names}")
    print(f"dp2xpp2: gradient buckets ran {total_overlap:.1f} ms while backward computed (over the ranks)")

# Micro-batch counts around the stage count (a batch of 60 divides by each).
for m in (1, 3, 5):
    flags = ["--pp=4", "--layers=4", "--batch=60", f"--micro_batches={m}"]
    code, out, secs, in_order = train(4, flags)
    code2, out2, secs2, losses = train(4, flags, schedule="1f1b")
    check(f"pp4 m={m} 1f1b: runs and equals the in-order executor ({secs2:.1f} s)",
          code == 0 and code2 == 0 and same(losses, in_order), f"{losses} vs {in_order}\n{out2}")

# Interleaved 1F1B: 2 chunks per stage, the layers split over 2p virtual stages.
# name: (processes, stages, flags, micro-batches)
chunked = {"pp2": (2, 2, ["--pp=2", "--layers=4"], 4), "pp4": (4, 4, ["--pp=4", "--layers=8"], 8),
           "dp2xpp2": (4, 2, ["--pp=2", "--layers=4"], 4), "tp2xpp2": (4, 2, ["--tp=2", "--pp=2", "--layers=4"], 4)}
for name, (nproc, stages, flags, m) in chunked.items():
    base = flags + [f"--micro_batches={m}"]
    code, out, secs, one_chunk = train(nproc, base, schedule="1f1b")
    check(f"{name} m={m} 1f1b, {flags[-1][2:]}: ran ({secs:.1f} s)", code == 0 and len(one_chunk) == 3, out)
    code, out, secs, in_order = train(nproc, base + ["--virtual_pipeline_size=2"])
    check(f"{name} m={m} 2 chunks per stage, in-order executor: equals 1f1b ({secs:.1f} s)",
          code == 0 and same(in_order, one_chunk), f"{in_order} vs {one_chunk}\n{out}")
    code, out, secs, losses = train(nproc, base + ["--virtual_pipeline_size=2"], schedule="interleaved_1f1b")
    check(f"{name} m={m} interleaved_1f1b: losses equal 1f1b's ({secs:.1f} s)",
          code == 0 and same(losses, one_chunk), f"{losses} vs {one_chunk}\n{out}")
    reports = {int(r): (int(s), a.split(), int(f)) for r, s, a, f in re.findall(
        r"step 2 rank (\d+) stage (\d+) actions ([FBWc0-9 ]+) in_flight (\d+)", out)}
    check(f"{name} interleaved_1f1b: every rank reported its actions", sorted(reports) == list(range(nproc)), out)
    for rank, (stage, actions, in_flight) in sorted(reports.items()):
        want = interleaved(stages, stage, m, 2)
        check(f"{name} m={m} interleaved_1f1b rank {rank} (stage {stage}): {' '.join(actions)}", actions == want,
              f"expected {' '.join(want)}")
        # The warm-up's forwards and the one of the steady state.
        bound = min(2 * m, 2 * (stages - stage - 1) + stages + 1)
        check(f"{name} m={m} interleaved_1f1b stage {stage}: {in_flight} chunk micro-batches in flight, at most "
              f"{bound}", in_flight <= bound and (stage != 0 or in_flight == bound))

# Refused before the first step: micro-batches not a multiple of the stages,
# and a schedule of one chunk per stage given two.
code, out, secs, losses = train(4, ["--pp=4", "--layers=8", "--micro_batches=6", "--batch=12",
                                    "--virtual_pipeline_size=2"], schedule="interleaved_1f1b")
check(f"pp4 m=6 interleaved_1f1b: refused before a step ({secs:.1f} s)",
      code != 0 and not losses and "interleaved 1F1B over 6 micro-batches on 4 stages: expected the micro-batches "
      "a multiple of the stage count" in out and "use 4 or 8" in out, out)
code, out, secs, losses = train(2, ["--pp=2", "--layers=4", "--micro_batches=4", "--virtual_pipeline_size=2"],
                                schedule="1f1b")
check(f"pp2 with 2 chunks under 1f1b: refused before a step ({secs:.1f} s)",
      code != 0 and not losses and "pipeline schedule '1f1b' runs one model chunk per stage, and each stage holds 2"
      in out, out)
finish()
