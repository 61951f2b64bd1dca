"""gradsync.torch.monitor(): a PyTorch DDP job's own metrics, for the
coordinator's hang, desync and straggler diagnosis.

    ddp = DistributedDataParallel(model)
    gradsync.torch.monitor(ddp, batch_size=64)

It registers a DDP communication hook that wraps the default all-reduce: it
numbers every bucket's all-reduce (the collective's sequence number), keeps
its fingerprint (op, dtype, element count, bucket index), times it, notes
when each step's first bucket became ready, and counts a step when the last
bucket of an iteration is reduced; the step's communication time (COMM
TIME in status) is the wait the step's last bucket made it do: from its
launch, when backward produced its last gradient, to its end. After each
collective's start and end a sender thread passes the latest state on:
under `gradsync launch` as one datagram to the local agent
(GRADSYNC_AGENT_SOCKET), which folds it into the heartbeats it sends for
this rank; in a process that joined by itself (init_method="gradsync://...")
to its own membership, whose next heartbeat carries it. gradsync status then
shows the rank's step, samples/s, step and communication time, per-bucket
all-reduce times, and a rank that stops issuing collectives is named in the
hang diagnosis. Training never waits for either: while a state is on its
way, newer state accumulates and goes in the next one. One monitor reports
for a process: a later monitor() (a model wrapped again) closes the one
before, whose hook then only counts.
"""
import os
import socket
import threading
import time

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gradsync import _stacks
from gradsync import member as _member
from gradsync._proto import health_pb2, job_pb2

_DTYPES = {
    torch.float32: "float32", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.float64: "float64",
}


class Monitor:
    """The hook's state; made by monitor(). Thread-safe (the hook runs on
    the autograd thread, its completions on the backend's)."""

    def __init__(self, ddp, batch_size=None, process_group=None,
                 agent_socket=None):
        self._send, self._close_sender = _sender(agent_socket)
        # The DDP's own group unless told another (None would all-reduce
        # over the default group, whatever group the DDP was made on).
        self._group = (process_group if process_group is not None
                       else getattr(ddp, "process_group", None))
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._dirty = False      # state not yet sent
        self._started = 0        # sequence number of the last collective
        self._finished = 0
        self._step = 0
        self._step_seconds = 0.0
        self._step_end = None    # time.perf_counter() of the last step's end
        self._exposed = 0.0      # the last step's wait for its last bucket
        self._first_of_step = True
        self._events = []        # fingerprints not yet sent
        self._ready = []         # StepReady not yet sent
        self._buckets = {}       # index -> BucketStats of the latest step
        self._closed = False
        _register_for_stacks()
        try:
            ddp.register_comm_hook(state=None, hook=self._hook)
        except BaseException:
            self._close_sender()
            raise
        self._sender_thread = threading.Thread(
            target=self._send_until_closed, daemon=True,
            name="gradsync-monitor")
        self._sender_thread.start()

    def close(self):
        """Stops reporting: the sender thread ends (after the state on its
        way) and its socket is closed. The hook stays registered with its
        DDP model and goes on counting. Idempotent."""
        with self._lock:
            self._closed = True
            self._changed.notify()
        if threading.current_thread() is not self._sender_thread:
            self._sender_thread.join(timeout=10.0)
        self._close_sender()

    @property
    def step(self):
        with self._lock:
            return self._step

    def _hook(self, state, bucket):
        tensor = bucket.buffer()
        index, is_last = bucket.index(), bucket.is_last()
        count, nbytes = tensor.numel(), tensor.numel() * tensor.element_size()
        with self._lock:
            self._started += 1
            sequence = self._started
            if self._first_of_step:
                ready = job_pb2.StepReady(step=self._step + 1)
                ready.time.GetCurrentTime()
                self._ready.append(ready)
                self._first_of_step = False
            self._events.append(job_pb2.CollectiveFingerprint(
                sequence=sequence, op="allreduce",
                dtype=_DTYPES.get(tensor.dtype, str(tensor.dtype)),
                count=count, bucket_index=index))
            self._mark_locked()
        start = time.perf_counter()
        future = default_hooks.allreduce_hook(self._group, bucket)

        def done(f):
            seconds = time.perf_counter() - start
            with self._lock:
                self._finished = max(self._finished, sequence)
                self._buckets[index] = job_pb2.BucketStats(
                    index=index, bytes=nbytes, allreduce_seconds=seconds,
                    algbw_bytes_per_second=nbytes / seconds if seconds > 0 else 0)
                if is_last:
                    self._exposed = seconds
                    self._end_step_locked()
                self._mark_locked()
            return f.value()

        return future.then(done)

    def _end_step_locked(self):
        now = time.perf_counter()
        if self._step_end is not None:
            self._step_seconds = now - self._step_end
        self._step_end = now
        self._step += 1
        self._first_of_step = True

    def _mark_locked(self):
        self._dirty = True
        self._changed.notify()

    def _send_until_closed(self):
        while True:
            with self._lock:
                self._changed.wait_for(lambda: self._dirty or self._closed)
                if self._closed:
                    return
                self._dirty = False
                request = self._request_locked()
                self._events, self._ready = [], []
            self._send(request)

    def _request_locked(self):
        metrics = job_pb2.WorkerMetrics(
            state=job_pb2.WORKER_STATE_TRAINING, step=self._step,
            last_started_collective=self._started,
            last_finished_collective=self._finished,
            recent_collectives=self._events, first_bucket_ready=self._ready,
            buckets=[self._buckets[i] for i in sorted(self._buckets)])
        if self._step_seconds > 0:
            metrics.step_timings.step_seconds = self._step_seconds
            metrics.step_timings.communication_seconds = self._exposed
            if self._batch_size:
                metrics.samples_per_second = self._batch_size / self._step_seconds
        return health_pb2.HeartbeatRequest(metrics=metrics)


