#!/usr/bin/env bash
# What the replica fingerprint (--fingerprint_every) costs a training step:
# gradsync-worker --standalone on ResNet-18 (synthetic CIFAR-sized images,
# SGD with momentum, so the optimizer state is fingerprinted too), a
# fingerprint after every step, the fingerprint's own time measured in the
# process (--summary_json's fingerprint_ms) against the median step time of
# the same run. Prints each run, the median share of one fingerprint in a
# step and what that is at the default --fingerprint_every=100.
#   bench/fingerprint_bench.sh [WORKER] [RUNS] [STEPS] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
worker=${1:-bazel-bin/worker/gradsync-worker}
runs=${2:-3}
steps=${3:-8}
batch=${4:-16}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

shares=()
for i in $(seq "$runs"); do
  "$worker" --standalone --model=resnet18 --dataset=synthetic \
    --synthetic_size=$((batch * (steps + 1))) --batch_size="$batch" \
    --steps="$steps" --warmup_steps=2 --log_every=0 --momentum=0.9 \
    --fingerprint_every=1 --summary_json="$work/s.json" >/dev/null 2>&1
  line=$(/usr/bin/python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
print(s["fingerprint_ms"], s["median_step_ms"], s["parameters"])' "$work/s.json")
  read -r fp step params <<<"$line"
  echo "run $i: fingerprint ${fp} ms, median step ${step} ms (${params} parameters)"
  shares+=("$(/usr/bin/python3 -c "print($fp / $step)")")
done
/usr/bin/python3 - "${shares[*]}" <<'PY'
import statistics, sys
share = statistics.median(float(x) for x in sys.argv[1].split())
print(f"one fingerprint: {100*share:.2f}% of a step (median of runs); "
      f"at --fingerprint_every=100: {share:.4f}% of step time")
PY
