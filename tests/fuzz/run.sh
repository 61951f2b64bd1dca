#!/usr/bin/env bash
# Builds the coordinator's libFuzzer harnesses (tests/fuzz/*_fuzzer.cc) with
# Debian's clang (address and undefined-behaviour sanitizers) and runs each
# from its seed corpus in tests/fuzz/corpus/<harness>/ for its share of a
# bounded time, as deploy/test.sh does:
#   tests/fuzz/run.sh [SECONDS]   (default 60, shared by all the harnesses)
# A crash fails the run; libFuzzer writes the input that caused it to
# $GRADSYNC_FUZZ_DIR (default /tmp/gradsync-fuzz). Fix the bug, then add
# that input to the corpus. New inputs the fuzzers find stay out of the
# repository (they go to the work directory).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
work=${GRADSYNC_FUZZ_DIR:-/tmp/gradsync-fuzz}
cxx=${CXX_FUZZ:-clang++-14}

# Each harness with its weight in the time: the managers' state space is the
# largest (managers_fuzzer.cc, authenticator_fuzzer.cc, http_routes_fuzzer.cc).
harnesses=(managers:2 authenticator:1 http_routes:1)

# What the harnesses link, from the coordinator's sources: an archive, so each
# takes only the objects it needs.
library=(
  common/clock.cc common/failpoint.cc common/grpc_status.cc
  common/job_config.cc common/logging.cc common/self_set_timeout.cc
  common/token_file.cc
  server/authenticator.cc server/cancellable_reactor.cc
  server/completion_batcher.cc
  server/completion_queues.cc server/connection_limits.cc server/coordinator.cc
  server/group_commit.cc server/hang_stack_request.cc server/share_balancer.cc
  server/health_detection.cc server/health_detectors.cc
  server/health_manager.cc server/health_replicas.cc server/health_transitions.cc
  server/health_views.cc
  server/health_wire.cc server/heartbeat_pacer.cc server/heartbeat_policer.cc
  server/heartbeat_shedder.cc
  server/job_manager.cc server/queue_delays.cc
  server/job_records.cc
  server/jobs_service.cc server/kv_manager.cc server/kv_records.cc server/kv_service.cc
  server/kv_writes.cc
  server/join_request.cc server/local_placement.cc server/malformed_request.cc
  server/http/prometheus_metrics.cc server/http/http_server.cc
  server/health_service.cc
  server/http/prometheus_text.cc server/pending_joins.cc server/rendezvous_close.cc
  server/rendezvous_manager.cc
  server/rendezvous_phase.cc server/rendezvous_reform.cc server/rendezvous_restore.cc
  server/rendezvous_views.cc
  server/round_lifecycle.cc server/round_placement.cc
  server/rendezvous_service.cc server/rpc_stats.cc server/http/status_page.cc
  server/tokens_service.cc
  server/storage/in_memory_storage.cc
)
# cpp-httplib's defines as third_party/system/BUILD sets them (its classes'
# layout depends on them).
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -DCPPHTTPLIB_OPENSSL_SUPPORT
       -DCPPHTTPLIB_ZLIB_SUPPORT -DCPPHTTPLIB_BROTLI_SUPPORT -I. -I"$work/gen")

mkdir -p "$work/gen" "$work/obj" "$work/new"
# Other flags, another compiler or another checkout (whose objects the
# dependency lists below cannot judge): start afresh.
fingerprint="$PWD $cxx ${flags[*]}"
if ! echo "$fingerprint" | cmp -s - "$work/obj/.flags"; then
  rm -rf "$work/obj"
  mkdir -p "$work/obj"
  echo "$fingerprint" >"$work/obj/.flags"
fi

# The protos, as the Bazel build generates them (bazel/proto.bzl); a file is
# replaced only when its text changed, so that what includes it is not
# rebuilt for nothing.
rm -rf "$work/gen.new"
mkdir -p "$work/gen.new"
protoc -I. -I/usr/include --cpp_out="$work/gen.new" --grpc_out="$work/gen.new" \
  --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin proto/gradsync/v1/*.proto
(cd "$work/gen.new" && find . -type f) | while read -r f; do
  if ! cmp -s "$work/gen.new/$f" "$work/gen/$f"; then
    mkdir -p "$(dirname "$work/gen/$f")"
    cp "$work/gen.new/$f" "$work/gen/$f"
  fi
done
for proto in proto/gradsync/v1/*.proto; do
  library+=("$work/gen/${proto%.proto}.pb.cc" "$work/gen/${proto%.proto}.grpc.pb.cc")
done

object() { echo "$work/obj/$(echo "${1#"$work"/}" | tr '/' '_').o"; }
# Whether the object of $1 is missing or older than a file it was built from
# (the dependency list the compiler wrote next to it).
stale() {
  local obj dep
  obj=$(object "$1")
  [ -f "$obj" ] && [ -f "$obj.d" ] || return 0
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
    [ "$dep" -nt "$obj" ] && return 0
  done
  return 1
}
sources=("${library[@]}")
for h in "${harnesses[@]}"; do sources+=("tests/fuzz/${h%%:*}_fuzzer.cc"); done
pids=()
for src in "${sources[@]}"; do
  stale "$src" || continue
  "$cxx" "${flags[@]}" -MMD -MF "$(object "$src").d" -c "$src" -o "$(object "$src")" &
  pids+=($!)
  # Two compilers at a time: this machine has two cores.
  if [ "${#pids[@]}" -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for pid in "${pids[@]}"; do wait "$pid"; done

objects=()
for src in "${library[@]}"; do objects+=("$(object "$src")"); done
rm -f "$work/libgradsync_fuzz.a"
ar rcs "$work/libgradsync_fuzz.a" "${objects[@]}"

# The -l flags of third_party/system's cc_library $1.
libs() {
  awk -v name="\"$1\"," '$1 == "name" && $3 == name {found = 1}
                         found && /^\)/ {exit} found' third_party/system/BUILD |
    grep -o '"-l[^"]*"' | tr -d '"' | tr '\n' ' '
}
# shellcheck disable=SC2046  # the flags are words
link_libs=($(libs grpc) $(libs httplib) $(libs prometheus_cpp) $(libs crypto) $(libs protobuf) $(libs absl))

total_weight=0
for h in "${harnesses[@]}"; do total_weight=$((total_weight + ${h##*:})); done
for h in "${harnesses[@]}"; do
  name=${h%%:*}
  share=$((seconds * ${h##*:} / total_weight))
  [ "$share" -ge 1 ] || share=1
  "$cxx" -fsanitize=fuzzer,address,undefined "$(object "tests/fuzz/${name}_fuzzer.cc")" \
    "$work/libgradsync_fuzz.a" "${link_libs[@]}" -o "$work/${name}_fuzzer"
  dict=()
  [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
  echo "fuzz: ${name}_fuzzer for ${share}s"
  mkdir -p "$work/new/$name"
  # The whole log stays in the work directory; a crash prints what it found.
  if ! "$work/${name}_fuzzer" -max_total_time="$share" -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix="$work/${name}-" -print_final_stats=1 \
      "${dict[@]}" "$work/new/$name" "tests/fuzz/corpus/$name" >"$work/$name.log" 2>&1; then
    grep -v '^INFO:\|^#[0-9]' "$work/$name.log" | head -n 80
    echo "fuzz: ${name}_fuzzer failed (whole log: $work/$name.log)"
    exit 1
  fi
  tail -n 12 "$work/$name.log"
done
echo "fuzz: no crash"
