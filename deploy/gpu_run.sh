#!/usr/bin/env bash
# The GPU check, in one call that tells the truth: builds what it needs with
# CMake on a GPU machine (PyTorch with its LibTorch, CUDA, NCCL, CMake,
# ninja, a C++ compiler; no Bazel, no network), runs the steps below in order
# of value, and exits 0 only when every step it was asked to run passed: a
# step that is missing, skipped or failed makes it exit 1 (2: bad usage).
#
#   deploy/gpu_run.sh --out=DIR [--deps=DIR] [--build_dir=DIR] [--jobs=N]
#       [--python=PY] [--steps=a,b,...] [--budget_s=S] [--no_build] [--dry_run]
#
#   --out    where the results go (created): summary.txt, summary.json (every
#            step: passed/failed/skipped and why, its seconds and figures) and
#            logs.tar.gz (every log), nothing else
#   --deps   Debian packages for gRPC, protobuf, abseil, Gloo, GoogleTest, ...
#            from deploy/pack_gpu_deps.sh (.deb files, unpacked into
#            BUILD_DIR/deps-root, never into /), or a folder holding such an
#            unpacked tree (usr/...). Empty: the machine's own.
#   --build_dir  default build/gpu;  --jobs  default: all cores
#   --python     the Python with torch (default python3)
#   --budget_s   the whole call's time, build included (default 450: the
#            call must fit in 8 minutes on the lent machine, with time left
#            to write the summaries). Each step's own timeout is cut to what
#            is left; a step the budget does not reach is recorded skipped
#            ("out of time"), which fails the call.
#   --no_build   use the binaries already in BUILD_DIR (a second try on the
#            same machine); a missing one fails the steps that need it
#   --steps  the steps to run, comma-separated (default: all, in this order):
#     nccl_tests       the NCCL backend: its real layer on the GPU (world size
#                      1, cuda_nccl_device_test) and its multi-rank logic on
#                      the simulated device (nccl_backend_test); a skipped
#                      case fails it (the "no GPU" case is left out: it
#                      skips wherever there is a GPU)
#     abort_recreate   20 cycles of a communicator aborted and re-created on
#                      the GPU, with the GPU memory in use before and after
#     worker_fault     gradsync-worker --device=cuda trains (an exact global
#                      batch of 8 micro-batches) and survives an
#                      asynchronous NCCL error injected by a failpoint
#     users_script     deploy/gpu/ddp_resnet50.py (PyTorch's DDP tutorial
#                      code, ResNet-50, SyncBatchNorm) under gradsync launch
#                      --nproc_per_node=gpu; passes only with its
#                      "ddp_resnet50:" result line
#     resnet50_ratio   ResNet-50 DDP step time, gradsync against PyTorch DDP
#                      on the same GPU (bench/ddp_bench.sh), as a ratio
#     python_elastic   gradsync._C built against the machine's PyTorch and
#                      installed with pip; a gradsync.elastic loop on the
#                      GPU (NCCL) survives an injected asynchronous NCCL
#                      error in place (deploy/gpu/python_elastic.sh)
#   --dry_run  needs no GPU, deps or build: checks that every step's command
#            line is well formed and that every script and binary it names
#            exists in the tree or is a target of the CMake build; writes the
#            same summaries (each step "planned"). CI runs it.
#
# PyTorch built with the pre-C++11 ABI does not link with Debian's gRPC:
# then the build leaves LibTorch out, summary.json says so, the steps that
# need it (worker_fault, resnet50_ratio) are skipped with that reason, and
# the others still run. The LibTorch targets build after the rest (step
# build_torch): if they do not compile against the machine's PyTorch, the
# steps that need them are skipped with that reason and the others still
# run. Plan: the whole call fits in 8 minutes on 16 cores (--budget_s
# enforces it).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

all_steps=(nccl_tests abort_recreate worker_fault users_script resnet50_ratio
           python_elastic)
