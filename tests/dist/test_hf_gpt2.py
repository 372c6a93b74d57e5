"""tessel's GPT-2 (models/gpt.h) equals Hugging Face's GPT2LMHeadModel on the
same weights: logits (plain, and with position ids and a padding attention
mask) and the language-model loss within 1e-5 (f32), on one rank, under tp2
with a vocabulary of 1,100 padded to 1,280 (the padded logits masked out)
under tp2 x pp2 and dp2 x tp2; for training, every parameter's gradient
within 1e-5 of its largest and 5 AdamW steps' losses within 1e-4, Hugging
Face in float64 (hf_training.py). gpt2_hf_dump writes the weights it drew and its outputs
as safetensors; this test installs transformers 4.40 (a version that works
with PyTorch 1.13) from PyPI into a temporary directory, loads the file with
the `safetensors` package, maps tessel's parameters onto Hugging Face's
names and layouts, and runs Hugging Face's model with its default GPT-2
configuration (tanh GELU, epsilon 1e-5, labels shifted inside)."""
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

work = tempfile.TemporaryDirectory(prefix="tessel_hf_gpt2_")
install_transformers(work.name)
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402


def hf_state(tensors, heads, layers, vocab):
    """tessel's parameters under Hugging Face's names and layouts."""
    p = {k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}
    hidden = p["wte.weight"].shape[1]
    head_dim = hidden // heads
    state = {"transformer.wte.weight": p["wte.weight"][:vocab], "transformer.wpe.weight": p["wpe.weight"],
             "transformer.ln_f.weight": p["ln_f.weight"], "transformer.ln_f.bias": p["ln_f.bias"]}
    for i in range(layers):
        t, h = f"h{i}.", f"transformer.h.{i}."
        # tessel's fused QKV is head-major ([head][q|k|v][head_dim]) so a
        # column split keeps heads whole; Hugging Face's is [q|k|v][head][head_dim].
        qkv_w = p[t + "attention.qkv.weight"].reshape(hidden, heads, 3, head_dim).permute(0, 2, 1, 3)
        qkv_b = p[t + "attention.qkv.bias"].reshape(heads, 3, head_dim).permute(1, 0, 2)
        state.update({
            h + "ln_1.weight": p[t + "ln1.weight"], h + "ln_1.bias": p[t + "ln1.bias"],
            h + "attn.c_attn.weight": qkv_w.reshape(hidden, 3 * hidden), h + "attn.c_attn.bias": qkv_b.reshape(-1),
            # Both store Linear weights as [in, out] (Hugging Face's Conv1D).
            h + "attn.c_proj.weight": p[t + "attention.out.weight"], h + "attn.c_proj.bias": p[t + "attention.out.bias"],
            h + "ln_2.weight": p[t + "ln2.weight"], h + "ln_2.bias": p[t + "ln2.bias"],
            h + "mlp.c_fc.weight": p[t + "mlp.fc1.weight"], h + "mlp.c_fc.bias": p[t + "mlp.fc1.bias"],
            h + "mlp.c_proj.weight": p[t + "mlp.fc2.weight"], h + "mlp.c_proj.bias": p[t + "mlp.fc2.bias"],
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
    vocab, padded = int(meta["vocab_size"]), int(meta["padded_vocab_size"])
    heads, layers = int(meta["num_attention_heads"]), int(meta["hidden_layers"])
    check(f"{name}: vocabulary {vocab} padded to a multiple of 128 x tp ({padded})",
          padded % (128 * (2 if "tp2" in name else 1)) == 0 and vocab <= padded < vocab + 256
          and tensors["logits"].shape[-1] == padded)

    config = GPT2Config(vocab_size=vocab, n_positions=int(meta["max_seq_length"]),
                        n_embd=int(meta["hidden_size"]), n_layer=layers, n_head=heads)
    model = GPT2LMHeadModel(config).eval()
    missing, unexpected = model.load_state_dict(hf_state(tensors, heads, layers, vocab), strict=False)
    # Left out on purpose: the tied LM head and the causal-mask buffers.
    check(f"{name}: every Hugging Face parameter comes from tessel",
          not unexpected and all(k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias"))
                                 for k in missing), f"missing {missing} unexpected {unexpected}")
    ids = tensors["input_ids"]
    with torch.no_grad():
        hf = model(input_ids=ids, labels=ids)
        hf_masked = model(input_ids=ids, position_ids=tensors["position_ids"],
                          attention_mask=tensors["attention_mask"].long()).logits
    ours = tensors["logits"][..., :vocab]
    err = max_error(ours, hf.logits)
    check(f"{name}: logits equal GPT2LMHeadModel's (max error {err:.2e})", err <= TOLERANCE)
    err = abs(tensors["loss"].item() - hf.loss.item())
    check(f"{name}: loss {tensors['loss'].item():.6f} equals GPT2LMHeadModel's {hf.loss.item():.6f} "
          f"(error {err:.2e})", err <= TOLERANCE)
    err = max_error(tensors["masked_logits"][..., :vocab], hf_masked)
    check(f"{name}: logits with position ids and a padding mask equal GPT2LMHeadModel's (max error {err:.2e})",
          err <= TOLERANCE)
    if padded > vocab:
        check(f"{name}: the {padded - vocab} padded logits are masked out",
              bool((tensors["logits"][..., vocab:] <= -1e29).all()))

    # Training: every gradient and 5 AdamW steps, in float64.
    model.double()
    loss_fn = lambda: model(input_ids=ids, labels=ids).loss  # noqa: E731
    compare_gradients(name, model, loss_fn, hf_state(tessel_gradients(tensors), heads, layers, vocab))
    compare_steps(name, model, loss_fn, tensors)

work.cleanup()
finish()
