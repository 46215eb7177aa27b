#!/usr/bin/env bash
# Runs COMMAND and prints the peak of the summed resident memory (VmRSS) of
# it and its descendants, sampled every 50 ms, and its wall time: what a
# job of several processes (asgd cluster) holds at once, which GNU time's
# largest-process figure does not say. The command's output goes to
# peak_rss.log in the current folder.
#
#   bench/peak_rss.sh COMMAND [ARGS...]
set -uo pipefail
(($#)) || { echo "usage: bench/peak_rss.sh COMMAND [ARGS...]" >&2; exit 2; }
descendants() {  # descendants PID: it and every process under it
  local kid
  echo "$1"
  for kid in $(ps -o pid= --ppid "$1"); do descendants "$kid"; done
}
"$@" >peak_rss.log 2>&1 &
root=$!
peak=0
start=$(date +%s.%N)
while kill -0 "$root" 2>/dev/null; do
  sum=0
  for p in $(descendants "$root"); do
    kb=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null)
    sum=$((sum + ${kb:-0}))
  done
  ((sum > peak)) && peak=$sum
  sleep 0.05
done
wait "$root"
status=$?
end=$(date +%s.%N)
printf 'peak summed RSS %d MB, wall %.2f s, exit %d\n' $((peak / 1024)) "$(echo "$end - $start" | bc)" "$status"
exit "$status"
