"""PyTorch's eager dispatch on the same tiny ops as dispatch_bench (no
autograd), for the ratio in docs/benchmarks.md. Prints JSON lines."""
import json
import time

import torch

torch.set_num_threads(1)
ITER = 200000


def micros(fn):
    for _ in range(1000):
        fn()
    start = time.perf_counter()
    for _ in range(ITER):
        fn()
    return (time.perf_counter() - start) / ITER * 1e6


with torch.no_grad():
    a, b = torch.full((4,), 1.0), torch.full((4,), 2.0)
    print(json.dumps({"case": "local add [4]", "us": round(micros(lambda: torch.add(a, b)), 3)}))
    print(json.dumps({"case": "mul scalar [4]", "us": round(micros(lambda: torch.mul(a, 0.5)), 3)}))
