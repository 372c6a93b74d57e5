"""tessel's BERT (models/bert.h) equals Hugging Face's BertForPreTraining on
the same weights: masked-LM and sentence logits (on the ids alone, and with
token types and a padding mask) and the pre-training loss (also in the weighted form tessel-train uses) within 1e-5
(f32), on one rank, under tp2 (a vocabulary of 1,100 padded to 1,280, the
padded logits masked out) and under tp2 x pp2. bert_hf_dump writes the
weights it drew, the inputs and its outputs as safetensors; this test
installs transformers 4.40 (a version that works with PyTorch 1.13) from
PyPI into a temporary directory, maps tessel's parameters onto Hugging
Face's names and layouts and runs Hugging Face's model with its default
BERT configuration (exact GELU, epsilon 1e-12, two token types). The
sequence classifier (num_labels 3) likewise equals
BertForSequenceClassification: logits and loss. Under dp2 x tp2 too; and
for training, every parameter's gradient within 1e-5 of its largest (inputs
with [PAD] tokens, whose embedding row takes no gradient from lookups, as
Hugging Face's padding_idx) and 5 AdamW steps' losses within 1e-4, Hugging
Face in float64 (hf_training.py)."""
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

work = tempfile.TemporaryDirectory(prefix="tessel_hf_bert_")
install_transformers(work.name)
import torch  # noqa: E402
from transformers import BertConfig, BertForPreTraining, BertForSequenceClassification  # noqa: E402


