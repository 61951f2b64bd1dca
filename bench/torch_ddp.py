"""PyTorch's DistributedDataParallel (Gloo, CPU) on the model and batch that
gradsync-worker trains, for bench/ddp_bench.sh to run side by side with it.

  /usr/bin/python3 bench/torch_ddp.py --world_size=2 --hidden=2800 \
      --batch_size=32 --steps=60 [--local]

--device=cuda uses NCCL, one GPU per rank. --local trains one process without DDP (the no-sync baseline). Prints one
line "RESULT mean_step_ms=... median_step_ms=... final_loss=..." from rank 0.
Step time spans zero_grad, forward, backward and optimizer.step(), as
gradsync-worker measures it.
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from collections import OrderedDict


def make_model(hidden):
    return nn.Sequential(OrderedDict([
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(784, hidden)), ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(hidden, hidden)), ("relu2", nn.ReLU()),
        ("fc3", nn.Linear(hidden, 10)),
    ]))


def synthetic(size, seed):
    # Same recipe as gradsync's MakeSyntheticDataset.
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (size,), generator=g)
    images = 0.35 * prototypes[labels] + 0.65 * torch.rand(size, 1, 28, 28, generator=g)
    return images, labels


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    world = 1 if args.local else args.world_size
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    torch.manual_seed(args.seed)
    model = make_model(args.hidden).to(device)
    if not args.local:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if device.type == "cuda" else None)
    images, labels = synthetic(args.synthetic_size, args.seed)
    images, labels = images.to(device), labels.to(device)
    sampler = torch.utils.data.DistributedSampler(
        range(args.synthetic_size), num_replicas=world, rank=rank, shuffle=False)
    order = torch.tensor(list(sampler), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    times = []
    loss = None
    per_epoch = (len(order) + args.batch_size - 1) // args.batch_size
    for step in range(args.steps):
        j = step % per_epoch
        idx = order[j * args.batch_size:(j + 1) * args.batch_size]
        start = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    steady = times[args.warmup:]
    if rank == 0:
        print("RESULT mean_step_ms=%.3f median_step_ms=%.3f final_loss=%.4f" % (
            1e3 * sum(steady) / len(steady), 1e3 * statistics.median(steady),
            loss.item()), flush=True)
    if not args.local:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2800)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic_size", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--local", action="store_true")
    args = p.parse_args()
    if args.local:
        run(0, args, 0)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(args, port), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
