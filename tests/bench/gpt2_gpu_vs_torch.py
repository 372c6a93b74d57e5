"""GPT-2 medium (or, with --model llama, a Llama 1B shape) training on one
GPU: tessel-train (eager, cuda) against PyTorch eager and torch.compile on
the same model, batch and precision, measured in this run on this machine.
Prints tokens/s and model FLOPs utilisation (MFU) for each, and tessel's
ratio to each peer.

The model is LiBai's GPT-2 benchmark shape: 24 layers, hidden 1024, 16 heads,
sequence 1024, vocabulary 50304, dropout 0. The PyTorch peer is Hugging
Face's GPT2LMHeadModel with the same configuration (attention through
PyTorch's scaled_dot_product_attention, its best eager path), AdamW, f32
weights. FLOPs per token are 6 N + 12 L h s (N parameters without the
position table, L layers, h hidden, s sequence), the count Megatron-LM and
nanoGPT use; MFU divides by the GPU's dense peak for the precision.

With --model llama the shape is Llama 3.2 1B's (16 layers, hidden 2048, 32
query heads on 8 key/value heads, MLP 8192, vocabulary 128256, tied
embeddings, rotary base 500000) on 2,048-token sequences, and the peer is
Hugging Face's LlamaForCausalLM; FLOPs per token are 6 N + 12 L h s (N
without the tied table counted twice).

  python3 tests/bench/gpt2_gpu_vs_torch.py --train build/tools/tessel-train \\
      --precision tf32 --batch 8
  python3 tests/bench/gpt2_gpu_vs_torch.py --train build/tools/tessel-train --model llama
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Dense peaks of an H100 SXM (NVIDIA's datasheet, without sparsity), TFLOP/s;
# f32 runs count against the TF32 peak only when TF32 is on.
PEAK_TFLOPS = {"tf32": 494.7, "bf16": 989.4, "f32": 66.9}

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--train", required=True, help="tessel-train of this build")
parser.add_argument("--precision", default="bf16", choices=["f32", "tf32", "bf16"],
                    help="f32 and tf32: f32 training (TF32 GEMMs for tf32); bf16: bf16 compute with f32 master "
                         "weights (tessel: train.amp; PyTorch: autocast)")
parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--layers", type=int, help="default: 24 (gpt2), 16 (llama)")
parser.add_argument("--hidden", type=int, help="default: 1024 (gpt2), 2048 (llama)")
parser.add_argument("--heads", type=int, help="default: 16 (gpt2), 32 (llama)")
parser.add_argument("--kv_heads", type=int, default=8, help="llama: key/value heads")
parser.add_argument("--ffn", type=int, default=8192, help="llama: the MLP's inner size")
parser.add_argument("--seq", type=int, help="default: 1024 (gpt2), 2048 (llama)")
parser.add_argument("--vocab", type=int, help="default: 50304 (gpt2), 128256 (llama)")
parser.add_argument("--steps", type=int, default=20, help="timed steps (after warm-up)")
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--skip", default="", help="comma-separated of: tessel, eager, compile")
parser.add_argument("--also_score_matrix", action="store_true",
                    help="also time tessel with model.fused_attention=false (attention through the [seq, seq] "
                         "score matrix and cuBLAS)")
args = parser.parse_args()
llama = args.model == "llama"
for name, gpt2, llama_default in (("layers", 24, 16), ("hidden", 1024, 2048), ("heads", 16, 32), ("seq", 1024, 2048),
                                   ("vocab", 50304, 128256)):
    if getattr(args, name) is None:
        setattr(args, name, llama_default if llama else gpt2)
skip = set(filter(None, args.skip.split(",")))


def flops_per_token():
    h, L, s, v = args.hidden, args.layers, args.seq, args.vocab
    if llama:
        kv = h // args.heads * args.kv_heads
        n = v * h + L * (2 * h * h + 2 * h * kv + 3 * h * args.ffn + 2 * h) + h  # tied table, blocks, norm
    else:
        n = v * h + L * (12 * h * h + 13 * h) + 2 * h  # token table (tied head), blocks, final norm
    return 6 * n + 12 * L * h * s


def report(name, tokens_per_s):
    mfu = tokens_per_s * flops_per_token() / (PEAK_TFLOPS[args.precision] * 1e12)
    print(f"| {name} | {args.precision} | {tokens_per_s:,.0f} | {100 * mfu:.1f}% |", flush=True)
    return tokens_per_s


def hf_model():
    """Hugging Face's model of the benchmark's shape (attention: SDPA,
    transformers' default where PyTorch has it)."""
    if llama:
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
            max_position_embeddings=args.seq, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True))
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.hidden,
                                      n_layer=args.layers, n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, activation_function="gelu_new"))


