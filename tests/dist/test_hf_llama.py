"""tessel's Llama (models/llama.h) equals Hugging Face's LlamaForCausalLM on
the same weights: logits (plain, and with per-row position ids and a
padding attention mask) and the language-model loss within 1e-5 (f32), with
grouped-query attention (8 query heads on 2 or 4 key/value heads) on one
rank, tp2, tp4, tp2 x pp2 and dp2 x tp2 (a vocabulary of 1,100 padded to a
multiple of 128 x tp, the padded logits masked out), and with the output
projection tied to the embedding across two pipeline stages; for training,
every parameter's gradient within 1e-5 of its largest and 5 AdamW steps'
losses within 1e-4, Hugging Face in float64 (hf_training.py).
llama_hf_dump writes the weights it drew and its outputs as safetensors;
this test installs transformers 4.40 from PyPI into a temporary directory
and maps tessel's parameters onto Hugging Face's names (Linear weights
transposed: tessel stores them [in, out]; q, k and v fused by key/value
group, gate and up interleaved; the output projection is [vocab, hidden]
in both)."""
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

work = tempfile.TemporaryDirectory(prefix="tessel_hf_llama_")
install_transformers(work.name)
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402


def hf_state(tensors, layers, vocab, tied, heads, kv_heads):
    """tessel's parameters under Hugging Face's names and layouts: the fused
    q|k|v projection is [hidden][key/value group][its query heads | k | v]
    [head_dim], gate|up is [hidden][ffn][gate | up]; Linear weights [in, out]."""
    p = {k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}
    state = {"model.embed_tokens.weight": p["embed_tokens.weight"][:vocab], "model.norm.weight": p["norm.weight"]}
    if not tied:
        state["lm_head.weight"] = p["lm_head.weight"][:vocab]
    hidden = p["norm.weight"].shape[0]
    head_dim, group = hidden // heads, heads // kv_heads
    for i in range(layers):
        t, h = f"layers{i}.", f"model.layers.{i}."
        qkv = p[t + "self_attn.qkv_proj.weight"].reshape(hidden, kv_heads, group + 2, head_dim)
        state[h + "self_attn.q_proj.weight"] = qkv[:, :, :group].reshape(hidden, -1).t()
        state[h + "self_attn.k_proj.weight"] = qkv[:, :, group].reshape(hidden, -1).t()
        state[h + "self_attn.v_proj.weight"] = qkv[:, :, group + 1].reshape(hidden, -1).t()
        gate_up = p[t + "mlp.gate_up_proj.weight"].reshape(hidden, -1, 2)
        state[h + "mlp.gate_proj.weight"] = gate_up[..., 0].t()
        state[h + "mlp.up_proj.weight"] = gate_up[..., 1].t()
        for proj in ("self_attn.o_proj", "mlp.down_proj"):
            state[h + proj + ".weight"] = p[t + proj + ".weight"].t()
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[h + norm + ".weight"] = p[t + norm + ".weight"]
    return state


def max_error(got, want):
    """Largest |got - want| relative to max(1, |want|)."""
    return ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()


# dp2 x tp2: dp is what is left of the 4 ranks (the batch of 3 splits 2 + 1).
layouts = {"1x1": (1, ["--tp=1"]), "tp2": (2, ["--tp=2"]), "tp4": (4, ["--tp=4", "--kv_heads=4"]),
           "tp2xpp2": (4, ["--tp=2", "--pp=2"]), "dp2xtp2": (4, ["--tp=2"]),
           "tied_pp2": (2, ["--pp=2", "--tie"])}
for name, (nproc, flags) in layouts.items():
    path = os.path.join(work.name, name + ".safetensors")
    meta, tensors = run_dump(args.launcher, args.program, nproc, flags, path, name)
    if tensors is None:
        continue
    vocab, padded = int(meta["vocab_size"]), int(meta["padded_vocab_size"])
    layers, tied = int(meta["hidden_layers"]), meta["tie_word_embeddings"] == "true"
    tp = 4 if "tp4" in name else 2 if "tp2" in name else 1
    check(f"{name}: vocabulary {vocab} padded to a multiple of 128 x tp ({padded})",
          padded % (128 * tp) == 0 and vocab <= padded < vocab + 128 * tp and tensors["logits"].shape[-1] == padded)

    config = LlamaConfig(vocab_size=vocab, hidden_size=int(meta["hidden_size"]),
                         intermediate_size=int(meta["intermediate_size"]), num_hidden_layers=layers,
                         num_attention_heads=int(meta["num_attention_heads"]),
                         num_key_value_heads=int(meta["num_key_value_heads"]),
                         max_position_embeddings=4 * int(meta["max_seq_length"]),
                         rms_norm_eps=float(meta["rms_norm_eps"]), rope_theta=float(meta["rope_theta"]),
                         tie_word_embeddings=tied, attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    heads, kv_heads = int(meta["num_attention_heads"]), int(meta["num_key_value_heads"])
    missing, unexpected = model.load_state_dict(hf_state(tensors, layers, vocab, tied, heads, kv_heads),
                                                strict=False)
    check(f"{name}: every Hugging Face parameter comes from tessel",
          not unexpected and all(k == "lm_head.weight" and tied or k.endswith("rotary_emb.inv_freq")
                                 for k in missing), f"missing {missing} unexpected {unexpected}")
    if tied:
        model.tie_weights()
    ids = tensors["input_ids"]
    with torch.no_grad():
        hf = model(input_ids=ids, labels=ids)
        hf_masked = model(input_ids=ids, position_ids=tensors["position_ids"],
                          attention_mask=tensors["attention_mask"].long()).logits
    ours = tensors["logits"][..., :vocab]
    err = max_error(ours, hf.logits)
    check(f"{name}: logits equal LlamaForCausalLM's (max error {err:.2e})", err <= TOLERANCE)
    err = abs(tensors["loss"].item() - hf.loss.item())
    check(f"{name}: loss {tensors['loss'].item():.6f} equals LlamaForCausalLM's {hf.loss.item():.6f} "
          f"(error {err:.2e})", err <= TOLERANCE)
    err = max_error(tensors["masked_logits"][..., :vocab], hf_masked)
    check(f"{name}: logits with position ids and a padding mask equal LlamaForCausalLM's (max error {err:.2e})",
          err <= TOLERANCE)
    if padded > vocab:
        check(f"{name}: the {padded - vocab} padded logits are masked out",
              bool((tensors["logits"][..., vocab:] <= -1e29).all()))

    # Training: every gradient and 5 AdamW steps, in float64.
    model.double()
    loss_fn = lambda: model(input_ids=ids, labels=ids).loss  # noqa: E731
    compare_gradients(name, model, loss_fn,
                      hf_state(tessel_gradients(tensors), layers, vocab, tied, heads, kv_heads))
    compare_steps(name, model, loss_fn, tensors)

work.cleanup()
finish()
