"""tessel-train on the bundled corpus from configs/gpt2_tiny.prototxt: the
same 20 losses (1e-5 relative) under 1x1x1, dp2, tp2, pp2, dp2 x tp2 and
tp2 x pp2 in graph mode with 1F1B (the global batch of 16 stays; the
accumulation steps follow from dp), eagerly on 1x1x1 and tp2 x pp2, and the
loss falls; the output directory holds the resolved config and
metrics.jsonl; 100 iterations lower the loss by 1.5 nats eagerly and in
graph mode under pp2; --fast_dev_run writes nothing. Bad input is named before the
first iteration: an unknown field (with the closest), inconsistent batch
sizes, dist sizes that do not divide the world, a dataset prefix missing, a
truncated .idx, a vocabulary smaller than the data's ids, each said in 3
lines under 4 ranks. --help is short; Megatron's flags get their --set
equivalent and a misspelt flag the closest one."""
import glob
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, expect, finish, run  # noqa: E402
from train_checks import (Trainer, check_bad_inputs, check_long_runs, check_same_losses, layout_sets,  # noqa: E402
                          train_args)

args = train_args()
config = os.path.join(args.source, "configs", "gpt2_tiny.prototxt")
work = tempfile.mkdtemp(prefix="tessel_train_layouts_")
ITERS = 20
train = Trainer(args.launcher, args.program, config)
common = [f"train.train_iter={ITERS}", "train.log_period=1", "evaluation.enabled=false",
          "scheduler.warmup_iter=5"]
losses = check_same_losses(train, work, ITERS, common, min_drop=0.5)
check_long_runs(train, work, [], min_drop=1.5)

# What a run leaves: the resolved config (every derived size) and the metrics.
out_dir = os.path.join(work, "tp2xpp2")
saved = open(os.path.join(out_dir, "config.prototxt")).read() if os.path.exists(
    os.path.join(out_dir, "config.prototxt")) else ""
for field in ("data_parallel_size: 1", "num_accumulation_steps: 4", "pipeline_num_layers: 4",
              "ffn_hidden_size: 512", "global_batch_size: 16"):
    check(f"resolved config holds {field}", field in saved, saved)
records = []
if os.path.exists(os.path.join(out_dir, "metrics.jsonl")):
    records = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
check(f"metrics.jsonl has {ITERS} records", len(records) == ITERS, str(records[:3]))
check("metrics.jsonl holds the losses printed",
      [round(r.get("loss", -1), 5) for r in records] == [round(v, 5) for v in losses["tp2xpp2"]], str(records[:3]))
keys = {"iteration", "loss", "lr", "tokens_seen", "samples_per_s", "tokens_per_s", "tflops_per_device", "mfu",
        "time_per_iter_ms", "data_ms", "memory_peak_mib", "memory_reserved_mib", "peak_rss_mib", "eta_s"}
check("metrics.jsonl records carry " + ", ".join(sorted(keys)), bool(records) and keys <= set(records[0]),
      str(records[:1]))

# The figures of a log line, from the records of a run logging every 5
# iterations under tp2 x pp2: the loss is the mean of the period's (the
# per-iteration losses of the run above), tokens count 16 x 64 per
# iteration, TFLOP/s per device are the model FLOPs of Megatron-LM's
# formula over the time per iteration and the 4 ranks, MFU their share of
# the peak the run states, memory is positive.
period_dir = os.path.join(work, "period")
code, out, _ = train(4, common[:1] + ["train.log_period=5", "evaluation.enabled=false", "scheduler.warmup_iter=5",
                                      f"train.output_dir={period_dir}", "train.timeline_iterations=[10]"] +
                     layout_sets(2, 2, True))
peak = re.search(r"tessel-train: ([0-9.]+) GFLOP per iteration \(model FLOPs\); MFU against ([0-9.e+-]+) TFLOP/s",
                 out)
check("log period 5: the run states its FLOPs and peak", code == 0 and peak is not None, out[-2000:])
# Megatron-LM's count (Narayanan et al. 2021, eq. 3, without recomputation's
# extra forward: 72 instead of 96): 72 B s L h^2 (1 + s / 6h + V / 12hL).
B, S, L, H, V = 16, 64, 4, 128, 2048
gflop = 72 * B * S * L * H * H * (1 + S / (6 * H) + V / (12 * H * L)) / 1e9
check(f"model FLOPs per iteration: {peak.group(1) if peak else None} (expected {gflop:.4g})",
      peak is not None and abs(float(peak.group(1)) - gflop) <= 1e-3 * gflop)
