"""PyTorch's own buffer broadcast, for bench/buffer_broadcast_bench.sh:
DistributedDataParallel's broadcast_buffers copies rank 0's module buffers
to every rank before each forward with torch.distributed._broadcast_coalesced
(250 MB buckets); here over Gloo on loopback, one process per rank, the
buffers of torchvision's ResNet (num_classes=10), rank r's holding r before
each run and checked to hold 0 after.

  /usr/bin/python3 bench/torch_buffer_broadcast.py [--model=resnet50]
      [--world_size=2] [--iterations=50] [--warmup=5]

Prints from rank 0: "RESULT buffers=N bytes=B coalesced_ms=MEDIAN wrong=W".
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BUCKET_BYTES = 250 * 1024 * 1024  # DistributedDataParallel's for buffers


def run(rank, args, port):
    import torchvision
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    model = getattr(torchvision.models, args.model)(num_classes=10)
    buffers = list(model.buffers())
    group = dist.group.WORLD
    times, wrong = [], 0
    for i in range(args.warmup + args.iterations):
        for b in buffers:
            b.fill_(rank)
        dist.barrier()
        start = time.perf_counter()
        dist._broadcast_coalesced(group, buffers, BUCKET_BYTES, 0)
        elapsed = time.perf_counter() - start
        wrong += sum(int(b.ne(0).sum()) for b in buffers)
        if i >= args.warmup:
            times.append(elapsed)
    if rank == 0:
        size = sum(b.numel() * b.element_size() for b in buffers)
        print(f"RESULT buffers={len(buffers)} bytes={size} "
              f"coalesced_ms={1e3 * statistics.median(times):.3f} wrong={wrong}",
              flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
