"""PyTorch's own DistributedDataParallel as the reference for gradsync's, for
tests/worker/ddp/torch_reference_test.cc: the same MLP, initial weights and
per-rank batches, trained by Debian's PyTorch 1.13 (Gloo, CPU) with one of
its communication hooks or under its Join context manager.

  /usr/bin/python3 torch_reference.py SPEC OUT

SPEC is a torch.save'd dict: mode ("fp16", "bf16", "join" or
"join_initial"), lr, sizes ([in, hidden, out]), init (the MLP's state dict)
and batches (per rank, a list of (x, y) pairs; ranks may have different
numbers of them). OUT receives rank 0's final state dict.

PyTorch 1.13 runs bf16_compress_hook only with CUDA and NCCL: its Gloo
cannot all-reduce bfloat16 ("Invalid scalar type") and DDP refuses the hook
by name without CUDA. So for "bf16" PyTorch's own bf16_compress_hook runs
under another name, with dist.all_reduce of bfloat16 tensors done as an
all-gather of their bits and a sum in float32 rounded to bfloat16 (what
gradsync's Gloo backend does for 2 ranks); every other step of the hook
(the cast, the division before the sum, the cast back) is PyTorch's.
"""
import collections
import faulthandler
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.join import Join


def mlp(sizes):
    n_in, hidden, n_out = sizes
    return nn.Sequential(collections.OrderedDict([
        ("fc1", nn.Linear(n_in, hidden)), ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(hidden, hidden)), ("relu2", nn.ReLU()),
        ("fc3", nn.Linear(hidden, n_out)),
    ]))


class _Done:
    """What dist.all_reduce(async_op=True) returns, already completed."""

    def __init__(self, tensor):
        self._future = torch.futures.Future()
        self._future.set_result([tensor])

    def get_future(self):
        return self._future


def _bf16_all_reduce(tensor, group=None, async_op=False):
    # Gloo gathers neither bfloat16 nor int16: the bits travel as int32.
    bits = tensor.view(torch.int16).to(torch.int32)
    gathered = [torch.empty_like(bits) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, bits, group=group)
    total = torch.zeros(tensor.shape, dtype=torch.float32)
    for g in gathered:
        total += g.to(torch.int16).view(torch.bfloat16).float()
    tensor.copy_(total.to(torch.bfloat16))
    return _Done(tensor) if async_op else None


def _bf16_hook(state, bucket):
    # PyTorch's hook under another name: DDP refuses one named
    # bf16_compress_hook without CUDA and NCCL.
    return default_hooks.bf16_compress_hook(state, bucket)


def run(rank, spec, init_method, out):
    # A hang ends with every thread's stack rather than at the test's kill.
    faulthandler.dump_traceback_later(150, exit=True)
    world = len(spec["batches"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=world)
    model = mlp(spec["sizes"])
    model.load_state_dict(spec["init"])
    ddp = nn.parallel.DistributedDataParallel(model)
    mode = spec["mode"]
    if mode == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif mode == "bf16":
        default_hooks.dist.all_reduce = _bf16_all_reduce
        ddp.register_comm_hook(None, _bf16_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"])
    uneven = mode.startswith("join")
    with Join([ddp], enable=uneven,
              divide_by_initial_world_size=(mode == "join_initial")):
        for x, y in spec["batches"][rank]:
            optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.barrier()
    # Tearing the Gloo process group down as run() returns was seen to hang
    # now and then (1.13); every rank is done, so leave without it.
    os._exit(0)


def main():
    spec_path, out = sys.argv[1], sys.argv[2]
    # weights_only=True (PyTorch's default from 2.6) where torch can read
    # floats with it (1.13 cannot).
    spec = torch.load(spec_path,
                      weights_only=not torch.__version__.startswith("1."))
    # Loopback only, whatever the host name resolves to.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(spec, "tcp://127.0.0.1:%d" % port, out),
             nprocs=len(spec["batches"]))


if __name__ == "__main__":
    main()
