#!/bin/bash
# Throughput of one warm `gpuphot worker` (one RunContext for all frames, fed by Redis) against one
# `gpuphot reduce` process per frame, on N copies of one simulated frame. Starts its own redis-server on
# 127.0.0.1 (random free port, no persistence) and stops it by PID.
#   usage: tests/redis/bench_worker_vs_reduce.sh GPUPHOT [N=20] [SIZE=2048x2048] [BACKEND=auto] [STARS=3000]
set -euo pipefail
bin=$(realpath "$1"); n=${2:-20}; size=${3:-2048x2048}; backend=${4:-auto}; stars=${5:-3000}
work=$(mktemp -d /tmp/gpuphot_bench_worker.XXXXXX)
redis_pid=
cleanup() { [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
now() { date +%s.%N; }

mkdir -p "$work/in" "$work/per_process" "$work/worker"
"$bin" simulate --size "$size" --stars "$stars" --seed 1 -q -o "$work/in" --name sim
for i in $(seq -w 1 "$n"); do cp "$work/in/sim.fits" "$work/in/f$i.fits"; done
frames=("$work"/in/f*.fits)

# 1. one process per image
t0=$(now)
for f in "${frames[@]}"; do
    GPUPHOT_NO_TYCHO2=1 "$bin" reduce "$f" -o "$work/per_process" -q --backend "$backend"
done
t1=$(now)

# 2. one warm worker (its start-up, CUDA context included, is counted)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --dir "$work" \
    --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
"$bin" enqueue --redis "127.0.0.1:$port" -q -o "$work/worker" "${frames[@]}"
t2=$(now)
"$bin" worker --redis "127.0.0.1:$port" --backend "$backend" --max-frames "$n" -q
t3=$(now)
ok=$("$bin" results --redis "127.0.0.1:$port" | grep -c '"status":"ok"' || true)

python3 - "$n" "$t0" "$t1" "$t2" "$t3" "$ok" "$size" "$backend" <<'PY'
import sys
n, t0, t1, t2, t3, ok = int(sys.argv[1]), *map(float, sys.argv[2:6]), int(sys.argv[6])
a, b = t1 - t0, t3 - t2
print(f"{n} frames {sys.argv[7]}, backend {sys.argv[8]}")
print(f"one reduce process per frame: {a:7.2f} s  {n / a:6.3f} frames/s")
print(f"one warm worker (Redis):      {b:7.2f} s  {n / b:6.3f} frames/s  ({ok} ok results)")
print(f"warm-worker gain: x{a / b:.2f}")
PY
