# shellcheck shell=bash
# Launch-time checks shared by submit.sh and run_local.sh (source after lib.sh).
#   stage_timeouts [SPEC]     print "STAGE SECONDS" per stage, defaults overlaid with SPEC
#                             (STAGE_TIMEOUTS syntax "image:1800,preflight:600,train:86400"); dies on bad input
#   check_settings            every setting of utils/launch/settings.tsv that is set, checked as its
#                             row says; dies with a one-line reason on the first bad one
#   check_sbatch_flags FLAG...  dies on a flag that contradicts what submit.sh sets itself
#   prepare_launch MODEL[:TAG] REPO [NODES [IGNORE_MIN]]
#                             resolve and check everything a launch needs before any side effect;
#                             applies the site file (utils/launch/site.sh: where the environment
#                             has not set a variable), exports MODEL MODEL_TAG JOB_WORKSPACE MST_VENV
#                             MST_SITE_APPLIED, sets MODEL_NAME, SITE_SBATCH and the config's minimum
#                             (CONFIG_MIN_NODES, CONFIG_GPUS_PER_NODE, CONFIG_MIN_WHY; empty for a
#                             config without a "# Minimum nodes:" line); with NODES (submit.sh) a
#                             count below that minimum is refused unless IGNORE_MIN is 1; dies with a
#                             one-line reason on bad input
#   gpu_request NODES FLAG... the job's GPUs (after site_sbatch; FLAG... the user's sbatch flags):
#                             exports JOB_GPUS_PER_NODE (the count preflight checks; unset: none)
#                             and MST_GPU_REQUEST (the job header's gpus: line), sets GPU_SBATCH
#                             (--gpus-per-node=N, or nothing when a GPU flag was given, the count
#                             is 0 or unknown, or SITE_GPU_REQUEST=0)
#   make_workspace            create JOB_WORKSPACE (the first side effect of a launch)
#   user_root_path            print $JOB_WORKSPACE/<user>, this user's root in the workspace
#   make_user_root            make the user's root, its .snapshots/ and runs/ ours (own_dir, 0755),
#                             or die with one line (someone else's, a link, writable by others)
#   move_aside_job BASE       an earlier job's log BASE.log and dir BASE (those that exist) are
#                             renamed with one suffix, PATH.earlier-<UTC time>[-XXXX], free for both
#                             (utils/diagnosis/jobdir.py pairs them by it), never overwritten; says
#                             so on stderr; a PATH that is not ours (someone else's, or a link
#                             someone put there) is refused with one line
#   check_attention_here fail|warn REPO
#                             only with CONTAINER_RUNTIME=none (the trainer is $MST_VENV/bin/python):
#                             that interpreter has the modules of the config's attention kernel
#                             (utils/launch/check_attention.py); fail: dies with its line (run_local.sh
#                             trains here), warn: prints it as a warning (submit.sh: the nodes run the
#                             same MST_VENV path, but their files may differ; preflight decides)

source "$(dirname "${BASH_SOURCE[0]}")/site.sh"

STAGE_TIMEOUT_DEFAULTS=$(setting_default STAGE_TIMEOUTS)
STAGE_TIMEOUT_MAX=31536000   # one year
# shellcheck disable=SC2034  # used by submit.sh
MAX_NODES=10000

