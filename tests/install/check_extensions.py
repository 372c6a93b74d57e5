"""The out-of-tree extension example (examples/custom_parallel): installs
tessel into a scratch prefix, builds the example against it with
find_package(tessel), and trains its config on 4 ranks (tp2 x pp2) with its
parallel mode, gradient handler and pipeline schedule, all picked by name.

- the mode's grids are the stages' ranks (stage 0 on ranks 0 and 2), and
  its own axis, "machine", groups ranks 0 1 and 2 3;
- every rank's action trace is the schedule's (backwards newest first);
- mode and schedule change no loss: the same 10 losses (1e-5) as the same
  program under 1d and 1F1B;
- the handler's effect: the frozen position embedding is bit-identical in
  the checkpoints of iterations 1, 5 and 10 while the token embedding moves;
  after one step it differs from that of a run without the handler (the
  same start), and from iteration 2 on the losses differ from that run's;
- names the program did not register are errors listing those it did."""
import json
import os
import re
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dist"))
from harness import check, expect, finish, run  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from example_build import install_and_build  # noqa: E402

build, source = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="tessel_extensions_")
LOSS = re.compile(r"\[rank 0\] iteration (\d+)/\d+ loss ([0-9.]+)")
ITERS = 10

prefix, example_build = install_and_build(build, source, work, "custom_parallel")

launcher = os.path.join(prefix, "bin", "tessel-launch")
config = os.path.join(source, "examples", "custom_parallel", "gpt2_custom_parallel.prototxt")
COMMON = ["train.log_period=1", "evaluation.enabled=false"]


def train(program, name, sets, extra=()):
    out_dir = os.path.join(work, name)
    cmd = [launcher, "--nproc_per_node", "4", "--master_port", "0", "--max_run_s", "200", "--", program,
           "--config", config] + list(extra)
    for s in COMMON + sets + [f"train.train_iter={ITERS}", f"train.output_dir={out_dir}", f"train.checkpoint_dir={out_dir}/checkpoints"]:
        cmd += ["--set", s]
    code, out, secs = run(cmd, timeout=240)
    losses = [float(v) for _, v in LOSS.findall(out)]
    check(f"{name}: {ITERS} iterations on 4 ranks ({secs:.1f} s)", code == 0 and len(losses) == ITERS,
          out[-4000:])
    return out, losses, out_dir


def tensors(checkpoint, names):
    """The named tensors of a checkpoint as raw bytes (merged into one safetensors file)."""
    merged = checkpoint + ".safetensors"
    code, out, _ = run([os.path.join(prefix, "bin", "tessel-checkpoint"), "merge", checkpoint, merged,
                        "--model_only"], timeout=120)
    check(f"tessel-checkpoint merges {os.path.basename(checkpoint)}", code == 0, out[-2000:])
    with open(merged, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        data = f.read()
    return {n: data[header[n]["data_offsets"][0]:header[n]["data_offsets"][1]] for n in names}


example = os.path.join(example_build, "custom_parallel")
custom, custom_losses, custom_dir = train(example, "custom", ["train.save_period=1", "train.keep_last_checkpoints=0"],
                                          extra=["--print_actions"])
expect("the mode's grids are the stages' ranks", custom,
       r"tensor_parallel_mode pp_inner \(tensor mesh \[2\]\): stage 0 \[dp x tp\] = \[\[0 2\]\]; stage 1 \[dp x tp\] = \[\[1 3\]\]")
for rank, stage in ((0, 0), (1, 1), (2, 0), (3, 1)):
    expect(f"rank {rank} runs stage {stage} in gpipe_lifo's order", custom,
           rf"\[rank {rank}\] rank {rank} stage {stage} gpipe_lifo: F0 F1 F2 F3 B3 B2 B1 B0")
expect("the handler froze the position embedding", custom, r"freeze: 1 parameters frozen \(prefix 'wpe\.'\)")
expect("the mode's own axis is in the layout", custom, r"axis machine \(pp_inner\): \[0 1\] \[2 3\]")

_, plain_losses, _ = train(example, "1d 1f1b", ["train.dist.tensor_parallel_mode=1d", "train.graph.pipeline=1f1b"])
worst = max((abs(a - b) / abs(b) for a, b in zip(custom_losses, plain_losses)), default=float("inf"))
check(f"pp_inner and gpipe_lifo give 1d and 1F1B's losses within 1e-5 (worst {worst:.2e})",
      len(custom_losses) == ITERS and worst <= 1e-5)

tessel_train = os.path.join(prefix, "bin", "tessel-train")
_, free_losses, free_dir = train(tessel_train, "no handler",
                                 ["train.dist.tensor_parallel_mode=1d", "train.graph.pipeline=1f1b",
                                  "train.gradient_handler=[]", "train.save_period=1", "train.keep_last_checkpoints=0"])
check("without the handler the first loss is the same (same start)",
      bool(free_losses) and bool(custom_losses) and free_losses[0] == custom_losses[0])
check("without the handler the losses after the first step differ",
      len(free_losses) == ITERS and all(abs(a - b) > 1e-6 for a, b in zip(free_losses[1:], custom_losses[1:])),
      f"{free_losses}\n{custom_losses}")

names = ["model.wpe.weight", "model.wte.weight"]
at = {it: tensors(os.path.join(d, "checkpoints", f"iter_{it:07d}"), names)
      for it, d in ((1, custom_dir), (5, custom_dir), (10, custom_dir))}
free = tensors(os.path.join(free_dir, "checkpoints", "iter_0000001"), names)
check("the frozen wpe.weight is bit-identical at iterations 1, 5 and 10",
      at[1]["model.wpe.weight"] == at[5]["model.wpe.weight"] == at[10]["model.wpe.weight"])
check("wte.weight trains: it changes from iteration 1 to 5 to 10",
      at[1]["model.wte.weight"] != at[5]["model.wte.weight"] != at[10]["model.wte.weight"])
check("without the handler wpe.weight moved in the first step", free["model.wpe.weight"] != at[1]["model.wpe.weight"])

for what, sets, pattern in (
        ("tessel-train does not know the example's mode",
         ["train.graph.pipeline=1f1b", "train.gradient_handler=[]"], r"tensor_parallel_mode 'pp_inner' is not registered; "
                                                             r"registered: 1d, 2\.5d, 2d, 3d "),
        ("an unregistered schedule is named", ["train.graph.pipeline=zero_bubble"],
         r"pipeline schedule 'zero_bubble' is not registered; registered: 1f1b, gpipe, gpipe_lifo, interleaved_1f1b, naive, zb_h1"),
        ("an unregistered handler is named", ['train.gradient_handler=[{name: "freez"}]'],
         r"gradient handler 'freez' is not registered; registered: clip_value, freeze"),
        ("a handler's missing option is named", ['train.gradient_handler=[{name: "freeze"}]'],
         r"gradient handler 'freeze' needs option 'prefix'")):
    program = tessel_train if what.startswith("tessel-train") else example
    code, out, _ = run([launcher, "--nproc_per_node", "4", "--master_port", "0", "--max_run_s", "60", "--", program,
                        "--config", config] + [a for s in sets for a in ("--set", s)], timeout=90)
    check(f"{what}: the job fails", code not in (0, None), out[-2000:])
    expect(f"{what}: before the first iteration", out if "iteration 1/" not in out else "", pattern)

finish()
