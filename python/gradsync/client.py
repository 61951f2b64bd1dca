"""gradsync.Client: a connection to a gradsync coordinator.

    client = gradsync.Client("127.0.0.1:29400")
    for job in client.list_jobs():
        print(job.config.job_id, gradsync.Client.state_name(job.state))
    status = client.get_job("train")          # a gradsync.v1.JobStatus
    for status in client.watch("train"):      # every change, until it ends
        ...
    kv = client.kv("train", round=status.round)
    kv.set("key", b"value"); kv.get("key"); kv.add("counter", 1)

Errors are gradsync.Error with the gRPC status code name and the
coordinator's message. Thread-safe (gRPC channels are).
"""
import os
import random
import secrets
import time

import grpc

from gradsync._proto import jobs_pb2, jobs_pb2_grpc, job_pb2, kv_pb2, kv_pb2_grpc


class Error(Exception):
    """A call the coordinator refused or could not answer."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code  # e.g. "NOT_FOUND", "UNAVAILABLE"
        self.message = message


def _call(what, fn, *args, **kwargs):
    """fn(*args, **kwargs), its gRPC errors as Error naming `what`."""
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as e:
        raise Error(e.code().name, f"{what}: {e.details()}") from None


# gRPC's words for a call the coordinator's transport ended to free memory
# (past its --transport_memory_limit: an HTTP/2 reset with
# ENHANCE_YOUR_CALM, reported as RESOURCE_EXHAUSTED). The coordinator's own
# RESOURCE_EXHAUSTED (a limit it enforces) never says it.
_SHED_BY_TRANSPORT = "Received RST_STREAM with error code 11"


def _transient(error):
    """Whether another attempt may succeed: the coordinator restarting or
    failing over, or a call its transport shed to free memory."""
    return error.code == "UNAVAILABLE" or (
        error.code == "RESOURCE_EXHAUSTED"
        and error.message.endswith(": " + _SHED_BY_TRANSPORT))


def _retrying(what, budget, fn, *args, **kwargs):
    """_call, again with backoff (0.1 s doubling to 1 s, jittered) while the
    coordinator is UNAVAILABLE (restarting, failing over) or its transport
    sheds the call to free memory, for up to `budget` seconds: as
    gradsync's C++ client retries. The same request goes every time (an
    Add's or a CompareAndSet's request id with it)."""
    deadline = time.monotonic() + budget
    backoff = 0.1
    while True:
        try:
            return _call(what, fn, *args, **kwargs)
        except Error as e:
            pause = backoff * random.uniform(0.8, 1.2)
            if not _transient(e):
                raise
            if time.monotonic() + pause > deadline:
                if e.code == "RESOURCE_EXHAUSTED":
                    raise Error(e.code, e.message + " (the coordinator kept "
                                "ending the call to free memory: it is short "
                                "of memory for its connections, see its "
                                "--transport_memory_limit)") from None
                raise
        time.sleep(pause)
        backoff = min(1.0, backoff * 2)


class KeyValue:
    """The key-value store of one round of a job (keys vanish with the round;
    a superseded round's calls fail with ABORTED). A call the coordinator
    cannot answer (UNAVAILABLE: restarting, failing over; or shed by its
    transport to free memory) is made again
    for up to `retry_budget` seconds; add and compare_and_set carry a
    request id, the same in every attempt, so that the coordinator answers
    a retry of one it applied as it answered the first (kv.proto)."""

    def __init__(self, stub, job_id, round, timeout, metadata=(),
                 retry_budget=60.0):
        self._stub = stub
        self._scope = kv_pb2.Scope(job_id=job_id, round=round)
        self._timeout = timeout
        self._metadata = metadata
        self._budget = retry_budget

    def _call(self, what, fn, request, timeout=None):
        return _retrying(what, self._budget, fn, request,
                         timeout=timeout or self._timeout,
                         metadata=self._metadata)

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else bytes(value)
        self._call("set", self._stub.Set,
                   kv_pb2.SetRequest(scope=self._scope, key=key, value=value))

    def get(self, key):
        """The value of `key` (bytes); Error NOT_FOUND when it is absent."""
        return self._call("get", self._stub.Get,
                          kv_pb2.GetRequest(scope=self._scope, key=key)).value

    def add(self, key, delta):
        """Adds `delta` to the integer at `key` (0 when absent); the sum."""
        return self._call("add", self._stub.Add, kv_pb2.AddRequest(
            scope=self._scope, key=key, delta=delta,
            request_id=secrets.token_hex(16))).value

    def compare_and_set(self, key, expected, desired):
        """Sets `key` to `desired` if it holds `expected` (None: absent);
        (swapped, the value now stored or None when absent)."""
        request = kv_pb2.CompareAndSetRequest(
            scope=self._scope, key=key, desired=bytes(desired),
            expected=bytes(expected or b""), expect_absent=expected is None,
            request_id=secrets.token_hex(16))
        r = self._call("compare_and_set", self._stub.CompareAndSet, request)
        return r.swapped, (r.value if r.exists else None)

    def wait(self, keys, timeout):
        """Blocks until every key in `keys` exists; Error DEADLINE_EXCEEDED
        after `timeout` seconds."""
        request = kv_pb2.WaitRequest(scope=self._scope, keys=list(keys),
                                     timeout_ms=max(1, int(timeout * 1000)))
        self._call("wait", self._stub.Wait, request, timeout=timeout + 30)

    def delete(self, key):
        """Deletes `key`; whether it existed."""
        return self._call("delete", self._stub.Delete,
                          kv_pb2.DeleteRequest(scope=self._scope, key=key)).existed

    def keys(self, prefix=""):
        """The keys that start with `prefix`, sorted."""
        r = self._call("list", self._stub.List,
                       kv_pb2.ListRequest(scope=self._scope, prefix=prefix,
                                          keys_only=True))
        return [e.key for e in r.entries]


def apply_watch_response(update, job):
    """The job's whole status after WatchJobResponse `update`, given the
    status built from the messages before it (None before the first)."""
    if not update.delta or job is None:
        return update.job
    members = {m.rank: m for m in job.members}
    for m in update.job.members:
        members[m.rank] = m
    for rank in update.removed_ranks:
        members.pop(rank, None)
    whole = job_pb2.JobStatus()
    whole.CopyFrom(update.job)
    del whole.members[:]
    whole.members.extend(members[r] for r in sorted(members))
    return whole


class Client:
    """A connection to the coordinator at `target` ("HOST:PORT"). With
    `tls_ca` (PEM file) the channel uses TLS, with `tls_cert`/`tls_key` it
    presents a client certificate (for --tls_client_ca coordinators). For a
    coordinator with --auth=token every call carries `token` (default:
    $GRADSYNC_TOKEN). While the coordinator is UNAVAILABLE (restarting,
    failing over to a standby) list_jobs and get_job are made again, and a
    watch is opened again (its first answer is the whole status once more),
    for up to `retry_budget` seconds; the key-value store's calls have their
    own budget (KeyValue)."""

    def __init__(self, target, timeout=10.0, tls_ca=None, tls_cert=None,
                 tls_key=None, token=None, retry_budget=10.0):
        token = token if token is not None else os.environ.get("GRADSYNC_TOKEN")
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        if tls_ca:
            def read(path):
                with open(path, "rb") as f:
                    return f.read()
            credentials = grpc.ssl_channel_credentials(
                read(tls_ca), read(tls_key) if tls_key else None,
                read(tls_cert) if tls_cert else None)
            self.channel = grpc.secure_channel(target, credentials)
        else:
            self.channel = grpc.insecure_channel(target)
        self.target = target
        self.timeout = timeout
        self.retry_budget = retry_budget
        # For gradsync's C++ client, which opens its own connections (the
        # membership of gradsync://, gradsync/member.py).
        self.token = token
        self.tls = (tls_ca, tls_cert, tls_key)
        self._jobs = jobs_pb2_grpc.JobsStub(self.channel)
        self._kv = kv_pb2_grpc.KeyValueStub(self.channel)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def list_jobs(self):
        return list(_retrying("list_jobs", self.retry_budget,
                              self._jobs.ListJobs, jobs_pb2.ListJobsRequest(),
                              timeout=self.timeout,
                              metadata=self.metadata).jobs)

    def get_job(self, job_id):
        return _retrying("get_job", self.retry_budget, self._jobs.GetJob,
                         jobs_pb2.GetJobRequest(job_id=job_id),
                         timeout=self.timeout, metadata=self.metadata).job

    def watch(self, job_id):
        """Yields the job's whole status on every change until the job ends.

        The coordinator sends deltas after its first message (see
        WatchJobResponse); they are applied here. A watch the coordinator
        ends as UNAVAILABLE (a restart, a fail-over) is opened again, for up
        to `retry_budget` seconds since its last answer.
        """
        backoff, deadline = 0.1, time.monotonic() + self.retry_budget
        while True:
            stream = self._jobs.WatchJob(
                jobs_pb2.WatchJobRequest(job_id=job_id), metadata=self.metadata)
            job = None
            try:
                for update in stream:
                    job = apply_watch_response(update, job)
                    backoff = 0.1
                    deadline = time.monotonic() + self.retry_budget
                    yield job
                return
            except grpc.RpcError as e:
                error = Error(e.code().name, f"watch: {e.details()}")
            pause = backoff * random.uniform(0.8, 1.2)
            if not _transient(error) or time.monotonic() + pause > deadline:
                raise error
            time.sleep(pause)
            backoff = min(1.0, backoff * 2)

    def kv(self, job_id, round):
        return KeyValue(self._kv, job_id, round, self.timeout, self.metadata)

    @staticmethod
    def state_name(state):
        """"running", "succeeded", ... for a gradsync.v1.JobState."""
        return job_pb2.JobState.Name(state).replace("JOB_STATE_", "").lower()
