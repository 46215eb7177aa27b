#!/usr/bin/env bash
# A job as five separate processes, each started by hand the way they would
# be on five hosts (docs/cluster.md): one coordinator, two shards, two
# workers, talking over tcp on 127.0.0.1. `asgd cluster` does the same in
# one command; this shows the parts.
#
#   examples/multi_process_cluster.sh ASGD_BINARY MNIST_DIR [OUT_DIR] [BASE_PORT]
#
# Prints the coordinator's summary; exits with the coordinator's status, or
# the status of the first process that failed (the others are then stopped).
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

# Waits for whichever process ends first. One that fails (at start, say:
# its port taken) tells nobody: the others would wait out their
# --join-timeout for it (60 s), so every process is stopped at once.
declare -A names=([$coordinator_pid]=coordinator [${pids[1]}]="shard 0" [${pids[2]}]="shard 1"
                  [${pids[3]}]="worker 0" [${pids[4]}]="worker 1")
declare -A logs=([$coordinator_pid]=coordinator.log [${pids[1]}]=shard0.log [${pids[2]}]=shard1.log
      [${pids[3]}]=worker0.log [${pids[4]}]=worker1.log)
status=0 running=("${pids[@]}")
while ((${#running[@]} > 0)); do
  ended="" code=0
  wait -n -p ended "${running[@]}" || code=$?
  [[ -n $ended ]] || break
  for i in "${!running[@]}"; do [[ ${running[$i]} != "$ended" ]] || unset "running[$i]"; done
  if ((code != 0 && status == 0)); then  # the first to fail; the others stop because of it
    echo "${names[$ended]} exited with status $code ($out/${logs[$ended]}): stopping the others" >&2
    tail -n 3 "$out/${logs[$ended]}" >&2 || true
    status=$code
    cleanup
  fi
done
grep -E "^done|test accuracy" "$out/coordinator.log" || cat "$out/coordinator.log"
if [[ -s $out/run.jsonl ]]; then
  echo "metrics: $out/run.jsonl (logs beside it)"
else
  echo "no metrics were written (exit status $status); logs: $out" >&2
fi
exit "$status"
