"""Recovery time, side by side in one run on this machine: gradsync's
in-place recovery against torchrun --max_restarts=1 running PyTorch DDP on
the same model (Debian's python3-torch; torchrun restarts every worker,
which reload the last checkpoint).

  bazel build //server:gradsync-coordinator //worker:gradsync-worker
  /usr/bin/python3 bench/recovery_bench.py [--world_size=3] [--hidden=512]
      [--kill_step=45] [--steps=120] [--checkpoint_every=10] [--rounds=3]
      [--monitor_interval=5] [--python --python_path=DIR]

Each round kills rank 1 with SIGKILL once rank 0 has reported --kill_step,
for gradsync (3 ranks and a spare waiting, shared memory) and for torchrun
(3 ranks, Gloo), and measures the time from the kill to the first step
completed after recovery, and the steps lost: the most steps rank 0 had
reported before the kill minus the step training resumed after. Prints
both, the medians over the rounds and their ratio. With --python, also the
same PyTorch script written for gradsync.elastic
(elastic_gradsync_train.py: 3 processes and a spare, joining by
themselves), against the same torchrun run (DIR holds the gradsync package
with its extension module, as bench/torch_pg_bench.sh assembles it).
"""
import argparse
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BOUND_S = 300


class Lines:
    """Reads the stdout of several processes; lines come back with their
    arrival time and the index of their process."""

    def __init__(self):
        self.queue = queue.Queue()

    def follow(self, index, stream):
        def pump():
            for line in iter(stream.readline, ""):
                self.queue.put((time.monotonic(), index, line.rstrip("\n")))
            self.queue.put((time.monotonic(), index, None))
        threading.Thread(target=pump, daemon=True).start()

    def get(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no progress within %d s" % BOUND_S)
        return self.queue.get(timeout=left)


def wait_for_port(path, process):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return int(open(path).read())
        if process.poll() is not None:
            break
        time.sleep(0.05)  # polling a file another process writes
    raise RuntimeError("the coordinator did not start")


def spare_round(args, work, job, command, round_line, step_line, env=None,
                spare_after_s=0):
    """One run of world_size processes and a spare that join a coordinator
    of their own: command(port, i) starts process i (the last to join is
    the spare, started spare_after_s after the others); round_line matches
    a process's "rank R in round N" line (named groups rank, round),
    step_line a step line (group step) of a round's rank 0. Kills rank 1 of
    round 1 once rank 0 reported --kill_step. Returns (seconds from the
    kill to the first step of round 2, steps lost)."""
    port_file = os.path.join(work, job + ".port")
    coordinator = subprocess.Popen(
        [args.coordinator, "--listen=127.0.0.1:0", "--port_file=" + port_file],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, job + ".coord.log"), "w"))
    processes = []
    try:
        port = wait_for_port(port_file, coordinator)
        lines = Lines()
        for i in range(args.world_size + 1):
            if i == args.world_size:
                time.sleep(spare_after_s)
            p = subprocess.Popen(
                command(port, i), stdout=subprocess.PIPE,
                stderr=open(os.path.join(work, "%s.%d.log" % (job, i)), "w"),
                text=True, env=env)
            processes.append(p)
            lines.follow(i, p.stdout)
        rank_of = {}  # (process, round) -> rank
        killed_at = last_step = None
        deadline = time.monotonic() + BOUND_S
        while True:
            t, i, line = lines.get(deadline)
            if line is None:
                continue
            m = re.match(round_line, line)
            if m:
                rank_of[(i, int(m.group("round")))] = int(m.group("rank"))
                continue
            m = re.match(step_line, line)
            if not m:
                continue
            step = int(m.group("step"))
            if killed_at is None and rank_of.get((i, 1)) == 0:
                last_step = step
                if step >= args.kill_step:
                    victim = next(p for (p, r), rank in rank_of.items()
                                  if r == 1 and rank == 1)
                    processes[victim].send_signal(signal.SIGKILL)
                    killed_at = time.monotonic()
            elif killed_at is not None and rank_of.get((i, 2)) == 0:
                for p in processes:
                    p.wait(timeout=BOUND_S)
                return t - killed_at, max(0, last_step - (step - 1))
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
        coordinator.terminate()
        coordinator.wait(timeout=30)


