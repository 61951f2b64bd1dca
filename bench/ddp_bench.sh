#!/usr/bin/env bash
# DDP benchmark, side by side in one run on this machine: gradsync-worker
# against PyTorch's DistributedDataParallel (python3-torch, Gloo on CPU or
# NCCL on CUDA) on the same model, batch and data, then gradsync's bucketed
# gradient sync against a raw all-reduce of the same bytes.
#   bench/ddp_bench.sh [--model=mlp|resnet18|resnet50] [--hidden=2800] [--batch_size=32]
#                      [--steps=60] [--world_size=2] [--threads=1] [--rounds=3]
#                      [--device=cpu|cuda] [--may_grow] [--gloo] [--no_build]
#                      [--hooks] [--powersgd_rank=2] [--powersgd_start_iter=2]
# --model=mlp (default) trains the MLP 784-hidden-hidden-10 on 1x28x28 images;
# --model=resnet18 torchvision's resnet18(num_classes=10) on 3x32x32 images
# (--hidden does not apply). Both on synthetic data made with one recipe.
# Each configuration runs --rounds times, interleaved with its peer's runs so
# that machine noise hits both; the median of the runs' median step times is
# reported. Prints:
#   - step time of gradsync DDP and PyTorch DDP, and their ratio (goal <= 0.95);
#   - each one's overhead over one process training alone without sync
#     (goal: gradsync's <= half of PyTorch's);
#   - with --may_grow: the step time of a round that may grow (--nnodes=1:2,
#     one node running: the ranks agree after every step whether to re-form
#     at the step boundary, a one-element all-reduce) over the fixed round's;
#   - with --hooks: DDP step time of gradsync and PyTorch with each comm hook,
#     allreduce, fp16_compress and powersgd (rank --powersgd_rank, from step
#     --powersgd_start_iter, which must be 2 to 5 for every measured step to
#     compress), interleaved over the rounds; their ratio; the bytes gradsync
#     puts on the wire per step (summary_json's bucket_bytes_per_step) and
#     their fraction of allreduce's; and the fraction of gradsync's
#     communication hidden behind backward; PyTorch's bytes per step and both
#     final losses as checks (RESULT lines). PyTorch's allreduce is DDP's
#     built-in one; on Gloo its powersgd chains the buckets (bench/torch_ddp.py);
#   - bucketed sync vs raw all-reduce throughput, Gloo and shared memory
#     (goal >= 97%; CPU and MLP only).
# --gloo runs gradsync's ranks over Gloo TCP instead of shared memory.
set -euo pipefail
cd "$(dirname "$0")/.."

hidden=2800 batch=32 steps=60 world=2 threads=1 rounds=3 device=cpu build=1
may_grow=0 shm=true model=mlp hooks=0 powersgd_rank=2 powersgd_start=2
for arg in "$@"; do
  case "$arg" in
    --model=*) model=${arg#*=} ;;
    --hidden=*) hidden=${arg#*=} ;;
    --batch_size=*) batch=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --world_size=*) world=${arg#*=} ;;
    --threads=*) threads=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --device=*) device=${arg#*=} ;;
    --may_grow) may_grow=1 ;;
    --gloo) shm=false ;;
    --no_build) build=0 ;;
    --hooks) hooks=1 ;;
    --powersgd_rank=*) powersgd_rank=${arg#*=} ;;
    --powersgd_start_iter=*) powersgd_start=${arg#*=} ;;
    *) echo "ddp_bench: unknown argument $arg" >&2; exit 2 ;;
  esac
done
case "$model" in
  mlp|resnet18|resnet50) ;;
  *) echo "ddp_bench: --model must be mlp, resnet18 or resnet50, not $model" >&2; exit 2 ;;
esac
# Both PowerSGDs refuse to compress before step 2 (buckets are rebuilt after
# step 1).
[ "$powersgd_start" -ge 2 ] || {
  echo "ddp_bench: --powersgd_start_iter must be at least 2" >&2; exit 2; }
# Where the binaries are: Bazel's output, or a CMake build dir (GPU machines).
bin=${GRADSYNC_BIN:-bazel-bin}
python=${PYTHON:-/usr/bin/python3}
if [ "$build" = 1 ] && [ "$bin" = bazel-bin ]; then
  deploy/install_deps.sh python3-torch python3-torchvision
  bazel build //server:gradsync-coordinator //worker:gradsync-worker \
    //bench:allreduce_bench 2>&1 | tail -n 1
