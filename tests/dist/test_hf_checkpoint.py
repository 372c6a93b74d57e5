"""Hugging Face models in and out of tessel (checkpoint/hugging_face.h,
tessel-checkpoint import-hf / export-hf, train.load_weight).

For GPT2LMHeadModel, LlamaForCausalLM (grouped-query attention, untied
output), T5ForConditionalGeneration (v1.1's gated GELU and untied output;
the original's ReLU and tied output), BertForPreTraining and
ViTForImageClassification:
a randomly initialised model (every parameter then moved by noise, so no
weight is 0 or 1 and a mapping mistake cannot hide), saved with
save_pretrained (safetensors), is imported as a tessel checkpoint; tessel's
model loads it on one rank and under tp2 x pp2 (a vocabulary of 1,100
padded to 1,280) and its logits equal Hugging Face's within 1e-5; the
checkpoint exported back loads with from_pretrained, with every weight
bit-identical and the same logits.

A GPT trained by tessel-train under tp2 x pp2 (four shards) exports to a
model whose logits under from_pretrained equal tessel's own on that
checkpoint; tessel-generate on that checkpoint under tp2 and pp2 continues a
prompt with Hugging Face's greedy tokens exactly and scores text with its
loss. train.load_weight: tessel-train starts from an imported GPT-2
under tp2 x pp2, and a ViT started from a checkpoint's weights gives as
its first loss the loss the saving run's continuation (--resume) gives on
the same batch. tessel-generate continues and scores with an imported
Llama as Hugging Face does. Bad input (another model type, a missing or extra tensor,
another arch or layer-norm epsilon under load_weight) is named."""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, expect, finish, install_transformers, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--tool", required=True, help="tessel-checkpoint")
parser.add_argument("--train", required=True, help="tessel-train")
parser.add_argument("--generate", required=True, help="tessel-generate")
parser.add_argument("--dataset", required=True, help="tessel-dataset")
parser.add_argument("--source", required=True)
parser.add_argument("--gpt2_dump", required=True)
parser.add_argument("--bert_dump", required=True)
parser.add_argument("--vit_dump", required=True)
parser.add_argument("--llama_dump", required=True)
parser.add_argument("--t5_dump", required=True)
args = parser.parse_args()

TOLERANCE = 1e-5
work = tempfile.mkdtemp(prefix="tessel_hf_checkpoint_")
install_transformers(work)
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import (BertConfig, BertForPreTraining, GPT2Config, GPT2LMHeadModel, LlamaConfig,  # noqa: E402
                          LlamaForCausalLM, T5Config, T5ForConditionalGeneration, ViTConfig,
                          ViTForImageClassification)

LOSS = re.compile(r"\[rank 0\] iteration (\d+)/\d+ loss ([0-9.]+)")


def max_error(got, want):
    """Largest |got - want| relative to max(1, |want|)."""
    return ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()


