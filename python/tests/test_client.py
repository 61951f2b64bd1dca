"""gradsync.Client against a real coordinator and `gradsync launch`."""
import time

import pytest

import gradsync
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


def test_errors_name_the_code_and_the_call(coordinator):
    client = gradsync.Client(coordinator)
    with pytest.raises(gradsync.Error) as error:
        client.get_job("nope")
    assert error.value.code == "NOT_FOUND"
    assert "get_job" in str(error.value) and "nope" in str(error.value)
