"""One rank of a job on torch.distributed's backend BACKEND ("gradsync" or
"gloo"), bootstrapped through a FileStore: run by test_process_group.py.

    process_group_script.py BACKEND RANK WORLD STORE_FILE OUT_JSON

Checks all_reduce, broadcast (also of bool), all_gather (also of int8 into
strided outputs) and barrier against their known results, then trains a small model with DistributedDataParallel (SGD with
momentum, 10 steps, each rank its own data) and writes the final
parameters and the group's transport to OUT_JSON."""
import datetime
import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gradsync.torch

backend, rank, world, store_file, out = sys.argv[1], int(sys.argv[2]), \
    int(sys.argv[3]), sys.argv[4], sys.argv[5]
dist.init_process_group(backend, store=dist.FileStore(store_file, world),
                        rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))

t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert torch.equal(t, torch.full((1000,), world * (world + 1) / 2.0)), t
b = torch.arange(6, dtype=torch.float64) * (rank + 1)
dist.broadcast(b, src=world - 1)
assert torch.equal(b, torch.arange(6, dtype=torch.float64) * world), b
gathered = [torch.zeros(3, dtype=torch.long) for _ in range(world)]
dist.all_gather(gathered, torch.full((3,), rank, dtype=torch.long))
assert [g[0].item() for g in gathered] == list(range(world)), gathered
dist.barrier()
# A bool tensor (a model's mask: DDP broadcasts buffers; torch 1.13's Gloo
# refuses bool, "Invalid scalar type") and int8 travel as bytes; all_gather
# writes into strided outputs (a matrix's columns).
bools = backend == "gradsync"
if bools:
    mask = torch.tensor([rank == world - 1, True, False])
    dist.broadcast(mask, src=world - 1)
    assert mask.tolist() == [True, True, False], mask
columns = torch.zeros(3, world, dtype=torch.int8)
dist.all_gather(list(columns.unbind(1)),
                torch.full((3,), rank, dtype=torch.int8))
assert columns[2].tolist() == list(range(world)), columns

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 1))
if bools:
    model.register_buffer("mask", torch.ones(4, dtype=torch.bool))
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
data = torch.Generator().manual_seed(100 + rank)
for step in range(10):
    x = torch.randn(16, 8, generator=data)
    y = x.sum(dim=1, keepdim=True)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()

with open(out, "w") as f:
    json.dump({
        "transport": (gradsync.torch.transport() if backend == "gradsync"
                      else backend),
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
    }, f)
dist.destroy_process_group()
