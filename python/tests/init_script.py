"""A DDP-style program that joins its process group with
init_method="gradsync://..." and no MASTER_ADDR: run by test_torch.py under
`gradsync launch`. Prints the all-reduced sum of rank + 1 on every rank.
The backend is $INIT_BACKEND (default gloo; "gradsync": gradsync's own,
bootstrapped through the coordinator's store, a Python store)."""
import os

import torch
import torch.distributed as dist

import gradsync.torch  # noqa: F401  (registers gradsync://)

for name in ("MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(name, None)
dist.init_process_group(
    os.environ.get("INIT_BACKEND", "gloo"), init_method="gradsync://{}/{}".format(
        os.environ["GRADSYNC_COORDINATOR"], os.environ["GRADSYNC_JOB"]))
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
dist.barrier()
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {t.item():g}",
      flush=True)
dist.destroy_process_group()
