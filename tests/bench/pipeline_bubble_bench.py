"""The pipeline bubble of each schedule against its theory, measured in one
invocation with the runs alternating (machine load touches every
schedule alike).

Each run trains examples/train_gpt in graph mode on the actor runtime with
--timeline_dir; the bubble of a rank is the share of the pipeline's span
(first unit begun on any rank to the last ended) in which its compute
stream ran nothing, from the timeline of the last step, averaged over the
ranks (tools/pipeline_timeline.py measures it the same way). The theory,
as a share of the span, for p stages and m micro-batches with even stages:

  1f1b, gpipe        (p - 1) / (m + p - 1)
  interleaved_1f1b   (p - 1) / (v m + p - 1)   v model chunks per stage
  zb_h1              (p - 1) / (3 m + p - 1)   F, B and W of one cost

The replay (tools/pipeline_timeline.py: replayed_bubble) runs the same
units in the same order with the times their ops computed in this run and
transfers that take no time: it keeps what the theory leaves out (stages of
uneven cost: the first embeds, the last computes the LM head and the loss)
and drops what the runtime adds, so the points over the replay are the
runtime's share of the bubble.

One process per stage: with more processes than cores the stages share
them and every unit that runs beside another slows down, which the theory
does not model.

  python3 tests/bench/pipeline_bubble_bench.py --launcher build/tools/tessel-launch \\
      --program build/examples/train_gpt --markdown [--pngs docs/]
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from pipeline_timeline import bubbles, ideal_bubble, load, replayed_bubble  # noqa: E402

from bench_util import print_table  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
parser.add_argument("--stages", type=int, default=2)
parser.add_argument("--layers", type=int, default=4, help="transformer layers (a multiple of stages x chunks)")
parser.add_argument("--chunks", type=int, default=2, help="interleaved_1f1b's model chunks per stage")
parser.add_argument("--micro_batches", default="4,8", help="comma-separated micro-batch counts")
parser.add_argument("--schedules", default="1f1b,interleaved_1f1b,zb_h1")
parser.add_argument("--hidden", type=int, default=768)
parser.add_argument("--heads", type=int, default=12)
parser.add_argument("--seq", type=int, default=256)
parser.add_argument("--steps", type=int, default=3, help="steps per run (the last one's timeline counts)")
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--pngs", default="", help="a directory to draw each schedule's last run into")
parser.add_argument("--markdown", action="store_true")
args = parser.parse_args()


def measure(schedule, m, timelines):
    chunks = args.chunks if schedule == "interleaved_1f1b" else 1
    cmd = [args.launcher, "--nproc_per_node", str(args.stages), "--master_port", "0", "--", args.program,
           f"--pp={args.stages}", f"--layers={args.layers}", f"--virtual_pipeline_size={chunks}", "--graph",
           f"--schedule={schedule}", f"--micro_batches={m}", f"--batch={m}", f"--hidden={args.hidden}",
           f"--heads={args.heads}", f"--seq={args.seq}", f"--steps={args.steps}", f"--timeline_dir={timelines}"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        sys.exit(f"benchmark failed: {' '.join(cmd)}\n{out.stdout[-3000:]}")
    ms = next(float(line.split()[-4]) for line in out.stdout.splitlines() if line.endswith("ms per step"))
    ranks = load(sorted(glob.glob(os.path.join(timelines, "timeline_rank*.json"))))
    return statistics.mean(bubbles(ranks).values()), ms, replayed_bubble(ranks)


rows = []
with tempfile.TemporaryDirectory() as scratch:
    results = {}
    for m in (int(x) for x in args.micro_batches.split(",")):
        for round_ in range(args.rounds):
            for schedule in args.schedules.split(","):
                timelines = os.path.join(scratch, f"{schedule}_m{m}")
                bubble, ms, replayed = measure(schedule, m, timelines)
                results.setdefault((m, schedule), []).append((bubble, ms, replayed))
                print(f"m {m} {schedule}: bubble {100 * bubble:.1f}% (replayed {100 * replayed:.1f}%), "
                      f"{ms:.0f} ms per step", flush=True)
    for (m, schedule), runs in results.items():
        v = args.chunks if schedule == "interleaved_1f1b" else 1
        theory = ideal_bubble(args.stages, m, v, split=schedule == "zb_h1")
        bubbles = [b for b, _, _ in runs]
        replayed = [r for _, _, r in runs]
        rows.append([schedule, str(m), ", ".join(f"{100 * b:.1f}%" for b in bubbles), f"{100 * theory:.1f}%",
                     f"{100 * (statistics.mean(bubbles) - theory):+.1f}",
                     ", ".join(f"{100 * r:.1f}%" for r in replayed),
                     f"{100 * (statistics.mean(bubbles) - statistics.mean(replayed)):+.1f}",
                     ", ".join(f"{ms:,.0f}" for _, ms, _ in runs)])
    if args.pngs:
        os.makedirs(args.pngs, exist_ok=True)
        for (m, schedule) in results:
            png = os.path.join(args.pngs, f"pipeline_{schedule}_pp{args.stages}_m{m}.png")
            subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                             "tools", "pipeline_timeline.py"),
                            os.path.join(scratch, f"{schedule}_m{m}"), "--out", png], check=True,
                           stdout=subprocess.DEVNULL)
print_table(f"Pipeline bubble, {args.stages} stages, {args.layers} layers (hidden {args.hidden}, sequence "
            f"{args.seq}), one sequence per micro-batch",
            ["schedule", "micro-batches", "measured bubble (mean of ranks), per run", "theory",
             "points over theory (mean)", "replayed with the run's unit times", "points over the replay (mean)",
             "ms per step"], rows, args.markdown)
