# shellcheck shell=bash
# Usage: source utils/launch/runtimes/enroot.sh   (by utils/launch/image.sh and _container.sh)
#
# Enroot, the engine under Pyxis (CONTAINER_RUNTIME=pyxis or enroot): the runtime interface of
# utils/launch/runtimes/apptainer.sh (RT_SUFFIX, rt_cli, rt_build, rt_exec), with enroot's commands
# (https://github.com/NVIDIA/enroot/blob/master/doc/usage.md and doc/cmd/{import,start,create,remove,version}.md):
#   rt_build: `enroot import -o OUT docker://[REGISTRY#]IMAGE[:TAG]` (the registry before '#'), or for a
#     saved archive `podman load` and `enroot import -o OUT podman://IMAGE` (enroot reads no archive).
#     Registry credentials: enroot's own $ENROOT_CONFIG_PATH/.credentials (netrc), not CONTAINER_AUTH_FILE.
#   rt_exec: `enroot start --env NAME ... --mount SRC:DST:none:x-create=auto,rbind[,ro] ... IMAGE CMD`:
#     --env NAME takes the value from our environment (never in argv); the container's environment is
#     the image's /etc/environment plus these. A squashfs image is started directly where squashfuse
#     and fuse-overlayfs are installed (start.md, "Starting container images"); otherwise it is unpacked
#     (`enroot create --name`) into a private ENROOT_DATA_PATH, removed (`enroot remove -f`) when CMD ends.
#   GPUs: NVIDIA through enroot's 98-nvidia.sh hook (doc/standard-hooks.md), enabled by
#     NVIDIA_VISIBLE_DEVICES (all, unless set) and NVIDIA_DRIVER_CAPABILITIES (compute,utility unless
#     set); AMD: /dev/kfd and /dev/dri are mounted (enroot leaves /dev as the host's unless
#     ENROOT_RESTRICT_DEV). No workdir option: CMD runs under `sh -c 'cd DIR && exec "$@"'`.
# Why not `srun --container-image` (Pyxis itself): that option puts the whole step in the container, so
# the node stage's code copy, its hash check, run_stage.sh's limits, the image stage and preflight would
# all run inside the image, and Pyxis imports by name on each node rather than the bytes the image
# stage recorded. Running enroot inside the step keeps the tiers as they are (env vars only) and leaves
# _job.sbatch's srun unchanged; Pyxis drives the same enroot commands.

# shellcheck disable=SC2034  # read by image.sh
RT_SUFFIX=sqsh

rt_cli() {
  command -v enroot >/dev/null 2>&1 || { echo "enroot: not installed"; return 1; }
  enroot version >/dev/null 2>&1 || { echo "enroot: 'enroot version' fails"; return 1; }
  echo enroot
}

# _enroot_uri NAME: enroot's docker:// URI for a registry name (the registry, when named, before '#')
_enroot_uri() {
  local first=${1%%/*}
  if [[ "$1" == */* && ( "$first" == *.* || "$first" == *:* || "$first" == localhost ) ]]; then
    printf 'docker://%s#%s\n' "$first" "${1#*/}"
  else
    printf 'docker://%s\n' "$1"
  fi
}

rt_build() {
  local out=$1 kind=$2 src=$3
  case "$kind" in
    tar)
      command -v podman >/dev/null 2>&1 || { echo "enroot imports no archive, and podman (to load it) is not installed"; return 1; }
      podman load -q -i "$src" || return 1
      enroot import -o "$out" "podman://${CONTAINER_IMAGE:-localhost/maxtext-slurm:latest}" ;;
    pull)
      if [[ -n "${CONTAINER_AUTH_FILE:-}" ]]; then
        echo "enroot reads no CONTAINER_AUTH_FILE (auth.json); put the registry's login in \$ENROOT_CONFIG_PATH/.credentials (netrc format) and unset CONTAINER_AUTH_FILE"
        return 1
      fi
      enroot import -o "$out" "$(_enroot_uri "$src")" ;;
    *) echo "enroot cannot make an image from $kind"; return 1 ;;
  esac
}

rt_exec() {
  local img=$1 b src dst opt v data name pid rc
  shift
  local -a args=()
  if [[ "${RT_GPU:-}" == nvidia ]]; then
    export NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-all}
    export NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-compute,utility}
    RT_ENV+=(NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES)
  fi
  for v in "${RT_ENV[@]}"; do args+=(--env "$v"); done
  for b in "${RT_BINDS[@]}"; do
    IFS=: read -r src dst opt <<< "$b"
    args+=(--mount "$src:$dst:none:x-create=auto,rbind${opt:+,$opt}")
  done
  # shellcheck disable=SC2016  # the script is for the container's sh
  set -- sh -c 'cd "$1" && shift && exec "$@"' mst-cd "$RT_WORKDIR" "$@"
  if command -v squashfuse >/dev/null 2>&1 && command -v fuse-overlayfs >/dev/null 2>&1; then
    exec enroot start "${args[@]}" "$img" "$@"
  fi
  # unpacked into a private directory of this node, removed when CMD ends (or is stopped)
  data=$(private_dir "${TMPDIR:-/tmp}")
  export ENROOT_DATA_PATH=$data
  name="mst-${JOB_ID:-run}-${JOB_HOSTNAME:-$(hostname)}"
  if ! enroot create --name "$name" "$img" >&2; then rm -rf -- "$data"; die "enroot create failed for $img"; fi
  trap '[[ -n "${pid:-}" ]] && kill -TERM "$pid" 2>/dev/null' TERM INT HUP
  enroot start "${args[@]}" "$name" "$@" &
  pid=$!
  rc=0; wait "$pid" || rc=$?   # a stop signal ends the wait early: wait again for CMD's own end
  while kill -0 "$pid" 2>/dev/null; do rc=0; wait "$pid" || rc=$?; done
  enroot remove -f "$name" >/dev/null 2>&1
  rm -rf -- "$data"
  exit "$rc"
}