def hf_state(tensors, heads, layers, vocab, prefix="param."):
    """tessel's parameters under Hugging Face's names and layouts: those of
    BertForPreTraining, or with prefix "cls_param." BertForSequenceClassification's."""
    p = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    hidden = p["word_embeddings.weight"].shape[1]
    head_dim = hidden // heads
    e = "bert.embeddings."
    # nn.Linear stores [out, in]; tessel's Linear [in, out].
    state = {e + "word_embeddings.weight": p["word_embeddings.weight"][:vocab],
             e + "position_embeddings.weight": p["position_embeddings.weight"],
             e + "token_type_embeddings.weight": p["token_type_embeddings.weight"],
             e + "LayerNorm.weight": p["embedding_ln.weight"], e + "LayerNorm.bias": p["embedding_ln.bias"],
             "bert.pooler.dense.weight": p["pooler.weight"].t(), "bert.pooler.dense.bias": p["pooler.bias"]}
    if "classifier.weight" in p:
        state.update({"classifier.weight": p["classifier.weight"].t(), "classifier.bias": p["classifier.bias"]})
    else:
        state.update({
            "cls.predictions.transform.dense.weight": p["mlm_transform.weight"].t(),
            "cls.predictions.transform.dense.bias": p["mlm_transform.bias"],
            "cls.predictions.transform.LayerNorm.weight": p["mlm_ln.weight"],
            "cls.predictions.transform.LayerNorm.bias": p["mlm_ln.bias"],
            "cls.predictions.bias": p["mlm_bias"][:vocab], "cls.predictions.decoder.bias": p["mlm_bias"][:vocab],
            "cls.seq_relationship.weight": p["sentence_head.weight"].t(),
            "cls.seq_relationship.bias": p["sentence_head.bias"]})
    for i in range(layers):
        t, h = f"h{i}.", f"bert.encoder.layer.{i}."
        # tessel's fused QKV is head-major ([head][q|k|v][head_dim]).
        qkv_w = p[t + "attention.qkv.weight"].reshape(hidden, heads, 3, head_dim)
        qkv_b = p[t + "attention.qkv.bias"].reshape(heads, 3, head_dim)
        for j, name in enumerate(["query", "key", "value"]):
            state[h + f"attention.self.{name}.weight"] = qkv_w[:, :, j, :].reshape(hidden, hidden).t()
            state[h + f"attention.self.{name}.bias"] = qkv_b[:, j, :].reshape(hidden)
        # Post-LN: ln1 follows the attention's residual add, ln2 the MLP's.
        state.update({
            h + "attention.output.dense.weight": p[t + "attention.out.weight"].t(),
            h + "attention.output.dense.bias": p[t + "attention.out.bias"],
            h + "attention.output.LayerNorm.weight": p[t + "ln1.weight"],
            h + "attention.output.LayerNorm.bias": p[t + "ln1.bias"],
            h + "intermediate.dense.weight": p[t + "mlp.fc1.weight"].t(),
            h + "intermediate.dense.bias": p[t + "mlp.fc1.bias"],
            h + "output.dense.weight": p[t + "mlp.fc2.weight"].t(), h + "output.dense.bias": p[t + "mlp.fc2.bias"],
            h + "output.LayerNorm.weight": p[t + "ln2.weight"], h + "output.LayerNorm.bias": p[t + "ln2.bias"],
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
          and tensors["mlm_logits"].shape[-1] == padded)
    hidden = int(meta["hidden_size"])
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * hidden, max_position_embeddings=int(meta["max_seq_length"]))
    model = BertForPreTraining(config).eval()
    missing, unexpected = model.load_state_dict(hf_state(tensors, heads, layers, vocab), strict=False)
    # Left out on purpose: the decoder weight, tied to the word embeddings.
    check(f"{name}: every Hugging Face parameter comes from tessel",
          not unexpected and all(k == "cls.predictions.decoder.weight" for k in missing),
          f"missing {missing} unexpected {unexpected}")
    with torch.no_grad():
        plain = model(input_ids=tensors["input_ids"])
        hf = model(input_ids=tensors["input_ids"], token_type_ids=tensors["token_type_ids"],
                   attention_mask=tensors["attention_mask"].long(), labels=tensors["mlm_labels"],
                   next_sentence_label=tensors["sentence_labels"])
    for label, ours, theirs in [("masked-LM logits on the ids", tensors["plain_mlm_logits"][..., :vocab],
                                 plain.prediction_logits),
                                ("sentence logits on the ids", tensors["plain_sentence_logits"],
                                 plain.seq_relationship_logits),
                                ("masked-LM logits with types and mask", tensors["mlm_logits"][..., :vocab],
                                 hf.prediction_logits),
                                ("sentence logits with types and mask", tensors["sentence_logits"],
                                 hf.seq_relationship_logits)]:
        err = max_error(ours, theirs)
        check(f"{name}: {label} equal BertForPreTraining's (max error {err:.2e})", err <= TOLERANCE)
    err = abs(tensors["loss"].item() - hf.loss.item())
    check(f"{name}: loss {tensors['loss'].item():.6f} equals BertForPreTraining's {hf.loss.item():.6f} "
          f"(error {err:.2e})", err <= TOLERANCE)
    err = abs(tensors["weighted_loss"].item() - hf.loss.item())
    check(f"{name}: the weighted loss tessel-train uses {tensors['weighted_loss'].item():.6f} equals it too "
          f"(error {err:.2e})", err <= TOLERANCE)
    if padded > vocab:
        check(f"{name}: the {padded - vocab} padded logits are masked out",
              bool((tensors["mlm_logits"][..., vocab:] <= -1e29).all()))

    # The sequence classifier (num_labels 3) against BertForSequenceClassification.
    config.num_labels = 3
    classifier = BertForSequenceClassification(config).eval()
    missing, unexpected = classifier.load_state_dict(hf_state(tensors, heads, layers, vocab, "cls_param."),
                                                     strict=False)
    check(f"{name}: every BertForSequenceClassification parameter comes from tessel", not missing and not unexpected,
          f"missing {missing} unexpected {unexpected}")
    with torch.no_grad():
        hf = classifier(input_ids=tensors["input_ids"], token_type_ids=tensors["token_type_ids"],
                        attention_mask=tensors["attention_mask"].long(), labels=tensors["class_labels"])
    err = max_error(tensors["class_logits"], hf.logits)
    check(f"{name}: classifier logits equal BertForSequenceClassification's (max error {err:.2e})",
          err <= TOLERANCE)
    err = abs(tensors["class_loss"].item() - hf.loss.item())
    check(f"{name}: classifier loss {tensors['class_loss'].item():.6f} equals its {hf.loss.item():.6f} "
          f"(error {err:.2e})", err <= TOLERANCE)

    # Training the pre-training model: every gradient (the [PAD] row of the
    # word embedding gets none from its lookups) and 5 AdamW steps, in float64.
    model.double()
    inputs = dict(input_ids=tensors["input_ids"], token_type_ids=tensors["token_type_ids"],
                  attention_mask=tensors["attention_mask"].long(), labels=tensors["mlm_labels"],
                  next_sentence_label=tensors["sentence_labels"])
    check(f"{name}: the inputs hold [PAD] tokens", bool((tensors["input_ids"] == config.pad_token_id).any()))
    loss_fn = lambda: model(**inputs).loss  # noqa: E731
    compare_gradients(name, model, loss_fn, hf_state(tessel_gradients(tensors), heads, layers, vocab))
    compare_steps(name, model, loss_fn, tensors)

work.cleanup()
finish()
