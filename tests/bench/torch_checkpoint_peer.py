"""The PyTorch peer of checkpoint_io_bench: one process saves (torch.save,
then fsync) and loads (torch.load, the file dropped from the page cache
first) a state dict of the tensors a tessel checkpoint's index lists, with
the same shapes and dtypes. Prints one JSON line: bytes, save_s, load_s."""
import argparse
import json
import os
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--index", required=True, help="index.json of a tessel checkpoint")
parser.add_argument("--out", required=True, help="file to write")
args = parser.parse_args()

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32,
          "I64": torch.int64, "BOOL": torch.bool}
index = json.load(open(args.index))
gen = torch.Generator().manual_seed(0)
state = {}
for name, t in index["tensors"].items():
    dtype = DTYPES[t["dtype"]]
    state[name] = (torch.randn(t["shape"], generator=gen).to(dtype) if dtype.is_floating_point
                   else torch.zeros(t["shape"], dtype=dtype))
nbytes = sum(v.numel() * v.element_size() for v in state.values())

start = time.monotonic()
with open(args.out, "wb") as f:
    torch.save(state, f)
    f.flush()
    os.fsync(f.fileno())
save_s = time.monotonic() - start
fd = os.open(args.out, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
del state
start = time.monotonic()
loaded = torch.load(args.out)
load_s = time.monotonic() - start
assert len(loaded) == len(index["tensors"])
print(json.dumps({"bytes": nbytes, "file_bytes": os.path.getsize(args.out), "save_s": save_s, "load_s": load_s}))
os.remove(args.out)
