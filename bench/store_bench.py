"""torch.distributed Store calls from Python, side by side in one run:
gradsync.torch.Store (a call to a coordinator on loopback per store call,
through the extension's C++ client and, as a second row, through
python3-grpcio) against TCPStore on the same torch.

  bazel build //server:gradsync-coordinator //python:gradsync/_C.so
  python/build_stubs.sh
  cp bazel-bin/python/gradsync/_C.so python/gradsync/   # for the C++ row
  /usr/bin/python3 bench/store_bench.py [--calls=2000] [--runs=3]

Each run times --calls calls of each kind (set, get of a present key, add,
compare_set) on each store, in an order that alternates from run to run,
and prints the microseconds per call and each gradsync row's ratio to
TCPStore. TCPStore's set() does not wait for an answer (its server may
not have the value yet when set returns; an error shows at a later call);
gradsync's set returns once the coordinator holds the value durably: the
"acked" line sums the three calls that wait for an answer on both stores.
"""
import argparse
import datetime
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))

import torch.distributed as dist  # noqa: E402

import gradsync.torch as gtorch  # noqa: E402
from conftest import running_coordinator  # noqa: E402
from gradsync.client import Client  # noqa: E402
from test_store import _round_of_new_job  # noqa: E402

CALLS = {
    "set": lambda store, i: store.set(f"s{i}", b"value"),
    "get": lambda store, i: store.get("present"),
    "add": lambda store, i: store.add("counter", 1),
    "compare_set": lambda store, i: store.compare_set("present", b"value",
                                                      b"value"),
}
ACKED = ("get", "add", "compare_set")


def time_calls(store, kind, calls):
    """Microseconds per call of `kind`."""
    call = CALLS[kind]
    start = time.perf_counter()
    for i in range(calls):
        call(store, i)
    return (time.perf_counter() - start) / calls * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with running_coordinator() as address:
        client = Client(address)
        stores = {"tcpstore": dist.TCPStore(
            "127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))}
        if gtorch.process_groups_available():
            job, round_ = _round_of_new_job(client)
            stores["gradsync (C++ client)"] = gtorch.Store(
                client, job, round_, native=True)
        else:
            print("no gradsync._C here: the C++ client's row is left out")
        job, round_ = _round_of_new_job(client)
        stores["gradsync (python3-grpcio)"] = gtorch.Store(
            client, job, round_, native=False)
        for store in stores.values():
            store.set("present", b"value")
        names = list(stores)
        for run in range(args.runs):
            order = names if run % 2 == 0 else names[::-1]
            took = {name: {kind: time_calls(stores[name], kind, args.calls)
                           for kind in CALLS} for name in order}
            print(f"run {run + 1}, {args.calls} calls of each kind "
                  "(us per call; ratio to TCPStore):")
            base = took["tcpstore"]
            for name in names:
                acked = sum(took[name][k] for k in ACKED)
                row = [f"{kind} {took[name][kind]:.1f}" for kind in CALLS]
                row.append(f"acked {acked:.1f}")
                if name != "tcpstore":
                    row = [f"{cell} ({took[name][kind] / base[kind]:.2f}x)"
                           for cell, kind in zip(row, CALLS)] + [
                        f"acked {acked:.1f} "
                        f"({acked / sum(base[k] for k in ACKED):.2f}x)"]
                print(f"  {name:26s} " + ", ".join(row))


if __name__ == "__main__":
    main()
