#!/usr/bin/env bash
# usage: check_probes.sh BUILD_DIR PROBES_FILE
# Builds each probe target of PROBES_FILE (lines "TARGET LAYER HEADER EXPECT")
# and checks that it compiles or fails as expected; a failure must be the
# missing header, not some other error. Exit 1 naming every probe that did not.
set -uo pipefail
build=$1
probes=$2
wrong=0
while read -r target layer header expect; do
  [[ -n $target ]] || continue
  out=$(cmake --build "$build" --target "$target" 2>&1)
  status=$?
  if [[ $expect == compiles && $status -ne 0 ]]; then
    echo "layering: $layer should include $header, but the build failed:" >&2
    echo "$out" | tail -20 >&2
    wrong=1
  elif [[ $expect == fails && $status -eq 0 ]]; then
    echo "layering: $layer includes $header, which is above it, and the build passed" >&2
    wrong=1
  elif [[ $expect == fails ]] && ! grep -qF "$header: No such file or directory" <<<"$out"; then
    echo "layering: $layer including $header failed, but not because the header is out of its reach:" >&2
    echo "$out" | tail -20 >&2
    wrong=1
  else
    echo "ok: $layer $([[ $expect == fails ]] && echo "cannot include" || echo includes) $header"
  fi
done <"$probes"
exit $wrong
