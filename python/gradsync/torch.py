"""PyTorch integration: torch.distributed on the coordinator's key-value
store, with no MASTER_ADDR and no TCPStore.

    import gradsync.torch  # registers the gradsync:// init method
    torch.distributed.init_process_group(
        "gloo", init_method="gradsync://COORDINATOR_HOST:PORT/JOB")

It also registers the process group backend "gradsync" (when the package
was built with its extension module, gradsync._C): the shared-memory
all-reduce when every rank is on one host, Gloo otherwise, with any
store: init_process_group("gradsync", ...).

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
import time
import urllib.parse

import torch.distributed as dist

from gradsync.client import Client, Error
from gradsync import member as _member
from gradsync.member import Member
from gradsync.monitor import Monitor, monitor  # noqa: F401

# gradsync._C, the extension module built against the installed torch
# (absent from a package installed without it): the process group backend
# "gradsync" (gradsync's shared-memory all-reduce when every rank runs on
# one host, Gloo otherwise) and the Store's key-value calls.
try:
    from gradsync import _C as _native
except ImportError as e:  # a build without the extension
    _native = None
    _native_missing = str(e)

# Keys of the process group live under this prefix in the round's store.
_PREFIX = "torch/"
# The longest one wait call asks the coordinator for (it takes up to an
# hour); Store.wait makes a longer or unlimited wait of several.
_WAIT_SLICE = 600.0

# The stores handed to torch.distributed. C++ keeps only the pybind
# trampoline of a Python store, which calls back into the Python object: the
# object must outlive the process group, so the module holds it.
_live_stores = []


def _keep(store):
    _live_stores.append(store)
    return store


# torch 2.x raises DistStoreError (a RuntimeError) from its stores.
_StoreErrorBase = getattr(dist, "DistStoreError", RuntimeError)


class StoreError(_StoreErrorBase):
    """A store call the coordinator refused or could not answer: a
    RuntimeError (torch 2.x: DistStoreError), as torch's own stores raise.
    `code` is the gRPC status code name."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class StoreTimeout(StoreError):
    """get() or wait() gave up: the message says "timeout" and names the
    keys still missing."""


class QueueEmpty(StoreError):
    """queue_pop(key, block=False) of an empty queue."""


def _bytes(value):
    return value.encode() if isinstance(value, str) else bytes(value)


