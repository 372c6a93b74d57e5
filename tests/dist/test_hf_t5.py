"""tessel's T5 (models/t5.h) equals Hugging Face's T5ForConditionalGeneration
on the same weights: logits and loss, without and with an encoder padding
mask, within 1e-5 (f32), for T5 v1.1 (gated GELU, untied output) on one
rank, tp2, tp2 x pp2 (the encoder's two layers on one stage, the decoder's
on the other) and dp2 x tp2, and for the original T5 (ReLU, output tied to
the token table with its hidden^-1/2 scaling) on tp2 x pp2; relative-
position buckets of a 16-token encoder and a 12-token decoder under 8
buckets up to distance 20 reach the logarithmic ones. For training, every
parameter's gradient within 1e-5 of its largest and 5 AdamW steps' losses
within 1e-4, Hugging Face in float64 (hf_training.py). t5_hf_dump writes
the weights it drew and its outputs as safetensors; this test installs
transformers 4.40 from PyPI into a temporary directory and maps tessel's
parameters onto Hugging Face's (Linear weights transposed; q|k|v and k|v
fused head-major, wi_0|wi_1 interleaved in tessel)."""
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

work = tempfile.TemporaryDirectory(prefix="tessel_hf_t5_")
install_transformers(work.name)
import torch  # noqa: E402
from transformers import T5Config, T5ForConditionalGeneration  # noqa: E402


def hf_state(tensors, meta):
    """tessel's parameters under Hugging Face's names and layouts."""
    p = {k[len("param."):]: v for k, v in tensors.items() if k.startswith("param.")}
    vocab, heads, d_kv = int(meta["vocab_size"]), int(meta["num_heads"]), int(meta["d_kv"])
    hidden, gated = int(meta["d_model"]), meta["feed_forward_proj"] == "gated-gelu"
    state = {"shared.weight": p["shared.weight"][:vocab]}
    if "lm_head.weight" in p:
        state["lm_head.weight"] = p["lm_head.weight"][:vocab]

    def attention(t, h, cross):
        if cross:
            state[h + "q.weight"] = p[t + "q.weight"].t()
            kv = p[t + "kv.weight"].reshape(hidden, heads, 2, d_kv)
            parts = {"k": kv[:, :, 0], "v": kv[:, :, 1]}
        else:
            qkv = p[t + "qkv.weight"].reshape(hidden, heads, 3, d_kv)
            parts = {"q": qkv[:, :, 0], "k": qkv[:, :, 1], "v": qkv[:, :, 2]}
        for name, w in parts.items():
            state[h + name + ".weight"] = w.reshape(hidden, heads * d_kv).t()
        state[h + "o.weight"] = p[t + "o.weight"].t()
        if t + "relative_attention_bias" in p:
            state[h + "relative_attention_bias.weight"] = p[t + "relative_attention_bias"]

    def feed_forward(t, h):
        if gated:
            wi = p[t + "wi.weight"].reshape(hidden, -1, 2)
            state[h + "wi_0.weight"], state[h + "wi_1.weight"] = wi[..., 0].t(), wi[..., 1].t()
        else:
            state[h + "wi.weight"] = p[t + "wi.weight"].t()
        state[h + "wo.weight"] = p[t + "wo.weight"].t()

    for stack, layers in (("encoder", int(meta["num_layers"])), ("decoder", int(meta["num_decoder_layers"]))):
        for i in range(layers):
            t, h = f"{stack}{i}.", f"{stack}.block.{i}.layer."
            state[h + "0.layer_norm.weight"] = p[t + "self_norm.weight"]
            attention(t + "self_attention.", h + "0.SelfAttention.", False)
            ff = 1
            if stack == "decoder":
                state[h + "1.layer_norm.weight"] = p[t + "cross_norm.weight"]
                attention(t + "cross_attention.", h + "1.EncDecAttention.", True)
                ff = 2
            state[h + f"{ff}.layer_norm.weight"] = p[t + "ff_norm.weight"]
            feed_forward(t + "ff.", h + f"{ff}.DenseReluDense.")
        state[f"{stack}.final_layer_norm.weight"] = p[f"{stack}_norm.weight"]
    return state


def max_error(got, want):
    """Largest |got - want| relative to max(1, |want|)."""
    return ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()


# dp2 x tp2: dp is what is left of the 4 ranks (the batch of 3 splits 2 + 1).
layouts = {"1x1": (1, ["--tp=1"]), "tp2": (2, ["--tp=2"]), "tp2xpp2": (4, ["--tp=2", "--pp=2"]),
           "dp2xtp2": (4, ["--tp=2"]), "original tp2xpp2": (4, ["--tp=2", "--pp=2", "--tie", "--gated=false"])}
for name, (nproc, flags) in layouts.items():
    path = os.path.join(work.name, name.replace(" ", "_") + ".safetensors")
    meta, tensors = run_dump(args.launcher, args.program, nproc, flags, path, name)
    if tensors is None:
        continue
    vocab, tied = int(meta["vocab_size"]), meta["tie_word_embeddings"] == "true"
    config = T5Config(vocab_size=vocab, d_model=int(meta["d_model"]), d_kv=int(meta["d_kv"]), d_ff=int(meta["d_ff"]),
                      num_layers=int(meta["num_layers"]), num_decoder_layers=int(meta["num_decoder_layers"]),
                      num_heads=int(meta["num_heads"]),
                      relative_attention_num_buckets=int(meta["relative_attention_num_buckets"]),
                      relative_attention_max_distance=int(meta["relative_attention_max_distance"]),
                      dropout_rate=0.0, layer_norm_epsilon=1e-6, feed_forward_proj=meta["feed_forward_proj"],
                      tie_word_embeddings=tied, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).eval()
    missing, unexpected = model.load_state_dict(hf_state(tensors, meta), strict=False)
    # The stacks' embed_tokens are the shared table (and a tied lm_head too).
    check(f"{name}: every Hugging Face parameter comes from tessel",
          not unexpected and all(k.endswith("embed_tokens.weight") or (tied and k == "lm_head.weight")
                                 for k in missing), f"missing {missing} unexpected {unexpected}")
    ids, dec, labels = tensors["input_ids"], tensors["decoder_input_ids"], tensors["labels"]
    mask = tensors["attention_mask"].long()
    with torch.no_grad():
        plain = model(input_ids=ids, decoder_input_ids=dec, labels=labels)
        masked = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, labels=labels)
    for label, ours, theirs in (("logits", tensors["logits"][..., :vocab], plain.logits),
                                ("loss", tensors["loss"].reshape(1), plain.loss.reshape(1)),
                                ("logits with an encoder padding mask", tensors["masked_logits"][..., :vocab],
                                 masked.logits),
                                ("loss with the mask", tensors["masked_loss"].reshape(1), masked.loss.reshape(1))):
        err = max_error(ours, theirs)
        check(f"{name}: {label} equal T5ForConditionalGeneration's (max error {err:.2e})", err <= TOLERANCE)

    model.double()
    loss_fn = lambda: model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, labels=labels).loss  # noqa
    compare_gradients(name, model, loss_fn, hf_state(tessel_gradients(tensors), meta))
    compare_steps(name, model, loss_fn, tensors)

work.cleanup()
finish()
