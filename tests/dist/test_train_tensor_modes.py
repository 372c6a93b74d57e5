"""The multi-axis tensor-parallel modes under tessel-train
(train.dist.tensor_parallel_mode): the tiny GPT and ViT give the losses of
one process (1e-5 relative) under 2d (tp 4 = 2 x 2, graph mode and eager,
beside data parallelism with ZeRO 1, and beside a pipeline), 2.5d (tp 8 =
depth 2 x 2 x 2) and 3d (tp 8 = 2 x 2 x 2). Runs of 4 ranks take 10
iterations, runs of 8 ranks 6 (2 cores run them). Sizes that do not form a
mode's mesh, a missing or non-dividing depth, an unregistered mode and
Megatron's sequence parallelism under a multi-axis mode are named before
the first iteration."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish  # noqa: E402
from train_checks import LOSS, Trainer, check_bad_inputs, layout_sets, train_args  # noqa: E402

args = train_args()
work = tempfile.mkdtemp(prefix="tessel_tensor_modes_")
ITERS = 10
ITERS_8 = 6  # 8 ranks on 2 cores


def mode(name, depth=None):
    sets = [f"train.dist.tensor_parallel_mode={name}"]
    if depth is not None:
        sets.append(f'train.dist.tensor_parallel_mode_options={{key: "depth" value: "{depth}"}}')
    return sets


def compare(model, train, common, runs):
    """runs: name -> (ranks, tp, pp, graph, extra sets); the first, on one
    rank, is the reference, run for each length the others take."""
    losses = {}
    for name, (nproc, tp, pp, graph, extra) in runs.items():
        reference = not losses
        for iters in sorted({ITERS if n <= 4 else ITERS_8 for n, *_ in runs.values()}) if reference else \
                [ITERS if nproc <= 4 else ITERS_8]:
            out_dir = os.path.join(work, f"{model}_{name}_{iters}".replace(" ", "_"))
            code, out, secs = train(nproc, common + layout_sets(tp, pp, graph) + extra +
                                    [f"train.train_iter={iters}", f"train.output_dir={out_dir}"], timeout=300)
            losses[(name, iters)] = [float(v) for _, v in LOSS.findall(out)]
            check(f"{model} {name}: {iters} iterations ({secs:.1f} s)",
                  code == 0 and len(losses[(name, iters)]) == iters, out[-3000:])
    ref_name = next(iter(runs))
    for (name, iters), values in losses.items():
        if name == ref_name:
            continue
        ref = losses[(ref_name, iters)]
        worst = max((abs(a - b) / abs(b) for a, b in zip(values, ref)), default=float("inf"))
        check(f"{model} {name}: the losses of {ref_name} within 1e-5 ({iters} steps, worst {worst:.2e})",
              len(values) == iters and worst <= 1e-5)


COMMON = ["train.log_period=1", "evaluation.enabled=false", "scheduler.warmup_iter=5"]
GPT_RUNS = {
    "1x1x1": (1, 1, 1, True, []),
    "2d tp4": (4, 4, 1, True, mode("2d")),
    "2d tp4 eager": (4, 4, 1, False, mode("2d")),
    "dp2 x 2d tp4, ZeRO 1": (8, 4, 1, True, mode("2d") + ["train.zero_optimization.enabled=true",
                                                         "train.zero_optimization.stage=1"]),
    "2d tp4 x pp2": (8, 4, 2, True, mode("2d")),
    "2.5d tp8 (depth 2)": (8, 8, 1, True, mode("2.5d", 2)),
    "3d tp8": (8, 8, 1, True, mode("3d")),
}
gpt = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "gpt2_tiny.prototxt"))
compare("GPT", gpt, COMMON, GPT_RUNS)
vit = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "vit_tiny.prototxt"))
compare("ViT", vit, COMMON + ["train.micro_batch_size=8"],
        {k: GPT_RUNS[k] for k in ("1x1x1", "2d tp4", "2.5d tp8 (depth 2)", "3d tp8")})

check_bad_inputs(gpt, work, {
    "2d with tp 2": (mode("2d") + ["train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=1"],
                     r"tensor_parallel_mode '2d' needs tensor_parallel_size = q x q with q >= 2 \(4, 9, 16, "
                     r"\.\.\.\); got 2"),
    "2.5d without a depth": (mode("2.5d") + ["train.dist.tensor_parallel_size=4",
                                             "train.dist.pipeline_parallel_size=1"],
                             r"tensor_parallel_mode '2\.5d' needs the option depth"),
    "2.5d with a depth that does not divide tp": (
        mode("2.5d", 3) + ["train.dist.tensor_parallel_size=4", "train.dist.pipeline_parallel_size=1"],
        r"tensor_parallel_mode '2\.5d': depth 3 does not divide tensor_parallel_size 4"),
    "3d with tp 4": (mode("3d") + ["train.dist.tensor_parallel_size=4", "train.dist.pipeline_parallel_size=1"],
                     r"tensor_parallel_mode '3d' needs tensor_parallel_size = q x q x q"),
    "a mode not registered": (mode("4d") + ["train.dist.tensor_parallel_size=4",
                                            "train.dist.pipeline_parallel_size=1"],
                              r"tensor_parallel_mode '4d' is not registered; registered: 1d, 2\.5d, 2d, 3d"),
    "Megatron's sequence parallelism under 2d": (
        mode("2d") + ["train.dist.tensor_parallel_size=4", "train.dist.pipeline_parallel_size=1",
                      "train.dist.sequence_parallel=true"],
        r"sequence_parallel \(Megatron's\) works with tensor_parallel_mode '1d'"),
}, 4, COMMON)
finish()
