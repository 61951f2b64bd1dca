#!/usr/bin/env bash
# Builds the gradsync Debian packages:
# - gradsync: gradsync-coordinator, the gradsync command (status, watch,
#   launch), the systemd unit with its flags file, a postinst that creates
#   the gradsync system user, the README and docs/;
# - python3-gradsync: the Python package (python/, with its gRPC stubs
#   generated from proto/ by python/setup.py, and its extension module
#   gradsync._C built by Bazel against Debian's python3-torch) in
#   /usr/lib/python3/dist-packages.
#   deploy/build_deb.sh [--out=DIR] [--version=X.Y.Z] [--no_build]
# The binaries come from $GRADSYNC_BIN (default: bazel-bin, built here with
# Bazel unless --no_build). Depends: are the Debian packages that own the
# shared libraries the binaries load (ldd, dpkg -S). gradsync-worker, the
# LibTorch trainer, is not packaged: it links CUDA and NCCL from outside
# Debian where they are installed. Prints the packages' paths, gradsync's
# first, one a line.
set -euo pipefail
cd "$(dirname "$0")/.."
out=. version=0.1.0 build=1
for arg in "$@"; do
  case "$arg" in
    --out=*) out=${arg#*=} ;;
    --version=*) version=${arg#*=} ;;
    --no_build) build=0 ;;
    *) echo "build_deb: unknown argument $arg" >&2; exit 2 ;;
  esac
done
bin=${GRADSYNC_BIN:-bazel-bin}
if [ "$build" = 1 ] && [ -z "${GRADSYNC_BIN:-}" ]; then
  bazel build //server:gradsync-coordinator //cli:gradsync //python:gradsync/_C.so >&2
fi
extension=$bin/python/gradsync/_C.so
[ -f "$extension" ] || { echo "build_deb: $extension is missing" >&2; exit 1; }
binaries=(server/gradsync-coordinator cli/gradsync)
for b in "${binaries[@]}"; do
  [ -x "$bin/$b" ] || { echo "build_deb: $bin/$b is missing" >&2; exit 1; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
  "$root/etc/default" "$root/usr/share/doc/gradsync"
for b in "${binaries[@]}"; do
  install -m 755 "$bin/$b" "$root/usr/bin/"
  strip --strip-debug "$root/usr/bin/$(basename "$b")"
done
install -m 644 deploy/debian/gradsync-coordinator.service "$root/lib/systemd/system/"
install -m 644 deploy/debian/gradsync-coordinator.default \
  "$root/etc/default/gradsync-coordinator"
install -m 644 README.md "$root/usr/share/doc/gradsync/README.md"
install -m 644 docs/*.md "$root/usr/share/doc/gradsync/"
install -m 755 deploy/debian/postinst deploy/debian/prerm "$root/DEBIAN/"
echo /etc/default/gradsync-coordinator >"$root/DEBIAN/conffiles"

# The packages owning the libraries the binaries load (ld.so and glibc's
# own come with libc6).
depends=$(for b in "${binaries[@]}"; do ldd "$root/usr/bin/$(basename "$b")"; done |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do
    dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
  done | cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')
cat >"$root/DEBIAN/control" <<CONTROL
Package: gradsync
Version: $version
Architecture: $(dpkg --print-architecture)
Maintainer: gradsync developers <gradsync@localhost>
Depends: adduser, ${depends:-libc6}
Section: net
Priority: optional
Description: coordinator service and tools for data-parallel training jobs
 gradsync-coordinator runs rendezvous, a key-value store for NCCL/Gloo
 bootstrap, heartbeats and failure, hang and straggler diagnosis for
 data-parallel training jobs, as a systemd service with durable state.
 The gradsync command shows job status and launches a node's processes
 (gradsync launch, torchrun-compatible).
CONTROL
mkdir -p "$out"
deb="$out/gradsync_${version}_$(dpkg --print-architecture).deb"
fakeroot dpkg-deb --build --root-owner-group "$root" "$deb" >&2
echo "$deb"

# python3-gradsync: pip builds the package from a copy of python/ and the
# protos (its build writes beside its sources), into dist-packages.
src=$stage/src
pyroot=$stage/pyroot
mkdir -p "$src/proto/gradsync" "$pyroot/DEBIAN" "$pyroot/usr/lib/python3/dist-packages"
cp -rL python "$src/python"
rm -rf "$src/python/build" "$src/python/gradsync/_gen" "$src"/python/*.egg-info
cp -rL proto/gradsync/v1 "$src/proto/gradsync/v1"
GRADSYNC_EXTENSION=$(readlink -f "$extension") \
  /usr/bin/python3 -m pip install --quiet --no-build-isolation --no-index --no-deps \
  --no-compile --target="$pyroot/usr/lib/python3/dist-packages" "$src/python" >&2
rm -rf "$pyroot/usr/lib/python3/dist-packages/bin"
strip --strip-debug "$pyroot/usr/lib/python3/dist-packages/gradsync/_C.so"
# The extension's libraries' packages, and the torch it was built against
# (its C++ ABI: the same minor version).
torch_version=$(dpkg-query -W -f='${Version}' python3-torch | sed 's/^\([0-9]*\.[0-9]*\).*/\1/')
py_depends=$(ldd "$pyroot/usr/lib/python3/dist-packages/gradsync/_C.so" |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do
    dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
  done | cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')
cat >"$pyroot/DEBIAN/control" <<CONTROL
Package: python3-gradsync
Version: $version
Architecture: $(dpkg --print-architecture)
Maintainer: gradsync developers <gradsync@localhost>
Depends: python3 (>= 3.11), python3 (<< 3.12), python3-grpcio, python3-protobuf, python3-torch (>= $torch_version), python3-torch (<< $torch_version.999), ${py_depends:-libc6}
Recommends: gradsync (= $version)
Section: python
Priority: optional
Description: Python client and torch.distributed Store for gradsync
 The gradsync Python package: jobs, status and the key-value store of a
 gradsync coordinator (gradsync.Client), and PyTorch integration
 (gradsync.torch: a torch.distributed Store on the coordinator's key-value
 store, the gradsync:// init method, the process group backend "gradsync",
 and monitor() for status of a training loop), and gradsync.elastic:
 in-place recovery for PyTorch training loops.
CONTROL
pydeb="$out/python3-gradsync_${version}_$(dpkg --print-architecture).deb"
fakeroot dpkg-deb --build --root-owner-group "$pyroot" "$pydeb" >&2
echo "$pydeb"
