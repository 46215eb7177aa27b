#!/usr/bin/env bash
# asgd cluster --auth-keys under a real mpirun (4 ranks: coordinator, 1
# shard, 2 workers, one key pair in a folder every rank reads): rank 0's
# endpoint in the rendezvous file carries its public key, every connection
# is CURVE, allreduce's collective included, and MNIST trains; with
# --collective mpi the keys are refused (MPI's traffic is not encrypted).
# Exit 77 (skipped): no data, or no mpirun.
# usage: mpi_auth_test.sh ASGD MNIST_DIR
set -uo pipefail
asgd=$1
mnist=$2
source "$(dirname "$0")/common.sh"
mpirun_prelude "$mnist"
fail=0
"$asgd" keys generate --out "$scratch/keys" --name coordinator >/dev/null || exit 1

out=$(timeout 240 mpirun "${root[@]}" --oversubscribe -np 4 "$asgd" cluster --shards 1 --workers 2 --epochs 1 \
  --policy allreduce --data-dir "$mnist" --rendezvous "$scratch/r1" --join-timeout 60 \
  --auth-keys "$scratch/keys" 2>&1)
status=$?
accuracy=$(printf '%s' "$out" | tr '\r' '\n' | sed -n 's/.*done: test accuracy \([0-9.]*\).*/\1/p' | tail -1)
echo "--auth-keys under mpirun: exit $status, test accuracy ${accuracy:-none}"
key=$(grep -v '^#' "$scratch/keys/coordinator.pub" | head -1)
if [[ $status -ne 0 ]] || ! python3 -c "import sys; sys.exit(0 if float('${accuracy:-0}') >= 0.9 else 1)" ||
  [[ "$out" != *"coordinator listening on tcp://"*" curve:$key"* ]] ||
  [[ $(printf '%s' "$out" | grep -c "collective: authenticated and encrypted (CURVE)") -ne 2 ]] ||
  [[ "$out" == *"refused a connection"* ]]; then
  printf '%s\n' "$out" | tr '\r' '\n' | tail -30
  fail=1
fi

out=$(timeout 60 mpirun "${root[@]}" --oversubscribe -np 4 "$asgd" cluster --shards 1 --workers 2 --policy allreduce \
  --collective mpi --data-dir "$mnist" --rendezvous "$scratch/r2" --join-timeout 10 --auth-keys "$scratch/keys" 2>&1)
status=$?
echo "--collective mpi with --auth-keys: exit $status"
[[ $status -ne 0 && "$out" == *"MPI's own traffic is neither authenticated nor encrypted"* ]] ||
  { printf '%s\n' "$out" | tail -5; fail=1; }
exit $fail
