#!/usr/bin/env bash
# A job as five separate processes, each started by hand the way they would
# be on five hosts (docs/cluster.md): one coordinator, two shards, two
# workers, talking over tcp on 127.0.0.1. `asgd cluster` does the same in
# one command; this shows the parts.
#
#   examples/multi_process_cluster.sh ASGD_BINARY MNIST_DIR [OUT_DIR] [BASE_PORT]
#
# Prints the coordinator's summary; exits with the coordinator's status.
# Any process that is still running when the script ends is stopped.
set -euo pipefail
asgd=${1:?usage: $0 ASGD_BINARY MNIST_DIR [OUT_DIR] [BASE_PORT]}
data=${2:?usage: $0 ASGD_BINARY MNIST_DIR [OUT_DIR] [BASE_PORT]}
out=${3:-$(mktemp -d)}
# Below Linux's ephemeral range (32768-60999): a port drawn there could be
# taken by any connection another program opens meanwhile (a shard that
# cannot bind leaves the coordinator waiting out --join-timeout).
port=${4:-$((10000 + RANDOM % 20000))}
mkdir -p "$out"
coordinator=tcp://127.0.0.1:$port

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Host A: the coordinator, with the job's flags.
"$asgd" coordinator --listen "$coordinator" --workers 2 --shards 2 --epochs 2 \
  --data-dir "$data" --metrics-out "$out/run.jsonl" >"$out/coordinator.log" 2>&1 &
coordinator_pid=$!
pids+=("$coordinator_pid")

# Host B: two shards, each announcing the endpoint it listens on.
for i in 0 1; do
  "$asgd" shard --coordinator "$coordinator" --listen "tcp://127.0.0.1:$((port + 1 + i))" \
    >"$out/shard$i.log" 2>&1 &
  pids+=("$!")
done

# Hosts C and D: two workers, each reading its partition from its own disk.
for i in 0 1; do
  "$asgd" worker --coordinator "$coordinator" --data-dir "$data" >"$out/worker$i.log" 2>&1 &
  pids+=("$!")
done

status=0
wait "$coordinator_pid" || status=$?
# A coordinator that failed (at start, say: its port taken) tells nobody:
# the others would wait out their --join-timeout for it. Stop them now.
if ((status != 0)); then cleanup; fi
for p in "${pids[@]:1}"; do wait "$p" || true; done
grep -E "^done|test accuracy" "$out/coordinator.log" || cat "$out/coordinator.log"
if [[ -s $out/run.jsonl ]]; then
  echo "metrics: $out/run.jsonl (logs beside it)"
else
  echo "no metrics were written (the coordinator exited with status $status); logs: $out" >&2
fi
exit "$status"
