"""gradsync.elastic: a PyTorch DDP loop that recovers in place under
`gradsync launch --self_managed` (elastic_script.py, 3 processes): one
SIGKILLed mid-training is restarted alone and healed from a survivor, the
survivors keep their processes, the job succeeds in round 2, and the final
parameters equal an uninterrupted run's; the same on simulated GPUs
(`--device=sim`, the NCCL backend's code paths). With an exact global batch
(elastic_plan_script.py, processes that join by themselves, 2:3 nodes): a
round that loses a rank shrinks to 2 and one that a third node waits for
grows at a step boundary, every sample of every epoch used exactly once,
ending where an uninterrupted run of 3 ends."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import gradsync
import gradsync.elastic
from conftest import HERE, binary, launch, poll, running_coordinator


def launch_elastic(coordinator, job, nproc, flags=(), **env):
    """`gradsync launch --self_managed --max_restarts=1` (and `flags`) of
    elastic_script.py as NPROC processes, with `env` added to their
    environment."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return launch(coordinator, job, nproc,
                      [os.path.join(HERE, "elastic_script.py")],
                      ["--self_managed", "--max_restarts=1", *flags])
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(coordinator, job, nproc=3, flags=(), **env):
    """(output, each rank's final parameters) of elastic_script.py as 3
    processes (`nproc`: --nproc_per_node's value, which must come to 3)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "params.json")
        agent = launch_elastic(coordinator, job, nproc, flags, ELASTIC_OUT=out,
                               **env)
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


def assert_healed_as_uninterrupted(reference, output, healed):
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


@pytest.fixture(scope="module")
def uninterrupted():
    """Each rank's final parameters after an uninterrupted run of
    elastic_script.py on 3 CPU processes."""
    with running_coordinator() as address:
        return run(address, "elastic-ref")[1]


def test_a_killed_rank_is_healed_in_place_and_the_run_ends_as_uninterrupted(
        coordinator, uninterrupted):
    reference = uninterrupted
    output, healed = run(coordinator, "elastic-kill", ELASTIC_DIE_AT="12")
    job = gradsync.Client(coordinator).get_job("elastic-kill")
    assert gradsync.Client.state_name(job.state) == "succeeded", output
    assert job.round == 2, output
    assert_healed_as_uninterrupted(reference, output, healed)


def test_on_simulated_gpus_under_launch_the_communicator_is_recreated(
        coordinator, uninterrupted):
    """The same, as `gradsync launch --device=sim --nproc_per_node=gpu`:
    a process per simulated GPU on the NCCL backend's code paths; the
    survivors abort the communicator the killed rank left and train on
    with a new one, ending as the uninterrupted CPU run."""
    reference = uninterrupted
    output, healed = run(coordinator, "elastic-sim-kill", nproc="gpu",
                         flags=["--device=sim"], ELASTIC_DIE_AT="12",
                         ELASTIC_DEVICE="sim", GRADSYNC_SIM_DEVICES="3")
    job = gradsync.Client(coordinator).get_job("elastic-sim-kill")
    assert gradsync.Client.state_name(job.state) == "succeeded", output
    assert job.round == 2, output
    assert " on nccl" in output and " on gloo" not in output, output
    assert "aborting the communicator" in output, output
    assert_healed_as_uninterrupted(reference, output, healed)


def assert_close(got, want):
    for a, b in zip(got, want, strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)


# The parameter tensors of the MLP with a BatchNorm and a Dropout (two
# linear layers and the norm's weight and bias); its buffers follow them in
# the lists the script writes.
BATCH_NORM_PARAMETERS = 6


def test_an_async_nccl_error_leaves_its_step_unapplied_and_the_round_heals(
        coordinator):
    """Failpoint nccl_async_error on rank 1's 20th collective (mid-training)
    on simulated GPUs, the model with a BatchNorm and a Dropout: the error
    reaches rank 1 after its host moved on, from backward(), before the
    optimizer step; every process stays, the round re-forms, the buffers
    and random draws of the failed step's forward are put back
    (copy_state), rank 1 is healed from a rank that committed cleanly, and
    every rank ends with the uninterrupted run's parameters, rank 0 also
    with its buffers (running statistics and batch counter; each rank's
    last forward leaves its own)."""
    with running_coordinator() as address:
        reference = run(address, "elastic-bn-ref", ELASTIC_NORM_DROPOUT="1")[1]
    output, healed = run(coordinator, "elastic-sim-async", nproc="gpu",
                         flags=["--device=sim"], ELASTIC_DEVICE="sim",
                         GRADSYNC_SIM_DEVICES="3", ELASTIC_NORM_DROPOUT="1",
                         ELASTIC_FAILPOINT="nccl_async_error:20")
    job = gradsync.Client(coordinator).get_job("elastic-sim-async")
    assert gradsync.Client.state_name(job.state) == "succeeded", output
    assert "failpoint nccl_async_error hit" in output, output
    assert job.round == 2, output
    seen = rounds_of(output)
    assert sorted(len(rounds) for rounds in seen.values()) == [2, 2, 2], output
    assert len(reference[0]) == BATCH_NORM_PARAMETERS + 3, "no buffers"
    for rank_state in healed:
        for got, want in zip(rank_state[:BATCH_NORM_PARAMETERS],
                             reference[0][:BATCH_NORM_PARAMETERS]):
            assert_close(got, want)
    for got, want in zip(healed[0], reference[0], strict=True):
        assert_close(got, want)


def test_a_corrupted_replica_is_found_and_healed_in_place(coordinator):
    """One process flips a bit of a parameter after step 7 (silent data
    corruption); fingerprints every 5 steps: the coordinator finds the rank
    that differs from the majority at step 10, in that parameter, the round
    re-forms with the same three processes, the corrupted one takes the
    state of a majority rank (copy_state), and every rank ends bit-identical
    to the others; the fingerprint taken after the last step (163, not a
    multiple of 5) is verified too."""
    steps = 163
    output, params = run(coordinator, "elastic-corrupt", ELASTIC_CORRUPT_AT="7",
                         ELASTIC_FINGERPRINT_EVERY="5", ELASTIC_STEPS=str(steps),
                         ELASTIC_STEP_SLEEP="0.05")
    job = gradsync.Client(coordinator).get_job("elastic-corrupt")
    assert gradsync.Client.state_name(job.state) == "succeeded", output
    assert job.round == 2, output
    seen = rounds_of(output)
    assert sorted(len(rounds) for rounds in seen.values()) == [2, 2, 2], output
    corrupter = re.search(r"pid (\d+): flipped a bit", output)
    assert corrupter, output
    rank = dict(seen[int(corrupter.group(1))])[1]
    divergence = job.diagnosis.divergence
    assert divergence.step == 10, divergence
    assert divergence.round == 1, divergence
    assert list(divergence.ranks) == [rank], divergence
    assert list(divergence.tensors) == ["0.weight"], divergence
    assert "healing" in divergence.verdict, divergence
    assert len(job.recoveries) == 1, job.recoveries
    assert "replicas diverged at step 10" in job.recoveries[0].cause
    assert job.diagnosis.replicas_verified_step == steps, job.diagnosis
    assert params[1] == params[0] and params[2] == params[0]


def test_steps_are_timed_for_the_status_and_the_self_set_timeouts(coordinator):
    """report_step without step_seconds: the time between a round's steps
    goes to the status (step time, samples/s) and to the timeouts that set
    themselves from the step times, the collective timeout in each process
    and the coordinator's hang timeout (a sample per rank and heartbeat,
    8 needed: 40 steps of 0.1 s)."""
    output, _ = run(coordinator, "elastic-timed", ELASTIC_STEPS="40",
                    ELASTIC_STEP_SLEEP="0.1")
    job = gradsync.Client(coordinator).get_job("elastic-timed")
    assert gradsync.Client.state_name(job.state) == "succeeded", output
    assert output.count("collective timeout self-set to") == 3, output
    assert job.diagnosis.hang_timeout_self_set, job.diagnosis
    assert len(job.members) == 3, job
    for member in job.members:
        # The sleep comes after report_step: the next step's time has it.
        assert member.metrics.step_timings.step_seconds >= 0.1, member
        assert member.metrics.samples_per_second > 0, member


def test_a_hung_rank_is_named_with_its_python_stack():
    """Rank 1 stops issuing collectives after step 5 (it sleeps): the hang
    verdict asks it and a healthy rank for their stacks, and each
    gradsync.elastic runtime answers with its loop's Python threads
    (faulthandler): rank 1's main thread in the script's sleep, the healthy
    rank's in the backward whose all-reduce waits for rank 1."""
    with running_coordinator("--hang_timeout=2s") as address:
        agent = launch_elastic(address, "elastic-hung", 3,
                               ELASTIC_HANG_AT="5", ELASTIC_STEPS="1000")
        try:
            client = gradsync.Client(address)
            status = poll(client, "elastic-hung", lambda s: len(
                s.diagnosis.hang_stacks.answered) == 2)
        finally:
            agent.terminate()
            agent.communicate(timeout=120)
    stacks = status.diagnosis.hang_stacks
    hung = list(stacks.hung_ranks)
    assert len(hung) == 1, stacks
    assert not stacks.errors, stacks
    only = {tuple(g.ranks): list(g.frames) for g in stacks.groups
            if len(g.ranks) == 1}
    sleep_line = next(i for i, line in enumerate(
        open(os.path.join(HERE, "elastic_script.py")), 1)
        if "time.sleep(60)" in line)
    assert only[tuple(hung)][0] == f"train (elastic_script.py:{sleep_line})", \
        stacks
    assert any(f.startswith("backward (") for f in
               only[(stacks.healthy_rank,)]), stacks


