#!/usr/bin/env bash
# Install Chorus's build and test dependencies from Debian 12 packages.
# Idempotent: does nothing when everything is already there. Needs root (or sudo).
#   --test  also what only tests need: a real Slurm for tests/slurm/requeue.sh
set -euo pipefail

pkgs=(build-essential cmake pkg-config git
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler libucx-dev ucx-utils
      libcriterion-dev libsqlite3-dev libopenblas-dev libsodium-dev libsystemd-dev
      openmpi-bin libopenmpi-dev python3
      libjansson-dev chromium)
# test-only: Slurm and munge, run by hand by tests/slurm/requeue.sh (it skips without them)
test_pkgs=(slurm-wlm munge)
[ "${1:-}" = --test ] && pkgs+=("${test_pkgs[@]}")

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
