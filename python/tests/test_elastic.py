"""gradsync.elastic: a PyTorch DDP loop that recovers in place under
`gradsync launch --self_managed` (elastic_script.py, 3 processes): one
SIGKILLed mid-training is restarted alone and healed from a survivor, the
survivors keep their processes, the job succeeds in round 2, and the final
parameters equal an uninterrupted run's; the same on simulated GPUs
(`--device=sim`, the NCCL backend's code paths). With an exact global batch
(elastic_plan_script.py, processes that join by themselves, 2:3 nodes): a
round that loses a rank shrinks to 2 and one that a third node waits for
grows at a step boundary, every sample of every epoch used exactly once,
ending where an uninterrupted run of 3 ends; a straggler's micro-batches
move to the others."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import gradsync
import gradsync.elastic
from conftest import HERE, binary, launch, poll, running_coordinator
from elastic_mlp import MlpTrainer, plan_data


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
    8 needed: 40 steps of 0.1 s). Each step is first reported with -1
    samples: ValueError, and nothing of the step's timings spent (the good
    report after it still has the step's time and COMM TIME); fingerprints
    of step 0 and of a name without its tensor: ValueError too. Each
    member shows its own pid."""
    output, _ = run(coordinator, "elastic-timed", ELASTIC_STEPS="40",
                    ELASTIC_STEP_SLEEP="0.1", ELASTIC_BAD_REPORTS="1")
    job = gradsync.Client(coordinator).get_job("elastic-timed")
    assert gradsync.Client.state_name(job.state) == "succeeded", output
    assert output.count("collective timeout self-set to") == 3, output
    assert job.diagnosis.hang_timeout_self_set, job.diagnosis
    for refused in ["a step report's sample count must be 0 or more, not -1",
                    "a fingerprint's step is a committed step (1 or more), "
                    "not 0",
                    "a replica digest takes one name per tensor: 1 names for "
                    "0 tensors"]:
        assert output.count(f"refused: gradsync: {refused}") == 3, output
    assert len(job.members) == 3, job
    # Each rank shows its own process, although the launcher joined round 1
    # for them (--self_managed).
    pids = {rank: pid for pid, rounds in rounds_of(output).items()
            for _, rank in rounds}
    assert sorted(m.node.pid for m in job.members) == sorted(pids.values()), \
        (job.members, output)
    for member in job.members:
        assert member.node.pid == pids[member.rank], (member, output)
        # The sleep comes after report_step: the next step's time has it.
        assert member.metrics.step_timings.step_seconds >= 0.1, member
        assert member.metrics.samples_per_second > 0, member
        # The script's DDP runs through observe()'s hook: COMM TIME.
        assert member.metrics.step_timings.communication_seconds > 0, member


@pytest.mark.parametrize("marked", [True, False])
def test_a_checkpoint_step_is_waited_for_past_the_self_set_timeout(
        coordinator, marked):
    """Rank 0 stands still for 6 s after step 20 of 30 (writing a
    checkpoint), past the self-set collective timeout (2 s: the floor
    min_collective_timeout, steps taking far less). Reported with
    checkpoint=True on every rank, the others wait for it and the round
    ends as it began; unmarked, their next collective is timed out and the
    round re-forms."""
    job = f"elastic-checkpoint-{'marked' if marked else 'unmarked'}"
    output, _ = run(coordinator, job, ELASTIC_STEP_SLEEP="0.02",
                    ELASTIC_CHECKPOINT_AT="20", ELASTIC_CHECKPOINT_SECONDS="6",
                    ELASTIC_MIN_COLLECTIVE_TIMEOUT="2",
                    ELASTIC_CHECKPOINT_UNMARKED="" if marked else "1")
    state = gradsync.Client(coordinator).get_job(job)
    assert gradsync.Client.state_name(state.state) == "succeeded", output
    assert output.count("collective timeout self-set to") >= 3, output
    if marked:
        assert state.round == 1, output
    else:
        assert state.round == 2, output
        assert "DEADLINE_EXCEEDED" in output, output


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


def assert_each_sample_once(steps, output, count=20):
    """Every committed step's ranks together used its 24 positions exactly
    once, and each of the first `count` steps (10 an epoch; 20: every
    epoch's 240 positions) was committed."""
    by_step = {}
    for s in steps:
        by_step.setdefault((s["epoch"], s["step"]), []).extend(s["positions"])
    assert sorted(by_step) == [divmod(i, 10) for i in range(count)], output
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


