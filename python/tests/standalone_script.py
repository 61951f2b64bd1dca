"""A plain Python process (no launcher, no RANK, no MASTER_ADDR) that joins
job "standalone" through init_method="gradsync://...?nnodes=2": run twice
by test_torch.py. With --fail_rank R, rank R raises after the all-reduce;
with --exit_rank R --exit_code N, rank R calls sys.exit(N) there (with
--raise_exit, `raise SystemExit(N)`). With --twice, the process group is
destroyed and made again, and all-reduces once more."""
import argparse
import sys

import torch
import torch.distributed as dist

import gradsync.torch  # noqa: F401  (registers gradsync://)

parser = argparse.ArgumentParser()
parser.add_argument("coordinator")
parser.add_argument("--job", default="standalone")
parser.add_argument("--fail_rank", type=int, default=-1)
parser.add_argument("--exit_rank", type=int, default=-1)
parser.add_argument("--exit_code", type=int, default=0)
parser.add_argument("--raise_exit", action="store_true")
parser.add_argument("--twice", action="store_true")
args = parser.parse_args()
url = f"gradsync://{args.coordinator}/{args.job}?nnodes=2"
dist.init_process_group("gloo", init_method=url)
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {t.item():g}",
      flush=True)
if args.twice:
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=url)
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"again: rank {dist.get_rank()} of {dist.get_world_size()}: "
          f"sum {t.item():g}", flush=True)
dist.barrier()
if dist.get_rank() == args.fail_rank:
    raise RuntimeError("boom: rank gave up")
if dist.get_rank() == args.exit_rank:
    if args.raise_exit:
        raise SystemExit(args.exit_code)
    sys.exit(args.exit_code)
dist.destroy_process_group()
