"""In-place recovery for a PyTorch training loop: gradsync's job runtime
(the C++ one gradsync-worker runs on, through gradsync._C) drives the
loop round after round. When a peer is lost, the survivors do not restart:
the collective in flight fails, train() returns by the exception, and the
runtime re-forms the round (with a spare, or a restarted process, in the
lost one's place) and calls train() again with the new round's process
group; the first thing train() does is take the training state from the
round's source rank, the member with the most committed steps.

    class MyTrainer(gradsync.elastic.Trainer):
        def __init__(self):
            super().__init__()
            self.model, self.optimizer, self.step = ..., ..., 0
        def committed_step(self):
            return self.step
        def train(self, round):
            gradsync.elastic.copy_state(round, self.model, self.optimizer,
                                        self)      # from the source rank
            ddp = DistributedDataParallel(self.model,
                                          process_group=round.process_group)
            while self.step < STEPS:
                ...  # forward, backward, optimizer step on this rank's
                self.step += 1                     # share of the step's batch
                round.report_step(self.step)

    gradsync.elastic.run(MyTrainer(), coordinator="HOST:29400", job="mlp",
                         nnodes="3")

Under `gradsync launch --self_managed` the launcher's coordinator, job and
join settings are used (and only a dead process restarts). The round's
process group is the backend "gradsync" (gradsync.torch): shared memory on
one host, Gloo across hosts, NCCL with device="cuda" (its tensors on
tensor_device(round); a failed all-reduce raises from wait() or backward(),
before the optimizer step). A loop must keep the state of its last
committed step when a step fails (an optimizer step that did not run left
it so; the buffers and random draws of a failed forward, copy_state puts
back), and make
a step's data depend on the step and the round's rank and world size only,
so that a redone step is the same step. Every run(fingerprint_every=...)
steps and after the last, each rank sends a fingerprint of copy_state's
model and optimizer; a replica that differs from the majority's is healed
in place from a majority rank (see run()). A loop with an exact global
batch runs each step's share through micro_batches(); with observe(ddp,
round) the coordinator also finds stragglers and moves micro-batches away
from them (run(exact_global_batch=True)).
"""
import atexit
import io
import os
import tempfile
import threading
import time

import torch

from gradsync import _C
from gradsync import _stacks

Round = _C.Round
ReformAtStepBoundary = _C.ReformAtStepBoundary
ReformAtStepBoundary.__doc__ = """Raised by train() to end its round at a
step boundary because should_reform() said so (every rank after the same
committed step): the runtime re-forms the round at once, with the node
that waited to join, without counting a recovery."""
ReformVoteFailed = _C.ReformVoteFailed
ReformVoteFailed.__doc__ = """A ReformAtStepBoundary that should_reform()
raises when this rank was asked to re-form and the ranks' agreement failed:
a peer that agreed may have rejoined first (the re-form is as planned, no
recovery counted) or may have died (a recovery): the next round tells."""


class Trainer(_C.Trainer):
    """A training loop that keeps its state across rounds. Subclasses define
    train(round) and committed_step(); has_state() defaults to
    committed_step() > 0. Used by one thread."""

    def has_state(self):
        return self.committed_step() > 0

    def _train_returned(self, round):
        """Called by the runtime when train(round) returned: the replica's
        fingerprint after the last committed step."""
        _replica.after_training(round, self.committed_step())

    def committed_step(self):
        raise NotImplementedError

    def train(self, round):
        raise NotImplementedError


