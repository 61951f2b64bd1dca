"""gradsync.torch.Store against PyTorch's Store contract: the cases of
PyTorch's StoreTestBase (test/distributed/test_store.py) and the timeout
behaviour torch relies on, run on the installed torch against
gradsync.torch.Store directly and behind dist.PrefixStore, with TCPStore
(direct and behind PrefixStore) run beside it as the control: every case
must hold for all four."""
import datetime
import itertools
import os
import re
import threading
import time

import pytest
import torch
import torch.distributed as dist

import gradsync.torch as gtorch
from conftest import running_coordinator
from gradsync.client import Client
from gradsync._proto import job_pb2, rendezvous_pb2, rendezvous_pb2_grpc

SHORT = datetime.timedelta(milliseconds=300)
_jobs = itertools.count()


@pytest.fixture(scope="module")
def coordinator_client():
    with running_coordinator() as address:
        client = Client(address)
        yield client
        client.close()


def _round_of_new_job(client):
    """Joins a new one-process job; (job id, round)."""
    job = f"store-{next(_jobs)}"
    config = job_pb2.JobConfig(job_id=job, min_nodes=1, max_nodes=1,
                               nproc_per_node=1)
    request = rendezvous_pb2.JoinRequest(
        job_id=job, config=config,
        node=job_pb2.NodeDescriptor(
            node_id="node", hostname="host", pid=os.getpid(),
            incarnation_id=os.urandom(16).hex(),
            device_type=job_pb2.DEVICE_TYPE_CPU, device_count=1))
    stub = rendezvous_pb2_grpc.RendezvousStub(client.channel)
    return job, stub.Join(request, timeout=30).assignment.round


# gradsync.torch.Store's two ways to the coordinator: the extension's C++
# client (where the package has gradsync._C, as here) and python3-grpcio.
_WAYS = {"gradsync": True, "gradsync-grpcio": False}


def _gradsync_store(client, way, timeout):
    job, round_ = _round_of_new_job(client)
    store = gtorch.Store(client, job, round_, timeout=timeout,
                         native=_WAYS[way])
    if _WAYS[way] and gtorch.process_groups_available():
        assert type(store._kv).__name__ == "KeyValue" and \
            type(store._kv).__module__ == "gradsync._C", type(store._kv)
    return store


def _tcp_store(*args, **kwargs):
    """torch's TCPStore, the control: on its libuv server where torch has
    one (the default from torch 2.4), else on the older one (Debian's torch
    2.6 is built without libuv and refuses the default)."""
    try:
        return dist.TCPStore(*args, **kwargs)
    except RuntimeError as e:
        if "use_libuv" not in str(e):
            raise
        return dist.TCPStore(*args, use_libuv=False, **kwargs)


@pytest.fixture(params=["tcp", "tcp+prefix", "gradsync", "gradsync+prefix",
                        "gradsync-grpcio", "gradsync-grpcio+prefix"])
def store(request, coordinator_client):
    kind = request.param
    if kind.startswith("tcp"):
        base = _tcp_store("127.0.0.1", 0, 1, True,
                          timeout=datetime.timedelta(seconds=30))
    else:
        base = _gradsync_store(coordinator_client, kind.split("+")[0],
                               datetime.timedelta(seconds=30))
    store = dist.PrefixStore("prefix", base) if kind.endswith("+prefix") \
        else base
    yield store  # this frame keeps `base` alive beside a PrefixStore


def test_set_get_check(store):
    before = store.num_keys()
    store.add("key", 1)
    store.add("key", 2)
    store.add("key", 3)
    store.set("key0", "value0")
    store.add("key3", 1)
    store.set("key1", "value1")
    store.add("key3", 2)
    store.set("key2", "value2")
    for delta in (3, 4, 5, 6):
        store.add("key3", delta)
    assert store.num_keys() == before + 5
    assert store.get("key") == b"6"
    assert store.get("key0") == b"value0"
    assert store.get("key1") == b"value1"
    assert store.get("key2") == b"value2"
    assert store.get("key3") == b"21"
    if hasattr(store, "check"):  # torch 1.13 binds check() for none of its own
        assert store.check(["key3"])
        assert not store.check(["Randomkey3"])
    store.set("-key3", "7")
    assert store.get("-key3") == b"7"
    assert store.delete_key("-key3")
    assert store.num_keys() == before + 5