class Store(dist.Store):
    """A torch.distributed.Store backed by the key-value store of round
    `round` of job `job_id` on `client`'s coordinator, under the prefix
    "torch/". get() and wait() block until the keys exist, up to the store's
    timeout (set_timeout, also through a PrefixStore over it), then raise
    StoreTimeout; other failures raise StoreError (both RuntimeErrors).
    Keys and values may be str or bytes; values come back as bytes. Keep a
    reference to a Store you hand to torch.distributed yourself for as long
    as its process group lives (torch keeps only a C++ handle to it).

    The calls go through gradsync's C++ client in the extension module
    (about half the cost of a python3-grpcio call) when the package has it
    and `native` is not False; `native=False` (or GRADSYNC_NATIVE_STORE=0)
    takes `client`'s python3-grpcio channel. Both retry a call the
    coordinator cannot answer (UNAVAILABLE) for up to a minute."""

    def __init__(self, client, job_id, round,
                 timeout=datetime.timedelta(minutes=5), native=None):
        super().__init__()
        if native is None:
            native = os.environ.get("GRADSYNC_NATIVE_STORE", "1") != "0"
        self._kv = (_native_client(client).kv(job_id, round)
                    if native and _native is not None
                    else client.kv(job_id, round))
        self.set_timeout(timeout)  # torch's own: PrefixStore sets it there

    def _do(self, fn, *args):
        try:
            return fn(*args)
        except Error as e:
            raise StoreError(f"gradsync store: {e}", e.code) from None

    def set(self, key, value):
        self._do(self._kv.set, _PREFIX + key, _bytes(value))

    def get(self, key):
        """`key`'s value, once it exists (one call when it does already)."""
        value = self._current(_PREFIX + key)
        if value is not None:
            return value
        self.wait([key])
        return self._do(self._kv.get, _PREFIX + key)

    def add(self, key, value):
        return self._do(self._kv.add, _PREFIX + key, int(value))

    def compare_set(self, key, expected, desired):
        """As TCPStore: sets `desired` when the key holds `expected` (or is
        absent and `expected` is empty); returns the value now stored, or
        `expected` when the key is absent and stays so."""
        expected, desired = _bytes(expected), _bytes(desired)
        swapped, value = self._do(self._kv.compare_and_set, _PREFIX + key,
                                  expected or None, desired)
        if not swapped and not expected and value == b"":
            # Present with the empty value, which is `expected` too.
            _, value = self._do(self._kv.compare_and_set, _PREFIX + key,
                                expected, desired)
        return value if value is not None else expected

    def wait(self, keys, timeout=None):
        """Blocks until every key exists, up to `timeout` (default: the
        store's; zero: no limit, as TCPStore's). No keys: returns at once."""
        if not keys:
            return
        timeout = self.timeout if timeout is None else timeout
        seconds = timeout.total_seconds()
        deadline = time.monotonic() + seconds if seconds > 0 else None
        while True:
            # The coordinator takes waits of up to an hour: a longer one is
            # made of several.
            left = (_WAIT_SLICE if deadline is None else
                    min(_WAIT_SLICE, max(deadline - time.monotonic(), 0.001)))
            try:
                self._kv.wait([_PREFIX + k for k in keys], left)
                return
            except Error as e:
                if e.code != "DEADLINE_EXCEEDED":
                    raise StoreError(f"gradsync store: {e}", e.code) from None
                if deadline is None or time.monotonic() < deadline - 0.001:
                    continue
                missing = [k for k in keys if not self.check([k])]
                raise StoreTimeout(
                    f"gradsync store: timeout after {seconds:g}s waiting for "
                    f"key(s) {', '.join(repr(k) for k in missing or keys)}",
                    e.code) from None

    def check(self, keys):
        try:
            for key in keys:
                self._kv.get(_PREFIX + key)
        except Error as e:
            if e.code == "NOT_FOUND":
                return False
            raise StoreError(f"gradsync store: {e}", e.code) from None
        return True

    def delete_key(self, key):
        """Deletes `key`; whether it existed."""
        return self._do(self._kv.delete, _PREFIX + key)

    def num_keys(self):
        """The keys this store holds (those under its prefix)."""
        return len(self._do(self._kv.keys, _PREFIX))

    # torch 1.13's trampoline for a Python store looks these two up by their
    # C++ names (a PrefixStore over this store calls them so).
    getNumKeys = num_keys
    deleteKey = delete_key

    # torch 2.x's calls beyond StoreTestBase's: its trampoline looks up
    # append, multi_get, multi_set and has_extended_api (torch 1.13 has no
    # such calls and never makes them; they work here all the same).
    def has_extended_api(self):
        return True

    def append(self, key, value):
        """Appends `value` to `key`'s value, creating the key; atomic (a
        compare-and-set, retried while other writers come between)."""
        key, value = _PREFIX + key, _bytes(value)
        current = self._current(key)
        while True:
            swapped, now = self._do(self._kv.compare_and_set, key, current,
                                    (current or b"") + value)
            if swapped:
                return
            current = now

    def multi_get(self, keys):
        """The values of `keys`, in order, once all exist (as get)."""
        self.wait(keys)
        return [self._do(self._kv.get, _PREFIX + k) for k in keys]

    def multi_set(self, keys, values):
        """Sets each key to its value, in order (one call per key: readers
        may see some set before the others)."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys, {len(values)} values")
        for key, value in zip(keys, values):
            self.set(key, value)

    # Queues (torch 2.x's queue_push/queue_pop/queue_len): items under
    # KEY/queue/N, N counted by KEY/queue/tail; KEY/queue/head is the next to
    # pop, advanced by compare-and-set so that each item is popped once.
    def queue_push(self, key, value):
        index = self.add(f"{key}/queue/tail", 1) - 1
        self.set(f"{key}/queue/{index}", value)

    def queue_pop(self, key, block=True):
        """The oldest item of queue `key`, removed. Blocks until there is
        one, up to the store's timeout (StoreTimeout); with block=False an
        empty queue raises QueueEmpty at once."""
        head_key = _PREFIX + f"{key}/queue/head"
        while True:
            head = self._current(head_key)
            index = int(head) if head else 0
            item = f"{key}/queue/{index}"
            if not block and not self.check([item]):
                raise QueueEmpty(f"gradsync store: queue '{key}' is empty",
                                 "NOT_FOUND")
            self.wait([item])
            swapped, _ = self._do(self._kv.compare_and_set, head_key, head,
                                  str(index + 1).encode())
            if swapped:
                value = self._do(self._kv.get, _PREFIX + item)
                self.delete_key(item)
                return value

    def queue_len(self, key):
        tail = self._current(_PREFIX + f"{key}/queue/tail")
        head = self._current(_PREFIX + f"{key}/queue/head")
        return int(tail or 0) - int(head or 0)

    def _current(self, key):
        """`key`'s value (the full key, prefix included), or None."""
        try:
            return self._kv.get(key)
        except Error as e:
            if e.code == "NOT_FOUND":
                return None
            raise StoreError(f"gradsync store: {e}", e.code) from None


