"""gradsync.Client against a real coordinator and `gradsync launch`."""
import time

import grpc
import pytest

import gradsync
from gradsync._proto import kv_pb2
from conftest import launch


def wait_for(predicate, seconds=60):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_jobs_status_watch_and_the_key_value_store(coordinator):
    client = gradsync.Client(coordinator)
    assert client.list_jobs() == []
    agent = launch(coordinator, "pyjob", 2,
                   ["/bin/sh", "-c", "sleep 2"])
    try:
        wait_for(lambda: any(j.config.job_id == "pyjob"
                             for j in client.list_jobs()) and
                 len(client.get_job("pyjob").members) == 2)
        job = client.get_job("pyjob")
        assert gradsync.Client.state_name(job.state) == "running"
        assert sorted(m.rank for m in job.members) == [0, 1]

        kv = client.kv("pyjob", job.round)
        kv.set("greeting", "hello")
        assert kv.get("greeting") == b"hello"
        assert kv.add("count", 2) == 2
        assert kv.add("count", 3) == 5
        assert kv.compare_and_set("slot", None, b"mine") == (True, b"mine")
        assert kv.compare_and_set("slot", None, b"theirs") == (False, b"mine")
        kv.wait(["greeting", "slot"], timeout=5)
        with pytest.raises(gradsync.Error) as missing:
            kv.wait(["never"], timeout=0.2)
        assert missing.value.code == "DEADLINE_EXCEEDED"

        states = [gradsync.Client.state_name(s.state)
                  for s in client.watch("pyjob")]
        assert states[-1] == "succeeded"
    finally:
        out, err = agent.communicate(timeout=120)
    assert agent.returncode == 0, err


def test_watch_deltas_apply_to_the_status_before_them():
    from gradsync._proto import job_pb2, jobs_pb2
    from gradsync.client import apply_watch_response

    def member(rank, step):
        m = job_pb2.Member(rank=rank)
        m.metrics.step = step
        return m

    first = jobs_pb2.WatchJobResponse(job=job_pb2.JobStatus(
        round=1, members=[member(0, 1), member(1, 1), member(2, 1)]))
    job = apply_watch_response(first, None)
    delta = jobs_pb2.WatchJobResponse(
        delta=True, removed_ranks=[2],
        job=job_pb2.JobStatus(round=1, reason="now",
                              members=[member(1, 5), member(3, 0)]))
    job = apply_watch_response(delta, job)
    assert [(m.rank, m.metrics.step) for m in job.members] == [
        (0, 1), (1, 5), (3, 0)]
    assert job.reason == "now"


def test_errors_name_the_code_and_the_call(coordinator):
    client = gradsync.Client(coordinator)
    with pytest.raises(gradsync.Error) as error:
        client.get_job("nope")
    assert error.value.code == "NOT_FOUND"
    assert "get_job" in str(error.value) and "nope" in str(error.value)


def test_a_token_goes_with_every_call(tmp_path):
    import json
    import subprocess
    from conftest import binary, running_coordinator
    admin = tmp_path / "admin"
    admin.write_text("admin-secret\n")
    with running_coordinator("--auth=token",
                             f"--admin_token_file={admin}") as coordinator:
        def create(job):
            out = subprocess.run(
                [binary("cli/gradsync"), f"--coordinator={coordinator}",
                 f"--token_file={admin}", "create", job, "--json"],
                check=True, capture_output=True, text=True).stdout
            return json.loads(out)["token"]
        token_a = create("a")
        create("b")
        with pytest.raises(gradsync.Error) as anonymous:
            gradsync.Client(coordinator, token="").list_jobs()
        assert anonymous.value.code == "UNAUTHENTICATED"
        as_a = gradsync.Client(coordinator, token=token_a)
        assert [j.config.job_id for j in as_a.list_jobs()] == ["a"]
        with pytest.raises(gradsync.Error) as other:
            as_a.get_job("b")
        assert other.value.code == "PERMISSION_DENIED"
        assert len(gradsync.Client(coordinator, token="admin-secret").list_jobs()) == 2


class _Failed(grpc.RpcError):
    def __init__(self, code, details):
        super().__init__()
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def _unavailable():
    return _Failed(grpc.StatusCode.UNAVAILABLE, "the coordinator restarts")


class _FlakyKv:
    """A KeyValue stub that answers each call with `error()` `failures`
    times before it answers, and records every request it was given."""

    def __init__(self, failures, error=_unavailable):
        self.failures = failures
        self.error = error
        self.requests = []

    def _answer(self, request, response):
        self.requests.append(request)
        if len(self.requests) <= self.failures:
            raise self.error()
        return response

    def Add(self, request, timeout, metadata):
        return self._answer(request, kv_pb2.AddResponse(value=7))

    def CompareAndSet(self, request, timeout, metadata):
        return self._answer(request, kv_pb2.CompareAndSetResponse(
            swapped=True, exists=True, value=request.desired))


