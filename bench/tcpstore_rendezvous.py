#!/usr/bin/python3
"""The peer of rendezvous_load: N clients rank themselves through PyTorch's TCPStore.

Each client opens its own TCPStore connection and takes a rank with
store.add("rank", 1), the way torch.distributed's store-based rendezvous hands
out ranks. Prints the time until every client has its rank and checks the
ranks are exactly 0..N-1 (#wrong). Gives up after --timeout seconds and
reports "timeout" (TCPStore 1.13 stops making progress near 2,000 clients).

Run with Debian's python3-torch: /usr/bin/python3 bench/tcpstore_rendezvous.py --workers=1000
"""
import argparse
import datetime
import os
import sys
import threading
import time

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()

    timeout = datetime.timedelta(seconds=args.timeout)
    master = dist.TCPStore("127.0.0.1", 0, is_master=True,
                           wait_for_workers=False, timeout=timeout)
    port = master.port
    ranks = [None] * args.workers
    errors = []
    stores = []
    lock = threading.Lock()
    start_gate = threading.Event()

    def worker(i):
        start_gate.wait()
        try:
            store = dist.TCPStore("127.0.0.1", port, is_master=False,
                                  timeout=timeout)
            ranks[i] = store.add("rank", 1) - 1
            with lock:
                stores.append(store)  # keep the connection open, as a worker does
        except Exception as e:  # noqa: BLE001 - report, do not hide
            with lock:
                errors.append(str(e))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(args.workers)]
    for t in threads:
        t.start()
    begin = time.monotonic()
    start_gate.set()
    deadline = begin + args.timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    elapsed = time.monotonic() - begin
    if any(t.is_alive() for t in threads):
        done = sum(r is not None for r in ranks)
        print(f"TCPStore rendezvous: {args.workers} clients: timeout after "
              f"{args.timeout:.0f} s with {done} ranked")
        print(f"RESULT workers={args.workers} ranked_s=timeout")
        exit_now()
    got = sorted(r for r in ranks if r is not None)
    wrong = sum(1 for a, b in zip(got, range(args.workers)) if a != b) + (
        args.workers - len(got))
    print(f"TCPStore rendezvous: {args.workers} clients, one connection each")
    print(f"time until every client has its rank: {elapsed:.3f} s  "
          f"(#wrong {wrong}, #failed {len(errors)})")
    print(f"RESULT workers={args.workers} ranked_s={elapsed:.4f} "
          f"wrong={wrong} failed={len(errors)}")
    exit_now()


def exit_now():
    """Exits without tearing the stores down: with thousands of open TCPStore
    connections (or clients stuck in calls) interpreter shutdown takes minutes."""
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
