"""Resuming without thinking (tessel-train's train.resume, save_on_signal,
max_duration, --resume_step) on the tiny GPT under tp2 x pp2:

- SIGTERM to the launcher mid-run: every rank finishes its iteration, a
  checkpoint of that iteration is saved (save_period or not), the ranks exit
  0 and the launcher says the job stopped (exit 143);
- the same command, unchanged, resumes from that checkpoint (train.resume
  auto, the default) and ends with the uninterrupted run's losses and final
  checkpoint shards, byte for byte;
- the first launch of that command into an empty directory starts afresh;
- train.max_duration stops after the first iteration past it with a
  checkpoint (exit 0);
- a run that resumed saves its end, so the same command once more has
  nothing left to train;
- --resume_step N resumes from iter_N, not the latest; one that is not
  there is named; train.keep_last_checkpoints keeps that many;
- train.resume off starts afresh beside a checkpoint, train.resume required
  fails without one;
- train.best_checkpoint_metric keeps the checkpoint of the lowest
  evaluation loss in checkpoints/best, across a resume."""
import glob
import hashlib
import os
import re
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import Job, check, expect, finish, run  # noqa: E402
from train_checks import LOSS, layout_sets, train_args  # noqa: E402

args = train_args()
work = tempfile.mkdtemp(prefix="tessel_preemption_")
config = os.path.join(args.source, "configs", "gpt2_tiny.prototxt")
ITERS = 30


def command(directory, extra=(), flags=()):
    sets = ["train.log_period=1", "evaluation.enabled=false", f"train.train_iter={ITERS}", "train.save_period=30",
            f"train.output_dir={directory}"] + layout_sets(2, 2, True) + list(extra)
    cmd = [args.launcher, "--nproc_per_node", "4", "--master_port", "0", "--max_run_s", "200", "--", args.program,
           "--config", config] + list(flags)
    for s in sets:
        cmd += ["--set", s]
    return cmd


def losses(out):
    return {int(i): v for i, v in LOSS.findall(out)}


def digest(checkpoint):
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in sorted(glob.glob(os.path.join(checkpoint, "shard-*")))}


def terminated_at(cmd, iteration):
    """Runs `cmd`, sends the launcher SIGTERM once rank 0 logged `iteration`;
    returns (exit code, output)."""
    job = Job(cmd)
    job.wait_for(re.escape(f"[rank 0] iteration {iteration}/"), timeout=120)
    job.signal(signal.SIGTERM)
    code, out, _ = job.wait(120)
    return code, out


# Uninterrupted.
full_dir = os.path.join(work, "full")
code, out, secs = run(command(full_dir), timeout=240)
full = losses(out)
check(f"uninterrupted tp2 x pp2: {ITERS} iterations ({secs:.1f} s)", code == 0 and len(full) == ITERS, out[-3000:])
check("uninterrupted: a fresh directory starts afresh (no resume line)", "resumed from" not in out, out[-2000:])
full_shards = digest(os.path.join(full_dir, "checkpoints", "iter_0000030"))

# Interrupted by SIGTERM, then the same command again.
run_dir = os.path.join(work, "preempted")
cmd = command(run_dir)
code, out = terminated_at(cmd, 8)
stopped = re.search(r"\[rank 0\] tessel-train: stopped at iteration (\d+) of 30 on SIGTERM", out)
check(f"SIGTERM: the launcher exits 143 (got {code})", code == 143, out[-3000:])
check("SIGTERM: tessel-train says where it stopped", stopped is not None, out[-3000:])
at = int(stopped.group(1)) if stopped else -1
check(f"SIGTERM: stopped after iteration {at}, before the end", 8 <= at < ITERS, out[-3000:])
expect("SIGTERM: the checkpoint of that iteration is saved (save_period is 30)", out,
       rf"saved checkpoint .*iter_{at:07d} in [0-9.]+ s \(on SIGTERM\)")
expect("SIGTERM: the launcher reports a stop, not a failure", out, r"tessel-launch: job stopped: received Terminated")
check("SIGTERM: every rank exits 0", len(re.findall(r"rank \d exited with status 0", out)) == 4, out[-2000:])
check("SIGTERM: the losses so far are the uninterrupted run's",
      losses(out) == {i: full[i] for i in range(1, at + 1)}, f"{losses(out)} vs {full}")