def gradsync_round(args, work, job):
    """One run of gradsync-worker (3 ranks and a spare): (seconds from the
    kill to the first step after recovery, steps lost)."""
    def command(port, i):
        return [args.worker, "--coordinator=127.0.0.1:%d" % port, "--job=" + job,
                "--nnodes=%d" % args.world_size, "--node_id=n%d" % i,
                "--model=mlp", "--hidden=%d" % args.hidden,
                "--batch_size=%d" % args.batch_size, "--steps=%d" % args.steps,
                "--synthetic_size=8192", "--lr=0.01", "--momentum=0.9",
                "--threads=1", "--log_every=1", "--timeout=60s",
                "--join_timeout=120s"]
    return spare_round(
        args, work, job, command,
        r"gradsync-worker: rank (?P<rank>\d+) of \d+ .*, round (?P<round>\d+),",
        r"step (?P<step>\d+)/")


def python_round(args, work, job):
    """One run of the gradsync.elastic script (elastic_gradsync_train.py,
    world_size processes and a spare that join by themselves): (seconds
    from the kill to the first step after recovery, steps lost)."""
    def command(port, i):
        return [sys.executable,
                os.path.join(os.path.dirname(__file__), "elastic_gradsync_train.py"),
                "127.0.0.1:%d" % port, job, "n%d" % i, str(args.world_size),
                "--hidden=%d" % args.hidden, "--batch_size=%d" % args.batch_size,
                "--steps=%d" % args.steps]
    return spare_round(
        args, work, job, command, r"ROUND (?P<round>\d+) RANK (?P<rank>\d+)$",
        r"STEP (?P<step>\d+)$",
        env=dict(os.environ, PYTHONPATH=args.python_path), spare_after_s=1)


