"""The out-of-tree model example (examples/custom_model): installs tessel
into a scratch prefix, builds the example against it with
find_package(tessel), and trains its model, registered as model.arch
token_mlp, from its prototxt:

- on 4 ranks (tp2 x pp2, graph mode, 1F1B) with the same losses (1e-5) as
  on 1 process, eagerly and in graph mode;
- checkpoints every 5 iterations; a run resumed from iteration 5
  (--resume_step) logs the uninterrupted run's losses from iteration 6 on,
  digit for digit, and its iteration-10 checkpoint (model and optimizer
  state) is byte-identical;
- metrics.jsonl holds a record per iteration and the TensorBoard event file
  the loss scalars; evaluation reports loss and perplexity;
- export-hf, which maps the zoo's models only, names it;
- its option's bad value, an unknown option and a best_checkpoint_metric
  its evaluation lacks are named before the first iteration; tessel-train,
  which did not register the model, lists the models it knows."""
import glob
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dist"))
from harness import check, expect, finish, run  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from example_build import install_and_build  # noqa: E402

build, source = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="tessel_custom_model_")
LOSS = re.compile(r"\[rank 0\] iteration (\d+)/\d+ loss ([0-9.]+)")
EVAL = re.compile(r"\[rank 0\].*eval.*loss ([0-9.]+).*perplexity ([0-9.]+)")
ITERS = 10

prefix, example_build = install_and_build(build, source, work, "custom_model")

launcher = os.path.join(prefix, "bin", "tessel-launch")
example = os.path.join(example_build, "token_mlp")
config = os.path.join(source, "examples", "custom_model", "token_mlp.prototxt")
COMMON = ["train.log_period=1", f"train.train_iter={ITERS}", "scheduler.warmup_iter=2", "evaluation.eval_period=5",
          "evaluation.eval_iter=2"]


def command(program, nproc, out_dir, sets, extra=()):
    cmd = [launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "200", "--", program,
           "--config", config] + list(extra)
    for s in COMMON + [f"train.output_dir={out_dir}"] + sets:
        cmd += ["--set", s]
    return cmd


def train(name, nproc, sets, extra=()):
    out_dir = os.path.join(work, name.replace(" ", "_"))
    code, out, secs = run(command(example, nproc, out_dir, sets, extra), timeout=240)
    losses = {int(i): v for i, v in LOSS.findall(out)}
    check(f"{name}: iterations logged on {nproc} rank(s) ({secs:.1f} s)", code == 0 and len(losses) > 0,
          out[-4000:])
    return out, losses, out_dir


def merged(checkpoint):
    """A checkpoint's tensors, model and optimizer state, as one safetensors file's bytes."""
    path = checkpoint + ".safetensors"
    code, out, _ = run([os.path.join(prefix, "bin", "tessel-checkpoint"), "merge", checkpoint, path], timeout=120)
    check(f"tessel-checkpoint merges {os.path.relpath(checkpoint, work)}", code == 0, out[-2000:])
    with open(path, "rb") as f:
        return f.read()


# 4 ranks, as the prototxt lays it out: tp2 x pp2, graph mode, 1F1B.
out4, losses4, dir4 = train("tp2 pp2", 4, ["train.save_period=5", "train.keep_last_checkpoints=0"],
                            extra=["--print_actions"])
check(f"tp2 x pp2: {ITERS} losses", sorted(losses4) == list(range(1, ITERS + 1)), out4[-3000:])
if len(losses4) != ITERS:
    finish()
expect("the log names the registered model and its layout", out4,
       r"tessel-train: token_mlp, 4 layers, hidden 128; world 4 = dp 1 x tp 2 x pp 2")
expect("graph mode, 1F1B", out4, r"graph mode, 1f1b")
# The blocks' layer_idx split them over the stages: ranks 0 and 1 hold
# stage 0, ranks 2 and 3 stage 1, each running 1F1B's order of 4 micro-batches.
for rank, order in ((0, "F0 F1 B0 F2 B1 F3 B2 B3"), (3, "F0 B0 F1 B1 F2 B2 F3 B3")):
    expect(f"rank {rank} runs its stage's units in 1F1B's order", out4,
           rf"\[rank {rank}\] rank {rank} stage {rank // 2} 1f1b: {order}")
evals = EVAL.findall(out4)
check(f"evaluation reports loss and perplexity twice ({evals})", len(evals) == 2 and all(
    abs(float(p) - 2.718281828 ** float(l)) < 1e-3 * float(p) for l, p in evals), out4[-3000:])
first, last = losses4.get(1), losses4.get(ITERS)
check(f"the loss falls ({first} -> {last})", first is not None and last is not None and float(last) < float(first))

