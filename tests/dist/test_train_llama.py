"""tessel-train on the bundled corpus from configs/llama_tiny.prototxt
(grouped-query attention, 8 query heads on 2 key/value heads): the same 20
losses (1e-5 relative) under 1x1x1, dp2, tp2, pp2, dp2 x tp2 and tp2 x pp2
in graph mode with 1F1B, eagerly on 1x1x1 and tp2 x pp2, under sequence
parallelism, ZeRO-3, interleaved 1F1B, ZB-H1 and activation
checkpointing, and the loss falls;
100 iterations lower it by 1.5 nats in graph mode under pp2; a
checkpoint saved under tp2 x pp2 with the vocabulary padded to 4,000 rows
resumes on one process, where it pads to 3,000, with the uninterrupted
losses (padding changes nothing);
the resolved config names Llama's sizes; a Llama-style tokenizer.json
(made here) preprocesses the corpus and gives model.vocab_size. Bad Llama
settings are named before the first iteration."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, install_transformers  # noqa: E402
from train_checks import (LOSS, Trainer, check_bad_inputs, check_long_runs, check_modes,  # noqa: E402
                          check_padded_resume, check_same_losses, layout_sets, train_args)

args = train_args()
config = os.path.join(args.source, "configs", "llama_tiny.prototxt")
work = tempfile.mkdtemp(prefix="tessel_train_llama_")
ITERS = 20
train = Trainer(args.launcher, args.program, config)
common = [f"train.train_iter={ITERS}", "train.log_period=1", "evaluation.enabled=false",
          "scheduler.warmup_iter=5"]
losses = check_same_losses(train, work, ITERS, common, min_drop=0.5)
check_long_runs(train, work, [], min_drop=1.5, runs=("graph pp2",))

# The modes the other models train under give the same losses too.
MODES = {"sequence parallel tp2xpp2": (4, ["train.dist.sequence_parallel=true"] + layout_sets(2, 2, True)),
         "ZeRO-3 dp4": (4, ["train.zero_optimization.enabled=true", "train.zero_optimization.stage=3"] +
                        layout_sets(1, 1, True)),
         "interleaved 1F1B pp2 x 2 chunks, dp2": (4, ["train.dist.virtual_pipeline_size=2",
                                                      "train.graph.pipeline=\"interleaved_1f1b\""] +
                                                  layout_sets(1, 2, True)),
         "ZB-H1 pp2": (2, ["train.graph.pipeline=\"zb_h1\""] + layout_sets(1, 2, True)),
         "activation checkpointing tp2xpp2": (4, ["train.activation_checkpoint=true"] + layout_sets(2, 2, True))}
check_modes(train, work, common, MODES, losses.get("1x1x1", []), ITERS)

saved_path = os.path.join(work, "tp2xpp2", "config.prototxt")
saved = open(saved_path).read() if os.path.exists(saved_path) else ""
for field in ('arch: "llama"', "num_key_value_heads: 2", "ffn_hidden_size: 352", 'hidden_act: "silu"',
              "pipeline_num_layers: 4"):
    check(f"resolved config holds {field}", field in saved, saved)

check_padded_resume(train, work, common, losses.get("1x1x1", []), ITERS)

# Llama's kind of tokenizer: a byte-level BPE with <|begin_of_text|> and
# <|end_of_text|> as a tokenizer.json (made here with the tokenizers package
# on the bundled corpus), preprocess_data.py --tokenizer-file, and the
# config's data.vocab_file pointing at the same file for model.vocab_size.
install_transformers(work)  # brings tokenizers
deps = os.path.join(work, "pydeps")
tokenizer = os.path.join(work, "tokenizer.json")
corpus = os.path.join(args.source, "data", "tiny_corpus", "corpus.jsonl")
made = subprocess.run([sys.executable, "-c", (
    "import json, sys\n"
    "from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers\n"
    "tok = Tokenizer(models.BPE())\n"
    "tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)\n"
    "tok.decoder = decoders.ByteLevel()\n"
    "trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=['<|begin_of_text|>', '<|end_of_text|>'],\n"
    "                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())\n"
    f"tok.train_from_iterator([json.loads(l)['text'] for l in open({corpus!r})], trainer)\n"
    f"tok.save({tokenizer!r})\n"
    "print(tok.get_vocab_size())\n")], env=dict(os.environ, PYTHONPATH=deps), capture_output=True, text=True)
check("a Llama-style tokenizer.json is made", made.returncode == 0, made.stderr[-2000:])
size = int(made.stdout.split()[-1]) if made.returncode == 0 else 0
prefix = os.path.join(work, "llama_corpus")
pre = subprocess.run([sys.executable, os.path.join(args.source, "tools", "preprocess_data.py"), "--input", corpus,
                      "--output-prefix", prefix, "--tokenizer-file", tokenizer, "--append-eod", "--eod-token",
                      "<|end_of_text|>"], env=dict(os.environ, PYTHONPATH=deps), capture_output=True, text=True)
check("preprocess_data.py --tokenizer-file tokenizer.json writes the dataset", pre.returncode == 0, pre.stderr[-2000:])
code, out, _ = train(2, common + layout_sets(2, 1, True) + [
    f"data.data_prefix=\"{prefix}\"", f"data.vocab_file=\"{tokenizer}\"",
    f"train.output_dir={os.path.join(work, 'own_tokenizer')}"])
values = [float(v) for i, v in LOSS.findall(out)]
check(f"tessel-train takes the vocabulary size ({size}) from the tokenizer.json and the loss falls "
      f"({values[0] if values else 0:.3f} -> {values[-1] if values else 0:.3f})",
      code == 0 and size == 1000 and f"vocab {size}," in out and len(values) == ITERS and values[-1] < values[0] - 0.5,
      out[-3000:])

check_bad_inputs(train, work, {
    "key/value heads that tp does not divide": (
        ["model.num_key_value_heads=1"] + layout_sets(2, 1, True),
        r"model.num_key_value_heads 1 is not divisible by train.dist.tensor_parallel_size 2"),
    "query heads that key/value heads do not divide": (
        ["model.num_key_value_heads=3"], r"model.num_attention_heads 8 is not divisible by model.num_key_value_heads 3"),
    "another activation": (["model.hidden_act=\"gelu\""], r"model.hidden_act is 'gelu'"),
    "dropout": (["model.hidden_dropout_prob=0.1"], r"model.hidden_dropout_prob is 0.1 but tessel's Llama has no dropout"),
    "a Llama setting on GPT-2": (["model.arch=\"gpt2\"", "model.num_key_value_heads=2"],
                                 r"model.num_key_value_heads is a Llama setting, but model.arch is 'gpt2'"),
}, nproc=2)

finish()
