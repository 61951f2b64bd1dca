#!/usr/bin/env bash
# deploy/gpu_run.sh's step python_elastic: a PyTorch training loop on the
# GPU through gradsync._C, recovering in place. In a build tree gpu_run.sh
# configured, it builds the extension (CMake target python_gradsync_C)
# against the machine's PyTorch, installs the package as a user would
# (`pip install ./python` with GRADSYNC_EXTENSION, into BUILD_DIR/pypkg),
# runs python/tests/extension_smoke.py --cuda, then python/tests/
# elastic_script.py under `gradsync launch --self_managed --device=auto
# --nproc_per_node=gpu` with ELASTIC_DEVICE=cuda and the failpoint
# nccl_async_error:20 in local rank 0: its 20th NCCL collective fails after
# the host moved on, the loop's backward() raises before the optimizer step,
# and the same process re-creates its communicator in round 2 and finishes
# with the parameters of an uninterrupted run of the script (run first).
#
#   deploy/gpu/python_elastic.sh BUILD_DIR PYTHON COORDINATOR_ADDRESS [DEVICE]
#
# DEVICE: cuda (default), or sim to run the same without a GPU (one
# simulated GPU; the smoke test's CUDA case is left out), as ctest's
# python.python_elastic_sim does (deploy/gpu/python_elastic_test.sh).
#
# Ends with "python_elastic: rounds=R failpoint_hit=H steps=S seconds=T
# max_rel_diff=D" and exit 0 when the job succeeded after the failpoint
# fired, in a round 2 on NCCL, every rank within 1e-5 of the uninterrupted
# run; non-zero otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
build_dir=$(cd "$1" && pwd) python=$2 coordinator=$3 device=${4:-cuda}
steps=40
case "$device" in
  cuda) launch_device=auto smoke_args=(--cuda) ;;
  sim) launch_device=sim smoke_args=(); export GRADSYNC_SIM_DEVICES=1 ;;
  *) echo "python_elastic: DEVICE must be cuda or sim, not '$device'" >&2; exit 2 ;;
esac

why=$(grep -o 'leaving out the Python extension: .*' "$build_dir/configure.log" 2>/dev/null)
[ -z "$why" ] || { echo "python_elastic: $why"; exit 1; }
cmake --build "$build_dir" --target python_gradsync_C || exit 1
extension=$build_dir/python/gradsync/_C.so
"$python" python/tests/extension_smoke.py "$extension" "${smoke_args[@]}" || exit 1

rm -rf "$build_dir/pypkg"
GRADSYNC_EXTENSION=$extension "$python" -m pip install --quiet --no-deps \
  --no-build-isolation --target "$build_dir/pypkg" ./python || exit 1

out=$build_dir/python_elastic
rm -rf "$out" && mkdir -p "$out"
# run NAME [FAILPOINT]: the script once, as job gpu-python-elastic-NAME; its
# output in $out/NAME.log, each rank's final parameters in $out/NAME.RANK;
# sets $code to the launcher's exit status.
run() {
  PYTHONPATH=$build_dir/pypkg ELASTIC_DEVICE=$device ELASTIC_STEPS=$steps \
    ELASTIC_FAILPOINT=${2:-} ELASTIC_FAILPOINT_RANK=0 ELASTIC_OUT=$out/$1 \
    "$build_dir/cli/gradsync" launch --coordinator="$coordinator" \
    --job="gpu-python-elastic-$1" --self_managed --max_restarts=1 \
    --device=$launch_device --nproc_per_node=gpu \
    --python="$(command -v "$python")" python/tests/elastic_script.py 2>&1 |
    tee "$out/$1.log"
  code=${PIPESTATUS[0]}
}
run reference
[ "$code" -eq 0 ] || { echo "python_elastic: the uninterrupted run exited $code"; exit 1; }
start=$SECONDS
run healed nccl_async_error:20
seconds=$((SECONDS - start))
rounds=$(grep -c 'pid [0-9]*: round [0-9]* rank 0 ' "$out/healed.log")
hit=$(grep -c 'failpoint nccl_async_error hit' "$out/healed.log")
# The largest relative difference of any rank's final parameters from the
# uninterrupted run's rank 0 (the C++ tests' bound: 1e-5).
diff=$("$python" - "$out" <<'PY'
import glob, json, sys
want = [x for p in json.load(open(f"{sys.argv[1]}/reference.0")) for x in p]
worst = 0.0
for path in sorted(glob.glob(f"{sys.argv[1]}/healed.*[0-9]")):
    got = [x for p in json.load(open(path)) for x in p]
    assert len(got) == len(want), path
    worst = max([worst] + [abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, want)])
print(f"{worst:.3g}")
PY
)
echo "python_elastic: rounds=$rounds failpoint_hit=$hit steps=$steps seconds=$seconds max_rel_diff=${diff:-none}"
[ "$code" -eq 0 ] || { echo "python_elastic: gradsync launch exited $code"; exit 1; }
[ "$hit" -gt 0 ] || { echo "python_elastic: the failpoint did not fire"; exit 1; }
grep -q 'round 2 rank 0 of .* on nccl' "$out/healed.log" ||
  { echo "python_elastic: no round 2 on NCCL after the injected error"; exit 1; }
"$python" -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= 1e-5 else 1)' "${diff:-inf}" ||
  { echo "python_elastic: the healed run ended away from the uninterrupted one"; exit 1; }
