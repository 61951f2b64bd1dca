"""A DDP loop with an exact global batch (gradsync.elastic.GlobalBatchPlan:
24 samples a step in micro-batches of 4, 240 samples, 2 epochs) that
recovers in place, run by test_elastic.py as processes that join by
themselves (no launcher), nodes of MIN:MAX = 2:3.

    elastic_plan_script.py COORDINATOR JOB NODE_ID LOG [DIE_AT [WAIT_AT]]

Appends a JSON line to LOG for every committed step ({"epoch", "step",
"round", "world", "positions"}: the epoch-order positions this rank
trained on, and "seconds": the time since the previous step's line) and
writes its final parameters to LOG.params. With DIE_AT=K (> 0) it SIGKILLs
itself right after committing step K. Re-forms at a step boundary when the
coordinator asks (a node waits to join, or micro-batches move); with
WAIT_AT=K a round of 2 waits after step K until it is asked (up to 120 s),
so that a node started late surely joins mid-training. ELASTIC_DEVICE=sim
trains on a simulated GPU, over the NCCL backend's code paths.

For the straggler test: PLAN_MICRO_BATCH (default 4) and PLAN_EPOCHS
(default 2) size the run, PLAN_NNODES (default "2:3") the round;
PLAN_SLOW=S sleeps S seconds in every micro-batch of this process;
PLAN_STRAGGLER ("report", the default, or "rebalance") and
PLAN_STRAGGLER_THRESHOLD (seconds) are run()'s; with PLAN_STOP_AFTER=K
training ends K steps into the first round after round 1."""
import json
import os
import signal
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel

import gradsync.elastic
from elastic_mlp import MlpTrainer, plan_data

coordinator, job, node, log = sys.argv[1:5]
die_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
wait_at = int(sys.argv[6]) if len(sys.argv) > 6 else 0
N = 240
EPOCHS = int(os.environ.get("PLAN_EPOCHS", "2"))
SLOW = float(os.environ.get("PLAN_SLOW", "0"))
STOP_AFTER = int(os.environ.get("PLAN_STOP_AFTER", "0"))
plan = gradsync.elastic.GlobalBatchPlan(
    global_batch=24, micro_batch=int(os.environ.get("PLAN_MICRO_BATCH", "4")),
    epoch_size=N)
X, Y, epoch_order = plan_data(N)


class PlanTrainer(MlpTrainer):
    def __init__(self):
        super().__init__()
        self.total = EPOCHS * plan.steps_per_epoch

    def train(self, round):
        gradsync.elastic.copy_state(round, self.model, self.optimizer, self)
        if STOP_AFTER and round.number >= 2:
            self.total = min(self.total, self.step + STOP_AFTER)
        ddp = DistributedDataParallel(self.model,
                                      process_group=round.process_group)
        gradsync.elastic.observe(ddp, round)
        last = time.monotonic()
        while self.step < self.total:
            epoch, k = divmod(self.step, plan.steps_per_epoch)
            order = epoch_order(epoch)
            self.optimizer.zero_grad()
            positions = []
            for begin, end in gradsync.elastic.micro_batches(plan, round, k,
                                                             ddp):
                idx = order[begin:end]
                positions += range(begin, end)
                time.sleep(SLOW)
                loss = torch.nn.functional.mse_loss(
                    ddp(X[idx]), Y[idx], reduction="sum")
                (loss / plan.loss_divisor(round.world_size)).backward()
            self.optimizer.step()
            self.step += 1
            now = time.monotonic()
            with open(log, "a") as f:
                f.write(json.dumps({
                    "epoch": epoch, "step": k, "round": round.number,
                    "world": round.world_size, "backend": round.backend,
                    "rank": round.rank, "positions": positions,
                    "seconds": now - last,
                }) + "\n")
            last = now
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


gradsync.elastic.run(
    PlanTrainer(), coordinator=coordinator, job=job,
    nnodes=os.environ.get("PLAN_NNODES", "2:3"), node_id=node, last_call=2.0,
    device=os.environ.get("ELASTIC_DEVICE", "cpu"), exact_global_batch=True,
    straggler_policy=os.environ.get("PLAN_STRAGGLER", "report"),
    straggler_threshold=float(os.environ.get("PLAN_STRAGGLER_THRESHOLD", "0")))
