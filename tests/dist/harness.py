"""Helpers for the process-level tests: run a command with a deadline and
capture what it printed, and assert on it with readable failures."""
import array
import glob
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time

passed = 0
failed = 0


def run(cmd, env=None, timeout=60, **kwargs):
    """Runs cmd; returns (exit code, combined output, seconds taken). A run
    past `timeout` is killed and returns exit code None."""
    full_env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        full_env.pop(k, None)
    full_env.update(env or {})
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True, start_new_session=True, **kwargs)
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        return None, out + f"\n[killed: still running after {timeout} s]", time.monotonic() - start
    return proc.returncode, proc.stdout, time.monotonic() - start


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
        print(f"[ OK ] {name}")
    else:
        failed += 1
        print(f"[FAIL] {name}\n{detail}")


def expect(name, output, pattern):
    check(name, re.search(pattern, output) is not None,
          f"  expected /{pattern}/ in the output:\n" + "\n".join("  | " + l for l in output.splitlines()))


def install_transformers(directory):
    """Installs Hugging Face transformers 4.40 (a version that works with
    Debian's PyTorch 1.13) from PyPI into `directory`/pydeps and puts it on
    sys.path; checks it, and ends the test (finish) if pip fails."""
    deps = os.path.join(directory, "pydeps")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--target", deps, "transformers==4.40.2", "numpy<2"], capture_output=True, text=True)
    check("pip installs transformers 4.40.2", pip.returncode == 0, pip.stderr[-2000:])
    if pip.returncode != 0:
        finish()
    sys.path.insert(0, deps)


def read_f32(path, name):
    """Tensor `name` (f32) of a safetensors file, as a flat list of floats."""
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        entry = header[name]
        assert entry["dtype"] == "F32", f"{path}: {name} is {entry['dtype']}, not F32"
        begin, end = entry["data_offsets"]
        f.seek(8 + header_size + begin)
        values = array.array("f")
        values.frombytes(f.read(end - begin))
    return values.tolist()


def poke_f32(path, name, index, value):
    """Writes `value` over element `index` of f32 tensor `name` of a
    safetensors file, in place."""
    with open(path, "r+b") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(header_size))[name]
        assert entry["dtype"] == "F32", f"{path}: {name} is {entry['dtype']}, not F32"
        f.seek(8 + header_size + entry["data_offsets"][0] + 4 * index)
        f.write(struct.pack("<f", value))


def checkpoint_tensor(directory, iteration, name):
    """Tensor `name` of a one-process tessel checkpoint saved at `iteration`
    under `directory` (train.checkpoint_dir), as a flat list of floats."""
    shards = glob.glob(os.path.join(directory, f"iter_{iteration:07d}", "shard-*.safetensors"))
    assert len(shards) == 1, f"expected one shard at iteration {iteration} in {directory}: {shards}"
    return read_f32(shards[0], name)


def finish():
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