def run(trainer, coordinator="", job="", nnodes="1", nproc_per_node=1,
        node_id="", failure_policy="", shared_memory=True, timeout=300.0,
        max_recoveries=3, last_call=30.0, token_file="", device="cpu",
        failpoint="", fingerprint_every=100, divergence_policy="",
        exact_global_batch=False, straggler_policy="",
        straggler_threshold=0.0, collective_timeout_factor=10.0,
        min_collective_timeout=10.0):
    """Joins the job (or takes the assignment `gradsync launch` made) and
    calls trainer.train(round) round after round until it returns, then
    reports success. Raises RuntimeError with the error that ended the job
    (a failure the runtime could not recover from, or max_recoveries
    used up), which it reported to the coordinator. `last_call`: seconds a
    round of MIN:MAX nodes waits for more once MIN have joined. `device`:
    "cpu" (Gloo, shared memory on one host); "cuda", a GPU per process
    (NCCL; the process keeps the GPU it got first, tensor_device(round)
    names it); or "sim", a simulated GPU per process (host memory through
    the NCCL backend, its abort and re-create included:
    GRADSYNC_SIM_DEVICES devices per host), for tests. `failpoint`, for
    tests: "nccl_async_error:N" (this process's N-th NCCL collective ends
    with an asynchronous error after it was enqueued) and/or "nccl_hang:N"
    (it never ends), comma-separated; device "cuda" or "sim" only.

    Divergent replicas: after every `fingerprint_every`-th committed step
    (round.report_step) and after the last (when train() returns), each
    rank fingerprints the parameters of the model copy_state was given and
    that optimizer's state (per tensor, a checksum computed where the tensor
    is; one synchronization on a GPU) and sends it with its heartbeats; the
    coordinator compares the ranks' fingerprints of a step. On a mismatch
    `divergence_policy` "heal" (the default, as the job's first join sets
    it) re-forms the round with the state copied from a rank of the
    majority (copy_state), "fail" fails the job. 0 turns fingerprints off;
    a loop that never calls copy_state sends none.

    Stragglers: a rank whose first gradient bucket is ready later than the
    earliest rank's by more than `straggler_threshold` seconds (0: the
    coordinator's, 100 ms), consistently, is named in the job's diagnosis;
    ranks report those times when the loop calls observe(ddp, round). With
    `exact_global_batch=True` (the loop runs a GlobalBatchPlan through
    micro_batches()) and `straggler_policy` "rebalance" (the default, as
    the job's first join sets it), the coordinator then moves micro-batches
    from the straggler to the others: should_reform() says so after a step,
    and the next round's round.micro_batch_shares carry the new division.
    "report" only names stragglers.

    Collective timeout: once a round has 8 steps, a collective that takes
    longer than `collective_timeout_factor` times the round's 99th
    percentile step time (at least `min_collective_timeout` seconds, at
    most `timeout`) aborts the round's process group, and the round
    re-forms (a recovery). 0 turns it off (`timeout` alone applies). A step
    after which rank 0 writes a slow checkpoint is reported with
    `round.report_step(..., checkpoint=True)` on every rank.

    When the coordinator diagnoses a hang and asks this rank for its stacks,
    the runtime answers with every thread's Python stack (faulthandler, on
    a real-time signal of its own), shown by `gradsync status`."""
    if (not isinstance(fingerprint_every, int) or
            isinstance(fingerprint_every, bool) or fingerprint_every < 0):
        raise ValueError("fingerprint_every must be a whole number of steps, "
                         f"0 or more (0: off), not {fingerprint_every!r}")
    _replica.every = fingerprint_every
    stacks_file = _register_for_stacks()
    _C.run_job(trainer, coordinator=coordinator, job=job, nnodes=str(nnodes),
               nproc_per_node=nproc_per_node, node_id=node_id,
               failure_policy=failure_policy, shared_memory=shared_memory,
               timeout_seconds=float(timeout), max_recoveries=max_recoveries,
               last_call_seconds=float(last_call), token_file=token_file,
               device=device, failpoint=failpoint,
               divergence_policy=divergence_policy,
               exact_global_batch=bool(exact_global_batch),
               straggler_policy=straggler_policy,
               straggler_threshold_seconds=float(straggler_threshold),
               stacks_file=stacks_file,
               collective_timeout_factor=float(collective_timeout_factor),
               min_collective_timeout_seconds=float(min_collective_timeout))


_stacks_file = None  # faulthandler's file while this process is registered


def _register_for_stacks():
    """The path of a file of this process's own, removed at exit, into
    which faulthandler dumps every thread's Python stack when the runtime
    answers a hang verdict (on _C.python_stacks_signal(): the runtime's
    own stack capture has the launcher's signal); registered once."""
    global _stacks_file
    if _stacks_file is None:
        descriptor, path = tempfile.mkstemp(prefix="gradsync-stacks-")
        os.close(descriptor)
        atexit.register(os.remove, path)
        _stacks_file = _stacks.register(path, _C.python_stacks_signal())
    return _stacks_file.name