stage_timeouts() {
  local spec p
  local -A lim=()
  local -a order=() pairs=()
  IFS=, read -r -a pairs <<< "$STAGE_TIMEOUT_DEFAULTS"
  for p in "${pairs[@]}"; do order+=("${p%%:*}"); lim[${p%%:*}]=${p#*:}; done
  spec=${1:-}
  [[ "$spec" != *$'\n'* ]] || die "STAGE_TIMEOUTS has a line break; write one line like $STAGE_TIMEOUT_DEFAULTS"
  IFS=, read -r -a pairs <<< "$spec"
  for p in "${pairs[@]}"; do
    if ! [[ "$p" =~ ^([a-z]+):([1-9][0-9]{0,7})$ && -v "lim[${BASH_REMATCH[1]}]" ]] || (( BASH_REMATCH[2] > STAGE_TIMEOUT_MAX )); then
      die "STAGE_TIMEOUTS entry '$p' is not STAGE:SECONDS with STAGE one of ${order[*]} and 1 <= SECONDS <= $STAGE_TIMEOUT_MAX (e.g. $STAGE_TIMEOUT_DEFAULTS)"
    fi
    lim[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
  done
  for p in "${order[@]}"; do printf '%s %s\n' "$p" "${lim[$p]}"; done
}

# check_settings: every row of the settings table with a check (utils/launch/settings.tsv) whose
# variable is set; the first bad value dies with one line: NAME='VALUE', what it must be, the row's doc.
check_settings() {
  local name check doc v want lo hi
  while IFS=$'\t' read -r name _ check _ _ _ doc; do
    [[ "$check" == - || "$check" == renamed:* || ! -v "$name" ]] && continue
    v=${!name}
    [[ -n "$v" || "$check" == int:* || "$check" == loopback ]] || continue
    want=""
    case "$check" in
      bool) [[ "$v" =~ ^[01]$ ]] || want="must be 0 or 1" ;;
      int:*) IFS=: read -r want lo hi <<< "$check"; want=""
        if ! [[ "$v" =~ ^[0-9]{1,15}$ ]] || (( 10#$v < lo || 10#$v > hi )); then
          want="must be a whole number from $lo to $hi"
        fi ;;
      abspath) [[ "$v" == /* ]] || want="must be an absolute path (a file every node sees)" ;;
      plainname) [[ "$v" =~ ^[A-Za-z0-9._@+-]{1,128}$ ]] || want="must be a name of letters, digits and . _ @ + -" ;;
      plainpath) [[ "$v" =~ ^/[A-Za-z0-9._/+@,=-]*$ ]] ||
        want="must be an absolute path of letters, digits and . _ / + @ , = -" ;;
      loopback) [[ "$v" =~ ^(127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|::1|localhost)$ ]] ||
        want="must be a loopback address (e.g. 127.0.0.1)" ;;
      exe) [[ -f "$v" && -x "$v" ]] || want="is not an executable file; point it at one or unset it" ;;
      enum:*) [[ ",${check#enum:}," == *",$v,"* ]] || want="is not one of ${check#enum:}"; want=${want//,/, } ;;
      fn:*) "${check#fn:}" "$v" >/dev/null || exit 1 ;;
      *) die "utils/launch/settings.tsv: $name has the unknown check '$check'" ;;
    esac
    [[ -z "$want" ]] || die "$name='$v' $want; $name is $doc"
  done < <(settings_rows)
  return 0
}

# check_auth_file PATH: the registry credentials file is an absolute path, not readable by others.
check_auth_file() {
  [[ "$1" == /* ]] || die "CONTAINER_AUTH_FILE='$1' must be an absolute path (a file every node sees)"
  if [[ -f "$1" ]] && (( (8#$(stat -L -c %a "$1") & 8#077) != 0 )); then
    die "CONTAINER_AUTH_FILE='$1' has mode $(stat -L -c %a "$1"): others can read your registry credentials; chmod 600 it"
  fi
}

# check_mounts / check_host_settings VALUE: CONTAINER_MOUNTS' shape, PREFLIGHT_HOST_SETTINGS' names
# and values (the table's fn: checks).
check_mounts() { container_mounts --shape; }
check_host_settings() {
  local bad
  bad=$(host_settings "$1" 2>&1 >/dev/null) || die "$bad"
}

# sbatch options submit.sh sets itself (long names); a user's flag for one of them, or an
# abbreviation sbatch would take for one (sbatch accepts unique prefixes), is refused.
SBATCH_OWN_LONG="job-name output error open-mode nodes ntasks-per-node export wrap array"
check_sbatch_flags() {
  local f name o
  for f in "$@"; do
    case "$f" in
      -J*|-o*|-e*) die "sbatch flag '$f' contradicts submit.sh, which names the job (MODEL:TAG) and its log (\$JOB_WORKSPACE/<jobid>-JAX-<model>.log)" ;;
      --?*)
        name=${f#--}; name=${name%%=*}
        for o in $SBATCH_OWN_LONG; do
          [[ "$o" == "$name"* ]] || continue
          [[ "$o" == nodes ]] && die "sbatch flag '$f' (--nodes): give the node count as -N NODES"
          die "sbatch flag '$f' (--$o) contradicts submit.sh, which sets --$o itself (see docs/security.md)"
        done ;;
    esac
  done
}

# check_workspace DIR: DIR is an absolute path of plain characters, and is (or can be made) a
# writable directory. Nothing is created.
check_workspace() {
  local ws=$1 bad p
  bad=$(LC_ALL=C tr -d 'A-Za-z0-9._/+@,=-' <<< "$ws" | tr -d '\n' | cut -c1)
  [[ -z "$bad" ]] ||
    die "JOB_WORKSPACE '$ws' has the character '$bad'; use a path of letters, digits and . _ / + @ , = - only (sbatch, Prometheus and the links need plain paths)"
  p=$ws
  while [[ ! -e "$p" ]]; do p=$(dirname "$p"); done
  [[ -d "$p" && -w "$p" && -x "$p" ]] ||
    die "workspace '$ws' is not a writable directory; set JOB_WORKSPACE to one (on shared storage for multi-node jobs)"
}

make_workspace() {
  local probe
  if ! mkdir -p "$JOB_WORKSPACE" 2>/dev/null || ! probe=$(mktemp -p "$JOB_WORKSPACE" .probe.XXXXXX 2>/dev/null); then
    die "workspace '$JOB_WORKSPACE' is not a writable directory; set JOB_WORKSPACE to one (on shared storage for multi-node jobs)"
  fi
  rm -f "$probe"
}

# A shared workspace (1777 scratch, 2775 group directory) holds one root per user: nobody else can
# write into it, so the snapshots (the code a job runs) and the runs (checkpoints) below it are
# the user's alone (docs/security.md#shared-workspaces).
user_root_path() {
  printf '%s/%s\n' "$JOB_WORKSPACE" "$(id -un)"
}

make_user_root() {
  local root
  root=$(user_root_path)
  own_dir "$root"
  own_dir "$root/.snapshots"
  own_dir "$root/runs"
}

move_aside() {  # PATH WHAT SUFFIX
  local path=$1 what=$2 dest=$1.$3
  [[ -e "$path" || -L "$path" ]] || return 0
  # only an earlier job's file of ours moves aside; a name someone else made (a link at the next
  # job's log path) is theirs: the job must not start with it
  [[ "$(stat -c %u -- "$path" 2>/dev/null)" == "$EUID" && ! -L "$path" ]] ||
    die "refusing the $what path $path: it $(trust_problem "$path"); someone put it there before this job could make it: ask them to remove it, or use a JOB_WORKSPACE of your own"
  mv -n -- "$path" "$dest" || die "cannot move the earlier $what '$path' aside; move it yourself and retry"
  echo "${PROG:-launch}: $what '$path' belonged to an earlier job with the same id; moved it to '$dest'" >&2
}

move_aside_job() {
  local base=$1 suffix
  # one suffix for both (two calls of date may fall in two seconds), free for both
  suffix="earlier-$(date -u +%Y%m%dT%H%M%SZ)"
  local stamp=$suffix
  while [[ -e "$base.log.$suffix" || -L "$base.log.$suffix" || -e "$base.$suffix" || -L "$base.$suffix" ]]; do
    suffix=$(mktemp -u "$stamp-XXXX")
  done
  move_aside "$base.log" log "$suffix"
  move_aside "$base" "job dir" "$suffix"
}

prepare_launch() {
  local arg=$1 repo=$2 nodes=${3:-} ignore_min=${4:-0} name tag msg out
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

  settings_renamed   # old names hand their values to the new ones, with a warning each
  site_load "$repo"
  # a bad value that came from the site file is blamed on it
  if msg=$(check_settings 2>&1); then [[ -z "$msg" ]] || printf '%s\n' "$msg" >&2
  else die "$(site_blame "${msg#*: }")"; fi
  JOB_WORKSPACE=${JOB_WORKSPACE:-$repo/outputs}
  [[ "$JOB_WORKSPACE" == /* ]] || JOB_WORKSPACE="$PWD/$JOB_WORKSPACE"
  check_workspace "$JOB_WORKSPACE"

  "$repo/utils/setup_env.sh" || exit 1 # its last line says what failed and what to install or fix
  MST_VENV=${MAXTEXT_SLURM_VENV:-$repo/.venv}
  # the config's minimum node count and GPUs per node (its header: utils/launch/config_header.py)
  out=$(config_header minimum "$repo/configs/$MODEL.yml" ${SITE_GPU_MEMORY_GB:+"$SITE_GPU_MEMORY_GB"} 2>&1) ||
    die "${out#config_header.py: }"
  IFS=$'\t' read -r CONFIG_MIN_NODES CONFIG_GPUS_PER_NODE CONFIG_MIN_WHY <<< "$out"
  if [[ -n "$nodes" && -n "$CONFIG_MIN_NODES" ]] && (( nodes < CONFIG_MIN_NODES && ignore_min != 1 )); then
    die "$MODEL needs at least $CONFIG_MIN_NODES nodes, -N $nodes is fewer ($CONFIG_MIN_WHY): give -N $CONFIG_MIN_NODES or more, or --ignore-min-nodes to submit anyway"
  fi
  # the config's keys and the MaxText overrides against MaxText's schema (overrides by environment:
  # they may hold secrets)
  TRAIN_OVERRIDES=${TRAIN_OVERRIDES:-} "$MST_VENV/bin/python" "$repo/utils/launch/check_config.py" "$repo/configs/$MODEL.yml" || exit 1
  export MODEL MODEL_TAG JOB_WORKSPACE MST_VENV MST_SITE_APPLIED
}

check_attention_here() {
  local mode=$1 repo=$2 out rc=0
  [[ "${CONTAINER_RUNTIME:-auto}" == none && -x "$MST_VENV/bin/python" ]] || return 0
  out=$(TRAIN_OVERRIDES=${TRAIN_OVERRIDES:-} PYTHONPATH="$repo/utils${PYTHONPATH:+:$PYTHONPATH}" \
    "$MST_VENV/bin/python" "$repo/utils/launch/check_attention.py" "$repo/configs/$MODEL.yml" 2>&1) || rc=$?
  (( rc == 1 )) || return 0
  [[ "$mode" == fail ]] && die "${out#attention: FAILED: }"
  echo "${PROG:-launch}: warning: ${out#attention: FAILED: } (preflight checks it again on each node)" >&2
}

# gpu_flag FLAG...: the first GPU request among sbatch FLAGs (--gpus-per-node, --gpus-per-task,
# --gres=gpu..., -G/--gpus; a value in the flag or the next word) as "FLAG<TAB>NAME<TAB>COUNT": the
# flag as given, its long or short name, its count (TYPE:N -> N; -G/--gpus: the job's total);
# status 1 when there is none.
gpu_flag() {
  local f v name
  while (( $# )); do
    f=$1 v=""; shift
    case "$f" in
      --gpus-per-node=*|--gpus-per-task=*|--gpus=*|--gres=*) name=${f%%=*} v=${f#*=} ;;
      --gpus-per-node|--gpus-per-task|--gpus|--gres|-G) name=$f v=${1:-}; f+=" ${1:-}"; shift || true ;;
      -G?*) name=-G v=${f#-G} ;;
      *) continue ;;
    esac
    if [[ "$name" == --gres ]]; then
      [[ ",$v" == *,gpu* ]] || continue   # --gres=nvme:1 asks for no GPU
      v=${v#*gpu}; v=${v%%,*}; [[ -n "$v" ]] || v=:1
      v=${v##*:}
    else
      v=${v##*:}
    fi
    printf '%s\t%s\t%s\n' "$f" "$name" "$v"
    return 0
  done
  return 1
}

# shellcheck disable=SC2034  # GPU_SBATCH: used by submit.sh
gpu_request() {
  local nodes=$1 n="" from="" by="" flag_out="" f="" name v req=""
  shift
  GPU_SBATCH=()
  local site_count=0; [[ " ${SITE_SET[*]:-} " == *" JOB_GPUS_PER_NODE "* ]] && site_count=1
  if flag_out=$(gpu_flag "$@"); then by=yours
  elif flag_out=$(gpu_flag "${SITE_SBATCH_KEPT[@]}"); then by=site
  fi
  if [[ -n "$by" ]]; then
    IFS=$'\t' read -r f name v <<< "$flag_out"
    if [[ "$v" =~ ^[0-9]+$ ]]; then
      if [[ "$name" == -G || "$name" == --gpus ]]; then
        (( v % nodes == 0 )) && v=$((v / nodes)) || v=""
      fi
    else
      v=""
    fi
  fi
  if [[ -v JOB_GPUS_PER_NODE ]] && (( ! site_count )); then n=$JOB_GPUS_PER_NODE from="JOB_GPUS_PER_NODE=$n, your environment"
  elif [[ "$by" == yours ]]; then n=$v   # the flag says it
  elif [[ -v JOB_GPUS_PER_NODE ]]; then n=$JOB_GPUS_PER_NODE from="JOB_GPUS_PER_NODE=$n, the site file"
  elif [[ "$by" == site ]]; then n=$v
  elif [[ -n "${CONFIG_GPUS_PER_NODE:-}" ]]; then n=$CONFIG_GPUS_PER_NODE from="configs/$MODEL.yml"
  fi
  if [[ "$by" == yours ]]; then req="asked by your $f"
  elif [[ "$by" == site ]]; then req="asked by the site's $f"
  elif [[ -n "$n" ]] && (( n > 0 )); then
    if [[ "${SITE_GPU_REQUEST:-1}" == 0 ]]; then req="not asked of Slurm: SITE_GPU_REQUEST=0 (whole nodes)"
    else GPU_SBATCH=("--gpus-per-node=$n") req="asked by --gpus-per-node=$n"; fi
  fi
  if [[ -z "$n" && -z "$by" ]]; then
    unset JOB_GPUS_PER_NODE
    MST_GPU_REQUEST="none (configs/$MODEL.yml names no GPUs: none asked, no GPU count check)"
  elif [[ -z "$n" ]]; then
    unset JOB_GPUS_PER_NODE
    MST_GPU_REQUEST="$req; the count per node is not known here: not checked (set JOB_GPUS_PER_NODE to check it)"
  elif (( n == 0 )); then
    export JOB_GPUS_PER_NODE=$n
    MST_GPU_REQUEST="none (${from:-$req})"
  else
    export JOB_GPUS_PER_NODE=$n
    MST_GPU_REQUEST="$n per node${from:+ ($from)}, $req; preflight fails a node that shows fewer"
  fi
  export MST_GPU_REQUEST
}
