#!/usr/bin/env bash
# //deploy:gpu_run_test: deploy/gpu_run.sh tells the truth about what it ran,
# checked without a GPU: stand-ins for the binaries it runs (--no_build)
# behave as on a GPU machine, and summary.json and the exit status must say
# what happened:
#  - the real layer's "no GPU" case, which skips wherever there is a GPU, is
#    left out of nccl_tests, and the step passes; any other skipped case
#    fails it, naming the case;
#  - users_script passes only with the script's "ddp_resnet50:" line;
#  - python_elastic is skipped, saying why, where torch cannot be imported;
#  - LibTorch's targets build after the rest: when they fail, only the
#    steps that need them are skipped;
#  - --budget_s cuts a hung step at the budget's end (failed, timed out) and
#    records the steps it did not reach as skipped, out of time; the call
#    fails, within the budget;
#  - a dependency pack's absolute links point into its unpacked tree, and
#    its programs find its libraries without the caller's LD_LIBRARY_PATH.
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "gpu_run_test: FAIL: $*" >&2; exit 1; }
# Debian's Python first: a version manager's shim costs most of a second a
# call (gpu_run.sh writes its summaries with the python3 on PATH).
export PATH="/usr/bin:$PATH"

build=$tmp/build
mkdir -p "$build/tests/worker/backend" "$build/cli" "$build/server" "$tmp/bin"

# A gtest binary of a GPU machine: runs the cases its --gtest_filter selects
# (gtest's syntax: POSITIVE[-NEGATIVE], ':'-separated globs), each OK, except
# that the "no GPU" case skips (there is a GPU) and so does every case named
# in $FAKE_SKIP; with $FAKE_HANG it then hangs. Appends its filter to
# $tmp/filters.
fake_gtest() {  # PATH CASE...
  local path=$1
  shift
  cat >"$path" <<EOF
#!/usr/bin/env bash
cases=($*)
filter='*'
for a; do case \$a in --gtest_filter=*) filter=\${a#*=} ;; esac; done
echo "\$filter" >>"$tmp/filters"
positive=\${filter%%-*} negative=
[[ \$filter == *-* ]] && negative=\${filter#*-}
[ -n "\$positive" ] || positive='*'
matches() {  # NAME GLOBS
  local glob globs
  IFS=: read -ra globs <<<"\$2"
  for glob in "\${globs[@]}"; do [[ \$1 == \$glob ]] && return 0; done
  return 1
}
for c in "\${cases[@]}"; do
  matches "\$c" "\$positive" || continue
  [ -n "\$negative" ] && matches "\$c" "\$negative" && continue
  echo "[ RUN      ] \$c"
  if [[ \$c == *OpeningAGpuWithoutOne* || " \${FAKE_SKIP:-} " == *" \$c "* ]]; then
    echo "[  SKIPPED ] \$c (0 ms)"
  else
    echo "[       OK ] \$c (1 ms)"
  fi
done
[ -z "\${FAKE_HANG:-}" ] || exec sleep 60
EOF
  chmod +x "$path"
}
fake_gtest "$build/tests/worker/backend/nccl_backend_test" \
  Sim/NcclSimCollectivesTest.EveryCollectiveMatchesItsClosedForm/world1_count0
fake_gtest "$build/tests/worker/backend/cuda_nccl_device_test" \
  NcclBackendTest.OpeningAGpuWithoutOneIsFailedPrecondition \
  NcclBackendTest.ManyCollectivesBackToBackCompleteInOrder \
  NcclBackendTest.AbortAndRecreateTwentyTimesKeepsGpuMemory
# A coordinator that writes its port and waits to be stopped.
cat >"$build/server/gradsync-coordinator" <<'EOF'
#!/usr/bin/env bash
for a; do case $a in --port_file=*) echo 29999 >"${a#*=}" ;; esac; done
exec sleep 60
EOF
# The launcher, as if the users' script ran: its result line unless
# $FAKE_NO_RESULT.
cat >"$build/cli/gradsync" <<'EOF'
#!/usr/bin/env bash
echo "launch: 1 process on 1 GPU"
[ -n "${FAKE_NO_RESULT:-}" ] ||
  echo "[local0]: ddp_resnet50: 12 steps, loss 6.9077, 80.5 ms/step (model resnet50)"
EOF
# A Python without torch: LibTorch is left out, the steps here need none.
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/python"
chmod +x "$build/server/gradsync-coordinator" "$build/cli/gradsync" "$tmp/bin/python"

