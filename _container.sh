#!/usr/bin/env bash
# Usage: _container.sh COMMAND [ARG...]
#
# Container tier: runs COMMAND (e.g. _train.sh, or bash for a shell) inside the training
# image, or natively when no runtime is used.
#   In a job, the image stage (utils/launch/image.sh) has chosen: the node's record
#   $JOB_DIR/.images/<host> names the runtime and the exact image (by ID), and that is what runs.
#   The record is refused (one line, the job fails) unless it and every directory from JOB_WORKSPACE
#   to it are ours, not links and not writable by others; its python= must be this job's MST_VENV's.
#   Without a record (run by hand): CONTAINER_RUNTIME=auto|podman|docker|none (default auto:
#   podman, then docker, each only if it has CONTAINER_IMAGE locally, then native), or
#   apptainer|singularity|pyxis|enroot with CONTAINER_IMAGE an image file (.sif, .sqsh).
#   CONTAINER_IMAGE defaults to localhost/maxtext-slurm:latest (built from the Dockerfile).
#   CONTAINER_MOUNTS adds mounts ("SRC:DST[:ro] ...", absolute paths, SRC must exist);
#   CONTAINER_ARGS adds podman or docker flags (split on spaces).
# In a container: exactly the variables of docs/env-contract.md are passed in (by name, so
# values never appear in argv), the job workspace and the code are mounted at the same
# paths, and AMD (/dev/kfd, /dev/dri) or NVIDIA GPUs are added when the node has them (under
# MST_DEV_ROOT). apptainer and enroot (pyxis) run the image file (utils/launch/runtimes/<name>.sh: the
# same mounts as binds, the variables by name through the runtime's environment, --nv/--rocm). Every
# container carries the labels mst.job=JOB_ID mst.workspace=JOB_WORKSPACE mst.scheduler=JOB_SCHEDULER.
# Sets MST_CONTAINER (the runtime used) and MST_PYTHON (the trainer's interpreter).
# podman and docker run under utils/launch/oci_run.sh: a stop signal ends the container whenever it lands.
# RDMA NICs (utils/launch/netenv.sh --container-args): /dev/infiniband, locked memory (unlimited where allowed), the
# host's verbs libraries (/etc/libibverbs.d, libibverbs, the providers of rdma_providers.tsv) read-only.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/utils/launch/lib.sh"; usage; exit; }
(( $# >= 1 )) || { echo "_container.sh: expected COMMAND [ARG...] (see --help)" >&2; exit 2; }
repo=${MST_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
source "$repo/utils/launch/lib.sh"
PROG=_container.sh

# The variables that cross into the container: the rows of utils/launch/settings.tsv whose container
# column says yes (docs/env-contract.md lists the same; tests/test_settings.py holds them equal).
mapfile -t CONTRACT_VARS < <(settings_names container)
(( ${#CONTRACT_VARS[@]} )) || die "no variable to pass into the container: utils/launch/settings.tsv is missing or empty"

image=${CONTAINER_IMAGE:-localhost/maxtext-slurm:latest}
runtime=${CONTAINER_RUNTIME:-auto}
shown_image=$image
has_image() { command -v "$1" >/dev/null 2>&1 && "$1" image inspect "$image" >/dev/null 2>&1; }
record="${JOB_DIR:-/nonexistent}/.images/${JOB_HOSTNAME:-$(hostname)}"
if [[ -n "${JOB_DIR:-}" ]] && [[ -e "$record" || -L "$record" ]]; then
  # the image stage's choice for this node (utils/launch/image.sh), not resolved again; it decides what
  # runs, so it is read only when it and every directory from the workspace to it are ours to trust
  advice="the job's own image stage writes it; resubmit in a JOB_WORKSPACE only you can write"
  if [[ -n "${JOB_WORKSPACE:-}" && "$record" == "${JOB_WORKSPACE%/}/"* ]]; then
    check_trusted_under "$JOB_WORKSPACE" "$record" "the image record" "$advice"
  else
    check_trusted "$JOB_DIR" "the image record" "$advice"
    check_trusted_under "$JOB_DIR" "$record" "the image record" "$advice"
  fi
  [[ -f "$record" ]] || die "refusing the image record $record: it is not a regular file; $advice"
  read -r -a fields < "$record"
  declare -A rec=()
  for kv in "${fields[@]}"; do rec[${kv%%=*}]=${kv#*=}; done
  runtime=${rec[runtime]:-}
  case "$runtime" in
    none)
      # only the interpreter image.sh records for this job's environment (MST_VENV), nothing else
      py=${MST_VENV:+$MST_VENV/bin/python}; py=${py:-python3}
      [[ "${rec[python]:-}" == "$py" ]] ||
        die "the image record $record names python=${rec[python]:-(none)}, not this job's environment's $py; rerun the job"
      export MST_PYTHON=$py ;;
    podman|docker|apptainer|enroot)
      [[ "${rec[digest]:-}" =~ ^sha256:[0-9a-f]{64}$ ]] || die "the image record $record has no digest=sha256:<64 hex>; rerun the job"
      image=${rec[digest]} shown_image="${rec[image]:-?} (${rec[digest]})"
      if [[ "$runtime" == apptainer || "$runtime" == enroot ]]; then   # the file whose sha256 it recorded
        image=${rec[image]:-}
        [[ "$image" == /* && -f "$image" ]] || die "the image record $record names no image file (image=${image:-?}); rerun the job"
        [[ "$image" != "${JOB_DIR%/}/"* ]] || check_trusted_under "$JOB_DIR" "$image" "the job's image file" "$advice"
      fi ;;
    *) die "the image record $record names no runtime (podman, docker, apptainer, enroot or none); rerun the job" ;;
  esac
fi
case "$runtime" in
  auto)
    if has_image podman; then runtime=podman
    elif has_image docker; then runtime=docker
    else runtime=none
    fi ;;
  podman|docker)
    command -v "$runtime" >/dev/null 2>&1 || die "CONTAINER_RUNTIME=$runtime but '$runtime' is not installed; use auto, none, or install it"
    has_image "$runtime" || die "image '$image' not found by $runtime; build it (podman build -t $image .) or set CONTAINER_IMAGE" ;;
  apptainer|singularity|pyxis|enroot)
    [[ "$runtime" == singularity ]] && runtime=apptainer
    [[ "$runtime" == pyxis ]] && runtime=enroot
    [[ "$image" == /* && -f "$image" ]] || die "CONTAINER_RUNTIME=$runtime runs an image file: set CONTAINER_IMAGE to its path (.sif, .sqsh)" ;;
  none) ;;
  *) die "CONTAINER_RUNTIME='$runtime' is not one of auto, podman, docker, apptainer, singularity, pyxis, enroot, none" ;;
esac
export MST_CONTAINER=$runtime

if [[ "$runtime" == none ]]; then
  export MST_PYTHON=${MST_PYTHON:-${MST_VENV:+$MST_VENV/bin/python}}
  : "${MST_PYTHON:=python3}"
  [[ "$1" != /* && -f "$repo/$1" ]] && set -- "$repo/$1" "${@:2}"
  exec "$@"
fi

export MST_PYTHON=python3   # the image's interpreter, which has MaxText installed
dev=$(node_root dev)
gpu=""; [[ -e "$dev/nvidiactl" ]] && gpu=nvidia; [[ -e "$dev/kfd" ]] && gpu=amd   # image.sh: kfd first
[[ "$1" != /* && -f "$repo/$1" ]] && set -- "$repo/$1" "${@:2}"
if [[ "$runtime" == apptainer || "$runtime" == enroot ]]; then
  # the podman flags below as binds (SRC:DST[:ro]); the RDMA ones from netenv.sh; locked memory is ours
  RT_BINDS=("$repo:$repo:ro") RT_ENV=() RT_GPU=$gpu RT_WORKDIR=$repo
  [[ -n "${JOB_WORKSPACE:-}" ]] && RT_BINDS+=("$JOB_WORKSPACE:$JOB_WORKSPACE")
  if [[ "${ENABLE_COREDUMPS:-0}" == 1 ]]; then
    ulimit -c unlimited 2>/dev/null || true
    [[ -n "${COREDUMP_DIR:-}" && "$COREDUMP_DIR/" != "${JOB_WORKSPACE:-}/"* ]] && mkdir -p "$COREDUMP_DIR" && RT_BINDS+=("$COREDUMP_DIR:$COREDUMP_DIR")
  fi
  [[ -n "${COMPILE_CACHE_DIR:-}" && "$COMPILE_CACHE_DIR/" != "${JOB_WORKSPACE:-}/"* ]] && mkdir -p "$COMPILE_CACHE_DIR" && RT_BINDS+=("$COMPILE_CACHE_DIR:$COMPILE_CACHE_DIR")
  container_mounts "$repo" "${JOB_WORKSPACE:-}" "${COREDUMP_DIR:-}" "${COMPILE_CACHE_DIR:-}"
  mapfile -t rdma_args < <("$repo/utils/launch/netenv.sh" --container-args)
  set_next=""
  for a in "${MOUNT_ARGS[@]}" "${rdma_args[@]}"; do
    case "$set_next" in
      bind) RT_BINDS+=("$a") ;;
      ulimit)   # memlock=BYTES[:BYTES] or -1 (podman's units); ulimit -l counts KiB
        v=${a#memlock=}; v=${v%%:*}
        if [[ "$v" == -1 ]]; then v=unlimited; else v=$(( v / 1024 )); fi
        ulimit -l "$v" 2>/dev/null || ulimit -S -l "$v" 2>/dev/null || true ;;
    esac
    case "$a" in -v|--device) set_next=bind ;; --ulimit) set_next="ulimit" ;; *) set_next="" ;; esac
  done
  for v in "${CONTRACT_VARS[@]}"; do [[ -v "$v" ]] && RT_ENV+=("$v"); done
  echo "_container.sh: $runtime image $shown_image" >&2
  # shellcheck source=utils/launch/runtimes/apptainer.sh
  source "$repo/utils/launch/runtimes/$runtime.sh"
  rt_exec "$image" "$@"
fi
args=(run --rm --network=host --ipc=host -w "$repo" -v "$repo:$repo:ro")
[[ -n "${JOB_WORKSPACE:-}" ]] && args+=(-v "$JOB_WORKSPACE:$JOB_WORKSPACE")
if [[ "${ENABLE_COREDUMPS:-0}" == 1 ]]; then   # cores in $JOB_DIR/cores or COREDUMP_DIR (utils/launch/coredump.sh)
  args+=(--ulimit core=-1)
  [[ -n "${COREDUMP_DIR:-}" && "$COREDUMP_DIR/" != "${JOB_WORKSPACE:-}/"* ]] && mkdir -p "$COREDUMP_DIR" && args+=(-v "$COREDUMP_DIR:$COREDUMP_DIR")
fi
# JAX's compilation cache (_train.sh) where COMPILE_CACHE_DIR puts it outside the workspace
[[ -n "${COMPILE_CACHE_DIR:-}" && "$COMPILE_CACHE_DIR/" != "${JOB_WORKSPACE:-}/"* ]] && mkdir -p "$COMPILE_CACHE_DIR" && args+=(-v "$COMPILE_CACHE_DIR:$COMPILE_CACHE_DIR")
container_mounts "$repo" "${JOB_WORKSPACE:-}" "${COREDUMP_DIR:-}" "${COMPILE_CACHE_DIR:-}"
args+=("${MOUNT_ARGS[@]}")
args+=(--label "mst.job=${JOB_ID:-}" --label "mst.workspace=${JOB_WORKSPACE:-}" --label "mst.scheduler=${JOB_SCHEDULER:-}")
for v in "${CONTRACT_VARS[@]}"; do [[ -v "$v" ]] && args+=(-e "$v"); done
if [[ "$gpu" == amd ]]; then
  args+=(--device "$dev/kfd:/dev/kfd" --device "$dev/dri:/dev/dri" --group-add video --security-opt seccomp=unconfined)
fi
if [[ "$gpu" == nvidia ]]; then
  if [[ "$runtime" == podman ]]; then args+=(--device nvidia.com/gpu=all); else args+=(--gpus all); fi
fi
mapfile -t rdma_args < <("$repo/utils/launch/netenv.sh" --container-args)
args+=("${rdma_args[@]}")
read -r -a extra <<< "${CONTAINER_ARGS:-}"
if [[ -t 0 ]]; then
  args+=(-it)
else
  # COMMAND is not the container's process 1, which ignores SIGTERM that it has no handler for: a small
  # sh passes the stop signals that the runtime forwards (a stage's timeout, a cancel) on to COMMAND,
  # and the container ends with it (measured: without it, `podman run` killed after its TERM left the
  # trainer running)
  # shellcheck disable=SC2016  # the script is for the container's sh
  set -- sh -c 'trap "kill -TERM \$c 2>/dev/null" TERM INT HUP; "$@" & c=$!
    while :; do wait "$c"; r=$?; kill -0 "$c" 2>/dev/null || exit "$r"; done' mst-init "$@"
fi
echo "_container.sh: $runtime image $shown_image" >&2
# interactive: the runtime's own terminal; otherwise oci_run.sh sees the container end on a stop signal
[[ -t 0 ]] && exec "$runtime" "${args[@]}" "${extra[@]}" "$image" "$@"
exec "$repo/utils/launch/oci_run.sh" "$runtime" "${args[@]:1}" "${extra[@]}" "$image" "$@"
