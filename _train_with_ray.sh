#!/usr/bin/env bash
# Usage: _train_with_ray.sh
#
# Training tier with observability (RAY=1), run on every node in place of _train.sh.
# Every node: makes its private scratch (utils/launch/lib.sh job_scratch; no private scratch, no job),
# saves the trainer's environment there, starts the metrics exporter (utils/observe/metrics_exporter.py,
# bound to the node's address so only the cluster can scrape it; 127.0.0.1 for a one-node job) and
# its part of the Ray cluster (utils/observe/ray_cluster.sh: token-authenticated, temp dir in the scratch).
# Node rank 0 also starts Prometheus and TensorBoard (utils/observe/job_services.sh), prints the OBSERVE
# block, and runs _ray_actor.py, which trains through one thin actor per node. The other nodes
# wait until the head reports the end ($JOB_DIR/ray/done). If Ray cannot start or nodes cannot
# join, every node says so and falls back to the plain launch (_train.sh), metrics still on.
# At the end each node keeps its Ray logs in $JOB_DIR/ray/logs-<host> (regular files only) and
# removes its scratch. Reads the variables of docs/env-contract.md; stops only what it started.
set -uo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/utils/launch/lib.sh"; usage; exit; }
repo=${MST_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
source "$repo/utils/launch/lib.sh"
PROG=_train_with_ray.sh
: "${JOB_DIR:?}" "${JOB_ID:?}"
host=${JOB_HOSTNAME:-$(hostname)} rank=${JOB_NODE_RANK:-0}
export JOB_HOSTNAME=$host
read -r -a addrs <<< "${JOB_NODE_ADDRS:-}"
addr=${addrs[$rank]:-127.0.0.1}
(( ${JOB_NUM_NODES:-1} > 1 )) || addr=127.0.0.1  # one node: nothing outside needs to reach it
py=${MST_PYTHON:-python3}
ray_dir="$JOB_DIR/ray"
mkdir -p "$ray_dir" "$JOB_DIR/metrics/targets"
join_timeout=${RAY_JOIN_TIMEOUT:-120}
say() { echo "_train_with_ray.sh: $*"; }

# This node's private scratch (new, 0700, ours: nobody else can have made it or look inside):
# Ray's temp dir, the saved environment, the exporter's plugin state. If it cannot be made
# (job_scratch says why), the job fails here: it never falls back to a shared path.
scratch=$(job_scratch) || exit 1

# The trainer's environment, saved before Ray touches anything (mode 600: it may hold _env_
# secrets; never Ray's token variables). MST_RAY_OWNER marks every process started for this node,
# trainers included. MST_JOB_SCRATCH, exported after, reaches Ray and through it each actor,
# which reads the environment from its own node's scratch.
export MST_RAY_OWNER="$JOB_ID:$host"
(umask 077; env -0 -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN -u RAY_AUTH_TOKEN_PATH > "$scratch/job.env")
export MST_JOB_SCRATCH=$scratch
unset RAY_AUTH_TOKEN  # a token from the caller's environment would win over the job's own

# keep_ray_logs: this node's Ray session logs into the job dir. Only regular files are copied,
# and no symbolic link is followed (a link in Ray's world-writable temp dir must not copy whatever
# it points at into the job dir).
keep_ray_logs() {
  local s dest="$ray_dir/logs-$host"
  for s in "$scratch/ray"/session_2*; do
    [[ -d "$s/logs" && ! -L "$s" && ! -L "$s/logs" ]] || continue
    mkdir -p "$dest"
    (cd "$s/logs" && find . -type f -print0 | xargs -0 -r cp -P --parents -t "$dest") 2>/dev/null
  done
  return 0
}

exporter_pid=""
cleanup() {
  trap '' TERM INT HUP
  # Ray (and with it the trainers its actors spawned) first: Ray's daemons leave the job's
  # process tree, so Slurm's SIGKILL after a cancel (KillWait) would not reach them if this
  # cleanup were cut short. Then Prometheus before the exporter: a scrape of an exporter already
  # gone would mark its series stale at the end.
  "$repo/utils/observe/ray_cluster.sh" stop
  (( rank == 0 )) && "$repo/utils/observe/job_services.sh" stop
  [[ -n "$exporter_pid" ]] && kill -TERM "$exporter_pid" 2>/dev/null && wait "$exporter_pid" 2>/dev/null
  keep_ray_logs
  # the token is of no use once the cluster is gone
  (( rank == 0 )) && rm -rf -- "$ray_dir/auth"
  rm -rf -- "$scratch"
  return 0
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

"$py" "$repo/utils/observe/metrics_exporter.py" --bind "$addr" --port "$(free_port 9400)" \
  --interval "${METRICS_INTERVAL:-5}" --host "$host" --node-rank "$rank" --job-dir "$JOB_DIR" \
  --state-dir "$scratch/exporter" \
  --sd-file "$JOB_DIR/metrics/targets/$host-node.json" --log "$JOB_DIR/metrics/exporter-$host.log" >/dev/null 2>&1 &
exporter_pid=$!

plain() {  # the fallback: train without Ray, same environment
  say "$* - falling back to the plain launch (metrics stay on)"
  "$repo/_train.sh"
}

if (( rank == 0 )); then
  if ! head_info=$("$repo/utils/observe/ray_cluster.sh" head "$addr" 2> "$JOB_DIR/metrics/ray-start-$host.log"); then
    touch "$ray_dir/FAILED"
    plain "Ray head did not start on $host (see $JOB_DIR/metrics/ray-start-$host.log)"
    exit $?
  fi
  read -r address dash_port token_file <<< "$head_info"
  echo "$address" > "$ray_dir/head.tmp" && mv "$ray_dir/head.tmp" "$ray_dir/head"
  RAY_DASHBOARD_PORT=$dash_port MST_RAY_TOKEN_FILE=$token_file "$repo/utils/observe/job_services.sh" start
  say "Ray head $address; waiting for ${JOB_NUM_NODES:-1} node(s) to join"
  # the driver authenticates with the job's token like every other Ray process (its path only)
  RAY_ADDRESS=$address RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$token_file \
    RAY_JOIN_TIMEOUT=$join_timeout "$py" "$repo/_ray_actor.py"
  rc=$?
  if (( rc == 200 )); then
    touch "$ray_dir/FAILED"
    plain "Ray could not run the job"
    exit $?
  fi
  # let every exporter poll once more and Prometheus scrape it, so the last steps are kept
  flush=$(( ${METRICS_INTERVAL:-5} * 2 + 1 ))
  say "training ended (exit $rc); keeping metrics up ${flush} s for a last scrape"
  sleep "$flush"
  touch "$ray_dir/done"
  exit "$rc"
fi

# Other nodes: join the head, then wait for the end (or for the head to give up on Ray).
waited=0
while [[ ! -e "$ray_dir/head" && ! -e "$ray_dir/FAILED" ]] && (( waited < join_timeout * 4 )); do
  sleep 0.25; waited=$((waited + 1))
done
if [[ ! -e "$ray_dir/head" ]]; then
  plain "no Ray head appeared within ${join_timeout} s"
  exit $?
fi
# Ray gives a raylet 30 s to register with the GCS; on a loaded node that can pass once: one more try
# (after stopping what the first one left, only this job's Ray processes on this node).
for attempt in 1 2; do
  if "$repo/utils/observe/ray_cluster.sh" worker "$addr" "$(cat "$ray_dir/head")" 2>> "$JOB_DIR/metrics/ray-start-$host.log"; then
    break
  fi
  "$repo/utils/observe/ray_cluster.sh" stop
  say "could not join the Ray head (attempt $attempt of 2; see $JOB_DIR/metrics/ray-start-$host.log)"
done
until [[ -e "$ray_dir/done" || -e "$ray_dir/FAILED" ]]; do sleep 0.5; done
if [[ -e "$ray_dir/FAILED" && ! -e "$ray_dir/done" ]]; then
  plain "the head could not run the job on Ray"
  exit $?
fi
exit 0