def test_fingerprint_every_must_be_a_count_of_steps():
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="fingerprint_every"):
            gradsync.elastic.run(None, fingerprint_every=bad)


def test_an_nccl_failpoint_needs_a_gpu_and_others_are_refused(tmp_path):
    """The failpoints a Python loop takes: the NCCL ones, on a GPU or a
    simulated one; anything else is refused before joining, naming why."""
    for device, spec, message in [
            ("cpu", "nccl_hang:3", "device='cuda' or device='sim'"),
            ("sim", "state_transfer", "does not apply to a Python"),
            ("sim", "nccl_hang:x", "nccl_hang:x")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            gradsync.elastic.run(gradsync.elastic.Trainer(),
                                 coordinator="127.0.0.1:1", job="never",
                                 device=device, failpoint=spec)


def test_elastic_needs_neither_grpc_nor_protobuf():
    """A GPU machine's Python may have torch and no protobuf (neither torch
    nor grpcio needs it): gradsync.elastic takes only torch and gradsync._C,
    the client's modules load on first use."""
    code = "\n".join([
        "import sys",
        "class Block:",
        "    def find_spec(self, name, path=None, target=None):",
        "        if name.split('.')[0] in ('grpc', 'google'):",
        "            raise ImportError('blocked: ' + name)",
        "sys.meta_path.insert(0, Block())",
        "import gradsync.elastic",
        "assert {'Client', 'Error', 'KeyValue', 'elastic'} <= set(dir(gradsync)), dir(gradsync)",
        "assert 'gradsync.client' not in sys.modules, sys.modules",
        "assert callable(gradsync.elastic.run)",
        "print('imported')"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr


def test_an_error_of_the_loop_itself_fails_the_job_with_it(coordinator):
    """Not a lost peer: train() raising its own exception is no reason to
    re-form; the job fails, naming it, and no process restarts."""
    agent = launch_elastic(coordinator, "elastic-raise", 2, ELASTIC_RAISE_AT="3")
    stdout, stderr = agent.communicate(timeout=180)
    assert agent.returncode != 0, stdout + stderr
    job = gradsync.Client(coordinator).get_job("elastic-raise")
    assert gradsync.Client.state_name(job.state) == "failed", job
    assert "ValueError: bad batch at step 3" in job.reason, job.reason
    assert job.round == 1, job


def test_a_spare_agent_takes_a_killed_ranks_place(coordinator):
    """Three agents of one process each and a fourth waiting as the spare
    (`gradsync launch --self_managed --nnodes=3`, one node each): rank 1
    SIGKILLed mid-training; the spare's process takes its place, the
    survivors keep their pids, and every rank of round 2 ends with the
    uninterrupted run's parameters."""
    _, reference = run(coordinator, "elastic-spare-ref", ELASTIC_STEPS="60")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE),
                   ELASTIC_STEPS="60", ELASTIC_STEP_SLEEP="0.1",
                   ELASTIC_OUT=os.path.join(tmp, "params"))
        outs = [os.path.join(tmp, f"agent{i}") for i in range(4)]

        def agent(i):
            return subprocess.Popen(
                [binary("cli/gradsync"), "launch", f"--coordinator={coordinator}",
                 "--job=elastic-spare", "--nnodes=3", "--nproc_per_node=1",
                 f"--node_id=n{i}", "--self_managed", "--max_restarts=1",
                 "--python", sys.executable, "--",
                 os.path.join(HERE, "elastic_script.py")],
                stdout=open(outs[i], "w"), stderr=subprocess.STDOUT,
                text=True, env=env)

        def output():
            return "".join(open(o).read() for o in outs if os.path.exists(o))

        agents = [agent(i) for i in range(3)]
        client = gradsync.Client(coordinator)
        try:
            deadline = time.monotonic() + 120
            while len(rounds_of(output())) < 3:
                assert time.monotonic() < deadline, output()
                time.sleep(0.1)
            agents.append(agent(3))
            while not client.get_job("elastic-spare").spares:
                assert time.monotonic() < deadline, output()
                time.sleep(0.1)
            victim = next(pid for pid, rounds in rounds_of(output()).items()
                          if (1, 1) in rounds)
            os.kill(victim, signal.SIGKILL)
            codes = [a.wait(timeout=180) for a in agents]
        finally:
            for a in agents:
                if a.poll() is None:
                    a.kill()
                    a.wait()
        out = output()
        job = client.get_job("elastic-spare")
        assert gradsync.Client.state_name(job.state) == "succeeded", out
        assert job.round == 2, out
        # The spare's agent exits 0 with its process done; the killed one's
        # restarted process found the place taken and was turned away once
        # the job succeeded (exit 1, as a gradsync-worker spare left over).
        killed = next(i for i in range(3) if f"pid {victim}:" in open(outs[i]).read())
        for i in range(4):
            assert codes[i] == (1 if i == killed else 0), (codes, out)
        assert "has ended (succeeded" in open(outs[killed]).read(), out
        assert "job 'elastic-spare' round 2: node rank" in open(outs[3]).read(), out
        seen = rounds_of(out)
        survivors = [pid for pid, rounds in seen.items()
                     if [n for n, _ in rounds] == [1, 2]]
        assert len(survivors) == 2, out
        for rank in range(3):
            with open(os.path.join(tmp, f"params.{rank}")) as f:
                params = json.load(f)
            for got, want in zip(params, reference[0]):
                for a, b in zip(got, want):
                    assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)