def test_a_wait_for_no_keys_returns_at_once(store):
    store.wait([])
    store.wait([], SHORT)


class _SlowKeys:
    """A store's key-value calls whose waits run out `misses` times first."""

    def __init__(self, misses):
        self.misses = misses
        self.waits = []

    def wait(self, keys, seconds):
        self.waits.append(seconds)
        if len(self.waits) <= self.misses:
            raise gtorch.Error("DEADLINE_EXCEEDED", "not yet")


@pytest.mark.parametrize("hours", [2, 0])
def test_a_wait_past_what_the_coordinator_takes_is_made_of_several(
        coordinator_client, hours):
    """The coordinator takes waits of up to an hour: a store whose timeout
    is 2 h, or none (zero, as TCPStore's), waits in slices within that."""
    store = _gradsync_store(coordinator_client, "gradsync",
                            datetime.timedelta(hours=hours))
    store._kv = _SlowKeys(misses=2)
    store.wait(["late"])
    assert len(store._kv.waits) == 3, store._kv.waits
    assert all(0 < s <= 3600 for s in store._kv.waits), store._kv.waits


def test_compare_set(store):
    assert store.compare_set("cs_key0", "wrong_old_value",
                             "new_value0") == b"wrong_old_value"
    store.set("cs_key0", "value0")
    assert store.get("cs_key0") == b"value0"
    assert store.compare_set("cs_key0", "wrong_old_value",
                             "new_value0") == b"value0"
    assert store.get("cs_key0") == b"value0"
    assert store.compare_set("cs_key0", "value0", "new_value0") == \
        b"new_value0"
    assert store.get("cs_key0") == b"new_value0"
    assert store.compare_set("cs_key1", "", "new_value1") == b"new_value1"
    assert store.get("cs_key1") == b"new_value1"
    # An empty expected value also matches a key that holds the empty value.
    store.set("cs_key2", "")
    assert store.compare_set("cs_key2", "", "new_value2") == b"new_value2"
    assert store.get("cs_key2") == b"new_value2"


def test_compare_set_takes_bytes_as_torch_2_does(store):
    store.set("b_key", b"\x00\x01")
    assert store.compare_set("b_key", b"\x00\x01", b"\x02") == b"\x02"
    assert store.get("b_key") == b"\x02"


def test_delete_key_says_whether_the_key_existed(store):
    store.set("d_key", "v")
    assert store.delete_key("d_key") is True
    assert store.delete_key("d_key") is False


def _timeout_error(call):
    """Runs `call`, which must time out; the error and how long it took."""
    start = time.monotonic()
    with pytest.raises(RuntimeError) as caught:
        call()
    return caught.value, time.monotonic() - start


def test_get_of_a_missing_key_times_out_with_a_runtime_error(store):
    store.set_timeout(SHORT)
    error, took = _timeout_error(lambda: store.get("never_set"))
    assert re.search("[Tt]imeout", str(error)), error
    assert took < 10, "the timeout set (also through PrefixStore) is used"


def test_wait_with_its_own_timeout_raises_a_runtime_error(store):
    store.set("present", "1")
    error, took = _timeout_error(
        lambda: store.wait(["present", "absent"], SHORT))
    assert re.search("[Tt]imeout", str(error)), error
    assert took < 10
    store.wait(["present"], SHORT)


def test_a_process_group_initialises_through_it(store):
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(4)
        dist.all_reduce(t)
        assert t.tolist() == [1.0] * 4
    finally:
        dist.destroy_process_group()


# What only gradsync's store promises beyond the contract.

@pytest.fixture(params=list(_WAYS))
def way(request):
    return request.param


def test_a_timeout_names_the_missing_keys(coordinator_client, way):
    store = _gradsync_store(coordinator_client, way, SHORT)
    store.set("here", "1")
    with pytest.raises(gtorch.StoreTimeout) as caught:
        store.wait(["here", "gone"])
    assert "timeout after 0.3s waiting for key(s) 'gone'" in str(caught.value)
    assert caught.value.code == "DEADLINE_EXCEEDED"


def test_refusals_are_store_errors_with_the_code(coordinator_client, way):
    store = gtorch.Store(coordinator_client, "no-such-job", 1,
                         native=_WAYS[way])
    for call in (lambda: store.set("k", "v"), lambda: store.add("k", 1),
                 lambda: store.compare_set("k", "", "v"),
                 lambda: store.delete_key("k"), lambda: store.num_keys()):
        with pytest.raises(gtorch.StoreError) as caught:
            call()
        assert isinstance(caught.value, RuntimeError)
        assert caught.value.code in ("NOT_FOUND", "FAILED_PRECONDITION"), \
            caught.value
        assert "no-such-job" in str(caught.value), caught.value


