"""gradsync.torch.monitor(): a PyTorch job's steps and collectives reach the
coordinator through `gradsync launch`, and a rank that stops issuing
collectives is named by the hang diagnosis, with its Python stacks."""
import os
import re
import time

import gradsync
from conftest import HERE, launch, running_coordinator

SCRIPT = os.path.join(HERE, "monitor_script.py")


def poll(client, job, predicate, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status = client.get_job(job)
            if predicate(status):
                return status
        except gradsync.Error:
            pass  # not created yet
        time.sleep(0.1)
    raise AssertionError(f"timed out; last status: {status}")


def test_steps_and_buckets_show_in_status(coordinator):
    agent = launch(coordinator, "monitored", 2,
                   [SCRIPT, "--steps", "30", "--pause", "0.1"])
    try:
        client = gradsync.Client(coordinator)
        status = poll(client, "monitored", lambda s: len(s.members) == 2 and all(
            m.metrics.step >= 3 for m in s.members))
        for m in status.members:
            # One or two buckets a step (DDP rebuilds them after the first).
            assert m.metrics.last_finished_collective > m.metrics.step
            assert m.metrics.step_timings.step_seconds > 0
            assert m.metrics.samples_per_second > 0
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
