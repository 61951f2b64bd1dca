"""The users' script of deploy/gpu_run.sh, as PyTorch's DDP documentation
writes it: the launcher sets the environment (LOCAL_RANK, RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), the script joins with NCCL, converts BatchNorm to
SyncBatchNorm, wraps the model in DistributedDataParallel and runs a few SGD
steps on random images. torchvision's ResNet-50 when torchvision is there,
else a small ResNet-like model of the same shape of layers.

  python3 ddp_resnet50.py [--steps N] [--batch_size N]

Prints one line "ddp_resnet50: STEPS steps, loss L, MS ms/step (model M)" on
rank 0 and exits 0.
"""
import argparse
import os
import time

import torch
import torch.distributed as distributed
import torch.nn as nn


def resnet_like():
    """A ResNet-shaped model (conv, BatchNorm, residual blocks, pooling)."""
    class Block(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(channels), nn.ReLU(),
                nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(channels))

        def forward(self, x):
            return torch.relu(x + self.body(x))

    return nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
        *[Block(64) for _ in range(4)], nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 1000))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=32)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    distributed.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    try:
        import torchvision
        model, name = torchvision.models.resnet50(), "torchvision resnet50"
    except ImportError:
        model, name = resnet_like(), "resnet-like"
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).to(local_rank)
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[local_rank], output_device=local_rank)
    assert list(model.parameters()) == list(model.module.parameters())

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator(device="cuda").manual_seed(distributed.get_rank())
    images = torch.randn(args.batch_size, 3, 224, 224, device="cuda",
                         generator=generator)
    labels = torch.randint(0, 1000, (args.batch_size,), device="cuda",
                           generator=generator)
    start = None
    for step in range(args.steps):
        if step == 2:  # the first steps warm up cuDNN and NCCL
            torch.cuda.synchronize()
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    timed = max(args.steps - 2, 1)
    ms = (time.perf_counter() - start) * 1000 / timed if start else float("nan")
    if distributed.get_rank() == 0:
        print(f"ddp_resnet50: {args.steps} steps, loss {loss.item():.4f}, "
              f"{ms:.1f} ms/step (model {name})", flush=True)
    distributed.destroy_process_group()


if __name__ == "__main__":
    main()
