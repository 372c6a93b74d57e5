"""tessel-train with configs/bert_tiny.prototxt (BERT pre-training on the
bundled corpus's sentences): the same 20 losses (1e-5 relative) under 1x1x1,
dp2, tp2, pp2, dp2 x tp2 and tp2 x pp2 in graph mode with 1F1B and eagerly
on 1x1x1 and tp2 x pp2 (the accumulation steps differ between them: the
masked-LM loss is normalised over the global batch); 100 iterations with a
falling loss in graph mode under pp2; the config on 4
ranks (150 of its iterations) lowers the held-out masked-LM loss; bad input is named before the
first iteration."""
import json
import math
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, expect, finish  # noqa: E402
from train_checks import Trainer, check_bad_inputs, check_long_runs, check_same_losses, train_args  # noqa: E402

args = train_args()
config = os.path.join(args.source, "configs", "bert_tiny.prototxt")
work = tempfile.mkdtemp(prefix="tessel_train_bert_")
train = Trainer(args.launcher, args.program, config)

ITERS = 20
check_same_losses(train, work, ITERS, [f"train.train_iter={ITERS}", "train.log_period=1", "evaluation.enabled=false",
                                       "scheduler.warmup_iter=5"], min_drop=0.3)
check_long_runs(train, work, ["scheduler.warmup_iter=10"], min_drop=1.0, runs=("graph pp2",))

# The config (tp2 x pp2, 1F1B, graph mode) for half its iterations, with
# evaluations at 50, 100 and 150: the held-out masked-LM loss falls, well
# below a uniform guess over the vocabulary.
out_dir = os.path.join(work, "bert_tiny")
code, out, secs = train(4, [f"train.output_dir={out_dir}", "train.train_iter=150", "evaluation.eval_period=50"],
                        timeout=600)
check(f"bert_tiny: the config trains on 4 ranks ({secs:.1f} s)", code == 0, out[-3000:])
expect("bert_tiny: the log names the data", out,
       r"vocab 2048, sequence 64, masked_lm_prob 0\.15; train \d+ sentence-pair samples \(\d+ epochs of \d+ "
       r"documents of two sentences or more\)")
evals = [(int(i), float(m)) for i, m in
         re.findall(r"evaluation at iteration (\d+): loss [0-9.]+ mlm_loss ([0-9.]+) sentence_loss", out)]
uniform = math.log(2048)
check(f"bert_tiny: held-out masked-LM loss {' -> '.join(f'{m:.3f}' for _, m in evals)} falls and ends more than "
      f"1 nat below a uniform guess ({uniform:.3f})",
      len(evals) == 3 and evals[-1][1] < evals[0][1] and evals[-1][1] < uniform - 1, out[-3000:])
records = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))] if os.path.exists(
    os.path.join(out_dir, "metrics.jsonl")) else []
logged = [r for r in records if "eval_mlm_loss" in r]
check("bert_tiny: metrics.jsonl holds the evaluations' terms and perplexity",
      len(logged) == 3 and abs(logged[-1]["eval_mlm_loss"] - evals[-1][1]) < 1e-5 and
      abs(logged[-1]["eval_mlm_perplexity"] - math.exp(evals[-1][1])) < 1e-2 * logged[-1]["eval_mlm_perplexity"],
      str(logged))

# Bad input: named before the first iteration.
gpt_corpus = os.path.join(args.source, "data", "tiny_corpus", "tiny_corpus_text_document")
cases = {
    "documents of one sequence": ([f"data.data_prefix={gpt_corpus}"],
                                  r"no document has two sentences of at most 512 tokens \(\d+ hold a longer one\); "
                                  r"BERT's samples pair sentences \(preprocess the text with "
                                  r"tools/preprocess_data\.py --split-sentences\)"),
    "a special token the vocabulary file names otherwise": (["data.mask_token_id=5"],
                                                            r"data\.mask_token_id is 5 but \[MASK\] is id 103 in "
                                                            r".*bert-vocab\.txt"),
    "a vocabulary smaller than the vocabulary file": (["model.vocab_size=1000"],
                                                      r"model\.vocab_size is 1000 but data\.vocab_file "
                                                      r".*bert-vocab\.txt holds 2048 tokens"),
    "a special token outside the vocabulary": (["data.vocab_file=", "model.vocab_size=2048",
                                                "data.mask_token_id=5000"],
                                               r"data\.mask_token_id is 5000; expected an id below "
                                               r"model\.vocab_size 2048"),
    "two special tokens the same": (["data.vocab_file=", "model.vocab_size=2048", "data.pad_token_id=101"],
                                    r"data\.cls_token_id and data\.pad_token_id are both 101"),
    "a vocabulary smaller than the data": (["data.vocab_file=", "model.vocab_size=1000"],
                                           r"holds token id 2047 but model\.vocab_size is 1000"),
    "a sequence too short for a pair": (["model.max_seq_length=4"],
                                        r"model\.max_seq_length is 4; BERT needs at least 5"),
}
check_bad_inputs(train, work, cases, 2, ["train.dist.pipeline_parallel_size=1"])
shutil.rmtree(work, ignore_errors=True)
finish()
