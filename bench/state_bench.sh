#!/usr/bin/env bash
# Durable-state benchmark, side by side in one run: the coordinator serving
# from memory, from --state_dir (SQLite, WAL, synchronous=FULL) and from
# --etcd (a one-member etcd on loopback that this script starts, when
# /usr/bin/etcd is there), on the same load: 10,000 simulated workers ranked
# (goal <= 1 s with state), then key-value Set+Get calls with 64 in flight
# (goal: durable >= 0.5 of memory). A fourth column serves from memory over
# TLS (a CA and a certificate for 127.0.0.1 made here with openssl), a fifth
# with per-job tokens (--auth=token: the job created by an admin, every join
# and key-value call carrying the job's token): what TLS and tokens cost, as
# ratios to plaintext without tokens.
#   bench/state_bench.sh [--rounds=3]
# Rounds alternate the backends so machine noise hits all; prints each round
# and the median ratios durable / in-memory.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
for arg in "$@"; do
  case "$arg" in
    --rounds=*) rounds=${arg#*=} ;;
    *) echo "state_bench: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
bazel build -c opt //bench:rendezvous_load 2>&1 | tail -n 1
load=bazel-bin/bench/rendezvous_load
bin=bazel-bin
source bench/lib.sh
state=$work
etcd_endpoint=""
if [ -x /usr/bin/etcd ]; then start_etcd; fi

# TLS material for the fourth column.
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$state/ca.key" -out "$state/ca.pem" \
  -days 1 -subj /CN=bench-ca 2>/dev/null
openssl req "${ec[@]}" -keyout "$state/c.key" -out "$state/c.csr" \
  -subj /CN=127.0.0.1 2>/dev/null
echo "subjectAltName=IP:127.0.0.1" >"$state/ext"
openssl x509 -req -in "$state/c.csr" -CA "$state/ca.pem" -CAkey "$state/ca.key" \
  -CAcreateserial -out "$state/c.pem" -days 1 -extfile "$state/ext" 2>/dev/null
tls=(--tls_cert="$state/c.pem" --tls_key="$state/c.key" --tls_ca="$state/ca.pem")

field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }
# Every row's workers use gRPC's C++ client (TLS needs it, and the rows are
# compared with each other).
run() {  # prints "ranked_s kv_calls_per_s" of one run, or fails
  local out
  out=$("$load" --workers=10000 --channels=8 --kv_ops=5000 --join_client=grpc \
          "$@" | grep '^RESULT')
  [ "$(field wrong "$out")" = 0 ] && [ "$(field failed "$out")" = 0 ] || {
    echo "state_bench: wrong or failed results: $out" >&2; exit 1; }
  echo "$(field ranked_s "$out") $(field kv_calls_per_s "$out")"
}

printf "%5s %10s %10s %10s %10s %10s %12s %12s %12s %12s %12s\n" round memory_s \
  state_s etcd_s tls_s token_s memory_kv/s state_kv/s etcd_kv/s tls_kv/s token_kv/s
kv_ratios=(); rank_ratios=(); etcd_kv_ratios=(); etcd_rank_ratios=()
tls_kv_ratios=(); tls_rank_ratios=(); token_kv_ratios=(); token_rank_ratios=()
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
for r in $(seq 1 "$rounds"); do
  read -r mr mk < <(run)
  rm -rf "$state/r$r"
  read -r sr sk < <(run --state_dir="$state/r$r")
  er="-"; ek="-"
  if [ -n "$etcd_endpoint" ]; then
    read -r er ek < <(run --etcd="$etcd_endpoint" --etcd_prefix="/bench-$r/")
    etcd_kv_ratios+=("$(ratio "$ek" "$mk")")
    etcd_rank_ratios+=("$(ratio "$er" "$mr")")
  fi
  read -r tr tk < <(run "${tls[@]}")
  tls_kv_ratios+=("$(ratio "$tk" "$mk")")
  tls_rank_ratios+=("$(ratio "$tr" "$mr")")
  read -r ar ak < <(run --tokens)
  token_kv_ratios+=("$(ratio "$ak" "$mk")")
  token_rank_ratios+=("$(ratio "$ar" "$mr")")
  printf "%5d %10s %10s %10s %10s %10s %12s %12s %12s %12s %12s\n" "$r" "$mr" "$sr" \
    "$er" "$tr" "$ar" "$mk" "$sk" "$ek" "$tk" "$ak"
  kv_ratios+=("$(ratio "$sk" "$mk")")
  rank_ratios+=("$(ratio "$sr" "$mr")")
done
median() { printf "%s\n" "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "key-value throughput, --state_dir / in-memory (median): $(median "${kv_ratios[@]}")  (goal >= 0.5)"
echo "time to rank 10,000 workers, --state_dir / in-memory (median): $(median "${rank_ratios[@]}")"
if [ -n "$etcd_endpoint" ]; then
  echo "key-value throughput, --etcd / in-memory (median): $(median "${etcd_kv_ratios[@]}")"
  echo "time to rank 10,000 workers, --etcd / in-memory (median): $(median "${etcd_rank_ratios[@]}")"
else
  echo "--etcd: not measured (no /usr/bin/etcd)"
fi
echo "key-value throughput, TLS / plaintext (median): $(median "${tls_kv_ratios[@]}")"
echo "time to rank 10,000 workers, TLS / plaintext (median): $(median "${tls_rank_ratios[@]}")"
echo "key-value throughput, tokens / none (median): $(median "${token_kv_ratios[@]}")"
echo "time to rank 10,000 workers, tokens / none (median): $(median "${token_rank_ratios[@]}")"