for mode, sets in (("graph", []), ("eager", ["train.graph.enabled=false"])):
    _, losses1, _ = train(f"one process {mode}", 1, ["train.dist.tensor_parallel_size=1",
                                                     "train.dist.pipeline_parallel_size=1"] + sets)
    worst = max((abs(float(losses1[i]) - float(losses4[i])) / float(losses1[i]) for i in losses4 if i in losses1),
                default=float("inf"))
    check(f"tp2 x pp2 gives one process's losses ({mode}) within 1e-5 (worst {worst:.2e})",
          len(losses1) == ITERS and worst <= 1e-5)

# metrics.jsonl and TensorBoard.
with open(os.path.join(dir4, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
train_records = [r for r in records if "loss" in r and "iteration" in r and "eval_loss" not in r]
check(f"metrics.jsonl: a record per iteration ({len(train_records)})",
      [r["iteration"] for r in train_records] == list(range(1, ITERS + 1)) and
      all(f"{r['loss']:.7f}" == losses4[r["iteration"]] for r in train_records), str(records[:3]))
check("metrics.jsonl: the evaluations (eval_loss, eval_perplexity)",
      sum(1 for r in records if "eval_loss" in r and "eval_perplexity" in r) == 2, str(records[-3:]))
events = glob.glob(os.path.join(dir4, "events.out.tfevents.*"))
data = open(events[0], "rb").read() if events else b""
check(f"a TensorBoard event file with the loss ({len(data)} bytes)", b"train/loss" in data)

# Resume from iteration 5: the checkpoint copied into a fresh directory, so
# the resumed run writes its own iteration 10.
resumed_ckpt = os.path.join(work, "resumed_checkpoints")
shutil.copytree(os.path.join(dir4, "checkpoints", "iter_0000005"), os.path.join(resumed_ckpt, "iter_0000005"))
out_r, losses_r, _ = train("resumed", 4, [f"train.checkpoint_dir={resumed_ckpt}", "train.save_period=5"],
                           extra=["--resume_step", "5"])
check("the resumed run logs iterations 6 to 10", sorted(losses_r) == list(range(6, ITERS + 1)), out_r[-3000:])
check("the resumed run's losses are the uninterrupted run's, digit for digit",
      all(losses_r.get(i) == losses4[i] for i in range(6, ITERS + 1)), f"{losses_r}\n{losses4}")
a = merged(os.path.join(dir4, "checkpoints", f"iter_{ITERS:07d}"))
b = merged(os.path.join(resumed_ckpt, f"iter_{ITERS:07d}"))
check(f"iteration {ITERS}'s checkpoint (model and optimizer, {len(a)} bytes) is byte-identical after resuming",
      len(a) > 0 and a == b)

# Hugging Face knows the zoo's models only: export-hf says so and points to merge.
code, out, _ = run([os.path.join(prefix, "bin", "tessel-checkpoint"), "export-hf",
                    os.path.join(dir4, "checkpoints", f"iter_{ITERS:07d}"), os.path.join(work, "hf")], timeout=120)
check("export-hf of a registered model fails", code not in (0, None), out[-2000:])
expect("export-hf names the model and the way out", out,
       r"model.arch 'token_mlp' has none; expected gpt2, llama, t5, bert or vit .*tessel-checkpoint merge")

# Mistakes, named before any work.
tessel_train = os.path.join(prefix, "bin", "tessel-train")
for what, program, sets, pattern in (
        ("a bad option value", example, ["model.options={key: \"tied_output\" value: \"yes\"}"],
         r"token_mlp: model.options tied_output is 'yes'; expected true or false"),
        ("an unknown option", example, ["model.options={key: \"tied_outputs\" value: \"true\"}"],
         r"token_mlp: model.options has 'tied_outputs'; the options are: tied_output"),
        ("a metric its evaluation lacks", example, ["train.best_checkpoint_metric=eval_accuracy"],
         r"train.best_checkpoint_metric is 'eval_accuracy'; expected one of eval_loss, eval_perplexity"),
        ("tessel-train does not know the model", tessel_train, [],
         r"model.arch is 'token_mlp'; expected one of gpt2, gpt, llama, t5, bert, vit")):
    one = ["train.dist.tensor_parallel_size=1", "train.dist.pipeline_parallel_size=1"]
    code, out, _ = run(command(program, 1, os.path.join(work, "mistake"), one + sets), timeout=90)
    check(f"{what}: the job fails", code not in (0, None), out[-2000:])
    expect(f"{what}: named before the first iteration", out if "iteration 1/" not in out else "", pattern)

# The tied variant trains too, on 4 ranks (the table crosses the pipeline).
_, tied, _ = train("tied", 4, ["model.options={key: \"tied_output\" value: \"true\"}"])
check(f"tied_output: {len(tied)} iterations on tp2 x pp2", len(tied) == ITERS)

shutil.rmtree(work, ignore_errors=True)
finish()
