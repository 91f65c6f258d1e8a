#!/usr/bin/env bash
# Install Chorus's dependencies from Debian 12 packages, by set:
#   runtime  what the installed daemons and chorusctl load (a node that only runs Chorus)
#   build    runtime + compilers, CMake, the -dev packages and help2man (man pages)
#            (deploy/quickstart.sh demo)
#   test     build + what the test suite and its reference benchmarks use
#            (Criterion, Open MPI, python3, chromium, prometheus for promtool;
#            deploy/quickstart.sh test)
# usage: deploy/install-deps.sh [runtime|build|test]   (default: test, everything)
# Idempotent: does nothing when the set is already there. Needs root (or sudo).
set -euo pipefail

runtime=(libuv1 libprotobuf-c1 libsodium23 libsqlite3-0 libjansson4 libucx0 ucx-utils
         libopenblas0)
build=(build-essential cmake pkg-config git protobuf-c-compiler help2man
       libuv1-dev libprotobuf-c-dev libsodium-dev libsqlite3-dev libjansson-dev libucx-dev
       libopenblas-dev)
# slurm-wlm and munge: a real Slurm, run by hand by tests/slurm/requeue.sh
test=(libcriterion-dev openmpi-bin libopenmpi-dev python3 chromium prometheus slurm-wlm munge)

case "${1:-test}" in
runtime) pkgs=("${runtime[@]}") ;;
build) pkgs=("${runtime[@]}" "${build[@]}") ;;
test) pkgs=("${runtime[@]}" "${build[@]}" "${test[@]}") ;;
-h | --help) sed -n '2,8p' "$0"; exit 0 ;;
*) echo "install-deps: unknown set '$1' (runtime, build or test)" >&2; exit 2 ;;
esac
# Optional, for the PyTorch reference checks (tests/reference/: run_reference.sh,
# bytes_run.sh) and tests/bench/torch_engine.py; CI does not need them. CHORUS_TORCH=1 adds
# them (about 70 MB to download).
if [ "${CHORUS_TORCH:-0}" = 1 ]; then
  pkgs+=(python3-torch python3-numpy)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