GlobalBatchPlan = _C.GlobalBatchPlan
GlobalBatchPlan.__doc__ = """An exact global batch, the C++ trainer's rules
(worker/data/global_batch.h): GlobalBatchPlan(B, b, N). Step k of an epoch
uses positions [k*B, (k+1)*B) of the epoch's order, cut into B/b
micro-batches of b; rank r of W runs plan.share(r, W, round.micro_batch_shares)
= (first, count) of them (accumulating gradients: DDP's no_sync() for all
but the last) and divides its samples' summed loss by plan.loss_divisor(W).
Every sample of an epoch is used exactly once with weight 1/B whatever the
world size, also when the round shrinks or grows mid-epoch."""


def step_positions(plan, round, step_in_epoch):
    """The epoch-order positions this rank trains on in step
    `step_in_epoch` (0-based) of the round: a list of (begin, end), one
    per micro-batch, in order. ValueError for a step the epoch does not
    have (0 to plan.steps_per_epoch - 1)."""
    if not 0 <= step_in_epoch < plan.steps_per_epoch:
        raise ValueError(f"step_in_epoch {step_in_epoch} is not in [0, "
                         f"{plan.steps_per_epoch}): the epoch's steps")
    first, count = plan.share(round.rank, round.world_size,
                              round.micro_batch_shares)
    start = step_in_epoch * plan.global_batch
    return [plan.micro_batch_span(start, j) for j in range(first, first + count)]


def micro_batches(plan, round, step_in_epoch, ddp):
    """Yields this rank's micro-batches of step `step_in_epoch` (0-based) of
    the epoch, as (begin, end) epoch-order positions (step_positions), all
    but the last inside ddp.no_sync(), so that gradients accumulate and the
    last one's backward all-reduces them; a rank whose share is empty (more
    ranks than micro-batches) gets one empty span (begin == end): a forward
    of no samples gives zero gradients and still joins the all-reduce.

        for begin, end in gradsync.elastic.micro_batches(plan, round, k, ddp):
            idx = order[begin:end]
            loss = loss_fn(ddp(x[idx]), y[idx], reduction="sum")
            (loss / plan.loss_divisor(round.world_size)).backward()

    It times the micro-batches, and the next round.report_step sends how
    many this rank ran and what one took (the mean of those before the
    last, which do not synchronize, measured on a GPU from and to an idle
    device: two waits a step; a lone one until its last gradient bucket
    was ready, on a GPU queued, when observe() watches `ddp`), which is
    what the coordinator divides a step by when it moves micro-batches
    away from a straggler (run()'s exact_global_batch)."""
    spans = step_positions(plan, round, step_in_epoch)
    per_step = plan.micro_batches_per_step
    if not spans:
        start = step_in_epoch * plan.global_batch
        _load.set(round, 0, per_step, 0.0, 0)
        yield (start, start)
        return
    device = tensor_device(round)
    start = _idle_time(device)
    for span in spans[:-1]:
        with ddp.no_sync():
            yield span
    before_last = len(spans) - 1
    if before_last:
        seconds = (_idle_time(device) - start) / before_last
        yield spans[-1]
    else:  # a lone micro-batch: without the wait for its all-reduce
        yield spans[-1]
        seconds = (_observer.last_ready(round, start) or
                   time.perf_counter()) - start
    _load.set(round, len(spans), per_step, seconds,
              sum(end - begin for begin, end in spans))


