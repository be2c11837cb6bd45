#!/usr/bin/env bash
# Usage: utils/observe/ray_cluster.sh head ADDR | worker ADDR HEAD_ADDRESS | stop
#
# Starts this node's part of a job's Ray cluster, or stops what this script started here.
#   head ADDR            makes the job's Ray token, then ray start --head on ADDR; prints
#                        "ADDR:PORT DASHBOARD_PORT TOKEN_FILE"
#   worker ADDR HEAD     ray start joining HEAD (with the token the head made)
#   stop                 kill the Ray processes this node started for this job (found by
#                        the MST_RAY_OWNER marker in their environment), nothing else
# Secure by default:
#   - token authentication (Ray's RAY_AUTH_MODE=token) on every Ray process of the job: GCS,
#     raylets, object managers, workers, dashboard and its agents refuse a caller without the
#     token. The head makes it (random, 256 bits) in $JOB_DIR/ray/auth/token (directory new,
#     0700 without the setgid bit a group workspace hands down, file 0600, created before the
#     head's address is published); every node checks it and every directory above it up to
#     JOB_WORKSPACE (ours, no link, writable by nobody else) and reads it from there
#     (RAY_AUTH_TOKEN_PATH: the value is never in an argument, a log or the environment).
#   - no Ray client server, no autoscaler monitor, no log monitor (the job uses none of them);
#     the dashboard (and its Jobs API) binds DASHBOARD_BIND (default 127.0.0.1).
#   - a one-node job keeps all of Ray on 127.0.0.1; with several nodes Ray uses the node's address.
#   - Ray's temp dir is $MST_JOB_SCRATCH/ray, inside the node's private scratch (utils/launch/lib.sh
#     job_scratch): Ray makes its temp dir world-writable, the scratch keeps others out of it.
#     MST_JOB_SCRATCH reaches every Ray process (actors too) through the environment.
# Every port is picked free (several nodes may share one machine); a head whose port another
# job took between the pick and Ray's bind (jobs starting Ray on one node at the same moment; Ray
# says "address already in use") is stopped and started again on ports searched from a random
# offset, at most 3 tries; the node advertises the
# custom resource mst_host_<host> so actors can be pinned to it; Ray's metrics port is
# written as a Prometheus file_sd target to $JOB_DIR/metrics/targets/<host>-ray.json.
# Needs JOB_DIR JOB_ID JOB_HOSTNAME MST_JOB_SCRATCH, MST_PYTHON (or MST_VENV); JOB_NUM_NODES.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../launch/lib.sh"; usage; exit; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../launch/lib.sh"
PROG=ray_cluster.sh
: "${JOB_DIR:?}" "${JOB_ID:?}" "${JOB_HOSTNAME:?}"
host=$JOB_HOSTNAME
export MST_RAY_OWNER="$JOB_ID:$host"
py=${MST_PYTHON:-${MST_VENV:-/usr}/bin/python}
resource="mst_host_${host//[^A-Za-z0-9]/_}"
token_dir="$JOB_DIR/ray/auth"
token_file="$token_dir/token"
single=0; (( ${JOB_NUM_NODES:-1} > 1 )) || single=1

# stat_fields FILE ARRAY: the fields of a /proc/PID/stat after "PID (COMM) " (COMM may hold spaces
# and parentheses) into ARRAY: STATE PPID PGRP SESSION ...; 1 when the process is gone
stat_fields() {
  local -n out=$2
  local rest
  { read -r rest < "$1"; } 2>/dev/null || return 1   # (a plain 2>/dev/null after < comes too late)
  read -r -a out <<< "${rest##*) }"
}

