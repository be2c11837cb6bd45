#!/usr/bin/env bash
# Usage: _train.sh [--shell | --print-env | --print-cmd]
#
# Training tier: composes the trainer's environment and runs MaxText on this node.
#   1. launcher defaults (only where the variable is not already set),
#   2. configs/$MODEL.env.sh if it exists,
#   3. the _env_NAME=VALUE overrides (TRAIN_ENV_OVERRIDES), which win over both;
#   4. the network of the collectives where still unset (utils/launch/netenv.sh: NCCL_SOCKET_IFNAME,
#      GLOO_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX from this node's interfaces and RDMA ports);
# then maps the generic job variables to MaxText's multi-process initialisation
# (JAX_COORDINATOR_IP/PORT, NNODES, NODE_RANK) and runs
#   $MST_PYTHON -m maxtext.trainers.pre_train.train configs/$MODEL.yml <job keys> <TRAIN_OVERRIDES>
#   --shell      open an interactive shell in that environment instead (MODEL optional)
#   --print-env  print the variables this tier set, then exit
#   --print-cmd  print the trainer command line, then exit
# Reads the variables listed in docs/env-contract.md; knows nothing of the scheduler.
set -euo pipefail
mode=run
case "${1:-}" in
  -h|--help) source "$(dirname "${BASH_SOURCE[0]}")/utils/launch/lib.sh"; usage; exit ;;
  --shell) mode=shell ;; --print-env) mode="env" ;; --print-cmd) mode=cmd ;;
  "") ;;
  *) echo "_train.sh: unknown argument '$1' (expected --shell, --print-env, --print-cmd or --help)" >&2; exit 2 ;;
