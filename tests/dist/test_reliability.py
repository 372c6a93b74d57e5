"""Regression tests for the reliability findings (all traffic on loopback):
- stray bytes, HTTP, huge counts and thousands of short connections to the
  rendezvous store leave the job, its descriptors and threads unchanged;
- a connection without the job's secret cannot read or write a key; no
  listener of a single-host job is on a non-loopback address;
- a silent listener on MASTER_PORT and a stopped rank 0 are timeouts naming
  them, not hangs; a rank that leaves early is named at once;
- the launcher names the rank that skipped a collective, survives `| head`,
  sets OMP_NUM_THREADS, leaves program arguments to the program, and
  reports descriptor exhaustion before starting anything;
- while the small GPT trains, a bounded loop of malformed and
  unauthenticated connections to its store changes none of its losses;
- up to 200 stray connections to every socket the job listens on during
  start-up (the store and each Gloo pair's own listener) leave its losses
  unchanged: Gloo only ever sees connections that proved the job's secret.
"""
import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import Job, check, expect, finish, free_port, run  # noqa: E402
from store_client import StoreClient  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--launcher", required=True)
parser.add_argument("--probe", required=True)
parser.add_argument("--gpt", required=True)
parser.add_argument("--only", default="", help="comma-separated test names to run (default: all)")
parser.add_argument("--listener_jobs", type=int, default=2,
                    help="jobs the 'listeners' test starts under attack (the hardening issue asks for 20)")
args = parser.parse_args()
SECRET = "reliability-test-secret-0123456789"
ONLY = set(filter(None, args.only.split(",")))


def selected(name):
    return not ONLY or name in ONLY


def count(path):
    try:
        return len(os.listdir(path))
    except FileNotFoundError:
        return -1


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 1 << 40  # gone: counts as unbounded growth


