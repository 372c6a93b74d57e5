"""tessel-train with configs/vit_tiny.prototxt (ViT on the bundled digits):
the same 20 losses (1e-5 relative) under 1x1x1, dp2, tp2, pp2, dp2 x tp2
and tp2 x pp2 in graph mode with 1F1B and eagerly on 1x1x1 and tp2 x pp2;
100 iterations with a falling loss in graph mode under pp2;
the whole config on one process reaches at least 93% accuracy on the
held-out images within 10 minutes, and its class token changes from the
first iteration to the last; synthetic images train; bad input is named
before the first iteration."""
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, checkpoint_tensor, expect, finish  # noqa: E402
from train_checks import Trainer, check_bad_inputs, check_long_runs, check_same_losses, train_args  # noqa: E402

args = train_args()
config = os.path.join(args.source, "configs", "vit_tiny.prototxt")
work = tempfile.mkdtemp(prefix="tessel_train_vit_")
train = Trainer(args.launcher, args.program, config)

ITERS = 20
check_same_losses(train, work, ITERS, [f"train.train_iter={ITERS}", "train.log_period=1", "evaluation.enabled=false",
                                       "scheduler.warmup_iter=5"], min_drop=0.05)
check_long_runs(train, work, ["scheduler.warmup_iter=10"], min_drop=0.5, runs=("graph pp2",))

# The whole config on one process: held-out accuracy.
out_dir = os.path.join(work, "digits")
code, out, secs = train(1, [f"train.output_dir={out_dir}", "train.save_period=100000"], timeout=600)
check(f"digits: the config trains on 1 process within 10 minutes ({secs:.1f} s)", code == 0 and secs < 600, out)
accuracy = [float(v) for v in re.findall(r"evaluation at iteration \d+: loss [0-9.]+ accuracy ([0-9.]+)", out)]
check(f"digits: held-out accuracy {accuracy[-1] if accuracy else 0:.4f} >= 0.93 at the end",
      bool(accuracy) and accuracy[-1] >= 0.93, out[-3000:])
expect("digits: the log names the data and its split", out,
       r"digits\.safetensors: 1797 images of 1 x 8 x 8 in 10 classes; train 1438, validation 359 images")
records = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))] if os.path.exists(
    os.path.join(out_dir, "metrics.jsonl")) else []
evals = [r for r in records if "eval_accuracy" in r]
check("digits: metrics.jsonl holds the evaluations' accuracy and loss",
      bool(evals) and abs(evals[-1]["eval_accuracy"] - accuracy[-1]) < 1e-5 and "eval_loss" in evals[-1],
      str(evals))

# The class token trains: a run of one iteration (one AdamW step, from the
# same initial values) and the whole run end with class tokens that differ
# in most values. Were it never trained (no gradient, and 1-D so no weight
# decay), both would hold the initial values.
first_dir = os.path.join(work, "digits_first")
code, out, _ = train(1, [f"train.output_dir={first_dir}", "train.train_iter=1", "train.save_period=1",
                         "scheduler.warmup_iter=0", "evaluation.enabled=false"])
check("digits: one iteration ran and saved a checkpoint", code == 0, out[-2000:])
last_iter = max([r.get("iteration", 0) for r in records] + [0])
try:
    first = checkpoint_tensor(os.path.join(first_dir, "checkpoints"), 1, "model.cls_token")
    last = checkpoint_tensor(os.path.join(out_dir, "checkpoints"), last_iter, "model.cls_token")
    moved = sum(abs(a - b) > 1e-6 for a, b in zip(first, last))
    check(f"digits: the class token changes during training ({moved} of {len(first)} values moved by more than "
          f"1e-6 from iteration 1 to {last_iter})", len(first) == len(last) > 0 and moved > len(first) // 2)
except (AssertionError, OSError, KeyError) as e:
    check("digits: the class token can be read from both checkpoints", False, str(e))

# Synthetic images of another size: learnable, no file.
code, out, _ = train(2, ["data.image_dataset=synthetic", "data.synthetic_samples=512", "model.image_size=16",
                         "model.patch_size=4", "model.num_channels=3", "train.dist.tensor_parallel_size=2",
                         "train.train_iter=60", "train.log_period=10", "scheduler.warmup_iter=5",
                         "evaluation.eval_period=60", f"train.output_dir={os.path.join(work, 'synthetic')}"])
check("synthetic images: training ran", code == 0, out)
losses = [float(v) for v in re.findall(r"\[rank 0\] iteration \d+/60 loss ([0-9.]+)", out)]
check(f"synthetic images: the loss falls ({losses[0] if losses else 0:.3f} -> {losses[-1] if losses else 0:.3f})",
      len(losses) == 7 and losses[-1] < losses[0] - 0.5, out[-2000:])
expect("synthetic images: the log describes them", out, r"synthetic: 512 images of 3 x 16 x 16 in 10 classes")

# Bad input: named before the first iteration.
bad = os.path.join(work, "bad")
os.makedirs(bad)
with open(os.path.join(args.source, "data", "digits", "digits.safetensors"), "rb") as f:
    digits = f.read()
with open(os.path.join(bad, "cut.safetensors"), "wb") as f:
    f.write(digits[: len(digits) - 100])
cases = {
    "images of another size": (["model.image_size=16"],
                               r"holds images of 1 x 8 x 8 but the model expects model\.num_channels 1 x "
                               r"model\.image_size 16 x 16"),
    "fewer classes than the data": (["model.num_classes=5"], r"has 10 classes but model\.num_classes is 5"),
    "image not whole patches": (["model.patch_size=3"], r"model\.image_size 8 is not a multiple of model\.patch_size 3"),
    "dataset missing": ([f"data.image_dataset={bad}/nothing.safetensors"],
                        r"cannot open " + re.escape(bad) + r"/nothing\.safetensors"),
    "truncated file": ([f"data.image_dataset={bad}/cut.safetensors"], r"cut\.safetensors.*end past the data section"),
    "synthetic without classes": (["data.image_dataset=synthetic", "model.num_classes=0"],
                                  r"\"synthetic\" needs model\.num_classes \(0\)"),
}
check_bad_inputs(train, work, cases, 2)
shutil.rmtree(work, ignore_errors=True)
finish()
