#!/usr/bin/env bash
# Usage: _train_with_ray.sh
#
# Training tier with observability (RAY=1), run on every node in place of _train.sh.
# Every node: makes its private scratch (utils/launch/lib.sh job_scratch; no private scratch, no job),
# saves the trainer's environment there, starts the metrics exporter (utils/observe/metrics_exporter.py,
# bound to the node's address so only the cluster can scrape it; 127.0.0.1 for a one-node job;
# restarted when it exits, exporter_restarts_total counts it) and
# its part of the Ray cluster (utils/observe/ray_cluster.sh: token-authenticated, temp dir in the scratch).
# Node rank 0 also starts Prometheus and TensorBoard (utils/observe/job_services.sh), prints the OBSERVE
# block, publishes its Ray address in $JOB_DIR/ray/head (a new file of its own) and runs
# _ray_actor.py, which trains through one thin actor per node. The other nodes read that address
# only after checking the record and every directory above it up to JOB_WORKSPACE (ours, no link,
# writable by nobody else; refused with one line otherwise: they never send the token to an address
# someone else wrote), join, and wait until the head reports the end ($JOB_DIR/ray/done). If Ray
# cannot start or nodes cannot join, every node says so and falls back to the plain launch
# (_train.sh), metrics, Prometheus and TensorBoard still on; the OBSERVE block says why ("ray: off").
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
join_timeout=${MST_RAY_JOIN_TIMEOUT:-120}
say() { echo "_train_with_ray.sh: $*"; }

# The job dir may sit in a shared workspace (docs/security.md#shared-workspaces): the directories
# this script writes into, and the head's address record the other nodes read, must be ours, not
# links, writable by nobody else, and so must every directory between the workspace and them.
root=${JOB_WORKSPACE:-}
[[ -n "$root" && "$JOB_DIR" == "${root%/}/"* ]] || root=$(dirname "$JOB_DIR")
# a job dir of ours made under a group umask (002) is closed to the others' writes first
[[ -d "$JOB_DIR" && -O "$JOB_DIR" && ! -L "$JOB_DIR" ]] && chmod go-w -- "$JOB_DIR"
check_trusted_under "$root" "$JOB_DIR" "the job directory" "it must be the job's own (made by submit.sh); not starting Ray"
# Everything the job's services write into the workspace is readable by the group and writable by
# us only (as submit.sh makes the job's log and directory), whatever umask the job was given.
umask 022
# made here on every node (the same user everywhere): 0755, no inherited setgid
for d in "$JOB_DIR/metrics" "$JOB_DIR/metrics/targets" "$ray_dir"; do own_dir "$d"; done

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
# this launcher's pid, for the trainer's guard (utils/observe/trainer_guard.py): it stops the
# trainer once this script is gone, even when Slurm cut the cleanup below short
(umask 077; echo "$$" > "$scratch/launcher.pid")
unset RAY_AUTH_TOKEN  # a token from the caller's environment would win over the job's own

# keep_ray_logs: this node's Ray session logs into the job dir. Only regular files are copied,
# and no symbolic link is followed (a link in Ray's world-writable temp dir must not copy whatever
# it points at into the job dir).
keep_ray_logs() {
  local s dest="$ray_dir/logs-$host"
  for s in "$scratch/ray"/session_2*; do
    [[ -d "$s/logs" && ! -L "$s" && ! -L "$s/logs" ]] || continue
    [[ -d "$dest" && ! -L "$dest" ]] || (own_dir "$dest") || return 0
    (cd "$s/logs" && find . -type f -print0 | xargs -0 -r cp -P --parents -t "$dest") 2>/dev/null
  done
  return 0
}