def poke(port, data, linger=0.0):
    """Connects, sends `data`, closes; True if the connection was made."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            if data:
                s.sendall(data)
            if linger:
                time.sleep(linger)
        return True
    except OSError:
        return False


def settle(pid, fds, threads, timeout=5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count(f"/proc/{pid}/fd") <= fds and count(f"/proc/{pid}/task") <= threads:
            return True
        time.sleep(0.1)
    return False


# ---------------------------------------------------------------- the store of a live job
if selected("store"):
    port = free_port()
    job = Job([args.launcher, "--nproc_per_node", "2", "--master_port", str(port), "--", args.probe, "--mode=sleep"],
              env={"TESSEL_JOB_SECRET": SECRET})
    pids = job.pids(2)
    check("store: job started", len(pids) == 2, job.output())
    def attack_store():
        rank0 = pids[0]
        time.sleep(0.5)
        fds0, threads0, rss0 = count(f"/proc/{rank0}/fd"), count(f"/proc/{rank0}/task"), rss_kib(rank0)
        rng = random.Random(1)
        for _ in range(50):
            poke(port, bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400))))
        poke(port, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        poke(port, b"\x04\x00\x00\x00\x01")  # the old protocol: check, 16 Mi keys
        # 20 connections held open at once, each claiming a 64 MiB key.
        held = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"\x01\x01\x00\x00\x00\x00\x00\x00\x04")
            held.append(s)
        time.sleep(0.5)
        grew = rss_kib(rank0) - rss0
        check(f"store: 20 huge claims held open cost rank 0 {grew} KiB (< 16 MiB)", grew < 16 * 1024)
        for s in held:
            s.close()
        # 2,000 short connections.
        t0 = time.monotonic()
        for i in range(2000):
            poke(port, b"x" if i % 2 else b"")
        secs = time.monotonic() - t0
        back = settle(rank0, fds0, threads0)
        check(f"store: 2,000 short connections in {secs:.1f} s, descriptors and threads back to baseline "
              f"({count(f'/proc/{rank0}/fd')}/{fds0} fds, {count(f'/proc/{rank0}/task')}/{threads0} threads)", back)
        # Without the secret: no key can be read or written.
        c = StoreClient(port)
        denied = not c.authenticate("not-the-job-secret-at-all")
        c.close()
        check("store: a wrong secret is denied", denied)
        c = StoreClient(port)
        try:
            c.get("tessel/join/0")  # no handshake at all
            leaked = True
        except (ConnectionError, OSError):
            leaked = False
        c.close()
        check("store: a client that skips the handshake gets no key", not leaked)
        c = StoreClient(port)
        try:
            c.set("tessel/join/7", b"forged")
        except (ConnectionError, OSError):
            pass
        c.close()
        good = StoreClient(port)
        check("store: the job's secret is accepted (the test client speaks the protocol)",
              good.authenticate(SECRET))
        status, _ = good.get("tessel/join/0")
        check("store: an authenticated client reads a key", status == 0)
        status, _ = good.get("tessel/join/7")
        check("store: the unauthenticated write did not land", status == 1)
        good.close()
        # Listeners of the job: loopback only.
        ss = subprocess.run(["ss", "-ltnpH"], stdout=subprocess.PIPE, text=True).stdout
        mine = [l for l in ss.splitlines() if any(f"pid={p}," in l for p in pids.values())]
        local = [l.split()[3] for l in mine]
        check(f"store: the job listens on loopback only ({', '.join(local)})",
              mine and all(a.startswith("127.") or a.startswith("[::1]") for a in local), ss)
        alive = all(os.path.exists(f"/proc/{p}") for p in pids.values())
        check("store: every rank is still running", alive and job.proc.poll() is None, job.output())
        expect("store: rank 0 logged the dropped connections", job.output(),
               r"rendezvous store: dropped a connection from 127\.0\.0\.1:\d+: not a tessel store client")

    if len(pids) == 2:
        try:
            attack_store()
        except OSError as e:
            check("store: the store survived the attacks", False, f"  {e!r}\n{job.output()[-3000:]}")
    job.stop()

# ---------------------------------------------------------------- silent listener, stopped rank 0
if selected("silent"):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        code, out, secs = run([args.probe, "--rendezvous_timeout_s=2"], timeout=60,
                              env={"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "TESSEL_JOB_SECRET": SECRET})
    check(f"silent listener: fails in {secs:.1f} s (< 10 s)", code != 0 and secs < 10, out)
    expect("silent listener: names the address", out,
           rf"the rendezvous store at MASTER_ADDR:MASTER_PORT=127\.0\.0\.1:{port} accepted the connection but "
           r"did not answer within 2 s")

if selected("stopped"):
    job = Job([args.launcher, "--nproc_per_node", "4", "--master_port", "0", "--heartbeat_timeout_s", "4", "--",
               args.probe, "--mode=loop"])
    pids = job.pids(4)
    job.wait_for(r"\[rank 3\] iteration 3 ", 1, 30)
    if pids:
        os.kill(pids[0], signal.SIGSTOP)
    stopped_at = time.monotonic()
    code, out, _ = job.wait(60)
    secs = time.monotonic() - stopped_at
    check(f"stopped rank 0: the job ends in {secs:.1f} s (limit 4 s, < 15 s)", code == 1 and secs < 15, out)
    expect("stopped rank 0: reported at once", out, r"rank 0 \(pid \d+\) was stopped by signal 19")
    expect("stopped rank 0: the launcher names it", out,
           r"job failed: rank 0 \(pid \d+\) has been stopped by signal 19 \(Stopped \(signal\)\) for \d")

# ---------------------------------------------------------------- early exits
for victim in (0, 3):
    if not selected("early"):
        break
    code, out, secs = run([args.launcher, "--nproc_per_node", "4", "--master_port", "0", "--", args.probe,
                           "--mode=exit_early", f"--odd_rank={victim}"], timeout=120)
    check(f"rank {victim} exits early: the job fails in {secs:.1f} s (< 15 s)", code == 1 and secs < 15, out)
    expect(f"rank {victim} exits early: reported as the likely root cause", out,
           rf"after rank {victim} had left the job early \((exited with status 0|reached shutdown)\).*rank "
           rf"{victim} ran fewer collectives than its peers, the likely root cause")

# ---------------------------------------------------------------- skipped collective
if selected("skip"):
    code, out, secs = run([args.launcher, "--nproc_per_node", "4", "--master_port", "0", "--", args.probe,
                           "--mode=hang_collective", "--odd_rank=2"], env={"TESSEL_COMM_TIMEOUT_S": "3"},
                          timeout=120)
    check(f"skipped collective: fails after the 3 s timeout from TESSEL_COMM_TIMEOUT_S (took {secs:.1f} s)",
          code == 1 and 2.5 < secs < 30, out)
    expect("skipped collective: the launcher names the rank", out,
           r"tessel-launch: rank 2 never reached all_reduce #3 on group \[0-3\], which rank\(s\) 0, 1, 3 waited in")
    expect("skipped collective: what rank 2 last ran", out,
           r"rank 2: between collectives; the last was all_reduce #2 on group \[0-3\]")
    expect("skipped collective: the failing rank prints its recent collectives", out,
           r"recent collectives of this rank.*\n.*connect #1 on group \[0-3\].*\n.*all_reduce #2 on group \[0-3\], "
           r"8 bytes, done.*\n.*all_reduce #3 on group \[0-3\], 8 bytes, FAILED")

# ---------------------------------------------------------------- the launcher itself
if selected("launcher"):
    # Piping into head: the job runs on to a clean exit.
    cmd = (f"'{args.launcher}' --nproc_per_node 2 --master_port 0 -- '{args.probe}' --mode=loop --iterations=300 "
           "| head -n 2; echo launcher_exit=${PIPESTATUS[0]}")
    code, out, _ = run(["bash", "-c", cmd], timeout=120)
    expect("| head: the launcher exits 0", out, r"launcher_exit=0")
    expect("| head: says the output is dropped", out, r"standard output was closed by its reader")

    cores = len(os.sched_getaffinity(0))
    code, out, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--", args.probe, "--mode=env"])
    expect(f"threads: OMP_NUM_THREADS = {cores} cores / 2 ranks", out,
           rf"\[rank 1\] OMP_NUM_THREADS={max(1, cores // 2)} ")
    expect("threads: said once in the log", out, rf"OMP_NUM_THREADS={max(1, cores // 2)} for each of 2 rank\(s\)")
    code, out, _ = run([args.launcher, "--master_port", "0", "--", args.probe, "--mode=env"],
                       env={"OMP_NUM_THREADS": "3"})
    expect("threads: a user's OMP_NUM_THREADS is kept", out, r"\[rank 0\] OMP_NUM_THREADS=3 ")

    # Without "--", words after the program are the program's.
    code, out, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", args.probe, "--mode=allreduce"])
    check("arguments: flags after the program go to it", code == 0, out)
    expect("arguments: the program ran its mode", out, r"\[rank 1\] all_reduce result 3")

    code, out, _ = run(["bash", "-c", f"ulimit -n 64; '{args.launcher}' --nproc_per_node 100 -- '{args.probe}'"])
    check("descriptors: fails before starting", code == 2 and "[rank" not in out, out)
    expect("descriptors: says how many are needed", out,
           r"--nproc_per_node=100 needs about 364 open files, but the limit is 64")

# ---------------------------------------------------------------- GPT under a store flood
if selected("left"):
    # After Shutdown, rank 0 no longer serves the store: its server thread
    # is stopped before the process exits, so a connection arriving during
    # exit is not handled while the process tears down (rank 0 crashed at
    # exit under a connection flood).
    port = free_port()
    job = Job([args.launcher, "--nproc_per_node", "2", "--master_port", str(port), "--", args.probe, "--mode=left"])
    left = job.wait_for(r"\[rank \d\] left pid=", 2, timeout=60)
    check("left: both ranks left after two Shutdown calls", left is not None, job.output())
    check("left: rank 0's store no longer accepts connections", left is not None and not poke(port, b""),
          job.output())
    job.stop()

if selected("gpt"):
    def losses(output):
        return re.findall(r"\[rank 0\] step (\d+) loss (\S+)", output)

    gpt = [args.gpt, "--tp", "2", "--steps", "10"]
    code, clean, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--", *gpt], timeout=300)
    check("gpt: clean run", code == 0 and len(losses(clean)) == 10, clean)
    port = free_port()
    stop = threading.Event()
    sent = [0]

    def hammer():
        rng = random.Random(2)
        kinds = [lambda: bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))),
                 lambda: b"GET / HTTP/1.1\r\n\r\n", lambda: b"\x04\x00\x00\x00\x01",
                 lambda: b"TSLCLNT2" + bytes(68), lambda: b""]
        deadline = time.monotonic() + 120
        while not stop.is_set() and sent[0] < 5000 and time.monotonic() < deadline:
            sent[0] += poke(port, rng.choice(kinds)())

    t = threading.Thread(target=hammer)
    t.start()
    code, noisy, _ = run([args.launcher, "--nproc_per_node", "2", "--master_port", str(port), "--", *gpt],
                         timeout=300)
    stop.set()
    t.join()
    check(f"gpt: trained while {sent[0]} malformed or unauthenticated connections hit its store",
          code == 0 and sent[0] > 0, noisy)
    check("gpt: the losses are unchanged", losses(noisy) == losses(clean) and len(losses(clean)) == 10,
          f"clean {losses(clean)}\nnoisy {losses(noisy)}")

# ---------------------------------------------------------------- every listener of a starting job
def process_tree(root):
    """The pids of `root` and its descendants."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


