"""Concurrent key-value Adds from one Python process: THREADS threads each
make CALLS `gradsync.torch.Store.add` calls on one counter (through the
extension's C++ client, the GIL released while each waits) against a
coordinator keeping its state in a --state_dir (SQLite), so that every Add
waits for a commit; prints the time and the Adds per second, and checks the
counter's sum.

  bazel build //server:gradsync-coordinator //python:gradsync/_C.so
  python/build_stubs.sh
  cp bazel-bin/python/gradsync/_C.so python/gradsync/
  GRADSYNC_BIN=DIR /usr/bin/python3 bench/kv_add_load.py [THREADS] [CALLS]

GRADSYNC_BIN is a folder holding server/gradsync-coordinator (default: the
repository's bazel-bin): point it at two builds in turn to compare them.
"""
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))

import gradsync.torch as gtorch  # noqa: E402
from conftest import running_coordinator  # noqa: E402
from gradsync.client import Client  # noqa: E402
from test_store import _round_of_new_job  # noqa: E402


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    if not gtorch.process_groups_available():
        sys.exit("no gradsync._C here: build it and copy it next to the package")
    with tempfile.TemporaryDirectory() as state, \
            running_coordinator(f"--state_dir={state}") as address:
        client = Client(address)
        job, round_ = _round_of_new_job(client)
        store = gtorch.Store(client, job, round_, native=True)
        store.add("warm", 1)

        def work():
            for _ in range(calls):
                store.add("counter", 1)

        workers = [threading.Thread(target=work) for _ in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        took = time.perf_counter() - start
        total = int(store.get("counter"))
        if total != threads * calls:
            sys.exit(f"the counter is {total}, not {threads * calls}")
        print(f"{threads} threads x {calls} adds: {took:.3f} s, "
              f"{threads * calls / took:.0f} adds/s")


if __name__ == "__main__":
    main()
