#!/bin/bash
# `gpuphot submit slurm` and `gpuphot status` against a real single-node Slurm (Debian slurm-wlm + munge)
# started here, as root, without systemd or cgroups:
#   munged with its own key and socket in a temp dir; slurmctld -D and slurmd -D with SLURM_CONF pointing
#   at a slurm.conf in the temp dir (free ports, state/spool/pid/log files there, Gres=gpu:2 on fake
#   device nodes); 4 simulated frames, one of them not FITS; `submit slurm --gpus-per-task 1 --wait`;
#   then `status` must say 3 ok + 1 failed and the catalogs must exist.
# Every daemon started here is stopped by PID on exit, and the temp dir removed.
# Usage: slurm_test.sh PATH/TO/gpuphot        Exit 77 (skipped) without Slurm/munge or when not root.
set -u
GPUPHOT=${1:?usage: slurm_test.sh PATH/TO/gpuphot}
GPUPHOT=$(readlink -f "$GPUPHOT")

skip() { echo "SKIP: $*"; exit 77; }
for tool in munged slurmctld slurmd sbatch squeue sinfo scontrol; do
    command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed (Debian: slurm-wlm, munge)"
done
[ "$(id -u)" = 0 ] || skip "needs root (slurmd runs the jobs as their owner and SlurmUser=root)"
[ -x "$GPUPHOT" ] || { echo "FAIL: $GPUPHOT is not executable"; exit 1; }

