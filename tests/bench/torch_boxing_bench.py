"""PyTorch's gloo doing the same transfers as boxing_bench.cc, measured the
same way (slowest rank's mean). Gloo in PyTorch 1.13 has no reduce_scatter,
so P->S(0) is all_reduce plus taking one's chunk, as a gloo user must.
S(0)->S(1) is all_to_all_single with the packing it needs."""
import argparse
import json
import time

import torch
import torch.distributed as dist
from torch_peer import slowest

parser = argparse.ArgumentParser()
parser.add_argument("--sizes_mib", default="1,64")
parser.add_argument("--seconds_per_case", type=float, default=1.0)
args = parser.parse_args()

dist.init_process_group("gloo")
p, rank = dist.get_world_size(), dist.get_rank()
torch.set_num_threads(1)



for mib in (int(s) for s in args.sizes_mib.split(",")):
    elements = mib * (1 << 20) // 4
    rows = 1
    while rows * rows < elements:
        rows *= 2
    cols = elements // rows
    full = torch.rand(rows, cols)
    mine = full.chunk(p, 0)[rank].contiguous()

    def p_to_b():
        t = full.clone()
        dist.all_reduce(t)
        return t

    def s_to_b():
        parts = [torch.empty_like(mine) for _ in range(p)]
        dist.all_gather(parts, mine)
        return torch.cat(parts, 0)

    def p_to_s():
        t = full.clone()
        dist.all_reduce(t)
        return t.chunk(p, 0)[rank].contiguous()

    def s0_to_s1():
        send = torch.cat([c.contiguous().view(-1) for c in mine.chunk(p, 1)])
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return torch.cat([c.view(rows // p, cols // p) for c in recv.chunk(p)], 0)

    for name, fn in (("P->B", p_to_b), ("S(0)->B", s_to_b), ("P->S(0)", p_to_s), ("S(0)->S(1)", s0_to_s1)):
        fn()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        once = slowest(time.perf_counter() - t0)
        iters = max(3, int(args.seconds_per_case / max(once, 1e-6)))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        us = slowest(time.perf_counter() - t0) / iters * 1e6
        if rank == 0:
            print(json.dumps({"impl": "torch-gloo", "case": name, "bytes": rows * cols * 4, "iters": iters,
                              "us": round(us, 1)}), flush=True)
dist.destroy_process_group()