deps= out= build_dir=build/gpu jobs=$(nproc) python=python3 dry_run=0
budget_s=450 no_build=0
steps_arg=$(IFS=,; echo "${all_steps[*]}")
for arg in "$@"; do
  case "$arg" in
    --deps=*) deps=${arg#*=} ;;
    --out=*) out=${arg#*=} ;;
    --build_dir=*) build_dir=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --python=*) python=${arg#*=} ;;
    --steps=*) steps_arg=${arg#*=} ;;
    --budget_s=*) budget_s=${arg#*=} ;;
    --no_build) no_build=1 ;;
    --dry_run) dry_run=1 ;;
    *) echo "gpu_run: unknown argument '$arg' (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_run: --out=DIR is required" >&2; exit 2; }
[[ "$budget_s" =~ ^[1-9][0-9]*$ ]] || {
  echo "gpu_run: --budget_s must be a positive number of seconds, got '$budget_s'" >&2
  exit 2; }
deadline=$((SECONDS + budget_s))  # bash's SECONDS: seconds since the start
IFS=, read -r -a steps <<<"$steps_arg"
for s in "${steps[@]}"; do
  [[ " ${all_steps[*]} " == *" $s "* ]] || {
    echo "gpu_run: unknown step '$s' (steps: ${all_steps[*]})" >&2; exit 2; }
done
mkdir -p "$out" "$build_dir"
out=$(cd "$out" && pwd)
build_dir=$(cd "$build_dir" && pwd)
logs=$build_dir/logs
rm -rf "$logs"
mkdir -p "$logs"
results=$logs/results.tsv  # step, result, why, seconds, figures (k=v;k=v)
: >"$results"
facts=$logs/facts.tsv      # key, value: the machine
: >"$facts"

note() { echo "== $*"; }
fact() { printf '%s\t%s\n' "$1" "$2" >>"$facts"; }
record() {  # STEP RESULT WHY SECONDS [FIGURES]
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >>"$results"
  printf '%-16s %-8s %s\n' "$1" "$2" "$3"
}
wanted() { [[ " ${steps[*]} " == *" $1 "* ]]; }
# starting STEP: whether to run STEP now: it was asked for and the budget
# has time left (else it is recorded skipped, out of time). Announces it.
starting() {
  wanted "$1" || return 1
  if [ "$dry_run" -eq 0 ] && [ "$SECONDS" -ge "$deadline" ]; then
    record "$1" skipped "out of time: the --budget_s=$budget_s s were spent before this step" 0
    return 1
  fi
  note "$1"
}

finish() {
  tar -czf "$out/logs.tar.gz" -C "$build_dir" logs 2>/dev/null
  /usr/bin/env python3 - "$results" "$facts" "$out" "$dry_run" "${steps[@]}" <<'EOF'
import json, sys, datetime
results_path, facts_path, out, dry_run, asked = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5:]
facts = dict(line.rstrip("\n").split("\t", 1) for line in open(facts_path) if "\t" in line)
done = {}
for line in open(results_path):
    name, result, why, seconds, figures = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    done[name] = {"step": name, "result": result, "why": why,
                  "seconds": float(seconds or 0),
                  "figures": dict(f.split("=", 1) for f in figures.split(";") if "=" in f)}
steps = [done.get(s, {"step": s, "result": "missing", "why": "the run ended before this step", "seconds": 0, "figures": {}}) for s in asked]
good = "planned" if dry_run else "passed"
ok = all(s["result"] == good for s in steps) and all(
    v["result"] == good for k, v in done.items() if k not in asked)
summary = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "dry_run": dry_run, "machine": facts, "ok": ok,
           "steps": steps + [v for k, v in done.items() if k not in asked]}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
with open(f"{out}/summary.txt", "w") as f:
    f.write(f"gradsync gpu_run at {summary['date']}{' (dry run)' if dry_run else ''}: "
            f"{'OK' if ok else 'NOT OK'}\n")
    for k, v in facts.items():
        f.write(f"  {k}: {v}\n")
    for s in summary["steps"]:
        figures = " ".join(f"{k}={v}" for k, v in s["figures"].items())
        f.write(f"{s['step']:16} {s['result']:8} {s['seconds']:6.0f}s  {s['why']} {figures}\n")
