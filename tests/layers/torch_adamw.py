"""torch.optim.AdamW on the parameters and gradients tessel's optimizer test
wrote (f32, raw bytes): runs its steps with the learning rates given and
writes the parameters after each step, for the C++ test to compare.

  torch_adamw.py DIR   reads DIR/case.json, DIR/w0_<i>.bin, DIR/g<step>_<i>.bin
                       writes DIR/torch_w<step>_<i>.bin
"""
import json
import os
import sys

import numpy as np
import torch

d = sys.argv[1]
case = json.load(open(os.path.join(d, "case.json")))
params = []
for i, shape in enumerate(case["shapes"]):
    w = np.fromfile(os.path.join(d, f"w0_{i}.bin"), dtype=np.float32).reshape(shape)
    params.append(torch.nn.Parameter(torch.from_numpy(w.copy())))
# tessel decays matrices, not vectors (biases, norms): one group each.
groups = [{"params": [p], "weight_decay": case["weight_decay"] if decays else 0.0}
          for p, decays in zip(params, case["decays"])]
opt = torch.optim.AdamW(groups, lr=case["lrs"][0], betas=(case["beta1"], case["beta2"]), eps=case["eps"])
for step, lr in enumerate(case["lrs"]):
    for group in opt.param_groups:
        group["lr"] = lr
    for i, (p, shape) in enumerate(zip(params, case["shapes"])):
        g = np.fromfile(os.path.join(d, f"g{step}_{i}.bin"), dtype=np.float32).reshape(shape)
        p.grad = torch.from_numpy(g.copy())
    opt.step()
    for i, p in enumerate(params):
        p.detach().numpy().astype(np.float32).tofile(os.path.join(d, f"torch_w{step}_{i}.bin"))
