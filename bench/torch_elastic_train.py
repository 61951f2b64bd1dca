"""The torchrun side of bench/recovery_bench.py: PyTorch DDP (Gloo, CPU) on
the model gradsync-worker trains, written the way torchrun's fault tolerance
expects: every worker loads the last checkpoint when it starts, and rank 0
writes one every --checkpoint_every steps. Started by torchrun, which
restarts every worker when one dies (--max_restarts).

Prints "PID <rank> <pid>" at start, "RESTORED <step>" when it resumed from a
checkpoint, and "STEP <step>" after every step (rank 0).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn

from torch_ddp import make_model, synthetic  # the same model and data


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--synthetic_size", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--checkpoint_every", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print("PID %d %d" % (rank, os.getpid()), flush=True)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model("mlp", args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        if rank == 0:
            print("RESTORED %d" % start, flush=True)
    images, labels = synthetic(args.synthetic_size, 0)
    sampler = torch.utils.data.DistributedSampler(
        range(args.synthetic_size), num_replicas=world, rank=rank, shuffle=False)
    order = torch.tensor(list(sampler))
    per_epoch = (len(order) + args.batch_size - 1) // args.batch_size
    for step in range(start + 1, args.steps + 1):
        j = (step - 1) % per_epoch
        idx = order[j * args.batch_size:(j + 1) * args.batch_size]
        opt.zero_grad()
        nn.functional.cross_entropy(model(images[idx]), labels[idx]).backward()
        opt.step()
        if rank == 0:
            print("STEP %d" % step, flush=True)
            if step % args.checkpoint_every == 0:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.module.state_dict(),
                            "optimizer": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, args.checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
