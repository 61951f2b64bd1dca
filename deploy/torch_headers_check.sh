#!/usr/bin/env bash
# Compiles every gradsync source that includes LibTorch against the headers
# of newer PyTorch releases than Debian 12's 1.13, on this machine (no GPU,
# no PyTorch 2.x needed): the GPU machines have PyTorch 2.x, where a build
# error costs the scarce GPU time. Syntax only (-fsyntax-only: templates are
# instantiated, nothing is linked).
#   deploy/torch_headers_check.sh [--work_dir=DIR] [--set=NAME ...] [--only=REGEX]
#
#   --work_dir  downloads, unpacked headers and the CMake tree (default
#               build/torch-headers, git-ignored)
#   --set       which header sets (default all):
#                 2.6-cuda  Debian 13's libtorch-cuda-dev 2.6 (C++17, with
#                           c10/cuda: GRADSYNC_TORCH_CUDA and CUDA's headers
#                           from CUDA_HOME, default /usr/local/cuda)
#                 2.14      Debian unstable's libtorch-dev 2.14 (C++20,
#                           which PyTorch requires from 2.13)
#               Both with Debian unstable's pybind11 (the Python extension).
#               Together they bracket the GPU machines' PyTorch (2.11 in
#               2026-11).
#   --only      check only the sources whose path matches REGEX
# Needs Debian's package archive (apt-get download through a temporary
# sources list under DIR; nothing is installed), CMake, ninja, g++ and this
# tree's build dependencies (deploy/install_deps.sh). Prints one line per
# source and set, then "torch_headers_check: N of M failed"; exits 1 when
# any failed (the compiler's messages are in DIR/logs/SET/), 2 on bad usage.
# Not part of the test command: it downloads about 30 MB (the package lists
# of two Debian releases, then 6 MB of packages).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

work=build/torch-headers
sets=()
only=
for arg in "$@"; do
  case "$arg" in
    --work_dir=*) work=${arg#*=} ;;
    --set=*) sets+=("${arg#*=}") ;;
    --only=*) only=${arg#*=} ;;
    *) echo "torch_headers_check: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
[ ${#sets[@]} -gt 0 ] || sets=(2.6-cuda 2.14)
for s in "${sets[@]}"; do
  case "$s" in
    2.6-cuda|2.14) ;;
    *) echo "torch_headers_check: unknown set '$s' (sets: 2.6-cuda, 2.14)" >&2; exit 2 ;;
  esac
done
mkdir -p "$work" && work=$(cd "$work" && pwd)
cuda_home=${CUDA_HOME:-/usr/local/cuda}

# package=version for each set; the versions are the ones this script was
# written against (a newer one is a new check: change it here).
declare -A packages=(
  [2.6-cuda]="libtorch-cuda-dev=2.6.0+dfsg-7+b1"
  [2.14]="libtorch-dev=2.14.1+dfsg-1"
)
pybind="pybind11-dev=3.1.0-2"

# --- Download and unpack (once; kept in DIR).
apt_dir=$work/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$work/debs"
cat >"$apt_dir/sources.list" <<'EOF'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main contrib
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main contrib
EOF
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
  -o APT::Sandbox::User=root)
unpack() {  # unpack NAME PACKAGE=VERSION: into DIR/NAME unless there
  local name=$1 spec=$2 deb
  [ -d "$work/$name/usr/include" ] && return 0
  if ! ls "$work/debs/${spec%%=*}_"*.deb >/dev/null 2>&1; then
    if [ ! -f "$apt_dir/updated" ]; then
      apt-get "${apt_opts[@]}" update >"$work/apt-update.log" 2>&1 ||
        { echo "torch_headers_check: apt-get update failed ($work/apt-update.log)" >&2; return 1; }
      touch "$apt_dir/updated"
    fi
    (cd "$work/debs" && apt-get "${apt_opts[@]}" download "$spec") >"$work/apt-download.log" 2>&1 ||
      { echo "torch_headers_check: apt-get download $spec failed ($work/apt-download.log;" \
          "if Debian no longer has that version, put the current one in this script)" >&2; return 1; }
  fi
  deb=$(ls "$work/debs/${spec%%=*}_"*.deb | head -n 1)
  rm -rf "$work/$name.tmp" && mkdir -p "$work/$name.tmp" && dpkg -x "$deb" "$work/$name.tmp" &&
    mv "$work/$name.tmp" "$work/$name"
}
unpack pybind11 "$pybind" || exit 1
for s in "${sets[@]}"; do unpack "torch-$s" "${packages[$s]}" || exit 1; done

