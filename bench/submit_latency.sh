#!/usr/bin/env bash
# Usage: bench/submit_latency.sh [RUNS]
#
# Wall time of submit.sh from command to accepted job (snapshot, config check and sbatch
# included), on the local Slurm cluster (started here if it is not up, stopped again after).
# Jobs are submitted to begin an hour later and cancelled at once, so nothing trains (submit.sh
# itself holds and releases each job). Goal: <= 1 s.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../utils/launch/lib.sh"; usage; exit; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-10}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "submit_latency.sh: RUNS must be a positive number" >&2; exit 2; }
started=0
if ! "$repo/utils/local_cluster.sh" status >/dev/null 2>&1; then
  "$repo/utils/local_cluster.sh" up 2 >/dev/null; started=1
fi
eval "$("$repo/utils/local_cluster.sh" env)"
ws=$(mktemp -d)
"$repo/utils/setup_env.sh"
times=()
for _ in $(seq "$runs"); do
  t0=$(date +%s%N)
  out=$(JOB_WORKSPACE=$ws "$repo/submit.sh" tiny -N 2 --begin=now+3600 -- steps=1)
  t1=$(date +%s%N)
  times+=($(( (t1 - t0) / 1000000 )))
  scancel "$(sed -n 's/^Submitted job \([0-9]*\).*/\1/p' <<< "$out")"
done
chmod -R u+w "$ws" && rm -rf "$ws"
(( started )) && "$repo/utils/local_cluster.sh" down >/dev/null
printf '%s\n' "${times[@]}" | sort -n | awk -v n="$runs" '
  { t[NR] = $1; s += $1 }
  END { printf "submit.sh latency over %d runs: median %.3f s, min %.3f s, max %.3f s, mean %.3f s (goal <= 1 s)\n",
        n, t[int((n + 1) / 2)] / 1000, t[1] / 1000, t[n] / 1000, s / n / 1000 }'
