#!/usr/bin/env bash
# The quick-start demo (deploy/quickstart.sh demo runs `deploy/demo.sh build`):
# start a 2-node local cluster in a temporary directory, train the small GPT of
# deploy/jobs/demo.ini (its layout: tp x pp over the 4 slots) on the built-in corpus
# while watching it live, show the final status (each rank's place in the layout and
# where its step went) and how the model's answers improved, and stop the cluster (also
# when interrupted).
#
# usage: deploy/demo.sh [BUILD_DIR] [--set section.key=value]...
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ $# -gt 0 ] && shift
ctl=$build/bin/chorusctl
[ -x "$ctl" ] || { echo "demo: $ctl not found; build first (deploy/quickstart.sh demo)" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/chorus-demo.XXXXXX")
# shellcheck disable=SC2317 # called by the trap
stop() { "$ctl" local down --dir "$dir" >/dev/null 2>&1 || true; }
trap stop EXIT
trap 'exit 130' INT TERM

echo "== starting a local cluster (2 nodes x 2 slots) in $dir"
"$ctl" local up --dir "$dir" --nodes 2 --slots 2
export CHORUS_SOCKET=$dir/ctl.sock
"$ctl" nodes

echo
echo "== training: deploy/jobs/demo.ini $*"
id=$("$ctl" submit deploy/jobs/demo.ini --set "checkpoint.dir=$dir/checkpoints" "$@")
echo "job $id; following it live (Ctrl-C stops the demo)"
status=0
"$ctl" watch "$id" || status=$?

echo
echo "== final status"
"$ctl" status "$id"

# Rank 0 logs "step=S accuracy=A  12+35=47 ✓ ..." after each evaluation (workerd/train.c):
# show the first, every 250th step and the last.
echo
echo "== the model's answers as it trained (greedy completions; accuracy over 64 sums)"
"$ctl" logs "$id" --rank 0 2>/dev/null |
  sed -n 's/.* step=\([0-9]*\) accuracy=\([0-9.]*\) *\(.*\)/\1 \2 \3/p' |
  awk '{ rest = $0; sub(/^[^ ]+ [^ ]+ /, "", rest)
         line = sprintf("step %5d  accuracy %5.1f%%   %s", $1, 100 * $2, rest) }
       NR == 1 || $1 % 250 == 0 { print line; shown = NR }
       END { if (NR > 0 && shown != NR) print line }' || true
# A sliced layout is evaluated from its checkpoints: say why when it could not be.
"$ctl" logs "$id" --rank 0 2>/dev/null | grep -m1 -o 'accuracy not evaluated.*' || true

if [ $status -ne 0 ]; then
  echo
  echo "== the job did not complete; last lines of its rank 0 log:"
  "$ctl" logs "$id" --rank 0 | tail -n 20 || true
fi

echo
echo "== stopping the cluster"
"$ctl" local down --dir "$dir"
trap - EXIT
rm -rf "$dir"
exit $status
