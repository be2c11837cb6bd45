#!/usr/bin/env bash
# Usage: utils/observe/job_services.sh start | fallback WHY | stop
#
# The job's head-node services for RAY=1: Prometheus and TensorBoard.
#   start  Prometheus (PROMETHEUS_BIN or prometheus on PATH) scraping every file_sd target in
#          $JOB_DIR/metrics/targets/ (each node's exporter and Ray metrics port) every
#          METRICS_INTERVAL seconds (default 5) into the TSDB $JOB_DIR/prometheus (retention
#          100y), restarted if it dies; TensorBoard over $JOB_DIR. Both bind DASHBOARD_BIND
#          (default 127.0.0.1) on a free port from 9190 / 6006. Prints the OBSERVE block
#          (URLs, SSH tunnel commands, where the TSDB is, how to browse it later; with
#          RAY_DASHBOARD_PORT the Ray dashboard, and with MST_RAY_TOKEN_FILE where its token is:
#          the path, never the value; with MST_RAY_FALLBACK=WHY the line "ray: off - WHY; ..."
#          instead: the job trains without Ray, and this is why). Prometheus evaluates the alert
#          rules utils/observe/alert_rules.yml (from utils/diagnosis/alerts.tsv);
#          utils/observe/alert_relay.py prints a line into the job log when one starts or stops
#          firing ("alert: firing ..."). With METRICS_REMOTE_WRITE_URL, Prometheus also sends every series it scrapes there (remote write) with the labels
#          job_id, user and model, authenticated with METRICS_REMOTE_WRITE_CREDENTIALS (a mode 600
#          file: the password for METRICS_REMOTE_WRITE_USER, else a bearer token; Prometheus reads
#          it itself); the OBSERVE block says where, or why not ("remote_write: off - WHY").
#   fallback WHY  Ray stopped being usable after start: prints the OBSERVE block again, its Ray
#          lines replaced by "ray: off - WHY; ...".
#   stop   stops them (SIGTERM: Prometheus flushes its head block; sent between two scrapes,
#          utils/observe/prom_between_scrapes.py) and waits; a TSDB on node-local disk is copied
#          into the job dir a last time and removed from the node; a second stop does nothing.
# Where the job dir's file system is one Prometheus does not support (NFS and the like: lib.sh
# tsdb_place; MST_TSDB_FSTYPE forces the type for tests), Prometheus writes the TSDB in a private
# directory on this node's disk (in TMPDIR) and utils/observe/tsdb_mirror.py copies it into
# $JOB_DIR/prometheus every METRICS_TSDB_COPY_INTERVAL seconds (default 60) and at the end (here, or
# by the copier itself on the SIGTERM Slurm sends every process of a cancelled job); the OBSERVE block
# says so ("tsdb_local: ..."). A job killed with SIGKILL keeps what the last copy held.
# A missing Prometheus is reported and skipped: the job still runs.
set -uo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../launch/lib.sh"; usage; exit; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../launch/lib.sh"
PROG=job_services.sh
: "${JOB_DIR:?}" "${JOB_HOSTNAME:?}"
run_dir="$JOB_DIR/metrics/run"
bind=${DASHBOARD_BIND:-127.0.0.1}
interval=${METRICS_INTERVAL:-5}
copy_every=${METRICS_TSDB_COPY_INTERVAL:-60}
py=${MST_PYTHON:-python3}

ray_off() {  # WHY: the OBSERVE line of a RAY=1 job that trains without Ray
  printf 'ray: off - %s; training with the plain launch (metrics, Prometheus and TensorBoard stay on)\n' "${1//$'\n'/ }"
}

observe() {  # LINE...: print the OBSERVE block with these lines, then where the TSDB is
  echo "==================== OBSERVE ===================="
  printf '%s\n' "$@"
  echo "tsdb: $JOB_DIR/prometheus"
  echo "browse_later: utils/prometheus.sh view $JOB_DIR"
  echo "================================================="
}

# tsdb_store: sets store, the directory Prometheus writes the TSDB in, and tsdb_line, the OBSERVE line
# about it (empty when in place). On a file system Prometheus does not support (lib.sh tsdb_place) it is a
# private directory on this node's disk (lib.sh job_scratch, in TMPDIR), named in
# $run_dir/tsdb.local for `stop`, which copies it into the job dir a last time and removes it.
store="$JOB_DIR/prometheus" tsdb_line=""
tsdb_store() {
  local place fs scratch
  read -r place fs <<< "$(tsdb_place "$JOB_DIR")"
  if [[ "$place" == node_local ]]; then
    if scratch=$(job_scratch 2> "$run_dir/tsdb.err") && mkdir -- "$scratch/tsdb"; then
      printf '%s\n' "$scratch" > "$run_dir/tsdb.local"
      store="$scratch/tsdb"
      tsdb_line="tsdb_local: $store   (the job dir is on $fs, which Prometheus does not support: written on this node's disk, copied to the tsdb every $copy_every s and at the end; metrics/tsdb-copy.log)"
      return 0
    fi
    tsdb_line="tsdb_local: none - $(head -c 300 "$run_dir/tsdb.err" | tr '\n' ' '); written in place on $fs, which Prometheus does not support"
  fi
}