T=$(mktemp -d /tmp/gpuphot_slurm.XXXXXX)
chmod 755 "$T" # munged wants its socket's directory searchable by everyone
PIDS=()
cleanup() {
    local rc=$?
    # Newest first: slurmd, slurmctld, munged.
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        kill -TERM "${PIDS[i]}" 2>/dev/null
    done
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        for _ in $(seq 1 50); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "${PIDS[i]}" 2>/dev/null
        wait "${PIDS[i]}" 2>/dev/null
    done
    if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
        echo "---- logs ($T) ----"
        for f in "$T"/slurmctld.log "$T"/slurmd.log "$T"/munged.log "$T"/out/slurm/*.out; do
            [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }
        done
    fi
    rm -rf "$T"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "FAIL: $*"; exit 1; }

# A TCP port nobody listens on, from a range chosen by our PID (parallel runs do not collide).
free_port() {
    local p=$1
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}
BASE=$((20000 + ($$ % 2000) * 10))
CTLD_PORT=$(free_port $BASE)
SLURMD_PORT=$(free_port $((CTLD_PORT + 1)))

# ---- munge: its own key and socket ----
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none
chmod 600 "$T/munge.key"
munged --force --key-file="$T/munge.key" --socket="$T/munge.sock" --pid-file="$T/munged.pid" \
    --seed-file="$T/munged.seed" --log-file="$T/munged.log" || fail "munged did not start"
# munged forks into the background; its PID file names the daemon.
for _ in $(seq 1 50); do [ -s "$T/munged.pid" ] && break; sleep 0.1; done
PIDS+=("$(cat "$T/munged.pid")")

# ---- slurm.conf and gres.conf ----
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
mkdir -p "$T/state" "$T/spool" "$T/dev"
# Fake GPUs: gres.conf wants character devices (a plain file works but slurmd then sets no
# CUDA_VISIBLE_DEVICES); fall back to touch where mknod is not allowed (containers).
for i in 0 1; do mknod "$T/dev/nvidia$i" c 195 "$i" 2>/dev/null || touch "$T/dev/nvidia$i"; done
cat >"$T/slurm.conf" <<EOF
ClusterName=gpuphottest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge.sock
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
MailProg=/bin/true
ReturnToService=2
MinJobAge=600
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
echo "Name=gpu File=$T/dev/nvidia[0-1]" >"$T/gres.conf"
export SLURM_CONF="$T/slurm.conf"

# ---- the daemons, in the foreground of background jobs so that $! is the daemon ----
slurmctld -D -f "$SLURM_CONF" >"$T/slurmctld.stdout" 2>&1 &
PIDS+=("$!")
slurmd -D -N localhost -f "$SLURM_CONF" >"$T/slurmd.stdout" 2>&1 &
PIDS+=("$!")
state=""
for _ in $(seq 1 300); do
    state=$(sinfo -h -n localhost -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.1
done
[ "$state" = idle ] || fail "the node did not become idle (sinfo says '$state')"
echo "Slurm up: node idle (ports $CTLD_PORT/$SLURMD_PORT)"

# ---- 4 frames: 3 simulated (the same field under three names), 1 not FITS ----
export GPUPHOT_NO_TYCHO2=1
mkdir -p "$T/data"
"$GPUPHOT" simulate --size 256x256 --stars 60 --seed 11 -o "$T/data" --name f1 -q || fail "simulate failed"
cp "$T/data/f1.fits" "$T/data/f2.fits"
cp "$T/data/f1.fits" "$T/data/f3.fits"
echo "this is not a FITS file" >"$T/data/bad.fits"

# ---- errors that need no cluster ----
out=$("$GPUPHOT" submit slurm -o "$T/none" 2>&1) && fail "submit without frames succeeded"
grep -q "no frames" <<<"$out" || fail "no-frames message: $out"
out=$(PATH=/nonexistent "$GPUPHOT" submit slurm "$T/data/f1.fits" -o "$T/nosbatch" 2>&1) &&
    fail "submit without sbatch on PATH succeeded"
grep -q "sbatch: not found on PATH" <<<"$out" || fail "sbatch-missing message: $out"
out=$("$GPUPHOT" submit slurm "$T/data/f1.fits" -o "$T/badpart" --partition nosuchpartition 2>&1) &&
    fail "submit to a missing partition succeeded"
grep -qi "sbatch.*failed.*partition" <<<"$out" || fail "sbatch failure should show sbatch's stderr: $out"

# ---- the real run ----
OUT="$T/out"
"$GPUPHOT" submit slurm "$T/data/f1.fits" "$T/data/f2.fits" "$T/data/bad.fits" "$T/data/f3.fits" \
    --ref "$T/data/f1.ref.fits" -o "$OUT" --gpus-per-task 1 --max-parallel 2 --cpus-per-task 1 \
    --wait --poll 0.5 -- --formats csv >"$T/submit.stdout" 2>"$T/submit.stderr"
rc=$?
cat "$T/submit.stdout" "$T/submit.stderr"
[ "$rc" = 1 ] || fail "submit --wait should exit 1 (one frame failed), got $rc"
JOB=$(head -n 1 "$T/submit.stdout")
[[ "$JOB" =~ ^[0-9]+$ ]] || fail "first line of submit's output is not a job id: '$JOB'"
[ "$(cat "$OUT/slurm/job_id")" = "$JOB" ] || fail "job_id file"
grep -q -- "--array=0-3%2" "$OUT/slurm/job.sh" || fail "job.sh has no --array=0-3%2"
grep -q -- "--gres=gpu:1" "$OUT/slurm/job.sh" || fail "job.sh has no --gres=gpu:1"
[ "$(sed -n 3p "$OUT/slurm/frames.txt")" = "$T/data/bad.fits" ] || fail "frames.txt line 3"

"$GPUPHOT" status "$OUT" >"$T/status.txt"
rc=$?
cat "$T/status.txt"
[ "$rc" = 1 ] || fail "status should exit 1 with a failed frame, got $rc"
"$GPUPHOT" status "$OUT" --json >"$T/status.json"
read -r ok failed missing <<<"$(jq -r '.totals | "\(.ok) \(.failed) \(.missing)"' "$T/status.json")"
[ "$ok/$failed/$missing" = "3/1/0" ] || fail "expected 3 ok, 1 failed, 0 missing; got $ok/$failed/$missing"
[ "$(jq -r '.frames[] | select(.status == "failed") | .frame' "$T/status.json")" = "$T/data/bad.fits" ] ||
    fail "the failed frame is not bad.fits"
for f in f1 f2 f3; do
    [ -s "$OUT/$f.cat.fits" ] || fail "$OUT/$f.cat.fits missing"
    [ -s "$OUT/$f.cat.csv" ] || fail "$OUT/$f.cat.csv missing (the reduce arguments after -- were not passed)"
    [ -s "$OUT/$f.report.json" ] || fail "$OUT/$f.report.json missing"
    zp=$(jq -r --arg f "$T/data/$f.fits" '.frames[] | select(.frame == $f) | .line.zp' "$T/status.json")
    [[ "$zp" =~ ^[0-9.-]+$ ]] || fail "$f: no zero point in its status line (--ref not passed?): $zp"
done
[ ! -e "$OUT/bad.cat.fits" ] || fail "a catalog for the bad frame"
# One status file per element, named JOB_TASK.jsonl; each element saw one fake GPU.
for t in 0 1 2 3; do
    [ -s "$OUT/slurm/status/${JOB}_$t.jsonl" ] || fail "status/${JOB}_$t.jsonl missing"
    grep -q "CUDA_VISIBLE_DEVICES=[01])" "$OUT/slurm/${JOB}_$t.out" || fail "element $t got no GPU from the gres"
done

# A frame without a status line is "missing", and Slurm's word on its element is shown.
rm "$OUT/slurm/status/${JOB}_1.jsonl"
"$GPUPHOT" status "$OUT" --json >"$T/status2.json" && fail "status with a missing frame exited 0"
[ "$(jq -r '.totals.missing' "$T/status2.json")" = 1 ] || fail "missing count"
jq -r '.frames[1].slurm' "$T/status2.json" | grep -q "COMPLETED" || fail "Slurm state of the missing element"

echo "PASS"
