#!/usr/bin/env bash
# Build Chorus and install it on this machine: a thin wrapper over `cmake --install`
# (deploy/package.cmake says what goes where), plus the two things an install rule should not
# do to /etc: copy the example configs to /etc/chorus/ when none exist (local edits are kept)
# and reload systemd. It makes no key: `chorusctl keygen /etc/chorus/cluster.key` on the head
# node, then copy that file to every node.
#
# usage: deploy/install.sh [--prefix DIR] [--build-dir DIR] [--no-build] [--no-deps]
#                          [--enable coordinatord|workerd|both]
# Default prefix /usr/local. DESTDIR=/some/root installs under that root instead (no root
# needed, nothing reloaded or enabled). --enable runs systemctl enable --now.
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
dest=${DESTDIR:-}
if [ -z "$dest" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install: must run as root (try sudo $0 $*), or set DESTDIR" >&2
  exit 1
fi

[ "$do_build" = 1 ] && [ "$do_deps" = 1 ] && deploy/install-deps.sh build
# Configure even with --no-build: the units name the binaries under this prefix.
cmake -S "$root" -B "$build" -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
if [ "$do_build" = 1 ]; then
  targets=(coordinatord workerd chorus-rank chorusctl)
  # the GPU backend module, when this machine has CUDA and NCCL (the target exists then)
  cmake --build "$build" --target help 2>/dev/null | grep -q chorus_engine_cuda &&
    targets+=(chorus_engine_cuda)
  cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}"
fi
cmake --install "$build"

# Root's jobs run as chorus-jobs (coordinatord's run-as-user): a system user of their own,
# with no shell and no home, so no unrelated process shares their uid (nobody would).
if [ -z "$dest" ] && ! getent passwd chorus-jobs >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "Chorus training jobs of root" chorus-jobs
  echo "install: created the system user chorus-jobs (root's jobs run as it)"
fi

etc=$dest/etc/chorus
install -d -m 0755 "$etc"
for c in coordinatord workerd; do
  if [ -e "$etc/$c.conf" ]; then
    echo "install: keeping $etc/$c.conf (new example: $prefix/share/chorus/etc/$c.conf)"
  else
    install -m 0644 "$dest$prefix/share/chorus/etc/$c.conf" "$etc/$c.conf"
    echo "install: wrote $etc/$c.conf"
  fi
done
if [ -z "$dest" ] && [ -e /etc/chorus/cluster.key ]; then
  # The daemons run as root: the key is root's alone (a key another user owns, or can
  # read, lets that user act as any worker of the cluster).
  chown root:root /etc/chorus/cluster.key
  chmod 0600 /etc/chorus/cluster.key
fi

if [ -z "$dest" ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  case "$enable" in
  coordinatord) systemctl enable --now chorus-coordinatord.service ;;
  workerd) systemctl enable --now chorus-workerd.service ;;
  both) systemctl enable --now chorus-coordinatord.service chorus-workerd.service ;;
  esac
elif [ -n "$enable" ]; then
  echo "install: systemd is not running here (or DESTDIR is set); not enabling anything" >&2
fi

cat <<MSG
install: done ($dest$prefix). Next, as README's "Deploying on a cluster" says:
  head node:  chorusctl keygen /etc/chorus/cluster.key, and copy it to every node (mode 0600)
              edit /etc/chorus/coordinatord.conf, then systemctl enable --now chorus-coordinatord
  each node:  set coordinator= in /etc/chorus/workerd.conf, then
              systemctl enable --now chorus-workerd
  check:      chorusctl nodes
MSG
