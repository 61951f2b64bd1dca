"""A DDP loop with an exact global batch (gradsync.elastic.GlobalBatchPlan:
24 samples a step in micro-batches of 4, 240 samples, 2 epochs) that
recovers in place, run by test_elastic.py as processes that join by
themselves (no launcher), nodes of MIN:MAX = 2:3.

    elastic_plan_script.py COORDINATOR JOB NODE_ID LOG [DIE_AT [WAIT_AT]]

Appends a JSON line to LOG for every committed step ({"epoch", "step",
"round", "world", "positions"}: the epoch-order positions this rank
trained on) and writes its final parameters to LOG.params. With DIE_AT=K
(> 0) it SIGKILLs itself right after committing step K. Re-forms at a step
boundary when the coordinator asks (a node waits to join); with WAIT_AT=K
a round of 2 waits after step K until it is asked (up to 120 s), so that a
node started late surely joins mid-training. ELASTIC_DEVICE=sim trains on
a simulated GPU, over the NCCL backend's code paths."""
import contextlib
import json
import os
import signal
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel

import gradsync.elastic
from elastic_mlp import MlpTrainer

coordinator, job, node, log = sys.argv[1:5]
die_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
wait_at = int(sys.argv[6]) if len(sys.argv) > 6 else 0
N, EPOCHS = 240, 2
plan = gradsync.elastic.GlobalBatchPlan(global_batch=24, micro_batch=4,
                                        epoch_size=N)
data = torch.Generator().manual_seed(7)
X = torch.randn(N, 8, generator=data)
Y = torch.sin(X.sum(dim=1, keepdim=True))


class PlanTrainer(MlpTrainer):
    def train(self, round):
        gradsync.elastic.copy_state(round, self.model, self.optimizer, self)
        ddp = DistributedDataParallel(self.model,
                                      process_group=round.process_group)
        total = EPOCHS * plan.steps_per_epoch
        while self.step < total:
            epoch, k = divmod(self.step, plan.steps_per_epoch)
            order = torch.randperm(
                N, generator=torch.Generator().manual_seed(100 + epoch))
            spans = gradsync.elastic.step_positions(plan, round, k)
            self.optimizer.zero_grad()
            for i, (begin, end) in enumerate(spans):
                idx = order[begin:end]
                last = i == len(spans) - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    loss = torch.nn.functional.mse_loss(
                        ddp(X[idx]), Y[idx], reduction="sum")
                    (loss / plan.loss_divisor(round.world_size)).backward()
            self.optimizer.step()
            self.step += 1
            with open(log, "a") as f:
                f.write(json.dumps({
                    "epoch": epoch, "step": k, "round": round.number,
                    "world": round.world_size, "backend": round.backend,
                    "positions": [p for b, e in spans for p in range(b, e)],
                }) + "\n")
            round.report_step(self.step)
            if die_at and self.step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if gradsync.elastic.should_reform(round):
                raise gradsync.elastic.ReformAtStepBoundary()
            if self.step == wait_at and round.world_size == 2:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    time.sleep(0.1)
                    if gradsync.elastic.should_reform(round):
                        raise gradsync.elastic.ReformAtStepBoundary()
        with open(log + ".params", "w") as f:
            json.dump(self.parameters_list(), f)


gradsync.elastic.run(PlanTrainer(), coordinator=coordinator, job=job,
                     nnodes="2:3", node_id=node, last_call=2.0,
                     device=os.environ.get("ELASTIC_DEVICE", "cpu"))