code, out, _ = run(cmd, timeout=240)
expect("rerun unchanged: resumes from the SIGTERM checkpoint", out,
       rf"resumed from .*iter_{at:07d} at iteration {at} \(saved by 4 ranks as dp 1 x tp 2 x pp 2\)")
resumed = losses(out)
check(f"rerun unchanged: iterations {at + 1} to {ITERS} print the uninterrupted losses exactly",
      code == 0 and resumed == {i: full[i] for i in range(at + 1, ITERS + 1)}, f"{resumed} vs {full}")
same = digest(os.path.join(run_dir, "checkpoints", "iter_0000030"))
check(f"rerun unchanged: the final shards equal the uninterrupted run's byte for byte "
      f"({sum(full_shards[k] == same.get(k) for k in full_shards)} of {len(full_shards)})",
      len(full_shards) == 4 and same == full_shards)
metrics = [line for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in line]
check(f"rerun unchanged: metrics.jsonl holds both parts ({len(metrics)} lines)", len(metrics) == ITERS)
code, out, _ = run(cmd, timeout=240)
expect("a third run of the finished job: nothing left to train", out,
       r"the checkpoint is at train.train_iter 30: nothing left to train")
check("a third run: exit 0, no iteration", code == 0 and not losses(out), out[-2000:])

# train.max_duration: stops past it with a checkpoint, exit 0.
budget_dir = os.path.join(work, "budget")
code, out, _ = run(command(budget_dir, ["train.max_duration=1s", "train.save_period=0"]), timeout=240)
stopped = re.search(r"stopped at iteration (\d+) of 30 past train.max_duration 1s", out)
check("max_duration 1s: stops early and says why, exit 0", code == 0 and stopped is not None, out[-3000:])
if stopped:
    expect("max_duration: its checkpoint is saved", out,
           rf"saved checkpoint .*iter_{int(stopped.group(1)):07d} in [0-9.]+ s \(past train.max_duration 1s\)")
# Without save_period: the rerun (without the budget) finishes and saves its
# end, so one more run has nothing to repeat.
code, out, _ = run(command(budget_dir, ["train.save_period=0"]), timeout=240)
expect("max_duration: the rerun resumes where the budget stopped", out,
       rf"resumed from .*iter_{int(stopped.group(1)) if stopped else 0:07d}")
expect("max_duration: the resumed run saves its end", out,
       r"saved checkpoint .*iter_0000030 in [0-9.]+ s \(the end of a resumed run\)")
check("max_duration: the rerun ends with the uninterrupted losses",
      code == 0 and stopped is not None and losses(out) == {i: full[i] for i in range(int(stopped.group(1)) + 1, 31)},
      out[-2000:])
code, out, _ = run(command(budget_dir, ["train.save_period=0"]), timeout=240)
check("max_duration: once more, nothing is repeated", code == 0 and not losses(out) and
      "nothing left to train" in out, out[-2000:])
code, out, _ = run(command(budget_dir, ["train.max_duration=1x"]), timeout=120)
expect("max_duration '1x': named before the first step", out, r"config: train.max_duration is '1x'; expected a "
                                                             r"positive duration")
check("max_duration '1x': no iteration ran", code not in (0, None) and "iteration 1/" not in out)

# --resume_step and retention: saves every 5 iterations keeping 2.
steps_dir = os.path.join(work, "steps")
code, out, _ = run(command(steps_dir, ["train.save_period=5", "train.keep_last_checkpoints=2"]), timeout=240)
kept = sorted(os.path.basename(p) for p in glob.glob(os.path.join(steps_dir, "checkpoints", "iter_*")))
check(f"keep_last_checkpoints 2: the last two are kept ({kept})",
      code == 0 and kept == ["iter_0000025", "iter_0000030"], out[-2000:])
code, out, _ = run(command(steps_dir, ["train.save_period=0"], ["--resume_step", "25"]), timeout=240)
expect("--resume_step 25: resumes from iter_0000025, not the latest", out,
       r"resumed from .*iter_0000025 at iteration 25")
