"""A PyTorch DDP training script written for torchrun, as users write them.

It reads torchrun's variables (and checks each against the others), joins
the process group with env://, shards a synthetic dataset with
DistributedSampler, wraps an MLP in DistributedDataParallel, trains with SGD,
and has rank 0 write the final parameters, one number per line, to the path
given as its first argument. Run under torchrun and under `gradsync launch`,
the two files must match.

  python3 ddp_script.py OUT [--pause SECONDS] [--backend gloo|nccl]

--pause sleeps after each step; --backend=nccl trains on GPU LOCAL_RANK with
device_ids=[local_rank], as GPU scripts do (deploy/gpu_run.sh).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def env_int(name):
    value = os.environ.get(name)
    if value is None:
        sys.exit(f"ddp_script: {name} is not set")
    return int(value)


def check_environment():
    rank, world = env_int("RANK"), env_int("WORLD_SIZE")
    local_rank, local_world = env_int("LOCAL_RANK"), env_int("LOCAL_WORLD_SIZE")
    group_rank, group_world = env_int("GROUP_RANK"), env_int("GROUP_WORLD_SIZE")
    checks = [
        (0 <= rank < world, "RANK in [0, WORLD_SIZE)"),
        (0 <= local_rank < local_world, "LOCAL_RANK in [0, LOCAL_WORLD_SIZE)"),
        (0 <= group_rank < group_world, "GROUP_RANK in [0, GROUP_WORLD_SIZE)"),
        (group_world * local_world == world,
         "GROUP_WORLD_SIZE * LOCAL_WORLD_SIZE == WORLD_SIZE"),
        (group_rank * local_world + local_rank == rank,
         "GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK == RANK"),
        (env_int("ROLE_RANK") == rank, "ROLE_RANK == RANK (one role)"),
        (env_int("ROLE_WORLD_SIZE") == world, "ROLE_WORLD_SIZE == WORLD_SIZE"),
        (os.environ.get("ROLE_NAME") == "default", "ROLE_NAME == default"),
        (env_int("MASTER_PORT") > 0, "MASTER_PORT > 0"),
        (bool(os.environ.get("MASTER_ADDR")), "MASTER_ADDR set"),
        (env_int("TORCHELASTIC_RESTART_COUNT") >= 0,
         "TORCHELASTIC_RESTART_COUNT >= 0"),
        (env_int("TORCHELASTIC_MAX_RESTARTS") >= 0,
         "TORCHELASTIC_MAX_RESTARTS >= 0"),
        (bool(os.environ.get("TORCHELASTIC_RUN_ID")), "TORCHELASTIC_RUN_ID set"),
        (os.environ.get("OMP_NUM_THREADS") == "1", "OMP_NUM_THREADS == 1"),
    ]
    for ok, what in checks:
        if not ok:
            sys.exit(f"ddp_script: rank {rank}: expected {what}")
    return rank, world


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = parser.parse_args()
    out, pause = args.out, args.pause
    rank, world = check_environment()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", env_int("LOCAL_RANK"))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method="env://")
    assert dist.get_rank() == rank and dist.get_world_size() == world

    torch.manual_seed(0)  # the same data and initial model on every rank
    inputs = torch.randn(256, 16)
    targets = (inputs[:, :4].sum(dim=1) > 0).long()
    dataset = TensorDataset(inputs, targets)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    model = model.to(device)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                 shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    first = True
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            if first and rank == 0:  # for bench/launch_bench.sh
                print(f"first step done at {time.time():.6f}", flush=True)
            first = False
            time.sleep(pause)
    if rank == 0:
        with open(out, "w") as f:
            for p in model.parameters():
                for v in p.detach().cpu().flatten().tolist():
                    f.write(f"{v:.9g}\n")
        print(f"rank 0: wrote {out}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