# One grep over every process's environment: a fork or two per process took seconds on a busy
# node, and a cancel's SIGKILL (KillWait) then ended the cleanup before it reached the trainers.
# Their descendants in their own session too: Ray's agents overwrite their environment with their
# title, and one whose raylet died first would be left behind. Not across a session: the trainer
# and its guard (utils/observe/trainer_guard.py) run in sessions of their own, and the guard must
# outlive this stop when Slurm cuts it short, to stop a trainer that ignores SIGTERM.
owned_pids() {
  local envf pid stat ppid f
  local -A mine=() parent=() session=()
  while IFS= read -r envf; do
    pid=${envf#/proc/}; pid=${pid%/environ}
    [[ -O "$envf" && "$pid" != "$$" ]] && mine[$pid]=1
  done < <(grep -lsxzF -- "MST_RAY_OWNER=$MST_RAY_OWNER" /proc/[0-9]*/environ)
  for stat in /proc/[0-9]*/stat; do
    [[ -O "$stat" ]] || continue
    stat_fields "$stat" f || continue
    pid=${stat#/proc/}; pid=${pid%/stat}
    parent[$pid]=${f[1]} session[$pid]=${f[3]}
  done
  local grew=1
  while (( grew )); do
    grew=0
    for pid in "${!parent[@]}"; do
      ppid=${parent[$pid]}
      [[ -z "${mine[$pid]:-}" && -n "${mine[$ppid]:-}" && "${session[$pid]}" == "${session[$ppid]:-}" && "$pid" != "$$" ]] &&
        { mine[$pid]=1; grew=1; }
    done
  done
  (( ${#mine[@]} )) && printf '%s\n' "${!mine[@]}"
  return 0
}

# The node address Ray uses. One node: 127.0.0.1 (with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 Ray
# keeps GCS, raylet, agents, dashboard and metrics on loopback; nothing outside needs to reach
# them). Several nodes: the scheduler's address; Ray refuses a multi-node cluster on loopback, so
# where the scheduler gave a loopback NodeAddr (several nodes on one machine) this machine's
# routable address is used.
ray_addr() {
  local a=$1
  (( single )) && { echo 127.0.0.1; return; }
  if [[ "$a" == 127.* || "$a" == localhost ]]; then
    a=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
    [[ -n "$a" ]] || a=$(hostname -I 2>/dev/null | awk '{ print $1 }')
  fi
  printf '%s\n' "${a:-$1}"
}

# is_private PATH TYPE MODE: PATH is a TYPE (d or f), no symlink, ours, with exactly MODE
is_private() {
  [[ ! -L "$1" && -O "$1" && "$(stat -c %a "$1" 2>/dev/null)" == "$3" ]] || return 1
  if [[ "$2" == d ]]; then [[ -d "$1" ]]; else [[ -f "$1" ]]; fi
}

# The job dir may be in a shared workspace: the token's directories must be ours up to it.
root=${JOB_WORKSPACE:-}
[[ -n "$root" && "$JOB_DIR" == "${root%/}/"* ]] || root=$(dirname "$JOB_DIR")

make_token() {  # the head, before its address is published: a new 0700 dir, a new 0600 token
  (umask 022; own_dir "$JOB_DIR/ray") || exit 1
  check_trusted_under "$root" "$JOB_DIR/ray" "the Ray directory" "not putting the Ray token there"
  mkdir -m 700 "$token_dir" 2>/dev/null ||
    die "cannot create '$token_dir' for the Ray token (it must not exist before the job starts)"
  # a group workspace's setgid bit is inherited by new directories (2700): not ours to keep
  [[ -O "$token_dir" && ! -L "$token_dir" ]] && chmod g-s -- "$token_dir"
  is_private "$token_dir" d 700 ||
    die "'$token_dir' is not a private directory (owner $(stat -c %U -- "$token_dir" 2>/dev/null || echo '?'), mode $(stat -c %a -- "$token_dir" 2>/dev/null || echo '?'); want yours, 700); refusing to put the Ray token there"
  "$py" -c 'import os, secrets, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
os.write(fd, secrets.token_hex(32).encode())
os.close(fd)' "$token_file" || die "cannot write the Ray token '$token_file'"
}

check_token() {  # every node, before ray start: the token is there and private, and so is the way to it
  { is_private "$token_dir" d 700 && is_private "$token_file" f 600; } ||
    die "the Ray token '$token_file' is missing or not private (want: directory 0700, file 0600, owned by $(id -un)); not starting Ray without it"
  check_trusted_under "$root" "$token_file" "the Ray token" "not starting Ray with it"
}

# `ray start` with the Ray client server left out: Ray 2.60 starts it (port 10001, with the
# whole cluster behind it) whenever grpc is importable and offers no flag to turn it off, so the
# CLI runs here with that check answering "not installed".
ray_start() {
  "$py" -c 'import sys
import ray.scripts.scripts as cli
cli.get_ray_client_dependency_error = lambda: ImportError("the Ray client server is off for maxtext-slurm jobs")
sys.argv[0] = "ray"
cli.main()' start "$@"
}

spread=0 # added to every port's search start: 0 on the first try, random on a retry

start() {  # ADDR ARGS...: start Ray on this node with the common arguments; 1 if ray start failed
  local addr; addr=$(ray_addr "$1"); shift
  { [[ -n "${MST_JOB_SCRATCH:-}" ]] && is_private "$MST_JOB_SCRATCH" d 700; } ||
    die "MST_JOB_SCRATCH='${MST_JOB_SCRATCH:-}' is not this node's private scratch (utils/launch/lib.sh job_scratch); not starting Ray"
  check_token
  local metrics_port; metrics_port=$(free_port $((8080 + spread)))
  # Every Ray process started below (and every worker and actor they start) inherits these.
  # RAY_AUTH_TOKEN would win over the file: a value from the caller's environment is dropped.
  unset RAY_AUTH_TOKEN
  export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$token_file
  (( single )) && export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  # Ray runs its workers at nice 15, and the trainer an actor spawns inherits it (an unprivileged
  # process cannot lower it again): the trainer would lose the CPU to every daemon on the node.
  RAY_worker_niceness=0 ray_start "$@" --node-ip-address="$addr" --disable-usage-stats \
    --temp-dir="$MST_JOB_SCRATCH/ray" --include-log-monitor=false \
    --num-cpus="${MST_RAY_NUM_CPUS:-1}" --num-gpus=0 --resources="{\"$resource\": 1}" \
    --object-store-memory="${MST_RAY_OBJECT_STORE_BYTES:-268435456}" \
    --metrics-export-port="$metrics_port" \
    --dashboard-agent-listen-port="$(free_port $((52365 + spread)))" \
    --dashboard-agent-grpc-port="$(free_port $((53365 + spread)))" \
    --runtime-env-agent-port="$(free_port $((54365 + spread)))" \
    --node-manager-port="$(free_port $((55365 + spread)))" \
    --object-manager-port="$(free_port $((56365 + spread)))" \
    --min-worker-port="$(free_port $((20000 + spread)))" --max-worker-port=29999 >&2 || return 1
  # the head runs this in a command substitution, where bash drops set -e: each step says so itself
  local target="$JOB_DIR/metrics/targets/$host-ray.json"
  if ! { mkdir -p "$JOB_DIR/metrics/targets" &&
    printf '[{"targets": ["%s:%s"], "labels": {"host": "%s", "source": "ray"}}]\n' \
      "$addr" "$metrics_port" "$host" > "$target.tmp" && mv "$target.tmp" "$target"; }; then
    echo "ray_cluster.sh: cannot write Ray's metrics target $target" >&2
    return 1
  fi
}

running() { # PID: it exists and has not ended (a zombie has: only its parent's reaping is left)
  local f
  stat_fields "/proc/$1/stat" f && [[ "${f[0]}" != Z ]]
}

stop_owned() { # kill what this node started for this job (MST_RAY_OWNER), TERM then KILL
  local pids p alive
  mapfile -t pids < <(owned_pids)
  (( ${#pids[@]} )) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 20); do
    alive=0; for p in "${pids[@]}"; do running "$p" && alive=1; done
    (( alive )) || break; sleep 0.25
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

start_head() { # ADDR: the head on free ports; prints "ADDR:PORT DASHBOARD_PORT TOKEN_FILE"
  local port dash_port
  port=$(free_port $((6379 + spread)))
  dash_port=$(free_port $((8265 + spread)))
  # the dashboard's own metrics server (Ray's default 44227 would clash between jobs on a node)
  DASHBOARD_METRIC_PORT=$(free_port $((44227 + spread))) start "$1" --head --port="$port" --no-monitor \
    --include-dashboard=true --dashboard-host="${DASHBOARD_BIND:-127.0.0.1}" --dashboard-port="$dash_port" || return 1
  echo "$(ray_addr "$1"):$port $dash_port $token_file"
}

head_with_retries() { # ADDR: start_head; when a port it picked was taken meanwhile (Ray says so), stop
  # what it left and try again; any other failure ends here with Ray's own output last
  local try err rc
  for try in 1 2 3; do
    { err=$(start_head "$1" 2>&1 1>&3 3>&-) && rc=0 || rc=$?; } 3>&1
    [[ -z "$err" ]] || printf '%s\n' "$err" >&2
    (( rc == 0 )) && return 0
    stop_owned
    grep -qiE 'address already in use|failed to start the grpc server|already occupied' <<< "$err" || exit 1
    (( try < 3 )) || break
    spread=$((1 + RANDOM % 500))
    echo "ray_cluster.sh: the Ray head did not start on $host (try $try of 3; a port taken meanwhile): trying other ports" >&2
  done
  die "the Ray head did not start on $host in 3 tries: its ports were taken each time (Ray's output is above)"
}

case "${1:-}" in
  head)
    (( $# == 2 )) || die "usage: ray_cluster.sh head ADDR"
    make_token
    head_with_retries "$2" ;;
  worker)
    (( $# == 3 )) || die "usage: ray_cluster.sh worker ADDR HEAD_ADDRESS"
    # _train_with_ray.sh tries a worker twice (a slow raylet registration), with ports picked again
    start "$2" --address="$3" || die "ray start did not join $3 from $host (Ray's output is above)" ;;
  stop) stop_owned ;;
  *) die_usage "unknown command '${1:-}': use head, worker or stop (see --help)" ;;
esac
