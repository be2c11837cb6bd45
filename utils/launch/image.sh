#!/usr/bin/env bash
# Usage: utils/launch/image.sh            the image stage, on every node (before preflight)
#        utils/launch/image.sh --agree    once per job, after the image stage ran on every node
#        utils/launch/image.sh --cleanup  at the job's end: removes the image files the job built
#
# The image stage decides this node's container runtime once and makes the training image present:
#   CONTAINER_RUNTIME  auto (default: podman, then docker, then apptainer, then pyxis, each only where it
#                      works; a CONTAINER_IMAGE ending in .sif: apptainer, in .sqsh: pyxis), podman, docker,
#                      apptainer (or singularity), pyxis (or enroot), or none (natively, with MST_VENV)
#                      podman and docker first: the default image is a local podman/docker one (Dockerfile),
#                      which the others can only run after a build of minutes into a file on shared storage.
#   CONTAINER_IMAGE    default localhost/maxtext-slurm:latest. Taken from the runtime's local store;
#                      else loaded from CONTAINER_IMAGE_TAR (a `podman save`/`docker save` .tar on
#                      shared storage); else pulled from its registry, with the credentials in
#                      CONTAINER_AUTH_FILE (auth.json format, readable by you only; the runtime gets
#                      the file's path, never its contents). Names under localhost/ are never pulled.
# apptainer and pyxis (utils/launch/runtimes/<name>.sh; pyxis runs enroot, the engine under Pyxis, inside
# the step: why, in runtimes/enroot.sh) run an image file: CONTAINER_IMAGE=/path/x.sif (apptainer) or
# /path/x.sqsh (pyxis) as it is; else the node of rank 0 builds one per job into $JOB_DIR/.images/image.sif
# or image.sqsh from CONTAINER_IMAGE_TAR or the registry, and the other nodes wait for it. Every node
# records the file's sha256 (reading it whole: the agreement compares the bytes each node will run).
# A node with GPUs (MST_DEV_ROOT/kfd: AMD, MST_DEV_ROOT/nvidiactl: NVIDIA; MST_DEV_ROOT defaults to
# /dev) never falls back to running natively: where no image can be had, the stage fails and says
# what was tried. Under auto a CPU-only node without the image runs natively (the local cluster, CI).
# CONTAINER_RUNTIME=none on a GPU node needs an environment made for that GPU
# (MST_ACCELERATOR=cuda|rocm utils/setup_env.sh); a CPU one is refused.
# Records $JOB_DIR/.images/<host> (a new file in a .images/ of ours, never through a link; the records
# are read only when they and the directories from JOB_WORKSPACE to them are ours), which
# _container.sh then runs exactly:
#   runtime=podman|docker image=NAME digest=sha256:ID source=local|tar|pull   (ID: `image inspect`)
#   runtime=apptainer|enroot image=FILE digest=sha256:SHA256 source=file|tar|pull   (SHA256: the file's)
#   runtime=none python=PATH accelerator=cpu|cuda|rocm
# --agree compares the records of every node of JOB_NODELIST: a missing record, or another runtime,
# image ID or accelerator than the other nodes', prints a per-node table and exits 1.
# --cleanup removes $JOB_DIR/.images/image.sif and image.sqsh (what the stage built; never a CONTAINER_IMAGE
# file of the user's) and their partial builds.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
repo=${MST_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$repo/utils/launch/lib.sh"
PROG="image: FAILED"   # how die (lib.sh: CONTAINER_MOUNTS, private_dir) starts its one line
: "${JOB_DIR:?image.sh: JOB_DIR is not set}"
rec_dir="$JOB_DIR/.images"

# GPU device file (under MST_DEV_ROOT) -> the accelerator a native environment needs for it
GPU_DEVICES=(kfd:rocm nvidiactl:cuda)

fail() { echo "image: FAILED: $*" >&2; exit 1; }
# what a failed runtime command said, in one line: its "Error: ..." line, else its last line
said() { { grep -m1 '^Error' <<< "$1" || tail -n 1 <<< "$1"; } | cut -c1-300; }

# trusted_record PATH: die with one line unless PATH (a record, or the records' directory) and every
# directory from JOB_WORKSPACE (or from JOB_DIR, outside a workspace) to it are ours to trust
trusted_record() {
  local advice="records are written by the job's own image stage; remove it and resubmit, in a JOB_WORKSPACE only you can write"
  if [[ -n "${JOB_WORKSPACE:-}" && "$1" == "${JOB_WORKSPACE%/}/"* ]]; then
    check_trusted_under "$JOB_WORKSPACE" "$1" "the image record" "$advice"
  else
    check_trusted "$JOB_DIR" "the image record" "$advice"
    check_trusted_under "$JOB_DIR" "$1" "the image record" "$advice"
  fi
}

# record FIELDS...: this node's record, written whole (a reader never sees half of it): a new file
# (never through a link) in the records' directory, made ours (own_dir; under umask 022, so that
# another node never sees it group-writable), renamed over an earlier record of this node
record() {
  local tmp umask_was
  umask_was=$(umask)
  umask 022
  own_dir "$rec_dir" 755
  trusted_record "$rec_dir"
  tmp="$rec_dir/.$host.$$"
  rm -f -- "$tmp"
  new_file "$tmp"
  umask "$umask_was"
  printf '%s\n' "$*" > "$tmp"
  mv -f -T -- "$tmp" "$rec_dir/$host"
  echo "image: this node: $*"
}

# field NAME RECORD: the value of NAME=... in a record line
field() {
  local kv
  for kv in $2; do [[ "$kv" == "$1="* ]] && { printf '%s\n' "${kv#*=}"; return 0; }; done
  return 0
}

if [[ "${1:-}" == --agree ]]; then
  read -r -a nodes <<< "${JOB_NODELIST:?image.sh: JOB_NODELIST is not set}"
  declare -A key=() rec=() count=()
  for n in "${nodes[@]}"; do
    [[ -e "$rec_dir/$n" || -L "$rec_dir/$n" ]] || continue
    trusted_record "$rec_dir/$n"
    rec[$n]=$(head -n 1 "$rec_dir/$n")
    r=$(field runtime "${rec[$n]}")
    if [[ "$r" == none ]]; then key[$n]="none accelerator=$(field accelerator "${rec[$n]}")"
    else key[$n]="$r $(field digest "${rec[$n]}")"; fi
    k=${key[$n]}
    count[$k]=$(( ${count[$k]:-0} + 1 ))
  done
  # the reference: what most nodes have (ties: the first such node in JOB_NODELIST order)
  ref="" ref_node="" best=0
  for n in "${nodes[@]}"; do
    [[ -v "key[$n]" ]] || continue
    k=${key[$n]}
    if (( ${count[$k]} > best )); then ref=$k ref_node=$n best=${count[$k]}; fi
  done
  odd=() missing=()
  for n in "${nodes[@]}"; do
    if [[ ! -v "key[$n]" ]]; then missing+=("$n")
    elif [[ "${key[$n]}" != "$ref" ]]; then odd+=("$n")
    fi
  done
  if (( ${#odd[@]} == 0 && ${#missing[@]} == 0 )); then
    echo "image: all ${#nodes[@]} node(s) agree: ${rec[$ref_node]}"
    exit 0
  fi
  w=4
  for n in "${nodes[@]}"; do (( ${#n} > w )) && w=${#n}; done
  echo "image: the nodes' images (records in $rec_dir):"
  printf 'image:   %-*s  %s\n' "$w" node record
  for n in "${nodes[@]}"; do
    if [[ ! -v "key[$n]" ]]; then mark="  <- no record"
    elif [[ "${key[$n]}" != "$ref" ]]; then mark="  <- differs"
    else mark=""; fi
    printf 'image:   %-*s  %s%s\n' "$w" "$n" "${rec[$n]:-(none: its image stage left no record)}" "$mark"
  done
  why=()
  others=""; (( best > 1 )) && others=" and $((best - 1)) other node(s)"
  (( ${#odd[@]} )) && why+=("${odd[*]} differ(s) from $ref_node$others ($ref)")
  (( ${#missing[@]} )) && why+=("no image record from ${missing[*]}")
  why_text=$(IFS=';'; echo "${why[*]}")
  fail "the nodes do not all run the same runtime and image: ${why_text//;/; }; make CONTAINER_IMAGE the same image ID on every node (e.g. load one CONTAINER_IMAGE_TAR everywhere) and resubmit"
fi
if [[ "${1:-}" == --cleanup ]]; then
  [[ -d "$rec_dir" && ! -L "$rec_dir" ]] || exit 0
  trusted_record "$rec_dir"
  find "$rec_dir" -maxdepth 1 -type f \( -name 'image.sif' -o -name 'image.sqsh' -o -name '.image.*' \) \
    -printf 'image: removing %p (built for the job)\n' -delete
  exit 0
fi
(( $# == 0 )) || { echo "image.sh: unexpected argument '$1' (expected --agree, --cleanup or nothing; see --help)" >&2; exit 2; }

host=${JOB_HOSTNAME:-$(hostname)}
image=${CONTAINER_IMAGE:-localhost/maxtext-slurm:latest}
want=${CONTAINER_RUNTIME:-auto}
case "$want" in
  auto|podman|docker|apptainer|none) ;;
  singularity) want=apptainer ;;
  pyxis|enroot) want=enroot ;;
  *) fail "CONTAINER_RUNTIME='$want' is not one of auto, podman, docker, apptainer, singularity, pyxis, enroot, none" ;;
esac
gpu="" gpu_dev="" dev=$(node_root dev)
for e in "${GPU_DEVICES[@]}"; do
  if [[ -e "$dev/${e%%:*}" ]]; then gpu=${e#*:} gpu_dev="$dev/${e%%:*}"; break; fi
done

# native: record this node's native run, after checking its environment fits the node
native() {
  local venv=${MST_VENV:-} acc=cpu py
  py=${venv:+$venv/bin/python}
  [[ -n "$venv" && -f "$venv/.mst-accelerator" ]] && read -r acc _ < "$venv/.mst-accelerator"
  if [[ -n "$gpu" && "$acc" != "$gpu" ]]; then
    fail "$host has GPUs ($gpu_dev) but CONTAINER_RUNTIME=none would run the $acc environment ${venv:-(MST_VENV unset)}; make a $gpu one with MST_ACCELERATOR=$gpu utils/setup_env.sh, or run in the image (CONTAINER_RUNTIME=auto with CONTAINER_IMAGE or CONTAINER_IMAGE_TAR)"
  fi
  if [[ -n "$py" && ! -x "$py" ]]; then
    fail "MST_VENV=$venv has no $py on $host; the environment must be on storage every node sees (MAXTEXT_SLURM_VENV)"
  fi
  record "runtime=none python=${py:-python3} accelerator=$acc"
  exit 0
}
[[ "$want" == none ]] && native

# the runtimes to try, and why the others were left out
tried=()
runtimes=()
candidates=("$want")
if [[ "$want" == auto ]]; then
  case "$image" in
    /*.sif) candidates=(apptainer) ;;
    /*.sqsh) candidates=(enroot) ;;
    *) candidates=(podman docker apptainer enroot) ;;
  esac
fi
files=()   # the runtimes that run an image file (utils/launch/runtimes/<name>.sh)
for r in "${candidates[@]}"; do
  if [[ "$r" == apptainer || "$r" == enroot ]]; then
    # shellcheck source=utils/launch/runtimes/apptainer.sh
    if no=$(source "$repo/utils/launch/runtimes/$r.sh" && rt_cli); then files+=("$r"); else tried+=("$no"); fi
  elif ! command -v "$r" >/dev/null 2>&1; then tried+=("$r: not installed")
  elif [[ "$r" == docker ]] && ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    tried+=("docker: no daemon answers")
  else runtimes+=("$r")
  fi
done
if [[ "$want" != auto && ${#runtimes[@]} == 0 && ${#files[@]} == 0 ]]; then
  fail "CONTAINER_RUNTIME=$want but ${tried[0]#*: } on $host; install it, or use CONTAINER_RUNTIME=auto"
fi
if (( ${#runtimes[@]} + ${#files[@]} )); then
  container_mounts "$repo" "${JOB_WORKSPACE:-}" "${COREDUMP_DIR:-}" "${COMPILE_CACHE_DIR:-}"   # a bad CONTAINER_MOUNTS fails here, not in training
fi

image_id() { "$1" image inspect --format '{{.Id}}' "$image" 2>/dev/null | head -n 1; }
found() {  # RUNTIME SOURCE: record the image RUNTIME now has
  local id
  id=$(image_id "$1") || true
  [[ -n "$id" ]] || fail "$1 reports no image '$image' on $host after $2"
  record "runtime=$1 image=$image digest=sha256:${id#sha256:} source=$2"
  exit 0
}

# 1. already in a runtime's local store
for r in "${runtimes[@]}"; do
  [[ -n "$(image_id "$r" || true)" ]] && found "$r" local
done
(( ${#runtimes[@]} )) && tried+=("not in the local store of ${runtimes[*]}")
r=${runtimes[0]:-}

# 2. a saved image on shared storage
if [[ -n "${CONTAINER_IMAGE_TAR:-}" ]]; then
  tar=$CONTAINER_IMAGE_TAR
  [[ -f "$tar" && -r "$tar" ]] ||
    fail "CONTAINER_IMAGE_TAR='$tar' is not a readable file on $host; point it at a saved image (podman save -o FILE.tar $image) on storage every node sees"
  if [[ -n "$r" ]]; then
    echo "image: loading $tar with $r"
    if ! out=$("$r" load -i "$tar" 2>&1); then
      fail "$r load -i $tar failed on $host: $(said "$out")"
    fi
    [[ -n "$(image_id "$r" || true)" ]] ||
      fail "CONTAINER_IMAGE_TAR=$tar holds no image named '$image' ($r: $(grep -m1 -i 'loaded' <<< "$out" | cut -c1-200)); set CONTAINER_IMAGE to the name it holds"
    found "$r" tar
  fi
  (( ${#files[@]} )) || tried+=("CONTAINER_IMAGE_TAR: no runtime to load it")
elif [[ "$image" == localhost/* ]]; then
  tried+=("no CONTAINER_IMAGE_TAR, and a localhost/ name is never pulled")
elif [[ -n "$r" ]]; then
  # 3. the registry
  auth=${CONTAINER_AUTH_FILE:-}
  auth_args=()
  if [[ -n "$auth" ]]; then
    # its path is shown nowhere (a secret-looking name: the launcher redacts its value in the log)
    [[ -f "$auth" && -r "$auth" ]] || fail "CONTAINER_AUTH_FILE is not a readable file on $host"
    mode=$(stat -L -c %a "$auth")
    (( (8#$mode & 8#077) == 0 )) ||
      fail "CONTAINER_AUTH_FILE has mode $mode: others can read your registry credentials; chmod 600 it"
    if [[ "$r" == podman ]]; then
      auth_args=(--authfile "$auth")
    else  # docker reads DIR/config.json
      cfg=$(private_dir "${TMPDIR:-/tmp}")
      trap 'rm -rf -- "$cfg"' EXIT
      ln -s -- "$(realpath -- "$auth")" "$cfg/config.json"
      auth_args=(--config "$cfg")
    fi
  fi
  echo "image: pulling $image with $r${auth:+ (credentials from CONTAINER_AUTH_FILE)}"
  if [[ "$r" == podman ]]; then pull=(podman pull -q "${auth_args[@]}" "$image")
  else pull=(docker "${auth_args[@]}" pull -q "$image"); fi
  if out=$("${pull[@]}" 2>&1); then found "$r" pull; fi
  tried+=("pull with $r: $(said "$out")")
fi

# 4. a runtime that runs an image file
# file_image RUNTIME: record the file RUNTIME runs (CONTAINER_IMAGE itself, or the one the job builds);
# returns, adding to tried, only where RUNTIME cannot run CONTAINER_IMAGE
file_image() {
  local r=$1 out src kind part failed first out_text
  # shellcheck source=utils/launch/runtimes/apptainer.sh
  source "$repo/utils/launch/runtimes/$r.sh"
  if [[ "$image" == /* ]]; then
    [[ "$image" == *".$RT_SUFFIX" ]] || { tried+=("$r runs a .$RT_SUFFIX file or a registry name, not $image"); return 0; }
    [[ -f "$image" && -r "$image" ]] || fail "CONTAINER_IMAGE=$image is not a readable file on $host; the .$RT_SUFFIX must be on storage every node sees"
    out=$image src=file
  else
    if [[ -n "${CONTAINER_IMAGE_TAR:-}" ]]; then kind=tar src=$CONTAINER_IMAGE_TAR
    elif [[ "$image" == localhost/* ]]; then tried+=("$r: no CONTAINER_IMAGE_TAR, and a localhost/ name is never pulled"); return 0
    else kind=pull src=$image; fi
    out="$rec_dir/image.$RT_SUFFIX" failed="$rec_dir/image.failed"
    first=$(read -r -a n <<< "${JOB_NODELIST:-$host}"; echo "${n[0]}")
    if [[ "${JOB_NODE_RANK:-0}" == 0 ]]; then   # one build per job, by the node of rank 0
      own_dir "$rec_dir" 755
      trusted_record "$rec_dir"
      part="$rec_dir/.image.$$.$RT_SUFFIX"
      rm -f -- "$part"
      echo "image: building $out with $r from $([[ $kind == tar ]] && echo "$src" || echo "docker://$src")"
      if ! out_text=$(rt_build "$part" "$kind" "$src" 2>&1) || [[ ! -f "$part" ]]; then
        rm -f -- "$part"
        new_file "$failed" && printf '%s\n' "$r: $(said "$out_text")" > "$failed"
        fail "$r could not build $out on $host: $(said "$out_text")"
      fi
      chmod go-w -- "$part"   # whatever the umask: the other nodes trust only a file nobody else can write
      mv -f -T -- "$part" "$out"
    else
      echo "image: waiting for $first (rank 0) to build $out"
      until [[ -e "$out" || -e "$failed" ]]; do
        [[ -e "$rec_dir/$first" ]] && fail "$first (rank 0) recorded '$(head -n 1 "$rec_dir/$first")' and builds no $out"
        sleep 2
      done
      [[ -e "$out" ]] || fail "$first (rank 0) could not build $out: $(head -c 300 "$failed")"
    fi
    trusted_record "$out"
    src=$kind
  fi
  record "runtime=$r image=$out digest=sha256:$(sha256sum -- "$out" | cut -c1-64) source=$src"
  exit 0
}
for r in "${files[@]}"; do file_image "$r"; done

# 5. no image
tried_text=$(IFS=';'; echo "${tried[*]}")
tried_text=${tried_text//;/; }
if [[ -z "$gpu" && "$want" == auto ]]; then
  echo "image: no image '$image' on $host ($tried_text): this CPU-only node runs natively"
  native
fi
provide="provide it (build or load it on every node, or set CONTAINER_IMAGE_TAR to a saved .tar on shared storage)"
if [[ -n "$gpu" ]]; then
  fail "$host has GPUs ($gpu_dev) but no image '$image' could be had ($tried_text); $provide, or run natively on purpose: CONTAINER_RUNTIME=none with a GPU environment (MST_ACCELERATOR=$gpu utils/setup_env.sh)"
fi
fail "no image '$image' could be had on $host ($tried_text); $provide, or run natively: CONTAINER_RUNTIME=none"
