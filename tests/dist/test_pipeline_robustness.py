"""Pipelines never hang and never train a different model than configured
(train_gpt --graph on the actor runtime, 4 stages):

- bad pipeline configs fail before the first step with a message naming the
  value: fewer layers than stages, stage ids of the wrong length, out of
  range, decreasing (a forward edge to an earlier stage) or leaving a stage
  empty, an unknown schedule, virtual stages without a layer each or
  without a pipeline; the layer-to-stage assignment is logged with every
  layer (and each chunk's under virtual stages);
- 1, p - 1, p and p + 1 micro-batches run under both schedules with one
  pending send per rank, each step well under 5 s;
- 1,000 iterations of 4 stages x 8 micro-batches under 1F1B, with one
  pending send per rank (a send waits until the previous one was taken),
  finish with the schedule's order on every stage;
- without --max_pending_sends every rank runs with the schedule's quota
  (twice the most micro-batches a stage holds) and stays within it;
- a rank SIGKILLed mid-pipeline stops the job within 30 s, the launcher
  names it, and no rank process is left behind."""
import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, expect, finish, run  # noqa: E402
from pipeline_orders import reference  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
args = parser.parse_args()
PP4 = ["--pp=4", "--layers=4", "--graph"]


def launch(flags, max_run_s=120):
    return [args.launcher, "--nproc_per_node", "4", "--master_port", "0", "--max_run_s", str(max_run_s), "--",
            args.program] + flags


# 1. Bad pipeline configs.
bad = {
    "fewer layers than stages": (["--pp=4", "--layers=2"],
                                 r"pipeline_parallel_size=4 needs pipeline_num_layers >= the stage count; got 2"),
    "stage ids of the wrong length": (["--pp=2", "--layers=4", "--stage_ids=0,1"],
                                      r"custom_pipeline_stage_ids has 2 entries but pipeline_num_layers=4"),
    "stage id out of range": (["--pp=2", "--layers=4", "--stage_ids=0,0,1,2"],
                              r"custom_pipeline_stage_ids\[3\]=2 is not a stage \(0..1\)"),
    "forward edge to an earlier stage": (["--pp=2", "--layers=4", "--stage_ids=0,1,0,1"],
                                         r"custom_pipeline_stage_ids\[2\]=0 puts layer 2 on an earlier stage than "
                                         r"layer 1 \(stage 1\)"),
    "a stage with no layers": (PP4 + ["--stage_ids=0,1,1,3"],
                               r"custom_pipeline_stage_ids \[0, 1, 1, 3\] give stage 2 no layers"),
    "stage ids not numbers": (["--pp=2", "--layers=2", "--stage_ids=0,one"], r"'one' is not an integer"),
    "unknown schedule": (PP4 + ["--schedule=zigzag"], r"pipeline schedule 'zigzag' is not registered; registered: 1f1b, gpipe, interleaved_1f1b, naive"),
    "virtual stages without layers": (["--pp=2", "--layers=3", "--virtual_pipeline_size=2"],
                                      r"pipeline_parallel_size=2 x virtual_pipeline_size=2 needs pipeline_num_layers "
                                      r">= 4 \(a layer or more per virtual stage\); got 3"),
    "virtual stages without a pipeline": (["--pp=1", "--layers=4", "--virtual_pipeline_size=2"],
                                          r"virtual_pipeline_size=2 with pipeline_parallel_size=1; expected 1"),
}
for name, (flags, pattern) in bad.items():
    code, out, secs = run(launch(flags + ["--steps=2"]), timeout=60)
    check(f"{name}: fails ({secs:.1f} s)", code not in (0, None), out)
    expect(f"{name}: says why", out, pattern)
    check(f"{name}: before the first step", "step 0 loss" not in out, out)

code, out, secs = run(launch(["--pp=4", "--layers=6", "--stage_ids=0,0,1,2,2,3", "--steps=1"]), timeout=60)
expect("the layer-to-stage assignment is logged", out,
       r"pipeline: 6 layers on 4 stages: stage 0 \(ranks 0..0\): layers 0..1; stage 1 \(ranks 1..1\): layer 2; "
       r"stage 2 \(ranks 2..2\): layers 3..4; stage 3 \(ranks 3..3\): layer 5")
check(f"custom stage ids train ({secs:.1f} s)", code == 0 and "step 0 loss" in out, out)
code, out, secs = run(launch(["--pp=2", "--layers=6", "--virtual_pipeline_size=2", "--graph", "--micro_batches=4",
                              "--schedule=interleaved_1f1b", "--steps=1"]), timeout=60)
expect("the layers of each chunk are logged", out,
       r"pipeline: 6 layers on 2 stages of 2 chunks: stage 0 \(ranks 0..1\): layers 0..1, 4; "
       r"stage 1 \(ranks 2..3\): layers 2..3, 5")