def noisy(model, seed):
    """Every parameter moved by noise (LayerNorm gains off 1, biases off 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model.eval()


def tool(*argv):
    return run([args.tool, *argv], timeout=120)


def dump(program, nproc, flags, out):
    code, text, _ = run([args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "200",
                         "--", program, *flags, f"--out={out}"], timeout=240)
    if code != 0:
        return None, text
    with safe_open(out, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, text


LAYOUTS = {"1x1": (1, ["--tp=1"]), "tp2xpp2": (4, ["--tp=2", "--pp=2"])}


def gpt2_outputs(model, t, vocab):
    with torch.no_grad():
        plain = model(input_ids=t["input_ids"], labels=t["input_ids"])
        masked = model(input_ids=t["input_ids"], position_ids=t["position_ids"],
                       attention_mask=t["attention_mask"].long()).logits
    return [("logits", t["logits"][..., :vocab], plain.logits),
            ("logits with position ids and a padding mask", t["masked_logits"][..., :vocab], masked),
            ("loss", t["loss"].reshape(1), plain.loss.reshape(1))]


def bert_outputs(model, t, vocab):
    with torch.no_grad():
        plain = model(input_ids=t["input_ids"])
        full = model(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"],
                     attention_mask=t["attention_mask"].long(), labels=t["mlm_labels"],
                     next_sentence_label=t["sentence_labels"])
    return [("masked-LM logits", t["plain_mlm_logits"][..., :vocab], plain.prediction_logits),
            ("sentence logits", t["plain_sentence_logits"], plain.seq_relationship_logits),
            ("masked-LM logits with types and mask", t["mlm_logits"][..., :vocab], full.prediction_logits),
            ("loss", t["loss"].reshape(1), full.loss.reshape(1))]


def t5_outputs(model, t, vocab):
    with torch.no_grad():
        plain = model(input_ids=t["input_ids"], decoder_input_ids=t["decoder_input_ids"], labels=t["labels"])
        masked = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"].long(),
                       decoder_input_ids=t["decoder_input_ids"], labels=t["labels"])
    return [("logits", t["logits"][..., :vocab], plain.logits), ("loss", t["loss"].reshape(1), plain.loss.reshape(1)),
            ("logits with an encoder padding mask", t["masked_logits"][..., :vocab], masked.logits)]


def t5_config(gated):
    # initializer_factor 0.1: at T5's own 1.0 (an output table of std 1,
    # logits up to 30) Hugging Face's float32 logits differ from its float64
    # ones by 3e-5, more than the tolerance; the noise still moves every weight.
    return T5Config(initializer_factor=0.1, vocab_size=1100, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                    layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu" if gated else "relu",
                    tie_word_embeddings=not gated, decoder_start_token_id=0, pad_token_id=0)


T5_FLAGS = ["--vocab=1100", "--hidden=64", "--heads=4", "--head_dim=16", "--ffn=96", "--encoder_layers=2",
            "--decoder_layers=2", "--buckets=8", "--max_distance=20"]


def vit_outputs(model, t, vocab):
    with torch.no_grad():
        out = model(pixel_values=t["pixel_values"], labels=t["labels"])
    return [("logits", t["logits"], out.logits), ("loss", t["loss"].reshape(1), out.loss.reshape(1))]


MODELS = {
    "gpt2": (GPT2LMHeadModel, GPT2Config(vocab_size=1100, n_positions=16, n_embd=32, n_layer=2, n_head=4),
             args.gpt2_dump, ["--vocab=1100", "--hidden=32", "--heads=4", "--layers=2", "--seq=16"], gpt2_outputs),
    "llama": (LlamaForCausalLM, LlamaConfig(vocab_size=1100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                            num_attention_heads=8, num_key_value_heads=2,
                                            max_position_embeddings=16, rms_norm_eps=1e-5,
                                            attn_implementation="eager"),
              args.llama_dump, ["--vocab=1100", "--hidden=64", "--heads=8", "--kv_heads=2", "--ffn=96", "--layers=2",
                                "--seq=16"], gpt2_outputs),
    "t5": (T5ForConditionalGeneration, t5_config(gated=True), args.t5_dump, T5_FLAGS, t5_outputs),
    "t5 original": (T5ForConditionalGeneration, t5_config(gated=False), args.t5_dump,
                    T5_FLAGS + ["--tie", "--gated=false"], t5_outputs),
    "bert": (BertForPreTraining, BertConfig(vocab_size=1100, hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=128,
                                            max_position_embeddings=16),
             args.bert_dump, ["--vocab=1100", "--hidden=32", "--heads=4", "--layers=2", "--seq=16"], bert_outputs),
    "vit": (ViTForImageClassification, ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=128, image_size=16, patch_size=4,
                                                 num_channels=3, num_labels=7),
            args.vit_dump, ["--hidden=32", "--heads=4", "--layers=2", "--image_size=16", "--patch=4",
                            "--channels=3", "--classes=7"], vit_outputs),
}

hf_models = {}
for arch, (cls, config, program, flags, outputs) in MODELS.items():
    hf = noisy(cls(config), seed=len(arch))
    hf_models[arch] = hf
    arch_field = arch.split()[0]  # "t5 original" is a t5
    arch = arch.replace(" ", "_")
    hf_dir = os.path.join(work, f"{arch}_hf")
    hf.save_pretrained(hf_dir, safe_serialization=True)
    ckpt = os.path.join(work, f"{arch}_imported")
    code, out, _ = tool("import-hf", hf_dir, ckpt)
    check(f"{arch}: import-hf converts save_pretrained's directory", code == 0, out[-3000:])
    if code != 0:
        continue
    expect(f"{arch}: import-hf prints the config's model block", out, rf'arch: "{arch_field}"')
    vocab = getattr(config, "vocab_size", 0)
    for layout, (nproc, layout_flags) in LAYOUTS.items():
        tensors, text = dump(program, nproc, flags + layout_flags + [f"--load={ckpt}"],
                             os.path.join(work, f"{arch}_{layout}.safetensors"))
        check(f"{arch} {layout}: tessel's model loads the import", tensors is not None, text[-3000:])
        if tensors is None:
            continue
        for label, ours, theirs in outputs(hf, tensors, vocab):
            err = max_error(ours, theirs)
            check(f"{arch} {layout}: {label} equal {cls.__name__}'s (max error {err:.2e})", err <= TOLERANCE)
    exported = os.path.join(work, f"{arch}_exported")
    code, out, _ = tool("export-hf", ckpt, exported)
    check(f"{arch}: export-hf writes config.json and model.safetensors", code == 0 and os.path.exists(
        os.path.join(exported, "model.safetensors")), out[-2000:])
    if code != 0:
        continue
    if arch == "bert":  # the padding row's token goes out as it came in
        exported_pad = json.load(open(os.path.join(exported, "config.json"))).get("pad_token_id", "absent")
        check(f"bert: export-hf keeps pad_token_id ({exported_pad}, imported {config.pad_token_id})",
              exported_pad == config.pad_token_id)
    back = cls.from_pretrained(exported).eval()
    theirs, ours = hf.state_dict(), back.state_dict()
    same = [k for k in theirs if k in ours and torch.equal(theirs[k], ours[k])]
    check(f"{arch}: from_pretrained of the export has every weight bit for bit ({len(same)} of {len(theirs)})",
          len(same) == len(theirs), str(sorted(set(theirs) - set(same))[:10]))
    tensors, _ = dump(program, 1, flags + [f"--load={ckpt}"], os.path.join(work, f"{arch}_again.safetensors"))
    if tensors is not None:
        for label, got, want in outputs(back, tensors, vocab):
            err = max_error(got, want)
            check(f"{arch}: the exported model's {label} equal tessel's (max error {err:.2e})", err <= TOLERANCE)

# tessel-generate with the imported Llama (its config given, as import-hf
# saves none) under tp2 and pp2: Hugging Face's greedy tokens (stopping at
# its eos id 2), and --score gives from_pretrained's losses.
llama_config = os.path.join(work, "llama_generate.prototxt")
with open(llama_config, "w") as f:
    f.write('model { arch: "llama" vocab_size: 1100 hidden_size: 64 num_attention_heads: 8 num_key_value_heads: 2 '
            'ffn_hidden_size: 96 hidden_layers: 2 max_seq_length: 16 layernorm_epsilon: 1e-5 }\n')
if "llama" in hf_models:
    llama_hf = hf_models["llama"]
    prompt = [17, 300, 5, 942, 64]
    with torch.no_grad():
        want = llama_hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False,
                                 pad_token_id=0)[0, len(prompt):].tolist()
        want_loss = llama_hf(torch.tensor([prompt]), labels=torch.tensor([prompt])).loss.item()
    for layout in (["--tp", "2"], ["--pp", "2"]):
        code, out, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--max_run_s", "200", "--",
                            args.generate, "--checkpoint", os.path.join(work, "llama_imported"), "--config",
                            llama_config, *layout, "--prompt_ids", ",".join(map(str, prompt)), "--max_new_tokens",
                            "8", "--eos_id", "2"], timeout=240)
        got = [[int(x) for x in ids.split()] for ids in re.findall(r"\[rank 0\]   new ids:([ 0-9]*)", out)]
        check(f"llama: tessel-generate {' '.join(layout)} gives Hugging Face's greedy tokens ({got} vs {want})",
              code == 0 and got == [want], out[-2000:])
    code, out, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--max_run_s", "200", "--",
                        args.generate, "--checkpoint", os.path.join(work, "llama_imported"), "--config", llama_config,
                        "--tp", "2", "--score", "--prompt_ids", ",".join(map(str, prompt))], timeout=240)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+) per predicted token", out)]
    check(f"llama: tessel-generate --score gives from_pretrained's loss ({losses} vs {want_loss:.6f})",
          code == 0 and len(losses) == 1 and abs(losses[0] - want_loss) <= 1e-4 * max(1, want_loss), out[-2000:])

# A GPT-2 saved in bf16 (its tied lm_head too) imports as f32: tessel's
# logits equal those of the same model widened back to f32.
hf16 = noisy(GPT2LMHeadModel(MODELS["gpt2"][1]), seed=16).to(torch.bfloat16)
hf16_dir = os.path.join(work, "gpt2_bf16_hf")
hf16.save_pretrained(hf16_dir, safe_serialization=True)
ckpt16 = os.path.join(work, "gpt2_bf16_imported")
code, out, _ = tool("import-hf", hf16_dir, ckpt16)
check("gpt2 in bf16: import-hf widens it to f32 (the tied lm_head compared as such)", code == 0, out[-2000:])
if code == 0:
    tensors, text = dump(args.gpt2_dump, 1, MODELS["gpt2"][3] + [f"--load={ckpt16}"],
                         os.path.join(work, "gpt2_bf16.safetensors"))
    check("gpt2 in bf16: tessel's model loads it", tensors is not None, text[-2000:])
    if tensors is not None:
        for label, got, want in gpt2_outputs(hf16.float().eval(), tensors, 1100):
            err = max_error(got, want)
            check(f"gpt2 in bf16: {label} equal the widened model's (max error {err:.2e})", err <= TOLERANCE)

# A GPT trained by tessel-train under tp2 x pp2 (4 shards, its vocabulary
# padded per tp), exported: from_pretrained gives tessel's logits.
gpt_config = os.path.join(args.source, "configs", "gpt2_tiny.prototxt")
COMMON = ["train.log_period=1", "evaluation.enabled=false", "train.train_iter=8", "scheduler.warmup_iter=0"]


def train(config, nproc, sets, out_name, flags=()):
    cmd = [args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "220", "--",
           args.train, "--config", config, *flags]
    for s in COMMON + sets + [f"train.output_dir={os.path.join(work, out_name)}"]:
        cmd += ["--set", s]
    return run(cmd, timeout=240)


trained = os.path.join(work, "gpt_trained")
EVAL_SETS = ["model.vocab_size=2100", "evaluation.enabled=true", "evaluation.eval_period=8", "evaluation.eval_iter=2"]
code, out, secs = train(gpt_config, 4, ["train.save_period=8", f"train.checkpoint_dir={trained}"] + EVAL_SETS,
                        "gpt_trained_out")
trained_eval = re.search(r"\[rank 0\] evaluation at iteration 8: loss ([0-9.]+)", out)
check(f"tessel-train: the tiny GPT (vocabulary 2,100) trains under tp2 x pp2 and saves ({secs:.1f} s)", code == 0,
      out[-3000:])
exported = os.path.join(work, "gpt_trained_hf")
code, out, _ = tool("export-hf", trained, exported)
check("export-hf of the tp2 x pp2 checkpoint", code == 0, out[-2000:])
if code == 0:
    cfg = json.load(open(os.path.join(exported, "config.json")))
    check("its config.json is GPT-2's with the trained sizes",
          cfg["model_type"] == "gpt2" and cfg["vocab_size"] == 2100 and cfg["n_layer"] == 4 and cfg["n_embd"] == 128,
          json.dumps(cfg))
    back = GPT2LMHeadModel.from_pretrained(exported).eval()
    # tessel-dataset samples gives the validation samples as the run's
    # evaluation read them: from_pretrained's loss over them is the
    # evaluation loss tessel-train logged at iteration 8.
    sample_sets = []
    for s in COMMON + EVAL_SETS:
        sample_sets += ["--set", s]
    code, listed, _ = run([args.dataset, "samples", gpt_config, "--split", "validation", "--count", "32",
                           "--world_size", "4"] + sample_sets, timeout=120)
    rows = [[int(x) for x in m.split()] for m in re.findall(r"^sample \d+ \(batch \d+, row \d+\):([ 0-9]+)$",
                                                              listed, re.M)]
    check("tessel-dataset samples --split validation lists 2 batches of 16 samples of 65 tokens, with text",
          code == 0 and len(rows) == 32 and all(len(r) == 65 for r in rows) and "  text: " in listed, listed[-2000:])
    if len(rows) == 32 and trained_eval:
        with torch.no_grad():
            batches = [torch.tensor(rows[16 * b:16 * b + 16]) for b in range(2)]
            losses = [torch.nn.functional.cross_entropy(back(batch[:, :-1]).logits.reshape(-1, 2100),
                                                        batch[:, 1:].reshape(-1)).item() for batch in batches]
        hf_eval = sum(losses) / 2
        logged = float(trained_eval.group(1))
        check(f"from_pretrained's loss on tessel-dataset's validation samples is tessel-train's evaluation loss "
              f"({hf_eval:.6f} vs {logged:.6f})", abs(hf_eval - logged) <= 2e-6 * max(1.0, logged) + 1e-6)
    tensors, text = dump(args.gpt2_dump, 1, ["--vocab=2100", "--hidden=128", "--heads=4", "--layers=4", "--seq=64",
                                            f"--load={trained}"], os.path.join(work, "gpt_trained.safetensors"))
    check("tessel's GPT loads the trained checkpoint on one rank", tensors is not None, text[-2000:])
    if tensors is not None:
        for label, got, want in gpt2_outputs(back, tensors, 2100):
            err = max_error(got, want)
            check(f"trained and exported: from_pretrained's {label} equal tessel's (max error {err:.2e})",
                  err <= TOLERANCE)

# export-hf --tokenizer: the data's BPE goes with the model, so
# AutoTokenizer loads the directory, its end-of-text token is config.json's
# bos/eos id (0 in the bundled vocabulary, not GPT-2's 50256) and greedy
# generate() gives text that ends there or runs its length.
with_tokenizer = os.path.join(work, "gpt_trained_hf_tokenizer")
code, out, _ = tool("export-hf", trained, with_tokenizer, "--tokenizer",
                    os.path.join(args.source, "data", "tiny_corpus"))
expect("export-hf --tokenizer: says the end-of-text id", out, r"the tokenizer; <\|endoftext\|> is id 0")
if code == 0:
    from transformers import AutoTokenizer  # noqa: E402
    tokenizer = AutoTokenizer.from_pretrained(with_tokenizer)
    model = GPT2LMHeadModel.from_pretrained(with_tokenizer).eval()
    check(f"export-hf --tokenizer: AutoTokenizer loads it ({type(tokenizer).__name__}, eos "
          f"{tokenizer.eos_token!r} = {tokenizer.eos_token_id}), config eos/bos {model.config.eos_token_id}/"
          f"{model.config.bos_token_id}",
          tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 0 and model.config.eos_token_id == 0
          and model.config.bos_token_id == 0)
    prompt = tokenizer("The licence grants", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    text = tokenizer.decode(generated[0])
    new = generated.shape[1] - prompt.input_ids.shape[1]
    check(f"export-hf --tokenizer: generate() continues the prompt ({text!r})",
          text.startswith("The licence grants") and 1 <= new <= 12 and
          (new == 12 or generated[0, -1].item() == 0))

    # tessel-generate on the same checkpoint under tp2 and under pp2: the
    # greedy continuation is Hugging Face's token for token, top-k 1
    # sampling is greedy, and --score is from_pretrained's loss.
    prompt_ids = prompt.input_ids[0].tolist()
    hf_new = generated[0, len(prompt_ids):].tolist()
    tiny_corpus = os.path.join(args.source, "data", "tiny_corpus")

    def generate(nproc, *flags):
        code, out, _ = run([args.launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s",
                            "200", "--", args.generate, "--checkpoint", trained, *flags], timeout=240)
        found = re.findall(r"\[rank 0\]   new ids:([ 0-9]*)", out)
        return code, out, [[int(x) for x in ids.split()] for ids in found]

    for layout in (["--tp", "2"], ["--pp", "2"]):
        code, out, got = generate(2, *layout, "--prompt_ids", ",".join(map(str, prompt_ids)), "--max_new_tokens",
                                  "12", "--tokenizer", tiny_corpus)
        check(f"tessel-generate {' '.join(layout)}: Hugging Face's greedy tokens exactly ({got} vs {hf_new})",
              code == 0 and got == [hf_new], out[-2000:])
        expect(f"tessel-generate {' '.join(layout)}: prints the text", out,
               r"\[rank 0\]   text: The licence grants\|")
    code, out, got = generate(2, "--tp", "2", "--prompt_ids", ",".join(map(str, prompt_ids)), "--max_new_tokens",
                              "12", "--eos_id", "-1", "--sample", "--top_k", "1")
    check("tessel-generate --sample --top_k 1 is greedy (no stop at end-of-text: 12 tokens)",
          code == 0 and len(got) == 1 and len(got[0]) == 12 and got[0][:len(hf_new)] == hf_new, out[-2000:])
    sampled = [generate(2, "--tp", "2", "--prompt_ids", "5,17,200", "--max_new_tokens", "16", "--eos_id", "-1",
                        "--sample", "--temperature", "1.5", "--seed", str(seed))[2] for seed in (7, 7, 8)]
    check(f"tessel-generate --sample: the same seed draws the same tokens, another seed others ({sampled})",
          sampled[0] == sampled[1] and len(sampled[0]) == 1 and sampled[0] != sampled[2])
    scored = [[3, 17, 200, 9, 41, 5], [12, 7, 7, 1000, 2099]]
    code, out, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--max_run_s", "200", "--",
                        args.generate, "--checkpoint", trained, "--tp", "2", "--score", "--prompt_ids",
                        ";".join(",".join(map(str, s)) for s in scored)], timeout=240)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+) per predicted token", out)]
    with torch.no_grad():
        want = [model(torch.tensor([s]), labels=torch.tensor([s])).loss.item() for s in scored]
    check(f"tessel-generate --score: per-prompt losses equal from_pretrained's ({losses} vs {want})",
          code == 0 and len(losses) == 2 and all(abs(a - b) <= 1e-4 * max(1, b) for a, b in zip(losses, want)),
          out[-2000:])
    for flags, pattern in ((["--prompt_ids", "1,x"], r"'x' is not a token id"),
                           (["--prompt_ids", "1,2100"], r"id 2100 of prompt 0 is outside the vocabulary of 2100"),
                           (["--prompt_ids", "1", "--top_p", "0"], r"--top_p 0; expected 0 < p <= 1")):
        code, out, _ = run([args.generate, "--checkpoint", trained, *flags], timeout=60)
        check(f"tessel-generate {' '.join(flags)} is refused, named", code != 0 and re.search(pattern, out) is not None,
              out[-1500:])
code, out, _ = tool("export-hf", trained, os.path.join(work, "bad_tokenizer"), "--tokenizer", work)
expect("export-hf --tokenizer without vocab.json and merges.txt: named", out,
       r"does not hold vocab\.json and merges\.txt")
check("export-hf with a bad --tokenizer writes nothing", code != 0 and not os.path.exists(
    os.path.join(work, "bad_tokenizer")))

# train.load_weight from an imported GPT-2 of the tiny config's sizes, with
# 128 positions for sequences of 64, under tp2 x pp2.
torch.manual_seed(1)  # its initialisation too: a model whose greedy continuation (below) takes 6 different tokens
hf = noisy(GPT2LMHeadModel(GPT2Config(vocab_size=2048, n_positions=128, n_embd=128, n_layer=4, n_head=4)), seed=9)
hf_dir = os.path.join(work, "gpt_tiny_hf")
hf.save_pretrained(hf_dir, safe_serialization=True)
imported = os.path.join(work, "gpt_tiny_imported")
code, out, _ = tool("import-hf", hf_dir, imported)
check("import-hf of a GPT-2 with 128 positions", code == 0, out[-2000:])
code, out, secs = train(gpt_config, 4, [f"train.load_weight={imported}", "model.max_position_embeddings=128"],
                        "gpt_loaded")
check(f"train.load_weight: tessel-train starts from the imported GPT-2 under tp2 x pp2 ({secs:.1f} s)",
      code == 0 and len(LOSS.findall(out)) == 8, out[-3000:])
expect("train.load_weight: the load is logged", out, r"loaded the gpt2 weights of .*gpt_tiny_imported")
fresh = [float(v) for _, v in LOSS.findall(train(gpt_config, 4, [], "gpt_fresh")[1])]
loaded = [float(v) for _, v in LOSS.findall(out)]
check(f"train.load_weight: the first loss ({loaded[0] if loaded else None}) is the imported model's, not a fresh "
      f"start's ({fresh[0] if fresh else None})", loaded and fresh and abs(loaded[0] - fresh[0]) > 1e-3)

# tessel-generate on the imported GPT-2 (its model block is the one
# import-hf saved), under tp2 and under pp2 with the model given by
# --config and --set: a noisy model's greedy continuation is Hugging
# Face's token for token over 40 new tokens.
prompt_ids = [5, 17, 200, 1999, 64]
with torch.no_grad():
    hf_new = hf.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                         max_new_tokens=40, do_sample=False, pad_token_id=0, eos_token_id=None)[0, 5:].tolist()
for flags in (["--tp", "2"], ["--pp", "2", "--config", gpt_config, "--set", "model.max_position_embeddings=128"]):
    code, out, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--max_run_s", "200", "--",
                        args.generate, "--checkpoint", imported, *flags, "--prompt_ids",
                        ",".join(map(str, prompt_ids)), "--max_new_tokens", "40", "--eos_id", "-1"], timeout=240)
    found = re.findall(r"\[rank 0\]   new ids:([ 0-9]*)", out)
    got = [int(x) for x in found[0].split()] if found else None
    check(f"tessel-generate {' '.join(flags[:2])} on the imported GPT-2: Hugging Face's greedy tokens exactly, "
          f"{len(set(hf_new))} different ones ({got} vs {hf_new})",
          code == 0 and got == hf_new and len(set(hf_new)) >= 5, out[-2000:])

# train.load_weight takes the model's weights and nothing else: a ViT whose
# every batch is the same 32 synthetic images, started from a checkpoint's
# weights, gives as its first loss what the saving run's continuation gives.
vit_config = os.path.join(args.source, "configs", "vit_tiny.prototxt")
VIT = ["data.image_dataset=synthetic", "data.synthetic_samples=32", "data.split=100,0,0",
       "scheduler.name=constant", "scheduler.warmup_iter=0"]
vit_saved = os.path.join(work, "vit_saved")
code, out, _ = train(vit_config, 2, VIT + ["train.train_iter=5", "train.save_period=5",
                                           f"train.checkpoint_dir={vit_saved}"], "vit_a")
check("ViT on 32 synthetic images: 5 iterations saved", code == 0, out[-2000:])
code, out, _ = train(vit_config, 2, VIT + ["train.train_iter=6", f"train.checkpoint_dir={vit_saved}"], "vit_b",
                     flags=["--resume"])
check("ViT: the run resumed from iteration 5 makes its sixth", code == 0, out[-2000:])
resumed = dict(LOSS.findall(out))
code, out, _ = train(vit_config, 4, VIT + ["train.train_iter=1", f"train.load_weight={vit_saved}/iter_0000005",
                                           "train.dist.tensor_parallel_size=2", "train.dist.pipeline_parallel_size=2"],
                     "vit_c")
started = dict(LOSS.findall(out))
check("ViT: loaded under tp2 x pp2, the first loss equals the resumed run's sixth (the same weights, the same "
      f"batch): {started.get('1')} vs {resumed.get('6')}",
      "1" in started and "6" in resumed and abs(float(started["1"]) - float(resumed["6"])) <= TOLERANCE *
      max(1.0, abs(float(resumed["6"]))), out[-2000:])

# Bad input, named.
bad = os.path.join(work, "bad_hf")
shutil.copytree(os.path.join(work, "gpt2_hf"), bad)
cfg = json.load(open(os.path.join(bad, "config.json")))
cfg["model_type"] = "mistral"
json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
code, out, _ = tool("import-hf", bad, os.path.join(work, "x1"))
check("another model type is refused", code not in (0, None), out[-1000:])
expect("... naming it", out, r"model_type 'mistral'; expected gpt2, llama, t5, bert or vit")
cfg["model_type"], cfg["n_layer"] = "gpt2", 3
json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
code, out, _ = tool("import-hf", bad, os.path.join(work, "x2"))
check("a tensor missing for the config's layers is refused", code not in (0, None), out[-1000:])
expect("... naming it", out, r"has no tensor 'transformer\.h\.2\.ln_1\.weight'")
cfg["n_layer"] = 1
json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
code, out, _ = tool("import-hf", bad, os.path.join(work, "x3"))
check("tensors the config has no place for are refused", code not in (0, None), out[-1000:])
expect("... naming them", out, r"tensor\(s\) tessel's gpt2 has no place for: transformer\.h\.1\.")
bad_t5 = os.path.join(work, "bad_t5_hf")
shutil.copytree(os.path.join(work, "t5_hf"), bad_t5)
cfg = json.load(open(os.path.join(bad_t5, "config.json")))
cfg["feed_forward_proj"] = "gated-silu"
json.dump(cfg, open(os.path.join(bad_t5, "config.json"), "w"))
code, out, _ = tool("import-hf", bad_t5, os.path.join(work, "x_t5"))
check("a T5 feed-forward tessel's T5 has not is refused", code not in (0, None), out[-1000:])
expect("... naming it", out, r'"feed_forward_proj" is "gated-silu"; tessel\'s T5 supports "gated-gelu"')
code, out, _ = train(gpt_config, 4, [f"train.load_weight={os.path.join(work, 'bert_imported')}"], "x4")
check("load_weight of another arch is refused", code not in (0, None), out[-1000:])
expect("... naming both", out, r"is of model\.arch 'bert' but this config trains 'gpt2'")
code, out, _ = train(gpt_config, 4, [f"train.load_weight={imported}", "model.max_position_embeddings=128",
                                     "model.layernorm_epsilon=1e-6"], "x5")
check("load_weight under another layer-norm epsilon is refused", code not in (0, None), out[-1000:])
expect("... naming both", out, r"model\.layernorm_epsilon 1e-05 but this config has 1e-06")
code, out, _ = train(gpt_config, 4, [f"train.load_weight={imported}"], "x6")
check("load_weight with too few positions is refused", code not in (0, None), out[-1000:])
expect("... naming the tensor and both shapes", out,
       r"tensor 'model\.wpe\.weight' has shape \[128, 128\] there but \[64, 128\] in the model")

shutil.rmtree(work, ignore_errors=True)
finish()
