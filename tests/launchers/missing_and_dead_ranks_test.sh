#!/usr/bin/env bash
# Start-up and loss under a launcher (ASGD_* variables, 5 ranks on this
# machine), the two ways issue 19 asks never to hang:
#  1. a worker rank never starts: every started rank exits within
#     --join-timeout (3 s) and a few seconds, each naming the missing one;
#  2. rank 0 is killed mid-training: every other rank is gone within
#     --heartbeat-timeout (3 s) + 5 s, saying the coordinator went silent.
# usage: missing_and_dead_ranks_test.sh ASGD MNIST_DIR   (exit 77: no data)
set -uo pipefail
asgd=$1
mnist=$2
[[ -d "$mnist" ]] || exit 77
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/common.sh"
status=0

# start RANK PORT EXTRA...: one rank in the background; its pid in $pid.
start() {
  local rank=$1 port=$2
  shift 2
  ASGD_RANK=$rank ASGD_WORLD_SIZE=5 ASGD_COORDINATOR="tcp://127.0.0.1:$port" \
    "$asgd" cluster --shards 2 --workers 2 --data-dir "$mnist" --log-level info "$@" >"$work/rank$rank.log" 2>&1 &
  pid=$!
}

# 1. Rank 4 (worker 1) never starts.
port=$(free_port)
pids=()
t0=$SECONDS
for r in 0 1 2 3; do start $r "$port" --join-timeout 3 --epochs 1; pids+=("$pid"); done
for r in 0 1 2 3; do wait "${pids[$r]}"; done
took=$((SECONDS - t0))
echo "1. started ranks all gone after $took s"
[[ $took -le 10 ]] || { echo "   too slow: more than --join-timeout 3 s + 7 s"; status=1; }
grep -h "error" "$work"/rank0.log | tail -1
for r in 0 1 2 3; do
  grep -q "missing: worker 1 (rank 4 under a launcher)" "$work/rank$r.log" ||
    { echo "   rank $r did not name the missing rank"; tail -3 "$work/rank$r.log"; status=1; }
done
grep -h "error" "$work"/rank3.log | tail -1

# 2. Rank 0 killed while the others train.
port=$(free_port)
pids=()
for r in 0 1 2 3 4; do
  start $r "$port" --join-timeout 30 --epochs 50 --heartbeat-timeout 3 --rpc-timeout 30
  pids+=("$pid")
done
for _ in $(seq 300); do grep -q "epoch 1/50" "$work/rank0.log" && break; sleep 0.1; done
grep -q "epoch 1/50" "$work/rank0.log" || { echo "2. the job never finished its first epoch"; tail -5 "$work/rank0.log"; exit 1; }
kill -9 "${pids[0]}"
t0=$SECONDS
for r in 1 2 3 4; do wait "${pids[$r]}"; done
took=$((SECONDS - t0))
echo "2. ranks 1-4 all gone $took s after rank 0 was killed"
grep -h "coordinator sent nothing" "$work"/rank[1-4].log | head -2
[[ $took -le 8 ]] || { echo "   too slow: more than --heartbeat-timeout 3 s + 5 s"; status=1; }

# 3. Every rank signalled at once mid-training, as scancel does (SIGTERM)
# and as Slurm's --signal=USR1@N does ahead of a time limit (SIGUSR1):
# every rank exits 1, the job having not finished (a rank that heard the
# signal before the coordinator's stop exited 0; SIGUSR1 killed them all),
# and the shards' checkpoints are there to resume from.
for sig in TERM USR1; do
  port=$(free_port)
  pids=()
  ck="$work/ck-$sig"
  for r in 0 1 2 3 4; do
    start $r "$port" --join-timeout 30 --epochs 50 --checkpoint-dir "$ck" --checkpoint-every 0.5
    pids+=("$pid")
  done
  for _ in $(seq 300); do grep -q "epoch 1/50" "$work/rank0.log" && break; sleep 0.1; done
  kill -"$sig" "${pids[@]}"
  codes=()
  for r in 0 1 2 3 4; do
    wait "${pids[$r]}"
    codes+=($?)
  done
  echo "3. SIG$sig to every rank: exit statuses ${codes[*]}"
  for r in 0 1 2 3 4; do
    [[ ${codes[$r]} -eq 1 ]] || { echo "   rank $r exited ${codes[$r]}, not 1"; tail -3 "$work/rank$r.log"; status=1; }
  done
  for k in 0 1; do
    [[ -f "$ck/shard-$k.ckpt" ]] || { echo "   no checkpoint of shard $k after SIG$sig"; status=1; }
  done
done
exit $status
