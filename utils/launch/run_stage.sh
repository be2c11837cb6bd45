#!/usr/bin/env bash
# Usage: utils/launch/run_stage.sh STAGE TIMEOUT_SECONDS COMMAND [ARG...]
#
# Runs one stage of a job on this node: COMMAND under a time limit, every output line
# prefixed with "<host>: " (so a merged multi-node log stays attributable), and the outcome
# recorded in $JOB_DIR/.stages/STAGE/<host> as "rc=N end=EPOCH reason=exit|timeout|stopped".
# SIGTERM/SIGINT/SIGHUP stop COMMAND's whole process group (TERM, then KILL after
# STAGE_STOP_GRACE seconds, default 5) and record reason=stopped. A record that already exists
# is kept (a more precise writer, e.g. the Ray actor, got there first). With ENABLE_COREDUMPS=1
# the KILL waits while a core is being written (utils/launch/coredump.sh core_writing), at most
# COREDUMP_WAIT seconds (default 120; under Slurm also bounded by the cluster's KillWait), so a
# node that crashes while another stops it still leaves a whole core.
# Needs JOB_DIR; the host name is JOB_HOSTNAME or $(hostname). Exits with COMMAND's status.
set -uo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
(( $# >= 3 )) || { echo "run_stage.sh: expected STAGE TIMEOUT_SECONDS COMMAND... (see --help)" >&2; exit 2; }
[[ "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || { echo "run_stage.sh: timeout '$2' must be a positive number of seconds" >&2; exit 2; }
: "${JOB_DIR:?run_stage.sh: JOB_DIR is not set}"

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/coredump.sh"
stage=$1 limit=$2
shift 2
host=${JOB_HOSTNAME:-$(hostname)}
rec_dir="$JOB_DIR/.stages/$stage"
# the records go into directories of ours (made here, or checked: never someone else's or a link)
[[ -e "$JOB_DIR" || -L "$JOB_DIR" ]] || own_dir "$JOB_DIR"
own_dir "$JOB_DIR/.stages"
own_dir "$rec_dir"

record() { (set -C; printf 'rc=%s end=%s reason=%s\n' "$1" "$(date +%s.%N | cut -c1-14)" "$2" > "$rec_dir/$host") 2>/dev/null || true; }

# Lines that already carry a node's prefix (the Ray driver relays other nodes' output) keep it.
# Each line reaches the log as soon as it is complete, whole whatever its length or bytes; no awk
# or sed (Ubuntu 24.04's mawk -W interactive dropped every line after one over 4096 bytes): see
# prefix_lines.sh.
exec 3> >(exec "$(dirname "${BASH_SOURCE[0]}")/prefix_lines.sh" "$host")
prefixer=$!

# SIGKILL cuts a core short: let a core being written finish first.
wait_for_cores() {
  local dir end=$((SECONDS + ${COREDUMP_WAIT:-120}))
  dir=$(core_dir 2>/dev/null) || return 0
  core_writing "$dir" "$child" || return 0
  echo "run_stage.sh: waiting (at most ${COREDUMP_WAIT:-120} s) for a core being written on $host before stopping stage '$stage'" >&3
  while core_writing "$dir" "$child" && (( SECONDS < end )); do sleep 0.25; done
}

child=""
stop() {
  trap '' TERM INT HUP
  if [[ -n "$child" ]]; then
    # timeout(1) leads its own process group: signal the group, so no trainer is orphaned
    kill -TERM -- "-$child" 2>/dev/null
    for _ in $(seq $(( ${STAGE_STOP_GRACE:-5} * 4 ))); do kill -0 -- "-$child" 2>/dev/null || break; sleep 0.25; done
    [[ "${ENABLE_COREDUMPS:-0}" == 1 ]] && wait_for_cores
    kill -KILL -- "-$child" 2>/dev/null
  fi
  record 143 stopped
  exec 3>&-
  exit 143
}
trap stop TERM INT HUP

started=$SECONDS
timeout --kill-after=10 "$limit" "$@" >&3 2>&1 &
child=$!
wait "$child"
rc=$?
reason="exit"
# 124: stopped by TERM at the limit; 137: it ignored TERM and was killed 10 s later
if (( rc == 124 || (rc == 137 && SECONDS - started >= limit) )); then
  reason=timeout
  echo "run_stage.sh: stage '$stage' exceeded its ${limit} s limit on $host" >&3
  kill -KILL -- "-$child" 2>/dev/null
fi
record "$rc" "$reason"
exec 3>&-
wait "$prefixer" 2>/dev/null
exit "$rc"
