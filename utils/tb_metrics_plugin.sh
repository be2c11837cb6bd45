#!/usr/bin/env bash
# Usage: tb_metrics_plugin.sh [--help]
#
# The running job's TensorBoard scalars as Prometheus text on stdout:
#   tb_<tag, / and other characters outside [a-zA-Z0-9_] as _>{run="<dir of the event file>"} VALUE TIMESTAMP_MS
#   (learning/loss -> tb_learning_loss), one sample per new event, stamped with the event's wall time,
#   plus tb_step (the step of each new step). Event files: events.out.tfevents.* anywhere under $JOB_DIR.
# Run by metrics_exporter.py at every poll (contract: docs/plugins.md; metrics: docs/metrics.md).
# The decoding is done by utils/tb_bridge.py, started on the first poll in its own session and kept alive
# (restarted if it died), so Python's start-up is paid once per job. The plugin talks to it through two
# FIFOs in $METRICS_STATE_DIR with bash builtins only, and prints only what was appended since the last poll.
# Environment: JOB_DIR, JOB_NODE_RANK, METRICS_STATE_DIR, METRICS_TIMEOUT, METRICS_PYTHON (interpreter with
#   tensorboard; default python3), METRICS_EXPORTER_PID (the bridge exits when it is gone),
#   TB_METRICS_ALL_NODES=1 (report on every node; default: node rank 0 only, where MaxText writes TensorBoard),
#   TB_BRIDGE (path of tb_bridge.py; default: next to this script).
# Exit 64 (never run again) off rank 0, without JOB_DIR, or when the bridge cannot import tensorboard;
# 1 when a running bridge does not answer in time; 0 otherwise (also while a new bridge is starting).
set -euo pipefail
export LC_ALL=C # numbers with a "." whatever the caller's locale

if [[ ${1-} == -h || ${1-} == --help ]]; then
  source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" # usage: the one help mechanism (needed only here)
  usage
  exit
fi

never_again=${METRICS_NEVER_AGAIN_EXIT:-64}
if [[ ${JOB_NODE_RANK:-0} != 0 && ${TB_METRICS_ALL_NODES:-0} != 1 ]]; then
  echo "tb_metrics_plugin: node rank ${JOB_NODE_RANK} does not write TensorBoard events" >&2
  exit "$never_again"
fi
if [[ -z ${JOB_DIR:-} || ! -d $JOB_DIR ]]; then
  echo "tb_metrics_plugin: JOB_DIR='${JOB_DIR:-}' is not a directory" >&2
  exit "$never_again"
fi
state=${METRICS_STATE_DIR:?tb_metrics_plugin: METRICS_STATE_DIR must be set}
if [[ -s $state/bridge.fatal ]]; then
  IFS= read -r why < "$state/bridge.fatal" || true
  echo "tb_metrics_plugin: ${why:-the bridge cannot run}" >&2
  exit "$never_again"
fi
here=${BASH_SOURCE[0]%/*}
[[ $here != "${BASH_SOURCE[0]}" ]] || here=.
bridge=${TB_BRIDGE:-$here/tb_bridge.py}

# bridge_alive: the pid in bridge.pid is a live tb_bridge.py.
bridge_alive() {
  local pid args=()
  { IFS= read -r pid || [[ -n $pid ]]; } 2>/dev/null < "$state/bridge.pid" || return 1
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  mapfile -d '' -t args 2>/dev/null < "/proc/$pid/cmdline" || return 1
  [[ "${args[*]}" == *tb_bridge.py* ]]
}

for fifo in req ack; do
  if [[ ! -p $state/$fifo ]]; then
    rm -f "$state/$fifo"
    mkfifo -m 600 "$state/$fifo"
  fi
done

started=0
if ! bridge_alive; then
  setsid "${METRICS_PYTHON:-python3}" "$bridge" --state-dir "$state" --job-dir "$JOB_DIR" \
    --exporter-pid "${METRICS_EXPORTER_PID:-0}" < /dev/null >> "$state/bridge.log" 2>&1 &
  started=1
fi

# Both FIFOs are opened read-write: that never blocks, whether or not the bridge is up yet.
acked=-
if [[ -r $state/acked ]]; then IFS= read -r acked < "$state/acked" || true; fi
t0=${EPOCHREALTIME/./} # microseconds (LC_ALL=C: the decimal point is '.')
nonce=${t0}_$$
exec {req_fd}<>"$state/req" {ack_fd}<>"$state/ack"
printf 'poll %s %s\n' "$nonce" "${acked:--}" >&"$req_fd"

# Wait for our answer until half a second before the exporter's timeout (older answers are skipped).
timeout=${METRICS_TIMEOUT:-3}
whole=${timeout%%.*}; frac=${timeout#"$whole"}; frac=${frac#.}000000
budget_us=$(( ${whole:-0} * 1000000 + 10#${frac:0:6} - 500000 ))
(( budget_us > 100000 )) || budget_us=100000
deadline=$((t0 + budget_us))
response=""
while :; do
  left=$((deadline - ${EPOCHREALTIME/./}))
  (( left > 0 )) || break
  printf -v wait '%d.%06d' $((left / 1000000)) $((left % 1000000))
  if ! IFS=' ' read -r -t "$wait" -u "$ack_fd" verb got path; then break; fi
  if [[ $verb == "done" && $got == "$nonce" ]]; then response=$path; break; fi
done

if [[ -z $response ]]; then
  if (( started )); then
    echo "tb_metrics_plugin: started the bridge; its first answer comes with the next poll" >&2
    exit 0
  fi
  echo "tb_metrics_plugin: the bridge did not answer within ${timeout}s (see $state/bridge.log)" >&2
  exit 1
fi
lines=()
mapfile -t lines < "$response"
if (( ${#lines[@]} )); then printf '%s\n' "${lines[@]}"; fi
printf '%s\n' "$nonce" > "$state/acked"
