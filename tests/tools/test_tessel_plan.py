"""tessel-plan --config answers "will it fit" for GPT-3 175B on 1,024
devices (configs/gpt3_175b.prototxt: tp8 x pp16 x dp8, 16 micro-batches of
one 2,048-token sequence, 1F1B).

The reference is Korthikanti et al. (2022), "Reducing Activation
Recomputation in Large Transformer Models", section 4: a transformer
layer under tensor parallelism t (no sequence parallelism) keeps
sbh(10 + 24/t + 5as/(ht)) bytes of activations per micro-batch in 16-bit
training, and the first stage of a 1F1B pipeline keeps p micro-batches of
its L/p layers. Those bytes are 2-byte values (LayerNorm inputs and
outputs, Q, K, V, the projections' and MLP's inputs, GeLU's input and
output, the softmax and its dropout) and 1-byte dropout masks (2sbh +
as^2b/t). tessel keeps no masks: backward draws them again from the
Philox counter. So the reference for tessel is the formula without the
mask bytes, with 4-byte values in f32 and 2-byte ones in bf16; the
formula as published is printed beside it.

Also: the plan says the job does not fit 80 GiB devices in f32 without
recomputation, and that it fits with every layer recomputed (the
config's default); bad inputs are refused with a message naming them.
Llama 3 8B (configs/llama3_8b.prototxt) plans with Megatron's per-layer
sequence-parallel communication and fits 80 GiB."""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "dist"))
from harness import check, expect, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--plan", required=True)
parser.add_argument("--source", required=True)
args = parser.parse_args()
config = os.path.join(args.source, "configs", "gpt3_175b.prototxt")

GIB = 2.0**30
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(-|\d+)\s+([\d.]+) (\w+)\s+([\d.]+) (\w+)\s+([\d.]+) (\w+)\s+([\d.]+) (\w+)",
                 re.M)


def plan(*extra):
    code, out, seconds = run([args.plan, "--config", config, "--device_memory", "80GiB", *extra], timeout=300)
    check(f"tessel-plan {' '.join(extra)} exits 0 ({seconds:.1f} s)", code == 0, out[-3000:])
    stages = {}
    for m in ROW.finditer(out):
        value = lambda i: float(m.group(i)) * UNITS[m.group(i + 1)]  # noqa: E731
        stages[int(m.group(1))] = {"in_flight": m.group(3), "variables": value(4), "activations": value(6),
                                   "op_results": value(8), "total": value(10)}
    check(f"tessel-plan {' '.join(extra)} lists 16 stages", sorted(stages) == list(range(16)), out[-3000:])
    return out, stages


# GPT-3 175B as the config lays it out.
s, b, h, a, t, p, layers = 2048, 1, 12288, 96, 8, 16, 96
layers_per_stage = layers // p
sbh, as2b = s * b * h, a * s * s * b
values_16bit = sbh * (8 + 24 / t) + 4 * as2b / t  # per layer and micro-batch, bytes
masks = 2 * sbh + as2b / t
published = sbh * (10 + 24 / t + 5 * a * s / (h * t))
assert abs(values_16bit + masks - published) < 1  # the split adds up to the formula


def reference(element_bytes):
    """Stage 0 under 1F1B: p micro-batches in flight of its layers."""
    return values_16bit * element_bytes / 2 * layers_per_stage * p


