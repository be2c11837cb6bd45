# shellcheck shell=bash
# Usage: source utils/launch/runtimes/apptainer.sh   (by utils/launch/image.sh and _container.sh)
#
# Apptainer (and Singularity, the older name of the same CLI): the commands of the image stage's runtime
# interface, one file per runtime (utils/launch/runtimes/<name>.sh), each defining:
#   RT_SUFFIX                 the image file's suffix (CONTAINER_IMAGE=/path/x.RT_SUFFIX is run as it is)
#   rt_cli                    the command to run (prints it), or status 1 and why on stdout
#   rt_build OUT KIND SRC     make the image file OUT (a new path) from KIND=tar (a `podman save`/`docker
#                             save` archive SRC) or KIND=pull (a registry name SRC; CONTAINER_AUTH_FILE's
#                             path, never its contents, goes to the runtime); output: the runtime's own
#   rt_exec IMAGE CMD...      exec CMD in the image file IMAGE, from the arrays and values _container.sh
#                             sets: RT_BINDS (SRC:DST[:ro] each), RT_ENV (names of the variables passed in),
#                             RT_GPU (nvidia, amd or empty), RT_WORKDIR
# The command lines follow the Apptainer user guide (https://apptainer.org/docs/user/main/):
#   build/pull: cli/apptainer_build.html, cli/apptainer_pull.html (docker-archive: and docker:// sources,
#     --authfile); exec: cli/apptainer_exec.html (--bind src:dest[:ro], --nv, --rocm, --cleanenv, --no-home,
#     --pwd); environment_and_metadata.html: with --cleanenv only APPTAINERENV_NAME (SINGULARITYENV_NAME for
#     the singularity CLI) set NAME inside, so the contract's values travel in the environment, never in argv.
# Not --containall: it implies --contain (a minimal /dev, without the RDMA devices) and new PID and IPC
# namespaces, while NCCL/RCCL between the node's processes want the host's IPC (as podman's --ipc=host).
# --no-home: the trainer reads only the code and the workspace (podman mounts no home either).

# shellcheck disable=SC2034  # read by image.sh
RT_SUFFIX=sif

rt_cli() {
  local c
  for c in apptainer singularity; do
    if command -v "$c" >/dev/null 2>&1; then
      if "$c" --version >/dev/null 2>&1; then printf '%s\n' "$c"; return 0; fi
      echo "$c: '$c --version' fails"; return 1
    fi
  done
  echo "apptainer: not installed (nor singularity)"
  return 1
}

rt_build() {
  local out=$1 kind=$2 src=$3 cli
  cli=$(rt_cli) || { echo "$cli"; return 1; }
  case "$kind" in
    tar) "$cli" build "$out" "docker-archive:$src" ;;
    pull)
      local -a authfile=()
      [[ -n "${CONTAINER_AUTH_FILE:-}" ]] && authfile=(--authfile "$CONTAINER_AUTH_FILE")
      "$cli" pull "${authfile[@]}" "$out" "docker://$src" ;;
    *) echo "apptainer cannot make an image from $kind"; return 1 ;;
  esac
}

rt_exec() {
  local img=$1 cli b v prefix
  shift
  cli=$(rt_cli) || { echo "_container.sh: $cli" >&2; exit 1; }
  prefix=APPTAINERENV_; [[ "$cli" == singularity ]] && prefix=SINGULARITYENV_
  local -a args=(exec --cleanenv --no-home --pwd "$RT_WORKDIR")
  case "${RT_GPU:-}" in
    nvidia) args+=(--nv) ;;
    amd) args+=(--rocm) ;;
  esac
  for b in "${RT_BINDS[@]}"; do args+=(--bind "$b"); done
  for v in "${RT_ENV[@]}"; do export "$prefix$v=${!v}"; done
  exec "$cli" "${args[@]}" "$img" "$@"
}
