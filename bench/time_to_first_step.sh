#!/usr/bin/env bash
# Usage: bench/time_to_first_step.sh
#
# Seconds from `run_local.sh tiny` start to the first completed training step:
#   cold: a new workspace (empty JAX compilation cache);
#   warm: a second run in the same workspace (compilation cache filled).
# The Python environment is set up before timing starts.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../utils/launch/lib.sh"; usage; exit; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/utils/setup_env.sh"
ws=$(mktemp -d)

first_step() {  # prints seconds until "completed step: 0" shows in run_local.sh's output
  local t0 line
  t0=$(date +%s%N)
  while IFS= read -r line; do
    if [[ "$line" == *"completed step: 0,"* ]]; then
      awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f\n", (b - a) / 1e9 }'
    fi
  done < <(JOB_WORKSPACE=$ws "$repo/run_local.sh" tiny -- steps=3 2>&1)
}
cold=$(first_step)
warm=$(first_step)
chmod -R u+w "$ws" && rm -rf "$ws"
echo "run_local.sh tiny start to first completed step: cold ${cold} s, warm ${warm} s"