def torch_tokens_per_s(compiled):
    torch.backends.cuda.matmul.allow_tf32 = args.precision != "f32"
    torch.backends.cudnn.allow_tf32 = args.precision != "f32"
    model = hf_model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    step_model = torch.compile(model) if compiled else model
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
        loss.item()  # tessel-train reads its loss every step too
    seconds = time.perf_counter() - start
    del model, opt, step_model
    torch.cuda.empty_cache()
    return args.batch * args.seq * args.steps / seconds


def tessel_tokens_per_s(fused_attention=True):
    out = tempfile.mkdtemp(prefix="tessel_gpt2_gpu_")
    iters = 2 * args.steps  # the first log period warms up; the second is timed
    overrides = {
        "model.hidden_layers": args.layers, "model.hidden_size": args.hidden,
        "model.num_attention_heads": args.heads, "model.max_seq_length": args.seq,
        "model.vocab_size": args.vocab, "train.dist.device": "cuda", "train.dist.tensor_parallel_size": 1,
        "train.graph.enabled": "false", "train.activation_checkpoint": "false",
        "train.micro_batch_size": args.batch, "train.global_batch_size": args.batch,
        "train.train_iter": iters, "train.log_period": args.steps, "scheduler.warmup_iter": 0,
        "evaluation.enabled": "false", "train.output_dir": out,
        "data.data_prefix": os.path.join(ROOT, "data/tiny_corpus/tiny_corpus_text_document"),
        "train.amp.enabled": "true" if args.precision == "bf16" else "false", "train.amp.dtype": "bf16",
        "model.fused_attention": "true" if fused_attention else "false",
    }
    config = "configs/gpt2_355m.prototxt"
    if llama:
        config = "configs/llama_tiny.prototxt"
        overrides.update({"model.num_key_value_heads": args.kv_heads, "model.ffn_hidden_size": args.ffn,
                          "model.rope_theta": 500000, "model.tie_word_embeddings": "true",
                          "model.vocab_size": args.vocab,
                          "train.dist.pipeline_parallel_size": 1})
    cmd = [args.train, "--config", os.path.join(ROOT, config)]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    env = dict(os.environ, TESSEL_CUDA_ALLOW_TF32="1" if args.precision == "tf32" else "0")
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"tessel-train failed: {' '.join(cmd)}\n{run.stdout[-4000:]}")
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"tokens_per_s"' in l]
    # The last record covers the timed steps only (the first period warmed up).
    return records[-1]["tokens_per_s"]


print(f"{'Llama' if llama else 'GPT-2'} {args.layers} layers, hidden {args.hidden}, seq {args.seq}, vocab {args.vocab}, batch "
      f"{args.batch}, on {torch.cuda.get_device_name(0)}; {flops_per_token() / 1e9:.2f} GFLOP per token")
print("| system | precision | tokens/s | MFU |")  # MFU against the precision's dense peak
print("| --- | --- | --- | --- |")
results = {}
if "tessel" not in skip:
    results["tessel"] = report("tessel eager (cuda)", tessel_tokens_per_s())
if args.also_score_matrix and "tessel" not in skip:
    report("tessel eager (cuda), score-matrix attention", tessel_tokens_per_s(fused_attention=False))
if "eager" not in skip:
    results["eager"] = report("PyTorch eager", torch_tokens_per_s(False))
if "compile" not in skip:
    results["compile"] = report("PyTorch torch.compile", torch_tokens_per_s(True))
if "tessel" in results:
    for peer in ("eager", "compile"):
        if peer in results:
            print(f"tessel / PyTorch {peer}: {results['tessel'] / results[peer]:.2f}x")