def _idle_time(device):
    """time.perf_counter(), on a GPU once `device` finished its work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def observe(ddp, round):
    """Registers a DDP communication hook on `ddp` (the round's
    DistributedDataParallel over round.process_group) that all-reduces each
    bucket to its average, as DDP does, and notes when each step's first
    gradient bucket was ready (the coordinator compares the ranks' times to
    find stragglers: run()'s straggler_threshold) and how long the step
    waited for communication after its last bucket was ready (COMM TIME in
    `gradsync status`), which the next round.report_step sends. Call it
    once per DDP, before its first step, instead of ddp.register_comm_hook
    (a loop with a hook of its own reports neither). A step that trains
    several observed DDPs reports the earliest first bucket of any and the
    sum of their waits."""
    _observer.watch(round, ddp)


def tensor_device(round):
    """The torch.device the round's process group takes tensors on: the
    process's GPU ("cuda:N", the same in every round) with device="cuda",
    else the CPU (a simulated GPU's buffers are host memory). A loop moves
    its model there and makes it the current device:

        device = gradsync.elastic.tensor_device(round)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.model.to(device)
    """
    if round.device.startswith("cuda:"):
        return torch.device(round.device)
    return torch.device("cpu")


def _broadcast(group, tensor, root):
    options = torch.distributed.BroadcastOptions()
    options.rootRank = root
    group.broadcast([tensor], options).wait()


def should_reform(round):
    """After a committed step: whether the coordinator asked this round to
    re-form at a step boundary (a node waits to join a round below MAX, or
    a straggler's micro-batches move), agreed among the ranks so that every
    rank stops after the same step (one all-reduce of a flag; nothing when
    the round may not re-form). Then raise ReformAtStepBoundary. Collective:
    every rank calls it after every step. When this rank was asked and the
    all-reduce fails (a rank that saw the agreement first may have rejoined
    already), it raises ReformVoteFailed; otherwise the all-reduce's
    error."""
    if not round.may_reform:
        return False
    asked = round.reform_requested()
    flag = torch.tensor([1 if asked else 0],
                        dtype=torch.int32, device=tensor_device(round))
    try:
        round.process_group.allreduce([flag]).wait()
    except RuntimeError as error:
        if asked:
            raise ReformVoteFailed(
                f"the ranks' agreement to re-form failed: {error}") from error
        raise
    return bool(flag.item())


class _Committed:
    """What a step changes before it is known to be good, as the last
    committed step (round.report_step) left it: the buffers of the model
    copy_state was last given (a forward moves BatchNorm's running
    statistics and batch counter) and the default random generators, on the
    CPU and on the round's GPU (dropout draws from them). A step that fails
    is trained again in the next round, so the next copy_state puts them
    back first. The buffers as one flat copy per dtype and device, by name
    (a model moved to its device in between is still the same model). Used
    by the training loop's thread."""

    def __init__(self):
        self._model = None
        self._device = None
        self._groups = []  # (names, values): one dtype and device each
        self._rng = None   # (CPU generator state, GPU's or None)

    def take(self, model=None, device=None):
        """Copies the buffers of `model` (kept from now on, with the GPU
        `device`) or of the model kept before, and the generators' states,
        as they are now."""
        if model is not None:
            self._model, self._device = model, device
        if self._model is None:
            return
        groups = {}
        for name, buffer in self._model.named_buffers():
            if buffer is not None and buffer.numel() > 0:
                key = (buffer.device, buffer.dtype)
                groups.setdefault(key, []).append((name, buffer))
        with torch.no_grad():
            self._groups = [
                ([name for name, _ in members],
                 torch.cat([b.reshape(-1) for _, b in members]))
                for members in groups.values()]
        gpu = (torch.cuda.get_rng_state(self._device)
               if self._device is not None and self._device.type == "cuda"
               else None)
        self._rng = (torch.get_rng_state(), gpu)

    def restore(self, model):
        """Puts the copies back when `model` is the model they were taken
        of."""
        if model is not self._model or self._rng is None:
            return
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for names, values in self._groups:
                offset = 0
                for name in names:
                    buffer = buffers[name]
                    part = values[offset:offset + buffer.numel()]
                    buffer.copy_(part.view_as(buffer))
                    offset += buffer.numel()
        cpu, gpu = self._rng
        torch.set_rng_state(cpu)
        if gpu is not None:
            torch.cuda.set_rng_state(gpu, self._device)


class _Replica:
    """What the coordinator compares across ranks to catch a replica that
    silently stopped being one: the parameters of the model copy_state was
    last given, in named_parameters() order, then that optimizer's state
    tensors of each ("fc1.weight:momentum_buffer", ...), digested by the
    runtime (worker/ddp/tensor_digest.h, gradsync-worker's rule). Used by the
    training loop's thread."""

    def __init__(self):
        self.every = 0       # run()'s fingerprint_every
        self._model = None
        self._optimizer = None
        self._sent = None    # (round number, step) of the last one sent

    def watch(self, model, optimizer):
        self._model, self._optimizer = model, optimizer

    def after_step(self, round, step):
        """After committed step `step`: a fingerprint when one is due."""
        if self.every > 0 and step % self.every == 0:
            self._send(round, step)

    def after_training(self, round, step):
        """After the last step: a fingerprint unless that step had one."""
        if self.every > 0 and step > 0 and self._sent != (round.number, step):
            self._send(round, step)

    def _send(self, round, step):
        if self._model is None:
            return
        names, tensors, state_names, state_tensors = [], [], [], []
        state = self._optimizer.state if self._optimizer is not None else {}
        for name, parameter in self._model.named_parameters():
            names.append(name)
            tensors.append(parameter.detach())
            for key, value in sorted(state.get(parameter, {}).items()):
                if torch.is_tensor(value):
                    state_names.append(f"{name}:{key}")
                    state_tensors.append(value.detach())
        round.report_fingerprint(step, names + state_names,
                                 tensors + state_tensors)
        self._sent = (round.number, step)


class _StepClock:
    """The time from one committed step of a round to the next, for a
    report_step that does not give step_seconds (the step time `gradsync
    status` shows, samples/s, and what the self-set collective and hang
    timeouts follow); a round's first step counts from the end of
    copy_state. Used by the training loop's thread."""

    def __init__(self):
        self._round = None
        self._last = 0.0

    def start(self, round):
        self._round, self._last = round.number, time.monotonic()

    def elapsed(self, round):
        """Seconds since the round's previous step (or copy_state); 0 when
        not known."""
        if self._round != round.number:
            return 0.0
        return time.monotonic() - self._last


class _MicroBatchLoad:
    """This rank's part of the step in progress (micro_batches()), for the
    next report_step. Used by the training loop's thread."""

    def __init__(self):
        # (round number, count, per step, seconds, samples)
        self._pending = None

    def set(self, round, count, per_step, seconds, samples):
        self._pending = (round.number, count, per_step, seconds, samples)

    def get(self, round):
        """(count, per step, seconds, samples) of the round's step, zeros
        when micro_batches() did not run it."""
        if self._pending is None or self._pending[0] != round.number:
            return 0, 0, 0.0, 0
        return self._pending[1:]

    def clear(self):
        self._pending = None


class _Observed:
    """One DDP's hook (observe()) and what it saw of the step in progress.
    Thread-safe: the hook runs on the autograd thread, the all-reduces'
    completions on the backend's."""

    def __init__(self, group):
        self._lock = threading.Lock()
        self._group = group
        self._first_ready = 0.0  # time.time() of the first bucket; 0: none
        self._last_ready = 0.0   # time.perf_counter() of the last one's
        self._done = 0.0         # and of the end of the last all-reduce

    def hook(self, state, bucket):
        now = time.perf_counter()
        with self._lock:
            if self._first_ready == 0.0:
                self._first_ready = time.time()
            if bucket.is_last():
                self._last_ready = now

        def done(future):
            with self._lock:
                self._done = max(self._done, time.perf_counter())
            return future.value()[0]

        # The average in the all-reduce itself (gradsync's backends divide
        # as they reduce; one rank: nothing), not a pass over the bucket
        # first, as default_hooks.allreduce_hook makes.
        options = torch.distributed.AllreduceOptions()
        options.reduceOp = torch.distributed.ReduceOp.AVG
        return self._group.allreduce([bucket.buffer()],
                                     options).get_future().then(done)

    def step(self):
        """(first bucket ready as Unix seconds or 0, last bucket ready as
        perf_counter or 0, exposed communication seconds) of the step."""
        with self._lock:
            first, last, done = self._first_ready, self._last_ready, self._done
        return first, last, max(0.0, done - last) if last > 0 else 0.0

    def clear(self):
        with self._lock:
            self._first_ready = self._last_ready = self._done = 0.0


class _Observer:
    """The DDPs observe() watches in the current round, and what they saw
    of its step in progress: the first bucket ready of any of them (a step
    that trains two models starts communicating with the first), the last
    one's last bucket, and the sum of their exposed communication (each
    DDP's backward waits for its own). Watch, get and clear on the
    training loop's thread; the hooks run on autograd's."""

    def __init__(self):
        self._round = None
        self._watched = []

    def watch(self, round, ddp):
        observed = _Observed(round.process_group)
        if self._round != round.number:  # the last round's DDPs are gone
            self._round, self._watched = round.number, []
        ddp.register_comm_hook(state=None, hook=observed.hook)
        self._watched.append(observed)

    def _steps(self, round):
        return ([o.step() for o in self._watched]
                if self._round == round.number else [])

    def last_ready(self, round, since):
        """When the step's last bucket was ready, if it was after `since`
        (perf_counter) in the round's DDPs; None otherwise."""
        last = max((s[1] for s in self._steps(round)), default=0.0)
        return last if last > 0 and last >= since else None

    def get(self, round):
        """(first bucket ready as Unix seconds, exposed communication
        seconds) of the round's step, zeros when not observed."""
        steps = self._steps(round)
        first = min((s[0] for s in steps if s[0] > 0), default=0.0)
        return first, sum(s[2] for s in steps)

    def clear(self):
        """Starts the next step."""
        for observed in self._watched:
            observed.clear()


_committed = _Committed()
_replica = _Replica()
_clock = _StepClock()
_load = _MicroBatchLoad()
_observer = _Observer()
_native_report_step = Round.report_step


def _report_step(self, step, samples=None, loss=0.0, step_seconds=None,
                 checkpoint=False):
    """Reports committed step `step` (call after every optimizer step):
    `samples` this rank trained on (default: its micro-batches' samples
    when the step ran through micro_batches(), else 0), its `loss`, and the
    step's duration
    (default: the time since the round's previous report_step, or since
    copy_state for the first). Heartbeats carry it: `gradsync status`'s
    step time and samples/s, and the step times that the collective and
    hang timeouts set themselves from. Also keeps the buffers of
    copy_state's model and the random generators' states as this step left
    them, for the next copy_state, and sends the replica's fingerprint when
    one is due (run()'s fingerprint_every). With the step run through
    micro_batches() and `ddp` watched by observe(), it also sends this
    rank's micro-batches and what one took, when the step's first gradient
    bucket was ready and its wait for communication. `checkpoint=True`
    (on every rank): rank 0 writes a checkpoint after this step, which the
    others wait for in their next collective, so that wait is left to the
    backend's timeout rather than the self-set collective timeout (see
    run()'s min_collective_timeout). Raises ValueError for
    a report that cannot be (a step below 1, a negative count or time),
    which changes nothing; RuntimeError once the coordinator failed the
    job."""
    count, per_step, micro_batch_seconds, trained = _load.get(self)
    first_ready, communication = _observer.get(self)
    reported = _native_report_step(
        self, step, samples=trained if samples is None else samples,
        loss=loss,
        step_seconds=_clock.elapsed(self) if step_seconds is None
        else step_seconds,
        micro_batches=count, micro_batches_per_step=per_step,
        micro_batch_seconds=micro_batch_seconds,
        first_bucket_ready=first_ready, communication_seconds=communication,
        checkpoint=bool(checkpoint))
    # Reported: what the step measured is spent, its state committed.
    _clock.start(self)
    _load.clear()
    _observer.clear()
    _committed.take()
    _replica.after_step(self, step)
    return reported


Round.report_step = _report_step


def copy_state(round, model, optimizer=None, trainer=None):
    """Makes every rank's training state the round's source rank's: the
    model's state_dict, the optimizer's, and trainer.step when a trainer is
    given (the committed step). Collective: every rank of the round calls it
    first in train(). The state travels as one serialized buffer over the
    round's process group, on tensor_device(round).

    A step that failed has already moved the model's buffers in its forward
    (BatchNorm's running statistics and batch counter) and drawn from the
    default random generators (dropout); copy_state first puts back, on
    this rank, the buffers and generator states of the last committed step
    (round.report_step keeps them for the model copy_state was last given),
    so that the step trains again from the committed state, as an
    uninterrupted run does. The generators are not copied between ranks: a
    new process's are its own."""
    _committed.restore(model)
    _share_state(round, model, optimizer, trainer)
    _committed.take(model, tensor_device(round))
    _replica.watch(model, optimizer)
    _clock.start(round)


def _share_state(round, model, optimizer, trainer):
    """copy_state's transfer from the source rank."""
    group = round.process_group
    if round.world_size == 1:
        return
    device = tensor_device(round)
    source = round.source_rank
    if round.rank == source:
        buffer = io.BytesIO()
        torch.save({
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer else None,
            "step": trainer.step if trainer is not None else None,
        }, buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()),
                                dtype=torch.uint8).to(device)
        size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    _broadcast(group, size, source)
    if round.rank != source:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _broadcast(group, data, source)
    if round.rank == source:
        return
    # Loaded on the CPU (the source's GPU index may not be this process's),
    # then copied into the model's and optimizer's own tensors.
    state = torch.load(io.BytesIO(data.cpu().numpy().tobytes()),
                       map_location="cpu")
    model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if trainer is not None and state["step"] is not None:
        trainer.step = state["step"]
