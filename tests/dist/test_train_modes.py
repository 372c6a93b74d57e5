"""Parallel modes under tessel-train: ZeRO (train.zero_optimization) and
sequence parallelism (train.dist.sequence_parallel). The tiny GPT and ViT
give the losses of one process (1e-5 relative, 10 iterations) with ZeRO
stages 1, 2 and 3 under dp4 (graph mode, 1F1B), stage 2 eagerly, ZeRO
beside tensor parallelism (dp2 x tp2, stage 3) and pipelines with gradient
accumulation (dp2 x pp2, stage 1); and with sequence parallelism under
tp2, dp2 x tp2, tp2 x pp2 and tp4 (eager; ViT's 17 tokens split unevenly);
for GPT also with all-to-all sequence parallelism under dp4, dp2 x tp2
(eager) and dp2 x pp2 with ZeRO 1, and context parallelism under dp4,
dp2 x tp2 (eager) and dp2 x pp2, BERT with these and all-to-all under dp4,
ViT (17 tokens split unevenly) under cp4, dp2 x tp2 and all-to-all dp4; and interleaved 1F1B with 2 model chunks
per stage under dp2 x pp2 (GPT and ViT); the GPT's gradients reduced in
bf16 (train.gradient_reducer) under dp4, in graph mode and eagerly with ZeRO
1, within 1e-3 of one process's losses. A bad stage, ZeRO with mixed
precision, interleaved 1F1B over a micro-batch count that is not a multiple
of the stages, all-to-all sequence parallelism or context parallelism
without data parallelism or for Llama, an unknown sequence parallel mode, an unregistered gradient
reducer and a reducer under ZeRO 2 are named before the first
iteration."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish  # noqa: E402
from train_checks import LOSS, Trainer, check_bad_inputs, layout_sets, train_args  # noqa: E402

args = train_args()
work = tempfile.mkdtemp(prefix="tessel_modes_")
ITERS = 10


def mode(stage):
    """ZeRO's stage, or "sp" for sequence parallelism."""
    if stage == "sp":
        return ["train.dist.sequence_parallel=true"]
    if stage == "a2a":
        return ["train.dist.sequence_parallel=true", "train.dist.sequence_parallel_mode=all_to_all"]
    if stage == "a2a zero1":
        return mode("a2a") + mode(1)
    if stage == "cp":
        return ["train.dist.sequence_parallel=true", "train.dist.sequence_parallel_mode=context"]
    if stage == "interleaved":
        return ["train.dist.virtual_pipeline_size=2", "train.graph.pipeline=interleaved_1f1b"]
    return [] if stage == 0 else ["train.zero_optimization.enabled=true", f"train.zero_optimization.stage={stage}"]


def compare(model, train, common, runs):
    """runs: name -> (ranks, tp, pp, graph, mode); the first is the reference."""
    losses = {}
    for name, (nproc, tp, pp, graph, stage) in runs.items():
        out_dir = os.path.join(work, f"{model}_{name}".replace(" ", "_"))
        code, out, secs = train(nproc, common + layout_sets(tp, pp, graph) + mode(stage) +
                                [f"train.output_dir={out_dir}"])
        losses[name] = [float(v) for _, v in LOSS.findall(out)]
        check(f"{model} {name}: {ITERS} iterations ({secs:.1f} s)", code == 0 and len(losses[name]) == ITERS,
              out[-3000:])
    ref_name = next(iter(runs))
    ref = losses[ref_name]
    for name, values in losses.items():
        if name == ref_name:
            continue
        worst = max((abs(a - b) / abs(b) for a, b in zip(values, ref)), default=float("inf"))
        check(f"{model} {name}: the losses of {ref_name} within 1e-5 (worst {worst:.2e})",
              len(values) == ITERS and worst <= 1e-5)
    return losses


RUNS = {"1x1x1": (1, 1, 1, True, 0), "dp4 stage 1": (4, 1, 1, True, 1), "dp4 stage 2": (4, 1, 1, True, 2),
        "dp4 stage 3": (4, 1, 1, True, 3), "dp4 stage 2 eager": (4, 1, 1, False, 2),
        "dp2 x tp2 stage 3": (4, 2, 1, True, 3), "dp2 x pp2 stage 1": (4, 1, 2, True, 1),
        "tp2 sequence parallel": (2, 2, 1, True, "sp"), "dp2 x tp2 sequence parallel": (4, 2, 1, True, "sp"),
        "tp2 x pp2 sequence parallel": (4, 2, 2, True, "sp"), "tp4 sequence parallel eager": (4, 4, 1, False, "sp"),
        "dp4 all-to-all sequence parallel": (4, 1, 1, True, "a2a"),
        "dp2 x tp2 all-to-all sequence parallel eager": (4, 2, 1, False, "a2a"),
        "dp2 x pp2 all-to-all sequence parallel, ZeRO 1": (4, 1, 2, True, "a2a zero1"),
        "dp4 context parallel": (4, 1, 1, True, "cp"), "dp2 x tp2 context parallel eager": (4, 2, 1, False, "cp"),
        "dp2 x pp2 context parallel": (4, 1, 2, True, "cp"),
        "dp2 x pp2 interleaved 1F1B, 2 chunks per stage": (4, 1, 2, True, "interleaved")}
COMMON = [f"train.train_iter={ITERS}", "train.log_period=1", "evaluation.enabled=false", "scheduler.warmup_iter=5"]
gpt = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "gpt2_tiny.prototxt"))
gpt_losses = compare("GPT", gpt, COMMON, RUNS)

