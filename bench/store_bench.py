"""torch.distributed Store calls from Python, side by side in one run:
gradsync.torch.Store (one gRPC call each to a coordinator on loopback)
against TCPStore on the same torch.

  bazel build //server:gradsync-coordinator && python/build_stubs.sh
  /usr/bin/python3 bench/store_bench.py [--calls=2000] [--runs=3]

Each run times --calls set() calls on each store, alternating which goes
first, and prints both and their ratio (gradsync / TCPStore).
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


def time_sets(store, calls, tag):
    start = time.perf_counter()
    for i in range(calls):
        store.set(f"{tag}{i}", b"v")
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with running_coordinator() as address:
        client = Client(address)
        job, round_ = _round_of_new_job(client)
        stores = {
            "gradsync": gtorch.Store(client, job, round_),
            "tcpstore": dist.TCPStore("127.0.0.1", 0, 1, True,
                                      timeout=datetime.timedelta(seconds=30)),
        }
        for run in range(args.runs):
            order = ["gradsync", "tcpstore"][::1 if run % 2 == 0 else -1]
            took = {name: time_sets(stores[name], args.calls, f"r{run}-")
                    for name in order}
            print(f"run {run + 1}: {args.calls} sets: gradsync "
                  f"{took['gradsync']:.3f} s ({took['gradsync'] / args.calls * 1e3:.3f} ms/call), "
                  f"TCPStore {took['tcpstore']:.3f} s ({took['tcpstore'] / args.calls * 1e3:.3f} ms/call), "
                  f"ratio {took['gradsync'] / took['tcpstore']:.1f}")


if __name__ == "__main__":
    main()