rows = [json.loads(line) for line in open(os.path.join(period_dir, "metrics.jsonl"))] if code == 0 else []
check("log period 5: records at 1, 5, 10, 15, 20", [r["iteration"] for r in rows] == [1, 5, 10, 15, 20], str(rows))
per_iteration = losses["tp2xpp2"]
previous = 0
for r in rows:
    first, previous = previous + 1, r["iteration"]
    want = sum(per_iteration[first - 1:r["iteration"]]) / (r["iteration"] - first + 1)
    check(f"iteration {r['iteration']}: loss {r['loss']:.6f} is the mean of iterations {first}..{r['iteration']} "
          f"({want:.6f})", abs(r["loss"] - want) <= 1e-5 * abs(want))
    check(f"iteration {r['iteration']}: tokens_seen {r['tokens_seen']}", r["tokens_seen"] == r["iteration"] * 16 * 64)
    tflops = gflop * 1e9 / (r["time_per_iter_ms"] / 1e3) / 4 / 1e12
    check(f"iteration {r['iteration']}: tflops_per_device {r['tflops_per_device']:.4g} = FLOPs / time / ranks "
          f"({tflops:.4g})", abs(r["tflops_per_device"] - tflops) <= 2e-3 * tflops)
    check(f"iteration {r['iteration']}: mfu {r['mfu']:.4g} = tflops / the stated peak",
          peak is not None and abs(r["mfu"] - r["tflops_per_device"] / float(peak.group(2))) <= 2e-3 * r["mfu"])
    check(f"iteration {r['iteration']}: memory peak {r['memory_peak_mib']} MiB of {r['memory_reserved_mib']} "
          f"reserved", 0 < r["memory_peak_mib"] <= r["memory_reserved_mib"])

# train.timeline_iterations: iteration 10's step left each rank's Chrome
# trace, which tools/pipeline_timeline.py reads: every rank ran the four
# micro-batches' forward and backward units of its stage.
sys.path.insert(0, os.path.join(args.source, "tools"))
from pipeline_timeline import load  # noqa: E402
timeline_dir = os.path.join(period_dir, "timeline", "iter_0000010")
expect("timeline: the run says where it is", out, r"the timeline of iteration 10 is in .*iter_0000010")
traces = sorted(glob.glob(os.path.join(timeline_dir, "timeline_rank*.json")))
check(f"timeline: one trace per rank ({len(traces)})", len(traces) == 4)
ranks = load(traces) if len(traces) == 4 else {}
for rank, r in sorted(ranks.items()):
    names = sorted(u["name"] for u in r["units"])
    check(f"timeline: rank {rank} (stage {r['stage']}) ran {names}",
          names == ["B0", "B1", "B2", "B3", "F0", "F1", "F2", "F3"] and r["stage"] == rank // 2 and r["compute"])
check("timeline: no other iteration traced", os.listdir(os.path.join(period_dir, "timeline")) == ["iter_0000010"])

# data.blend: two copies of the bundled corpus under other names, weights 1
# and 3: the 32 samples of two iterations come 8 and 24 from them.
blend_dir = os.path.join(work, "blend")
os.makedirs(blend_dir)
corpus_prefix = os.path.join(args.source, "data", "tiny_corpus", "tiny_corpus_text_document")
for name in ("web", "books"):
    for ext in (".bin", ".idx"):
        shutil.copy(corpus_prefix + ext, os.path.join(blend_dir, name + ext))
blend = (f'data.blend=[{{weight: 1 data_prefix: "{blend_dir}/web"}}, '
         f'{{weight: 3 data_prefix: "{blend_dir}/books"}}]')
code, out, _ = run([args.launcher, "--nproc_per_node", "4", "--master_port", "0", "--", args.program, "--config",
                    config, "--set", "data.data_prefix=", "--set", blend, "--fast-dev-run"], timeout=120)
check("blend: trains", code == 0 and "iteration 2/2" in out, out[-2000:])
expect("blend: 8 samples from the first dataset and 24 from the second", out,
       r"train 32 samples \(8 from .*/web, 1 epochs of 653 documents; 24 from .*/books, 1 epochs of 653 "
       r"documents\)")

# --fast_dev_run: two iterations, one evaluation batch, nothing written.
fast_dir = os.path.join(work, "fast")
code, out, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--", args.program, "--config",
                    config, "--set", "train.dist.pipeline_parallel_size=1", "--set",
                    f"train.output_dir={fast_dir}", "--fast-dev-run"], timeout=120)
