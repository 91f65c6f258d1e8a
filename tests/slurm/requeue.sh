#!/usr/bin/env bash
# A real Slurm drives deploy/slurm/chorus.sbatch: Debian's slurm-wlm and munge, one node on
# 127.0.0.1, every daemon started here by hand (no systemd). A training job is submitted
# with sbatch, requeued once mid-run (scontrol requeue: the allocation's processes are
# killed and the batch job starts again), and must continue to completion: every step in
# the run's history once, the last step reached, no step started over from 0.
#
#   tests/slurm/requeue.sh BIN_DIR SRC_DIR      (ctest: slurm.requeue; exit 77 = skipped)
#
# Needs root (slurmd runs jobs as their users) and the test packages of
# deploy/install-deps.sh test; skips with the reason otherwise.
set -euo pipefail

skip() {
  echo "SKIP: $*"
  exit 77
}
for b in slurmctld slurmd sbatch scontrol sinfo munged; do
  command -v "$b" >/dev/null ||
    skip "$b is not installed (deploy/install-deps.sh test installs slurm-wlm and munge)"
done
[ "$(id -u)" -eq 0 ] || skip "slurmd and munged need root"

bin=$(realpath "${1:?usage: requeue.sh BIN_DIR SRC_DIR}")
src=$(realpath "${2:?usage: requeue.sh BIN_DIR SRC_DIR}")
base=${CHORUS_TEST_TMP:-/tmp}
mkdir -p "$base"
work=$(mktemp -d "$base/slurm.XXXXXX")
chmod 755 "$work"
host=$(hostname -s)
steps=2000 # long enough that the requeue lands mid-run on a fast machine
pids=()

cleanup() {
  scontrol cancel "${jobid:-0}" >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${jobid:-}" ] && rm -rf "/tmp/chorus-$jobid-"* # the script's node-local dirs
  return 0
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/slurmctld.log "$work"/slurmd.log "$work"/out-*.txt "$work"/shared/*.log; do
    [ -e "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }
  done
  exit 1
}
# wait_for SECONDS CMD...: poll CMD every 0.5 s until it succeeds (bounded).
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -lt "$deadline" ] || return 1
    sleep 0.5
  done
}

# ---- munge: a key and a socket of our own
mkdir -p "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --force --foreground --key-file="$work/munge/munge.key" \
  --socket="$work/munge/munge.socket" --pid-file="$work/munge/munged.pid" \
  --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" \
  >"$work/munge/munged.out" 2>&1 &
pids+=($!)
wait_for 10 test -S "$work/munge/munge.socket" || fail "munged did not start"

# ---- slurm: one node, this host, on 127.0.0.1
# A port below the kernel's ephemeral range (32768 up, where other tests' listeners and
# connections land) that nothing listens on now.
port() {
  local p
  for _ in $(seq 50); do
    p=$(shuf -i 20000-32000 -n 1)
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  echo "$p"
}
mkdir -p "$work/state" "$work/spool"
export SLURM_CONF=$work/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=chorusci
FirstJobId=$(shuf -i 100000-900000 -n 1)
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(port)
SlurmdPort=$(port)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SelectType=select/linear
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -D -i -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$host" -f "$SLURM_CONF" >"$work/slurmd.out" 2>&1 &
pids+=($!)
idle() { sinfo -h -o %T 2>/dev/null | grep -q idle; }
wait_for 60 idle || fail "the node did not become idle"

# ---- the job: a small model, a checkpoint every 20 steps
cat >"$work/job.ini" <<JOB
[job]
name = slurm-ci
[model]
layers = 2
heads = 2
embd = 32
seq_len = 16
[parallel]
micro_batch_size = 4
[train]
steps = $steps
log_every = 50
[checkpoint]
every = 20
JOB
jobid=$(sbatch --parsable --nodes=1 --time=10 --output="$work/out-%j.txt" \
  --export="ALL,CHORUS_BIN=$bin,CHORUS_SHARED=$work/shared,CHORUS_SLOTS=1,CHORUS_PORT=$(port)" \
  "$src/deploy/slurm/chorus.sbatch" "$work/job.ini")
echo "slurm job $jobid"
history=$work/shared/checkpoints/slurm-ci/metrics.jsonl
committed() { compgen -G "$work/shared/checkpoints/slurm-ci/step-*/manifest.json" >/dev/null; }
steps_done() { [ -e "$history" ] && [ "$(wc -l <"$history")" -ge "$1" ]; }
wait_for 240 committed || fail "no checkpoint committed"
wait_for 60 steps_done 60 || fail "the run did not reach step 60"
before=$(wc -l <"$history")
[ "$before" -lt "$steps" ] || fail "the run ended before the requeue"
state() { scontrol show job "$jobid" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
requeued_ms=$(date +%s%3N)
scontrol requeue "$jobid" || fail "scontrol requeue"
echo "requeued at step $before"
# Slurm holds a requeued batch job back (EligibleTime about two minutes ahead, then its next
# periodic scheduling pass): a site's policy, not Chorus's. Once it is pending again, make it
# eligible now so the test spends its time on the continued run.
pending() { [ "$(state)" = PENDING ]; }
wait_for 60 pending || fail "the requeued job did not return to the queue (state $(state))"
scontrol show job "$jobid" | grep -o 'EligibleTime=[^ ]*' || true
scontrol update JobId="$jobid" StartTime=now || fail "scontrol update StartTime"

ended() { case $(state) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) return 0 ;; esac; return 1; }
wait_for 600 ended || fail "the requeued job did not end (state $(state))"
[ "$(state)" = COMPLETED ] || fail "the job ended $(state)"
restarts=$(scontrol show job "$jobid" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
[ "${restarts:-0}" -ge 1 ] || fail "the job was not requeued (Restarts=$restarts)"

# every step once, in order, and the last one reached
awk -v n="$steps" 'match($0, /"step": [0-9]+/) { s = substr($0, RSTART + 8, RLENGTH - 8) + 0;
  if (s != ++k) { print "step " s " at line " k; bad = 1; exit } }
  END { if (!bad && k != n) { print k " steps, not " n; bad = 1 } exit bad }' "$history" ||
  fail "$history does not hold each step once"
grep -q '"resumed_from"' "$work/shared/checkpoints/slurm-ci/run.json" || fail "no run.json"
# the steps before the last checkpoint ran once, in the first allocation: not from 0 again
kept=$(awk -v t="$requeued_ms" 'match($0, /"time_ms": [0-9]+/) &&
  substr($0, RSTART + 11, RLENGTH - 11) + 0 < t { k++ } END { print k + 0 }' "$history")
[ "$kept" -ge 20 ] || fail "only $kept steps of the first allocation kept: the run started over"
echo "PASS: requeued at step $before of $steps ($kept steps kept), completed after $restarts restart(s)"
