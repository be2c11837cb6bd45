#!/usr/bin/env bash
# Usage: utils/ray_cluster.sh head ADDR | worker ADDR HEAD_ADDRESS | stop
#
# Starts this node's part of a job's Ray cluster, or stops what this script started here.
#   head ADDR            ray start --head on ADDR; prints the cluster address (ADDR:PORT)
#   worker ADDR HEAD     ray start joining HEAD
#   stop                 kill the Ray processes this node started for this job (found by
#                        the MST_RAY_OWNER marker in their environment), nothing else
# Every port is picked free (several nodes may share one machine); the node advertises the
# custom resource mst_host_<host> so actors can be pinned to it; Ray's metrics port is
# written as a Prometheus file_sd target to $JOB_DIR/metrics/targets/<host>-ray.json.
# Dashboards bind to DASHBOARD_BIND (default 127.0.0.1). Needs JOB_DIR JOB_ID JOB_HOSTNAME
# MST_PYTHON (or MST_VENV); Ray's temp dir is node-local (RAY_TMPDIR, default /tmp/ray-$JOB_ID).
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/lib.sh"
PROG=ray_cluster.sh
: "${JOB_DIR:?}" "${JOB_ID:?}" "${JOB_HOSTNAME:?}"
host=$JOB_HOSTNAME
export MST_RAY_OWNER="$JOB_ID:$host"
ray_bin=$(dirname "${MST_PYTHON:-${MST_VENV:-/usr}/bin/python}")/ray
[[ -x "$ray_bin" ]] || ray_bin=ray
resource="mst_host_${host//[^A-Za-z0-9]/_}"

owned_pids() {
  local envf pid
  for envf in /proc/[0-9]*/environ; do
    pid=${envf#/proc/}; pid=${pid%/environ}
    [[ -O "$envf" && "$pid" != "$$" ]] || continue
    tr '\0' '\n' 2>/dev/null < "$envf" | grep -qxF "MST_RAY_OWNER=$MST_RAY_OWNER" && echo "$pid"
  done
  return 0
}

# Ray insists on a routable node address (it rewrites a loopback one, and refuses multi-node
# clusters on loopback): where the scheduler gave a loopback NodeAddr (several nodes on one
# machine), use this machine's routable address. Dashboards still bind DASHBOARD_BIND.
ray_addr() {
  local a=$1
  if [[ "$a" == 127.* || "$a" == localhost ]]; then
    a=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
    [[ -n "$a" ]] || a=$(hostname -I 2>/dev/null | awk '{ print $1 }')
  fi
  printf '%s\n' "${a:-$1}"
}

start() {  # ADDR ARGS...: start Ray on this node with the common arguments
  local addr; addr=$(ray_addr "$1"); shift
  local metrics_port; metrics_port=$(free_port 8080)
  # Ray runs its workers at nice 15, and the trainer an actor spawns inherits it (an unprivileged
  # process cannot lower it again): the trainer would lose the CPU to every daemon on the node.
  RAY_worker_niceness=0 "$ray_bin" start "$@" --node-ip-address="$addr" --disable-usage-stats \
    --num-cpus="${RAY_NUM_CPUS:-1}" --num-gpus=0 --resources="{\"$resource\": 1}" \
    --object-store-memory="${RAY_OBJECT_STORE_BYTES:-268435456}" \
    --metrics-export-port="$metrics_port" \
    --dashboard-agent-listen-port="$(free_port 52365)" \
    --dashboard-agent-grpc-port="$(free_port 53365)" \
    --runtime-env-agent-port="$(free_port 54365)" \
    --node-manager-port="$(free_port 55365)" --object-manager-port="$(free_port 56365)" \
    --min-worker-port="$(free_port 20000)" --max-worker-port=29999 >&2
  mkdir -p "$JOB_DIR/metrics/targets"
  printf '[{"targets": ["%s:%s"], "labels": {"host": "%s", "source": "ray"}}]\n' \
    "$addr" "$metrics_port" "$host" > "$JOB_DIR/metrics/targets/$host-ray.json.tmp"
  mv "$JOB_DIR/metrics/targets/$host-ray.json.tmp" "$JOB_DIR/metrics/targets/$host-ray.json"
}

case "${1:-}" in
  head)
    (( $# == 2 )) || die "usage: ray_cluster.sh head ADDR"
    port=$(free_port 6379)
    dash_port=$(free_port 8265)
    start "$2" --head --port="$port" --temp-dir="${RAY_TMPDIR:-/tmp/ray-$JOB_ID}" \
      --include-dashboard=true --dashboard-host="${DASHBOARD_BIND:-127.0.0.1}" --dashboard-port="$dash_port" \
      --ray-client-server-port="$(free_port 10001)"
    echo "$(ray_addr "$2"):$port $dash_port" ;;
  worker)
    (( $# == 3 )) || die "usage: ray_cluster.sh worker ADDR HEAD_ADDRESS"
    start "$2" --address="$3" ;;
  stop)
    mapfile -t pids < <(owned_pids)
    (( ${#pids[@]} )) || exit 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 20); do
      alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      (( alive )) || break; sleep 0.25
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true ;;
  *) die "unknown command '${1:-}': use head, worker or stop (see --help)" ;;
esac
