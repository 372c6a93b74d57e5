"""PyTorch reference for the kernel parity test. Reads DIR/cases.json
(written by kernel_parity_test), computes every case's outputs and the
gradients of its float inputs for the given upstream gradients, and writes
them as raw little-endian files next to the inputs.

    python3 torch_reference.py DIR [--device cuda]

With --device cuda, PyTorch computes on the GPU (TF32 off, as tessel's f32
default) and the results are copied back for the comparison.
"""
import argparse
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

DEVICE = "cpu"
DTYPES = {"f32": (np.float32, torch.float32), "i64": (np.int64, torch.int64), "bool": (np.bool_, torch.bool),
          "f16": (np.float16, torch.float16), "bf16": (np.int16, torch.bfloat16)}


def load(d, spec):
    """A tensor as the test wrote it. f16 and bf16 values are widened to f32:
    the reference computes in f32 from the rounded values the kernel saw."""
    np_type, torch_type = DTYPES[spec["dtype"]]
    arr = np.fromfile(os.path.join(d, spec["file"]), dtype=np_type).reshape(spec["shape"])
    t = torch.from_numpy(arr.copy())
    if spec["dtype"] == "bf16":
        t = t.view(torch.bfloat16)  # numpy has no bf16: the bits were read as int16
    if spec["dtype"] in ("f16", "bf16"):
        t = t.float()
    t = t.to(DEVICE)
    if t.is_floating_point() and spec.get("grad", False):
        t.requires_grad_(True)
    return t


def softmax(x, a):
    s = x * a["scale"]
    keep = torch.ones_like(s, dtype=torch.bool)
    if "mask" in a:
        keep = keep & a["mask"]
    if a.get("causal"):
        q, k = s.shape[-2], s.shape[-1]
        keep = keep & torch.ones(q, k, dtype=torch.bool, device=s.device).tril(k - q)
    return F.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)


