"""Dropout under tessel-train, eagerly and in graph mode. With embedding,
attention and hidden dropout at 0.1, the captured step draws at every
iteration the masks eager code draws (each layer's counter is a variable
the graph advances), so graph mode gives eager's losses (1e-5 relative, 10
iterations) on one process and under tp2, pp2 (1F1B), tp2 x pp2 with
gradient accumulation, Megatron sequence parallelism and activation
checkpointing; the masks are keyed by logical position, so those layouts
give one process's losses too; dp2 (which cuts the batch into other
micro-batches) gives eager dp2's. The losses differ from a run without dropout
(dropout is on), and a graph-mode run saved at iteration 5 and resumed
prints the uninterrupted losses exactly. BERT (padding mask, the score
matrix's dropout) gives eager's losses in graph mode too."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish  # noqa: E402
from train_checks import LOSS, Trainer, layout_sets, train_args  # noqa: E402

args = train_args()
work = tempfile.mkdtemp(prefix="tessel_dropout_")
ITERS = 10
DROPOUT = ["model.hidden_dropout_prob=0.1", "model.attention_dropout_prob=0.1", "model.embedding_dropout_prob=0.1"]
COMMON = [f"train.train_iter={ITERS}", "train.log_period=1", "evaluation.enabled=false", "scheduler.warmup_iter=2"]


def train(trainer, name, nproc, tp, pp, graph, extra=()):
    out_dir = os.path.join(work, name.replace(" ", "_").replace(",", ""))
    code, out, secs = trainer(nproc, COMMON + layout_sets(tp, pp, graph) + list(extra) +
                              [f"train.output_dir={out_dir}", f"train.checkpoint_dir={out_dir}/checkpoints"])
    values = {int(i): float(v) for i, v in LOSS.findall(out)}
    check(f"{name}: ran ({secs:.1f} s)", code == 0 and len(values) >= 1, out[-3000:])
    return values


def close(a, b):
    """Worst relative difference of two {iteration: loss} maps over the same iterations."""
    if not a or a.keys() != b.keys():
        return float("inf")
    return max(abs(a[i] - b[i]) / abs(b[i]) for i in a)


gpt = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "gpt2_tiny.prototxt"))
RUNS = {  # name: (ranks, tp, pp, graph, extra)
    "eager 1x1x1": (1, 1, 1, False, []),
    "graph 1x1x1": (1, 1, 1, True, []),
    "graph tp2": (2, 2, 1, True, []),
    "graph pp2 1F1B": (2, 1, 2, True, []),
    "graph tp2 x pp2": (4, 2, 2, True, []),
    "eager tp2 x pp2": (4, 2, 2, False, []),
    "graph tp2 sequence parallel": (2, 2, 1, True, ["train.dist.sequence_parallel=true"]),
    "graph activation checkpointing": (1, 1, 1, True, ["train.activation_checkpoint=true"]),
}
losses = {name: train(gpt, name, n, tp, pp, g, DROPOUT + extra) for name, (n, tp, pp, g, extra) in RUNS.items()}
ref = losses["eager 1x1x1"]
check(f"eager 1x1x1: {ITERS} losses", len(ref) == ITERS, str(ref))
for name, values in losses.items():
    if name != "eager 1x1x1":
        worst = close(values, ref)
        check(f"{name}: the losses of eager 1x1x1 within 1e-5 (worst {worst:.2e})", worst <= 1e-5,
              f"{values} vs {ref}")
# Data parallelism cuts the global batch into other micro-batches, so a
# sample sits at another logical position and draws another mask: dp2 is
# compared with eager dp2.
dp2 = {g: train(gpt, f"{'graph' if g else 'eager'} dp2", 2, 1, 1, g, DROPOUT) for g in (False, True)}
worst = close(dp2[True], dp2[False])
check(f"graph dp2: the losses of eager dp2 within 1e-5 (worst {worst:.2e})", worst <= 1e-5,
      f"{dp2[True]} vs {dp2[False]}")
plain = train(gpt, "graph 1x1x1 without dropout", 1, 1, 1, True)
check("without dropout the losses differ (dropout was on)", close(plain, ref) > 1e-3, f"{plain} vs {ref}")

# Resuming in graph mode: the checkpoint holds each counter (read from the
# stage that holds it), so iterations 6 to 10 draw the uninterrupted masks.
half = train(gpt, "graph tp2 x pp2 resumable", 4, 2, 2, True,
             DROPOUT + ["train.train_iter=5", "train.save_period=5", "scheduler.name=constant",
                        "scheduler.warmup_iter=0"])
constant_full = train(gpt, "graph tp2 x pp2 constant lr", 4, 2, 2, True,
                      DROPOUT + ["scheduler.name=constant", "scheduler.warmup_iter=0"])
out_dir = os.path.join(work, "graph_tp2_x_pp2_resumable")
code, out, secs = gpt(4, COMMON + layout_sets(2, 2, True) + DROPOUT +
                      ["scheduler.name=constant", "scheduler.warmup_iter=0", f"train.output_dir={out_dir}",
                       f"train.checkpoint_dir={out_dir}/checkpoints"], extra=["--resume"])
resumed = {int(i): float(v) for i, v in LOSS.findall(out)}
check(f"graph tp2 x pp2: resumed at iteration 5 ({secs:.1f} s)", code == 0 and sorted(resumed) == list(range(6, 11)),
      out[-3000:])
check("graph tp2 x pp2: the resumed iterations print the uninterrupted losses exactly",
      resumed == {i: constant_full[i] for i in range(6, 11)} and len(half) == 5, f"{resumed} vs {constant_full}")

bert = Trainer(args.launcher, args.program, os.path.join(args.source, "configs", "bert_tiny.prototxt"))
bert_eager = train(bert, "bert eager", 1, 1, 1, False, DROPOUT)
bert_graph = train(bert, "bert graph", 1, 1, 1, True, DROPOUT)
worst = close(bert_graph, bert_eager)
check(f"bert graph: the losses of eager within 1e-5 (worst {worst:.2e})", worst <= 1e-5,
      f"{bert_graph} vs {bert_eager}")
finish()
