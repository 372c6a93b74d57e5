"""The launcher and the runtime never let a broken job hang:
- a killed rank stops the job quickly, and the launcher names it;
- a rank that never joins rendezvous makes the others time out, naming it;
- a rank that skips a collective makes the others time out, naming the op;
- ranks that ignore SIGTERM are still stopped (SIGKILL after the grace);
- a SIGTERM to the launcher gives the ranks --signal_grace_s, and a second
  one ends them at once;
- the launcher's memory stays bounded whatever a rank prints (a rank
  printing without pause, a 300 MB line), a slow reader loses nothing, and
  a rank killed while nobody reads the launcher's stdout still stops the job;
- no process of a job outlives it: not a wrapper script's program whose
  shell was killed, not a killed rank's children (setsid ones too), not
  the ranks of a launcher that was SIGKILLed.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import Job, check, expect, finish, run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--probe", required=True)
args = parser.parse_args()
L = [args.launcher, "--master_port", "0"]


def kill_one_rank(victim, extra_probe_args=(), launcher_args=()):
    """Starts 4 sleeping ranks, SIGKILLs `victim` once all are ready; returns
    (exit code, output, seconds from the kill to the launcher's exit)."""
    cmd = L + ["--nproc_per_node", "4", *launcher_args, "--", args.probe, "--mode=sleep", *extra_probe_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, pids = [], {}
    deadline = time.monotonic() + 60
    while len(pids) < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.match(r"\[rank (\d+)\] ready pid=(\d+)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
    if len(pids) < 4:
        proc.kill()
        return -1, "".join(lines) + proc.stdout.read(), 0.0
    killed_at = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    rest = []
    reader = threading.Thread(target=lambda: rest.append(proc.stdout.read()))
    reader.start()
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    reader.join()
    return code, "".join(lines) + "".join(rest), time.monotonic() - killed_at


# 1. SIGKILL one rank of four.
code, out, secs = kill_one_rank(2)
check("killed rank: launcher exits non-zero", code not in (0, -1), f"  exit code {code}\n{out}")
check(f"killed rank: launcher exits within 30 s (took {secs:.1f} s)", secs < 30)
expect("killed rank: launcher names rank 2 and the signal", out,
       r"tessel-launch: job failed: rank 2 \(pid \d+\) was killed by signal 9")

# 2. Ranks that ignore SIGTERM are SIGKILLed after --kill_grace_s.
code, out, secs = kill_one_rank(0, ["--ignore_sigterm"], ["--kill_grace_s", "2"])
check("stubborn ranks: launcher exits non-zero", code not in (0, -1), f"  exit code {code}\n{out}")
check(f"stubborn ranks: stopped after the grace period (took {secs:.1f} s)", 1.5 < secs < 30)
expect("stubborn ranks: the others were SIGKILLed", out, r"rank 3 was killed by signal 9")

# 2b. The launcher signalled from outside (a preemption): ranks that do not
# end get --signal_grace_s; a second signal ends them at once.
def signal_launcher(times):
    job = Job(L + ["--nproc_per_node", "4", "--signal_grace_s", "60", "--", args.probe, "--mode=sleep",
                   "--ignore_sigterm"])
    job.pids(4)
    job.signal(signal.SIGTERM)
    time.sleep(2)
    start = time.monotonic()
    for _ in range(times - 1):
        job.signal(signal.SIGTERM)
    code, out, _ = job.wait(10)
    return code, out, time.monotonic() - start


code, out, secs = signal_launcher(1)
check("one SIGTERM: ranks ignoring it still run after 2 s + 10 s (grace 60 s)", code is None, out[-2000:])
expect("one SIGTERM: the grace is said", out, r"received Terminated \(the ranks get --signal_grace_s=60 s")
code, out, secs = signal_launcher(2)
check(f"a second SIGTERM: the ranks are ended at once (took {secs:.1f} s, exit {code})", code == 143 and secs < 5,
      out[-2000:])
expect("a second SIGTERM: said", out, r"a second signal; ending the ranks now")
expect("a second SIGTERM: the ranks were SIGKILLed", out, r"rank 3 was killed by signal 9")

# 3. A rank that never joins rendezvous.
code, out, secs = run(L + ["--nproc_per_node", "4", "--", args.probe, "--mode=skip_init", "--odd_rank=3",
                           "--rendezvous_timeout_s=3"], timeout=120)
check("never joins: launcher exits non-zero", code != 0, f"  exit code {code}\n{out}")
check(f"never joins: fails after the 3 s timeout, not hangs (took {secs:.1f} s)", 2.5 < secs < 30)
expect("never joins: the error names the missing rank", out,
       r"rendezvous timed out after 3 s at rank \d: rank\(s\) 3 of WORLD_SIZE=4 never joined")

# 4. A rank that skips a collective.
code, out, secs = run(L + ["--nproc_per_node", "4", "--", args.probe, "--mode=hang_collective", "--odd_rank=1",
                           "--comm_timeout_s=3"], timeout=120)
check("skipped collective: launcher exits non-zero", code != 0, f"  exit code {code}\n{out}")
check(f"skipped collective: fails after the 3 s timeout (took {secs:.1f} s)", 2.5 < secs < 30)
expect("skipped collective: the error names op, group and rank", out,
       r"fatal error on rank \d: all_reduce timed out after 3 s on gloo group \[0, 1, 2, 3\] at group rank \d")

# 5. --max_run_s stops a job that runs too long.
code, out, secs = run(L + ["--nproc_per_node", "2", "--max_run_s", "2", "--", args.probe, "--mode=sleep"],
                      timeout=60)
check("max_run_s: exit code 124", code == 124, f"  exit code {code}\n{out}")
expect("max_run_s: says why", out, r"the job ran past --max_run_s=2")

# 6. The happy path: output prefixed with ranks, exit 0.
code, out, _ = run(L + ["--nproc_per_node", "3", "--", args.probe, "--mode=allreduce"], timeout=60)
check("happy path: exit 0", code == 0, out)
for r in range(3):
    expect(f"happy path: rank {r} prints the sum 6 with its prefix", out, rf"\[rank {r}\] all_reduce result 6")



def launcher_peak_kib(cmd, stdout, timeout=60):
    """Runs the launcher; returns (exit code, its own peak RSS in KiB, seconds),
    the peak read from /proc while it runs (its ranks not counted)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None and time.monotonic() - start < timeout:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                peak = max([peak] + [int(l.split()[1]) for l in f if l.startswith("VmHWM:")])
        except OSError:
            pass
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    return proc.wait(), peak, time.monotonic() - start


# 7. A rank printing without pause (`yes` for 8 s, its output to /dev/null):
# the launcher keeps up in bounded memory (it read to EAGAIN before, and
# grew by ~250 MB/s).
code, peak, secs = launcher_peak_kib(L + ["--nproc_per_node", "1", "--", "timeout", "8", "yes"], subprocess.DEVNULL)
check(f"a rank printing `yes` for 8 s: the launcher peaks at {peak / 1024:.1f} MiB (< 64 MiB)",
      code == 1 and 0 < peak < 64 * 1024, f"exit {code}")

# 8. One line of 300 MB without a newline: passed on in marked pieces, never
# held whole (it peaked at 864 MiB before); a slow reader gets every byte.
big = "import sys; sys.stdout.write('x' * 300_000_000)"
code, peak, secs = launcher_peak_kib(L + ["--nproc_per_node", "1", "--", sys.executable, "-c", big],
                                     subprocess.DEVNULL)
check(f"a 300 MB line: the launcher peaks at {peak / 1024:.1f} MiB (< 64 MiB)", code == 0 and 0 < peak < 64 * 1024,
      f"exit {code}")
proc = subprocess.Popen(L + ["--nproc_per_node", "1", "--", sys.executable, "-c", big], stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL)
pieces = total = 0
for line in proc.stdout:  # a reader slower than the rank: back-pressure, not loss
    pieces += 1
    total += len(line) - len(b"[rank 0] ") - 1
    if line.endswith(b" [line cut: continues]\n"):
        total -= len(b" [line cut: continues]")
code = proc.wait()
check(f"a 300 MB line reaches a slow reader whole, in {pieces} marked pieces", code == 0 and total == 300_000_000
      and pieces == -(-300_000_000 // 65536), f"exit {code}, {total} bytes")

# 9. The launcher's stdout is a pipe nobody reads (a paused pager) and rank 0
# fills it; rank 1 is SIGKILLed after 3 s. The job stops at once, and the
# launcher exits within seconds instead of hanging in a write.
err_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tessel_launch_stall_{os.getpid()}.err")


def with_stdout_unread(launch_args, timeout):
    """Runs the launcher with its stdout a pipe nobody reads and its stderr
    to a file; returns (exit code, seconds, what it said on stderr)."""
    with open(err_path, "w") as err:
        start = time.monotonic()
        proc = subprocess.Popen(L + launch_args, stdout=subprocess.PIPE, stderr=err)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        secs = time.monotonic() - start
        proc.stdout.close()
    with open(err_path) as f:
        said = f.read()
    os.remove(err_path)
    return code, secs, said


code, secs, said = with_stdout_unread(["--nproc_per_node", "2", "--", "sh", "-c",
                                       'if [ "$RANK" = 0 ]; then yes; else sleep 3; kill -9 $$; fi'], 30)
check(f"stdout unread: the killed rank stopped the job, the launcher exited {secs - 3:.1f} s after the kill (< 5 s)",
      code == 1 and secs < 8 and "job failed: rank 1" in said and "rank 0 was killed by signal 15" in said, said)

# 9b. The same unread stdout, and a rank that prints 100 MB then finishes:
# after 10 s without a read the launcher drops the output, says so, and the
# rank runs to its end instead of blocking in its write.
marker = err_path + ".done"
big = f"import sys; sys.stdout.write('x' * 99 + chr(10)); sys.stdout.write(('y' * 99 + chr(10)) * 1_000_000); " \
      f"sys.stdout.flush(); open({marker!r}, 'w').close()"
code, secs, said = with_stdout_unread(["--nproc_per_node", "1", "--", sys.executable, "-c", big], 60)
finished = os.path.exists(marker)
if finished:
    os.remove(marker)
check(f"stdout stalled: the rank printing 100 MB ran to its end, the job exited 0 in {secs:.1f} s",
      code == 0 and finished and secs < 40, said)
expect("stdout stalled: the launcher says it drops the output", said,
       r"standard output has taken nothing for 10 s; the ranks' output is dropped until it reads again")


def alive(pid):
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def leftovers_after(ranks_cmd, act, nproc=2, runs=10):
    """Runs the launcher `runs` times on ranks_cmd (each rank prints
    "child=PID" for every process it starts); `act(launcher, rank_pids)`
    harms the job once the children are up. Returns the children still
    alive 3 s after the launcher ended, over all runs (each then killed)."""
    survivors = []
    for _ in range(runs):
        proc = subprocess.Popen(L + ["--nproc_per_node", str(nproc), "--", "sh", "-c", ranks_cmd],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        children, lines = [], []
        deadline = time.monotonic() + 20
        while len(children) < nproc and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            children += [int(p) for p in re.findall(r"child=(\d+)", line)]
        time.sleep(0.3)  # the rest of each rank's children start
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            rank_pids = [int(p) for p in f.read().split()]
        act(proc, rank_pids)
        rest = proc.stdout.read()
        proc.wait()
        children += [int(p) for p in re.findall(r"child=(\d+)", rest)]
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(alive(c) for c in children):
            time.sleep(0.1)
        for c in children:
            if alive(c):
                survivors.append(c)
                os.kill(c, signal.SIGKILL)
    return survivors


# 10. A rank run through a wrapper script whose shell is SIGKILLed: the
# program the shell started (its child, in the rank's process group) does
# not outlive the job (it kept running with ppid 1 before).
left = leftovers_after('sleep 300 & echo "child=$!"; wait',
                       lambda launcher, ranks: os.kill(ranks[0], signal.SIGKILL))
check(f"wrapper shell killed: no process of the job left over 10 runs ({len(left)} survivors)", not left)

# 11. A rank with children (a worker in its process group, and one that left
# it with setsid) is SIGKILLed: neither child survives (the launcher is their
# subreaper and ends what the ranks left).
left = leftovers_after('sleep 301 & echo "child=$!"; setsid sleep 302 & echo "child=$!"; wait',
                       lambda launcher, ranks: os.kill(ranks[0], signal.SIGKILL), nproc=1)
check(f"rank with children killed: no process of the job left over 10 runs ({len(left)} survivors)", not left)

# 12. The launcher itself SIGKILLed, its ranks tessel programs under a
# wrapper shell: the shells die with the launcher (their death signal) and
# the programs notice its heartbeat socket close and end their process group.
wrapped = f"{args.probe} --mode=sleep & echo \"child=$!\"; wait"
left = leftovers_after(wrapped, lambda launcher, ranks: (time.sleep(0.5), launcher.kill()))
check(f"launcher SIGKILLed: no process of the job left over 10 runs ({len(left)} survivors)", not left)

finish()
