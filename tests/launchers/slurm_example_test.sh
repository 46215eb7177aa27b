#!/usr/bin/env bash
# A real single-node Slurm on this machine, all of it in a scratch folder:
# a munge key, munged, a generated slurm.conf for this host (declaring 8
# CPUs, more than the VM has, through SlurmdParameters=config_overrides),
# slurmctld and slurmd; then `sbatch --wait examples/slurm/train.sbatch`
# must train MNIST to 0.97 as 5 tasks of one srun step. Every daemon is
# stopped at the end, whatever happened.
# usage: slurm_example_test.sh SOURCE_DIR ASGD MNIST_PARENT_DIR
# Exit 77 (skipped): not root, Slurm or munge not installed, or no data.
set -uo pipefail
source_dir=$1
asgd=$2
data=$3
[[ $(id -u) -eq 0 && -d "$data/mnist" ]] || exit 77
for tool in munged slurmctld slurmd sbatch scontrol; do command -v "$tool" >/dev/null || exit 77; done

work=$(mktemp -d /tmp/asgd-slurm.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "slurm_example_test: $*" >&2
  for log in munged slurmctld slurmd; do [[ -f "$work/$log.log" ]] && { echo "--- $log.log"; tail -15 "$work/$log.log"; }; done
  exit 1
}
source "$(dirname "$0")/common.sh"

host=$(hostname -s)
mkdir -p "$work/state" "$work/spool" "$work/munge" "$work/key"
dd if=/dev/urandom of="$work/key/munge.key" bs=1024 count=1 2>/dev/null
chmod 700 "$work/key"
chmod 400 "$work/key/munge.key"
chmod 755 "$work/munge"  # clients reach the socket through it
munged --force --key-file="$work/key/munge.key" --socket="$work/munge/munge.socket" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munged.log" --seed-file="$work/key/seed" -F \
  >>"$work/munged.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [[ -S "$work/munge/munge.socket" ]] && break; sleep 0.1; done
[[ -S "$work/munge/munge.socket" ]] || fail "munged did not start"

cat >"$work/slurm.conf" <<CONF
ClusterName=asgdtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" >>"$work/slurmctld.log" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$host" >>"$work/slurmd.log" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 100); do
  state=$(scontrol show node "$host" 2>/dev/null | sed -n 's/.*State=\([A-Z+_]*\).*/\1/p')
  [[ $state == IDLE* ]] && break
  [[ $state == *DRAIN* ]] && scontrol update nodename="$host" state=resume >/dev/null 2>&1
  sleep 0.2
done
[[ $state == IDLE* ]] || fail "the node did not become idle (state '$state')"

cd "$work" || fail "no scratch folder"
ASGD="$asgd" ASGD_DATA_DIR="$data" timeout 240 sbatch --wait "$source_dir/examples/slurm/train.sbatch" >"$work/sbatch.out" 2>&1
status=$?
out=$(cat "$work"/asgd-train-*.out 2>/dev/null)
accuracy=$(printf '%s' "$out" | tr '\r' '\n' | sed -n 's/.*done: test accuracy \([0-9.]*\).*/\1/p' | tail -1)
echo "sbatch exit $status, test accuracy ${accuracy:-none} ($(cat "$work/sbatch.out"))"
if [[ $status -ne 0 || -z "$accuracy" ]]; then
  printf '%s\n' "$out" | tr '\r' '\n' | tail -20
  fail "the job did not finish"
fi
python3 -c "import sys; sys.exit(0 if float('$accuracy') >= 0.97 else 1)" || fail "test accuracy $accuracy is below 0.97"
