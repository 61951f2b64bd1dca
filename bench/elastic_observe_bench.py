"""One side of the Python-loop straggler-reporting benchmark
(bench/elastic_loop_bench.sh --what=observe): a gradsync.elastic loop of one
rank training bench/elastic_resnet.py's ResNet-18 under DDP over the
round's process group (a global batch of 16 of 3x32x32 in 2 micro-batches
of 8, one intra-op thread) for STEPS steps after 2 warm-ups. SIDE
"observed": observe(ddp, round) and micro_batches(); "plain": DDP's own
all-reduce, the same micro-batches under no_sync by hand.

    elastic_observe_bench.py COORDINATOR JOB SIDE STEPS
    elastic_observe_bench.py --summarize < LINES

Prints one line of JSON: {"side": SIDE, "step": the median step (the
micro-batches' forward and backward, the optimizer step and
round.report_step)}. With --summarize: each side's steps (alternating
sides), the medians over rounds and their ratio."""
import contextlib
import json
import statistics
import sys
import time


def summarize(lines):
    rows = [json.loads(line) for line in lines if line.startswith("{")]

    def median(side):
        return statistics.median(r["step"] for r in rows if r["side"] == side)

    for side in ("observed", "plain"):
        steps = [round(r["step"] * 1e3, 2) for r in rows if r["side"] == side]
        print(f"{side}: step {steps} ms")
    observed, plain = median("observed"), median("plain")
    print(f"median step: {observed * 1e3:.2f} ms observed, {plain * 1e3:.2f} "
          f"ms plain (ratio {observed / plain:.3f})")


if sys.argv[1:] == ["--summarize"]:
    summarize(sys.stdin)
    sys.exit(0)

import torch  # noqa: E402  (not needed to summarize)
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import gradsync.elastic  # noqa: E402
from elastic_resnet import WARMUP, ResNetTrainer  # noqa: E402

coordinator, job, side, steps = sys.argv[1], sys.argv[2], sys.argv[3], \
    int(sys.argv[4])
plan = gradsync.elastic.GlobalBatchPlan(global_batch=16, micro_batch=8,
                                        epoch_size=16 * (WARMUP + steps))


class Bench(ResNetTrainer):
    def __init__(self):
        super().__init__()
        self.times = []

    def spans(self, round, ddp, k):
        if side == "observed":
            yield from gradsync.elastic.micro_batches(plan, round, k, ddp)
            return
        spans = gradsync.elastic.step_positions(plan, round, k)
        for i, span in enumerate(spans):
            last = i == len(spans) - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                yield span

    def train(self, round):
        gradsync.elastic.copy_state(round, self.model, self.optimizer, self)
        ddp = DistributedDataParallel(self.model,
                                      process_group=round.process_group)
        if side == "observed":
            gradsync.elastic.observe(ddp, round)
        x = torch.randn(plan.global_batch * plan.steps_per_epoch, 3, 32, 32)
        y = torch.randint(0, 10, (x.shape[0],))
        while self.step < WARMUP + steps:
            start = time.perf_counter()
            self.optimizer.zero_grad()
            for begin, end in self.spans(round, ddp, self.step):
                loss = torch.nn.functional.cross_entropy(
                    ddp(x[begin:end]), y[begin:end], reduction="sum")
                (loss / plan.loss_divisor(round.world_size)).backward()
            self.optimizer.step()
            self.step += 1
            round.report_step(self.step, samples=plan.global_batch)
            if self.step > WARMUP:
                self.times.append(time.perf_counter() - start)


torch.set_num_threads(1)
bench = Bench()
gradsync.elastic.run(bench, coordinator=coordinator, job=job,
                     fingerprint_every=0)
print(json.dumps({"side": side, "step": statistics.median(bench.times)}))
