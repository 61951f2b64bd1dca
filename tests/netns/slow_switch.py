"""A user-space switch for the netns harness (tests/netns/lib.sh): one TUN
device, gsnet0, in each host's network namespace, and this process between
them, delivering every IPv4 packet to the host it is addressed to after a
delay, or dropping it with a probability (this kernel has no netem).

    slow_switch.py --delay_ms=200 --loss=0.05 --seed=N NS=ADDRESS ...

Prints "ready" once every device exists (the caller then gives each its
address and brings it up); runs until killed. The devices vanish with it.
"""
import argparse
import ctypes
import fcntl
import heapq
import os
import random
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def open_tun_in(namespace, name=b"gsnet0"):
    """A TUN device `name` in network namespace `namespace`, as a
    non-blocking fd (this thread enters the namespace to make it)."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR)
            fcntl.ioctl(fd, TUNSETIFF,
                        struct.pack("16sH", name, IFF_TUN | IFF_NO_PI))
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)
    os.set_blocking(fd, False)
    return fd


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay_ms", type=float, default=0)
    parser.add_argument("--loss", type=float, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("hosts", nargs="+", help="NAMESPACE=IPV4")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    by_address, fds = {}, []
    for host in args.hosts:
        namespace, address = host.split("=")
        fd = open_tun_in(namespace)
        by_address[bytes(int(x) for x in address.split("."))] = fd
        fds.append(fd)
    print("ready", flush=True)
    delay = args.delay_ms / 1000.0
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    due, order = [], 0  # (time, order, fd, packet)
    while True:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, fd, packet = heapq.heappop(due)
            try:
                os.write(fd, packet)
            except OSError:
                pass  # the device is down or full: the packet is lost
        timeout = None if not due else max(0, (due[0][0] - now) * 1000)
        for fd, _ in poller.poll(timeout):
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if len(packet) < 20 or packet[0] >> 4 != 4:
                    continue  # IPv4 only
                to = by_address.get(packet[16:20])
                if to is None or rng.random() < args.loss:
                    continue
                order += 1
                heapq.heappush(due, (time.monotonic() + delay, order, to,
                                     packet))


if __name__ == "__main__":
    sys.exit(main())
