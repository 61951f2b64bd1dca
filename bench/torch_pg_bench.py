"""One rank of the process-group benchmark (bench/torch_pg_bench.sh):
torch.distributed on BACKEND ("gradsync" or "gloo"), bootstrapped through a
FileStore, on this host.

    torch_pg_bench.py BACKEND RANK WORLD STORE_FILE STEPS

Prints, on rank 0, two lines of JSON: {"what": "allreduce", ...} the
median time of an all_reduce of ResNet-18's gradient size (11.7 M float32,
in one tensor) over STEPS calls after 3 warm-ups, and {"what": "ddp", ...}
the median ResNet-18 DDP training step (torchvision, batch 16 of 3x64x64
per rank, SGD with momentum) over STEPS steps after 3 warm-ups."""
import datetime
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel

import gradsync.torch  # noqa: F401  (registers the backend "gradsync")

backend, rank, world, store_file, steps = sys.argv[1], int(sys.argv[2]), \
    int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
torch.set_num_threads(1)
dist.init_process_group(backend, store=dist.FileStore(store_file, world),
                        rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=300))


def median_time(fn):
    times = []
    for i in range(3 + steps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


grads = torch.ones(11_689_512)
reduce_s = median_time(lambda: dist.all_reduce(grads))

torch.manual_seed(0)
model = DistributedDataParallel(torchvision.models.resnet18(num_classes=10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(16, 3, 64, 64)
y = torch.randint(0, 10, (16,))


def step():
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


step_s = median_time(step)
if rank == 0:
    print(json.dumps({"what": "allreduce", "backend": backend,
                      "seconds": reduce_s}), flush=True)
    print(json.dumps({"what": "ddp", "backend": backend, "seconds": step_s}),
          flush=True)
dist.destroy_process_group()