def torchrun_round(args, work, name):
    """One torchrun run: returns (seconds from kill to first step, steps lost)."""
    checkpoint = os.path.join(work, name + ".pt")
    logs = os.path.join(work, name + "-logs")
    process = subprocess.Popen(
        [args.torchrun, "--standalone", "--nnodes=1",
         "--nproc_per_node=%d" % args.world_size, "--max_restarts=1",
         "--monitor_interval=%g" % args.monitor_interval,
         "--redirects=1", "--tee=1", "--log_dir=" + logs,
         os.path.join(os.path.dirname(__file__), "torch_elastic_train.py"),
         "--hidden=%d" % args.hidden, "--batch_size=%d" % args.batch_size,
         "--steps=%d" % args.steps, "--checkpoint=" + checkpoint,
         "--checkpoint_every=%d" % args.checkpoint_every],
        stdout=subprocess.PIPE, stderr=open(os.path.join(work, name + ".err"), "w"),
        text=True, start_new_session=True)
    try:
        lines = Lines()
        lines.follow(0, process.stdout)
        pids = {}
        killed_at = last_step = restored = None
        deadline = time.monotonic() + BOUND_S
        while True:
            t, _, line = lines.get(deadline)
            if line is None:
                raise RuntimeError("torchrun ended before it recovered")
            m = re.search(r"PID (\d+) (\d+)$", line)
            if m:
                pids[int(m.group(1))] = int(m.group(2))
            m = re.search(r"RESTORED (\d+)$", line)
            if m and killed_at is not None:
                restored = int(m.group(1))
            m = re.search(r"\]:STEP (\d+)$", line)
            if not m:
                continue
            step = int(m.group(1))
            if killed_at is None:
                last_step = step
                if step >= args.kill_step:
                    os.kill(pids[1], signal.SIGKILL)
                    killed_at = time.monotonic()
            elif restored is not None:
                process.wait(timeout=BOUND_S)
                return t - killed_at, max(0, last_step - restored)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world_size", type=int, default=3)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--kill_step", type=int, default=45)
    p.add_argument("--checkpoint_every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--monitor_interval", type=float, default=5,
                   help="torchrun's worker monitor interval (s); 5 is its default")
    p.add_argument("--python", action="store_true",
                   help="also the same PyTorch script on gradsync.elastic "
                        "(bench/elastic_gradsync_train.py), beside torchrun")
    p.add_argument("--python_path", default="",
                   help="where the gradsync package with its extension is "
                        "(bench/recovery_bench.sh --python assembles it)")
    p.add_argument("--bin", default="bazel-bin")
    p.add_argument("--torchrun", default=shutil.which("torchrun") or "torchrun")
    args = p.parse_args()
    args.coordinator = os.path.join(args.bin, "server", "gradsync-coordinator")
    args.worker = os.path.join(args.bin, "worker", "gradsync-worker")
    print("== recovery: MLP 784-%d-%d-10, batch %d per rank, %d ranks, rank 1 "
          "killed (SIGKILL) after step %d of %d; gradsync with 1 spare waiting, "
          "torchrun --max_restarts=1 --monitor_interval=%g with a checkpoint "
          "every %d steps; %d rounds"
          % (args.hidden, args.hidden, args.batch_size, args.world_size,
             args.kill_step, args.steps, args.monitor_interval,
             args.checkpoint_every, args.rounds),
          flush=True)
    work = tempfile.mkdtemp(prefix="recovery-bench-")
    results = {"gradsync": [], "torchrun": [], "python": []}
    try:
        for r in range(args.rounds):
            g = gradsync_round(args, work, "rec-%d" % r)
            t = torchrun_round(args, work, "torchrun-%d" % r)
            results["gradsync"].append(g)
            results["torchrun"].append(t)
            print("round %d: gradsync %.3f s, %d step(s) lost; torchrun %.3f s, "
                  "%d step(s) lost" % (r + 1, g[0], g[1], t[0], t[1]), flush=True)
            if args.python:
                py = python_round(args, work, "py-%d" % r)
                results["python"].append(py)
                print("round %d: gradsync.elastic (the PyTorch script) %.3f s, "
                      "%d step(s) lost" % (r + 1, py[0], py[1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    g_s = statistics.median(x[0] for x in results["gradsync"])
    t_s = statistics.median(x[0] for x in results["torchrun"])
    g_lost = max(x[1] for x in results["gradsync"])
    t_lost = max(x[1] for x in results["torchrun"])
    print("%-44s %10s %10s" % ("", "gradsync", "torchrun"))
    print("%-44s %10.3f %10.3f" % ("kill -> first step after recovery (s, median)", g_s, t_s))
    print("%-44s %10d %10d" % ("steps lost (most over the rounds)", g_lost, t_lost))
    print("ratio gradsync/torchrun: %.3f (goal <= 0.1); gradsync goal <= 1 s, 0 steps lost"
          % (g_s / t_s))
    print("RESULT gradsync_s=%.3f torchrun_s=%.3f ratio=%.3f gradsync_lost=%d torchrun_lost=%d"
          % (g_s, t_s, g_s / t_s, g_lost, t_lost))
    if args.python:
        p_s = statistics.median(x[0] for x in results["python"])
        p_lost = max(x[1] for x in results["python"])
        print("PyTorch script on gradsync.elastic: %.3f s (median), %d step(s) "
              "lost (most); ratio to torchrun %.3f (goal <= 0.2, 0 lost)"
              % (p_s, p_lost, p_s / t_s))
        print("RESULT python_s=%.3f python_ratio=%.3f python_lost=%d"
              % (p_s, p_s / t_s, p_lost))


if __name__ == "__main__":
    sys.exit(main())
