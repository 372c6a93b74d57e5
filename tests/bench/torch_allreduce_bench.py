"""PyTorch's gloo all-reduce, measured the same way as allreduce_bench.cc.
Launch it with tessel-launch, whose variables are torchrun's:
    tessel-launch --nproc_per_node 4 -- python3 torch_allreduce_bench.py"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from torch_peer import slowest

parser = argparse.ArgumentParser()
parser.add_argument("--min_bytes", type=int, default=1 << 10)
parser.add_argument("--max_bytes", type=int, default=64 << 20)
parser.add_argument("--step", type=int, default=4)
parser.add_argument("--seconds_per_size", type=float, default=0.5)
args = parser.parse_args()

dist.init_process_group("gloo")
p, rank = dist.get_world_size(), dist.get_rank()
torch.set_num_threads(1)

nbytes = args.min_bytes
while nbytes <= args.max_bytes:
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    dist.all_reduce(buf)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    once = slowest(time.perf_counter() - t0)
    iters = int(min(1000, max(3, args.seconds_per_size / max(once, 1e-6))))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    secs = slowest(time.perf_counter() - t0)
    us = secs / iters * 1e6
    algbw = nbytes / (us * 1e-6) / 1e9
    if rank == 0:
        print(json.dumps({"impl": "torch-gloo", "ranks": p, "bytes": nbytes, "iters": iters, "us": round(us, 2),
                          "algbw_gbps": round(algbw, 4), "busbw_gbps": round(algbw * 2 * (p - 1) / p, 4)}),
              flush=True)
    nbytes *= args.step
dist.destroy_process_group()
