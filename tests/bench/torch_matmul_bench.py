"""PyTorch's CPU matmul on the shapes of gemm_shapes.h, timed like
gemm_timer.h (best of three batches). Run by matmul_vs_peers.py with
OPENBLAS_CORETYPE=Cooperlake and the same thread count as tessel."""
import json
import re
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
header = open(sys.argv[3]).read()
torch.set_num_threads(threads)
for name, m, n, k in re.findall(r'\{"([^"]+)", (\d+), (\d+), (\d+)\}', header):
    m, n, k = int(m), int(n), int(k)
    a, b = torch.full((m, k), 0.5), torch.full((k, n), 0.25)
    c = torch.empty(m, n)
    torch.matmul(a, b, out=c)
    t0 = time.perf_counter()
    torch.matmul(a, b, out=c)
    once = time.perf_counter() - t0
    iters = max(1, int(seconds / 3 / max(once, 1e-6)))
    best = 1e30
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.matmul(a, b, out=c)
        best = min(best, (time.perf_counter() - t0) / iters)
    print(json.dumps({"impl": "torch", "shape": name, "gflops": round(2 * m * n * k / best / 1e9, 1)}), flush=True)