def _sender(agent_socket):
    """Where the monitor's state goes: a function of a HeartbeatRequest
    (its metrics), and one that closes what it holds. The `gradsync launch`
    agent's socket (`agent_socket`, or GRADSYNC_AGENT_SOCKET), else this
    process's own membership."""
    path = agent_socket or os.environ.get("GRADSYNC_AGENT_SOCKET")
    if path:
        ref = health_pb2.MemberRef(
            job_id=os.environ.get("GRADSYNC_JOB", ""),
            round=int(os.environ.get("GRADSYNC_ROUND", "0")),
            rank=int(os.environ.get("RANK", "0")))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.settimeout(5.0)

        def to_agent(request):
            request.member.CopyFrom(ref)
            try:
                sock.sendto(request.SerializeToString(), path)
            except OSError:
                pass  # the agent is gone: training goes on
        return to_agent, sock.close
    member = _member.current()
    if member is None:
        raise ValueError(
            "gradsync.torch.monitor reports through `gradsync launch` "
            "(GRADSYNC_AGENT_SOCKET) or through this process's own membership "
            "(dist.init_process_group(init_method=\"gradsync://HOST:PORT/JOB"
            "?nnodes=N\") first); this process has neither")
    return lambda request: member.report(request.metrics), lambda: None


_lock = threading.Lock()
_stacks_file = None  # the registration's open file, once registered
_latest = None       # the Monitor monitor() made last


def _register_for_stacks():
    """Lets `gradsync launch` show this process's Python stacks when the
    coordinator diagnoses a hang: on GRADSYNC_STACKS_SIGNAL, faulthandler
    appends every thread's stack to GRADSYNC_STACKS_FILE. The registration
    line is written last: the agent signals only a process that has it (the
    signal would end one that has not). Once per process; the file stays
    open (faulthandler writes to its descriptor). Nothing outside `gradsync
    launch`."""
    global _stacks_file
    path = os.environ.get("GRADSYNC_STACKS_FILE")
    signum = os.environ.get("GRADSYNC_STACKS_SIGNAL")
    with _lock:
        if path and signum and _stacks_file is None:
            _stacks_file = _stacks.register(path, int(signum))


def monitor(ddp, batch_size=None, process_group=None):
    """Reports `ddp`'s steps and collectives to the coordinator, through the
    local gradsync launch agent or this process's own membership (see the
    module comment); returns the Monitor. The monitor made by the call
    before, if any, is closed once this one stands."""
    global _latest
    made = Monitor(ddp, batch_size=batch_size, process_group=process_group)
    with _lock:
        before, _latest = _latest, made
    if before is not None:
        before.close()
    return made