fi
# find_bin DIR NAME: $bin/DIR/NAME or $bin/NAME, whichever exists.
find_bin() {
  for f in "$bin/$1/$2" "$bin/$2"; do [ -x "$f" ] && { echo "$f"; return; }; done
  return 0
}
coordinator_bin=$(find_bin server gradsync-coordinator)
worker_bin=$(find_bin worker gradsync-worker)
allreduce_bin=$(find_bin bench allreduce_bench)
[ -n "$coordinator_bin" ] && [ -n "$worker_bin" ] || {
  echo "ddp_bench: no gradsync-coordinator / gradsync-worker under $bin" >&2; exit 1; }

work=$(mktemp -d)
cleanup() { [ -n "${coord_pid:-}" ] && kill "$coord_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
"$coordinator_bin" --listen=127.0.0.1:0 --port_file="$work/port" \
  >"$work/coordinator.log" 2>&1 &
coord_pid=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
port=$(cat "$work/port")

warmup=5
common=(--model="$model" --hidden="$hidden" --batch_size="$batch" --steps="$steps"
        --synthetic_size=8192 --lr=0.01 --threads="$threads" --device="$device"
        --warmup_steps="$warmup" --log_every=0)
torch_common=(--model="$model" --hidden="$hidden" --batch_size="$batch" --steps="$steps"
              --synthetic_size=8192 --threads="$threads" --device="$device"
              --warmup="$warmup" --world_size="$world")
# gradsync_ddp ROUND [NNODES [FLAG...]]: one DDP run as job "bench-ROUND"
# (runs in a subshell, so the job id comes from the caller), on one node of
# NNODES (default 1), with gradsync-worker's FLAGs added; prints its median
# step time and leaves rank 0's summary in $work/gs.json.
gradsync_ddp() {
  local job=$1 nnodes=${2:-1} pids=()
  shift $(($# < 2 ? $# : 2))
  for r in $(seq "$world"); do
    "$worker_bin" --coordinator="127.0.0.1:$port" --job="bench-$job" \
      --nnodes="$nnodes" --last_call_timeout=0s --shared_memory="$shm" \
      --nproc_per_node="$world" "${common[@]}" "$@" \
      --summary_json="$work/gs.json" >"$work/gs-$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { cat "$work"/gs-*.log >&2; exit 1; }; done
  json_field median_step_ms "$work/gs.json"
}
gradsync_local() {
  "$worker_bin" --standalone "${common[@]}" --summary_json="$work/gl.json" \
    >"$work/gl.log" 2>&1 || { cat "$work/gl.log" >&2; exit 1; }
  json_field median_step_ms "$work/gl.json"
}
# torch_run [FLAG...]: bench/torch_ddp.py with FLAGs added; prints its median
# step time and leaves its RESULT line in $work/t.out.
torch_run() {
  "$python" bench/torch_ddp.py "${torch_common[@]}" "$@" 2>"$work/t.err" \
    | tee "$work/t.out" | sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p' | grep . \
    || { cat "$work/t.err" >&2; exit 1; }
}
json_field() { "$python" -c "import json,sys; print(json.load(open(sys.argv[2]))[sys.argv[1]])" "$1" "$2"; }
# result_field NAME FILE: NAME's value in FILE's RESULT line.
result_field() { sed -n "s/^RESULT.* $1=\([^ ]*\).*/\1/p" "$2"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

if [ "$model" = mlp ]; then
  params=$("$python" -c "h=$hidden; print(784*h + h + h*h + h + 10*h + 10)")
  description="MLP 784-$hidden-$hidden-10 ($params parameters)"
else
  params=$("$python" -c "import torchvision
print(sum(p.numel() for p in torchvision.models.$model(num_classes=10).parameters()))")
  description="${model/resnet/ResNet-} (torchvision's, num_classes=10, 3x32x32 images, $params parameters)"
fi
echo "== $device, $description, batch $batch per rank," \
     "$world ranks, $threads thread(s) per rank, $steps steps ($warmup warm-up), $rounds rounds," \
     "gradsync over $([ "$device" = cuda ] && echo NCCL ||
       { [ "$shm" = true ] && echo "shared memory" || echo "Gloo TCP"; })"
gs_ddp=() gs_local=() t_ddp=() t_local=() gs_grow=()
for round in $(seq "$rounds"); do
  gs_ddp+=("$(gradsync_ddp "$round")")
  cp "$work/gs.json" "$work/gs_ddp.json"
  if [ "$may_grow" = 1 ]; then
    gs_grow+=("$(gradsync_ddp "grow-$round" 1:2)")
    echo "round $round: gradsync ddp in a round that may grow ${gs_grow[-1]} ms"
  fi
  t_ddp+=("$(torch_run)")
  gs_local+=("$(gradsync_local)")
  t_local+=("$(torch_run --local)")
  echo "round $round: gradsync ddp ${gs_ddp[-1]} ms, torch ddp ${t_ddp[-1]} ms," \
       "gradsync alone ${gs_local[-1]} ms, torch alone ${t_local[-1]} ms"
done
g=$(echo "${gs_ddp[*]}" | median); t=$(echo "${t_ddp[*]}" | median)
gl=$(echo "${gs_local[*]}" | median); tl=$(echo "${t_local[*]}" | median)
awk -v g="$g" -v t="$t" -v gl="$gl" -v tl="$tl" 'BEGIN {
  printf "%-28s %12s %12s\n", "median step time (ms)", "gradsync", "pytorch"
  printf "%-28s %12.2f %12.2f\n", "DDP, all ranks", g, t
  printf "%-28s %12.2f %12.2f\n", "one process, no sync", gl, tl
  go = (g - gl) / gl * 100; to = (t - tl) / tl * 100
  printf "%-28s %11.1f%% %11.1f%%\n", "DDP overhead", go, to
  printf "step-time ratio gradsync/pytorch: %.3f (goal <= 0.95)\n", g / t
  if (to > 0) printf "overhead ratio gradsync/pytorch: %.2f (goal <= 0.5)\n", go / to
  printf "RESULT gradsync_ms=%.3f torch_ms=%.3f gradsync_alone_ms=%.3f torch_alone_ms=%.3f step_ratio=%.3f\n", g, t, gl, tl, g / t
}'

# Where gradsync's DDP step went, in the last round (means over its
# measured steps; forward and backward are host times, on a GPU the time to
# queue the work; communication is the collectives' own run time; commit
# wait the host's wait for the step's collectives (and loss) before the
# update, update the optimizer step's host time; a replica
# fingerprint's time is the mean of one, taken every --fingerprint_every
# steps and after the last).
"$python" - "$work/gs_ddp.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ("forward_ms", "backward_ms", "communication_ms",
        "exposed_communication_ms", "commit_wait_ms", "update_ms",
        "fingerprint_ms", "buckets")
print("gradsync's DDP step, last round: " + ", ".join(
    f"{k.replace('_ms', '')} {s.get(k, 0):.3f}" + (" ms" if k.endswith("_ms") else "")
    for k in keys))
print("RESULT_PARTS " + " ".join(f"{k}={s.get(k, 0):.3f}" for k in keys))
EOF

if [ "$may_grow" = 1 ]; then
  gg=$(echo "${gs_grow[*]}" | median)
  awk -v g="$g" -v gg="$gg" 'BEGIN {
    printf "round that may grow: %.2f ms vs fixed %.2f ms, ratio %.3f\n", gg, g, gg / g
    printf "RESULT may_grow_ms=%.3f fixed_ms=%.3f may_grow_ratio=%.3f\n", gg, g, gg / g
  }'
fi

if [ "$hooks" = 1 ]; then
  echo
  echo "== comm hooks, $model: powersgd at rank $powersgd_rank from step $powersgd_start" \
       "($warmup warm-up steps); PyTorch's allreduce is DDP's built-in one"
  [ "$powersgd_start" -le "$warmup" ] || echo "note: powersgd compresses only" \
    "from step $powersgd_start: measured steps before it do not"
  hook_names=(allreduce fp16_compress powersgd)
  powersgd_flags=(--powersgd_rank="$powersgd_rank" --powersgd_start_iter="$powersgd_start")
  declare -A h_gs h_t h_bytes h_tbytes h_hidden h_comm h_exposed h_gloss h_tloss
  for round in $(seq "$rounds"); do
    for hook in "${hook_names[@]}"; do
      flags=(--comm_hook="$hook")
      [ "$hook" = powersgd ] && flags+=("${powersgd_flags[@]}")
      ms=$(gradsync_ddp "${hook//_/-}-$round" 1 "${flags[@]}")  # job ids: DNS labels
      bytes=$(json_field bucket_bytes_per_step "$work/gs.json")
      hidden_fraction=$("$python" -c "import json,sys
s = json.load(open(sys.argv[1]))
c = s['communication_ms']
print(s['hidden_communication_ms'] / c if c > 0 else 0)" "$work/gs.json")
      h_gs[$hook]+=" $ms" h_bytes[$hook]+=" $bytes" h_hidden[$hook]+=" $hidden_fraction"
      h_comm[$hook]+=" $(json_field communication_ms "$work/gs.json")"
      h_exposed[$hook]+=" $(json_field exposed_communication_ms "$work/gs.json")"
      h_gloss[$hook]+=" $(json_field final_loss "$work/gs.json")"
      tms=$(torch_run "${flags[@]}")
      tbytes=$(result_field bytes_per_step "$work/t.out")
      h_t[$hook]+=" $tms" h_tbytes[$hook]+=" $tbytes"
      h_tloss[$hook]+=" $(result_field final_loss "$work/t.out")"
      echo "round $round, $hook: gradsync ddp $ms ms ($bytes bytes/step)," \
           "torch ddp $tms ms ($tbytes bytes/step)"
    done
  done
  printf "%-14s %11s %11s %7s %15s %10s %9s %10s %10s %15s\n" hook "gradsync ms" "pytorch ms" \
    ratio "gradsync B/step" "of allred." "comm ms" "exposed ms" "hidden" "pytorch B/step"
  base=$(echo "${h_bytes[allreduce]}" | median)
  for hook in "${hook_names[@]}"; do
    awk -v hook="$hook" -v g="$(echo "${h_gs[$hook]}" | median)" \
        -v t="$(echo "${h_t[$hook]}" | median)" \
        -v b="$(echo "${h_bytes[$hook]}" | median)" -v base="$base" \
        -v hf="$(echo "${h_hidden[$hook]}" | median)" \
        -v cm="$(echo "${h_comm[$hook]}" | median)" \
        -v ex="$(echo "${h_exposed[$hook]}" | median)" \
        -v tb="$(echo "${h_tbytes[$hook]}" | median)" \
        -v gloss="$(echo "${h_gloss[$hook]}" | median)" \
        -v tloss="$(echo "${h_tloss[$hook]}" | median)" 'BEGIN {
      f = base > 0 ? b / base : 0
      printf "%-14s %11.2f %11.2f %7.3f %15d %9.2f%% %9.2f %10.2f %9.1f%% %15d\n", hook, g, t, g / t, b, 100 * f, cm, ex, 100 * hf, tb
      printf "RESULT hook=%s gradsync_ms=%.3f torch_ms=%.3f step_ratio=%.3f gradsync_bytes_per_step=%d bytes_fraction=%.4f comm_ms=%.3f exposed_comm_ms=%.3f hidden_comm_fraction=%.3f torch_bytes_per_step=%d gradsync_final_loss=%.4f torch_final_loss=%.4f\n", hook, g, t, g / t, b, f, cm, ex, hf, tb, gloss, tloss
    }' >>"$work/hooks.out"
  done
  grep -v '^RESULT' "$work/hooks.out"
  grep '^RESULT' "$work/hooks.out"
  echo "(ratio: gradsync/pytorch step time; of allred.: gradsync's bytes over its" \
       "allreduce bytes; comm ms: how long gradsync's collectives ran, each from its" \
       "own start to its end; exposed ms: from the last gradient to the last" \
       "collective's end; hidden: (comm - exposed) / comm, a lower bound;" \
       "pytorch B/step, counted at its dist.all_reduce, checks gradsync's)"
fi

if [ "$device" = cpu ] && [ "$model" = mlp ] && [ -n "$allreduce_bin" ]; then
  echo
  echo "== bucketed gradient sync vs one raw all-reduce of the same bytes ($world ranks;"
  echo "   gradsync-worker uses shm on one node, gloo across nodes)"
  "$allreduce_bin" --hidden="$hidden" --world_size="$world" --iterations=20 \
    --backend=gloo,shm
fi