exporter_sup=""
# stop_pid PID: SIGTERM, up to 10 s to exit, then SIGKILL (only a pid this job recorded in its scratch)
stop_pid() {
  local pid=$1 i
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
  kill -KILL "$pid" 2>/dev/null || true
}
cleanup() {
  trap '' TERM INT HUP
  # the exporter's supervisor restarts nothing from here on
  touch "$scratch/exporter.stop"
  # Ray (and with it the trainers its actors spawned, and the exporter: every process that carries
  # MST_RAY_OWNER) first: Ray's daemons leave the job's process tree, so Slurm's SIGKILL after a
  # cancel (KillWait) would not reach them if this cleanup were cut short. At a normal end rank 0
  # stopped Prometheus before (so the TSDB ends with every node's last scrape).
  "$repo/utils/observe/ray_cluster.sh" stop
  (( rank == 0 )) && "$repo/utils/observe/job_services.sh" stop
  if [[ -n "$exporter_sup" ]]; then
    kill -TERM "$exporter_sup" 2>/dev/null; wait "$exporter_sup" 2>/dev/null
    stop_pid "$(cat "$scratch/exporter.pid" 2>/dev/null)"
  fi
  keep_ray_logs
  # the token is of no use once the cluster is gone
  (( rank == 0 )) && rm -rf -- "$ray_dir/auth"
  rm -rf -- "$scratch"
  return 0
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

# The node's exporter, supervised like Prometheus: when it exits (a crash, the OOM killer, a kill)
# it starts again 1 s later, then after 2, 4 ... at most 30 s (1 s again once one ran a minute),
# each told how many ran before it (exporter_restarts_total), until the cleanup stops it.
supervise_exporter() {
  local restarts=0 delay=1 began rc
  while [[ ! -e "$scratch/exporter.stop" ]]; do
    began=$SECONDS
    "$py" "$repo/utils/observe/metrics_exporter.py" --bind "$addr" --port "$(free_port 9400)" \
      --interval "${METRICS_INTERVAL:-5}" --host "$host" --node-rank "$rank" --job-dir "$JOB_DIR" \
      --state-dir "$scratch/exporter" --restarts "$restarts" \
      --sd-file "$JOB_DIR/metrics/targets/$host-node.json" --log "$JOB_DIR/metrics/exporter-$host.log" >/dev/null 2>&1 &
    echo "$!" > "$scratch/exporter.pid"
    rc=0; wait "$!" || rc=$?
    [[ -e "$scratch/exporter.stop" ]] && break
    (( SECONDS - began < 60 )) || delay=1
    restarts=$((restarts + 1))
    printf '%s _train_with_ray.sh: the exporter exited (status %s); start %s in %s s\n' \
      "$(date -u +%FT%TZ)" "$rc" "$((restarts + 1))" "$delay" >> "$JOB_DIR/metrics/exporter-$host.log"
    sleep "$delay"
    delay=$(( delay * 2 > 30 ? 30 : delay * 2 ))
  done
}
supervise_exporter &
exporter_sup=$!

plain() {  # the fallback: train without Ray, same environment
  say "$* - falling back to the plain launch (metrics stay on)"
  "$repo/_train.sh"
}

# last_line FILE: its last non-empty line, at most 300 characters (the reason a Ray step failed)
last_line() {
  local l
  l=$(grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1)
  printf '%s\n' "${l:0:300}"
}

if (( rank == 0 )); then
  start_log="$JOB_DIR/metrics/ray-start-$host.log"
  if ! head_info=$("$repo/utils/observe/ray_cluster.sh" head "$addr" 2> "$start_log"); then
    touch "$ray_dir/FAILED"
    why="Ray head did not start on $host: $(last_line "$start_log") (see $start_log)"
    # Prometheus and TensorBoard still run; the OBSERVE block says why there is no Ray
    MST_RAY_FALLBACK=$why "$repo/utils/observe/job_services.sh" start
    plain "$why"
    exit $?
  fi
  read -r address dash_port token_file <<< "$head_info"
  # The record the other nodes connect to (and send the token to): a new file of ours in the
  # directory made above, renamed into place whole, never written through a link.
  new_file "$ray_dir/head.tmp"
  { printf '%s\n' "$address" > "$ray_dir/head.tmp" && mv -T -- "$ray_dir/head.tmp" "$ray_dir/head"; } ||
    die "cannot write the Ray head's address $ray_dir/head"
  RAY_DASHBOARD_PORT=$dash_port MST_RAY_TOKEN_FILE=$token_file "$repo/utils/observe/job_services.sh" start
  say "Ray head $address; waiting for ${JOB_NUM_NODES:-1} node(s) to join"
  # the driver authenticates with the job's token like every other Ray process (its path only);
  # when Ray cannot run the job it says why in MST_RAY_REASON_FILE (the node's private scratch)
  RAY_ADDRESS=$address RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$token_file MST_RAY_REASON_FILE=$scratch/ray-unusable \
    MST_RAY_JOIN_TIMEOUT=$join_timeout "$py" "$repo/_ray_actor.py"
  rc=$?
  if (( rc == 200 )); then
    touch "$ray_dir/FAILED"
    why="Ray could not run the job: $(head -c 300 "$scratch/ray-unusable" 2>/dev/null || echo 'see the _ray_actor.py line above')"
    "$repo/utils/observe/job_services.sh" fallback "$why"
    plain "$why"
    exit $?
  fi
  # let every exporter poll once more and Prometheus scrape it, so the last steps are kept
  flush=$(( ${METRICS_INTERVAL:-5} * 2 + 1 ))
  say "training ended (exit $rc); keeping metrics up ${flush} s for a last scrape"
  sleep "$flush"
  # Prometheus stops while every node's Ray and exporter still answer: a scrape after any of them
  # stopped would end its series with a staleness marker, and the saved TSDB, queried at its end,
  # would lack that node (the cleanup below stops Ray first only when the job is cut short)
  "$repo/utils/observe/job_services.sh" stop
  touch "$ray_dir/done"
  exit "$rc"
fi

# Other nodes: read the head's address, join the head, then wait for the end (or for the head to
# give up on Ray). The address is read only from the head's own record, checked race-free (ours,
# no link, nobody else can write it or a directory above it; utils/observe/job_record.py) before
# this node connects to it and sends it the token: a record someone else planted stops the node.
waited=0 head=""
while (( waited < join_timeout * 4 )) && [[ ! -e "$ray_dir/FAILED" ]]; do
  if [[ -e "$ray_dir/head" || -L "$ray_dir/head" ]]; then
    head=$("$py" "$repo/utils/observe/job_record.py" read "$root" "$ray_dir/head" --max 256 \
      --what "the Ray head's address" --advice "someone else made it; not connecting to it" 2>&1)
    case $? in
      0) break ;;
      3) head="" ;;  # gone again between the test and the read
      *) die "$head" ;;
    esac
  fi
  sleep 0.25; waited=$((waited + 1))
done
head=${head%$'\n'}
if [[ -z "$head" ]]; then
  if [[ -e "$ray_dir/FAILED" ]]; then plain "the head could not start Ray"
  else plain "no Ray head appeared within ${join_timeout} s"; fi
  exit $?
fi
[[ "$head" =~ ^[A-Za-z0-9._-]+:[0-9]{1,5}$ ]] ||
  die "the Ray head's address record $ray_dir/head holds no address ('${head:0:80}'); not connecting"
# Ray gives a raylet 30 s to register with the GCS; on a loaded node that can pass once: one more try
# (after stopping what the first one left, only this job's Ray processes on this node).
for attempt in 1 2; do
  if "$repo/utils/observe/ray_cluster.sh" worker "$addr" "$head" 2>> "$JOB_DIR/metrics/ray-start-$host.log"; then
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
