#!/usr/bin/env bash
# Builds the coordinator's libFuzzer harnesses with Debian's clang (address
# and undefined-behaviour sanitizers) and runs each for a bounded time from
# its seed corpus in tests/fuzz/corpus/, as deploy/test.sh does:
#   tests/fuzz/run.sh [SECONDS_PER_FUZZER]   (default 60)
# A crash fails the run; libFuzzer writes the input that caused it to
# $GRADSYNC_FUZZ_DIR (default /tmp/gradsync-fuzz). Fix the bug, then add
# that input to the corpus. New inputs the fuzzer finds stay out of the
# repository (they go to the work directory).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
work=${GRADSYNC_FUZZ_DIR:-/tmp/gradsync-fuzz}
cxx=${CXX_FUZZ:-clang++-14}
mkdir -p "$work/gen" "$work/obj" "$work/new"
# Objects are reused while no source or header changed since they were built.
if [ -n "$(find common server proto tests/fuzz -newer "$work/obj/.stamp" \
             -print -quit 2>/dev/null || echo missing)" ]; then
  rm -f "$work"/obj/*.o
fi

# The protos, as the Bazel build generates them.
protoc -I. --cpp_out="$work/gen" proto/gradsync/v1/*.proto

sources=(
  common/clock.cc common/failpoint.cc common/job_config.cc common/logging.cc
  server/health_manager.cc server/job_manager.cc server/kv_manager.cc
  server/rendezvous_manager.cc server/storage/in_memory_storage.cc
  tests/fuzz/managers_fuzzer.cc
)
for proto in proto/gradsync/v1/*.proto; do
  sources+=("$work/gen/${proto%.proto}.pb.cc")
done
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -I. -I"$work/gen")
objects=()
build() {  # compiles $1 into an object unless it is there already
  local obj="$work/obj/$(echo "$1" | tr '/' '_').o"
  [ -f "$obj" ] || "$cxx" "${flags[@]}" -c "$1" -o "$obj"
  echo "$obj"
}
pids=()
for src in "${sources[@]}"; do
  build "$src" >/dev/null &
  pids+=($!)
  # Two compilers at a time: this machine has two cores.
  if [ "${#pids[@]}" -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for pid in "${pids[@]}"; do wait "$pid"; done
for src in "${sources[@]}"; do objects+=("$(build "$src")"); done
touch "$work/obj/.stamp"

absl_libs=$(sed -n 's/^ *"-l\(absl_[a-z0-9_]*\)",$/-l\1/p' third_party/system/BUILD | tr '\n' ' ')
"$cxx" -fsanitize=fuzzer,address,undefined "${objects[@]}" -o "$work/managers_fuzzer" \
  -lprotobuf $absl_libs -lpthread

echo "fuzz: managers_fuzzer for ${seconds}s"
mkdir -p "$work/new/managers"
"$work/managers_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$work/" -print_final_stats=1 \
  "$work/new/managers" tests/fuzz/corpus/managers 2>&1 | tail -n 12
echo "fuzz: no crash"