check(f"virtual stages train ({secs:.1f} s)", code == 0 and "step 0 loss" in out, out)

# 2. Micro-batch counts around the stage count, one pending send per rank.
for schedule in ("1f1b", "gpipe"):
    for m in (1, 3, 4, 5):
        code, out, secs = run(launch(PP4 + [f"--schedule={schedule}", f"--micro_batches={m}", "--batch=60",
                                            "--max_pending_sends=1", "--steps=3"], max_run_s=60), timeout=90)
        per_step = [float(v) for v in re.findall(r"\[rank 0\] ([0-9.]+) ms per step", out)]
        check(f"{schedule} with {m} micro-batches on 4 stages: runs, {per_step} ms per step",
              code == 0 and per_step and per_step[0] < 5000, out[-3000:])

# 3. 1,000 iterations of 4 stages x 8 micro-batches.
code, out, secs = run(launch(PP4 + ["--schedule=1f1b", "--micro_batches=8", "--max_pending_sends=1",
                                    "--steps=1000", "--print_actions"], max_run_s=500), timeout=560)
check(f"1,000 iterations of pp4 x 8 micro-batches, 1f1b, one pending send: done in {secs:.0f} s",
      code == 0 and "[rank 0] step 999 loss" in out, out[-3000:])
reports = re.findall(r"step 999 rank (\d) stage (\d) actions ([FB0-9 ]+) in_flight (\d+) peak_bytes \d+ "
                     r"pending_sends (\d+)", out)
check("1,000 iterations: every rank reported its last step", len(reports) == 4, out[-3000:])
for rank, stage, actions, in_flight, pending in reports:
    want = reference("1f1b", 4, int(stage), 8)
    check(f"iteration 1,000, stage {stage}: the 1F1B order, {in_flight} in flight, {pending} pending send(s)",
          actions.split() == want and int(in_flight) <= 4 - int(stage) and int(pending) <= 1,
          f"expected {' '.join(want)}, at most {4 - int(stage)} in flight and 1 pending send")

# 3b. Back-pressure is on by default: the quota is twice the most micro-batches
# a stage of the schedule holds (from the reference orders: 1F1B on 4 stages
# 4, so 8; GPipe over 6 micro-batches 6, so 12), and no step reaches it.
def most_in_flight(schedule, stages, m):
    most = 0
    for stage in range(stages):
        held = 0
        for unit in reference(schedule, stages, stage, m):
            held += 1 if unit.startswith("F") else -1
            most = max(most, held)
    return most


for schedule, m in (("1f1b", 8), ("gpipe", 6)):
    quota = 2 * most_in_flight(schedule, 4, m)
    code, out, secs = run(launch(PP4 + [f"--schedule={schedule}", f"--micro_batches={m}", "--batch=48",
                                        "--steps=2", "--print_actions"]), timeout=90)
    reports = re.findall(r"step 1 rank (\d) stage \d actions [FB0-9 ]+ in_flight \d+ peak_bytes \d+ "
                         r"pending_sends (\d+) send_quota (\d+)", out)
    check(f"{schedule} over {m} micro-batches, default back-pressure: every rank reported a quota of {quota} "
          f"and stayed within it ({reports})",
          code == 0 and len(reports) == 4 and all(int(q) == quota and int(p) <= quota for _, p, q in reports),
          out[-3000:])


# 4. A rank killed mid-pipeline.
def job_pids(marker):
    """{rank: pid} of the processes whose environment holds `marker`."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"TESSEL_TEST_MARKER") == marker.encode() and b"RANK" in env:
            pids[int(env[b"RANK"])] = int(entry)
    return pids


marker = uuid.uuid4().hex
env = dict(os.environ, TESSEL_TEST_MARKER=marker)
proc = subprocess.Popen(launch(PP4 + ["--micro_batches=8", "--steps=100000"], max_run_s=300), env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
lines = []
reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")))
reader.start()
deadline = time.monotonic() + 90
while time.monotonic() < deadline and not any("[rank 0] step 3 loss" in line for line in lines):
    time.sleep(0.05)
pids = job_pids(marker)
check("killed rank: the pipeline was training with 4 ranks", len(pids) == 4, "".join(lines)[-3000:])
killed_at = time.monotonic()
if 2 in pids:
    os.kill(pids[2], signal.SIGKILL)
try:
    code = proc.wait(timeout=60)
except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait()
secs = time.monotonic() - killed_at
reader.join()
out = "".join(lines)
check(f"killed rank: the job stops within 30 s (took {secs:.1f} s)", code not in (0, None) and secs < 30,
      out[-3000:])
expect("killed rank: the launcher names rank 2", out, r"tessel-launch: job failed: rank 2 \(pid \d+\) was killed")
time.sleep(1)
left = job_pids(marker)
check(f"killed rank: no rank process is left behind ({sorted(left.values())})", not left)
finish()
