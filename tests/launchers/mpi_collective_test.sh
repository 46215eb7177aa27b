#!/usr/bin/env bash
# asgd cluster --collective mpi under a real mpirun (4 ranks: coordinator,
# 1 shard, 2 workers): the allreduce policy's all-reduce through Open MPI's
# MPI_Allreduce trains MNIST to 0.97 in 3 epochs; a worker rank killed
# mid-job ends every rank in time (MPI cannot drop a rank: mpirun, or the
# other worker once told, stops the job); and the flag is refused outside
# mpirun and for gossip. Exit 77 (skipped): no data, or no mpirun.
# usage: mpi_collective_test.sh ASGD MNIST_DIR
set -uo pipefail
asgd=$1
mnist=$2
source "$(dirname "$0")/common.sh"
mpirun_prelude "$mnist"
# Open MPI leaves allocations behind at MPI_Finalize (it unloads its
# components): under AddressSanitizer (scripts/sanitize) the ranks, which
# call MPI, do not look for leaks.
[[ -n "${ASAN_OPTIONS:-}" ]] && root+=(-x "ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0")
run() {  # run RENDEZVOUS EPOCHS
  local rendezvous=$1 epochs=$2
  timeout 240 mpirun "${root[@]}" --oversubscribe -np 4 "$asgd" cluster --shards 1 --workers 2 --epochs "$epochs" \
    --policy allreduce --collective mpi --data-dir "$mnist" --rendezvous "$rendezvous" --join-timeout 60 \
    --log-level warn
}
fail=0

out=$(run "$scratch/r1" 3 2>&1)
status=$?
accuracy=$(printf '%s' "$out" | tr '\r' '\n' | sed -n 's/.*done: test accuracy \([0-9.]*\).*/\1/p' | tail -1)
echo "--collective mpi: exit $status, test accuracy ${accuracy:-none}"
if [[ $status -ne 0 ]] || ! python3 -c "import sys; sys.exit(0 if float('${accuracy:-0}') >= 0.97 else 1)"; then
  printf '%s\n' "$out" | tr '\r' '\n' | tail -20
  fail=1
fi

# Worker 1 is rank 3 (rank 0 the coordinator, then the shard, then the workers).
run "$scratch/r2" 30 >"$scratch/killed.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 200); do
  for pid in $(pgrep -f -- "--rendezvous $scratch/r2"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=3' &&
      grep -q "epoch 1/30" "$scratch/killed.log"; then
      victim=$pid
    fi
  done
  [[ -n "$victim" ]] && break
  sleep 0.1
done
start=$(date +%s)
[[ -n "$victim" ]] && kill -9 "$victim"
wait "$job"
status=$?
took=$(($(date +%s) - start))
echo "worker 1 (pid ${victim:-none}) killed: mpirun exited $status after ${took} s"
if [[ -z "$victim" || $status -eq 0 || $status -eq 124 || $took -gt 60 ]]; then
  tail -20 "$scratch/killed.log"
  fail=1
fi

out=$("$asgd" cluster --launcher local --collective mpi --policy allreduce 2>&1 </dev/null)
status=$?
echo "outside mpirun: exit $status: $out"
[[ $status -eq 2 && "$out" == *"not started by mpirun"* ]] || fail=1
out=$(timeout 60 mpirun "${root[@]}" --oversubscribe -np 4 "$asgd" cluster --shards 1 --workers 2 --policy gossip:2 \
  --collective mpi --data-dir "$mnist" --rendezvous "$scratch/r3" --join-timeout 10 2>&1)
status=$?
echo "gossip: exit $status"
[[ $status -ne 0 && "$out" == *"for --policy allreduce only"* ]] || { printf '%s\n' "$out" | tail -5; fail=1; }
exit $fail
