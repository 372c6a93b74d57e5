"""PyTorch modules for module_parity_test: loads tessel's weights (mapping
layouts: tessel's Linear weight is [in, out], its fused QKV is head-major),
runs forward and backward with the given upstream gradient, and writes the
output and the gradients of the input and of every parameter, in tessel's
parameter order, as raw f32 files.

    python3 torch_modules.py DIR
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

d = sys.argv[1]
torch.set_num_threads(1)


def load(name, shape, dtype=np.float32):
    return torch.from_numpy(np.fromfile(os.path.join(d, name), dtype=dtype).reshape(shape).copy())


def head_major_to_torch(w_in_out, b, heads):
    """tessel qkv weight [H, 3H], features (head, q|k|v, hd) -> torch in_proj [3H, H], rows (q|k|v, head, hd)."""
    h = w_in_out.shape[0]
    hd = h // heads
    w = w_in_out.reshape(h, heads, 3, hd).permute(2, 1, 3, 0).reshape(3 * h, h)
    return w, b.reshape(heads, 3, hd).permute(1, 0, 2).reshape(3 * h)


def torch_to_head_major(g_w, g_b, heads):
    h = g_w.shape[1]
    hd = h // heads
    w = g_w.reshape(3, heads, hd, h).permute(3, 1, 0, 2).reshape(h, 3 * h)
    return w, g_b.reshape(3, heads, hd).permute(1, 0, 2).reshape(3 * h)


def set_mha(mha, p, prefix, heads):
    w, b = head_major_to_torch(p[prefix + "qkv.weight"], p[prefix + "qkv.bias"], heads)
    mha.in_proj_weight.data.copy_(w)
    mha.in_proj_bias.data.copy_(b)
    mha.out_proj.weight.data.copy_(p[prefix + "out.weight"].t())
    mha.out_proj.bias.data.copy_(p[prefix + "out.bias"])


def mha_grads(mha, prefix, heads):
    gw, gb = torch_to_head_major(mha.in_proj_weight.grad, mha.in_proj_bias.grad, heads)
    return {prefix + "qkv.weight": gw, prefix + "qkv.bias": gb, prefix + "out.weight": mha.out_proj.weight.grad.t(),
            prefix + "out.bias": mha.out_proj.bias.grad}


with open(os.path.join(d, "cases.json")) as f:
    cases = json.load(f)
for c in cases:
    p = {n: load(f"{c['name']}.p{i}", s) for i, (n, s) in enumerate(zip(c["params"], c["param_shapes"]))}
    x = load(c["name"] + ".x", c["x_shape"], np.int64 if c["x_int"] else np.float32)
    if not c["x_int"]:
        x.requires_grad_(True)
    kind = c["kind"]
    grads = {}
    if kind == "linear":
        m = torch.nn.Linear(*p["weight"].shape)
        m.weight.data.copy_(p["weight"].t()); m.bias.data.copy_(p["bias"])
        y = m(x)
    elif kind == "embedding":
        m = torch.nn.Embedding(*p["weight"].shape)
        m.weight.data.copy_(p["weight"])
        y = m(x)
    elif kind == "layer_norm":
        m = torch.nn.LayerNorm(p["weight"].shape[0])
        m.weight.data.copy_(p["weight"]); m.bias.data.copy_(p["bias"])
        y = m(x)
    elif kind == "attention":
        h, heads = x.shape[-1], c["heads"]
        m = torch.nn.MultiheadAttention(h, heads, batch_first=True)
        set_mha(m, p, "", heads)
        s = x.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool).triu(1) if c["causal"] else None
        y = m(x, x, x, need_weights=False, attn_mask=mask)[0]
    elif kind == "transformer":
        h, heads = x.shape[-1], c["heads"]
        m = torch.nn.TransformerEncoderLayer(h, heads, dim_feedforward=p["mlp.fc1.weight"].shape[1], dropout=0.0,
                                             activation="gelu", batch_first=True, norm_first=True)
        m.norm1.weight.data.copy_(p["ln1.weight"]); m.norm1.bias.data.copy_(p["ln1.bias"])
        m.norm2.weight.data.copy_(p["ln2.weight"]); m.norm2.bias.data.copy_(p["ln2.bias"])
        set_mha(m.self_attn, p, "attention.", heads)
        m.linear1.weight.data.copy_(p["mlp.fc1.weight"].t()); m.linear1.bias.data.copy_(p["mlp.fc1.bias"])
        m.linear2.weight.data.copy_(p["mlp.fc2.weight"].t()); m.linear2.bias.data.copy_(p["mlp.fc2.bias"])
        y = m(x)
    elif kind == "patch_embedding":
        k = c["patch"]
        w, b = p["proj.weight"], p["proj.bias"]
        hidden, cin = w.shape[1], x.shape[1]
        m = torch.nn.Conv2d(cin, hidden, k, stride=k)
        m.weight.data.copy_(w.t().reshape(hidden, cin, k, k)); m.bias.data.copy_(b)
        y = m(x).flatten(2).transpose(1, 2)
    elif kind == "cross_entropy":
        labels = load(c["name"] + ".labels", c["labels_shape"], np.int64)
        y = F.cross_entropy(x.reshape(-1, x.shape[-1]), labels.reshape(-1), ignore_index=-100)
        m = None
    else:
        raise ValueError(kind)
    y.backward(load(c["name"] + ".dy", list(y.shape)))
    y.detach().numpy().astype(np.float32).tofile(os.path.join(d, c["name"] + ".out"))
    if not c["x_int"]:
        x.grad.numpy().astype(np.float32).tofile(os.path.join(d, c["name"] + ".gx"))
    # Parameter gradients in tessel's layouts and order.
    if kind == "linear":
        grads = {"weight": m.weight.grad.t(), "bias": m.bias.grad}
    elif kind == "embedding":
        grads = {"weight": m.weight.grad}
    elif kind == "layer_norm":
        grads = {"weight": m.weight.grad, "bias": m.bias.grad}
    elif kind == "attention":
        grads = mha_grads(m, "", c["heads"])
    elif kind == "patch_embedding":
        grads = {"proj.weight": m.weight.grad.reshape(m.weight.shape[0], -1).t(), "proj.bias": m.bias.grad}
    elif kind == "transformer":
        grads = {"ln1.weight": m.norm1.weight.grad, "ln1.bias": m.norm1.bias.grad,
                 "ln2.weight": m.norm2.weight.grad, "ln2.bias": m.norm2.bias.grad,
                 "mlp.fc1.weight": m.linear1.weight.grad.t(), "mlp.fc1.bias": m.linear1.bias.grad,
                 "mlp.fc2.weight": m.linear2.weight.grad.t(), "mlp.fc2.bias": m.linear2.bias.grad}
        grads.update(mha_grads(m.self_attn, "attention.", c["heads"]))
    for i, n in enumerate(c["params"]):
        grads[n].contiguous().numpy().astype(np.float32).tofile(os.path.join(d, f"{c['name']}.g{i}"))
