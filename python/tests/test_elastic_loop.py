"""gradsync.elastic's contract with a training loop, in one process or
none: observe()'s step reports, a global batch plan, should_reform()'s
vote, run()'s checks of its settings, what the runtime does when the loop's
own methods raise, and the imports a GPU machine's Python needs. (The
multi-process scenarios are test_elastic.py's.)"""
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import gradsync
import gradsync.elastic
from conftest import HERE


class _FakeGroup:
    """A process group whose all-reduces end when the test ends them."""

    def __init__(self):
        self.pending = []

    def allreduce(self, tensors, options):
        assert options.reduceOp == torch.distributed.ReduceOp.AVG
        future = torch.futures.Future()
        self.pending.append((future, tensors))

        class Work:
            def get_future(self):
                return future
        return Work()

    def end_all(self):
        for future, tensors in self.pending:
            future.set_result(tensors)
        self.pending = []


class _FakeDdp:
    def register_comm_hook(self, state, hook):
        self.hook = hook

    def backward(self, buckets):
        """Hands `buckets` buckets to the hook, the last one marked last."""
        return [self.hook(None, _FakeBucket(i == buckets - 1))
                for i in range(buckets)]


class _FakeBucket:
    def __init__(self, last):
        self._last = last

    def is_last(self):
        return self._last

    def buffer(self):
        return torch.zeros(2)


def test_a_step_of_two_observed_ddps_reports_the_first_bucket_and_both_waits():
    """observe() on two DDPs in one round (a step that trains two models):
    the step's first bucket is the earlier DDP's, its exposed communication
    each DDP's wait after its last bucket, summed; report_step starts the
    next step, and a new round forgets the last one's DDPs."""
    observer = gradsync.elastic._Observer()
    group = _FakeGroup()
    round1 = type("Round", (), {"number": 1, "process_group": group})()
    first, second = _FakeDdp(), _FakeDdp()
    observer.watch(round1, first)
    observer.watch(round1, second)
    assert observer.get(round1) == (0.0, 0.0)
    before = time.time()
    first.backward(2)
    between = time.time()
    time.sleep(0.05)   # the first DDP's all-reduces end 50 ms after its last
    group.end_all()
    second.backward(3)
    time.sleep(0.05)
    group.end_all()
    ready, exposed = observer.get(round1)
    assert before <= ready <= between, (before, ready, between)
    assert exposed >= 0.1, exposed
    assert observer.last_ready(round1, since=0.0) is not None
    observer.clear()
    assert observer.get(round1) == (0.0, 0.0)
    round2 = type("Round", (), {"number": 2, "process_group": group})()
    third = _FakeDdp()
    observer.watch(round2, third)
    first.backward(1)  # round 1's DDP, no longer watched
    group.end_all()
    assert observer.get(round2) == (0.0, 0.0)
    assert observer.get(round1) == (0.0, 0.0)


def test_a_global_batch_plan_places_each_rank_and_refuses_what_is_not_in_it():
    """GlobalBatchPlan(12, 2, 40): 6 micro-batches a step, 3 steps an epoch
    (a tail of 4 dropped). Shares, spans and divisors as the C++ trainer's;
    a rank, world, micro-batch or step outside the plan is a ValueError,
    not positions of another step's samples or of none."""
    elastic = gradsync.elastic
    plan = elastic.GlobalBatchPlan(12, 2, 40)
    assert (plan.micro_batches_per_step, plan.steps_per_epoch) == (6, 3)
    assert [plan.share(r, 4) for r in range(4)] == \
        [(0, 2), (2, 2), (4, 1), (5, 1)]
    assert plan.share(1, 2, [5, 1]) == (5, 1)
    assert plan.micro_batch_span(24, 5) == (34, 36)
    assert plan.loss_divisor(4) == 3.0
    round = type("Round", (), {"rank": 1, "world_size": 3,
                               "micro_batch_shares": [1, 3, 2]})()
    assert elastic.step_positions(plan, round, 2) == \
        [(26, 28), (28, 30), (30, 32)]
    for args, match in [((0, 2, 40), "at least 1"),
                        ((12, 5, 40), "multiple"),
                        ((12, 2, 11), "no whole global batch")]:
        with pytest.raises(ValueError, match=match):
            elastic.GlobalBatchPlan(*args)
    refused = [
        (lambda: plan.share(4, 4), "rank 4 is not in"),
        (lambda: plan.share(0, 0), "at least 1"),
        (lambda: plan.share(0, 2, [3, 2]), "do not divide"),
        (lambda: plan.micro_batch_span(36, 0), "position 36"),
        (lambda: plan.micro_batch_span(13, 0), "position 13"),
        (lambda: plan.micro_batch_span(12, 6), "micro-batch 6"),
        (lambda: plan.micro_batch_span(12, -1), "micro-batch -1"),
        (lambda: plan.loss_divisor(0), "at least 1"),
        (lambda: elastic.step_positions(plan, round, 3), "step_in_epoch 3"),
        (lambda: elastic.step_positions(plan, round, -1), "step_in_epoch -1"),
    ]
    for call, match in refused:
        with pytest.raises(ValueError, match=match):
            call()


