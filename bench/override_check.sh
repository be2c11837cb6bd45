#!/usr/bin/env bash
# Usage: bench/override_check.sh [RUNS]
#
# Time of the submit-time config and override check (utils/launch/check_config.py, as the launcher runs
# it) for configs/llama3.1-8b.yml with 20 overrides of every kind: wall and CPU seconds per run,
# median over RUNS (default 20). It must stay a small part of submit.sh's 1 s (goal: <= 0.3 s);
# the share of a bare Python start is printed beside it.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../utils/launch/lib.sh"; usage; exit; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=${1:-20}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "override_check.sh: RUNS must be a positive number" >&2; exit 2; }
"$repo/utils/setup_env.sh"
py="${MAXTEXT_SLURM_VENV:-$repo/.venv}/bin/python"
overrides=$'steps=100\nlearning_rate=1e-4\nwarmup_steps_fraction=0.1\nenable_checkpointing=true\npacking=no
run_name=bench\ndataset_type=hf\nhf_path=allenai/c4\nhf_data_dir=en\ntokenizer_path=meta-llama/Llama-3.1-8B
attention=dot_product\nremat_policy=minimal\nprofiler=xplane\nprofiler_steps=3\nskip_first_n_steps_for_profiler=2
ici_parallelism=[1, 1]\nper_device_batch_size=1\nmax_target_length=4096\nlog_period=10\ncheckpoint_period=1000'

measure() {  # measure LABEL CMD...: median wall and CPU seconds of RUNS runs of CMD
  local label=$1 out wall cpu
  shift
  out=$(for _ in $(seq "$runs"); do
    TRAIN_OVERRIDES=$overrides TIMEFORMAT='%R %U %S' bash -c 'time "$@" >/dev/null' _ "$@" 2>&1 >/dev/null | tail -1
  done)
  wall=$(awk '{ print $1 }' <<< "$out" | sort -n | awk '{ v[NR] = $1 } END { printf "%.3f %.3f", v[int((NR + 1) / 2)], v[1] }')
  cpu=$(awk '{ print $2 + $3 }' <<< "$out" | sort -n | awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] }')
  printf '%s: median %s s wall (min %s s), %s s CPU, over %d runs\n' "$label" "${wall% *}" "${wall#* }" "$cpu" "$runs"
}
TRAIN_OVERRIDES=$overrides "$py" "$repo/utils/launch/check_config.py" "$repo/configs/llama3.1-8b.yml"
measure "check_config.py, 20 overrides" "$py" "$repo/utils/launch/check_config.py" "$repo/configs/llama3.1-8b.yml"
measure "bare python start (for scale)" "$py" -c pass
