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
# 5. MaxText overrides: credentials (SECRET_MAXTEXT_KEYS, e.g. hf_access_token) reach MaxText as
# M_<KEY> environment variables (MaxText reads those), never in the trainer's argv (ps shows argv).
overrides=()
while IFS= read -r kv; do
  [[ -n "$kv" ]] || continue
  if is_secret_key "${kv%%=*}"; then
    key=${kv%%=*}; key="M_${key^^}"
    export "$key=${kv#*=}"; set_vars+=("$key")
  else
    overrides+=("$kv")
  fi
done <<< "${TRAIN_OVERRIDES:-}"

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
if [[ "$mode" == shell ]]; then
  echo "_train.sh: shell in the job environment (MODEL=${MODEL:-none}, python: ${MST_PYTHON:-python3}); exit to leave" >&2
  exec bash -i
fi

[[ -n "${MODEL:-}" ]] || die "MODEL is not set (the orchestration tier sets it; see docs/env-contract.md)"
config="$repo/configs/$MODEL.yml"
[[ -f "$config" ]] || die "no config $config for MODEL=$MODEL"
: "${JOB_DIR:?_train.sh: JOB_DIR is not set}"
args=("$config" "run_name=${JOB_NAME:-maxtext}" "base_output_directory=$JOB_DIR"
      "jax_cache_dir=${JOB_WORKSPACE:-$JOB_DIR}/.jax_cache")
# a run (--run): checkpoints on; their directory is a link to the run's (utils/launch/run_alias.sh)
[[ -z "${MST_RUN:-}" ]] || args+=("enable_checkpointing=true")
cmd=("${MST_PYTHON:-python3}" -m maxtext.trainers.pre_train.train "${args[@]}" "${overrides[@]}")

if [[ "$mode" == cmd ]]; then
  shown_cmd "${cmd[@]}"
  exit 0
fi

if [[ "${ENABLE_COREDUMPS:-0}" == 1 ]]; then
  source "$repo/utils/launch/coredump.sh"
  core_setup "${MST_PYTHON:-python3}"   # cd into the core directory, ulimit -c unlimited, context.txt
fi
stray=$(compgen -v | grep -E '^M_[A-Z0-9_]+$' | grep -vxF -f <(printf '%s\n' "${set_vars[@]}") | paste -sd' ' || true)
[[ -z "$stray" ]] || echo "_train.sh: warning: MaxText reads M_<KEY> variables as config overrides; set in this environment: $stray" >&2
echo "_train.sh: rank $NODE_RANK/$NNODES, coordinator $JAX_COORDINATOR_IP:$JAX_COORDINATOR_PORT, env set: $(for v in "${set_vars[@]}"; do printf '%s=%s\n' "$v" "${!v}"; done | shown_list env)" >&2
echo "_train.sh: $(shown_cmd "${cmd[@]}")" >&2
exec "${cmd[@]}"