check("--fast-dev-run runs", code == 0, out)
expect("--fast-dev-run logs iterations 1 and 2", out, r"iteration 1/2 loss [^\n]*\n(.*\n)*.*iteration 2/2 loss")
expect("--fast-dev-run evaluates", out, r"evaluation at iteration 2: loss [0-9.]+ perplexity")
check("--fast-dev-run writes no output directory", not os.path.exists(fast_dir), str(os.listdir(work)))

# Bad input: named before the first iteration, on a 4-rank launch.
bad_data = os.path.join(work, "bad")
os.makedirs(bad_data)
corpus = os.path.join(args.source, "data", "tiny_corpus", "tiny_corpus_text_document")
shutil.copy(corpus + ".bin", os.path.join(bad_data, "cut.bin"))
with open(corpus + ".idx", "rb") as f:
    idx = f.read()
with open(os.path.join(bad_data, "cut.idx"), "wb") as f:
    f.write(idx[: len(idx) // 2])
cases = {
    "unknown field": (["train.dist.tensor_paralel_size=2"],
                      r"unknown field 'tensor_paralel_size' in train\.dist; did you mean 'tensor_parallel_size'"),
    "inconsistent batch sizes": (["train.num_accumulation_steps=3"],
                                 r"train\.global_batch_size is 16 but micro_batch_size x data_parallel_size x "
                                 r"num_accumulation_steps = 4 x 1 x 3 = 12"),
    "dist sizes that do not divide the world": (["train.dist.tensor_parallel_size=3"],
                                                r"4 ranks cannot be split into tensor_parallel_size 3"),
    "dataset prefix missing": ([f"data.data_prefix={bad_data}/nothing"],
                               r"cannot open " + re.escape(bad_data) + r"/nothing\.idx"),
    "truncated .idx": ([f"data.data_prefix={bad_data}/cut"], r"cut\.idx.*truncated"),
    "vocabulary smaller than the data's ids": (["data.vocab_file=", "model.vocab_size=1024"],
                                               r"holds token id 2047 but model\.vocab_size is 1024"),
    "vocabulary smaller than the vocabulary file": (["model.vocab_size=1024"],
                                                    r"model\.vocab_size is 1024 but data\.vocab_file "
                                                    r".*vocab\.json holds 2048 tokens"),
    "a vocabulary file that is not there": (["data.vocab_file=/nonexistent/vocab.json"],
                                            r"vocabulary /nonexistent/vocab\.json is not a file"),
    "a blend beside data_prefix": (['data.blend=[{weight: 1 data_prefix: "x"}]'],
                                   r"data\.data_prefix and data\.blend are both set"),
    "a blend weight of 0": (['data.data_prefix=', 'data.blend=[{weight: 0 data_prefix: "x"}]'],
                            r"data\.blend\[0\]\.weight is 0"),
    "a timeline of an eager run": (["train.graph.enabled=false", "train.timeline_iterations=[3]"],
                                   r"train\.timeline_iterations is set but the step runs eagerly"),
    "a timeline past the end": (["train.timeline_iterations=[900]"],
                                r"train\.timeline_iterations holds 900; expected iterations 1 to train\.train_iter"),
}
check_bad_inputs(train, work, cases, 4)

# Flags: --help lists tessel-train's own and the runtime's (not the logging
# library's); another trainer's flag gets tessel-train's way to say it, a
# near miss the closest flag; both before any work, exit 2.
code, out, _ = run([args.program, "--help"], timeout=30)
check(f"--help: exit 0, {len(out.splitlines())} lines (at most 40), the program's flags first",
      code == 0 and len(out.splitlines()) <= 40 and "--config" in out and "--resume_step" in out and
      "--comm_timeout_s" in out and "logging.cc" not in out, out)
code, out, _ = run([args.program, "--tensor-model-parallel-size", "2", "--config", train.config], timeout=30)
check("Megatron's --tensor-model-parallel-size: exit 2", code == 2, out)
expect("Megatron's --tensor-model-parallel-size: the --set equivalent", out,
       r"--tensor-model-parallel-size is not a tessel-train flag .*here: --set train\.dist\.tensor_parallel_size=N")
code, out, _ = run([args.program, "--config", train.config, "--resum"], timeout=30)
expect("--resum: the closest flag", out, r"unknown flag --resum \(did you mean --resume\?\)")
check("--resum: exit 2", code == 2, out)
shutil.rmtree(work, ignore_errors=True)
finish()
