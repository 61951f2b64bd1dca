#!/usr/bin/env bash
# //deploy:package_test: the Debian packages build, install into a
# throwaway root and run from there (a coordinator with durable state
# answers the gradsync command, a PyTorch script under the unpacked
# `gradsync launch` finds the unpacked Python package with no PYTHONPATH and
# all-reduces through gradsync://, and the coordinator stops cleanly on
# SIGTERM); systemd
# accepts the unit and rates its hardening; the Kubernetes manifests parse
# (kubectl kustomize: no cluster here for a server-side dry run).
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }

# 1. Build and unpack.
debs=$(GRADSYNC_BIN=$PWD deploy/build_deb.sh --no_build --out="$tmp/dist")
deb=$(sed -n 1p <<<"$debs")
pydeb=$(sed -n 2p <<<"$debs")
root=$tmp/root
dpkg-deb -x "$deb" "$root"
dpkg-deb -x "$pydeb" "$root"
pycontrol=$(dpkg-deb -f "$pydeb")
for field in "Package: python3-gradsync" "Architecture: $(dpkg --print-architecture)" \
    "python3-grpcio" "python3-torch (>= 1.13)"; do
  grep -qF "$field" <<<"$pycontrol" || fail "python3-gradsync's control lacks '$field': $pycontrol"
done
for f in gradsync/__init__.py gradsync/torch.py gradsync/elastic.py gradsync/_C.so \
    gradsync/_gen/proto/gradsync/v1/kv_pb2_grpc.py; do
  [ -e "$root/usr/lib/python3/dist-packages/$f" ] || fail "$f is not in python3-gradsync"
done
control=$(dpkg-deb -f "$deb")
for field in "Package: gradsync" "Depends: adduser, " "libgrpc++1.51"; do
  grep -qF "$field" <<<"$control" || fail "control lacks '$field': $control"
done
# (listed first: `grep -q` quitting early would SIGPIPE tar and, with
# pipefail, fail the pipeline)
control_files=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
grep -q conffiles <<<"$control_files" || fail "no conffiles"
for f in usr/bin/gradsync-coordinator usr/bin/gradsync \
    lib/systemd/system/gradsync-coordinator.service \
    etc/default/gradsync-coordinator usr/share/doc/gradsync/README.md \
    usr/share/doc/gradsync/operating.md; do
  [ -e "$root/$f" ] || fail "$f is not in the package"
done
sh -n deploy/debian/postinst && sh -n deploy/debian/prerm

# 2. The installed binaries run: a coordinator on durable state, asked by
# the installed gradsync command, stopped by SIGTERM.
"$root/usr/bin/gradsync-coordinator" --listen=127.0.0.1:0 \
  --port_file="$tmp/port" --state_dir="$tmp/state" 2>"$tmp/coordinator.log" &
pid=$!
for _ in $(seq 300); do [ -s "$tmp/port" ] && break; sleep 0.1; done
[ -s "$tmp/port" ] || { kill -9 $pid; fail "the coordinator did not start: $(cat "$tmp/coordinator.log")"; }
"$root/usr/bin/gradsync" --coordinator="127.0.0.1:$(cat "$tmp/port")" jobs \
  || { kill -9 $pid; fail "gradsync jobs failed"; }
# Two processes of a PyTorch script under the unpacked launcher, with no
# PYTHONPATH (and from another directory than the package's), under
# Debian's Python, which has python3-torch.
here=$PWD
(cd "$tmp" && env -u PYTHONPATH timeout 120 "$root/usr/bin/gradsync" launch \
  --coordinator="127.0.0.1:$(cat "$tmp/port")" --job=pkg --nnodes=1 --python=/usr/bin/python3 \
  --nproc_per_node=2 "$here/python/tests/init_script.py") >"$tmp/launch.log" 2>&1 \
  || { kill -9 $pid; fail "gradsync launch of a PyTorch script failed: $(cat "$tmp/launch.log")"; }
grep -q "rank 1 of 2: sum 3" "$tmp/launch.log" \
  || { kill -9 $pid; fail "the script did not all-reduce: $(cat "$tmp/launch.log")"; }
# The same on the package's process group backend "gradsync" (its
# extension module), and a gradsync.elastic loop that recovers in place
# (python/tests/elastic_script.py: local rank 1 killed after step 5 and
# restarted alone).
(cd "$tmp" && env -u PYTHONPATH INIT_BACKEND=gradsync timeout 120 "$root/usr/bin/gradsync" launch \
  --coordinator="127.0.0.1:$(cat "$tmp/port")" --job=pkg-pg --nnodes=1 --python=/usr/bin/python3 \
  --nproc_per_node=2 "$here/python/tests/init_script.py") >"$tmp/launch-pg.log" 2>&1 \
  || { kill -9 $pid; fail "the backend 'gradsync' failed: $(cat "$tmp/launch-pg.log")"; }
grep -q "rank 1 of 2: sum 3" "$tmp/launch-pg.log" \
  || { kill -9 $pid; fail "no all-reduce on 'gradsync': $(cat "$tmp/launch-pg.log")"; }
(cd "$tmp" && env -u PYTHONPATH ELASTIC_DIE_AT=5 ELASTIC_STEPS=10 timeout 120 \
  "$root/usr/bin/gradsync" launch --coordinator="127.0.0.1:$(cat "$tmp/port")" \
  --job=pkg-elastic --nnodes=1 --python=/usr/bin/python3 --nproc_per_node=2 \
  --self_managed --max_restarts=1 "$here/python/tests/elastic_script.py") \
  >"$tmp/launch-elastic.log" 2>&1 \
  || { kill -9 $pid; fail "the elastic loop failed: $(cat "$tmp/launch-elastic.log")"; }
grep -q "round 2 rank [01] of 2 from step 5" "$tmp/launch-elastic.log" \
  || { kill -9 $pid; fail "no round 2 after the kill: $(cat "$tmp/launch-elastic.log")"; }
kill -TERM $pid
wait $pid || fail "the coordinator exited $? on SIGTERM: $(cat "$tmp/coordinator.log")"
[ -n "$(ls -A "$tmp/state")" ] || fail "no state written to --state_dir"

# 3. systemd accepts the unit (its ExecStart pointed at the unpacked binary)
# and its hardening rates OK or better.
unit=$tmp/gradsync-coordinator.service
sed "s|/usr/bin/gradsync-coordinator|$root/usr/bin/gradsync-coordinator|" \
  "$root/lib/systemd/system/gradsync-coordinator.service" >"$unit"
complaints=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $complaints"
[ -z "$complaints" ] || fail "systemd-analyze verify complains: $complaints"
exposure=$(systemd-analyze security --offline=yes "$unit" 2>/dev/null |
  sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
[ -n "$exposure" ] || fail "systemd-analyze security gave no exposure level"
awk -v e="$exposure" 'BEGIN {exit !(e <= 2.0)}' || fail "exposure $exposure > 2.0"

# 4. The Kubernetes manifests parse, with what the coordinator needs.
cp -rL deploy/k8s "$tmp/k8s"  # kustomize takes no symlinked (runfiles) files
manifests=$(kubectl kustomize "$tmp/k8s") || fail "kubectl kustomize deploy/k8s"
for want in "kind: StatefulSet" "kind: Service" "kind: Job" "grpc:" \
    "--state_dir=/var/lib/gradsync" "gradsync launch"; do
  grep -qF -- "$want" <<<"$manifests" || fail "manifests lack '$want'"
done
echo "package_test: OK ($deb; unit exposure $exposure)"
