"""A Python process that is a member of a job by itself (no launcher): it
joins the rendezvous, heartbeats from a thread (with what
gradsync.torch.monitor reports, through Member.report), and reports its
completion when the interpreter exits. Used by the gradsync:// init method
outside `gradsync launch`.

Heartbeats: on a stream that is opened again, with backoff, when it
breaks (a blip, a coordinator restart). Completion: success at a normal
exit; failure (exit code 1, with the exception) after an uncaught
exception; failure with the code after sys.exit(N) (or exit(N)) from the
main thread with N other than 0 and None (a string: code 1, the string as
the message). Python tells an exit hook nothing of a `raise SystemExit(N)`
written out by hand: that one reports success. A process that ends with
os._exit or a signal reports nothing: its heartbeats stop and the
coordinator finds it lost, as for any dead worker.
"""
import builtins
import atexit
import os
import secrets
import socket
import sys
import threading

import grpc

from gradsync._proto import (health_pb2, health_pb2_grpc, job_pb2,
                             rendezvous_pb2, rendezvous_pb2_grpc)
from gradsync.client import _call

_DEFAULT_INTERVAL = 1.0  # until the coordinator answers with the job's own
_MAX_EVENTS = 256  # the coordinator's limit per heartbeat (newest kept)
# Backoff between heartbeat streams after one broke.
_MIN_BACKOFF, _MAX_BACKOFF = 0.1, 1.0
# Answers after which there is nothing to reconnect to: the round is over
# (ABORTED), the job ended or is unknown, or the member is refused.
_FINAL = (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION,
          grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
          grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
_current = None  # this process's Member, once it joined


def current():
    """The Member this process joined as (gradsync:// outside `gradsync
    launch`), or None."""
    return _current


def _exit_outcome(code):
    """(exit code, message) of sys.exit(code), as the interpreter exits."""
    if code is None:
        return (0, "")
    if isinstance(code, int):
        return (code, f"exited with code {code}" if code else "")
    return (1, str(code))


class Member:
    """Joins `job` on `client`'s coordinator as one process of a node of its
    own (unless `node_id` groups several) and stays its member until exit.
    `assignment` is the gradsync.v1.Assignment of the round it joined."""

    def __init__(self, client, job, nnodes="1", nproc_per_node=1,
                 node_id=None, join_timeout=600.0):
        minimum, _, maximum = str(nnodes).partition(":")
        hostname = socket.gethostname()
        self._incarnation = secrets.token_hex(16)
        config = job_pb2.JobConfig(job_id=job, min_nodes=int(minimum),
                                   max_nodes=int(maximum or minimum),
                                   nproc_per_node=int(nproc_per_node))
        config.join_timeout.FromSeconds(int(join_timeout))
        request = rendezvous_pb2.JoinRequest(
            job_id=job, config=config,
            node=job_pb2.NodeDescriptor(
                node_id=node_id or f"{hostname}-{os.getpid()}",
                hostname=hostname, addresses=["127.0.0.1"], pid=os.getpid(),
                incarnation_id=self._incarnation,
                device_type=job_pb2.DEVICE_TYPE_CPU, device_count=1))
        rendezvous = rendezvous_pb2_grpc.RendezvousStub(client.channel)
        self._metadata = client.metadata
        self.assignment = _call("join", rendezvous.Join, request,
                                timeout=join_timeout + 30,
                                wait_for_ready=True,
                                metadata=self._metadata).assignment
        self._ref = health_pb2.MemberRef(
            job_id=job, round=self.assignment.round,
            rank=self.assignment.rank, incarnation_id=self._incarnation)
        self._monitor = health_pb2_grpc.MonitorStub(client.channel)
        self._stop = threading.Event()
        self._interval = _DEFAULT_INTERVAL
        self._failure = None  # (exit code, message) after an uncaught exception
        self._lock = threading.Lock()
        self._latest = job_pb2.WorkerMetrics(state=job_pb2.WORKER_STATE_TRAINING)
        self._events, self._ready = [], []  # since the last heartbeat
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name="gradsync-heartbeats")
        self._thread.start()
        previous_hook = sys.excepthook

        def hook(kind, value, traceback):
            self._failure = (1, f"{kind.__name__}: {value}")
            previous_hook(kind, value, traceback)
        sys.excepthook = hook
        self._exit_code = None  # (exit code, message) given to sys.exit
        self._hook_exits()
        atexit.register(self.finish)
        global _current
        _current = self

    def _hook_exits(self):
        """Wraps sys.exit (and the exit/quit builtins) so that the code a
        main thread exits with is known at completion."""
        def wrap(previous):
            def exit_with(code=None):
                if threading.current_thread() is threading.main_thread():
                    self._exit_code = _exit_outcome(code)
                previous(code)
            return exit_with
        sys.exit = wrap(sys.exit)
        for name in ("exit", "quit"):
            if callable(getattr(builtins, name, None)):
                setattr(builtins, name, wrap(getattr(builtins, name)))

    def report(self, metrics):
        """Makes `metrics` (a gradsync.v1.WorkerMetrics, e.g. from
        gradsync.torch.monitor) this member's latest: the next heartbeat
        carries them, with every collective and step event reported since
        the previous one (the newest 256 of each)."""
        with self._lock:
            self._events = (self._events + list(metrics.recent_collectives))[-_MAX_EVENTS:]
            self._ready = (self._ready + list(metrics.first_bucket_ready))[-_MAX_EVENTS:]
            self._latest = job_pb2.WorkerMetrics()
            self._latest.CopyFrom(metrics)
            del self._latest.recent_collectives[:]
            del self._latest.first_bucket_ready[:]

    def _next_metrics(self):
        with self._lock:
            metrics = job_pb2.WorkerMetrics()
            metrics.CopyFrom(self._latest)
            metrics.recent_collectives.extend(self._events)
            metrics.first_bucket_ready.extend(self._ready)
            self._events, self._ready = [], []
        return metrics

    def _requests(self):
        while not self._stop.is_set():
            yield health_pb2.HeartbeatRequest(member=self._ref,
                                              metrics=self._next_metrics())
            self._stop.wait(self._interval)

    def _heartbeat(self):
        """Heartbeats on a stream, and on a new one (after 0.1-1 s of
        backoff) when it breaks: a blip or a coordinator restart keeps the
        member's place if it comes back within the coordinator's reconnect
        grace. An answer that the round is over, or the job gone, ends it."""
        backoff, said = _MIN_BACKOFF, False
        while not self._stop.is_set():
            try:
                for answer in self._monitor.Heartbeat(self._requests(),
                                                      metadata=self._metadata):
                    seconds = answer.heartbeat_interval.ToTimedelta().total_seconds()
                    if seconds > 0:
                        self._interval = seconds
                    if said:
                        print(f"gradsync: heartbeats of rank {self._ref.rank} "
                              "reach the coordinator again", file=sys.stderr,
                              flush=True)
                    backoff, said = _MIN_BACKOFF, False
                why = "the coordinator closed the stream"
            except grpc.RpcError as e:
                if e.code() in _FINAL:
                    if not self._stop.is_set():
                        print(f"gradsync: heartbeats of rank {self._ref.rank} "
                              f"stopped: {e.code().name}: {e.details()}",
                              file=sys.stderr, flush=True)
                    return
                why = f"{e.code().name}: {e.details()}"
            if self._stop.is_set():
                return
            if not said:
                print(f"gradsync: heartbeats of rank {self._ref.rank} broke "
                      f"({why}); reconnecting", file=sys.stderr, flush=True)
                said = True
            self._stop.wait(backoff)
            backoff = min(2 * backoff, _MAX_BACKOFF)

    def finish(self):
        """Stops heartbeating and reports the completion (once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)
        code, message = self._failure or self._exit_code or (0, "")
        _call("report_completion", self._monitor.ReportCompletion,
              health_pb2.ReportCompletionRequest(
                  member=self._ref, success=code == 0, exit_code=code,
                  message=message),
              timeout=10, metadata=self._metadata)