esac
repo=${MST_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
source "$repo/utils/launch/lib.sh"
PROG=_train.sh
set_vars=()

# 1. launcher defaults
for kv in PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.93 TF_CPP_MIN_LOG_LEVEL=0; do
  [[ -v "${kv%%=*}" ]] || { export "${kv?}"; set_vars+=("${kv%%=*}"); }
done
# 2. the model's env file (only plain export lines and comments, see configs/)
if [[ -n "${MODEL:-}" && -f "$repo/configs/$MODEL.env.sh" ]]; then
  mapfile -t model_vars < <(sed -n 's/^[[:space:]]*export[[:space:]]\{1,\}\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "$repo/configs/$MODEL.env.sh")
  # shellcheck disable=SC1090
  source "$repo/configs/$MODEL.env.sh"
  set_vars+=("${model_vars[@]}")
fi
# 3. _env_ overrides from the command line
while IFS= read -r kv; do
  [[ -n "$kv" ]] || continue
  export "${kv?}"; set_vars+=("${kv%%=*}")
done <<< "${TRAIN_ENV_OVERRIDES:-}"
# 4. the network of the collectives, only where none of the above set it (the same rule on every node)
while IFS= read -r kv; do
  [[ "$kv" == [A-Z]*=* && ! -v "${kv%%=*}" ]] || continue
  export "${kv?}"; set_vars+=("${kv%%=*}")
done < <("$repo/utils/launch/netenv.sh" --print)
# 5. MaxText overrides. A credential never reaches MaxText's config: MaxText writes its whole config
# into TensorBoard's text summaries (event files whoever reads the job directory reads), and copies
# HF_TOKEN into it. The Hugging Face token (hf_access_token=..., or HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
# M_HF_ACCESS_TOKEN in the environment, e.g. from _env_HF_TOKEN) goes into a private file that the
# Hugging Face libraries read (HF_TOKEN_PATH), and none of those variables reaches the trainer:
# MaxText's hf_access_token stays unset, so its downloads send the file's token. Never in argv either
# (ps shows argv).
overrides=() hf_token=""
while IFS= read -r kv; do
  [[ -n "$kv" ]] || continue
  key=${kv%%=*}
  if is_secret_key "$key"; then
    [[ "${key##*.}" == hf_access_token ]] ||
      die "the MaxText key $key is a credential MaxText would write into TensorBoard; pass the Hugging Face token as hf_access_token=... or _env_HF_TOKEN instead"
    hf_token=${kv#*=}
  else
    overrides+=("$kv")
  fi
done <<< "${TRAIN_OVERRIDES:-}"
for v in M_HF_ACCESS_TOKEN HF_TOKEN HUGGING_FACE_HUB_TOKEN; do
  [[ -z "$hf_token" && -n "${!v:-}" ]] && hf_token=${!v}
  unset "$v"
done
kept=()
for v in "${set_vars[@]}"; do [[ -v "$v" ]] && kept+=("$v"); done
set_vars=("${kept[@]}")
if [[ -n "$hf_token" ]]; then
  export HF_TOKEN_PATH="<a private file, made at launch>"; set_vars+=(HF_TOKEN_PATH)
fi
# the trainer's Python never imports from its working directory (nor do the Pythons it starts)
export PYTHONSAFEPATH=1; set_vars+=(PYTHONSAFEPATH)

# Multi-process JAX from the generic job variables (MaxText's hardware=gpu path; on CPU
# JAX_PLATFORMS=cpu keeps it there). One process per node drives all of the node's devices.
export JAX_COORDINATOR_IP=${JOB_COORDINATOR_ADDR:-127.0.0.1}
export JAX_COORDINATOR_PORT=${JOB_COORDINATOR_PORT:-$(free_port 61440)}
export JAX_COORDINATOR_BIND_ADDRESS="$JAX_COORDINATOR_IP:$JAX_COORDINATOR_PORT"
export NNODES=${JOB_NUM_NODES:-1} NODE_RANK=${JOB_NODE_RANK:-0}
set_vars+=(JAX_COORDINATOR_IP JAX_COORDINATOR_PORT JAX_COORDINATOR_BIND_ADDRESS NNODES NODE_RANK)

if [[ "$mode" == env ]]; then
  for v in "${set_vars[@]}"; do shown_kv env "$v=${!v}"; done | awk '!seen[$0]++'
  exit 0
fi
# hf_token_file: the Hugging Face token in a new file only we can read, in this node's private job
# scratch (utils/launch/lib.sh job_scratch: labelled, so preflight removes what a killed job left);
# removed when this process, the trainer after exec, ends.
hf_token_file() {
  local d
  d=$(job_scratch) || exit 1
  (umask 077; new_file "$d/hf_token") || exit 1
  printf '%s\n' "$hf_token" > "$d/hf_token"
  export HF_TOKEN_PATH="$d/hf_token"
  (
    trap '' HUP INT TERM
    while kill -0 "$1" 2>/dev/null; do sleep 2; done
    rm -rf -- "$d"
  ) < /dev/null > /dev/null 2>&1 &
}

if [[ "$mode" == shell ]]; then
  [[ -z "$hf_token" ]] || hf_token_file $$
  echo "_train.sh: shell in the job environment (MODEL=${MODEL:-none}, python: ${MST_PYTHON:-python3}); exit to leave" >&2
  exec bash -i
fi

[[ -n "${MODEL:-}" ]] || die "MODEL is not set (the orchestration tier sets it; see docs/env-contract.md)"
config="$repo/configs/$MODEL.yml"
[[ -f "$config" ]] || die "no config $config for MODEL=$MODEL"
: "${JOB_DIR:?_train.sh: JOB_DIR is not set}"
# JAX's compilation cache holds compiled programs, that is code: the user's own. With
# COMPILE_CACHE_DIR (a node's own disk, or a place every node shares) it is COMPILE_CACHE_DIR/<user>,
# a private directory; else in the user's root of the workspace (MST_USER_ROOT,
# docs/security.md#shared-workspaces), else in the job's directory
if [[ -n "${COMPILE_CACHE_DIR:-}" ]]; then
  cache_dir="${COMPILE_CACHE_DIR%/}/$(id -un)"
else
  cache_dir=${MST_USER_ROOT:-$JOB_DIR}/.jax_cache
fi
args=("$config" "run_name=${JOB_NAME:-maxtext}" "base_output_directory=$JOB_DIR" "jax_cache_dir=$cache_dir")
# a run (--run): checkpoints on; their directory is a link to the run's (utils/launch/run_alias.sh)
[[ -z "${MST_RUN:-}" ]] || args+=("enable_checkpointing=true")
py=${MST_PYTHON:-python3}
cmd=("$py" -P -m maxtext.trainers.pre_train.train "${args[@]}" "${overrides[@]}")

if [[ "$mode" == cmd ]]; then
  shown_cmd "${cmd[@]}"
  exit 0
fi

# -P (Python >= 3.11): the working directory is not on the import path. An older Python would import
# from it, and cannot run MaxText 0.2.5 (>= 3.12) anyway: refused.
if ! "$py" -I -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  v=$("$py" -I -c 'import platform; print(platform.python_version())' 2>/dev/null) ||
    die "cannot run the trainer's Python '$py' on ${JOB_HOSTNAME:-$(hostname)}; check MST_VENV (MAXTEXT_SLURM_VENV) or the image"
  die "the trainer's Python '$py' is $v: older than 3.11 it would import from its working directory (no -P); MaxText 0.2.5 needs Python >= 3.12 (utils/setup_env.sh)"
fi
[[ -z "${MST_USER_ROOT:-}" ]] ||
  check_trusted_under "${JOB_WORKSPACE:?}" "$MST_USER_ROOT" "your root in the workspace" "it holds the compilation cache; use a JOB_WORKSPACE of your own"
if [[ -n "${COMPILE_CACHE_DIR:-}" ]]; then
  mkdir -p -- "$COMPILE_CACHE_DIR" 2>/dev/null ||
    die "cannot create COMPILE_CACHE_DIR=$COMPILE_CACHE_DIR on ${JOB_HOSTNAME:-$(hostname)}; set it to a writable place (or unset it: the cache then goes to the workspace)"
  # one that someone else made first, a link, or one others may write is refused (own_dir)
  (umask 077; own_dir "$cache_dir" 700) || exit 1
elif [[ -e "$cache_dir" || -L "$cache_dir" ]]; then
  check_trusted "$cache_dir" "JAX's compilation cache" "it holds compiled programs; remove it"
elif [[ -d "${cache_dir%/*}" ]]; then
  own_dir "$cache_dir"
fi
[[ -z "$hf_token" ]] || hf_token_file $$
if [[ "${ENABLE_COREDUMPS:-0}" == 1 ]]; then
  source "$repo/utils/launch/coredump.sh"
  core_setup "$py"   # cd into the (private) core directory, ulimit -c unlimited, context.txt
fi
stray=$(compgen -v | grep -E '^M_[A-Z0-9_]+$' | grep -vxF -f <(printf '%s\n' "${set_vars[@]}") | paste -sd' ' || true)
[[ -z "$stray" ]] || echo "_train.sh: warning: MaxText reads M_<KEY> variables as config overrides; set in this environment: $stray" >&2
echo "_train.sh: rank $NODE_RANK/$NNODES, coordinator $JAX_COORDINATOR_IP:$JAX_COORDINATOR_PORT, env set: $(for v in "${set_vars[@]}"; do printf '%s=%s\n' "$v" "${!v}"; done | shown_list env)" >&2
echo "_train.sh: $(shown_cmd "${cmd[@]}")" >&2
exec "${cmd[@]}"
