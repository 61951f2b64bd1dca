"""A DDP training loop that recovers in place (gradsync.elastic), run by
test_elastic.py under `gradsync launch --self_managed`: an MLP, SGD with
momentum, STEPS steps of a global batch of 24 samples drawn from the step
number alone, split across the round's ranks. With ELASTIC_DIE_AT=K the
process of local rank 1 SIGKILLs itself right after committing step K, in
its first life only (a restarted process has no LOCAL_RANK);
ELASTIC_STEP_SLEEP=S sleeps S seconds after each step; with
ELASTIC_RAISE_AT=K rank 0 raises ValueError after step K; with
ELASTIC_CORRUPT_AT=K the process of local rank 1 flips one bit of its
first parameter right after committing step K, in its first life (silent
data corruption); with ELASTIC_HANG_AT=K the process of local rank 1
stops issuing collectives after committing step K (it sleeps 60 s, in its
first life); ELASTIC_FINGERPRINT_EVERY=N is run()'s fingerprint_every;
with ELASTIC_CHECKPOINT_AT=K rank 0 stands still for
ELASTIC_CHECKPOINT_SECONDS (default 5) after committing step K (a slow
checkpoint write), which every rank reports with checkpoint=True unless
ELASTIC_CHECKPOINT_UNMARKED=1; ELASTIC_MIN_COLLECTIVE_TIMEOUT=S is run()'s
min_collective_timeout;
ELASTIC_DEVICE=sim trains on a simulated GPU (NCCL's code paths),
ELASTIC_DEVICE=cuda on a GPU; ELASTIC_FAILPOINT=SPEC arms the NCCL
failpoints SPEC in the process of local rank ELASTIC_FAILPOINT_RANK
(default 1), in its first life; with ELASTIC_BAD_REPORTS=1 every
report_step is preceded by one of samples=-1 and by fingerprints of step 0
and of one name for no tensor, each of which must raise ValueError
(printed at step 1: "refused: MESSAGE"). Prints
"pid P: round N rank R of W from step S on BACKEND" at each round's start; each rank
writes its final parameters to ELASTIC_OUT.RANK. Its DDP all-reduces through
gradsync.elastic.observe's hook (first-bucket times, COMM TIME)."""
import json
import os
import signal
import time

import torch
from torch.nn.parallel import DistributedDataParallel

import gradsync.elastic
from elastic_mlp import MlpTrainer

STEPS = int(os.environ.get("ELASTIC_STEPS", "30"))
DIE_AT = int(os.environ.get("ELASTIC_DIE_AT", "0"))
STEP_SLEEP = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))
RAISE_AT = int(os.environ.get("ELASTIC_RAISE_AT", "0"))
CORRUPT_AT = int(os.environ.get("ELASTIC_CORRUPT_AT", "0"))
HANG_AT = int(os.environ.get("ELASTIC_HANG_AT", "0"))
BAD_REPORTS = os.environ.get("ELASTIC_BAD_REPORTS") == "1"
CHECKPOINT_AT = int(os.environ.get("ELASTIC_CHECKPOINT_AT", "0"))
CHECKPOINT_SECONDS = float(os.environ.get("ELASTIC_CHECKPOINT_SECONDS", "5"))
CHECKPOINT_MARKED = os.environ.get("ELASTIC_CHECKPOINT_UNMARKED") != "1"
GLOBAL_BATCH = 24


class StepTrainer(MlpTrainer):
    def train(self, round):
        device = gradsync.elastic.tensor_device(round)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.model.to(device)
        gradsync.elastic.copy_state(round, self.model, self.optimizer, self)
        print(f"pid {os.getpid()}: round {round.number} rank {round.rank} of "
              f"{round.world_size} from step {self.step} on {round.backend}",
              flush=True)
        ddp = DistributedDataParallel(self.model,
                                      process_group=round.process_group)
        gradsync.elastic.observe(ddp, round)
        share = GLOBAL_BATCH // round.world_size
        while self.step < STEPS:
            data = torch.Generator().manual_seed(1000 + self.step)
            x = torch.randn(GLOBAL_BATCH, 8, generator=data)
            y = torch.sin(x.sum(dim=1, keepdim=True))
            x, y = x.to(device), y.to(device)
            mine = slice(round.rank * share, (round.rank + 1) * share)
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x[mine]), y[mine])
            loss.backward()
            self.optimizer.step()
            self.step += 1
            if BAD_REPORTS:
                report_badly(round, self.step)
            checkpoint = bool(CHECKPOINT_AT) and self.step == CHECKPOINT_AT
            round.report_step(self.step, samples=share, loss=loss.item(),
                              checkpoint=checkpoint and CHECKPOINT_MARKED)
            time.sleep(STEP_SLEEP)
            if checkpoint and round.rank == 0 and round.number == 1:
                time.sleep(CHECKPOINT_SECONDS)  # writing it
            if RAISE_AT and self.step == RAISE_AT and round.rank == 0:
                raise ValueError(f"bad batch at step {self.step}")
            if (HANG_AT and self.step == HANG_AT and
                    os.environ.get("LOCAL_RANK") == "1"):
                time.sleep(60)  # a rank stuck outside its collectives
            if (CORRUPT_AT and self.step == CORRUPT_AT and
                    os.environ.get("LOCAL_RANK") == "1"):
                flip_one_bit(self.model)
            if (DIE_AT and self.step == DIE_AT and
                    os.environ.get("LOCAL_RANK") == "1"):
                os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get("ELASTIC_OUT"):
            with open(f"{os.environ['ELASTIC_OUT']}.{round.rank}", "w") as f:
                json.dump(self.parameters_list(), f)


def report_badly(round, step):
    for what, call in [
            ("a report of -1 samples",
             lambda: round.report_step(step, samples=-1)),
            ("a fingerprint of step 0",
             lambda: round.report_fingerprint(0, [], [])),
            ("a fingerprint of one name for no tensor",
             lambda: round.report_fingerprint(step, ["w"], []))]:
        try:
            call()
        except ValueError as refused:
            if step == 1:
                print(f"refused: {refused}", flush=True)
        else:
            raise AssertionError(f"{what} was taken")


def flip_one_bit(model):
    """Bit 20 of the first element of the first parameter, in place (what
    gradsync-worker's failpoint corrupt_parameters does)."""
    with torch.no_grad():
        first = next(model.parameters())
        first.view(torch.int32).view(-1)[0] ^= 1 << 20
    print(f"pid {os.getpid()}: flipped a bit of the first parameter",
          flush=True)


failpoint = (os.environ.get("ELASTIC_FAILPOINT", "")
             if os.environ.get("LOCAL_RANK") ==
             os.environ.get("ELASTIC_FAILPOINT_RANK", "1") else "")
gradsync.elastic.run(StepTrainer(),
                     device=os.environ.get("ELASTIC_DEVICE", "cpu"),
                     failpoint=failpoint,
                     fingerprint_every=int(
                         os.environ.get("ELASTIC_FINGERPRINT_EVERY", "100")),
                     min_collective_timeout=float(
                         os.environ.get("ELASTIC_MIN_COLLECTIVE_TIMEOUT",
                                        "10")))