def test_add_and_compare_and_set_retry_with_the_same_request_id():
    stub = _FlakyKv(failures=2)
    kv = gradsync.KeyValue(stub, "j", 1, timeout=5)
    assert kv.add("n", 1) == 7
    ids = [r.request_id for r in stub.requests]
    assert len(ids) == 3 and len(set(ids)) == 1 and len(ids[0]) == 32, ids
    stub.requests, stub.failures = [], 1
    assert kv.compare_and_set("k", None, b"v") == (True, b"v")
    assert stub.requests[0].request_id == stub.requests[1].request_id
    assert stub.requests[0].request_id != ids[0]


def test_a_coordinator_unavailable_past_the_budget_is_an_error():
    kv = gradsync.KeyValue(_FlakyKv(failures=1000), "j", 1, timeout=5,
                           retry_budget=0.5)
    with pytest.raises(gradsync.Error) as raised:
        kv.add("n", 1)
    assert raised.value.code == "UNAVAILABLE"


def test_calls_the_transport_shed_are_retried_and_limits_are_not():
    # Past its --transport_memory_limit, the coordinator's gRPC resets
    # streams to free memory: gRPC's words for it, RESOURCE_EXHAUSTED.
    shed = _FlakyKv(failures=2, error=lambda: _Failed(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Received RST_STREAM with error code 11"))
    assert gradsync.KeyValue(shed, "j", 1, timeout=5).add("n", 1) == 7
    assert len(shed.requests) == 3
    limit = _FlakyKv(failures=1, error=lambda: _Failed(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "job j holds 1000 keys (--max_keys_per_job)"))
    with pytest.raises(gradsync.Error) as raised:
        gradsync.KeyValue(limit, "j", 1, timeout=5).add("n", 1)
    assert raised.value.code == "RESOURCE_EXHAUSTED"
    assert len(limit.requests) == 1
    always_shed = _FlakyKv(failures=1000, error=shed.error)
    with pytest.raises(gradsync.Error) as raised:
        gradsync.KeyValue(always_shed, "j", 1, timeout=5,
                          retry_budget=0.5).add("n", 1)
    assert raised.value.code == "RESOURCE_EXHAUSTED"
    assert "--transport_memory_limit" in raised.value.message
    assert len(always_shed.requests) > 1


class _FlakyJobs:
    """A Jobs stub that answers each call with `error()` `failures` times
    before it answers, and counts the calls. Its watch sends one whole
    status, then fails once with `error()` (the coordinator restarting);
    reopened, it sends the status of round 2, a delta, and ends."""

    def __init__(self, failures, error=_unavailable):
        from gradsync._proto import job_pb2, jobs_pb2
        self.job_pb2, self.jobs_pb2 = job_pb2, jobs_pb2
        self.failures = failures
        self.error = error
        self.calls = 0
        self.watches = 0

    def _answer(self, response):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error()
        return response

    def ListJobs(self, request, timeout, metadata):
        return self._answer(self.jobs_pb2.ListJobsResponse(
            jobs=[self.job_pb2.JobStatus(round=3)]))

    def GetJob(self, request, timeout, metadata):
        return self._answer(self.jobs_pb2.GetJobResponse(
            job=self.job_pb2.JobStatus(round=4)))

    def WatchJob(self, request, metadata):
        self.watches += 1
        status = self.job_pb2.JobStatus
        response = self.jobs_pb2.WatchJobResponse
        if self.watches == 1:
            yield response(job=status(round=1))
            raise self.error()
        yield response(job=status(round=2))
        yield response(delta=True, job=status(round=2, reason="healed"))


def _client_with(stub, retry_budget=5.0):
    client = gradsync.Client("127.0.0.1:1", retry_budget=retry_budget)
    client._jobs = stub
    return client


def test_status_reads_retry_while_the_coordinator_is_unavailable():
    stub = _FlakyJobs(failures=2)
    client = _client_with(stub)
    assert [j.round for j in client.list_jobs()] == [3]
    assert stub.calls == 3
    stub.calls = 0
    assert client.get_job("j").round == 4
    assert stub.calls == 3
    # Past the budget: the error; an error no retry can cure: at once.
    with pytest.raises(gradsync.Error) as raised:
        _client_with(_FlakyJobs(failures=1000), retry_budget=0.5).list_jobs()
    assert raised.value.code == "UNAVAILABLE"
    missing = _FlakyJobs(failures=1, error=lambda: _Failed(
        grpc.StatusCode.NOT_FOUND, "no job j"))
    with pytest.raises(gradsync.Error) as raised:
        _client_with(missing).get_job("j")
    assert raised.value.code == "NOT_FOUND" and missing.calls == 1


def test_a_watch_the_coordinator_ended_is_opened_again():
    stub = _FlakyJobs(failures=0)
    seen = [(j.round, j.reason) for j in _client_with(stub).watch("j")]
    assert seen == [(1, ""), (2, ""), (2, "healed")]
    assert stub.watches == 2
    # An error no retry can cure ends the watch.
    refused = _FlakyJobs(failures=0, error=lambda: _Failed(
        grpc.StatusCode.PERMISSION_DENIED, "not yours"))
    with pytest.raises(gradsync.Error) as raised:
        list(_client_with(refused).watch("j"))
    assert raised.value.code == "PERMISSION_DENIED" and refused.watches == 1
