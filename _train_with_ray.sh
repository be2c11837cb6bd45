#!/usr/bin/env bash
# Usage: _train_with_ray.sh
#
# Training tier with observability (RAY=1), run on every node in place of _train.sh.
# Every node: starts the metrics exporter (utils/metrics_exporter.py, bound to the node's
# address so only the cluster can scrape it) and its part of the Ray cluster (utils/ray_cluster.sh).
# Node rank 0 also starts Prometheus and TensorBoard (utils/job_services.sh), prints the OBSERVE
# block, and runs _ray_actor.py, which trains through one thin actor per node. The other nodes
# wait until the head reports the end ($JOB_DIR/ray/done). If Ray cannot start or nodes cannot
# join, every node says so and falls back to the plain launch (_train.sh), metrics still on.
# Reads the variables of docs/env-contract.md; stops only what it started.
set -uo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
repo=${MST_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
source "$repo/utils/lib.sh"
PROG=_train_with_ray.sh
: "${JOB_DIR:?}" "${JOB_ID:?}"
host=${JOB_HOSTNAME:-$(hostname)} rank=${JOB_NODE_RANK:-0}
export JOB_HOSTNAME=$host
read -r -a addrs <<< "${JOB_NODE_ADDRS:-}"
addr=${addrs[$rank]:-127.0.0.1}
py=${MST_PYTHON:-python3}
ray_dir="$JOB_DIR/ray"
base="${TMPDIR:-/tmp}/maxtext-slurm-${USER:-$(id -un)}/${JOB_SCHEDULER:-local}/$JOB_ID"
scratch="$base/$host"
mkdir -p "$ray_dir" "$JOB_DIR/metrics/targets" "$scratch" && chmod 700 "$scratch"
join_timeout=${RAY_JOIN_TIMEOUT:-120}
say() { echo "_train_with_ray.sh: $*"; }

# The trainer's environment, saved before Ray touches anything (node-local, mode 600: it may
# hold _env_ secrets). MST_RAY_OWNER marks every process started for this node, trainers included.
export MST_RAY_OWNER="$JOB_ID:$host"
(umask 077; env -0 > "$scratch/job.env")

exporter_pid=""
cleanup() {
  trap '' TERM INT HUP
  [[ -n "$exporter_pid" ]] && kill -TERM "$exporter_pid" 2>/dev/null
  "$repo/utils/ray_cluster.sh" stop
  (( rank == 0 )) && "$repo/utils/job_services.sh" stop
  # keep this node's Ray session logs with the job (Ray's temp dir is node-local)
  local d
  for d in "${RAY_TMPDIR:-/tmp/ray-$JOB_ID}" /tmp/ray; do
    [[ -d "$d/session_latest/logs" ]] || continue
    cp -rL "$d/session_latest/logs" "$ray_dir/logs-$host" 2>/dev/null
    break
  done
  return 0
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

"$py" "$repo/utils/metrics_exporter.py" --bind "$addr" --port "$(free_port 9400)" \
  --interval "${METRICS_INTERVAL:-5}" --host "$host" --node-rank "$rank" --job-dir "$JOB_DIR" \
  --plugin-dir "$repo/utils" --state-dir "$scratch/exporter" \
  --sd-file "$JOB_DIR/metrics/targets/$host-node.json" --log "$JOB_DIR/metrics/exporter-$host.log" >/dev/null 2>&1 &
exporter_pid=$!

plain() {  # the fallback: train without Ray, same environment
  say "$* - falling back to the plain launch (metrics stay on)"
  "$repo/_train.sh"
}

if (( rank == 0 )); then
  if ! head_info=$("$repo/utils/ray_cluster.sh" head "$addr" 2> "$JOB_DIR/metrics/ray-start-$host.log"); then
    touch "$ray_dir/FAILED"
    plain "Ray head did not start on $host (see $JOB_DIR/metrics/ray-start-$host.log)"
    exit $?
  fi
  read -r address dash_port <<< "$head_info"
  echo "$address" > "$ray_dir/head.tmp" && mv "$ray_dir/head.tmp" "$ray_dir/head"
  RAY_DASHBOARD_PORT=$dash_port "$repo/utils/job_services.sh" start
  say "Ray head $address; waiting for ${JOB_NUM_NODES:-1} node(s) to join"
  RAY_ADDRESS=$address MST_RAY_ENV_FILE="$base/{host}/job.env" RAY_JOIN_TIMEOUT=$join_timeout \
    "$py" "$repo/_ray_actor.py"
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
  if "$repo/utils/ray_cluster.sh" worker "$addr" "$(cat "$ray_dir/head")" 2>> "$JOB_DIR/metrics/ray-start-$host.log"; then
    break
  fi
  "$repo/utils/ray_cluster.sh" stop
  say "could not join the Ray head (attempt $attempt of 2; see $JOB_DIR/metrics/ray-start-$host.log)"
done
until [[ -e "$ray_dir/done" || -e "$ray_dir/FAILED" ]]; do sleep 0.5; done
if [[ -e "$ray_dir/FAILED" && ! -e "$ray_dir/done" ]]; then
  plain "the head could not run the job on Ray"
  exit $?
fi
exit 0
