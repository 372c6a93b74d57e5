"""Bad input fails before any work with a message that names the value:
invalid WORLD_SIZE/RANK, unreachable master, port in use, unknown flags, and
the launcher's own flags and program."""
import argparse
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import check, expect, finish, free_port, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--probe", required=True)
args = parser.parse_args()
P = args.probe


def fails(name, cmd, pattern, env=None, timeout=60):
    code, out, _ = run(cmd, env=env, timeout=timeout)
    check(f"{name}: exits non-zero", code != 0, f"  exit code {code}\n{out}")
    expect(f"{name}: message", out, pattern)


SECRET = "bad-input-test-secret-0123"
dist = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "TESSEL_JOB_SECRET": SECRET}
fails("WORLD_SIZE not a number", [P], r"WORLD_SIZE='four' is not an integer; expected a positive integer",
      env={**dist, "WORLD_SIZE": "four", "RANK": "0"})
fails("RANK >= WORLD_SIZE", [P], r"RANK=4 is out of range; expected 0 <= RANK < WORLD_SIZE=4",
      env={**dist, "WORLD_SIZE": "4", "RANK": "4"})
fails("RANK negative", [P], r"RANK=-2 is out of range", env={**dist, "WORLD_SIZE": "2", "RANK": "-2"})
fails("RANK without WORLD_SIZE", [P], r"RANK=1 is set but WORLD_SIZE is not", env={"RANK": "1"})
fails("MASTER_PORT not a number", [P], r"MASTER_PORT='http' is not an integer",
      env={**dist, "MASTER_PORT": "http", "WORLD_SIZE": "2", "RANK": "1"})

# Unreachable master: nothing listens on the port.
fails("unreachable master", [P, "--rendezvous_timeout_s=2"],
      r"cannot reach the rendezvous master at MASTER_ADDR=127.0.0.1 MASTER_PORT=\d+ within 2 s",
      env={**dist, "WORLD_SIZE": "2", "RANK": "1"})
fails("unresolvable master", [P, "--rendezvous_timeout_s=1"],
      r"cannot reach the rendezvous master at MASTER_ADDR=no-such-host.invalid",
      env={**dist, "MASTER_ADDR": "no-such-host.invalid", "WORLD_SIZE": "2", "RANK": "1"})

# Port in use: rank 0 cannot serve the store on a port someone holds.
with socket.socket(socket.AF_INET6) as holder:
    holder.bind(("::", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    fails("port in use", [P], rf"MASTER_PORT {busy} is already in use on 127.0.0.1",
          env={**dist, "MASTER_PORT": str(busy), "WORLD_SIZE": "2", "RANK": "0"})

# The job secret: required for several ranks, checked for length, and a
# secret file must be private.
no_secret = {k: v for k, v in dist.items() if k != "TESSEL_JOB_SECRET"}
fails("no job secret", [P], r"WORLD_SIZE=2 but no job secret is set: give every rank the same TESSEL_JOB_SECRET",
      env={**no_secret, "WORLD_SIZE": "2", "RANK": "1"})
fails("short job secret", [P], r"the job secret from TESSEL_JOB_SECRET has 5 characters; expected 16\.\.4096",
      env={**dist, "TESSEL_JOB_SECRET": "short", "WORLD_SIZE": "2", "RANK": "1"})
import tempfile  # noqa: E402
with tempfile.NamedTemporaryFile("w", suffix=".secret") as f:
    f.write("a-long-enough-secret-value\n")
    f.flush()
    os.chmod(f.name, 0o644)
    fails("world-readable secret file", [P], rf"the job secret file '{f.name}' is readable by other users \(mode 0644\)",
          env={**no_secret, "TESSEL_JOB_SECRET_FILE": f.name, "WORLD_SIZE": "2", "RANK": "1"})
    fails("launcher: world-readable secret file", [args.launcher, "--secret_file", f.name, "--", P],
          rf"the job secret file '{f.name}' is readable by other users")
fails("launcher: several nodes need a shared secret", [args.launcher, "--nnodes=2", "--", P],
      r"--nnodes=2 needs a job secret shared by every node")
fails("bad TESSEL_ timeout variable", [P], r"environment variable TESSEL_COMM_TIMEOUT_S='soon' is not a valid value for --comm_timeout_s",
      env={"TESSEL_COMM_TIMEOUT_S": "soon"})

# Unknown flags, for programs and for the launcher.
fails("unknown program flag", [P, "--no_such_flag=1"], r"unknown command line flag 'no_such_flag'")
fails("bad timeout flag", [P, "--comm_timeout_s=0"], r"--comm_timeout_s=0 must be a positive number of seconds")
L = args.launcher
fails("unknown launcher flag", [L, "--nprocs=2", "--", P], r"unknown command line flag 'nprocs'")
fails("nproc_per_node 0", [L, "--nproc_per_node=0", "--", P], r"--nproc_per_node=0 is invalid; expected 1..4096")
fails("node_rank out of range", [L, "--nnodes=2", "--node_rank=2", "--", P],
      r"--node_rank=2 is invalid; expected 0 <= node_rank < nnodes=2")
fails("master_port out of range", [L, "--master_port=70000", "--", P], r"--master_port=70000 is invalid")
fails("no program", [L, "--nproc_per_node=2"], r"no program given; usage: tessel-launch")
fails("missing program", [L, "--", "./no/such/program"], r"program './no/such/program' does not exist")
fails("program not on PATH", [L, "--", "no-such-program-xyz"], r"program 'no-such-program-xyz' was not found on PATH")

code, out, _ = run([L, "--help"])
expect("launcher --help explains usage", out, r"usage: tessel-launch \[flags\] -- PROGRAM")

finish()
