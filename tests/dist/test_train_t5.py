"""tessel-train on the bundled corpus from configs/t5_tiny.prototxt (T5
v1.1 pre-trained by span corruption): the same 20 losses (1e-5 relative)
under 1x1x1, dp2, tp2, pp2, dp2 x tp2 and tp2 x pp2 in graph mode with
1F1B, eagerly on 1x1x1 and tp2 x pp2, under ZeRO-3, interleaved 1F1B, ZB-H1,
activation checkpointing and pp4 (the encoder's output read by two decoder
stages), and the loss falls; the original T5 (ReLU, tied output) the same
under tp2 x pp2 as on one process; 100 iterations lower the loss in graph
mode under pp2; a checkpoint saved under tp2 x pp2 with the
vocabulary padded to 4,000 rows resumes on one process with the
uninterrupted losses; the resolved config names T5's sizes; export-hf
writes the data's eos into config.json; bad T5 settings are named before
the first iteration."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, finish, run  # noqa: E402
from train_checks import (LOSS, Trainer, check_bad_inputs, check_long_runs, check_modes,  # noqa: E402
                          check_padded_resume, check_same_as, check_same_losses, layout_sets, train_args)

args = train_args()
config = os.path.join(args.source, "configs", "t5_tiny.prototxt")
work = tempfile.mkdtemp(prefix="tessel_train_t5_")
ITERS = 20
train = Trainer(args.launcher, args.program, config)
common = [f"train.train_iter={ITERS}", "train.log_period=1", "evaluation.enabled=false",
          "scheduler.warmup_iter=5"]
losses = check_same_losses(train, work, ITERS, common, min_drop=0.5)
check_long_runs(train, work, [], min_drop=1.5, runs=("graph pp2",))


def losses_of(nproc, sets, name):
    code, out, secs = train(nproc, common + sets + [f"train.output_dir={os.path.join(work, name)}"])
    return code, [float(v) for i, v in LOSS.findall(out)], out, secs


# The modes the other models train under give the same losses too.
MODES = {"ZeRO-3 dp4": (4, ["train.zero_optimization.enabled=true", "train.zero_optimization.stage=3"] +
                        layout_sets(1, 1, True)),
         "interleaved 1F1B pp2 x 2 chunks, dp2": (4, ["train.dist.virtual_pipeline_size=2",
                                                      "train.graph.pipeline=\"interleaved_1f1b\""] +
                                                  layout_sets(1, 2, True)),
         "ZB-H1 pp2": (2, ["train.graph.pipeline=\"zb_h1\""] + layout_sets(1, 2, True)),
         "activation checkpointing tp2xpp2": (4, ["train.activation_checkpoint=true"] + layout_sets(2, 2, True)),
         "pp4: the encoder's output read on two decoder stages": (4, layout_sets(1, 4, True))}
check_modes(train, work, common, MODES, losses.get("1x1x1", []), ITERS)

# The original T5: a ReLU feed-forward and the output tied to the token
# table (scaled by hidden^-1/2), across the pipeline's two ends.
original = ["model.hidden_act=\"relu\"", "model.tie_word_embeddings=true"]
code, ref, out, _ = losses_of(1, original + layout_sets(1, 1, True), "original_1")
check(f"original T5 on one process: {len(ref)} losses, falling ({ref[0] if ref else 0:.4f} -> "
      f"{ref[-1] if ref else 0:.4f}: the scaled tied output starts with small logits)",
      code == 0 and len(ref) == ITERS and ref[-1] < ref[0] - 0.05, out[-3000:])
code, values, out, secs = losses_of(4, original + layout_sets(2, 2, True), "original_tp2xpp2")
check_same_as("original T5 tp2 x pp2", values, ref, ITERS, code, secs, out)

saved_path = os.path.join(work, "tp2xpp2", "config.prototxt")
saved = open(saved_path).read() if os.path.exists(saved_path) else ""
for field in ('arch: "t5"', "num_decoder_layers: 2", "head_dim: 32", 'hidden_act: "gated-gelu"',
              "pipeline_num_layers: 4", "layernorm_epsilon: 1e-06", "eos_token_id: 0"):
    check(f"resolved config holds {field}", field in saved, saved)

check_padded_resume(train, work, common, losses.get("1x1x1", []), ITERS)

# export-hf of that tp2 x pp2 checkpoint: T5ForConditionalGeneration's
# config.json with the data's end-of-sequence id (the bundled vocabulary's
# <|endoftext|>, 0) for generate() to stop at.
exported = os.path.join(work, "exported_hf")
code, out, _ = run([os.path.join(os.path.dirname(args.program), "tessel-checkpoint"), "export-hf",
                    os.path.join(work, "ckpt"), exported], timeout=120)
hf_config = json.load(open(os.path.join(exported, "config.json"))) if code == 0 else {}
check(f"export-hf writes a T5 with the data's eos ({hf_config.get('eos_token_id')}) and its sizes",
      code == 0 and hf_config.get("model_type") == "t5" and hf_config.get("eos_token_id") == 0 and
      hf_config.get("num_decoder_layers") == 2 and hf_config.get("feed_forward_proj") == "gated-gelu" and
      os.path.exists(os.path.join(exported, "model.safetensors")), out[-2000:])

check_bad_inputs(train, work, {
    "no room for the sentinels": (["model.vocab_size=2050"],
                                  r"the 4 sentinels of a 70-token sequence are ids 2046 .. 2049 .*"
                                  r"expected model.vocab_size of at least 2052"),
    "heads that tp does not divide": (["model.num_attention_heads=3", "model.head_dim=32"] + layout_sets(2, 1, True),
                                      r"model.num_attention_heads 3 is not divisible by "
                                      r"train.dist.tensor_parallel_size 2"),
    "another feed-forward": (["model.hidden_act=\"gelu\""], r"model.hidden_act is 'gelu'"),
    "dropout": (["model.hidden_dropout_prob=0.1"], r"model.hidden_dropout_prob is 0.1 but tessel's T5 has no dropout"),
    "sequence parallelism": (["train.dist.sequence_parallel=true"] + layout_sets(2, 1, True),
                             r"model.arch t5 trains without sequence parallelism"),
    "a noise density of 1": (["data.noise_density=1"], r"data.noise_density is 1"),
    "a T5 setting on GPT-2": (["model.arch=\"gpt2\"", "model.hidden_act=\"gelu\""],
                              r"model.num_decoder_layers is a T5 setting, but model.arch is 'gpt2'"),
}, nproc=2, common=layout_sets(1, 2, True))

finish()