sys.exit(0 if ok else 1)
EOF
  status=$?
  cat "$out/summary.txt"
  exit "$status"
}

# Binaries, as the CMake build lays them out (bazel-bin's layout).
coordinator=$build_dir/server/gradsync-coordinator
worker=$build_dir/worker/gradsync-worker
launcher=$build_dir/cli/gradsync
nccl_test=$build_dir/tests/worker/backend/nccl_backend_test
cuda_test=$build_dir/tests/worker/backend/cuda_nccl_device_test

# need PATH...: each must exist: a file of the tree, or a binary the CMake
# build makes (dry run: a rule of that name in its folder's CMakeLists.txt).
# Prints what is missing; false when anything is.
need() {
  local missing=0 path rel pkg name
  for path in "$@"; do
    if [[ "$path" == "$build_dir"/* ]]; then
      rel=${path#"$build_dir"/}
      pkg=$(dirname "$rel") name=$(basename "$rel")
      if [ "$dry_run" -eq 1 ]; then
        grep -Eq "NAME $name\$" "$repo/$pkg/CMakeLists.txt" 2>/dev/null && continue
        echo "   no CMake rule builds $rel ($pkg/CMakeLists.txt)"
      else
        [ -x "$path" ] && continue
        echo "   $rel was not built (see build.log)"
      fi
    else
      [ -e "$repo/$path" ] && continue
      echo "   $path is not in this checkout"
    fi
    missing=1
  done
  return "$missing"
}

# gtest_cases RESULT LOG: the names of LOG's test cases that ended with
# RESULT (OK, FAILED, SKIPPED), one a line: the lines that end a case
# ("[  SKIPPED ] Suite.Name (0 ms)"), not gtest's closing lists.
gtest_cases() {
  grep -E "^\[ *$1 *\] [^ ]+.* \([0-9]+ ms\)\$" "$2" 2>/dev/null |
    sed -E 's/^\[ *[A-Z]+ *\] ([^ ]+).*/\1/'
}

# run_step STEP TIMEOUT_S COMMAND...: runs it with its output in
# logs/STEP.log (dry run: prints it), for at most TIMEOUT_S or what is left
# of the budget; sets $step_status (the command's exit status, which
# $step_exit keeps), $step_seconds, $step_limit (the timeout it ran under)
# and $step_capped (1: the budget's end cut it), and clears $step_problem.
run_step() {
  local step=$1 limit=$2
  shift 2
  echo "   \$ $*" >>"$logs/commands.txt"
  step_seconds=0 step_problem= step_limit=$limit step_capped=0 step_exit=0
  if [ "$dry_run" -eq 1 ]; then
    echo "   $step: $*"
    bash -n <(printf '%q ' "$@") 2>/dev/null || { step_status=2; return; }
    step_status=0
    return
  fi
  local start=$SECONDS left=$((deadline - SECONDS))
  if [ "$left" -lt "$limit" ]; then step_limit=$((left > 0 ? left : 0)) step_capped=1; fi
  [ "$step_limit" -ge 1 ] || { step_status=124 step_exit=124; return; }
  # -k: a command that ignores SIGTERM is killed 5 s later.
  timeout -k 5 "$step_limit" "$@" >"$logs/$step.log" 2>&1
  step_status=$?
  step_exit=$step_status
  step_seconds=$((SECONDS - start))
  tail -n 5 "$logs/$step.log" | sed 's/^/   | /'
}
# fail_step WHY: the step's output lacks what it must show (its result
# line, ...): it fails, for WHY (as well as for its exit status).
fail_step() {
  [ "$dry_run" -eq 1 ] && return
  step_problem=$1
  [ "$step_status" -ne 0 ] || step_status=3
}
# conclude STEP WHY [FIGURES]: records passed/failed from $step_status.
conclude() {
  local result=passed why=$2
  local figures=${3:-}
  if [ "$dry_run" -eq 1 ]; then
    result=planned figures=
    [ "$step_status" -eq 0 ] || { result=failed why="command line not well formed"; }
  elif [ "$step_status" -ne 0 ]; then
    result=failed
    local how=
    if [ "$step_exit" -eq 124 ]; then
      how="timed out after $step_limit s"
      [ "$step_capped" -eq 1 ] && how="$how, at the end of --budget_s=$budget_s"
    elif [ "$step_exit" -ne 0 ]; then
      how="exit $step_exit"
    fi
    [ -n "$step_problem" ] && how="${how:+$how, }$step_problem"
    why="$how; $why"
  fi
  record "$1" "$result" "$why" "$step_seconds" "$figures"
}

# A gradsync-coordinator on a free loopback port: sets $coordinator_address
# (empty when it did not start) and $coordinator_pid.
start_coordinator() {
  local port_file=$build_dir/coordinator.port
  rm -f "$port_file"
  coordinator_address= coordinator_pid=
  [ "$dry_run" -eq 1 ] && { coordinator_address=127.0.0.1:29400; return; }
  "$coordinator" --listen=127.0.0.1:0 --port_file="$port_file" \
    >>"$logs/coordinator.log" 2>&1 &
  coordinator_pid=$!
  for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
  [ -s "$port_file" ] && coordinator_address="127.0.0.1:$(cat "$port_file")"
}
stop_coordinator() {
  [ -n "${coordinator_pid:-}" ] || return 0
  kill "$coordinator_pid" 2>/dev/null
  wait "$coordinator_pid" 2>/dev/null
  coordinator_pid=
}

# ---- The machine, and whether PyTorch's LibTorch can be linked.
torch_abi=unknown with_torch=ON
fact budget_s "$budget_s"
if [ "$dry_run" -eq 0 ]; then
  note "machine"
  fact gpu "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1)"
  fact cxx "$(c++ --version 2>&1 | head -n 1)"
  fact cmake "$(cmake --version 2>&1 | head -n 1)"
  fact torch "$("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  torch_abi=$("$python" -c 'import torch; print("cxx11" if torch.compiled_with_cxx11_abi() else "pre-cxx11")' 2>/dev/null || echo none)
  fact torch_abi "$torch_abi"
  [ "$no_build" -eq 1 ] && fact build "not run (--no_build): the binaries already in $build_dir"
  cat "$facts"
  for tool in cmake ninja c++; do
    [ "$no_build" -eq 1 ] && break
    command -v "$tool" >/dev/null || { record build failed "$tool not found" 0; finish; }
  done
fi
case "$torch_abi" in
  pre-cxx11) with_torch=OFF
    fact libtorch "left out: PyTorch is built with the pre-C++11 ABI, which does not link with Debian's gRPC" ;;
  none) with_torch=OFF; fact libtorch "left out: $python cannot import torch" ;;
