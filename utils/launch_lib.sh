# shellcheck shell=bash
# Launch-time checks shared by submit.sh and run_local.sh (source after lib.sh).
#   stage_timeouts [SPEC]     print "STAGE SECONDS" per stage, defaults overlaid with SPEC
#                             (STAGE_TIMEOUTS syntax "preflight:600,train:86400"); dies on bad input
#   prepare_launch MODEL[:TAG] REPO
#                             resolve and check everything a launch needs before any side effect;
#                             exports MODEL MODEL_TAG JOB_WORKSPACE MST_VENV, sets MODEL_NAME; dies
#                             with a one-line reason on bad input

STAGE_TIMEOUT_DEFAULTS="preflight:600,train:86400"

stage_timeouts() {
  local spec p
  local -A lim=()
  local -a order=() pairs=()
  IFS=, read -r -a pairs <<< "$STAGE_TIMEOUT_DEFAULTS"
  for p in "${pairs[@]}"; do order+=("${p%%:*}"); lim[${p%%:*}]=${p#*:}; done
  spec=${1:-}
  IFS=, read -r -a pairs <<< "$spec"
  for p in "${pairs[@]}"; do
    [[ "$p" =~ ^([a-z]+):([1-9][0-9]*)$ && -v "lim[${BASH_REMATCH[1]}]" ]] ||
      die "STAGE_TIMEOUTS entry '$p' is not STAGE:SECONDS with STAGE one of ${order[*]} (e.g. $STAGE_TIMEOUT_DEFAULTS)"
    lim[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
  done
  for p in "${order[@]}"; do printf '%s %s\n' "$p" "${lim[$p]}"; done
}

prepare_launch() {
  local arg=$1 repo=$2 name tag
  name=${arg%%:*}
  tag=""; [[ "$arg" == *:* ]] && tag=${arg#*:}
  [[ -n "$name" ]] || die "no model given; usage: ${PROG:-$0} MODEL[:TAG] ... (models: configs/*.yml)"
  MODEL=$(resolve_model "$name" "$repo/configs") || exit 1
  MODEL_TAG=""
  if [[ -n "$tag" ]]; then
    MODEL_TAG=$(safe_name "$tag")
    [[ "$MODEL_TAG" == "$tag" ]] || echo "${PROG:-$0}: tag '$tag' written as '$MODEL_TAG' (letters, digits, . _ - only)" >&2
  fi
  # shellcheck disable=SC2034  # used by the scripts that source this file
  MODEL_NAME="JAX-$MODEL${MODEL_TAG:+-$MODEL_TAG}"

  [[ "${RAY:-0}" =~ ^[01]$ ]] || die "RAY='${RAY}' must be 0 or 1"
  case "${CONTAINER_RUNTIME:-auto}" in auto|podman|docker|none) ;;
    *) die "CONTAINER_RUNTIME='$CONTAINER_RUNTIME' is not one of auto, podman, docker, none" ;; esac
  stage_timeouts "${STAGE_TIMEOUTS:-}" >/dev/null || exit 1

  JOB_WORKSPACE=${JOB_WORKSPACE:-$repo/outputs}
  [[ "$JOB_WORKSPACE" == /* ]] || JOB_WORKSPACE="$PWD/$JOB_WORKSPACE"
  local probe
  if ! mkdir -p "$JOB_WORKSPACE" 2>/dev/null || ! probe=$(mktemp -p "$JOB_WORKSPACE" .probe.XXXXXX 2>/dev/null); then
    die "workspace '$JOB_WORKSPACE' is not a writable directory; set JOB_WORKSPACE to one (on shared storage for multi-node jobs)"
  fi
  rm -f "$probe"

  "$repo/utils/setup_env.sh" || die "could not set up the Python environment (see the messages above)"
  MST_VENV=${MAXTEXT_SLURM_VENV:-$repo/.venv}
  "$MST_VENV/bin/python" "$repo/utils/check_config.py" "$repo/configs/$MODEL.yml" || exit 1
  export MODEL MODEL_TAG JOB_WORKSPACE MST_VENV
}
