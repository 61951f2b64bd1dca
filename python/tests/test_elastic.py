"""gradsync.elastic: a PyTorch DDP loop that recovers in place under
`gradsync launch --self_managed` (elastic_script.py, 3 processes): one
SIGKILLed mid-training is restarted alone and healed from a survivor, the
survivors keep their processes, the job succeeds in round 2, and the final
parameters equal an uninterrupted run's."""
import json
import os
import re
import tempfile

import gradsync
from conftest import HERE, launch


def run(coordinator, job, **env):
    """(output, each rank's final parameters) of elastic_script.py as 3
    processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "params.json")
        saved = dict(os.environ)
        os.environ.update(ELASTIC_OUT=out, **env)
        try:
            agent = launch(coordinator, job, 3,
                           [os.path.join(HERE, "elastic_script.py")],
                           ["--self_managed", "--max_restarts=1"])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        stdout, stderr = agent.communicate(timeout=240)
        assert agent.returncode == 0, stdout + stderr
        params = []
        for rank in range(3):
            with open(f"{out}.{rank}") as f:
                params.append(json.load(f))
        return stdout + stderr, params


def rounds_of(output):
    """{pid: [(round, rank), ...]} from the processes' round lines."""
    seen = {}
    for pid, number, rank in re.findall(
            r"pid (\d+): round (\d+) rank (\d+) of 3", output):
        seen.setdefault(int(pid), []).append((int(number), int(rank)))
    return seen


def test_a_killed_rank_is_healed_in_place_and_the_run_ends_as_uninterrupted(
        coordinator):
    _, reference = run(coordinator, "elastic-ref")
    output, healed = run(coordinator, "elastic-kill", ELASTIC_DIE_AT="12")
    job = gradsync.Client(coordinator).get_job("elastic-kill")
    assert gradsync.Client.state_name(job.state) == "succeeded", output
    assert job.round == 2, output
    seen = rounds_of(output)
    # Two survivors trained in rounds 1 and 2 in the same process; the
    # killed one's place went to a new process in round 2, from step 12.
    survivors = [pid for pid, rounds in seen.items()
                 if [n for n, _ in rounds] == [1, 2]]
    assert len(survivors) == 2, output
    newcomers = [pid for pid, rounds in seen.items()
                 if [n for n, _ in rounds] == [2]]
    assert len(newcomers) == 1, output
    assert "round 2 rank" in output and "from step 12" in output, output
    # Every rank, the healed newcomer included (momentum and all), ends
    # where the uninterrupted run's rank 0 did.
    for rank_params in reference + healed:
        for got, want in zip(rank_params, reference[0]):
            for a, b in zip(got, want):
                assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)
