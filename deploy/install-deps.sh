#!/usr/bin/env bash
# Install Chorus's build and test dependencies from Debian 12 packages.
# Idempotent: does nothing when everything is already there. Needs root (or sudo).
set -euo pipefail

pkgs=(build-essential cmake pkg-config git
      libuv1-dev libprotobuf-c-dev protobuf-c-compiler libucx-dev ucx-utils
      libcriterion-dev libsqlite3-dev libopenblas-dev libsodium-dev libsystemd-dev
      openmpi-bin libopenmpi-dev python3
      libjansson-dev chromium)
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
