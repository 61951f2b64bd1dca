# What the benchmark scripts share (sourced after setting $bin, the folder
# that holds server/gradsync-coordinator): a scratch folder $work, the
# processes in $pids killed and the folder removed at exit, and a
# coordinator on a loopback port.
#   bin=${1:-bazel-bin}; source bench/lib.sh
work=$(mktemp -d)
pids=()
bench_cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap bench_cleanup EXIT

# start_coordinator NAME [FLAG...]: a coordinator from $bin on 127.0.0.1
# (log: $work/NAME.coordinator.log), killed at exit; sets coordinator_pid
# and address (HOST:PORT) once it serves, fails after 10 s otherwise.
start_coordinator() {
  local name=$1
  shift
  "$bin/server/gradsync-coordinator" --listen=127.0.0.1:0 \
    --port_file="$work/$name.port" "$@" >"$work/$name.coordinator.log" 2>&1 &
  coordinator_pid=$!
  pids+=("$coordinator_pid")
  for _ in $(seq 100); do [[ -s $work/$name.port ]] && break; sleep 0.1; done
  [[ -s $work/$name.port ]] || {
    echo "$name: the coordinator did not start" >&2
    cat "$work/$name.coordinator.log" >&2
    return 1
  }
  address="127.0.0.1:$(cat "$work/$name.port")"
}

# start_etcd: a one-member etcd (Debian's etcd-server, default settings) on
# loopback with its data in $work/etcd, killed at exit; sets etcd_endpoint
# (HOST:PORT) once it answers /health, fails after 10 s otherwise.
start_etcd() {
  local cport pport
  cport=$(free_port); pport=$(free_port)
  /usr/bin/etcd --name=bench --data-dir="$work/etcd" \
    --listen-client-urls="http://127.0.0.1:$cport" \
    --advertise-client-urls="http://127.0.0.1:$cport" \
    --listen-peer-urls="http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls="http://127.0.0.1:$pport" \
    --initial-cluster="bench=http://127.0.0.1:$pport" \
    --logger=zap --log-outputs="$work/etcd.log" &
  pids+=("$!")
  etcd_endpoint="127.0.0.1:$cport"
  for _ in $(seq 1 100); do
    curl -fs "http://$etcd_endpoint/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "etcd did not start (log: $work/etcd.log)" >&2
  return 1
}

# A free loopback port (the kernel's pick for port 0).
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# python_package DIR: the gradsync package as the Python tests see it (its
# sources, the stubs and the extension from $bin: bazel build
# //python:gradsync/_C.so //python:stubs) in DIR/gradsync, for PYTHONPATH=DIR.
python_package() {
  mkdir -p "$1"
  cp -r python/gradsync "$1/"
  cp -r "$bin/python/gradsync/_gen" "$bin/python/gradsync/_C.so" "$1/gradsync/"
}
