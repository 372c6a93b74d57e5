"""tessel-train's checkpoints (checkpoint/checkpoint.h) on the tiny GPT:
a checkpoint saved at iteration 5 under tp2 x pp2 resumes under tp2 x pp2
bit-identically (the same losses, and the iteration-10 checkpoint's shards
byte for byte those of an uninterrupted run), and under dp4 and on one
process with the uninterrupted run's losses (1e-5); a vocabulary that
another tp pads to other row counts loads its real rows; a job killed
(SIGKILL) at three points of a save leaves the previous checkpoint whole
and --resume finishes from it; the last keep_last_checkpoints are kept; a
damaged shard (one flipped byte, a truncation), a tensor missing from the
index, a checkpoint of another model, a shape that disagrees and an empty
directory are named before the first iteration, and leave the checkpoint
as it was. With dropout (eager), the dropouts' mask counters are saved and
a resumed run repeats the uninterrupted losses exactly."""
import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, expect, finish, poke_f32, run  # noqa: E402
from train_checks import LOSS, Trainer, layout_sets  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
parser.add_argument("--source", required=True)
parser.add_argument("--tool", required=True, help="tessel-checkpoint")
args = parser.parse_args()
work = tempfile.mkdtemp(prefix="tessel_checkpoint_")
gpt = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "gpt2_tiny.prototxt"))
bert = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "bert_tiny.prototxt"))

# A constant learning rate: a run of 5 iterations is the first half of one of 10.
COMMON = ["train.log_period=1", "evaluation.enabled=false", "scheduler.name=constant", "scheduler.warmup_iter=0"]


def losses(out):
    return {int(i): v for i, v in LOSS.findall(out)}


def train(trainer, nproc, tp, pp, iters, checkpoints, extra=(), resume=False, env=None):
    sets = COMMON + layout_sets(tp, pp, True) + [f"train.train_iter={iters}", f"train.checkpoint_dir={checkpoints}",
                                                f"train.output_dir={checkpoints}_out"] + list(extra)
    cmd = [args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "220", "--",
           args.program, "--config", trainer.config] + (["--resume"] if resume else [])
    for s in sets:
        cmd += ["--set", s]
    return run(cmd, env=env, timeout=240)


def digest(directory):
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in sorted(glob.glob(os.path.join(directory, "*")))}


# Uninterrupted: 10 iterations under tp2 x pp2, a checkpoint at the end.
full_dir = os.path.join(work, "full")
code, out, secs = train(gpt, 4, 2, 2, 10, full_dir, ["train.save_period=10"])
full = losses(out)
check(f"uninterrupted tp2 x pp2: 10 iterations ({secs:.1f} s)", code == 0 and len(full) == 10, out[-3000:])
expect("uninterrupted: the save is logged", out, r"saved checkpoint .*iter_0000010 in [0-9.]+ s")

# The first half, saved at iteration 5.
half_dir = os.path.join(work, "half")
code, out, _ = train(gpt, 4, 2, 2, 5, half_dir, ["train.save_period=5"])
check("first half: 5 iterations and a checkpoint", code == 0 and os.path.exists(
    os.path.join(half_dir, "iter_0000005", "index.json")), out[-3000:])
check("first half: its losses are the uninterrupted run's", losses(out) == {i: full[i] for i in range(1, 6)},
      f"{losses(out)} vs {full}")
check("first half: `latest` names it", open(os.path.join(half_dir, "latest")).read().strip() == "iter_0000005")
shards = sorted(glob.glob(os.path.join(half_dir, "iter_0000005", "shard-*.safetensors")))
check("first half: one shard per rank, an index and the config",
      [os.path.basename(s) for s in shards] == [f"shard-0000{r}-of-00004.safetensors" for r in range(4)] and
      os.path.exists(os.path.join(half_dir, "iter_0000005", "config.prototxt")))
saved_state = digest(os.path.join(half_dir, "iter_0000005"))

