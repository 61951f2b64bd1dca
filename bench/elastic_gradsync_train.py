"""The gradsync.elastic side of bench/recovery_bench.py (--python): the
script torch_elastic_train.py runs under torchrun (same model, data, batch
and optimizer), written as a gradsync.elastic Trainer instead of around a
checkpoint: a process that joins the job by itself (no launcher); the one
that joins last waits as a spare. When a rank is lost, the survivors
re-form in place with the spare and take the state from the source rank.

  elastic_gradsync_train.py COORDINATOR JOB NODE_ID WORLD [--hidden=512]
      [--batch_size=32] [--steps=120]

Prints "ROUND <round> RANK <rank>" at each round's start and, on rank 0 of
a round, "STEP <step>" after every step."""
import argparse
import os
import sys

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import gradsync.elastic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp import make_model, synthetic  # noqa: E402  (the same model and data)


class Trainer(gradsync.elastic.Trainer):
    def __init__(self, args):
        super().__init__()
        self.args = args
        torch.manual_seed(0)
        self.model = make_model("mlp", args.hidden)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr,
                                         momentum=args.momentum)
        self.images, self.labels = synthetic(args.synthetic_size, 0)
        self.step = 0

    def committed_step(self):
        return self.step

    def train(self, round):
        gradsync.elastic.copy_state(round, self.model, self.optimizer, self)
        print("ROUND %d RANK %d" % (round.number, round.rank), flush=True)
        ddp = DistributedDataParallel(self.model,
                                      process_group=round.process_group)
        sampler = torch.utils.data.DistributedSampler(
            range(self.args.synthetic_size), num_replicas=round.world_size,
            rank=round.rank, shuffle=False)
        order = torch.tensor(list(sampler))
        batch = self.args.batch_size
        per_epoch = (len(order) + batch - 1) // batch
        while self.step < self.args.steps:
            j = self.step % per_epoch
            idx = order[j * batch:(j + 1) * batch]
            self.optimizer.zero_grad()
            nn.functional.cross_entropy(ddp(self.images[idx]),
                                        self.labels[idx]).backward()
            self.optimizer.step()
            self.step += 1
            round.report_step(self.step, samples=len(idx))
            if round.rank == 0:
                print("STEP %d" % self.step, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("coordinator")
    p.add_argument("job")
    p.add_argument("node_id")
    p.add_argument("world", type=int)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--synthetic_size", type=int, default=8192)
    args = p.parse_args()
    torch.set_num_threads(1)
    gradsync.elastic.run(Trainer(args), coordinator=args.coordinator,
                         job=args.job, nnodes=str(args.world),
                         node_id=args.node_id, timeout=60)


if __name__ == "__main__":
    main()
