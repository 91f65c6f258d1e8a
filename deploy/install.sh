#!/usr/bin/env bash
# Build Chorus and install it on this machine (Debian 12; run as root or with sudo):
#   binaries -> $PREFIX/bin              coordinatord, workerd, chorus-rank (next to workerd), chorusctl,
#                                        and libchorus_engine_cuda.so (next to chorus-rank) when the
#                                        build found CUDA + NCCL (train.device = cuda)
#   units    -> /etc/systemd/system/     chorus-coordinatord.service, chorus-workerd.service
#   configs  -> /etc/chorus/*.conf       only when absent: local edits are kept
#   key      -> /etc/chorus/cluster.key  only when absent; copy the same file to every node
#
# usage: deploy/install.sh [--prefix DIR] [--build-dir DIR] [--no-build] [--no-deps]
#                          [--enable coordinatord|workerd|both]
# Nothing is started unless --enable is given (it runs systemctl enable --now).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

prefix=/usr/local
build=$root/build
do_build=1
do_deps=1
enable=""
while [ $# -gt 0 ]; do
  case "$1" in
  --prefix) prefix=$2; shift 2 ;;
  --build-dir) build=$2; shift 2 ;;
  --no-build) do_build=0; shift ;;
  --no-deps) do_deps=0; shift ;;
  --enable) enable=$2; shift 2 ;;
  -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "install: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done
case "$enable" in "" | coordinatord | workerd | both) ;; *)
  echo "install: --enable takes coordinatord, workerd or both" >&2; exit 2 ;;
esac
if [ "$(id -u)" -ne 0 ]; then
  echo "install: must run as root (try sudo $0 $*)" >&2
  exit 1
fi

if [ "$do_build" = 1 ]; then
  [ "$do_deps" = 1 ] && deploy/install-deps.sh
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target coordinatord workerd chorus-rank chorusctl
  # the GPU backend module, when this machine has CUDA and NCCL (the target exists then)
  if cmake --build "$build" --target help 2>/dev/null | grep -q chorus_engine_cuda; then
    cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target chorus_engine_cuda
  fi
fi
for b in coordinatord workerd chorus-rank chorusctl; do
  [ -x "$build/bin/$b" ] || { echo "install: $build/bin/$b is missing (build first)" >&2; exit 1; }
done

install -d -m 0755 "$prefix/bin"
install -m 0755 "$build/bin/coordinatord" "$build/bin/workerd" "$build/bin/chorus-rank" \
  "$build/bin/chorusctl" "$prefix/bin/"
if [ -f "$build/bin/libchorus_engine_cuda.so" ]; then
  install -m 0755 "$build/bin/libchorus_engine_cuda.so" "$prefix/bin/"
  echo "install: the GPU backend module in $prefix/bin (train.device = cuda)"
fi
echo "install: binaries in $prefix/bin"

# Root's jobs run as chorus-jobs (coordinatord's run-as-user): a system user of their own,
# with no shell and no home, so no unrelated process shares their uid (nobody would).
if ! getent passwd chorus-jobs >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "Chorus training jobs of root" chorus-jobs
  echo "install: created the system user chorus-jobs (root's jobs run as it)"
fi

install -d -m 0755 /etc/chorus /etc/systemd/system
for u in chorus-coordinatord chorus-workerd; do
  sed "s|/usr/local/bin/|$prefix/bin/|g" "deploy/systemd/$u.service" >"/etc/systemd/system/$u.service"
  chmod 0644 "/etc/systemd/system/$u.service"
done
echo "install: units in /etc/systemd/system"

for c in coordinatord workerd; do
  if [ -e "/etc/chorus/$c.conf" ]; then
    echo "install: keeping /etc/chorus/$c.conf (new example: deploy/etc/$c.conf)"
  else
    install -m 0644 "deploy/etc/$c.conf" "/etc/chorus/$c.conf"
    echo "install: wrote /etc/chorus/$c.conf"
  fi
done

if [ -e /etc/chorus/cluster.key ]; then
  # The daemons run as root: the key is root's alone (a key another user owns, or can
  # read, lets that user act as any worker of the cluster).
  chown root:root /etc/chorus/cluster.key
  chmod 0600 /etc/chorus/cluster.key
  echo "install: keeping /etc/chorus/cluster.key (made root's, mode 0600)"
else
  "$prefix/bin/chorusctl" keygen /etc/chorus/cluster.key
  echo "install: copy /etc/chorus/cluster.key (mode 0600) to every node of the cluster"
fi

if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  case "$enable" in
  coordinatord) systemctl enable --now chorus-coordinatord.service ;;
  workerd) systemctl enable --now chorus-workerd.service ;;
  both) systemctl enable --now chorus-coordinatord.service chorus-workerd.service ;;
  esac
elif [ -n "$enable" ]; then
  echo "install: systemd is not running here; not enabling anything" >&2
fi

cat <<MSG
install: done. Next:
  head node:  edit /etc/chorus/coordinatord.conf, then systemctl enable --now chorus-coordinatord
  each node:  set coordinator= in /etc/chorus/workerd.conf, copy the key, then
              systemctl enable --now chorus-workerd
  check:      chorusctl nodes
MSG