# Resumed under the same layout: bit-identical.
same_dir = os.path.join(work, "same")
shutil.copytree(half_dir, same_dir)
code, out, _ = train(gpt, 4, 2, 2, 10, same_dir, ["train.save_period=10"], resume=True)
expect("tp2 x pp2: resumes at iteration 5", out, r"resumed from .*iter_0000005 at iteration 5 \(saved by 4 ranks "
                                                  r"as dp 1 x tp 2 x pp 2\)")
resumed = losses(out)
check(f"tp2 x pp2: iterations 6 to 10 print the uninterrupted losses exactly",
      code == 0 and resumed == {i: full[i] for i in range(6, 11)}, f"{resumed} vs {full}")
full_shards = digest(os.path.join(full_dir, "iter_0000010"))
same_shards = digest(os.path.join(same_dir, "iter_0000010"))
identical = [name for name in full_shards if name.startswith("shard-") and full_shards[name] == same_shards.get(name)]
check(f"tp2 x pp2: the iteration-10 shards (model and optimizer state) equal the uninterrupted run's byte for "
      f"byte ({len(identical)} of 4)", len(identical) == 4)

# Resumed under other layouts: the same losses within 1e-5.
for name, (nproc, tp, pp) in {"dp4": (4, 1, 1), "1x1x1": (1, 1, 1)}.items():
    layout_dir = os.path.join(work, name)
    shutil.copytree(half_dir, layout_dir)
    code, out, _ = train(gpt, nproc, tp, pp, 10, layout_dir, resume=True)
    resumed = losses(out)
    worst = max((abs(float(resumed[i]) - float(full[i])) / abs(float(full[i])) for i in range(6, 11) if i in resumed),
                default=float("inf"))
    check(f"{name}: resumed from tp2 x pp2, iterations 6 to 10 match within 1e-5 (worst {worst:.2e})",
          code == 0 and sorted(resumed) == list(range(6, 11)) and worst <= 1e-5, out[-3000:])

# tessel-checkpoint: info, merge into one safetensors file, split it back as a
# one-shard checkpoint, which resumes on one process.
code, out, _ = run([args.tool, "info", half_dir])
check("tessel-checkpoint info names the iteration, the layout and each tensor's boxes",
      code == 0 and "iteration: 5" in out and "layout: dp 1 x tp 2 x pp 2" in out and
      re.search(r"model\.h0\.attention\.qkv\.weight F32 \[128, 384\] on cpu:\[0, 1\] as \[S\(1\)\]: "
                r"\[0:128, 0:192\]@0 \[0:128, 192:384\]@1", out) is not None, out[-2000:])
