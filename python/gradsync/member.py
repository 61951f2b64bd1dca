"""A Python process that is a member of a job by itself (no launcher): it
joins the rendezvous, heartbeats from a thread (with what
gradsync.torch.monitor reports, through Member.report), and reports its
completion when the interpreter exits. Used by the gradsync:// init method
outside `gradsync launch`. The join, the heartbeats and the completion are
gradsync's C++ runtime (gradsync._C.Membership: the client and the
HealthReporter gradsync-worker runs on); this module adds what only Python
knows, how the process exits.

Heartbeats: on a stream that is opened again, with backoff, when it
breaks (a blip, a coordinator restart). Completion: the process's exit
status, reported when the process exits (after Python has finalized, from
a C exit handler: exit(N), sys.exit(N) and `raise SystemExit(N)` alike),
success for 0; an uncaught exception exits 1 and its text is the message;
sys.exit("text") exits 1 with the text. A process that ends with os._exit
or a signal reports nothing: its heartbeats stop and the coordinator finds
it lost, as for any dead worker.
"""
import builtins
import os
import socket
import sys
import threading

from gradsync._proto import job_pb2

try:
    from gradsync import _C as _native
except ImportError as e:  # a package built without its extension module
    _native = None
    _native_missing = str(e)

_current = None  # this process's Member, once it joined


def current():
    """The Member this process joined as (gradsync:// outside `gradsync
    launch`), or None."""
    return _current


class Member:
    """Joins `job` on `client`'s coordinator as one process of a node of its
    own (unless `node_id` groups several) and stays its member until exit.
    `assignment` is the gradsync.v1.Assignment of the round it joined.
    RuntimeError when the package has no extension module, or the join
    fails (naming why)."""

    def __init__(self, client, job, nnodes="1", nproc_per_node=1,
                 node_id=None, join_timeout=600.0):
        if _native is None:
            raise RuntimeError(
                "gradsync:// outside `gradsync launch` joins through the "
                f"package's extension module, which is missing ({_native_missing})")
        tls_ca, tls_cert, tls_key = client.tls
        self._membership = _native.Membership(
            client.target, job, str(nnodes), int(nproc_per_node),
            node_id or f"{socket.gethostname()}-{os.getpid()}",
            float(join_timeout), token=client.token or "",
            tls_ca=tls_ca or "", tls_cert=tls_cert or "", tls_key=tls_key or "")
        self.target, self.job = client.target, job
        self.assignment = job_pb2.Assignment.FromString(
            self._membership.assignment)
        previous_hook = sys.excepthook

        def hook(kind, value, traceback):
            self._membership.set_failure_message(f"{kind.__name__}: {value}")
            previous_hook(kind, value, traceback)
        sys.excepthook = hook
        self._hook_exit_messages()
        global _current
        _current = self

    def _hook_exit_messages(self):
        """Wraps sys.exit (and the exit/quit builtins) so that a text given
        to them from the main thread is the failure's message."""
        def wrap(previous):
            def exit_with(code=None):
                if (isinstance(code, str) and
                        threading.current_thread() is threading.main_thread()):
                    self._membership.set_failure_message(code)
                previous(code)
            return exit_with
        sys.exit = wrap(sys.exit)
        for name in ("exit", "quit"):
            if callable(getattr(builtins, name, None)):
                setattr(builtins, name, wrap(getattr(builtins, name)))

    def rejoin(self, timeout=None):
        """Joins the job's next round as a member of this one (a process
        group made again after destroy_process_group): the round is
        superseded, as by a survivor's rejoin, and self.assignment becomes
        the new round's. `timeout` (seconds; None: the job's join timeout)
        bounds the wait for the new round. RuntimeError when the join fails
        (its message says "timeout" when it ran out of time) or this member
        finished."""
        self._membership.rejoin(float(timeout or 0))
        self.assignment = job_pb2.Assignment.FromString(
            self._membership.assignment)

    def report(self, metrics):
        """Makes `metrics` (a gradsync.v1.WorkerMetrics, e.g. from
        gradsync.torch.monitor) this member's latest: the next heartbeat
        carries them, with every collective and step event reported since
        the previous one."""
        self._membership.report(metrics.SerializeToString())

    def finish(self, success=True, exit_code=0, message=""):
        """Stops heartbeating and reports the completion now instead of at
        the process's exit (once)."""
        self._membership.finish(success, exit_code, message)