# --- The compile commands of this tree (Debian's LibTorch 1.13 and the
# Python extension configured), with the generated protobuf headers.
cmake_dir=$work/cmake
cmake -S "$repo" -B "$cmake_dir" -G Ninja -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  -DGRADSYNC_WITH_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3 \
  >"$work/cmake.log" 2>&1 || { echo "torch_headers_check: cmake failed ($work/cmake.log)" >&2; exit 1; }
generated=$(ninja -C "$cmake_dir" -t targets all | grep -o '^[^:]*\.pb\.h' | sort -u)
# shellcheck disable=SC2086
ninja -C "$cmake_dir" $generated >"$work/generate.log" 2>&1 ||
  { echo "torch_headers_check: generating the protobuf headers failed ($work/generate.log)" >&2; exit 1; }

# --- Each LibTorch source against each set, two at a time.
rm -rf "$work/logs"
/usr/bin/env python3 - "$cmake_dir/compile_commands.json" "$work" "$cuda_home" "$only" "${sets[@]}" <<'EOF'
import json, os, re, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

commands, work, cuda_home, only, *sets = sys.argv[1:]
flags = {  # set: (C++ standard, extra flags)
    "2.6-cuda": ("c++17", ["-DGRADSYNC_TORCH_CUDA", "-isystem", cuda_home + "/include"]),
    "2.14": ("c++20", []),
}
# A source uses LibTorch when CMake gave it LibTorch's include folder.
units = [c for c in json.load(open(commands))
         if "torch/csrc/api/include" in c["command"]
         and (not only or re.search(only, c["file"]))]

def command(unit, name):
    std, extra = flags[name]
    include = f"{work}/torch-{name}/usr/include"
    args, out, skip = shlex.split(unit["command"]), [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c" and not a.startswith("-O"):
            out.append("-std=" + std if a.startswith("-std=") else a)
    # Ahead of every other folder: these headers win over Debian's 1.13.
    return ([args[0], "-isystem", include + "/torch/csrc/api/include",
             "-isystem", include, "-isystem", f"{work}/pybind11/usr/include"]
            + extra + out + ["-fsyntax-only"])

def check(job):
    unit, name = job
    p = subprocess.run(command(unit, name), cwd=unit["directory"],
                       capture_output=True, text=True)
    return unit, name, p.returncode, p.stderr

failed = 0
jobs = [(u, s) for s in sets for u in units]
with ThreadPoolExecutor(2) as pool:
    for unit, name, rc, err in pool.map(check, jobs):
        path = os.path.relpath(unit["file"], os.getcwd())
        errors = sum(1 for line in err.splitlines() if ": error:" in line)
        print(f"{'ok  ' if rc == 0 else 'FAIL'} {name:9} {path}"
              + (f" ({errors} errors)" if rc else ""), flush=True)
        if rc:
            failed += 1
            log = os.path.join(work, "logs", name, path.replace("/", "_") + ".log")
            os.makedirs(os.path.dirname(log), exist_ok=True)
            open(log, "w").write(err)
print(f"torch_headers_check: {failed} of {len(jobs)} failed"
      + (f" (logs in {work}/logs)" if failed else ""))
sys.exit(1 if failed else 0)
EOF
