#!/usr/bin/env bash
# examples/mpi/train.sh under a real mpirun (5 ranks, a rendezvous file)
# must train MNIST to 0.97. Exit 77 (skipped): no data, or no mpirun.
# usage: mpi_example_test.sh SOURCE_DIR ASGD MNIST_DIR
set -uo pipefail
source_dir=$1
asgd=$2
mnist=$3
[[ -d "$mnist" ]] && command -v mpirun >/dev/null || exit 77
out=$("$source_dir/examples/mpi/train.sh" "$asgd" "$mnist" 2>&1)
status=$?
accuracy=$(printf '%s' "$out" | tr '\r' '\n' | sed -n 's/.*done: test accuracy \([0-9.]*\).*/\1/p' | tail -1)
echo "exit $status, test accuracy ${accuracy:-none}"
if [[ $status -ne 0 ]]; then
  printf '%s\n' "$out" | tr '\r' '\n' | tail -20
  exit 1
fi
python3 -c "import sys; sys.exit(0 if float('${accuracy:-0}') >= 0.97 else 1)"
