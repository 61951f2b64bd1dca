"""Fixtures: gradsync's binaries and a coordinator on a free loopback port.

The binaries come from $GRADSYNC_BIN (a folder holding
server/gradsync-coordinator and cli/gradsync), by default the
repository's bazel-bin.
"""
import contextlib
import os
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the gradsync package

import gradsync  # noqa: E402


def _torch_lacks_libuv():
    """Whether this torch's TCPStore lacks the libuv server that env://
    asks for by default from torch 2.4: Debian 13's torch 2.6 is built
    without it and refuses (its own torchrun included) unless USE_LIBUV=0,
    which its users must set. torch 1.13 has no such server and no such
    default."""
    try:
        import torch.distributed as dist
        dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True)
    except TypeError:  # torch before 2.2: no use_libuv
        return False
    except RuntimeError as e:
        return "use_libuv" in str(e)
    return False


if _torch_lacks_libuv():  # for the processes the tests launch
    os.environ["USE_LIBUV"] = "0"

# The tests run several agents of one process each on this machine's cores,
# where `gradsync launch` (as torchrun) sets OMP_NUM_THREADS=1 only for
# several processes of one agent: one intra-op thread each, as there.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def binary(path):
    root = os.environ.get("GRADSYNC_BIN") or os.path.join(HERE, "..", "..",
                                                          "bazel-bin")
    full = os.path.join(root, path)
    if not os.path.exists(full):
        pytest.fail(f"{full} is missing: build it (bazel build //...)")
    return full


@contextlib.contextmanager
def running_coordinator(*flags):
    """The address ("127.0.0.1:PORT") of a coordinator (with `flags`)
    stopped afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        process = subprocess.Popen(
            [binary("server/gradsync-coordinator"), "--listen=127.0.0.1:0",
             f"--port_file={port_file}", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not (os.path.exists(port_file) and
                       os.path.getsize(port_file) > 0):
                assert time.monotonic() < deadline, "coordinator did not start"
                assert process.poll() is None, "coordinator exited"
                time.sleep(0.05)
            with open(port_file) as f:
                yield f"127.0.0.1:{f.read().strip()}"
        finally:
            process.terminate()
            process.wait(timeout=30)


@pytest.fixture
def coordinator():
    with running_coordinator() as address:
        yield address


def launch(coordinator, job, nproc, program, extra=()):
    """Starts `gradsync launch` of `program` as one node of `nproc`."""
    return subprocess.Popen(
        [binary("cli/gradsync"), "launch",
         f"--coordinator={coordinator}", f"--job={job}",
         f"--nproc_per_node={nproc}", "--python", sys.executable, *extra,
         "--", *program],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)))


def poll(client, job, predicate, seconds=120):
    """The first status of `job` (client.get_job) that `predicate` accepts,
    asked every 0.1 s for at most `seconds`."""
    status = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status = client.get_job(job)
            if predicate(status):
                return status
        except gradsync.Error:
            pass  # not created yet
        time.sleep(0.1)
    raise AssertionError(f"timed out; last status: {status}")
