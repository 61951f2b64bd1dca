"""gradsync.torch.monitor(): a PyTorch job's steps and collectives reach the
coordinator through `gradsync launch` or the process's own membership, and
a rank that stops issuing collectives is named by the hang diagnosis, with
its Python stacks. And what status says of a PyTorch job under `gradsync
launch`: each rank's own pid, a killed rank's exit as the recovery's cause,
no resumption claimed, every member final when the job fails."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import gradsync
import gradsync.torch
from gradsync._proto import job_pb2
from conftest import HERE, binary, launch, poll, running_coordinator

SCRIPT = os.path.join(HERE, "monitor_script.py")


def both_training(client, job):
    """The status once both members of `job` reported 3 steps."""
    return poll(client, job, lambda s: len(s.members) == 2 and all(
        m.metrics.step >= 3 for m in s.members))


def assert_monitored(member):
    """What monitor() reports shows in status: collectives (one or two
    buckets a step: DDP rebuilds them after the first), step and
    communication time."""
    m = member.metrics
    assert m.last_finished_collective > m.step, member
    assert m.step_timings.step_seconds > 0, member
    assert m.step_timings.communication_seconds > 0, member


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_steps_and_buckets_show_in_status(coordinator):
    agent = launch(coordinator, "monitored", 2,
                   [SCRIPT, "--steps", "30", "--pause", "0.1"])
    try:
        client = gradsync.Client(coordinator)
        status = both_training(client, "monitored")
        for m in status.members:
            assert_monitored(m)
            assert m.metrics.samples_per_second > 0
            # The rank's own process, which the agent started.
            assert m.node.pid != agent.pid and parent_of(m.node.pid) == agent.pid
    finally:
        out, err = agent.communicate(timeout=180)
    assert agent.returncode == 0, err
    assert "rank 0: 30 steps monitored" in out, out + err


def test_a_rank_that_stops_issuing_collectives_is_named():
    with running_coordinator("--hang_timeout=2s") as coordinator:
        agent = launch(coordinator, "hung", 2,
                       [SCRIPT, "--hang_rank", "1", "--hang_at", "4"])
        try:
            client = gradsync.Client(coordinator)
            # Rank 0 started step 4's all-reduces and waits; rank 1 finished
            # step 3's last and never started the next. (On a loaded machine
            # the first all-reduce, which connects Gloo, may itself take the
            # 2 s: that diagnosis, both ranks in collective #1, comes first
            # and is replaced once it finishes.)
            pattern = (r"rank 0 started collective #(\d+) and has not "
                       r"finished it; rank 1 finished #(\d+) and has "
                       r"not started #(\d+)")
            status = poll(client, "hung",
                          lambda s: re.search(pattern, s.diagnosis.hang))
            found = re.search(pattern, status.diagnosis.hang)
            rank0_at, rank1_done, rank1_next = map(int, found.groups())
            assert rank1_next == rank1_done + 1 and rank0_at >= rank1_next
            # The verdict asked both processes for their stacks, which the
            # agent took with faulthandler: the hung rank's main thread
            # stands in the script's sleep, rank 0's in the backward.
            status = poll(client, "hung", lambda s: sorted(
                s.diagnosis.hang_stacks.answered) == [0, 1])
            stacks = status.diagnosis.hang_stacks
            assert list(stacks.hung_ranks) == [1] and stacks.healthy_rank == 0
            only = {tuple(g.ranks): list(g.frames) for g in stacks.groups
                    if len(g.ranks) == 1}
            assert re.fullmatch(r"<module> \(monitor_script.py:\d+\)",
                                only[(1,)][0]), stacks
            assert any("backward" in f for f in only[(0,)]), stacks
            assert not stacks.errors, stacks
        finally:
            agent.terminate()
            agent.communicate(timeout=60)
        assert agent.returncode == 128 + 15


def standalone(coordinator, job, steps):
    """Two processes of the monitored script that join `job` by themselves
    (gradsync://, no launcher), training `steps` steps of at least 0.1 s."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRADSYNC_") and k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.path.dirname(HERE)
    url = f"gradsync://{coordinator}/{job}?nnodes=2"
    return [subprocess.Popen(
        [sys.executable, SCRIPT, "--init", url, "--steps", str(steps),
         "--pause", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env=env) for _ in range(2)]


def test_without_the_launcher_it_reports_through_the_membership(coordinator):
    processes = standalone(coordinator, "alone", 40)
    try:
        client = gradsync.Client(coordinator)
        status = both_training(client, "alone")
        for m in status.members:
            assert_monitored(m)
            assert m.node.pid in [p.pid for p in processes]
    finally:
        outputs = [p.communicate(timeout=180)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs
    job = client.get_job("alone")
    assert gradsync.Client.state_name(job.state) == "succeeded", job


def test_a_coordinator_restart_keeps_the_members_places(tmp_path):
    """The coordinator stops (SIGTERM) and comes back on the same port and
    state while two processes that joined by themselves train: their
    heartbeat streams break and they open new ones, so nobody is lost and
    the job succeeds in its first round."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = (f"--listen=127.0.0.1:{port}", f"--state_dir={tmp_path}")
    coordinator = f"127.0.0.1:{port}"
    with running_coordinator(*flags):
        processes = standalone(coordinator, "restarted", 80)
        before = both_training(gradsync.Client(coordinator), "restarted")
        step = max(m.metrics.step for m in before.members)
    with running_coordinator(*flags):
        client = gradsync.Client(coordinator)
        # The restarted coordinator hears of the steps only from heartbeats
        # on the members' new streams.
        poll(client, "restarted", lambda s: len(s.members) == 2 and all(
            m.metrics.step >= step + 5 for m in s.members), seconds=60)
        outputs = [p.communicate(timeout=180)[0] for p in processes]
        job = client.get_job("restarted")
    assert [p.returncode for p in processes] == [0, 0], outputs
    assert gradsync.Client.state_name(job.state) == "succeeded", job
    assert job.round == 1 and job.recovery_count == 0, job
    # (The membership's HealthReporter says so when its stream is back.)
    assert all(re.search(r"heartbeats reach the coordinator at \S+ again", o)
               for o in outputs), outputs


def run_and_kill(coordinator, job, rank, max_restarts):
    """Two nodes of one process each under their own agents; `rank`'s
    process is SIGKILLed (found by its pid as status shows it) once both
    trained 3 steps. Returns the job's final status, the pid, and the
    agents' exit codes and output."""
    agents = [launch(coordinator, job, 1,
                     [SCRIPT, "--steps", "60", "--pause", "0.1"],
                     extra=("--nnodes=2", f"--node_id={node}",
                            f"--max_restarts={max_restarts}"))
              for node in ("a", "b")]
    client = gradsync.Client(coordinator)
    try:
        pid = both_training(client, job).members[rank].node.pid
        os.kill(pid, signal.SIGKILL)
    finally:
        outputs = [a.communicate(timeout=180) for a in agents]
    return client.get_job(job), pid, [a.returncode for a in agents], outputs


def test_a_killed_ranks_exit_is_the_recovery_cause(coordinator):
    job, pid, codes, outputs = run_and_kill(coordinator, "killed", 1, 1)
    assert codes == [0, 0], outputs
    assert gradsync.Client.state_name(job.state) == "succeeded", job
    assert len(job.recoveries) == 1, job
    recovery = job.recoveries[0]
    assert recovery.cause == (f"rank 1 (pid {pid}) exited with code 137 "
                              "(SIGKILL)"), recovery
    assert not recovery.resumed_in_place
    text = subprocess.run(
        [binary("cli/gradsync"), f"--coordinator={coordinator}",
         "status", "killed"], capture_output=True, text=True,
        timeout=60).stdout
    assert "no: processes restarted" in text and "after step" not in text, text


def test_when_the_job_fails_every_member_is_final(coordinator):
    job, pid, codes, outputs = run_and_kill(coordinator, "ends", 0, 0)
    assert max(codes) == 137, outputs
    assert gradsync.Client.state_name(job.state) == "failed", job
    assert f"rank 0 (pid {pid}) exited with code 137 (SIGKILL)" in job.reason
    for m in job.members:
        assert m.state == job_pb2.MEMBER_STATE_EXITED, job


class FakeDdp:
    """What monitor() needs of a DDP model: a hook to register."""

    def __init__(self):
        self.hooks = []

    def register_comm_hook(self, state, hook):
        self.hooks.append(hook)


def monitor_threads():
    return [t for t in threading.enumerate() if t.name == "gradsync-monitor"]


def test_a_later_monitor_replaces_the_one_before(tmp_path, monkeypatch):
    # A model wrapped again (a loop that re-creates its DDP each round) is
    # monitored again: one sender thread and one socket, not one per call.
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(tmp_path / "agent"))
    monkeypatch.setenv("GRADSYNC_AGENT_SOCKET", str(tmp_path / "agent"))
    before = len(monitor_threads())
    first = gradsync.torch.monitor(FakeDdp())
    second = gradsync.torch.monitor(FakeDdp())
    try:
        assert len(monitor_threads()) == before + 1
        assert not first._sender_thread.is_alive()
        assert first._close_sender.__self__.fileno() == -1, "socket left open"
        assert second._sender_thread.is_alive()
    finally:
        second.close()
        agent.close()
    assert len(monitor_threads()) == before
    second.close()  # idempotent
