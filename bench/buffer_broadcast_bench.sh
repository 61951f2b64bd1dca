#!/usr/bin/env bash
# DDP's buffer broadcast (broadcast_buffers: rank 0's BatchNorm statistics to
# every rank before each forward), side by side in one run: gradsync's
# coalesced BroadcastTensors and one broadcast per buffer (gradsync's DDP
# until 2026-11-30), over Gloo and shared memory (bench/
# buffer_broadcast_bench.cc), then PyTorch's _broadcast_coalesced over Gloo
# (bench/torch_buffer_broadcast.py), the model's buffers on both sides.
#   bench/buffer_broadcast_bench.sh [--model=resnet50] [--world_size=2]
#                                   [--iterations=50] [--no_build]
# Prints each side's RESULT line, then the ratios: gradsync coalesced over
# PyTorch's (both Gloo; goal <= 1) and over one broadcast per buffer.
set -euo pipefail
cd "$(dirname "$0")/.."
model=resnet50 world=2 iterations=50 build=1
for arg in "$@"; do
  case "$arg" in
    --model=*) model=${arg#*=} ;;
    --world_size=*) world=${arg#*=} ;;
    --iterations=*) iterations=${arg#*=} ;;
    --no_build) build=0 ;;
    *) echo "buffer_broadcast_bench: unknown argument $arg" >&2; exit 2 ;;
  esac
done
case "$model" in
  resnet18|resnet50) ;;
  *) echo "buffer_broadcast_bench: --model must be resnet18 or resnet50 (torchvision has them too), not $model" >&2; exit 2 ;;
esac
bin=${GRADSYNC_BIN:-bazel-bin}
python=${PYTHON:-/usr/bin/python3}
if [ "$build" = 1 ] && [ "$bin" = bazel-bin ]; then
  deploy/install_deps.sh python3-torch python3-torchvision
  bazel build //bench:buffer_broadcast_bench 2>&1 | tail -n 1
fi
ours=$("$bin/bench/buffer_broadcast_bench" --model="$model" --world_size="$world" \
  --iterations="$iterations" --backend=gloo,shm 2>/dev/null | grep '^RESULT')
theirs=$("$python" bench/torch_buffer_broadcast.py --model="$model" \
  --world_size="$world" --iterations="$iterations" | grep '^RESULT')
echo "$ours"
echo "RESULT torch backend=gloo ${theirs#RESULT }"
field() { sed -n "s/.*$2=\([^ ]*\).*/\1/p" <<<"$1" | head -n 1; }
gloo=$(grep 'backend=gloo' <<<"$ours")
awk -v ours="$(field "$gloo" coalesced_ms)" -v per="$(field "$gloo" per_buffer_ms)" \
    -v torch="$(field "$theirs" coalesced_ms)" 'BEGIN {
  printf "buffer broadcast (Gloo), gradsync coalesced / PyTorch _broadcast_coalesced: %.3f (goal <= 1)\n", ours / torch
  printf "buffer broadcast (Gloo), gradsync coalesced / one broadcast per buffer: %.3f\n", ours / per
}'
