"""tessel's ViT (models/vit.h) equals Hugging Face's ViTForImageClassification
on the same weights: logits and loss within 1e-5 (f32) on one rank, under
tp2, under tp2 x pp2 and under dp2 x tp2; then every parameter's gradient
(the class token's too) within 1e-5 of its largest and 5 AdamW steps'
losses within 1e-4, Hugging Face in float64 (hf_training.py). vit_hf_dump writes the weights it drew, its inputs
and outputs as safetensors; this test installs transformers 4.40 (a version
that works with PyTorch 1.13) from PyPI into a temporary directory, maps
tessel's parameters onto Hugging Face's names and layouts, and runs Hugging
Face's model with its default ViT configuration (exact GELU, epsilon 1e-12,
query/key/value biases, no pooler)."""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, install_transformers, run_dump  # noqa: E402
from hf_training import compare_gradients, compare_steps, tessel_gradients  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--program", required=True)
args = parser.parse_args()

TOLERANCE = 1e-5

work = tempfile.TemporaryDirectory(prefix="tessel_hf_vit_")
install_transformers(work.name)
import torch  # noqa: E402
from transformers import ViTConfig, ViTForImageClassification  # noqa: E402


def hf_state(tensors, heads, layers, channels, patch):
    """tessel's parameters under Hugging Face's names and layouts."""
    p = {k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}
    hidden = p["cls_token"].shape[0]
    head_dim = hidden // heads
    # tessel's patch projection is a Linear [C*p*p, hidden] over patches
    # flattened as (channel, row, column); Hugging Face's is Conv2d
    # [hidden, C, p, p].
    conv = p["patch_embedding.proj.weight"].t().reshape(hidden, channels, patch, patch)
    state = {"vit.embeddings.cls_token": p["cls_token"].reshape(1, 1, hidden),
             "vit.embeddings.position_embeddings": p["position_embeddings"].unsqueeze(0),
             "vit.embeddings.patch_embeddings.projection.weight": conv,
             "vit.embeddings.patch_embeddings.projection.bias": p["patch_embedding.proj.bias"],
             "vit.layernorm.weight": p["ln_f.weight"], "vit.layernorm.bias": p["ln_f.bias"],
             # nn.Linear stores [out, in]; tessel's Linear [in, out].
             "classifier.weight": p["head.weight"].t(), "classifier.bias": p["head.bias"]}
    for i in range(layers):
        t, h = f"h{i}.", f"vit.encoder.layer.{i}."
        # tessel's fused QKV is head-major ([head][q|k|v][head_dim]).
        qkv_w = p[t + "attention.qkv.weight"].reshape(hidden, heads, 3, head_dim)
        qkv_b = p[t + "attention.qkv.bias"].reshape(heads, 3, head_dim)
        for j, name in enumerate(["query", "key", "value"]):
            state[h + f"attention.attention.{name}.weight"] = qkv_w[:, :, j, :].reshape(hidden, hidden).t()
            state[h + f"attention.attention.{name}.bias"] = qkv_b[:, j, :].reshape(hidden)
        state.update({
            h + "layernorm_before.weight": p[t + "ln1.weight"], h + "layernorm_before.bias": p[t + "ln1.bias"],
            h + "attention.output.dense.weight": p[t + "attention.out.weight"].t(),
            h + "attention.output.dense.bias": p[t + "attention.out.bias"],
            h + "layernorm_after.weight": p[t + "ln2.weight"], h + "layernorm_after.bias": p[t + "ln2.bias"],
            h + "intermediate.dense.weight": p[t + "mlp.fc1.weight"].t(),
            h + "intermediate.dense.bias": p[t + "mlp.fc1.bias"],
            h + "output.dense.weight": p[t + "mlp.fc2.weight"].t(), h + "output.dense.bias": p[t + "mlp.fc2.bias"],
        })
    return state


def max_error(got, want):
    """Largest |got - want| relative to max(1, |want|)."""
    return ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()


# dp2 x tp2: dp is what is left of the 4 ranks (the batch of 3 splits 2 + 1).
layouts = {"1x1": (1, ["--tp=1"]), "tp2": (2, ["--tp=2"]), "tp2xpp2": (4, ["--tp=2", "--pp=2"]),
           "dp2xtp2": (4, ["--tp=2"])}
for name, (nproc, flags) in layouts.items():
    path = os.path.join(work.name, name + ".safetensors")
    meta, tensors = run_dump(args.launcher, args.program, nproc, flags, path, name)
    if tensors is None:
        continue
    heads, layers = int(meta["num_attention_heads"]), int(meta["hidden_layers"])
    channels, patch = int(meta["num_channels"]), int(meta["patch_size"])
    config = ViTConfig(hidden_size=int(meta["hidden_size"]), num_hidden_layers=layers, num_attention_heads=heads,
                       intermediate_size=4 * int(meta["hidden_size"]), image_size=int(meta["image_size"]),
                       patch_size=patch, num_channels=channels, num_labels=int(meta["num_classes"]))
    model = ViTForImageClassification(config).eval()
    missing, unexpected = model.load_state_dict(hf_state(tensors, heads, layers, channels, patch), strict=False)
    check(f"{name}: every Hugging Face parameter comes from tessel and every tessel one is used",
          not missing and not unexpected, f"missing {missing} unexpected {unexpected}")
    with torch.no_grad():
        hf = model(pixel_values=tensors["pixel_values"], labels=tensors["labels"])
    err = max_error(tensors["logits"], hf.logits)
    check(f"{name}: logits equal ViTForImageClassification's (max error {err:.2e})", err <= TOLERANCE)
    err = abs(tensors["loss"].item() - hf.loss.item())
    check(f"{name}: loss {tensors['loss'].item():.6f} equals ViTForImageClassification's {hf.loss.item():.6f} "
          f"(error {err:.2e})", err <= TOLERANCE)

    # Training: every gradient (the class token's among them) and 5 AdamW steps, in float64.
    model.double()
    pixels, labels = tensors["pixel_values"].double(), tensors["labels"]
    loss_fn = lambda: model(pixel_values=pixels, labels=labels).loss  # noqa: E731
    compare_gradients(name, model, loss_fn, hf_state(tessel_gradients(tensors), heads, layers, channels, patch))
    # tessel's class token is 1-D (no weight decay); Hugging Face's [1, 1, hidden].
    compare_steps(name, model, loss_fn, tensors, no_decay=("cls_token",))

work.cleanup()
finish()
