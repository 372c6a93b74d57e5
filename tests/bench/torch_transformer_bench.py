"""The transformer stack of transformer_bench.cc in PyTorch (same sizes,
same math, same thread count), forward+backward, best of --iters, with
PyTorch at its best: the manual blocks take a precomputed additive causal
mask and fold the score scale and the mask into one baddbmm (the same
fusion tessel's scale_mask_softmax does), and PyTorch's own
nn.TransformerEncoderLayer (pre-LN, GELU, no dropout) is timed too. One JSON
line per variant, and "impl": "torch" for the fastest."""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
for name, default in (("layers", 4), ("batch", 4), ("seq", 128), ("hidden", 256), ("heads", 4), ("iters", 5),
                      ("threads", 2)):
    p.add_argument(f"--{name}", type=int, default=default)
a = p.parse_args()
torch.set_num_threads(a.threads)
h, nh = a.hidden, a.heads
hd = h // nh


def param(*shape, scale):
    return (torch.randn(*shape) * scale).requires_grad_(True)


blocks = []
for _ in range(a.layers):
    blocks.append(dict(ln1_g=torch.ones(h, requires_grad=True), ln1_b=torch.zeros(h, requires_grad=True),
                       w_qkv=param(h, 3 * h, scale=0.02), b_qkv=torch.zeros(3 * h, requires_grad=True),
                       w_o=param(h, h, scale=0.02), b_o=torch.zeros(h, requires_grad=True),
                       ln2_g=torch.ones(h, requires_grad=True), ln2_b=torch.zeros(h, requires_grad=True),
                       w_1=param(h, 4 * h, scale=0.02), b_1=torch.zeros(4 * h, requires_grad=True),
                       w_2=param(4 * h, h, scale=0.02), b_2=torch.zeros(h, requires_grad=True)))
x0 = torch.randn(a.batch, a.seq, h)
causal = torch.ones(a.seq, a.seq, dtype=torch.bool).tril()
# Built once: 0 where a position may attend, -inf elsewhere.
additive_mask = torch.zeros(a.seq, a.seq).masked_fill(~causal, float("-inf"))
batched_mask = additive_mask.expand(a.batch * nh, a.seq, a.seq)


def forward(x):
    for k in blocks:
        y = F.layer_norm(x, (h,), k["ln1_g"], k["ln1_b"])
        qkv = (y @ k["w_qkv"] + k["b_qkv"]).view(a.batch, a.seq, 3, nh, hd).permute(2, 0, 3, 1, 4)
        q, kk, v = qkv[0], qkv[1], qkv[2]
        q, kk, v = (t.reshape(a.batch * nh, a.seq, hd) for t in (q, kk, v))
        scores = torch.baddbmm(batched_mask, q, kk.transpose(-1, -2), alpha=1.0 / math.sqrt(hd))
        probs = F.softmax(scores, dim=-1)
        ctx = (probs @ v).view(a.batch, nh, a.seq, hd).permute(0, 2, 1, 3).reshape(a.batch, a.seq, h)
        x = x + ctx @ k["w_o"] + k["b_o"]
        m = F.gelu(F.layer_norm(x, (h,), k["ln2_g"], k["ln2_b"]) @ k["w_1"] + k["b_1"])
        x = x + m @ k["w_2"] + k["b_2"]
    return x


encoder = torch.nn.Sequential(*[
    torch.nn.TransformerEncoderLayer(h, nh, dim_feedforward=4 * h, dropout=0.0, activation="gelu",
                                     batch_first=True, norm_first=True) for _ in range(a.layers)])


def forward_nn(x):
    for layer in encoder:
        x = layer(x, src_mask=additive_mask)
    return x


def time_best(fn, params):
    best = 1e30
    for it in range(a.iters + 1):
        for t in params:
            t.grad = None
        t0 = time.perf_counter()
        loss = fn(x0).mean()
        loss.backward()
        if it > 0:
            best = min(best, time.perf_counter() - t0)
    return best * 1e3


results = {"torch-manual": time_best(forward, [t for k in blocks for t in k.values()]),
           "torch-nn.TransformerEncoderLayer": time_best(forward_nn, list(encoder.parameters()))}
for impl, ms in results.items():
    print(json.dumps({"impl": impl, "ms": round(ms, 2)}), flush=True)
print(json.dumps({"impl": "torch", "ms": round(min(results.values()), 2), "best_of": min(results, key=results.get)}),
      flush=True)
