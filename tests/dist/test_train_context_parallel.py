"""Context parallelism (train.dist.sequence_parallel_mode context): the
data-parallel ranks share each micro-batch's rows and split every
sequence; each attention keeps its queries split and gathers the keys and
values. The tiny GPT on one sequence of 4,096 tokens per micro-batch
(hidden 128, 2 heads, 2 layers) under cp 1, 2 and 4:

- the losses of one process (1e-5);
- the memory a step holds beyond the variables (tessel-train's logged peak
  less the same run's at 64 tokens) falls as 1/cp within 10%, and so do
  tessel-plan's planned activations of the same model;
- tessel-plan counts the gathers: 2 all-gathers per layer over dp, into
  buffers of the whole keys and values."""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, run  # noqa: E402
from train_checks import LOSS, Trainer, train_args  # noqa: E402

args = train_args()
work = tempfile.mkdtemp(prefix="tessel_context_parallel_")
gpt = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "gpt2_tiny.prototxt"))
MEMORY = re.compile(r"\[rank 0\] iteration 2/2 .* memory ([0-9]+)/[0-9]+ MiB")
SHAPE = ["model.hidden_layers=2", "model.num_attention_heads=2", "train.micro_batch_size=1",
         "train.global_batch_size=1", "train.dist.tensor_parallel_size=1", "train.dist.pipeline_parallel_size=1",
         "train.train_iter=2", "train.log_period=1", "evaluation.enabled=false", "scheduler.warmup_iter=0"]
CONTEXT = ["train.dist.sequence_parallel=true", "train.dist.sequence_parallel_mode=context"]


def step(cp, seq):
    sets = SHAPE + [f"model.max_seq_length={seq}", f"train.output_dir={os.path.join(work, f'cp{cp}_{seq}')}"]
    code, out, secs = gpt(cp, sets + (CONTEXT if cp > 1 else []))
    peak = MEMORY.search(out)
    losses = [float(v) for _, v in LOSS.findall(out)]
    check(f"cp {cp}, sequence {seq}: 2 iterations ({secs:.1f} s)", code == 0 and peak and len(losses) == 2,
          out[-3000:])
    return (int(peak.group(1)) if peak else 0), losses


held, losses = {}, {}
for cp in (1, 2, 4):
    base, _ = step(cp, 64)
    peak, losses[cp] = step(cp, 4096)
    held[cp] = peak - base
for cp in (2, 4):
    worst = max((abs(a - b) / abs(b) for a, b in zip(losses[cp], losses[1])), default=float("inf"))
    check(f"cp {cp}: the losses of one process within 1e-5 (worst {worst:.2e})",
          len(losses[cp]) == 2 and worst <= 1e-5)
    ratio = held[cp] / held[1] if held[1] else float("inf")
    check(f"cp {cp}: a step holds {held[cp]} MiB beyond the variables against {held[1]} MiB on one process, "
          f"{ratio:.3f} of it (1/cp within 10%)", abs(ratio * cp - 1) <= 0.10)

plan = os.path.join(os.path.dirname(args.program), "tessel-plan")
ROW = re.compile(r"^\s+0\s+0\s+1\s+\S+ \S+\s+([0-9.]+) (GiB|MiB)", re.M)
GATHER = re.compile(r"^\s+dp\s+all-gather\s+(\d+) ops\s+(\d+) bytes", re.M)
planned = {}
for cp in (1, 2, 4):
    cmd = [plan, "--dp", str(cp), "--tp", "1", "--pp", "1", "--layers", "2", "--hidden", "768", "--heads", "12",
           "--vocab", "1024", "--seq", "4096", "--micro_batch_size", "1", "--micro_batches", "1", "--rank", "0"]
    if cp > 1:
        cmd += ["--sequence_parallel", "--sequence_parallel_mode", "context"]
    code, out, _ = run(cmd, timeout=120)
    row = ROW.search(out)
    check(f"tessel-plan cp {cp}: a memory row", code == 0 and row is not None, out[-3000:])
    if row:
        planned[cp] = float(row.group(1)) * (1024 if row.group(2) == "GiB" else 1)
    if cp > 1:
        gather = GATHER.search(out)
        # Per layer the keys and the values, [1, 12, 4096, 64] f32 each: the
        # plan counts a gather's whole buffer.
        expected = 2 * 2 * 4096 * 768 * 4
        check(f"tessel-plan cp {cp}: 4 all-gathers over dp, {expected} bytes",
              gather is not None and int(gather.group(1)) == 4 and int(gather.group(2)) == expected,
              gather.group(0) if gather else out[-3000:])
for cp in (2, 4):
    if 1 in planned and cp in planned:
        ratio = planned[cp] / planned[1]
        check(f"tessel-plan cp {cp}: activations {planned[cp]:.0f} MiB against {planned[1]:.0f} MiB, {ratio:.3f} "
              f"(1/cp within 10%)", abs(ratio * cp - 1) <= 0.10)
finish()
