#!/usr/bin/env bash
# The install paths a user takes, checked on this machine in scratch roots (nothing outside
# them is touched), as CI runs it (ctest: package.install):
#   1. the .deb (cmake --build BUILD --target package) unpacks (dpkg -x) and each of its four
#      binaries answers --version; its units name those binaries and pass systemd-analyze
#      verify where systemd-analyze exists;
#   2. README's five deploy steps with DESTDIR: deploy/install.sh, a key made by the installed
#      chorusctl, the installed coordinatord and workerd started from the installed configs
#      (ports and folders moved into the scratch root), and `chorusctl nodes` shows the node
#      alive.
# usage: tests/package/check_install.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/chorus-install.XXXXXX")
pids=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$scratch"
}
trap cleanup EXIT
fail() { echo "check_install: FAIL: $*" >&2; exit 1; }
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")

echo "== 1. the package"
cmake --build "$build" --target package >"$scratch/cpack.log" 2>&1 || { cat "$scratch/cpack.log"; fail "cpack"; }
deb=$(ls -t "$build"/chorus_*.deb | head -n 1)
dpkg-deb --info "$deb" | grep -E '^ (Package|Version|Depends):'
dpkg -x "$deb" "$scratch/deb"
for b in coordinatord workerd chorus-rank chorusctl; do
  out=$("$scratch/deb$prefix/bin/$b" --version) || fail "$b --version exited $?"
  [[ $out == "$b (Chorus) "* ]] || fail "$b --version printed '$out'"
  echo "$out"
done
if command -v help2man >/dev/null; then
  for m in man1/chorusctl.1 man8/coordinatord.8 man8/workerd.8; do
    grep -q '^\.SH DESCRIPTION' "$scratch/deb$prefix/share/man/$m" || fail "no man page $m"
  done
  echo "man pages: chorusctl(1), coordinatord(8), workerd(8)"
fi
grep -q "complete -F _chorusctl chorusctl" "$scratch/deb$prefix/share/bash-completion/completions/chorusctl" ||
  fail "no bash completion for chorusctl"
units=("$scratch/deb$prefix"/lib/systemd/system/chorus-*.service)
[ ${#units[@]} -eq 2 ] || fail "expected 2 units, found ${units[*]}"
for u in "${units[@]}"; do
  grep -q "^ExecStart=$prefix/bin/" "$u" || fail "$(basename "$u") does not run $prefix/bin/"
  grep -q '^RestartPreventExitStatus=78' "$u" || fail "$(basename "$u") restarts on a config error"
done
if command -v systemd-analyze >/dev/null; then
  # Copies whose ExecStart= names the unpacked binaries (verify checks they exist); --root
  # would need a whole system's units in the scratch root.
  mkdir -p "$scratch/verify"
  for u in "${units[@]}"; do
    sed "s|^ExecStart=$prefix/bin/|ExecStart=$scratch/deb$prefix/bin/|" "$u" >"$scratch/verify/$(basename "$u")"
  done
  systemd-analyze verify "$scratch"/verify/*.service || fail "systemd-analyze verify"
  echo "units verified by systemd-analyze"
fi

echo "== 2. deploy steps with DESTDIR"
root=$scratch/root
DESTDIR=$root "$src/deploy/install.sh" --no-build --no-deps --build-dir "$build" --prefix "$prefix" >/dev/null
bin=$root$prefix/bin
etc=$root/etc/chorus
"$bin/chorusctl" keygen "$etc/cluster.key" >/dev/null
mkdir -p "$scratch/state" "$scratch/run"
# Step 1 on a real node creates the system user chorus-jobs (the example config's
# run-as-user); a DESTDIR install touches nothing outside its root, so on a machine where
# no install ran, root's jobs run as nobody here instead.
runas=()
getent passwd chorus-jobs >/dev/null || runas=(--run-as-user nobody)
"$bin/coordinatord" --config "$etc/coordinatord.conf" --key "$etc/cluster.key" "${runas[@]}" \
  --listen 127.0.0.1:0 --ctl-socket "$scratch/ctl.sock" --state-dir "$scratch/state" \
  --metrics "" --heartbeat-ms 100 --dead-after-ms 1000 >"$scratch/coordinatord.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$scratch/state/coordinatord.addr" ] && break; sleep 0.1; done
[ -s "$scratch/state/coordinatord.addr" ] || { cat "$scratch/coordinatord.log"; fail "coordinatord did not start"; }
addr=$(cat "$scratch/state/coordinatord.addr")
"$bin/workerd" --config "$etc/workerd.conf" --key "$etc/cluster.key" --coordinator "$addr" \
  --name install-check --slots 1 --device cpu --run-dir "$scratch/run" >"$scratch/workerd.log" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 100); do
  state=$("$bin/chorusctl" --socket "$scratch/ctl.sock" nodes 2>/dev/null | awk '$1 == "install-check" { print $2 }')
  [ "$state" = alive ] && break
  sleep 0.1
done
[ "$state" = alive ] || { cat "$scratch/workerd.log"; fail "the node is not alive (state '$state')"; }
echo "node install-check alive under the installed coordinatord"
echo "check_install: ok"