class _VotingRound:
    """What should_reform() uses of a round, with an all-reduce that
    fails."""
    may_reform = True
    device = "cpu"

    def __init__(self, asked):
        self.asked = asked
        self.process_group = self

    def reform_requested(self):
        return self.asked

    def allreduce(self, tensors):
        raise RuntimeError("gradsync process group: allreduce #9 (shm, rank "
                           "1 of 2): CANCELLED: the backend was aborted")


def test_a_failed_vote_of_an_asked_rank_is_a_reform_vote_failure():
    """should_reform() on a rank the coordinator asked, whose all-reduce of
    the agreement fails (a peer that agreed first may have rejoined):
    ReformVoteFailed, a ReformAtStepBoundary; on a rank not asked, the
    all-reduce's own error."""
    with pytest.raises(gradsync.elastic.ReformVoteFailed) as failed:
        gradsync.elastic.should_reform(_VotingRound(asked=True))
    assert isinstance(failed.value, gradsync.elastic.ReformAtStepBoundary)
    assert "allreduce #9" in str(failed.value)
    with pytest.raises(RuntimeError) as raised:
        gradsync.elastic.should_reform(_VotingRound(asked=False))
    assert not isinstance(raised.value, gradsync.elastic.ReformAtStepBoundary)


def test_a_failed_vote_rejoins_and_counts_unless_the_reform_was_planned(
        coordinator):
    """train() raising ReformVoteFailed re-forms the round, as a failed
    vote does in gradsync-worker: the next round was not a planned re-form
    (no node waited), so it counts as a recovery, and the job goes on."""
    lines = [
        "import gradsync.elastic as elastic",
        "class Loop(elastic.Trainer):",
        "    rounds = 0",
        "    def committed_step(self):",
        "        return self.rounds",
        "    def train(self, round):",
        "        self.rounds += 1",
        "        if round.number == 1:",
        "            raise elastic.ReformVoteFailed('agreement failed')",
        "elastic.run(Loop(), coordinator=" + repr(coordinator) + ", "
        "job='elastic-vote', max_recoveries=1)",
        "print('done')"]
    done = _run_python("\n".join(lines))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done" in done.stdout, done.stdout + done.stderr
    job = gradsync.Client(coordinator).get_job("elastic-vote")
    assert gradsync.Client.state_name(job.state) == "succeeded", job
    assert job.round == 2, job
    assert job.recovery_count == 1, job


def test_fingerprint_every_must_be_a_count_of_steps():
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="fingerprint_every"):
            gradsync.elastic.run(None, fingerprint_every=bad)


class _Idle(gradsync.elastic.Trainer):
    """A loop with nothing committed, for what is checked before a join (its
    progress is read first: a loop without committed_step() raises)."""

    def committed_step(self):
        return 0

    def train(self, round):
        pass


def test_straggler_settings_are_checked_before_joining():
    """A negative threshold or an unknown policy is refused before any join
    (the coordinator's address reaches nothing)."""
    never = dict(coordinator="127.0.0.1:1", job="never")
    with pytest.raises(ValueError, match="straggler_threshold must be 0"):
        gradsync.elastic.run(_Idle(), **never,
                             straggler_threshold=-0.5)
    with pytest.raises(RuntimeError, match="'bogus'"):
        gradsync.elastic.run(_Idle(), **never,
                             straggler_policy="bogus", timeout=5.0)