def test_a_stragglers_micro_batches_move_to_the_others():
    """Stragglers rebalanced, as gradsync-worker's are: 3 processes run 24
    micro-batches of 1 a step (8 each), one sleeping 10 ms in each of its
    own, with straggler_policy "rebalance" and a 20 ms threshold. The
    coordinator flags it from when each step's first gradient bucket was
    ready (observe()), weighs what a micro-batch took each rank
    (micro_batches()), and re-forms the round at a step boundary with
    micro-batches moved away from it; no step is lost, every step still
    uses its 24 samples exactly once, and steps get faster."""
    env = {"PLAN_MICRO_BATCH": "1", "PLAN_EPOCHS": "10", "PLAN_NNODES": "3",
           "PLAN_STRAGGLER": "rebalance", "PLAN_STRAGGLER_THRESHOLD": "0.02",
           "PLAN_STOP_AFTER": "6"}
    with running_coordinator("--heartbeat_interval=250ms") as address, \
            tempfile.TemporaryDirectory() as tmp:
        logs = [os.path.join(tmp, f"n{i}") for i in range(3)]
        out = finish([plan_process(address, "straggler", f"n{i}", logs[i],
                                   env_extra=dict(env, PLAN_SLOW="0.01")
                                   if i == 1 else env)
                      for i in range(3)], [(0,)] * 3)
        job = gradsync.Client(address).get_job("straggler")
        assert gradsync.Client.state_name(job.state) == "succeeded", out
        steps = committed_steps(logs)
        last_round = max(s["round"] for s in steps)
        assert last_round >= 2, (job, out)
        assert_each_sample_once(steps, out, count=max(
            s["epoch"] * 10 + s["step"] + 1 for s in steps))
        # Round 2 re-formed by plan after a committed step: none redone.
        assert len(steps) == 3 * len({(s["epoch"], s["step"]) for s in steps})
        slow = {s["rank"] for s in committed_steps(logs[1:2])
                if s["round"] == 1}.pop()
        cause = job.recoveries[0].cause
        assert f"rank {slow} takes" in cause, cause
        assert job.recoveries[0].resumed_in_place, job.recoveries
        # Each rank's latest step: its share of 24 and the wait for its
        # all-reduce after the last bucket (COMM TIME), from observe().
        assert len(job.members) == 3, job
        for member in job.members:
            assert member.metrics.micro_batches.per_step == 24, member
            assert member.metrics.micro_batches.seconds > 0, member
            # Samples counted from its micro-batches (report_step's default).
            assert member.metrics.samples_per_second > 0, member
            assert member.metrics.step_timings.communication_seconds > 0, member
        # The slow process's share of a step: 8 in round 1, fewer after.
        shares = {(s["round"], len(s["positions"]))
                  for s in committed_steps(logs[1:2])}
        assert (1, 8) in shares, shares
        assert all(n < 8 for r, n in shares if r == 2), shares
        # Rank 0's median step time, before and after (round 1's first
        # steps ran before the straggler was flagged).
        def median(values):
            return sorted(values)[len(values) // 2]
        rank0 = [s for s in steps if s["rank"] == 0]
        before = median([s["seconds"] for s in rank0 if s["round"] == 1][2:])
        after = median([s["seconds"] for s in rank0 if s["round"] >= 2][1:])
        print(f"rebalanced: {cause}\nmedian step {before * 1e3:.1f} ms "
              f"before, {after * 1e3:.1f} ms after")
        assert after < before, (before, after, cause)


def test_a_rank_without_micro_batches_still_takes_part(coordinator):
    """Micro-batches of 12: 2 a step for 3 ranks. Two ranks run one each,
    the third gets an empty span, whose forward of no samples gives zero
    gradients to DDP's all-reduce. Every step uses its 24 samples once,
    and the parameters are those of one process training on the whole
    batch of 24 (within 1e-5). One process sleeps 0.25 s in its
    micro-batch: a lone micro-batch is timed until its last gradient
    bucket was ready, so a rank that waits for that one in the all-reduce
    does not count the wait."""
    env = {"PLAN_MICRO_BATCH": "12", "PLAN_EPOCHS": "1", "PLAN_NNODES": "3"}
    with tempfile.TemporaryDirectory() as tmp:
        logs = [os.path.join(tmp, f"n{i}") for i in range(3)]
        out = finish([plan_process(coordinator, "plan-12", f"n{i}", logs[i],
                                   env_extra=dict(env, PLAN_SLOW="0.25")
                                   if i == 0 else env) for i in range(3)],
                     [(0,)] * 3)
        steps = committed_steps(logs)
        assert_each_sample_once(steps, out, count=10)
        assert sorted({(s["rank"], len(s["positions"])) for s in steps}) == \
            [(0, 12), (1, 12), (2, 0)], out
        job = gradsync.Client(coordinator).get_job("plan-12")
        loads = sorted((m.metrics.micro_batches.share,
                        m.metrics.micro_batches.seconds) for m in job.members)
        # An empty share reports no load (the coordinator balances only
        # ranks that ran micro-batches).
        assert [share for share, _ in loads] == [0, 1, 1], job.members
        assert loads[0][1] == 0 and loads[1][1] > 0, job.members
        assert loads[1][1] < 0.125, job.members  # not the sleeper's wait
        reference = MlpTrainer()
        x, y, epoch_order = plan_data(240)
        for k in range(10):
            idx = epoch_order(0)[24 * k:24 * (k + 1)]
            reference.optimizer.zero_grad()
            (torch.nn.functional.mse_loss(reference.model(x[idx]), y[idx],
                                          reduction="sum") / 24).backward()
            reference.optimizer.step()
        want = reference.parameters_list()
        for params in params_of(logs):
            for got, expected in zip(params, want):
                for a, b in zip(got, expected):
                    assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (a, b)


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