# gpu_run NAME ARGS...: runs gpu_run.sh on the stand-ins into $tmp/NAME;
# sets $status.
gpu_run() {
  local name=$1
  shift
  status=0
  bash deploy/gpu_run.sh --out="$tmp/$name" --build_dir="$build" --no_build \
    --python="$tmp/bin/python" "$@" >"$tmp/$name.log" 2>&1 || status=$?
}
# expect NAME PYTHON_EXPR WHAT: PYTHON_EXPR holds over summary.json, read
# as `s`, with `steps` its steps by name.
expect() {
  python3 - "$tmp/$1/summary.json" "$2" <<'EOF' ||
import json, sys
s = json.load(open(sys.argv[1]))
steps = {step["step"]: step for step in s["steps"]}
sys.exit(0 if eval(sys.argv[2]) else 1)
EOF
    fail "$1: $3; summary:
$(cat "$tmp/$1/summary.txt" 2>/dev/null)
log:
$(cat "$tmp/$1.log")"
}

# 1. A GPU machine where everything passes.
: >"$tmp/filters"
gpu_run gpu --steps=nccl_tests,users_script
expect gpu 'steps["nccl_tests"]["result"] == "passed"' \
  "nccl_tests must pass where only the no-GPU case skips"
expect gpu 'steps["nccl_tests"]["figures"] == {"passed": "2", "failed": "0", "skipped": "0"}' \
  "nccl_tests' figures count the cases run"
expect gpu 'steps["users_script"]["result"] == "passed" and steps["users_script"]["figures"] == {"ms_per_step": "80.5"}' \
  "users_script passes with its result line"
expect gpu 's["ok"] and s["machine"]["budget_s"] == "450"' "the call is OK"
[ "$status" -eq 0 ] || fail "gpu: exit $status, expected 0: $(cat "$tmp/gpu.log")"
grep -qxF -- '-*AbortAndRecreateTwentyTimes*:*OpeningAGpuWithoutOneIsFailedPrecondition*' \
  "$tmp/filters" || fail "the real layer's filter: $(cat "$tmp/filters")"

# 2. Any other skipped case fails nccl_tests, naming it.
FAKE_SKIP=NcclBackendTest.ManyCollectivesBackToBackCompleteInOrder \
  gpu_run other_skip --steps=nccl_tests
expect other_skip 'steps["nccl_tests"]["result"] == "failed" and steps["nccl_tests"]["why"].startswith("skipped: NcclBackendTest.ManyCollectivesBackToBackCompleteInOrder;")' \
  "a skipped case other than the no-GPU one fails nccl_tests"
expect other_skip 'steps["nccl_tests"]["figures"]["skipped"] == "1" and not s["ok"]' \
  "the skip is counted and the call is not OK"
[ "$status" -eq 1 ] || fail "other_skip: exit $status, expected 1"

# 3. The users' script without its result line fails its step.
FAKE_NO_RESULT=1 gpu_run no_result --steps=users_script
expect no_result 'steps["users_script"]["result"] == "failed" and steps["users_script"]["why"].startswith("no '"'"'ddp_resnet50:'"'"' result line")' \
  "users_script fails without its result line"
[ "$status" -eq 1 ] || fail "no_result: exit $status, expected 1"

# 4. A hung step is cut at the budget's end; the step after it is skipped.
start=$SECONDS
FAKE_HANG=1 gpu_run budget --steps=nccl_tests,users_script --budget_s=2
took=$((SECONDS - start))
expect budget 'steps["nccl_tests"]["result"] == "failed" and "at the end of --budget_s=2" in steps["nccl_tests"]["why"]' \
  "the hung step times out at the budget's end"
expect budget 'steps["users_script"]["result"] == "skipped" and steps["users_script"]["why"].startswith("out of time")' \
  "the step the budget did not reach is skipped, out of time"
[ "$status" -eq 1 ] || fail "budget: exit $status, expected 1"
[ "$took" -le 12 ] || fail "budget: the call took ${took} s on a 2 s budget"

# 5. Without a Python that imports torch, python_elastic is skipped, saying
# why, and the call fails: a skipped step is not a pass.
gpu_run no_torch --steps=python_elastic
expect no_torch 'steps["python_elastic"]["result"] == "skipped" and "cannot import torch" in steps["python_elastic"]["why"] and not s["ok"]' \
  "python_elastic is skipped without torch, and the call is not OK"
[ "$status" -eq 1 ] || fail "no_torch: exit $status, expected 1"

# 6. The build: LibTorch's targets build in their own step after the rest;
# when they fail (a PyTorch this code does not compile against), the steps
# that need them are skipped, saying so, and the others still run. A copy
# of gpu_run.sh in a tree of its own, with a stand-in for
# deploy/cmake_build.sh that fails on gradsync-worker, and a Python whose
# torch has the C++11 ABI.
repo=$tmp/repo
mkdir -p "$repo/deploy" "$repo/server" "$repo/cli" "$repo/worker" \
  "$repo/tests/worker/backend"
cp deploy/gpu_run.sh "$repo/deploy/"
echo 'NAME gradsync-coordinator' >"$repo/server/CMakeLists.txt"
echo 'NAME gradsync' >"$repo/cli/CMakeLists.txt"
echo 'NAME gradsync-worker' >"$repo/worker/CMakeLists.txt"
printf 'NAME nccl_backend_test\nNAME cuda_nccl_device_test\n' \
  >"$repo/tests/worker/backend/CMakeLists.txt"