def test_an_nccl_failpoint_needs_a_gpu_and_others_are_refused(tmp_path):
    """The failpoints a Python loop takes: the NCCL ones, on a GPU or a
    simulated one; anything else is refused before joining, naming why."""
    for device, spec, message in [
            ("cpu", "nccl_hang:3", "device='cuda' or device='sim'"),
            ("sim", "state_transfer", "does not apply to a Python"),
            ("sim", "nccl_hang:x", "nccl_hang:x")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            gradsync.elastic.run(_Idle(),
                                 coordinator="127.0.0.1:1", job="never",
                                 device=device, failpoint=spec)


def _run_python(code):
    """Runs `code` in a Python of its own with this tree's package; the
    CompletedProcess, its output as text."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=120, env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))


def test_elastic_needs_neither_grpc_nor_protobuf():
    """A GPU machine's Python may have torch and no protobuf (neither torch
    nor grpcio needs it): gradsync.elastic takes only torch and gradsync._C,
    the client's modules load on first use."""
    lines = [
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
        "print('imported')"]
    done = _run_python("\n".join(lines))
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr


@pytest.mark.parametrize("method", ["committed_step", "has_state"])
def test_a_loop_that_fails_again_while_its_failure_is_taken_fails_the_job(
        coordinator, method):
    """train() raises ReformAtStepBoundary, and then `method` raises when
    the runtime reads the loop's progress for the rejoin: run() raises
    RuntimeError naming both, the job fails with them (rather than the
    exception unwinding the runtime and the member going silent), and the
    round that train() was given is over (its calls raise, not read freed
    memory)."""
    job = f"elastic-twice-{method.replace('_', '-')}"
    lines = [
        "import gradsync.elastic as elastic",
        "kept = []",
        "class Loop(elastic.Trainer):",
        "    trained = False",
        "    def has_state(self):",
        f"        if self.trained and {method == 'has_state'}:",
        "            raise KeyError('no state kept')",
        "        return False",
        "    def committed_step(self):",
        f"        if self.trained and {method == 'committed_step'}:",
        "            raise KeyError('no step kept')",
        "        return 0",
        "    def train(self, round):",
        "        kept.append(round)",
        "        self.trained = True",
        "        raise elastic.ReformAtStepBoundary('at a boundary')",
        "try:",
        f"    elastic.run(Loop(), coordinator='{coordinator}', "
        f"job='{job}', max_recoveries=0)",
        "except RuntimeError as error:",
        "    print('run:', error)",
        "try:",
        "    print('rank', kept[0].rank)",
        "except RuntimeError as error:",
        "    print('round:', error)"]
    done = _run_python("\n".join(lines))
    assert done.returncode == 0, done.stdout + done.stderr
    raised = ("committed_step() raised KeyError: 'no step kept'"
              if method == "committed_step" else
              "has_state() raised KeyError: 'no state kept'")
    assert re.search(r"^run: .*ReformAtStepBoundary: at a boundary; then "
                     + re.escape(raised), done.stdout, re.M), \
        done.stdout + done.stderr
    assert "round: gradsync: this round is over" in done.stdout, done.stdout
    state = gradsync.Client(coordinator).get_job(job)
    assert gradsync.Client.state_name(state.state) == "failed", state
    assert raised in state.reason, state.reason


def test_a_loop_whose_progress_cannot_be_read_does_not_join(coordinator):
    """committed_step() raising before the first join is the caller's
    error: run() raises it as it is, and no job is made."""
    lines = [
        "import gradsync.elastic as elastic",
        "class Loop(elastic.Trainer):",
        "    def train(self, round):",
        "        pass",
        "try:",
        f"    elastic.run(Loop(), coordinator='{coordinator}', "
        "job='elastic-no-step')",
        "except NotImplementedError:",
        "    print('run: NotImplementedError')"]
    done = _run_python("\n".join(lines))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run: NotImplementedError" in done.stdout, done.stdout + done.stderr
    with pytest.raises(gradsync.client.Error):
        gradsync.Client(coordinator).get_job("elastic-no-step")
