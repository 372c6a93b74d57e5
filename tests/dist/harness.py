"""Helpers for the process-level tests: run a command with a deadline and
capture what it printed, and assert on it with readable failures."""
import array
import glob
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

passed = 0
failed = 0


def job_env(env=None):
    """The environment for a launch: this one without a rank's variables
    (a test may itself run under a launcher), plus `env`."""
    full_env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        full_env.pop(k, None)
    full_env.update(env or {})
    return full_env


def run(cmd, env=None, timeout=60, **kwargs):
    """Runs cmd; returns (exit code, combined output, seconds taken). A run
    past `timeout` is killed and returns exit code None."""
    full_env = job_env(env)
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True, errors="replace", start_new_session=True, **kwargs)
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        return None, out + f"\n[killed: still running after {timeout} s]", time.monotonic() - start
    return proc.returncode, proc.stdout, time.monotonic() - start


class Job:
    """A command (a launcher run, say) whose output is collected in the
    background while the test acts on it: waits for a line, signals it."""

    def __init__(self, cmd, env=None):
        self.start = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=job_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self):
        return "".join(self.lines)

    def wait_for(self, pattern, count=1, timeout=60):
        """The first `count` matches of `pattern` in the output, once there
        are that many; None if the job ends or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [m for m in (re.search(pattern, l) for l in list(self.lines)) if m]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        return None

    def pids(self, n, timeout=60):
        found = self.wait_for(r"\[rank (\d+)\] ready pid=(\d+)", n, timeout)
        return {int(m.group(1)): int(m.group(2)) for m in found} if found else {}

    def rank_pid(self, rank):
        """The pid of the launcher's child with RANK=`rank` (None if gone)."""
        children = subprocess.run(["pgrep", "-P", str(self.proc.pid)], stdout=subprocess.PIPE, text=True).stdout
        for pid in children.split():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"RANK={rank}".encode() in f.read().split(b"\0"):
                        return int(pid)
            except OSError:
                continue
        return None

    def signal(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout=120):
        """(exit code, output, seconds since the start); a job still running
        after `timeout` is killed and gives None."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = None
        self.reader.join(timeout=5)
        return code, self.output(), time.monotonic() - self.start

    def stop(self):
        self.signal(signal.SIGTERM)
        return self.wait(30)


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


def run_dump(launcher, program, nproc, flags, path, label):
    """Runs a *_hf_dump program on `nproc` ranks, writing `path`; checks
    "<label>: <program> ran" and returns the file's (metadata, tensors),
    or (None, None) when it failed. Needs the safetensors package
    (install_transformers brings it)."""
    from safetensors import safe_open

    code, out, _ = run([launcher, "--nproc_per_node", str(nproc), "--master_port", "0", "--max_run_s", "200",
                        "--", program, *flags, f"--out={path}"], timeout=240)
    check(f"{label}: {os.path.basename(program)} ran", code == 0, out[-3000:])
    if code != 0:
        return None, None
    with safe_open(path, "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


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
