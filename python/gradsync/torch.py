"""PyTorch integration: torch.distributed on the coordinator's key-value
store, with no MASTER_ADDR and no TCPStore.

    import gradsync.torch  # registers the gradsync:// init method
    torch.distributed.init_process_group(
        "gloo", init_method="gradsync://COORDINATOR_HOST:PORT/JOB")

Under `gradsync launch` the process group bootstraps through the key-value
store of the process's round (GRADSYNC_JOB, GRADSYNC_ROUND, RANK and
WORLD_SIZE come from the launcher; rank= and world_size= given to
init_process_group win). gradsync.torch.Store is the store itself, for
code that builds process groups by hand. gradsync.torch.monitor(ddp) reports
a DDP model's steps and collectives for the coordinator's diagnosis (see
gradsync/monitor.py).
"""
import datetime
import os
import urllib.parse

import torch.distributed as dist

from gradsync.client import Client, Error
from gradsync.monitor import Monitor, monitor  # noqa: F401

# Keys of the process group live under this prefix in the round's store.
_PREFIX = "torch/"


class Store(dist.Store):
    """A torch.distributed.Store backed by the key-value store of round
    `round` of job `job_id` on `client`'s coordinator. get() and wait()
    block until the keys exist, up to the store's timeout."""

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
    round_ = os.environ.get("GRADSYNC_ROUND")
    if not parsed.netloc or not job:
        raise ValueError(f"gradsync://HOST:PORT/JOB expected, got '{url}'")
    if round_ is None:
        raise ValueError("gradsync:// needs GRADSYNC_ROUND: run the program "
                         "under `gradsync launch`")
    if job != os.environ.get("GRADSYNC_JOB", job):
        raise ValueError(f"gradsync://.../{job} names another job than this "
                         f"process's ({os.environ['GRADSYNC_JOB']})")
    rank = _int_setting(query, "rank", "RANK")
    world_size = _int_setting(query, "world_size", "WORLD_SIZE")
    store = Store(Client(parsed.netloc), job, int(round_), timeout)
    yield store, rank, world_size
    raise RuntimeError("gradsync:// rendezvous runs once per process group")


dist.register_rendezvous_handler("gradsync", _rendezvous)