label() { printf '%s' "${1//[^A-Za-z0-9._:@+-]/_}"; }  # a label value safe in single quotes
# remote_write: for METRICS_REMOTE_WRITE_URL, sets rw_global (the external labels, under global:),
# rw_section (remote_write:) and rw_line (the OBSERVE line: where to, or why not); all empty when unset.
rw_global="" rw_section="" rw_line=""
remote_write() {
  local url=${METRICS_REMOTE_WRITE_URL:-} cred=${METRICS_REMOTE_WRITE_CREDENTIALS:-} user=${METRICS_REMOTE_WRITE_USER:-}
  local why="" auth="none" job model me
  [[ -n "$url" ]] || return 0
  if ! why=$( (check_remote_write_url "$url") 2>&1 ) ||
    { [[ -n "$cred" ]] && ! why=$( (check_remote_write_credentials "$cred") 2>&1 ); }; then
    rw_line="remote_write: off - ${why#*: }"
    return 0
  fi
  if [[ -n "$user" && ! "$user" =~ ^[A-Za-z0-9._@+-]{1,128}$ ]]; then
    rw_line="remote_write: off - METRICS_REMOTE_WRITE_USER='$user' must be a name of letters, digits and . _ @ + -"
    return 0
  fi
  job=$(label "${JOB_ID:-}") model=$(label "${MODEL:-}") me=$(label "$(id -un)")
  rw_global=$'  external_labels:\n'"    job_id: '$job'"$'\n'"    user: '$me'"$'\n'"    model: '$model'"
  rw_section=$'remote_write:\n'"  - url: '$url'"
  if [[ -n "$cred" && -n "$user" ]]; then
    rw_section+=$'\n    basic_auth:\n'"      username: '$user'"$'\n'"      password_file: '$cred'"
    auth="basic, user $user, password file $cred"
  elif [[ -n "$cred" ]]; then
    rw_section+=$'\n    authorization:\n      type: Bearer\n'"      credentials_file: '$cred'"
    auth="bearer token file $cred"
  fi
  rw_line="remote_write: $url   labels: job_id=$job user=$me model=$model   auth: $auth"
}

case "${1:-}" in
  start)
    for d in "$JOB_DIR/metrics" "$JOB_DIR/metrics/targets" "$run_dir" "$JOB_DIR/prometheus"; do own_dir "$d"; done
    remote_write
    cat > "$JOB_DIR/metrics/prometheus.yml" <<CONF
global:
  scrape_interval: ${interval}s
  scrape_timeout: $(( interval > 1 ? interval - 1 : 1 ))s
  evaluation_interval: ${interval}s
$rw_global
rule_files: ['$here/alert_rules.yml']
scrape_configs:
  - job_name: job
    honor_labels: true
    file_sd_configs:
      - files: ['$JOB_DIR/metrics/targets/*.json']
        refresh_interval: ${interval}s
