"""A PyTorch DDP program with gradsync.torch.monitor(), run by
test_monitor.py under `gradsync launch`.

  monitor_script.py [--steps N] [--pause SECONDS] [--hang_rank R --hang_at S]
                    [--init URL]

--init is the process group's init method (default env://, as under
`gradsync launch`; gradsync://HOST:PORT/JOB?nnodes=N joins without it).

With --hang_rank, rank R stops issuing collectives before step S's backward
(it sleeps), as a rank stuck in data loading would.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gradsync.torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--pause", type=float, default=0.0)
parser.add_argument("--hang_rank", type=int, default=-1)
parser.add_argument("--hang_at", type=int, default=0)
parser.add_argument("--init", default="env://")
args = parser.parse_args()

dist.init_process_group("gloo", init_method=args.init)
rank = dist.get_rank()
torch.manual_seed(0)
# Buckets fill in reverse parameter order and close past 1 MiB: the last
# layer (4 MiB) closes the first, the first layer makes the second. Two
# collectives a step.
model = torch.nn.Sequential(torch.nn.Linear(8, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 256))
ddp = DistributedDataParallel(model, bucket_cap_mb=1)
monitor = gradsync.torch.monitor(ddp, batch_size=8)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
for step in range(1, args.steps + 1):
    loss = ddp(torch.randn(8, 8)).sum()
    if rank == args.hang_rank and step == args.hang_at:
        print(f"rank {rank}: hanging before step {step}", flush=True)
        time.sleep(3600)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(args.pause)
print(f"rank {rank}: {monitor.step} steps monitored", flush=True)
dist.destroy_process_group()