def rotary(x, positions, a):
    """Hugging Face's Llama rotary embeddings (rotate half), with Llama 3's
    frequency scaling (transformers' _compute_llama3_parameters) when asked."""
    d = x.shape[-1]
    inv_freq = 1.0 / (a["theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if a.get("scaling_factor", 0) > 0:
        factor, low, high = a["scaling_factor"], a["low_freq_factor"], a["high_freq_factor"]
        context = a["original_max_positions"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (context / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen < context / high, inv_freq,
                               torch.where(wavelen > context / low, inv_freq / factor, blended))
    pos = positions if positions.dim() == 2 else positions[None, :]
    freqs = pos.float()[..., None] * inv_freq.to(x.device)[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]
    half = torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)
    return x * cos + half * sin


def run(op, ins, a):
    if op == "rms_norm":
        x, w = ins
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a["eps"]))
    if op == "swiglu":
        return F.silu(ins[0]) * ins[1]
    if op == "rotary":
        return rotary(ins[0], ins[1], a)
    if op == "matmul":
        x, y = ins
        return torch.matmul(x.mT if a["ta"] else x, y.mT if a["tb"] else y)
    if op == "linear":
        return torch.matmul(ins[0], ins[1]) + ins[2]
    if op == "linear_residual":
        return torch.matmul(ins[0], ins[1]) + ins[2] + ins[3]
    if op == "linear_gelu_tanh":
        return F.gelu(torch.matmul(ins[0], ins[1]) + ins[2], approximate="tanh")
    if op in ("add", "sub", "mul", "div"):
        return getattr(torch, op)(ins[0], ins[1])
    if op.endswith("_scalar"):
        return getattr(torch, op[: -len("_scalar")])(ins[0], a["scalar"])
    if op in ("relu", "tanh", "exp", "neg"):
        return getattr(torch, op)(ins[0])
    if op == "gelu":
        return F.gelu(ins[0])
    if op == "gelu_tanh":
        return F.gelu(ins[0], approximate="tanh")
    if op in ("sum", "mean"):
        return getattr(torch, op)(ins[0], dim=a["axes"], keepdim=a["keepdim"])
    if op == "max":
        return torch.amax(ins[0], dim=a["axes"], keepdim=a["keepdim"])
    if op == "softmax":
        if len(ins) > 1:
            a = dict(a, mask=ins[1])
        return softmax(ins[0], a)
    if op == "split_qkv":  # q, k, v stacked on the batch dim
        b, s, h, d3 = ins[0].shape
        return ins[0].reshape(b, s, h, 3, d3 // 3).permute(3, 0, 2, 1, 4).reshape(3 * b, h, s, d3 // 3)
    if op == "merge_qkv":
        b, h, s, d = ins[0].shape
        return torch.stack(ins, 3).permute(0, 2, 1, 3, 4).reshape(b, s, h, 3 * d)
    if op == "qkv_attention":  # x [b, s, heads, 3 d] -> [b, s, heads, d]
        b, s, h, d3 = ins[0].shape
        q, k, v = ins[0].reshape(b, s, h, 3, d3 // 3).permute(3, 0, 2, 1, 4).contiguous()
        return torch.matmul(softmax(torch.matmul(q, k.mT), a), v).permute(0, 2, 1, 3).contiguous()
    if op == "attention":
        q, k, v = ins
        return torch.matmul(softmax(torch.matmul(q, k.mT), a), v)
    if op == "layer_norm":
        x, g, b = ins
        return F.layer_norm(x, (x.shape[-1],), g, b, a["eps"])
    if op == "cross_entropy_mean":
        return F.cross_entropy(ins[0], ins[1], ignore_index=a["ignore_index"])
    if op == "cross_entropy":
        return F.cross_entropy(ins[0], ins[1], ignore_index=a["ignore_index"], reduction="none")
    if op == "transpose":
        return ins[0].transpose(a["dim0"], a["dim1"])
    if op == "reshape":
        return ins[0].reshape(a["shape"])
    if op == "permute":
        return ins[0].permute(a["perm"])
    if op == "slice":
        return ins[0].narrow(a["dim"], a["begin"], a["end"] - a["begin"])
    if op == "concat":
        return torch.cat(ins, a["dim"])
    if op == "split_swap":
        parts = torch.split(ins[0], a["sizes"], a["dim"])
        return torch.cat([parts[1], parts[0]], a["dim"])
    if op == "log":
        return torch.log(ins[0])
    if op == "where":
        return torch.where(ins[0], ins[1], ins[2])
    if op == "masked_fill":
        return ins[0].masked_fill(ins[1], a["value"])
    if op == "embedding":
        return F.embedding(ins[1], ins[0])
    if op == "embedding_padding":
        return F.embedding(ins[1], ins[0], padding_idx=a["padding_idx"])
    if op == "expand":
        return ins[0].expand(*a["shape"])
    if op == "unpatchify":
        # [B, patches, C*p*p] (patches row-major, each flattened as
        # (channel, row, column)) back to images [B, C, H, W].
        b, c, h, w = a["image_shape"]
        p = a["patch"]
        x = ins[0].reshape(b, h // p, w // p, c, p, p)
        return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    if op == "pick":
        x, y = ins
        keep = y != a["ignore_index"]
        picked = x.gather(1, torch.where(keep, y, torch.zeros_like(y)).unsqueeze(1)).squeeze(1)
        return torch.where(keep, picked, torch.zeros_like(picked))
    if op == "patch_embed":
        x, w, b = ins
        return F.conv2d(x, w, b, stride=a["patch"]).flatten(2).transpose(1, 2)
    if op == "global_norm":
        return torch.sqrt(sum((t * t).sum() for t in ins))
    if op in ("adamw3", "sgd3"):
        p = ins[0].clone().requires_grad_(True)
        if op == "adamw3":
            opt = torch.optim.AdamW([p], lr=a["lr"], weight_decay=a["weight_decay"])
        else:
            opt = torch.optim.SGD([p], lr=a["lr"], momentum=a["momentum"], weight_decay=a["weight_decay"])
        for _ in range(3):
            p.grad = ins[1].clone()
            opt.step()
        return p.detach()
    if op == "cast_roundtrip":
        low = {"bf16": torch.bfloat16, "f16": torch.float16}[a["dtype"]]
        return ins[0].to(low).to(torch.float32)
    raise ValueError(f"unknown op {op}")


def save(path, t):
    """Raw f32 data, and PyTorch's own shape beside it (path.shape), so the
    test compares shapes instead of reading the data with its own."""
    t.cpu().numpy().astype(np.float32).tofile(path)
    with open(path + ".shape", "w") as f:
        f.write(" ".join(str(d) for d in t.shape))


def main(d):
    torch.set_num_threads(1)
    with open(os.path.join(d, "cases.json")) as f:
        cases = json.load(f)
    for case in cases:
        ins = [load(d, s) for s in case["inputs"]]
        out = run(case["op"], ins, case["attrs"])
        save(os.path.join(d, case["name"] + ".out"), out.detach())
        wanted = [t for t in ins if t.requires_grad]
        if wanted:
            dy = load(d, {"file": case["name"] + ".dy", "shape": list(out.shape),
                          "dtype": case.get("dy_dtype", "f32")})
            grads = torch.autograd.grad(out, wanted, grad_outputs=dy)
            for i, g in enumerate(grads):
                save(os.path.join(d, f"{case['name']}.grad{i}"), g)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    DEVICE = args.device
    if DEVICE == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    main(args.dir)