$rw_section
CONF
    prom=${PROMETHEUS_BIN:-$(command -v prometheus || true)}
    lines=()
    if [[ -n "$prom" && -x "$prom" ]]; then
      prom_port=$(free_port 9190)
      tsdb_store
      lines+=("prometheus: http://$bind:$prom_port   tunnel: ssh -N -L $prom_port:$bind:$prom_port $JOB_HOSTNAME")
      [[ -z "$tsdb_line" ]] || lines+=("$tsdb_line")
      # supervise: restart Prometheus if it dies, until the stop file appears
      (
        while [[ ! -e "$run_dir/stop" ]]; do
          "$prom" --config.file="$JOB_DIR/metrics/prometheus.yml" --storage.tsdb.path="$store" \
            --storage.tsdb.retention.time=100y --web.listen-address="$bind:$prom_port" \
            >> "$JOB_DIR/metrics/prometheus.log" 2>&1 &
          echo $! > "$run_dir/prometheus.pid"
          wait $!
          [[ -e "$run_dir/stop" ]] || { echo "job_services.sh: Prometheus exited; restarting" >&2; sleep 1; }
        done
      ) &
      echo $! > "$run_dir/supervisor.pid"
      echo "$prom_port" > "$run_dir/prometheus.port"
      # firing alerts (utils/observe/alert_rules.yml) become lines of the job log (alert_relay.py)
      "$py" "$here/alert_relay.py" "http://$bind:$prom_port" --every "$interval" --stop-file "$run_dir/stop" &
      echo $! > "$run_dir/relay.pid"
      if [[ "$store" != "$JOB_DIR/prometheus" ]]; then
        "$py" "$here/tsdb_mirror.py" "$store" "$JOB_DIR/prometheus" --every "$copy_every" --stop-file "$run_dir/stop" \
          --pid-file "$run_dir/prometheus.pid" --remove "${store%/tsdb}" >> "$JOB_DIR/metrics/tsdb-copy.log" 2>&1 &
        echo $! > "$run_dir/mirror.pid"
      fi
    else
      echo "job_services.sh: Prometheus not found (apt-get install prometheus, or set PROMETHEUS_BIN): no TSDB for this job" >&2
    fi
    [[ -z "$rw_line" ]] || lines+=("$rw_line")
    tb_port=$(free_port 6006)
    "${MST_PYTHON:-python3}" -m tensorboard.main --logdir "$JOB_DIR" --host "$bind" --port "$tb_port" \
      >> "$JOB_DIR/metrics/tensorboard.log" 2>&1 &
    echo $! > "$run_dir/tensorboard.pid"
    lines+=("tensorboard: http://$bind:$tb_port   tunnel: ssh -N -L $tb_port:$bind:$tb_port $JOB_HOSTNAME")
    # the lines without Ray's, for a later `fallback` (ours, in the job's own metrics/run)
    printf '%s\n' "${lines[@]}" > "$run_dir/observe"
    if [[ -n "${MST_RAY_FALLBACK:-}" ]]; then
      lines+=("$(ray_off "$MST_RAY_FALLBACK")")
    else
      [[ -n "${RAY_DASHBOARD_PORT:-}" ]] &&
        lines+=("ray_dashboard: http://$bind:$RAY_DASHBOARD_PORT   tunnel: ssh -N -L $RAY_DASHBOARD_PORT:$bind:$RAY_DASHBOARD_PORT $JOB_HOSTNAME")
      [[ -n "${MST_RAY_TOKEN_FILE:-}" ]] &&
        lines+=("ray_token: $MST_RAY_TOKEN_FILE   (mode 600, gone when the job ends; the dashboard asks for its content; ray CLI: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<that file>; HTTP: Authorization: Bearer <content>)")
    fi
    observe "${lines[@]}"
    ;;
  fallback)
    (( $# == 2 )) || die "usage: job_services.sh fallback WHY"
    mapfile -t lines < "$run_dir/observe" 2>/dev/null || lines=()
    observe "${lines[@]}" "$(ray_off "$2")"
    ;;
  stop)
    touch "$run_dir/stop" 2>/dev/null
    # the TSDB's copier ends its pass and exits (it looks for the stop file 5 times a second)
    if pid=$(cat "$run_dir/mirror.pid" 2>/dev/null); then
      rm -f -- "$run_dir/mirror.pid"
      for _ in $(seq 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -KILL "$pid" 2>/dev/null
    fi
    for f in prometheus tensorboard; do
      pid=$(cat "$run_dir/$f.pid" 2>/dev/null) || continue
      rm -f -- "$run_dir/$f.pid"  # a second stop (the job's cleanup after its normal end) finds none
      kill -0 "$pid" 2>/dev/null || continue
      # between two scrapes: one that the shutdown cancels is saved as failed and ends its target's series
      if [[ "$f" == prometheus ]] && port=$(cat "$run_dir/prometheus.port" 2>/dev/null); then
        "${MST_PYTHON:-python3}" "$here/prom_between_scrapes.py" "http://$bind:$port" "$interval" 2>/dev/null
      fi
      kill -TERM "$pid" 2>/dev/null || continue
      for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    done
    sup=$(cat "$run_dir/supervisor.pid" 2>/dev/null) && wait "$sup" 2>/dev/null
    # a TSDB on node-local disk: the last copy into the job dir, then the node's copy is removed
    # (unless the copier made it already: a SIGTERM from Slurm to every process of the job)
    if scratch=$(cat "$run_dir/tsdb.local" 2>/dev/null) && [[ -d "$scratch/tsdb" ]]; then
      rm -f -- "$run_dir/tsdb.local"
      if out=$("$py" "$here/tsdb_mirror.py" "$scratch/tsdb" "$JOB_DIR/prometheus" --final 2>&1); then
        printf '%s\n' "$out" >> "$JOB_DIR/metrics/tsdb-copy.log"
        rm -rf -- "$scratch"
        echo "tsdb: the last copy from this node's disk is in $JOB_DIR/prometheus (${out#* tsdb_mirror: })"
      else
        echo "job_services.sh: ${out#tsdb_mirror.py: }" >&2
      fi
    fi
    ;;
  *) die_usage "unknown command '${1:-}': use start or stop (see --help)" ;;
esac
exit 0