cat >"$repo/deploy/cmake_build.sh" <<'EOF2'
#!/usr/bin/env bash
for a; do
  case $a in --targets=*worker_gradsync-worker*)
    echo "worker/ddp/reducer.cc: error: no member named 'x' (stand-in)"; exit 1 ;;
  esac
done
echo "built: $*"
EOF2
cat >"$tmp/bin/torch_python" <<'EOF2'
#!/usr/bin/env bash
case "$2" in
  *compiled_with_cxx11_abi*) echo cxx11 ;;
  *cmake_prefix_path*) echo /nonexistent/torch/share/cmake ;;
  *torch.__version__*) echo "2.11.0 cuda 13.0" ;;
  *) exit 1 ;;
esac
EOF2
chmod +x "$repo/deploy/cmake_build.sh" "$tmp/bin/torch_python"
status=0
bash "$repo/deploy/gpu_run.sh" --out="$tmp/build_split" --build_dir="$build" \
  --python="$tmp/bin/torch_python" --steps=nccl_tests,worker_fault \
  >"$tmp/build_split.log" 2>&1 || status=$?
expect build_split 'steps["build"]["result"] == "passed" and steps["build_torch"]["result"] == "failed"' \
  "the LibTorch targets fail in their own step, after the rest built"
expect build_split 'steps["nccl_tests"]["result"] == "passed"' \
  "the steps without LibTorch still run"
expect build_split 'steps["worker_fault"]["result"] == "skipped" and "did not build" in steps["worker_fault"]["why"] and not s["ok"]' \
  "worker_fault is skipped because LibTorch's targets did not build"
[ "$status" -eq 1 ] || fail "build_split: exit $status, expected 1"

# 7. A dependency pack (--deps: .deb files): unpacked into the build tree; a
# link in it to an absolute path (zlib1g-dev's libz.so -> /lib/...) points
# into the tree; the packs' programs run through wrappers that give them the
# packs' libraries, with no LD_LIBRARY_PATH of the caller's (Python with
# torch runs them from setup.py); the build links RPATH into the Python
# module too and finds etcd's .proto files in the pack.
pack=$tmp/pack
mkdir -p "$pack/deb/DEBIAN" "$pack/deb/usr/bin" "$pack/deb/lib/x86_64-linux-gnu" \
  "$pack/deb/usr/lib/x86_64-linux-gnu" "$pack/debs"
printf 'Package: fake\nVersion: 1\nArchitecture: all\nMaintainer: t\nDescription: t\n' \
  >"$pack/deb/DEBIAN/control"
printf '#!/bin/sh\necho "ld=$LD_LIBRARY_PATH"\n' >"$pack/deb/usr/bin/fake-protoc"
chmod +x "$pack/deb/usr/bin/fake-protoc"
echo lib >"$pack/deb/lib/x86_64-linux-gnu/libfake.so.1"
ln -s /lib/x86_64-linux-gnu/libfake.so.1 "$pack/deb/usr/lib/x86_64-linux-gnu/libfake.so"
dpkg-deb -b "$pack/deb" "$pack/debs/fake_1_all.deb" >/dev/null
cat >"$repo/deploy/cmake_build.sh" <<EOF2
#!/usr/bin/env bash
echo "\$*" >>"$tmp/cmake_args"
env -u LD_LIBRARY_PATH fake-protoc >"$tmp/fake_protoc.out"
EOF2
status=0
env -u LD_LIBRARY_PATH bash "$repo/deploy/gpu_run.sh" --out="$tmp/pack_run" --build_dir="$build" \
  --deps="$pack/debs" --python="$tmp/bin/torch_python" --steps=nccl_tests \
  >"$tmp/pack_run.log" 2>&1 || status=$?
expect pack_run 's["ok"]' "the call with a dependency pack is OK"
link=$build/deps-root/usr/lib/x86_64-linux-gnu/libfake.so
[ "$(readlink "$link")" = "$build/deps-root/lib/x86_64-linux-gnu/libfake.so.1" ] &&
  [ -f "$link" ] || fail "the pack's absolute link was not pointed into the tree: $(ls -l "$link")"
grep -qx "ld=$build/deps-root/usr/lib/x86_64-linux-gnu:$build/deps-root/usr/lib" \
  "$tmp/fake_protoc.out" ||
  fail "the pack's program did not get the pack's libraries: $(cat "$tmp/fake_protoc.out")"
grep -q -- "-DCMAKE_MODULE_LINKER_FLAGS=-Wl,--disable-new-dtags" "$tmp/cmake_args" &&
  grep -q -- "-DGRADSYNC_GOCODE_DIR=$build/deps-root/usr/share/gocode/src" \
    "$tmp/cmake_args" || fail "the build's CMake arguments: $(cat "$tmp/cmake_args")"

echo "gpu_run_test: OK (the budgeted call took ${took} s)"