# The gradients reduced in bf16 (train.gradient_reducer): each element within
# 2^-8 of its parts' magnitudes (layers/gradient_handler.h, checked
# elementwise by gradient_reducer_test); here the losses stay within 1e-3
# of one process's, in graph mode and eagerly with ZeRO 1 (a reduce-scatter
# in bf16), and are not the f32 reduction's bit for bit.
REDUCER = ['train.gradient_reducer={name: "bf16_all_reduce"}']
for name, (graph, zero) in {"graph mode": (True, 0), "eager, ZeRO 1": (False, 1)}.items():
    code, out, secs = gpt(4, COMMON + REDUCER + layout_sets(1, 1, graph) + mode(zero) +
                          [f"train.output_dir={os.path.join(work, 'bf16_reducer')}"])
    values = [float(v) for _, v in LOSS.findall(out)]
    ref = gpt_losses["1x1x1"]
    worst = max((abs(a - b) / abs(b) for a, b in zip(values, ref)), default=float("inf"))
    check(f"GPT dp4, gradients all-reduced in bf16, {name}: the losses of 1x1x1 within 1e-3 (worst {worst:.2e}, "
          f"{secs:.1f} s)", code == 0 and len(values) == ITERS and worst <= 1e-3, out[-3000:])
    check(f"GPT dp4, gradients all-reduced in bf16, {name}: the reducer is named in the log",
          'gradient reducer name: "bf16_all_reduce"' in out, out[-3000:])
    check(f"GPT dp4, gradients all-reduced in bf16, {name}: not the f32 reduction's losses bit for bit",
          values[1:] != ref[1:], str(values))
# BERT (a padding mask on the keys, a sentence label per row) under context
# parallelism and all-to-all sequence parallelism.
bert = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "bert_tiny.prototxt"))
compare("BERT", bert, COMMON,
        {k: RUNS[k] for k in ("1x1x1", "dp4 context parallel", "dp2 x tp2 context parallel eager",
                              "dp2 x pp2 context parallel", "dp4 all-to-all sequence parallel")})
vit = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "vit_tiny.prototxt"))
compare("ViT", vit, COMMON + ["train.micro_batch_size=8"],
        {k: RUNS[k] for k in ("1x1x1", "dp4 stage 1", "dp4 stage 2", "dp4 stage 3", "tp2 sequence parallel",
                              "tp2 x pp2 sequence parallel", "dp2 x pp2 interleaved 1F1B, 2 chunks per stage",
                              "dp4 context parallel", "dp2 x tp2 context parallel eager",
                              "dp4 all-to-all sequence parallel")})

check_bad_inputs(gpt, work, {
    "stage 4": (["train.zero_optimization.enabled=true", "train.zero_optimization.stage=4"],
                r"train\.zero_optimization\.stage is 4; expected 1 \(optimizer state\), 2 \(and gradients\) or 3"),
    "ZeRO with mixed precision": (["train.zero_optimization.enabled=true", "train.amp.enabled=true",
                                   "train.dist.device=cuda", "train.graph.enabled=false"],
                                  r"train\.zero_optimization with train\.amp is not supported yet"),
    "all-to-all sequence parallelism without data parallelism": (
        ["train.dist.sequence_parallel=true", "train.dist.sequence_parallel_mode=all_to_all",
         "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2"],
        r"sequence_parallel_mode all_to_all splits each sequence over the data-parallel ranks, but "
        r"data_parallel_size is 1"),
    "interleaved 1F1B over micro-batches not a multiple of the stages": (
        ["train.dist.pipeline_parallel_size=2", "train.dist.virtual_pipeline_size=2",
         "train.graph.pipeline=interleaved_1f1b", "train.global_batch_size=12"],
        r"train\.num_accumulation_steps is 3; interleaved_1f1b runs micro-batches in rounds of the 2 stages, so "
        r"expected a multiple of train\.dist\.pipeline_parallel_size"),
    "a gradient reducer not registered": (['train.gradient_reducer={name: "fp8"}'],
                                          r"gradient reducer 'fp8' is not registered"),
    "a gradient reducer under ZeRO 2": (['train.gradient_reducer={name: "bf16_all_reduce"}'] + mode(2),
                                        r"train\.gradient_reducer 'bf16_all_reduce' with "
                                        r"train\.zero_optimization\.stage 2: from stage 2 on, backward "
                                        r"reduce-scatters each gradient"),
    "a sequence parallel mode not known": (["train.dist.sequence_parallel_mode=ring"],
                                          r"train\.dist\.sequence_parallel_mode is 'ring'; expected one of "
                                          r"megatron, all_to_all, context"),
    "context parallelism without data parallelism": (
        ["train.dist.sequence_parallel=true", "train.dist.sequence_parallel_mode=context",
         "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2"],
        r"sequence_parallel_mode context splits each sequence over the data-parallel ranks, but "
        r"data_parallel_size is 1"),
}, 4, COMMON)
llama = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "llama_tiny.prototxt"))
check_bad_inputs(llama, work, {
    "all-to-all sequence parallelism of Llama": (
        ["train.dist.sequence_parallel=true", "train.dist.sequence_parallel_mode=all_to_all"],
        r"sequence_parallel_mode all_to_all is for model\.arch gpt2, bert and vit; this config trains 'llama'"),
    "context parallelism of Llama": (
        ["train.dist.sequence_parallel=true", "train.dist.sequence_parallel_mode=context"],
        r"sequence_parallel_mode context is for model\.arch gpt2, bert and vit; this config trains 'llama'"),
}, 4, COMMON)
finish()