merged = os.path.join(work, "merged.safetensors")
code, out, _ = run([args.tool, "merge", half_dir, merged])
check("tessel-checkpoint merge writes one file", code == 0 and os.path.exists(merged), out[-2000:])
model_only = os.path.join(work, "model_only.safetensors")
code, out, _ = run([args.tool, "merge", half_dir, model_only, "--model_only"])
model_count = [int(n) for n in re.findall(r"merged (\d+) tensors", out)]
all_count = len(json.load(open(os.path.join(half_dir, "iter_0000005", "index.json")))["tensors"])
check(f"merge --model_only keeps the model's tensors ({model_count} of {all_count}: without each one's two "
      "moments and step)", code == 0 and model_count == [all_count // 4], out[-2000:])
split_dir = os.path.join(work, "split")
code, out, _ = run([args.tool, "split", merged, split_dir])
check("tessel-checkpoint split writes a one-shard checkpoint",
      code == 0 and os.path.exists(os.path.join(split_dir, "iter_0000005", "shard-00000-of-00001.safetensors")),
      out[-2000:])
code, out, _ = train(gpt, 1, 1, 1, 10, split_dir, resume=True)
check("the merged-and-split checkpoint resumes on one process with the uninterrupted losses",
      code == 0 and {i: float(v) for i, v in losses(out).items()} ==
      {i: float(full[i]) for i in range(6, 11)}, out[-2000:])

# Weights holding a NaN (a damaged file, a diverged run): training stops at
# its first iteration, naming it, before logging or saving it (it trained on
# into NaN before).
nan_file = os.path.join(work, "nan.safetensors")
shutil.copy(merged, nan_file)
poke_f32(nan_file, "model.ln_f.weight", 0, float("nan"))
nan_dir = os.path.join(work, "nan")
code, out, _ = run([args.tool, "split", nan_file, nan_dir])
check("a checkpoint with a NaN weight is written", code == 0, out[-2000:])
code, out, _ = train(gpt, 1, 1, 1, 10, nan_dir, ["train.save_period=1"], resume=True)
check("NaN weights: the job fails", code not in (0, None), out[-2000:])
expect("NaN weights: the error names the iteration and the value", out,
       r"iteration 6: the loss is nan and the gradient norm nan; training stops at the first non-finite value")
check("NaN weights: nothing was logged or saved for it",
      "iteration 6/" not in out and not os.path.exists(os.path.join(nan_dir, "iter_0000006")), out[-2000:])

# A vocabulary that tp pads otherwise: 2,100 tokens are 2,304 rows under tp2
# and 2,176 on one process; the real rows load, the losses go on.
vocab = ["model.vocab_size=2100"]
code, out, _ = train(gpt, 4, 2, 2, 10, os.path.join(work, "vocab_full"), vocab)
vocab_full = losses(out)
vocab_dir = os.path.join(work, "vocab")
code, out, _ = train(gpt, 4, 2, 2, 5, vocab_dir, vocab + ["train.save_period=5"])
check("vocab 2100 under tp2 x pp2: saved at iteration 5", code == 0 and len(vocab_full) == 10, out[-2000:])
code, out, _ = train(gpt, 1, 1, 1, 10, vocab_dir, vocab, resume=True)
resumed = losses(out)
worst = max((abs(float(resumed[i]) - float(vocab_full[i])) / abs(float(vocab_full[i])) for i in range(6, 11)
             if i in resumed), default=float("inf"))
check(f"vocab 2100: the 2,304-row table resumes as 2,176 rows on one process, iterations 6 to 10 within 1e-5 "
      f"(worst {worst:.2e})", code == 0 and sorted(resumed) == list(range(6, 11)) and worst <= 1e-5, out[-2000:])

# Dropout (eager): the checkpoint keeps each dropout's mask counter, so the
# resumed run draws the masks the uninterrupted one drew; without them (the
# counters taken out of the index) it would draw the first iterations' again.
drop = ["train.graph.enabled=false", "model.hidden_dropout_prob=0.1", "model.attention_dropout_prob=0.1",
        "model.embedding_dropout_prob=0.1"]
code, out, _ = train(gpt, 4, 2, 2, 10, os.path.join(work, "drop_full"), drop)
drop_full = losses(out)
drop_dir = os.path.join(work, "drop")
code, out, _ = train(gpt, 4, 2, 2, 5, drop_dir, drop + ["train.save_period=5"])
meta = json.load(open(os.path.join(drop_dir, "iter_0000005", "index.json")))["metadata"]
counters = {k: v for k, v in meta.items() if k.startswith("rng.")}
check(f"dropout: the checkpoint holds the {len(counters)} dropout counters, advanced",
      code == 0 and len(counters) == 1 + 3 * 4 and all(int(v) > 0 for v in counters.values()), str(meta))
no_rng_dir = os.path.join(work, "drop_no_rng")
shutil.copytree(drop_dir, no_rng_dir)
code, out, _ = train(gpt, 4, 2, 2, 10, drop_dir, drop, resume=True)
check("dropout: resumed under tp2 x pp2, iterations 6 to 10 print the uninterrupted losses exactly",
      code == 0 and losses(out) == {i: drop_full[i] for i in range(6, 11)}, f"{losses(out)} vs {drop_full}")
index_path = os.path.join(no_rng_dir, "iter_0000005", "index.json")
index = json.load(open(index_path))
index["metadata"] = {k: v for k, v in index["metadata"].items() if not k.startswith("rng.")}
json.dump(index, open(index_path, "w"))
code, out, _ = train(gpt, 4, 2, 2, 10, no_rng_dir, drop, resume=True)
check("dropout: without the counters the resumed losses differ (the check above can fail)",
      code == 0 and len(losses(out)) == 5 and losses(out) != {i: drop_full[i] for i in range(6, 11)}, out[-2000:])

# A job killed (SIGKILL on rank 0) at three points of the iteration-10 save
# leaves `latest` at iteration 5, whole; --resume then finishes the run with
# the uninterrupted losses.
for point in ("shards", "index", "rename"):
    killed_dir = os.path.join(work, "killed_" + point)
    shutil.copytree(half_dir, killed_dir)
    code, out, _ = train(gpt, 4, 2, 2, 10, killed_dir, ["train.save_period=5"], resume=True,
                         env={"TESSEL_CHECKPOINT_KILL": point})
    check(f"killed at '{point}': the job stops, naming rank 0", code not in (0, None) and
          re.search(r"rank 0 \(pid \d+\) was killed by signal 9", out) is not None, out[-2000:])
    check(f"killed at '{point}': `latest` still names iteration 5, unchanged",
          open(os.path.join(killed_dir, "latest")).read().strip() == "iter_0000005" and
          digest(os.path.join(killed_dir, "iter_0000005")) == saved_state)
    code, out, _ = train(gpt, 4, 2, 2, 10, killed_dir, ["train.save_period=5"], resume=True)
    check(f"killed at '{point}': --resume continues from iteration 5 to the uninterrupted losses",
          code == 0 and "at iteration 5" in out and losses(out) == {i: full[i] for i in range(6, 11)}, out[-2000:])
    check(f"killed at '{point}': the second try completes iteration 10",
          open(os.path.join(killed_dir, "latest")).read().strip() == "iter_0000010" and
          not glob.glob(os.path.join(killed_dir, "*.tmp")) and not glob.glob(os.path.join(killed_dir, "*.old")))

# keep_last_checkpoints: saves at 2, 4, 6 keep the last two.
keep_dir = os.path.join(work, "keep")
code, out, _ = train(gpt, 1, 1, 1, 6, keep_dir, ["train.save_period=2", "train.keep_last_checkpoints=2"])
kept = sorted(os.path.basename(p) for p in glob.glob(os.path.join(keep_dir, "iter_*")))
check(f"keep_last_checkpoints 2: {kept}", code == 0 and kept == ["iter_0000004", "iter_0000006"], out[-2000:])

# Bad input: named before the first iteration; the checkpoint stays as it was.
cases = {}
flipped = os.path.join(work, "flipped")
shutil.copytree(half_dir, flipped)
shard = os.path.join(flipped, "iter_0000005", "shard-00000-of-00004.safetensors")
data = bytearray(open(shard, "rb").read())
data[-5] ^= 0x40  # in the last tensor's bytes
open(shard, "wb").write(bytes(data))
cases["a flipped byte"] = (gpt, flipped, [], r"shard-00000-of-00004\.safetensors: tensor '[^']+': checksum mismatch")
cut = os.path.join(work, "cut")
shutil.copytree(half_dir, cut)
shard = os.path.join(cut, "iter_0000005", "shard-00001-of-00004.safetensors")
open(shard, "r+b").truncate(os.path.getsize(shard) - 100)
cases["a truncated shard"] = (gpt, cut, [], r"shard-00001-of-00004\.safetensors")
missing = os.path.join(work, "missing")
shutil.copytree(half_dir, missing)
index_path = os.path.join(missing, "iter_0000005", "index.json")
index = json.load(open(index_path))
del index["tensors"]["model.h1.mlp.fc2.bias"]
json.dump(index, open(index_path, "w"))
cases["a tensor missing from the index"] = (gpt, missing, [], r"has no tensor 'model\.h1\.mlp\.fc2\.bias'")
# A shard from another iteration (the same names and shapes, other values):
# it loaded silently before.
swapped = os.path.join(work, "swapped")
shutil.copytree(half_dir, swapped)
shutil.copy(os.path.join(full_dir, "iter_0000010", "shard-00001-of-00004.safetensors"),
            os.path.join(swapped, "iter_0000005", "shard-00001-of-00004.safetensors"))
cases["a shard of another iteration"] = (gpt, swapped, [],
                                         r"checkpoint shard .*iter_0000005/shard-00001-of-00004\.safetensors belongs to "
                                         r"another save \(save id [0-9a-f]+\) than its index")
cases["a checkpoint of another model"] = (bert, half_dir, [],
                                          r"checkpoint .*iter_0000005 \(--resume.*\) is of model\.arch 'gpt2' but this config "
                                          r"trains 'bert'")
cases["a shape that disagrees"] = (gpt, half_dir, ["model.ffn_hidden_size=256"],
                                   r"tensor 'model\.h0\.mlp\.fc1\.weight' has shape \[128, 512\] there but "
                                   r"\[128, 256\] in the model")
cases["no checkpoint"] = (gpt, os.path.join(work, "nothing"), [], r"--resume but .*nothing holds no complete checkpoint")
for name, (trainer, directory, extra, pattern) in cases.items():
    before = digest(os.path.join(directory, "iter_0000005")) if os.path.exists(directory) else {}
    code, out, _ = train(trainer, 4, 2, 2, 10, directory, extra, resume=True)
    check(f"{name}: the job fails", code not in (0, None), out[-2000:])
    expect(f"{name}: the error says so", out, pattern)
    check(f"{name}: before the first iteration", "iteration 6/" not in out and "iteration 1/" not in out)
    if before:  # (the case without a checkpoint has nothing to leave)
        check(f"{name}: the checkpoint is left as it was", digest(os.path.join(directory, "iter_0000005")) == before)
check("the saved checkpoint itself was never changed", digest(os.path.join(half_dir, "iter_0000005")) == saved_state)

# The checkpoint directory is claimed before the first step.
# A file where the directory should be: named before iteration 1 (it failed
# at the first save before).
as_file = os.path.join(work, "a_file")
open(as_file, "w").close()
code, out, _ = train(gpt, 1, 1, 1, 5, as_file, ["train.save_period=5"])
check("checkpoint_dir a file: the job fails before iteration 1", code not in (0, None) and "iteration 1/" not in out,
      out[-2000:])
expect("checkpoint_dir a file: the error names it", out,
       re.escape(as_file) + r" cannot be made \(a file of that name is there\)")
# Two jobs on one directory: the second is refused, naming the first.
shared = os.path.join(work, "shared")
first_cmd = [args.launcher, "--nproc_per_node", "1", "--master_port", "0", "--max_run_s", "120", "--", args.program,
             "--config", gpt.config]
for s_ in COMMON + layout_sets(1, 1, True) + ["train.train_iter=100000", "train.save_period=100000",
                                              f"train.checkpoint_dir={shared}", f"train.output_dir={shared}_out"]:
    first_cmd += ["--set", s_]
first = subprocess.Popen(first_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
started = False
for line in first.stdout:
    if "iteration 1/" in line:
        started = True
        break
code, out, _ = train(gpt, 1, 1, 1, 5, shared, ["train.save_period=5"])
first.terminate()
first.communicate(timeout=60)
check("two jobs, one checkpoint_dir: the first trains", started)
check("two jobs, one checkpoint_dir: the second fails before iteration 1",
      code not in (0, None) and "iteration 1/" not in out, out[-2000:])
expect("two jobs, one checkpoint_dir: the error names the directory and the first job", out,
       r"checkpoint directory .*shared is being written by another job \(pid \d+ on ")
# What a killed save left (iter_N.tmp of any iteration) is cleaned at the next save.
stale = os.path.join(work, "stale")
os.makedirs(os.path.join(stale, "iter_0000003.tmp"))
code, out, _ = train(gpt, 1, 1, 1, 5, stale, ["train.save_period=5"])
check("a killed save's iter_0000003.tmp is gone after the next save",
      code == 0 and not os.path.exists(os.path.join(stale, "iter_0000003.tmp")) and
      os.path.exists(os.path.join(stale, "iter_0000005", "index.json")), out[-2000:])
shutil.rmtree(work, ignore_errors=True)
finish()
