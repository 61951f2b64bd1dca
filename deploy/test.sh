#!/usr/bin/env bash
# Runs gradsync's whole test suite (installing what it needs first):
#   deploy/test.sh [extra bazel test flags]
# bazel test //..., then the CMake build of everything and its tests
# (deploy/cmake_build.sh --ctest), so that the CMake build GPU machines use
# cannot rot: every unit test, find_package_test and the process tests that
# find CMake's binaries the quickest; the multi-process scenarios that Bazel
# has just run on the same sources (CMAKE_EXCLUDE below: 63 cases, about
# half of ctest's test-seconds in a full run here) are not run twice. Then
# a configure-only CMake run without LibTorch, the GPU check's dry run
# (deploy/gpu_run.sh --dry_run), then the libFuzzer
# harnesses for a minute (tests/fuzz/run.sh). Ends with one line
# "gtest: N passed, N failed, N skipped" counted from Bazel's test cases (GPU
# tests skip on machines without a GPU), after ctest's own line.
# GRADSYNC_TEST_LEAN_DISK=1 (CI's .ci/run sets it) frees each stage's build
# outputs once the stage passed (bazel clean after Bazel's tests, the CMake
# tree's objects after ctest, the fuzzers' objects after them), so that the
# run never holds them all at once; a rerun then builds from nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh || exit 1

bazel test //... "$@" 2>&1 | tee /tmp/gradsync-test.log
status=${PIPESTATUS[0]}

# A test target's logs (NAME is test.xml or test.log): its own, or one per
# shard (bazel-testlogs/PKG/TARGET/shard_K_of_N/NAME) for a sharded test.
target_logs() {
  local dir="bazel-testlogs/${1#//}"
  dir="${dir/://}"
  if [ -f "$dir/$2" ]; then
    echo "$dir/$2"
  else
    compgen -G "$dir/shard_*_of_*/$2" || true
  fi
}

# Count test cases from the JUnit XML of each test target this run reported.
passed=0
failed=0
skipped=0
while IFS= read -r xml; do
  line=$(grep -m1 -o '<testsuites [^>]*>' "$xml" || true)
  tests=$(sed -n 's/.* tests="\([0-9]*\)".*/\1/p' <<<"$line")
  failures=$(sed -n 's/.* failures="\([0-9]*\)".*/\1/p' <<<"$line")
  errors=$(sed -n 's/.* errors="\([0-9]*\)".*/\1/p' <<<"$line")
  disabled=$(sed -n 's/.* disabled="\([0-9]*\)".*/\1/p' <<<"$line")
  tests=${tests:-0}; failures=${failures:-0}; errors=${errors:-0}; disabled=${disabled:-0}
  skipped_here=$(grep -c '<skipped' "$xml" || true)
  failed=$((failed + failures + errors))
  skipped=$((skipped + skipped_here))
  passed=$((passed + tests - failures - errors - disabled - skipped_here))
done < <(grep -oE '^//[^ ]+' /tmp/gradsync-test.log | sort -u |
         while IFS= read -r target; do target_logs "$target" test.xml; done)
[ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1  # a build or harness failure
lean=${GRADSYNC_TEST_LEAN_DISK:-0}
# Bazel's outputs go once its tests passed (a failure's logs stay for the
# summary at the end).
if [ "$lean" = 1 ] && [ "$status" -eq 0 ]; then
  bazel clean >/dev/null 2>&1 && echo "lean disk: bazel clean"
fi

# Heavy multi-process scenarios Bazel ran above, from the same sources.
CMAKE_EXCLUDE='^(recovery_process_test|hang_process_test|hostile_client_test|shutdown_process_test|shutdown_stress_test|ha_process_test|launch_process_test|checkpoint_process_test|durable_state_process_test|torch_reference_test|status_page_test|overload_process_test|limits_process_test|multiprocess_test)\.'
# The Python extension too, for Debian's Python and torch (ctest's
# python.extension_smoke loads it). At -O1, not Release's -O3: this tree
# checks the CMake mirror (targets, dependencies, links) and runs the unit
# tests again, while Bazel's tests above ran the optimized build; -O1
# compiles in about 70% of the time here (a LibTorch TU 22 s, not 30 s).
deploy/cmake_build.sh --ctest --ctest_exclude="$CMAKE_EXCLUDE" \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DGRADSYNC_WITH_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3 2>&1 |
  tee /tmp/gradsync-cmake.log
cmake_status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$cmake_status
if [ "$lean" = 1 ] && [ "$cmake_status" -eq 0 ]; then
  find build/cmake -name '*.o' -delete && echo "lean disk: CMake objects deleted"
fi

# The configuration without LibTorch (what deploy/gpu_run.sh asks for where
# PyTorch has the pre-C++11 ABI) must configure, its LibTorch users left out.
rm -rf /tmp/gradsync-cmake-notorch
cmake -S . -B /tmp/gradsync-cmake-notorch -G Ninja -DGRADSYNC_WITH_TORCH=OFF \
  >/tmp/gradsync-cmake-notorch.log 2>&1
notorch_status=$?
rm -rf /tmp/gradsync-cmake-notorch
echo "cmake without LibTorch: configure exit $notorch_status (/tmp/gradsync-cmake-notorch.log)"
[ "$notorch_status" -eq 0 ] || grep -A3 'CMake Error' /tmp/gradsync-cmake-notorch.log | head -n 20
[ "$status" -eq 0 ] && status=$notorch_status

# The GPU check's plan (deploy/gpu_run.sh --dry_run, no GPU needed): every
# step's command line well formed, every script and binary it names there.
deploy/gpu_run.sh --dry_run --out=/tmp/gradsync-gpu-plan \
  --build_dir=/tmp/gradsync-gpu-plan-build 2>&1 | tee /tmp/gradsync-gpu-plan.log
plan_status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$plan_status

# The fuzzers, for a bounded time (tests/fuzz/run.sh).
tests/fuzz/run.sh 60 2>&1 | tee /tmp/gradsync-fuzz.log
fuzz_status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] && status=$fuzz_status
if [ "$lean" = 1 ] && [ "$fuzz_status" -eq 0 ]; then
  rm -rf "${GRADSYNC_FUZZ_DIR:-/tmp/gradsync-fuzz}/obj" &&
    echo "lean disk: fuzzer objects deleted"
fi

# Name what failed last, where a log's tail still shows it, and why: of
# each failed Bazel test's own log (each shard's that failed), the gtest
# failures and the log's last lines (a CI run keeps no more).
bazel_failed=$(grep -E '^//[^ ]+ +(\(cached\) +)?(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' \
  /tmp/gradsync-test.log || true)
while IFS= read -r target; do
  while IFS= read -r log; do
    grep -aq '^\[  PASSED  \].*' "$log" && ! grep -aq '^\[  FAILED  \]' "$log" &&
      continue
    echo "== $target: $log"
    grep -a -A3 -E '^[^ ]+:[0-9]+: Failure$' "$log" | head -n 24 | cut -c1-400
    echo "-- its end:"
    tail -n 8 "$log" | cut -c1-400
  done < <(target_logs "$target" test.log)
done < <(grep -oE '^//[^ ]+' <<<"$bazel_failed")
[ -z "$bazel_failed" ] || sed 's/^/bazel: /' <<<"$bazel_failed"
grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Not Run)\)' \
  /tmp/gradsync-cmake.log | sed 's/^/ctest: /' || true
echo "gtest: ${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$status"
