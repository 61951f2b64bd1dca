"""PyTorch integration: torch.distributed on the coordinator's key-value
store, with no MASTER_ADDR and no TCPStore.

    import gradsync.torch  # registers the gradsync:// init method
    torch.distributed.init_process_group(
        "gloo", init_method="gradsync://COORDINATOR_HOST:PORT/JOB")

Under `gradsync launch` the process group bootstraps through the key-value
store of the process's round (GRADSYNC_JOB, GRADSYNC_ROUND, RANK and
WORLD_SIZE come from the launcher; rank= and world_size= given to
init_process_group win). Without the launcher the process joins the job
itself (gradsync.member.Member: it heartbeats and reports its completion at
exit) and takes the rank the coordinator gives it; the URL's query sets the
job's shape: gradsync://HOST:PORT/JOB?nnodes=MIN[:MAX]&nproc_per_node=N
&node_id=ID (default: nnodes = world_size, each process a node of its own).
gradsync.torch.Store is the store itself, for code that builds process
groups by hand. gradsync.torch.monitor(ddp) reports
a DDP model's steps and collectives for the coordinator's diagnosis (see
gradsync/monitor.py).
"""
import datetime
import os
import urllib.parse

import torch.distributed as dist

from gradsync.client import Client, Error
from gradsync.member import Member
from gradsync.monitor import Monitor, monitor  # noqa: F401

# Keys of the process group live under this prefix in the round's store.
_PREFIX = "torch/"

# The stores handed to torch.distributed. C++ keeps only the pybind
# trampoline of a Python store, which calls back into the Python object: the
# object must outlive the process group, so the module holds it.
_live_stores = []


def _keep(store):
    _live_stores.append(store)
    return store


class Store(dist.Store):
    """A torch.distributed.Store backed by the key-value store of round
    `round` of job `job_id` on `client`'s coordinator. get() and wait()
    block until the keys exist, up to the store's timeout. Keep a reference
    to a Store you hand to torch.distributed yourself for as long as its
    process group lives (torch keeps only a C++ handle to it)."""

    def __init__(self, client, job_id, round,
                 timeout=datetime.timedelta(minutes=5)):
        super().__init__()
        self._kv = client.kv(job_id, round)
        self._timeout = timeout

    def set_timeout(self, timeout):
        self._timeout = timeout

    def set(self, key, value):
        self._kv.set(_PREFIX + key, value)

    def get(self, key):
        self._kv.wait([_PREFIX + key], self._timeout.total_seconds())
        return self._kv.get(_PREFIX + key)

    def add(self, key, value):
        return self._kv.add(_PREFIX + key, value)

    def compare_set(self, key, expected, desired):
        expected = bytes(expected) if expected else None
        _, value = self._kv.compare_and_set(_PREFIX + key, expected,
                                            bytes(desired))
        return value if value is not None else bytes(expected or b"")

    def wait(self, keys, timeout=None):
        seconds = (timeout or self._timeout).total_seconds()
        self._kv.wait([_PREFIX + k for k in keys], seconds)

    def check(self, keys):
        try:
            for key in keys:
                self._kv.get(_PREFIX + key)
        except Error as e:
            if e.code == "NOT_FOUND":
                return False
            raise
        return True

    def delete_key(self, key):
        self._kv.delete(_PREFIX + key)
        return True


def _int_setting(query, name, env):
    values = query.get(name)
    value = values[0] if values else os.environ.get(env)
    if value is None:
        raise ValueError(f"gradsync:// needs {name}= or {env} in the "
                         "environment (run under `gradsync launch`)")
    return int(value)


def _rendezvous(url, timeout=datetime.timedelta(minutes=5), **kwargs):
    """The gradsync:// rendezvous handler: (store, rank, world_size)."""
    parsed = urllib.parse.urlparse(url)
    query = urllib.parse.parse_qs(parsed.query)
    job = parsed.path.lstrip("/") or os.environ.get("GRADSYNC_JOB", "")
    if not parsed.netloc or not job:
        raise ValueError(f"gradsync://HOST:PORT/JOB expected, got '{url}'")
    client = Client(parsed.netloc)
    round_ = os.environ.get("GRADSYNC_ROUND")
    if round_ is None:  # no launcher: join as a member of our own
        def first(name, default=None):
            return query.get(name, [default])[0]
        nnodes = first("nnodes", first("world_size"))
        if nnodes is None:
            raise ValueError("gradsync:// outside `gradsync launch` needs "
                             "nnodes= in the URL or world_size=")
        member = Member(client, job, nnodes=nnodes,
                        nproc_per_node=int(first("nproc_per_node", 1)),
                        node_id=first("node_id"))
        a = member.assignment
        yield _keep(Store(client, job, a.round, timeout)), a.rank, a.world_size
        raise RuntimeError("gradsync:// rendezvous runs once per process group")
    if job != os.environ.get("GRADSYNC_JOB", job):
        raise ValueError(f"gradsync://.../{job} names another job than this "
                         f"process's ({os.environ['GRADSYNC_JOB']})")
    rank = _int_setting(query, "rank", "RANK")
    world_size = _int_setting(query, "world_size", "WORLD_SIZE")
    yield _keep(Store(client, job, int(round_), timeout)), rank, world_size
    raise RuntimeError("gradsync:// rendezvous runs once per process group")


dist.register_rendezvous_handler("gradsync", _rendezvous)