esac
torch_missing="LibTorch is left out of this build ($(grep '^libtorch' "$facts" | cut -f2))"

# ---- Build the targets the steps need: those without LibTorch first, then
# (step build_torch) those with it, so that a LibTorch this code does not
# compile against fails only the steps that need it.
targets=(server_gradsync-coordinator cli_gradsync
         tests_worker_backend_nccl_backend_test
         tests_worker_backend_cuda_nccl_device_test)
torch_targets=()
[ "$with_torch" = ON ] && torch_targets=(worker_gradsync-worker)
# Whether CMake target T is defined: cmake/gradsync.cmake names a target
# FOLDER_NAME (the folder's path with _ for /), so some split of T must be a
# folder whose CMakeLists.txt has that NAME. Checked before any build, in
# dry runs too: a target that moved must not be found only on the GPU
# machine.
cmake_target_defined() {
  local parts i dir name
  IFS=_ read -ra parts <<<"$1"
  for ((i = 1; i < ${#parts[@]}; i++)); do
    dir=$(IFS=/; echo "${parts[*]:0:i}")
    name=$(IFS=_; echo "${parts[*]:i}")
    grep -qE "^[[:space:]]*NAME ${name}[[:space:]]*$" "$dir/CMakeLists.txt" \
      2>/dev/null && return 0
  done
  return 1
}
if [ "$no_build" -eq 0 ]; then
  for target in "${targets[@]}" "${torch_targets[@]}"; do
    cmake_target_defined "$target" ||
      { record build failed "no CMake target $target (named FOLDER_NAME)" 0; finish; }
  done
fi
cmake_args=(-DGRADSYNC_WITH_NCCL=ON -DCMAKE_BUILD_TYPE=Release
            -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DGRADSYNC_WITH_TORCH="$with_torch")
prefix_path=() build_ld_path=
if [ "$with_torch" = ON ] && [ "$dry_run" -eq 0 ]; then
  prefix_path+=("$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')")
  # The Python the extension (step python_elastic) is built for.
  cmake_args+=(-DPython3_EXECUTABLE="$(command -v "$python")")
fi
# The NCCL torch loads (the nvidia-nccl wheel): one libnccl.so.2 per process.
nccl_root=$("$python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
[ -n "$nccl_root" ] && [ -f "$nccl_root/include/nccl.h" ] && cmake_args+=(-DNCCL_ROOT="$nccl_root")
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -d "$cuda_home" ] || cuda_home=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")
cmake_args+=(-DCUDA_HOME="$cuda_home")
[ -x "$cuda_home/bin/nvcc" ] && cmake_args+=(-DCMAKE_CUDA_COMPILER="$cuda_home/bin/nvcc")
if [ -n "$deps" ] && [ "$dry_run" -eq 0 ]; then
  deps=$(cd "$deps" && pwd)
  root=$deps
  if [ ! -d "$deps/usr" ]; then
    root=$build_dir/deps-root
    stamp=$(cd "$deps" && ls -l --time-style=+%s -- *.deb 2>/dev/null | md5sum)
    if [ ! -f "$root/.unpacked" ] || [ "$(cat "$root/.unpacked")" != "$stamp" ]; then
      rm -rf "$root" && mkdir -p "$root"
      for deb in "$deps"/*.deb; do
        dpkg-deb -x "$deb" "$root" 2>>"$logs/unpack.log" ||
          (tmp=$(mktemp -d) && cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$root") ||
          { record build failed "cannot unpack $deb" 0; finish; }
      done
      # A link to an absolute path (zlib1g-dev's libz.so -> /lib/...) points
      # out of the tree, to the machine's own file or to nothing (then the
      # linker takes the static libz.a, which the Python extension, a shared
      # object, cannot link): each is pointed into the tree.
      find "$root" -type l -lname '/*' -print0 |
        while IFS= read -r -d '' link; do
          ln -sfn "$root$(readlink "$link")" "$link"
        done
      echo "$stamp" >"$root/.unpacked"
    fi
  fi
  prefix_path=("$root/usr" "${prefix_path[@]}")
  # etcd's .proto files (the coordinator's etcd client), from the Go packages.
  cmake_args+=(-DGRADSYNC_GOCODE_DIR="$root/usr/share/gocode/src")
  build_ld_path="$root/usr/lib/x86_64-linux-gnu:$root/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The packs' programs (protoc, the gRPC plugins for C++ and, in the
  # package's setup.py, Python) through wrappers that give them alone the
  # packs' libraries: Python with torch, which the steps also start, must
  # keep the machine's own.
  wrappers=$build_dir/deps-bin
  rm -rf "$wrappers" && mkdir -p "$wrappers"
  for program in "$root"/usr/bin/*; do
    [ -f "$program" ] && [ -x "$program" ] || continue
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$build_ld_path" \
      "$program" >"$wrappers/${program##*/}"
    chmod +x "$wrappers/${program##*/}"
  done
  export PATH="$wrappers:$PATH"
  # RPATH (not RUNPATH), in the programs and the Python extension module: it
  # also serves the libraries' own dependencies (libgrpc's libupb).
  cmake_args+=(-DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags
              -DCMAKE_MODULE_LINKER_FLAGS=-Wl,--disable-new-dtags)
fi
[ ${#prefix_path[@]} -gt 0 ] && cmake_args+=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${prefix_path[*]}")")
if [ "$no_build" -eq 0 ]; then
  note "build: ${targets[*]}"
  need deploy/cmake_build.sh || { record build failed "deploy/cmake_build.sh is missing" 0; finish; }
  run_step build 420 env LD_LIBRARY_PATH="${build_ld_path:-${LD_LIBRARY_PATH:-}}" \
    deploy/cmake_build.sh --build_dir="$build_dir" --jobs="$jobs" \
    --targets="$(IFS=,; echo "${targets[*]}")" "${cmake_args[@]}"
  conclude build "targets: ${targets[*]}; LibTorch $with_torch"
  [ "$step_status" -eq 0 ] || finish
  if [ "${#torch_targets[@]}" -gt 0 ]; then
    run_step build_torch 300 env LD_LIBRARY_PATH="${build_ld_path:-${LD_LIBRARY_PATH:-}}" \
      deploy/cmake_build.sh --build_dir="$build_dir" --jobs="$jobs" \
      --targets="$(IFS=,; echo "${torch_targets[*]}")" "${cmake_args[@]}"
    conclude build_torch "targets: ${torch_targets[*]}"
    if [ "$step_status" -ne 0 ]; then
      with_torch=OFF
      torch_missing="the LibTorch targets did not build (step build_torch; build_torch.log in logs.tar.gz)"
    fi
  fi
fi

# ---- nccl_tests
if starting nccl_tests; then
  if need "$nccl_test" "$cuda_test"; then
    # Left out of the real layer's run: abort_recreate, the next step, and
    # the case that checks opening a GPU fails where there is none, which
    # skips wherever there is one. Any other skip fails the step.
    run_step nccl_tests 240 bash -c '"$1" && "$2" --gtest_filter="$3"' _ \
      "$nccl_test" "$cuda_test" \
      '-*AbortAndRecreateTwentyTimes*:*OpeningAGpuWithoutOneIsFailedPrecondition*'
    log=$logs/nccl_tests.log
    skipped_cases=$(gtest_cases SKIPPED "$log" | paste -sd' ')
    figures="passed=$(gtest_cases OK "$log" | wc -l);failed=$(gtest_cases FAILED "$log" | wc -l);skipped=$(gtest_cases SKIPPED "$log" | wc -l)"
    [ -n "$skipped_cases" ] && fail_step "skipped: $skipped_cases"
    conclude nccl_tests "sim multi-rank suite, then the real layer on the GPU (a skipped case fails the step)" "$figures"
  else
    record nccl_tests failed "missing binaries" 0
  fi
fi

# ---- abort_recreate
if starting abort_recreate; then
  if need "$cuda_test"; then
    run_step abort_recreate 120 "$cuda_test" --gtest_filter=*AbortAndRecreateTwentyTimes*
    line=$(grep -o 'abort_recreate: .*' "$logs/abort_recreate.log" 2>/dev/null | tail -n 1)
    [ -n "$line" ] || fail_step "no 'abort_recreate:' result line (skipped: no GPU?)"
    conclude abort_recreate "${line:-20 abort + re-create cycles}" \
      "$(sed -n 's/.* in \([0-9]*\) ms, GPU memory in use before \([0-9]*\) MiB, after \([0-9]*\) MiB/ms=\1;mib_before=\2;mib_after=\3/p' <<<"$line")"
  else
    record abort_recreate failed "missing binaries" 0
  fi
fi

# ---- worker_fault
if starting worker_fault; then
  if [ "$with_torch" = OFF ]; then
    record worker_fault skipped "$torch_missing" 0
  elif need "$coordinator" "$worker"; then
    start_coordinator
    run_step worker_fault 180 "$worker" --coordinator="$coordinator_address" \
      --job=gpu-fault --nnodes=1 --device=cuda --steps=200 --timeout=20s \
      --batch_size=32 --global_batch_size=256 \
      --failpoint=nccl_async_error:60 --summary_json="$logs/worker_summary.json"
    stop_coordinator
    hit=$(grep -c 'failpoint nccl_async_error hit' "$logs/worker_fault.log" 2>/dev/null)
    [ "${hit:-0}" -gt 0 ] || fail_step "the failpoint nccl_async_error did not fire"
    ms=$("$python" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["mean_step_ms"], 2))' \
      "$logs/worker_summary.json" 2>/dev/null)
    conclude worker_fault "MLP, 200 steps of an exact global batch (8 micro-batches timed on the device), async NCCL error injected at collective 60 and healed" \
      "mean_step_ms=${ms:-};failpoint_hit=${hit:-0}"
  else
    record worker_fault failed "missing binaries" 0
  fi
fi

# ---- users_script
if starting users_script; then
  if need "$coordinator" "$launcher" deploy/gpu/ddp_resnet50.py; then
    start_coordinator
    run_step users_script 240 "$launcher" launch --coordinator="$coordinator_address" \
      --job=gpu-users-script --nproc_per_node=gpu --python="$(command -v "$python")" \
      deploy/gpu/ddp_resnet50.py --steps=12
    stop_coordinator
    line=$(grep -o 'ddp_resnet50: .*' "$logs/users_script.log" 2>/dev/null | tail -n 1)
    [ -n "$line" ] || fail_step "no 'ddp_resnet50:' result line from the script"
    conclude users_script "${line:-ResNet-50 DDP script under gradsync launch}" \
      "$(sed -n 's/.* \([0-9.]*\) ms\/step.*/ms_per_step=\1/p' <<<"$line")"
  else
    record users_script failed "missing binaries or script" 0
  fi
fi

# ---- resnet50_ratio
if starting resnet50_ratio; then
  if [ "$with_torch" = OFF ]; then
    record resnet50_ratio skipped "$torch_missing" 0
  elif need "$coordinator" "$worker" bench/ddp_bench.sh bench/torch_ddp.py; then
    run_step resnet50_ratio 240 env GRADSYNC_BIN="$build_dir" PYTHON="$(command -v "$python")" \
      bench/ddp_bench.sh --device=cuda --world_size=1 --no_build --model=resnet50 \
      --batch_size=64 --steps=30 --rounds=1
    result=$(grep -m1 '^RESULT gradsync_ms=' "$logs/resnet50_ratio.log" 2>/dev/null)
    figures=$(sed -n 's/^RESULT gradsync_ms=\([^ ]*\) torch_ms=\([^ ]*\) .* step_ratio=\([^ ]*\).*/gradsync_ms=\1;torch_ms=\2;step_ratio=\3/p' <<<"$result")
    [ -n "$figures" ] || fail_step "no 'RESULT gradsync_ms=' line from the benchmark"
    # Where gradsync's step went (forward, backward, communication, ...).
    parts=$(grep -m1 '^RESULT_PARTS ' "$logs/resnet50_ratio.log" 2>/dev/null)
    parts=${parts#RESULT_PARTS }
    [ -n "$parts" ] && figures="$figures;${parts// /;}"
    conclude resnet50_ratio "gradsync DDP step / PyTorch DDP step, ResNet-50, batch 64, 1 GPU" \
      "$figures"
  else
    record resnet50_ratio failed "missing binaries or scripts" 0
  fi
fi

# ---- python_elastic
if starting python_elastic; then
  if [ "$with_torch" = OFF ]; then
    record python_elastic skipped "$torch_missing" 0
  elif need "$coordinator" "$launcher" deploy/gpu/python_elastic.sh \
      python/tests/elastic_script.py python/tests/extension_smoke.py; then
    start_coordinator
    run_step python_elastic 240 deploy/gpu/python_elastic.sh "$build_dir" \
      "$python" "$coordinator_address"
    stop_coordinator
    # "rounds=R failpoint_hit=H steps=S seconds=T max_rel_diff=D"
    line=$(grep -o '^python_elastic: rounds=.*' "$logs/python_elastic.log" 2>/dev/null | tail -n 1)
    [ -n "$line" ] || fail_step "no 'python_elastic:' result line"
    figures=${line#python_elastic: }
    conclude python_elastic "gradsync.elastic MLP on the GPU, async NCCL error injected at collective 20, healed in place to the uninterrupted run's parameters" \
      "${figures// /;}"
  else
    record python_elastic failed "missing binaries or scripts" 0
  fi
fi
cd "$repo"
finish