def test_large_values_take_the_coordinators_flag(coordinator_client, way):
    value = b"v" * (2 << 20)
    store = _gradsync_store(coordinator_client, way, SHORT)
    with pytest.raises(gtorch.StoreError) as caught:
        store.set("big", value)  # the default limit is 1 MiB
    assert "--max_kv_value_bytes" in str(caught.value), caught.value
    with pytest.raises(gtorch.StoreError) as caught:
        store.set("k" * 2000, "v")  # keys: 1 KiB by default
    assert "--max_kv_key_bytes" in str(caught.value), caught.value
    with running_coordinator("--max_kv_value_bytes=3145728",
                             "--max_kv_key_bytes=4096") as address:
        client = Client(address)
        store = _gradsync_store(client, way, SHORT)
        store.set("big", value)
        assert store.get("big") == value
        store.set("k" * 2000, "v")
        assert store.get("k" * 2000) == b"v"
        client.close()


def test_torch_2_calls_as_tcpstore_does(store):
    """torch 2.x's append, multi_get and multi_set, TCPStore the control;
    through a PrefixStore they reach gradsync's Store by torch's own
    trampoline (by these names, with bytes). Run on Debian 13's torch 2.6
    (deploy/torch_runtime_check.sh); torch 1.13 has none of them."""
    if not hasattr(dist.Store, "append"):
        pytest.skip(f"torch {torch.__version__} has no Store.append")
    assert store.has_extended_api()
    store.append("log", "a")
    store.append("log", b"bc")
    assert store.get("log") == b"abc"
    store.multi_set(["a", "b"], ["1", b"2"])
    assert store.multi_get(["b", "a"]) == [b"2", b"1"]


# torch 2.x's calls beyond StoreTestBase (append, multi_get, multi_set,
# queues) on gradsync's Store alone, called directly: where torch has no
# such calls (1.13; queues before 2.7) TCPStore cannot be the control;
# gradsync.torch.Store offers them with TCPStore 2.x's semantics.
@pytest.fixture
def gradsync_store(coordinator_client, way):
    return _gradsync_store(coordinator_client, way, SHORT)


def test_append_creates_and_extends(gradsync_store):
    assert gradsync_store.has_extended_api()
    gradsync_store.append("log", "a")
    gradsync_store.append("log", b"bc")
    assert gradsync_store.get("log") == b"abc"


def test_appends_from_many_threads_all_land(gradsync_store):
    threads = [threading.Thread(target=lambda i=i: gradsync_store.append(
        "log", f"{i};")) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parts = gradsync_store.get("log").decode().rstrip(";").split(";")
    assert sorted(map(int, parts)) == list(range(8))


def test_multi_set_then_multi_get(gradsync_store):
    gradsync_store.multi_set(["a", "b"], ["1", b"2"])
    assert gradsync_store.multi_get(["b", "a"]) == [b"2", b"1"]
    with pytest.raises(gtorch.StoreTimeout, match="timeout.*'missing'"):
        gradsync_store.multi_get(["a", "missing"])
    with pytest.raises(ValueError):
        gradsync_store.multi_set(["a"], [])


def test_a_queue_pops_in_push_order_once(gradsync_store):
    for item in ("x", "y", "z"):
        gradsync_store.queue_push("q", item)
    assert gradsync_store.queue_len("q") == 3
    assert [gradsync_store.queue_pop("q") for _ in range(3)] == [b"x", b"y", b"z"]
    assert gradsync_store.queue_len("q") == 0
    with pytest.raises(gtorch.QueueEmpty):
        gradsync_store.queue_pop("q", block=False)
    with pytest.raises(gtorch.StoreTimeout):
        gradsync_store.queue_pop("q")  # blocks up to the store's timeout


def test_a_blocked_pop_takes_the_next_push(gradsync_store):
    popped = []
    popper = threading.Thread(
        target=lambda: popped.append(gradsync_store.queue_pop("q")))
    popper.start()
    time.sleep(0.1)
    gradsync_store.queue_push("q", "late")
    popper.join(timeout=30)
    assert popped == [b"late"]