def _native_client(client):
    """The extension's C++ client for gradsync.Client `client`'s coordinator,
    made at first use and kept with `client` (one connection for all its
    stores)."""
    native = getattr(client, "_native_kv_client", None)
    if native is None:
        tls_ca, tls_cert, tls_key = client.tls
        native = _native.Client(client.target, client.timeout,
                                client.token or "", tls_ca or "",
                                tls_cert or "", tls_key or "")
        client._native_kv_client = native
    return native


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
        member = _member.current()
        if member is None:
            member = Member(client, job, nnodes=nnodes,
                            nproc_per_node=int(first("nproc_per_node", 1)),
                            node_id=first("node_id"),
                            join_timeout=timeout.total_seconds())
        elif (member.target, member.job) == (client.target, job):
            # A process group made again: a new round, within this init's
            # timeout.
            member.rejoin(timeout=timeout.total_seconds())
        else:
            raise ValueError(
                f"this process is a member of job '{member.job}' at "
                f"{member.target} already; it cannot join '{job}' at "
                f"{client.target} too (one job per process)")
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



def _create_process_group(store, rank, world_size, timeout):
    return _native.create_process_group(store, rank, world_size, timeout)


def _register_backend():
    """Registers the backend "gradsync" for CPU tensors (init_process_group
    makes its groups with them; a round's NCCL group with device "cuda"
    comes from gradsync.elastic, not from here). torch 2.x takes the
    devices a backend serves (and warns when told none); torch 1.13 does
    not."""
    try:
        dist.Backend.register_backend("gradsync", _create_process_group,
                                      devices=["cpu"])
    except TypeError:  # torch before 2.1: no devices=
        dist.Backend.register_backend("gradsync", _create_process_group)


if _native is not None and "GRADSYNC" not in dist.Backend._plugins:
    _register_backend()


def process_groups_available():
    """Whether torch.distributed has the backend "gradsync" here (the
    package was built with its extension module)."""
    return _native is not None


def transport(group=None):
    """'shm' or 'gloo': what a process group of backend "gradsync" (the
    default group when None) runs its collectives on. Choose with the
    environment before init_process_group: GRADSYNC_SHARED_MEMORY=0 takes
    Gloo on one host too, GRADSYNC_GLOO_ADDRESS the address Gloo binds."""
    _need_native()
    return _native.transport(group or dist.distributed_c10d._get_default_group())


def abort(group=None):
    """Fails the collective in flight on a "gradsync" process group (the
    default group when None) and every later one, here and at the peers in
    one with this rank, promptly: for a thread that learns that a peer is
    gone while training is blocked in a collective. The group is unusable
    afterwards (destroy it). The group of a gradsync.elastic round that has
    ended is left as it is (its collectives ended with the round)."""
    _need_native()
    _native.abort(group or dist.distributed_c10d._get_default_group())


def _need_native():
    if _native is None:
        raise RuntimeError("gradsync was installed without its extension "
                           f"module (gradsync._C: {_native_missing}): the "
                           "process group backend 'gradsync' is not here")
