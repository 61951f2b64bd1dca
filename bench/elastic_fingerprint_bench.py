"""One side of the Python-loop fingerprint benchmark
(bench/elastic_loop_bench.sh --what=fingerprint): a gradsync.elastic loop of
one rank training bench/elastic_resnet.py's ResNet-18 (batch 16 of
3x32x32, one intra-op thread) for STEPS steps after 2 warm-ups, with
fingerprint_every=EVERY (1: a fingerprint after every step; 0: none).

    elastic_fingerprint_bench.py COORDINATOR JOB EVERY STEPS
    elastic_fingerprint_bench.py --summarize < LINES

Prints one line of JSON: {"every": EVERY, "step": the median step (the
forward, backward and optimizer step, then round.report_step, which takes
the fingerprint), "report": the median round.report_step alone}. With
--summarize: the table of such lines (alternating sides), the medians over
rounds, and the fingerprint's own time (report_step with it minus
without) against a step."""
import json
import statistics
import sys
import time


def summarize(lines):
    rows = [json.loads(line) for line in lines if line.startswith("{")]

    def ms(seconds):
        return round(seconds * 1e3, 2)

    def median(every, key):
        return statistics.median(r[key] for r in rows if r["every"] == every)

    for every, name in ((1, "fingerprint every step"), (0, "no fingerprint")):
        mine = [r for r in rows if r["every"] == every]
        print(f"{name}: step {[ms(r['step']) for r in mine]} ms, "
              f"report_step {[ms(r['report']) for r in mine]} ms")
    step_with, step_without = median(1, "step"), median(0, "step")
    own = median(1, "report") - median(0, "report")
    print(f"median step: {ms(step_with)} ms with, {ms(step_without)} ms "
          f"without (ratio {step_with / step_without:.3f}); one fingerprint "
          f"{ms(own)} ms = {100 * own / step_without:.1f}% of a step, "
          f"{own / step_without / 100:.3%} of step time at fingerprint_every=100")


if sys.argv[1:] == ["--summarize"]:
    summarize(sys.stdin)
    sys.exit(0)

import torch  # noqa: E402  (not needed to summarize)

import gradsync.elastic  # noqa: E402
from elastic_resnet import WARMUP, ResNetTrainer  # noqa: E402

coordinator, job, every, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4])


class Bench(ResNetTrainer):
    def __init__(self):
        super().__init__()
        self.times, self.reports = [], []

    def train(self, round):
        gradsync.elastic.copy_state(round, self.model, self.optimizer, self)
        x = torch.randn(16, 3, 32, 32)
        y = torch.randint(0, 10, (16,))
        while self.step < WARMUP + steps:
            start = time.perf_counter()
            self.optimizer.zero_grad()
            torch.nn.functional.cross_entropy(self.model(x), y).backward()
            self.optimizer.step()
            self.step += 1
            reported = time.perf_counter()
            round.report_step(self.step, samples=16)
            end = time.perf_counter()
            if self.step > WARMUP:
                self.times.append(end - start)
                self.reports.append(end - reported)


torch.set_num_threads(1)
bench = Bench()
gradsync.elastic.run(bench, coordinator=coordinator, job=job,
                     fingerprint_every=every)
print(json.dumps({"every": every, "step": statistics.median(bench.times),
                  "report": statistics.median(bench.reports)}))
