#!/usr/bin/env bash
# Usage: utils/launch/job_header.sh
#
# Prints the block that opens every job log: job, model, nodes, the GPUs per node asked and
# checked (MST_GPU_REQUEST, JOB_GPUS_PER_NODE), coordinator, stage time limits (with the defaults),
# container, what the site file contributed (MST_SITE_APPLIED), code snapshot and its hash
# (MST_SNAPSHOT, MST_REPO_SHA256), the environment MST_VENV with its versions of JAX, jaxlib, the GPU
# plugin and MaxText (its .mst-versions record, written by utils/setup_env.sh; read now when it has
# none), overrides (secrets redacted), paths; for a run (--run, MST_RUN) its alias, run
# directory and the checkpoint step it resumes from; for RAY=1 where the TSDB is written (lib.sh
# tsdb_place: in the job dir, or on node-local disk and copied into it).
# Reads the generic JOB_* variables and the launch variables of docs/env-contract.md.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
source "$here/launch_lib.sh"
source "$here/run_alias.sh"
timeouts=$(stage_timeouts "${STAGE_TIMEOUTS:-}" | awk '{ printf "%s%s:%s", sep, $1, $2; sep = "," }')
run_line=""
environment=${MST_VENV:-?}
if [[ -x "${MST_VENV:-}/bin/python" ]]; then
  environment+=" $("$MST_VENV/bin/python" -I "$here/env_pins.py" versions 2>/dev/null || echo '(versions unknown: its python failed)')"
fi
gpus=${MST_GPU_REQUEST:-}   # submit.sh's gpu_request; run_local.sh asks for none
if [[ -z "$gpus" ]]; then
  gpus="not checked (JOB_GPUS_PER_NODE unset)"
  [[ -z "${JOB_GPUS_PER_NODE:-}" ]] || gpus="$JOB_GPUS_PER_NODE per node (JOB_GPUS_PER_NODE); preflight fails a node that shows fewer"
fi
[[ -z "${MST_RUN:-}" ]] || run_line="run: $(run_describe)"$'\n'
tsdb_line=""
if [[ "${RAY:-0}" == 1 ]]; then
  read -r place fs <<< "$(tsdb_place "${JOB_DIR:-.}")"
  if [[ "$place" == node_local ]]; then
    tsdb_line="tsdb: node_local ($fs; Prometheus does not support it): written on the first node's disk, copied into the job dir every ${METRICS_TSDB_COPY_INTERVAL:-60} s and at the end"$'\n'
  else
    tsdb_line="tsdb: in_place ($fs)"$'\n'
  fi
fi
[[ -z "${MST_RUN:-}" || -z "${MST_CONTINUE:-}" ]] || run_line+="continue: $(continue_describe)"$'\n'
cat <<HEADER
==================== JOB ====================
job: ${JOB_ID:-?} ${JOB_NAME:-?}
scheduler: ${JOB_SCHEDULER:-?}
model: ${MODEL:-?}${MODEL_TAG:+ (tag $MODEL_TAG)}
nodes: ${JOB_NUM_NODES:-?} (${JOB_NODELIST:-?})
gpus: $gpus
coordinator: ${JOB_COORDINATOR_ADDR:-?}:${JOB_COORDINATOR_PORT:-?}
stage_timeouts: $timeouts (defaults $STAGE_TIMEOUT_DEFAULTS; set STAGE_TIMEOUTS)
container: ${CONTAINER_RUNTIME:-auto} ${CONTAINER_IMAGE:-localhost/maxtext-slurm:latest}
site: ${MST_SITE_APPLIED:-none}
ray: ${RAY:-0}
${tsdb_line}environment: $environment
code: ${MST_SNAPSHOT:-${MST_REPO:-?}}
code_sha256: ${MST_REPO_SHA256:-?} (each node runs a private copy checked against it)
overrides: $(shown_list maxtext <<< "${TRAIN_OVERRIDES:-}")
env_overrides: $(shown_list env <<< "${TRAIN_ENV_OVERRIDES:-}")
${run_line}job_dir: ${JOB_DIR:-?}
log: ${JOB_LOG:-?}
started: $(date -u +%Y-%m-%dT%H:%M:%SZ)
=============================================
HEADER
