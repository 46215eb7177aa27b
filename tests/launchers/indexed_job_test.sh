#!/usr/bin/env bash
# A Kubernetes Indexed Job's five pods, as five processes on this machine:
# each gets the environment examples/kubernetes/train-job.yaml gives a pod
# (its JOB_COMPLETION_INDEX, the world size, the coordinator's stable name,
# its own address), runs the same `asgd cluster` command, and binds its own
# loopback address (127.0.0.2 to 127.0.0.6). The job must train to 0.97 and
# each shard must announce its own address, not 127.0.0.1.
# usage: indexed_job_test.sh ASGD MNIST_DIR   (exit 77: no data)
set -uo pipefail
asgd=$1
mnist=$2
[[ -d "$mnist" ]] || exit 77
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/common.sh"
port=$(free_port 127.0.0.2)
pids=()
for i in 0 1 2 3 4; do
  JOB_COMPLETION_INDEX=$i ASGD_WORLD_SIZE=5 ASGD_COORDINATOR="tcp://127.0.0.2:$port" ASGD_ADDRESS="127.0.0.$((2 + i))" \
    "$asgd" cluster --shards 2 --workers 2 --epochs 3 --data-dir "$mnist" --join-timeout 60 --log-level info \
    >"$work/rank$i.log" 2>&1 &
  pids+=($!)
done
status=0
for i in 0 1 2 3 4; do
  wait "${pids[$i]}" || { echo "rank $i exited with $?:"; tail -5 "$work/rank$i.log"; status=1; }
done
coordinator="$work/rank0.log"
for s in 0 1; do
  grep -q "shard $s registered: .* at tcp://127.0.0.$((3 + s)):" "$coordinator" ||
    { echo "shard $s did not announce 127.0.0.$((3 + s)):"; grep registered "$coordinator"; status=1; }
done
accuracy=$(sed -n 's/^done: test accuracy \([0-9.]*\).*/\1/p' "$coordinator")
echo "test accuracy ${accuracy:-none}"
grep registered "$coordinator"
python3 -c "import sys; sys.exit(0 if float('${accuracy:-0}') >= 0.97 else 1)" || { echo "below 0.97"; status=1; }
exit $status
