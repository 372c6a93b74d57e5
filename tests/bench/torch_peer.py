"""Shared by the PyTorch peer benchmarks (run with Debian's python3-torch
under tessel-launch)."""
import torch
import torch.distributed as dist


def slowest(seconds):
    """The slowest rank's time: a collective is done when all ranks are."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
