#!/usr/bin/env bash
# Usage: bench/gpu_smoke.sh [--python PY [--wheelhouse DIR]] [--steps N] [--workspace DIR] [--cpu]
#
# First contact with a GPU node, in one command: the node's GPU check (utils/launch/gpu_health.sh),
# the GPU metrics plugin (utils/observe/plugins/gpu_metrics_plugin.sh), then two short MaxText runs
# through run_local.sh on the shipped qwen3-8b config scaled down to fit one 80 GB GPU (8 layers of
# width 2048, batch 2 x 4096 tokens: ~1-2 min each), one with the config's own attention
# (cudnn_flash_te) and one with attention=dot_product, and utils/perf.py on each. Prints one table:
# steps seen (first..last, and whether the log holds them all: its JOB SUMMARY `steps:` line against
# the steps asked for), steady step time, tokens/s/device, MaxText's own TFLOP/s/device (perf.py's
# median of its step lines), perf.py's 6 N x tokens/s estimate, and MFU against the GPU's peak.
# A run refused before it starts (e.g. no Transformer Engine for cudnn_flash_te) shows why.
#   --python PY      adopt PY, the machine's own interpreter with JAX for its GPUs, as the environment
#                    (MAXTEXT_SLURM_VENV=<workspace>/adopted utils/setup_env.sh --adopt PY); default:
#                    the existing environment (MAXTEXT_SLURM_VENV, else .venv)
#   --wheelhouse DIR with --python: install what PY lacks from DIR, offline
#   --steps N        steps per run (default 30; 8 with --cpu)
#   --workspace DIR  where the runs' logs and job directories go (default: a new temporary directory,
#                    kept and printed)
#   --cpu            no GPU needed: the same pipeline on this machine's CPU with the tiny config (its
#                    own attention, then attention=dot_product); for the test suite
# The runs are native (CONTAINER_RUNTIME=none) unless CONTAINER_RUNTIME says otherwise.
# Exit 0 when both checks passed and every run trained; 1 when something failed (the table says
# what); 2 on bad usage, or on a machine without a GPU (one line) unless --cpu.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/utils/launch/lib.sh"
PROG=gpu_smoke.sh
bad() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 2; }

python="" wheelhouse="" steps="" ws="" cpu=0
while (( $# )); do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --python) (( $# >= 2 )) || bad "--python needs an interpreter, e.g. --python /usr/bin/python3"; python=$2; shift 2 ;;
    --wheelhouse) (( $# >= 2 )) || bad "--wheelhouse needs a directory of wheels"; wheelhouse=$2; shift 2 ;;
    --steps) (( $# >= 2 )) || bad "--steps needs a number, e.g. --steps 30"; steps=$2; shift 2 ;;
    --workspace) (( $# >= 2 )) || bad "--workspace needs a directory"; ws=$2; shift 2 ;;
    --cpu) cpu=1; shift ;;
    *) bad "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -z "$steps" || "$steps" =~ ^[1-9][0-9]{0,4}$ ]] || bad "--steps takes a whole number from 1 to 99999, got '$steps'"
[[ -z "$wheelhouse" || -n "$python" ]] || bad "--wheelhouse goes with --python PY"
[[ -z "$python" ]] || command -v "$python" >/dev/null 2>&1 || bad "--python: no interpreter '$python' on this machine"
host=$(hostname)
if (( ! cpu )) && [[ ! -e /dev/nvidiactl && ! -e /dev/kfd ]]; then
  bad "no GPU on $host (no /dev/nvidiactl or /dev/kfd): run it on a GPU node, or with --cpu for the same pipeline on this CPU"
fi

if [[ -z "$ws" ]]; then ws=$(mktemp -d "${TMPDIR:-/tmp}/gpu-smoke.XXXXXX"); else mkdir -p -- "$ws"; fi
ws=$(cd "$ws" && pwd)
export JOB_WORKSPACE=$ws CONTAINER_RUNTIME=${CONTAINER_RUNTIME:-none}
if [[ -n "$python" ]]; then
  # depends on utils/setup_env.sh --adopt (the machine's own JAX, no network)
  export MAXTEXT_SLURM_VENV=$ws/adopted
  MAXTEXT_SLURM_VENV=$MAXTEXT_SLURM_VENV "$repo/utils/setup_env.sh" --adopt "$python" ${wheelhouse:+--wheelhouse "$wheelhouse"} ||
    { echo "$PROG: could not adopt $python (utils/setup_env.sh --adopt: its last line says why)" >&2; exit 1; }
fi
venv_py=${MAXTEXT_SLURM_VENV:-$repo/.venv}/bin/python
failed=0

# 1. the GPU check and the metrics plugin
gh_rc=0
gh_out=$("$repo/utils/launch/gpu_health.sh" 2>&1) || gh_rc=$?
gh=$(grep -m 1 '^gpu_health: verdict ' <<< "$gh_out" || true)
gh=${gh#gpu_health: verdict }
[[ "$gh" == *": ok"* && $gh_rc == 0 ]] || failed=1
plugin_rc=0
plugin_out=$("$repo/utils/observe/plugins/gpu_metrics_plugin.sh" 2>&1) || plugin_rc=$?
series=$(grep -c '^hw_' <<< "$plugin_out" || true)
models=$(sed -n 's/^hw_gpu_info{.*model="\([^"]*\)".*/\1/p' <<< "$plugin_out" | sort | uniq -c | awk '{ $1 = $1 "x"; print }' | paste -sd, -)
case "$plugin_rc" in
  0) plugin="$series series${models:+, $models}" ;;
  64) plugin="no GPU (exit 64)"; (( cpu )) || failed=1 ;;
  *) plugin="FAILED (exit $plugin_rc): $(tail -n 1 <<< "$plugin_out")"; failed=1 ;;
esac

# 2. the runs, and perf.py on each
if (( cpu )); then
  model=tiny steps=${steps:-8}
  shape=()
else
  model=qwen3-8b steps=${steps:-30}
  shape=(override_model_config=true base_num_decoder_layers=8 base_emb_dim=2048 base_mlp_dim=6144
         base_num_query_heads=16 base_num_kv_heads=8 head_dim=128 per_device_batch_size=2 max_target_length=4096)
fi
rows=()
for attention in "" dot_product; do
  label=${attention:-default}
  out=$ws/run-$label.out
  args=("$model" -- "${shape[@]}" "steps=$steps" ${attention:+"attention=$attention"})
  echo "$PROG: run_local.sh ${args[*]}" >&2
  rc=0
  "$repo/run_local.sh" "${args[@]}" > "$out" 2>&1 || rc=$?
  log=$(sed -n 's/^run_local.sh: job [^ ]*, log \(.*\)$/\1/p' "$out" | head -n 1)
  if [[ -z "$log" ]]; then   # refused before the job started: its one line says why
    rows+=("$label" "$rc" "-" "$(tail -n 1 "$out")")
    failed=1
    continue
  fi
  (( rc == 0 )) || failed=1
  perf=$ws/perf-$label.json
  "$venv_py" "$repo/utils/perf.py" "$log" --json > "$perf" 2>> "$out" || true
  rows+=("$label" "$rc" "$log" "$perf")
done

echo "gpu_health: ${gh:-no verdict (exit $gh_rc)}"
echo "gpu plugin: $plugin"
PYTHONPATH="$repo/utils${PYTHONPATH:+:$PYTHONPATH}" "$venv_py" "$repo/bench/gpu_smoke_report.py" "$steps" "${rows[@]}" || failed=1
echo "workspace: $ws"
exit "$failed"