def plan_process(coordinator, job, node, log, *extra, env_extra=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GRADSYNC_") and k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.path.dirname(HERE)
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, os.path.join(HERE, "elastic_plan_script.py"),
         coordinator, job, node, log, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def finish(processes, allowed_codes):
    outputs = []
    for p, codes in zip(processes, allowed_codes):
        try:
            out, _ = p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode in codes, out
        outputs.append(out)
    return "".join(outputs)


def committed_steps(logs):
    steps = []
    for log in logs:
        with open(log) as f:
            steps += [json.loads(line) for line in f]
    return steps


def assert_each_sample_once(steps, output):
    """Every committed step's ranks together used its 24 positions exactly
    once, and every epoch's 240 positions were used exactly once."""
    by_step = {}
    for s in steps:
        by_step.setdefault((s["epoch"], s["step"]), []).extend(s["positions"])
    assert sorted(by_step) == [(e, k) for e in range(2) for k in range(10)], output
    for (epoch, k), positions in by_step.items():
        assert sorted(positions) == list(range(24 * k, 24 * (k + 1))), (
            epoch, k, positions, output)


def params_of(logs):
    loaded = []
    for log in logs:
        if os.path.exists(log + ".params"):
            with open(log + ".params") as f:
                loaded.append(json.load(f))
    return loaded


def test_exact_global_batch_through_a_shrink_and_a_grow(coordinator):
    with tempfile.TemporaryDirectory() as tmp:
        # Uninterrupted, 3 ranks.
        logs = [os.path.join(tmp, f"ref{i}") for i in range(3)]
        out = finish([plan_process(coordinator, "plan-ref", f"n{i}", logs[i])
                      for i in range(3)], [(0,)] * 3)
        assert_each_sample_once(committed_steps(logs), out)
        reference = params_of(logs)[0]

        # Shrink: n1 dies after step 7; n0 and n2 finish as a round of 2.
        logs = [os.path.join(tmp, f"shrink{i}") for i in range(3)]
        out = finish([plan_process(coordinator, "plan-shrink", f"n{i}", logs[i],
                                   *(["7"] if i == 1 else []))
                      for i in range(3)], [(0,), (-9,), (0,)])
        steps = committed_steps(logs)
        assert_each_sample_once(steps, out)
        assert {s["world"] for s in steps if s["round"] == 1} == {3}, out
        assert [s["world"] for s in steps if s["epoch"] == 1][-1] == 2, out
        job = gradsync.Client(coordinator).get_job("plan-shrink")
        assert gradsync.Client.state_name(job.state) == "succeeded", out
        for params in params_of(logs):
            for got, want in zip(params, reference):
                for a, b in zip(got, want):
                    assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)

        # Grow: n0 and n1 start as a round of 2 and wait after step 3; n2
        # comes then, and the round re-forms at a step boundary to take it.
        logs = [os.path.join(tmp, f"grow{i}") for i in range(3)]
        first = [plan_process(coordinator, "plan-grow", f"n{i}", logs[i],
                              "0", "3") for i in range(2)]
        deadline = time.monotonic() + 120
        while not (os.path.exists(logs[0]) and
                   sum(1 for _ in open(logs[0])) >= 3):
            assert time.monotonic() < deadline, "the first two never trained"
            assert all(p.poll() is None for p in first)
            time.sleep(0.1)
        late = plan_process(coordinator, "plan-grow", "n2", logs[2])
        out = finish(first + [late], [(0,)] * 3)
        steps = committed_steps(logs)
        assert_each_sample_once(steps, out)
        assert {s["world"] for s in steps if s["epoch"] == 0 and
                s["step"] < 3} == {2}, out
        assert {s["world"] for s in steps if s["epoch"] == 0 and
                s["step"] >= 3} == {3}, out
        job = gradsync.Client(coordinator).get_job("plan-grow")
        assert gradsync.Client.state_name(job.state) == "succeeded", out
        # The round changed by plan (its record says why), no loss.
        assert job.round == 2, out
        assert job.recoveries[0].resume_step == 3, job.recoveries
        assert job.recoveries[0].resumed_in_place, job.recoveries
        assert "join" in job.recoveries[0].cause, job.recoveries


def test_a_shrink_on_the_nccl_backend_aborts_and_recreates_its_communicator(
        coordinator):
    """The same loop on a simulated GPU per process (host memory through
    the NCCL backend's code paths): the rank killed after step 7 fails the
    survivors' NCCL all-reduce, they abort the communicator, re-form as 2
    on a new one, and every sample is still used exactly once."""
    sim = {"ELASTIC_DEVICE": "sim", "GRADSYNC_SIM_DEVICES": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        logs = [os.path.join(tmp, f"nccl{i}") for i in range(3)]
        out = finish([plan_process(coordinator, "plan-nccl", f"n{i}", logs[i],
                                   *(["7"] if i == 1 else []), env_extra=sim)
                      for i in range(3)], [(0,), (-9,), (0,)])
        steps = committed_steps(logs)
        assert_each_sample_once(steps, out)
        assert {s["backend"] for s in steps} == {"nccl"}, out
        assert [s["world"] for s in steps][-1] == 2, out
        assert "aborting the communicator" in out, out
        job = gradsync.Client(coordinator).get_job("plan-nccl")
        assert gradsync.Client.state_name(job.state) == "succeeded", out