class JobListeners:
    """The TCP sockets a job's processes listen on, found fast enough to see
    a Gloo pair's listener, which lives for milliseconds: /proc/net/tcp is
    read on every call, and only sockets not seen before are looked up among
    the job's descriptors."""

    def __init__(self, root):
        self.root = root
        self.pids = []
        self.owner = {}  # inode -> pid (None: not the job's)
        self.calls = 0

    def ports(self):
        """{port: pid} of the job's sockets in LISTEN state."""
        if self.calls % 64 == 0 or len(self.pids) < 2:
            self.pids = process_tree(self.root)
        self.calls += 1
        listening = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    next(f)
                    for line in f:
                        fields = line.split()
                        if fields[3] == "0A":  # LISTEN
                            listening[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
            except OSError:
                continue
        if any(inode not in self.owner for inode in listening):
            for pid in self.pids:
                try:
                    for fd in os.listdir(f"/proc/{pid}/fd"):
                        try:
                            target = os.readlink(f"/proc/{pid}/fd/{fd}")
                        except OSError:
                            continue
                        if target.startswith("socket:[") and target[8:-1] in listening:
                            self.owner[target[8:-1]] = pid
                except OSError:
                    continue
            for inode in listening:
                self.owner.setdefault(inode, None)
        return {port: self.owner[inode] for inode, port in listening.items() if self.owner[inode] is not None}


if selected("listeners"):
    def losses(output):
        return re.findall(r"\[rank 0\] step (\d+) loss (\S+)", output)

    # dp2 x tp2 on 4 ranks: the world, tensor- and data-parallel groups each
    # connect their own Gloo pairs, some of them only at the first step.
    gpt = [args.gpt, "--tp", "2", "--steps", "4"]
    launch = [args.launcher, "--nproc_per_node", "4", "--master_port", "0", "--"]
    code, clean, _ = run(launch + gpt, timeout=300)
    check("listeners: clean run", code == 0 and len(losses(clean)) == 4, clean)
    rng = random.Random(7)
    kinds = [lambda: bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))),
             lambda: b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", lambda: b"",
             lambda: b"TSLPAIR1" + bytes(rng.getrandbits(8) for _ in range(32)), "hold"]
    # A job whose pairs connected before the scanner saw them is run again
    # (the scan sometimes misses the first milliseconds): up to 3 more jobs.
    passed, attacked, attempt = 0, 0, 0
    while attacked < args.listener_jobs and attempt < args.listener_jobs + 3:
        attempt += 1
        job = Job(launch + gpt)
        hits, held = {}, []
        listeners = JobListeners(job.proc.pid)

        def hit(port):
            kind = rng.choice(kinds)
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
            except OSError:
                return False
            hits[port] = hits.get(port, 0) + 1
            if kind == "hold":
                held.append(s)
                return True
            try:
                data = kind()
                if data:
                    s.sendall(data)
            except OSError:
                pass
            s.close()
            return True

        # Until the first step: scan the job's listeners and hit each one up
        # to 200 times (garbage, HTTP, connect-and-close, a forged proof, a
        # connection held open without a word). Gloo's listeners live for
        # milliseconds, so the ranks are stopped in turn (each until the
        # others' listeners took their 200, at most 5 s): the listeners
        # waiting for the stopped rank stay open meanwhile.
        turn, store_port = 0, None
        while job.proc.poll() is None and not re.search(r"\[rank 0\] step 1 ", job.output()):
            ports = listeners.ports()
            if store_port is None and len(ports) == 1:
                store_port = next(iter(ports))
            ranks = [p for p in listeners.pids if p != job.proc.pid]
            if len(ranks) == 4:
                stopped = ranks[turn % 4]
                turn += 1
                try:
                    os.kill(stopped, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                until = time.monotonic() + 5
                while time.monotonic() < until:
                    waiting = [port for port, owner in listeners.ports().items()
                               if owner != stopped and hits.get(port, 0) < 200]
                    if not waiting:
                        break
                    for port in waiting:
                        hit(port)
                os.kill(stopped, signal.SIGCONT)
            for port in ports:
                for _ in range(4):
                    if hits.get(port, 0) >= 200 or not hit(port):
                        break
            if len(held) > 32:
                for s in held[:16]:
                    s.close()
                del held[:16]
        for s in held:
            s.close()
        code, out, _ = job.wait(300)
        refused = len(re.findall(r"refused a connection to communication listener", out))
        ok = code == 0 and losses(out) == losses(clean) and len(losses(out)) == 4
        passed += ok
        pairs = {port: n for port, n in hits.items() if port != store_port}
        full = sum(1 for n in pairs.values() if n >= 200)
        attacked += len(pairs) >= 1 and refused > 0
        print(f"listeners: job {attempt}: {hits.get(store_port, 0)} connections to the store, "
              f"{sum(pairs.values())} to {len(pairs)} Gloo pair listeners ({full} of them took 200), "
              f"refused by the pair guard (logged, at most 16 per rank): {refused}, "
              f"losses {'unchanged' if ok else 'CHANGED'}", flush=True)
        check(f"listeners: job {attempt} trained with unchanged losses under "
              f"{sum(hits.values())} stray connections", ok, out[-4000:])
    check(f"listeners: {attacked} jobs had their Gloo pair listeners hit and refusing strangers "
          f"(wanted {args.listener_jobs})", attacked >= args.listener_jobs)
    print(f"listeners: {passed}/{attempt} jobs trained with bit-identical losses", flush=True)

# ---------------------------------------------------------------- a rank SIGKILLed mid-training
# The launcher's diagnosis describes the ranks when the failure happened: a
# killed rank's stale report (or its peer's wait after the kill) must not
# turn into "rank 1 never reached all_reduce #N" (it did in 2 of 6 runs).
if selected("kill_gpt"):
    false_lines = []
    for attempt in range(6):
        job = Job([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--", args.gpt, "--tp", "2",
                   "--steps", "100000"])
        job.wait_for(r"\[rank 0\] step 5 ", 1, 120)
        time.sleep(0.1 * attempt)
        victim = job.rank_pid(1)
        if victim is None:
            job.stop()
            check("kill_gpt: found rank 1", False)
            continue
        os.kill(victim, signal.SIGKILL)
        code, out, _ = job.wait(120)
        check(f"kill_gpt {attempt + 1}: the job failed naming rank 1's death", code == 1 and re.search(
            r"job failed: rank 1 \(pid \d+\) was killed by signal 9", out) is not None, out[-3000:])
        false_lines += [line for line in out.splitlines() if "never reached" in line]
    check("kill_gpt: no rank is said to have never reached a collective", not false_lines, "\n".join(false_lines))

# ---------------------------------------------------------------- a stopped rank mid-training (default limit)
if selected("sigstop_gpt"):
    job = Job([args.launcher, "--nproc_per_node", "2", "--master_port", "0", "--", args.gpt, "--tp", "2", "--steps",
               "100000"])
    job.wait_for(r"\[rank 0\] step 3 ", 1, 120)
    victim = job.rank_pid(1)
    check("sigstop: found rank 1", victim is not None)
    if victim:
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        code, out, _ = job.wait(150)
        secs = time.monotonic() - t0
        check(f"sigstop: the job ends {secs:.0f} s after rank 1 was stopped mid-training (< 90 s)",
              code == 1 and secs < 90, out[-3000:])
        expect("sigstop: the launcher names rank 1", out, r"job failed: rank 1 \(pid \d+\) has been stopped by signal 19")
    else:
        job.stop()

finish()
