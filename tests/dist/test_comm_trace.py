"""The eager small GPT communicates what Megatron does and nothing more.

Per step (after the first), from train_gpt --comm_trace on every rank:
  tp2      on the tp group: per transformer layer 2 all-reduces of b*s*h
           forward and 2 backward, 1 for the vocab-parallel embedding, 3 [N]
           vectors for the vocab-parallel cross-entropy (max, sum of exp,
           label logit), 1 for the LM head's input gradient, 1 scalar for
           the gradient norm; nothing else.
  dp2      on the dp group: one all-reduce per parameter gradient (its full
           size) and two loss scalars (sum and count); nothing else.
  dp2xtp2  both, with the tp group's activations halved by dp and each
           gradient reduction the size of its tp shard.
Expected counts and bytes come from the model's shape, not from a recording.
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
args = parser.parse_args()

# models::GPTConfig defaults and train_gpt's batch.
LAYERS, HIDDEN, FFN, VOCAB, SEQ, BATCH = 2, 64, 256, 1000, 32, 8
F32 = 4


def padded_vocab(tp):
    """The table's rows: the vocabulary rounded up to a multiple of 128 x tp."""
    return -(-VOCAB // (128 * tp)) * 128 * tp


def param_shapes(tp):
    """(elements, split over tp) per parameter, as the layers lay them out."""
    shapes = [(padded_vocab(tp) * HIDDEN, True), (SEQ * HIDDEN, False)]  # wte (vocab-parallel), wpe
    for _ in range(LAYERS):
        shapes += [(HIDDEN, False), (HIDDEN, False)]  # ln1
        shapes += [(HIDDEN * 3 * HIDDEN, True), (3 * HIDDEN, True)]  # qkv: column-parallel
        shapes += [(HIDDEN * HIDDEN, True), (HIDDEN, False)]  # attention out: row-parallel
        shapes += [(HIDDEN, False), (HIDDEN, False)]  # ln2
        shapes += [(HIDDEN * FFN, True), (FFN, True)]  # fc1: column-parallel
        shapes += [(FFN * HIDDEN, True), (HIDDEN, False)]  # fc2: row-parallel
    shapes += [(HIDDEN, False), (HIDDEN, False)]  # ln_f
    return [n // tp if split else n for n, split in shapes]


def expected(dp, tp):
    """{(op, group): (calls, bytes)} for rank 0."""
    out = {}
    if tp > 1:
        rows = BATCH // dp * SEQ
        act = rows * HIDDEN * F32
        calls = 4 * LAYERS + 1 + 3 + 1 + 1
        out[("all_reduce", "0-1" if tp == 2 else "0-3")] = (calls, (4 * LAYERS + 2) * act + 3 * rows * F32 + F32)
    if dp > 1:
        grads = param_shapes(tp)
        group = "0-1" if tp == 1 else "0,2"
        out[("all_reduce", group)] = (len(grads) + 2, sum(grads) * F32 + 2 * F32)
    return out


layouts = {"tp2": (2, 1, 2), "dp2": (2, 2, 1), "dp2xtp2": (4, 2, 2)}
for name, (nproc, dp, tp) in layouts.items():
    code, out, secs = run([args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "120",
                           "--", args.program, f"--tp={tp}", "--steps=3", "--comm_trace"], timeout=150)
    check(f"{name}: training ran ({secs:.1f} s)", code == 0, out)
    # Rank 0's summary of step 2 (step 0 also builds caches; it is not asserted).
    m = re.search(r"\[rank 0\] step 2 comm of rank 0:\n((?:\[rank 0\]   .*\n)+)", out)
    check(f"{name}: step 2 has a communication trace", m is not None, out[-3000:])
    if m is None:
        continue
    seen = {}
    for line in m.group(1).splitlines():
        row = re.match(r"\[rank 0\]   (\w+) \[([0-9,-]+)\] x(\d+) (\d+) B", line)
        if row:
            seen[(row.group(1), row.group(2))] = (int(row.group(3)), int(row.group(4)))
    want = expected(dp, tp)
    print(f"{name}: traced {seen}")
    check(f"{name}: exactly the expected collectives {want}", seen == want, f"traced {seen}")
finish()