for precision, element_bytes in (("f32", 4), ("bf16", 2)):
    out, stages = plan("--set", "train.activation_checkpoint=false", "--precision", precision)
    if 0 not in stages:
        continue
    first = stages[0]
    ref = reference(element_bytes)
    as_published = published * layers_per_stage * p * (element_bytes / 2 if precision == "f32" else 1)
    print(f"  {precision}: stage 0 keeps {first['activations'] / GIB:.2f} GiB of activations; Korthikanti "
          f"without masks {ref / GIB:.2f} GiB, as published ({'values doubled, ' if precision == 'f32' else ''}"
          f"with 1-byte masks) {as_published / GIB:.2f} GiB")
    check(f"{precision}: stage 0 holds p = 16 micro-batches under 1F1B", first["in_flight"] == "16", out)
    check(f"{precision}: stage 0 activations within 10% of the formula's ({first['activations'] / GIB:.2f} vs "
          f"{ref / GIB:.2f} GiB)", abs(first["activations"] - ref) <= 0.10 * ref, out)
    last = stages[15]
    check(f"{precision}: the last stage holds one micro-batch, about 1/16 of the first stage's layers' "
          "activations", last["in_flight"] == "1" and last["activations"] < first["activations"] / 8, out)
    if precision == "f32":
        expect("f32 without recomputation: does not fit 80 GiB", out, r"does not fit 80\.00 GiB per device: stages 0")
        check("f32: stage 0's total is over 80 GiB", first["total"] > 80 * GIB, out)

out, stages = plan("--precision", "f32")
expect("f32 with every layer recomputed (the config's default): fits 80 GiB", out, r"fits 80\.00 GiB per device")
if 0 in stages:
    # Recomputation keeps each layer's input per micro-batch (sbh values)
    # and one layer's activations while it is recomputed.
    kept = sbh * 4 * layers_per_stage * p
    check(f"recomputation keeps about one input per layer and micro-batch ({stages[0]['activations'] / GIB:.2f} "
          f"GiB vs {kept / GIB:.2f} GiB plus one layer)",
          kept <= stages[0]["activations"] <= kept + 2 * values_16bit * 2, out)

# Llama 3 8B on a node of 8 (configs/llama3_8b.prototxt: tp8 with sequence
# parallelism, bf16, 32 micro-batches of one 8,192-token sequence): per
# layer and micro-batch, Megatron-LM's two all-gathers and two
# reduce-scatters of the s*b*h hidden states forward, and backward the same
# plus the two all-gathers that recompute the gathered inputs; it fits.
llama = os.path.join(args.source, "configs", "llama3_8b.prototxt")
code, out, seconds = run([args.plan, "--config", llama, "--device_memory", "80GiB"], timeout=300)
check(f"tessel-plan plans Llama 3 8B ({seconds:.1f} s)",
      code == 0 and "Llama: 32 layers, hidden 4096, 32 heads on 8 key/value heads" in out, out[-3000:])
LAYER_ROW = re.compile(r"^\s+(\d+)\s+(forward|backward)\s+tp\s+(\S+)\s+(\d+)\s+(\d+)", re.M)
rows = {(int(m.group(1)), m.group(2), m.group(3)): (int(m.group(4)), int(m.group(5)))
        for m in LAYER_ROW.finditer(out)}
sbh_llama, micro = 8192 * 4096, 32
expected = {("forward", "all-gather"): 2, ("forward", "reduce-scatter"): 2, ("backward", "all-gather"): 4,
            ("backward", "reduce-scatter"): 2}
wrong = [(k, rows.get((layer, *k))) for layer in range(32) for k, n in expected.items()
         if rows.get((layer, *k)) != (n * micro, n * micro * sbh_llama)]
check("Llama 3 8B: every layer's tensor-parallel traffic is Megatron's with sequence parallelism",
      len({k[0] for k in rows}) == 32 and not wrong and all(k[1:] in expected for k in rows), str(wrong[:4]))
expect("Llama 3 8B: fits 80 GiB per device", out, r"fits 80\.00 GiB per device")

# Clumsy use gets a message naming the value.
for extra, pattern in ((["--tp", "4"], r"--tp with --config"),
                       (["--device_memory", "eighty"], r"memory size 'eighty'"),
                       (["--schedule", "1f2b"], r"'1f2b' is not registered"),
                       (["--set", "train.dist.tensor_parallel_size=7"], r"tensor_parallel_size"),
                       (["--precision", "fp8"], r"--precision=fp8; expected f32 or bf16")):
    code, out, _ = run([args.plan, "--config", config, *extra], timeout=120)
    check(f"tessel-plan {' '.join(extra)} is refused", code == 1 and re.search(pattern, out) is not None, out[-2000:])

finish()
