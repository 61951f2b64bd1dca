"""PyTorch's DistributedDataParallel (Gloo, CPU) on the model and batch that
gradsync-worker trains, for bench/ddp_bench.sh to run side by side with it.

  /usr/bin/python3 bench/torch_ddp.py --world_size=2 [--model=mlp|resnet18|resnet50] \
      --hidden=2800 --batch_size=32 --steps=60 [--local] \
      [--comm_hook=allreduce|fp16_compress|powersgd] [--powersgd_rank=1] \
      [--powersgd_start_iter=1000]

--model=mlp is gradsync's MLP 784-hidden-hidden-10 on 1x28x28 images;
--model=resnet18 is torchvision.models.resnet18(num_classes=10) on 3x32x32
images (gradsync-worker --model=resnet18), both synthetic, made with
gradsync's recipe. --device=cuda uses NCCL, one GPU per rank. --local trains
one process without DDP (the no-sync baseline; --comm_hook does not apply).
--comm_hook picks how DDP reduces its gradient buckets: allreduce is DDP's
built-in all-reduce (no hook registered), fp16_compress PyTorch's
default_hooks.fp16_compress_hook, powersgd its powerSGD_hook with
PowerSGDState(matrix_approximation_rank=--powersgd_rank,
start_powerSGD_iter=--powersgd_start_iter) and PowerSGD's other defaults
(error feedback, warm start); on Gloo its buckets are chained one after
another (the stock hook crashes there with 2+ buckets: see
one_bucket_at_a_time).

Prints one line from rank 0:
  "RESULT mean_step_ms=... median_step_ms=... final_loss=... parameters=...
   comm_hook=... bytes_per_step=..."
where bytes_per_step is what rank 0 put into all-reduces in the last step (the
gradients' bytes for the built-in all-reduce; counted at dist.all_reduce for a
hook; 0 with --local).
Step time spans zero_grad, forward, backward and optimizer.step(), as
gradsync-worker measures it.
"""
import argparse
import gc
import os
import socket
import statistics
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from collections import OrderedDict

# Image shape per model, as gradsync-worker takes them (worker/trainer/models.h).
INPUT_SHAPES = {"mlp": (1, 28, 28), "resnet18": (3, 32, 32),
                "resnet50": (3, 32, 32)}


def make_model(name, hidden):
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet50(num_classes=10)
    if name == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=10)
    return nn.Sequential(OrderedDict([
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(784, hidden)), ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(hidden, hidden)), ("relu2", nn.ReLU()),
        ("fc3", nn.Linear(hidden, 10)),
    ]))


def synthetic(size, seed, shape=(1, 28, 28)):
    # Same recipe as gradsync's MakeSyntheticDataset: a random prototype per
    # class, each sample its class's prototype blended with uniform noise.
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(10, *shape, generator=g)
    labels = torch.randint(0, 10, (size,), generator=g)
    images = 0.35 * prototypes[labels] + 0.65 * torch.rand(size, *shape, generator=g)
    return images, labels


class AllReduceBytes:
    """Counts the bytes passed to dist.all_reduce (what PyTorch's Python comm
    hooks call) since the last reset(), by wrapping it. PowerSGD calls it
    from future callbacks too, hence the lock."""

    def __init__(self):
        self.bytes = 0
        self._lock = threading.Lock()
        self._all_reduce = dist.all_reduce

        def counting(tensor, *args, **kwargs):
            with self._lock:
                self.bytes += tensor.numel() * tensor.element_size()
            return self._all_reduce(tensor, *args, **kwargs)

        dist.all_reduce = counting

    def reset(self):
        with self._lock:
            self.bytes = 0


def one_bucket_at_a_time(hook):
    """`hook` run for a bucket only once the previous bucket's future is done.

    powerSGD_hook issues its second and third all-reduces from future
    callbacks (Gloo's threads) while DDP's thread issues the next bucket's
    first one. ProcessGroupGloo numbers collectives in the order they are
    issued, so two ranks that race differently pair up different tensors:
    "enforce fail at gloo/transport/tcp/pair.cc: op.preamble.length <=
    op.nbytes", nearly every run with 2+ buckets (torch 1.13). Chaining the
    buckets makes every rank issue them in one order; communication still
    overlaps the rest of backward."""
    last = [None]

    def run(state, bucket):
        result = torch.futures.Future()

        def launch(_=None):
            try:
                hook(state, bucket).add_done_callback(finish)
            except Exception as e:  # noqa: BLE001 (handed to DDP)
                result.set_exception(e)

        def finish(fut):
            try:
                result.set_result(fut.value())
            except Exception as e:  # noqa: BLE001
                result.set_exception(e)

        previous, last[0] = last[0], result
        if previous is None or previous.done():
            launch()
        else:
            previous.add_done_callback(launch)
        return result

    return run


def register_hook(model, args):
    """Registers --comm_hook on the DDP model; returns the byte counter, or
    None for DDP's built-in all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if args.comm_hook == "allreduce":
        return None
    counter = AllReduceBytes()
    if args.comm_hook == "fp16_compress":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=args.powersgd_start_iter)
        hook = powerSGD_hook.powerSGD_hook
        if dist.get_backend() == "gloo":
            hook = one_bucket_at_a_time(hook)
        model.register_comm_hook(state, hook)
    return counter


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(rank, args, port):
    torch.set_num_threads(args.threads)
    world = 1 if args.local else args.world_size
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    torch.manual_seed(args.seed)
    model = make_model(args.model, args.hidden).to(device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    counter = None
    if not args.local:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if device.type == "cuda" else None)
        counter = register_hook(model, args)
    images, labels = synthetic(args.synthetic_size, args.seed, INPUT_SHAPES[args.model])
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
        if counter is not None:
            counter.reset()
        start = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(images[idx]), labels[idx])
        loss.backward()
        opt.step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    steady = times[args.warmup:]
    if args.local:
        wire_bytes = 0
    elif counter is None:
        wire_bytes = sum(p.numel() * p.element_size() for p in parameters)
    else:
        wire_bytes = counter.bytes
    if rank == 0:
        print("RESULT mean_step_ms=%.3f median_step_ms=%.3f final_loss=%.4f "
              "parameters=%d comm_hook=%s bytes_per_step=%d" % (
                  1e3 * sum(steady) / len(steady), 1e3 * statistics.median(steady),
                  loss.item(), sum(p.numel() for p in parameters),
                  "none" if args.local else args.comm_hook, wire_bytes), flush=True)
    if not args.local:
        # The DDP model (its reducer, a comm hook's state and futures) goes
        # before the process group: left to the interpreter's exit, a
        # PowerSGD run often aborts there ("terminate called without an
        # active exception").
        del model, opt, counter
        gc.collect()
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--model", choices=sorted(INPUT_SHAPES), default="mlp")
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
    p.add_argument("--comm_hook", choices=["allreduce", "fp16_compress", "powersgd"],
                   default="allreduce")
    p.add_argument("--powersgd_rank", type=int, default=1)
    p.add_argument("--powersgd_start_iter", type=int, default=1000)
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
