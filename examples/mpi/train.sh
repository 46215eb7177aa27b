#!/usr/bin/env bash
# asgd under MPI: mpirun starts 5 ranks of the same `asgd cluster` command;
# rank 0 is the coordinator, ranks 1-2 the shards, 3-4 the workers. Rank 0
# writes where it listens to a rendezvous file the others read, so the file
# must be on a filesystem every host shares.
#
#   examples/mpi/train.sh [ASGD] [MNIST_DIR] [RENDEZVOUS_FILE]
#
# For a real cluster: give mpirun your hostfile (--hostfile hosts), put the
# rendezvous file on the shared filesystem (a fresh name per job), and drop
# --oversubscribe (and --allow-run-as-root, needed only when run as root, as
# in a container).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
asgd=${1:-$here/../../build/bin/asgd}
mnist=${2:-${ASGD_DATA_DIR:-../shared/data}/mnist}
rendezvous=${3:-$(mktemp -u "${TMPDIR:-/tmp}/asgd-rendezvous.XXXXXX")}
root=()
[[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
exec mpirun "${root[@]}" --oversubscribe -np 5 \
  "$asgd" cluster --shards 2 --workers 2 --epochs 3 --data-dir "$mnist" \
  --rendezvous "$rendezvous" --join-timeout 60 --log-level warn