check("--resume_step 25: iterations 26 to 30 print the uninterrupted losses",
      code == 0 and losses(out) == {i: full[i] for i in range(26, ITERS + 1)}, f"{losses(out)} vs {full}")
code, out, _ = run(command(steps_dir, [], ["--resume_step", "12"]), timeout=120)
expect("--resume_step 12: names the missing checkpoint", out,
       r"--resume_step 12 but .*iter_0000012 holds no complete checkpoint")
check("--resume_step 12: fails before the first iteration", code not in (0, None) and "iteration 1/" not in out)

# train.resume off beside a checkpoint: afresh; required without one: an error.
code, out, _ = run(command(steps_dir, ["train.resume=off", "train.save_period=0"]), timeout=240)
check("resume off: starts at iteration 1 beside checkpoints, with the uninterrupted losses",
      code == 0 and "resumed from" not in out and losses(out) == full, out[-2000:])
empty_dir = os.path.join(work, "empty")
code, out, _ = run(command(empty_dir, ["train.resume=required"]), timeout=120)
expect("resume required, no checkpoint: named", out, r"train.resume required but train.checkpoint_dir .* holds no "
                                                     r"complete checkpoint")
code, out, _ = run(command(empty_dir, ["train.resume=sometimes"]), timeout=120)
expect("resume 'sometimes': named", out, r"config: train.resume is 'sometimes'; expected one of")

# train.best_checkpoint_metric: a constant learning rate so high that the
# loss rises after the first evaluation and stays above it (evaluations
# every 2 iterations). best/ holds the checkpoint of the lowest evaluation
# loss of metrics.jsonl, apart from the latest; the run resumed to 8
# iterations compares with it and keeps iteration 2 (starting anew, it
# would keep one of 6 and 8).
best_run = os.path.join(work, "best")
best_sets = ["evaluation.enabled=true", "evaluation.eval_period=2", "evaluation.eval_iter=1", "optim.lr=0.1",
             "scheduler.name=constant", "scheduler.warmup_iter=0", "train.best_checkpoint_metric=eval_loss", "train.save_period=4"]


def best_state():
    """(iteration, value) of best/'s checkpoint, and the evaluations of metrics.jsonl."""
    import json
    found = glob.glob(os.path.join(best_run, "checkpoints", "best", "iter_*"))
    meta = json.load(open(os.path.join(found[0], "index.json")))["metadata"] if len(found) == 1 else {}
    rows = [json.loads(line) for line in open(os.path.join(best_run, "metrics.jsonl"))]
    evaluations = {r["iteration"]: r["eval_loss"] for r in rows if "eval_loss" in r}
    return len(found), meta, evaluations


for iterations in (4, 8):
    code, out, _ = run(command(best_run, best_sets + [f"train.train_iter={iterations}"]), timeout=240)
    count, meta, evaluations = best_state() if code == 0 else (0, {}, {})
    lowest = min(evaluations, key=evaluations.get) if evaluations else None
    check(f"best_checkpoint_metric eval_loss after {iterations} iterations: best/ holds one checkpoint, of "
          f"iteration {lowest}, the lowest of {evaluations} ({meta.get('iteration')}, {meta.get('best_value')})",
          code == 0 and count == 1 and meta.get("iteration") == str(lowest) and meta.get("best_metric") == "eval_loss"
          and abs(float(meta.get("best_value", "nan")) - evaluations[lowest]) <= 1e-5 * abs(evaluations[lowest]),
          out[-2000:])
    check(f"the loss rose after the first evaluation: best/ is iteration 2's, not the latest ({iterations})",
          code == 0 and lowest == 2 and
          os.path.isdir(os.path.join(best_run, "checkpoints", f"iter_{iterations:07d}")), str(evaluations))
code, out, _ = run(command(best_run, ["train.best_checkpoint_metric=eval_accuracy"]), timeout=120)
expect("best_checkpoint_metric eval_accuracy for a GPT: named", out,
       r"train.best_checkpoint_metric is 'eval_accuracy'; expected one of eval_loss, eval_perplexity")
finish()
