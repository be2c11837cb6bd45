#!/usr/bin/env bash
# Usage: utils/prometheus.sh list|view|query|serve ARGS...   (COMMAND --help for one command)
#
# Browses the Prometheus TSDBs that RAY=1 jobs save in <job dir>/prometheus, after the
# job or while it still runs. view and query never write to the saved TSDB: they start a
# private Prometheus on a temporary copy and remove the copy when they stop.
# JOB_DIR_OR_TSDB is a job dir (with prometheus/ inside) or a TSDB dir itself (block
# dirs with meta.json and/or wal/). Times are printed in UTC.
#
# utils/prometheus.sh list [WORKSPACE]
#   Lists the jobs with saved metrics, newest first: job dir name, TSDB size, the first
#   and last sample time held in blocks (from their meta.json), and the WAL's last write
#   time when a WAL is present (recent samples not yet in a block; a job killed before
#   its first 2h block has WAL only). WORKSPACE: $JOB_WORKSPACE, else <repo>/outputs.
#
# utils/prometheus.sh view JOB_DIR_OR_TSDB [--port P] [--bind ADDR]
#   Serves the saved metrics in Prometheus' web UI until Ctrl-C. Prints the URL (graph
#   range set to the data's time range) and an SSH tunnel command for your laptop.
#   --port P      default: the first free port from 9190; a taken P is an error
#   --bind ADDR   default 127.0.0.1; --bind 0.0.0.0 opens the UI (no auth) to the network
#
# utils/prometheus.sh query JOB_DIR_OR_TSDB 'PROMQL' [--time T | --range START END STEP]
#   Runs one query and prints Prometheus' whole JSON response ({"status":"success",
#   "data":{...}}) on one line; pipe it to `jq .data.result` for the series. An instant
#   query is evaluated at --time T, default the END of the saved data (not now).
#   T, START, END: unix seconds or RFC3339 (2024-05-01T12:00:00Z). STEP: seconds or a
#   duration (15s, 1m). Bad PromQL: Prometheus' error on one line, exit 1.
#   Put `--` before a PROMQL that starts with '-'.
#
# utils/prometheus.sh serve JOB_DIR_OR_TSDB
#   For programs that run many queries (utils/diagnosis/tsdb.py): serves a copy on a free port of
#   127.0.0.1, prints one line "url=http://127.0.0.1:PORT first_ms=FIRST last_ms=LAST"
#   (the data's time range in unix milliseconds, both empty for an empty TSDB) once
#   Prometheus is ready, and stays up until its stdin closes; then it stops Prometheus,
#   removes the copy and exits 0.
#
# Environment: PROMETHEUS_BIN (default: prometheus on PATH); TMPDIR (where the copy goes,
# default /tmp: needs room for the WAL, blocks are hard-linked when on the same
# filesystem); PROMETHEUS_START_TIMEOUT (seconds to wait for WAL replay, default 300).
set -euo pipefail

PROG=prometheus.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=utils/launch/lib.sh
source "$repo/utils/launch/lib.sh"

work=""       # temp dir: config, log, response, tsdb/ (the copy)
prom_pid=""   # the Prometheus this script started (the only process it ever stops)

show_help() { # [COMMAND]: the usage header above (lib.sh usage), or the paragraph of one command
  usage | awk -v cmd="${1:-}" '
    cmd == "" { print; next }
    index($0, "utils/prometheus.sh " cmd " ") == 1 { on = 1 }
    on && $0 == "" { on = 0; done = 1 }
    on && !done { print }
  '
}

utc() { date -u -d "@$1" '+%Y-%m-%d %H:%M:%S'; } # SECONDS -> "YYYY-MM-DD HH:MM:SS"

duration() { # SECONDS -> 3d4h, 2h5m, 4m10s
  local s=$1
  if ((s >= 86400)); then printf '%dd%dh' $((s / 86400)) $((s % 86400 / 3600))
  elif ((s >= 3600)); then printf '%dh%dm' $((s / 3600)) $((s % 3600 / 60))
  else printf '%dm%ds' $((s / 60)) $((s % 60)); fi
}

has_blocks() { local m; for m in "$1"/*/meta.json; do [[ -f "$m" ]] && return 0; done; return 1; }

tsdb=""
resolve_tsdb() { # ARG: sets tsdb to the absolute TSDB dir, or dies
  local arg=$1 want="a job dir with prometheus/ inside, or a TSDB dir with block dirs (meta.json) and/or wal/"
  [[ -e "$arg" ]] || die "$arg does not exist (expected $want)"
  [[ -d "$arg" ]] || die "$arg is not a directory (expected $want)"
  if [[ -d "$arg/prometheus" ]]; then
    tsdb=$arg/prometheus
    [[ -d "$tsdb/wal" ]] || has_blocks "$tsdb" ||
      die "$tsdb holds no saved metrics yet (no block dir with meta.json, no wal/)"
  elif [[ -d "$arg/wal" ]] || has_blocks "$arg"; then
    tsdb=$arg
  else
    die "$arg is neither a job dir nor a TSDB (expected $want)"
  fi
  tsdb=$(cd "$tsdb" && pwd -P)
}

prom=""
find_prometheus() {
  if [[ -n "${PROMETHEUS_BIN:-}" ]]; then
    prom=$(command -v "$PROMETHEUS_BIN") || true
    [[ -f "$prom" && -x "$prom" ]] ||
      die "PROMETHEUS_BIN=$PROMETHEUS_BIN is not an executable file (unset it to use prometheus from PATH)"
  else
    prom=$(command -v prometheus) ||
      die "prometheus not found on PATH: install it (apt-get install prometheus) or set PROMETHEUS_BIN=/path/to/prometheus"
  fi
  command -v curl >/dev/null || die "curl not found on PATH: install it (apt-get install curl)"
}

check_time() { # NAME VALUE: unix seconds or RFC3339 that date(1) accepts
  [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] && return 0
  [[ "$2" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$ ]] &&
    date -u -d "$2" +%s >/dev/null 2>&1 && return 0
  die_usage "bad $1 '$2': expected unix seconds (1714564800) or RFC3339 (2024-05-01T12:00:00Z)"
}

block_range() { # TSDB -> "FIRST_MS LAST_MS" over its blocks (meta.json maxTime is exclusive); nothing if none
  local metas=("$1"/*/meta.json)
  [[ -f "${metas[0]}" ]] || return 0
  awk '
    function num(re) { match($0, re); s = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", s); return s + 0 }
    FNR == 1 { skip = FILENAME ~ /\.tmp[^\/]*\/meta\.json$/; got_min = got_max = 0 }
    skip { next }
    !got_min && /"minTime"/ { v = num("\"minTime\": *[0-9]+"); if (lo == "" || v < lo) lo = v; got_min = 1 }
    !got_max && /"maxTime"/ { v = num("\"maxTime\": *[0-9]+") - 1; if (hi == "" || v > hi) hi = v; got_max = 1 }
    END { if (lo != "") printf "%.0f %.0f\n", lo, hi }
  ' "${metas[@]}"
}

operand="" # one_operand CMD WHAT ARG...: sets operand to CMD's only argument; handles --help, options and extras
one_operand() {
  local cmd=$1 what=$2
  shift 2
  operand=""
  while (($#)); do
    case $1 in
      -h | --help) show_help "$cmd"; exit 0 ;;
      -?*) die_usage "unknown option $1 for $cmd (it takes only $what)" ;;
      *) [[ -z "$operand" ]] || die_usage "$cmd takes one $what, got '$operand' and '$1'"; operand=$1 ;;
    esac
    shift
  done
}

cmd_list() {
  local ws d job size range first last wal_at key
  one_operand list WORKSPACE "$@"
  ws=${operand:-${JOB_WORKSPACE:-$repo/outputs}}
  [[ -d "$ws" ]] || die "workspace $ws is not a directory (give WORKSPACE or set JOB_WORKSPACE)"
  {
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' 9999999999 JOB SIZE 'FIRST (UTC)' 'LAST (UTC)' 'WAL LAST WRITE (UTC)'
    for d in "$ws"/*/prometheus; do
      [[ -d "$d" ]] || continue
      job=${d%/prometheus}
      size=$(du -sh "$d" 2>/dev/null | cut -f1) || true
      range=$(block_range "$d")
      first=- last=- wal_at=- key=$(stat -c %Y "$d")
      if [[ -n "$range" ]]; then
        first=$(utc $((${range% *} / 1000))) last=$(utc $((${range#* } / 1000))) key=$((${range#* } / 1000))
      fi
      if [[ -d "$d/wal" ]]; then
        wal_at=$(find "$d/wal" -type f -printf '%T@\n' 2>/dev/null | sort -n | tail -n1) || true
        if [[ -n "$wal_at" ]]; then
          wal_at=${wal_at%.*} key=$((wal_at > key ? wal_at : key)) wal_at=$(utc "$wal_at")
        else
          wal_at="(empty)"
        fi
      fi
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$key" "${job##*/}" "${size:-?}" "$first" "$last" "$wal_at"
    done
  } | sort -t $'\t' -k1,1nr -k2,2r | cut -f2- | awk -F '\t' '
    { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } }
    END { for (r = 1; r <= NR; r++) { line = ""; for (i = 1; i <= NF; i++) line = line sprintf("%-" w[i] "s  ", cell[r, i]); sub(/ +$/, "", line); print line } }'
}

cleanup() {
  if [[ -n "$prom_pid" ]] && kill -0 "$prom_pid" 2>/dev/null; then
    kill -TERM "$prom_pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do kill -0 "$prom_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$prom_pid" 2>/dev/null || true
    wait "$prom_pid" 2>/dev/null || true
  fi
  if [[ -n "$work" ]]; then rm -rf "$work"; fi
}

copy_tsdb() { # SRC DST: what Prometheus needs, never lock/queries.active/*.tmp
  local src=$1 dst=$2 d
  mkdir "$dst" || return 1
  # Head chunks and WAL first, blocks last: a block cut from the head while we copy then
  # shows up twice (queries merge duplicates), never not at all. These are real copies:
  # Prometheus repairs/truncates them in place on open.
  for d in chunks_head wal; do
    if [[ -d "$src/$d" ]]; then cp -R --reflink=auto "$src/$d" "$dst/$d" || return 1; fi
  done
  if [[ -d "$dst/wal" ]]; then find "$dst/wal" -maxdepth 1 -name '*.tmp' -exec rm -rf {} +; fi
  # Blocks are immutable (Prometheus replaces a meta.json or tombstones file by rename,
  # never writes in place): hard links are safe and instant, else copy.
  for d in "$src"/*/; do
    d=${d%/}
    [[ -f "$d/meta.json" && "${d##*/}" != *.tmp* ]] || continue
    cp -R -l "$d" "$dst/" 2>/dev/null || { rm -rf "${dst:?}/${d##*/}"; cp -R --reflink=auto "$d" "$dst/"; } || return 1
  done
}

api="" # http://HOST:PORT of the started Prometheus
# curl to our own Prometheus: never via a proxy (http_proxy is common on clusters), [::1] is no glob
http() { curl -s --globoff --noproxy '*' "$@"; }

start_prometheus() { # BIND PORT: 0 ready, 2 port taken meanwhile, dies otherwise
  local bind=$1 port=$2 host=$1 deadline
  [[ "$bind" == *:* ]] && bind="[$bind]"
  case $host in 0.0.0.0) host=127.0.0.1 ;; ::) host='[::1]' ;; *:*) host="[$host]" ;; esac
  api=http://$host:$port
  "$prom" --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --storage.tsdb.retention.time=100y \
    --storage.tsdb.min-block-duration=2h --storage.tsdb.max-block-duration=2h \
    --web.listen-address="$bind:$port" >"$work/prometheus.log" 2>&1 &
  prom_pid=$!
  deadline=$((SECONDS + ${PROMETHEUS_START_TIMEOUT:-300}))
  until http -f --max-time 5 -o /dev/null "$api/-/ready"; do
    if ! kill -0 "$prom_pid" 2>/dev/null; then
      wait "$prom_pid" || true
      prom_pid=""
      grep -q 'address already in use' "$work/prometheus.log" && return 2
      die "prometheus exited at start: $(grep -m1 'level=error' "$work/prometheus.log" || tail -n1 "$work/prometheus.log")"
    fi
    ((SECONDS < deadline)) || die "prometheus not ready after ${PROMETHEUS_START_TIMEOUT:-300}s (raise PROMETHEUS_START_TIMEOUT for a big WAL)"
    sleep 0.05
  done
}

serve() { # BIND PORT EXPLICIT(0|1): copy the TSDB and start Prometheus on it
  local bind=$1 port=$2 explicit=$3 try rc
  work=$(mktemp -d "${TMPDIR:-/tmp}/prometheus-sh.XXXXXX")
  printf '# no scrape targets: serves a copy of %s\nscrape_configs: []\n' "$tsdb" >"$work/prometheus.yml"
  # A live TSDB can drop a block or WAL segment while we copy it: start over.
  for try in 1 2 3; do
    copy_tsdb "$tsdb" "$work/tsdb" 2>"$work/copy.err" && break
    rm -rf "$work/tsdb"
    ((try < 3)) || die "could not copy $tsdb to $work: $(tail -n1 "$work/copy.err") (set TMPDIR to a place with room)"
  done
  for try in 1 2 3 4 5; do
    rc=0
    start_prometheus "$bind" "$port" || rc=$?
    ((rc == 0)) && return 0
    ((explicit)) && die "port $port is in use: pick another --port, or leave --port out to take a free one"
    port=$(free_port $((port + 1))) || break
  done
  die "no free port found for prometheus (pass --port P)"
}

data_range() { # -> "FIRST_MS LAST_MS" of the served copy (blocks + head), or nothing
  local range head lo hi
  range=$(block_range "$work/tsdb")
  head=$(http -f "$api/api/v1/status/tsdb") || head=""
  if [[ "$head" =~ \"numSeries\":([1-9][0-9]*).*\"minTime\":([0-9]+),\"maxTime\":([0-9]+) ]]; then
    lo=${BASH_REMATCH[2]} hi=${BASH_REMATCH[3]}
    if [[ -n "$range" ]]; then
      lo=$((${range% *} < lo ? ${range% *} : lo)) hi=$((${range#* } > hi ? ${range#* } : hi))
    fi
    range="$lo $hi"
  fi
  [[ -z "$range" ]] || printf '%s\n' "$range"
}

cmd_view() {
  local target="" port="" bind=127.0.0.1 range lo hi end path host url
  while (($#)); do
    case $1 in
      -h | --help) show_help view; exit 0 ;;
      --port | --bind) (($# >= 2)) || die_usage "$1 needs a value"
        if [[ "$1" == --port ]]; then port=$2; else bind=$2; fi; shift ;;
      -?*) die_usage "unknown option $1 for view (expected --port P or --bind ADDR)" ;;
      *) [[ -z "$target" ]] || die_usage "view takes one JOB_DIR_OR_TSDB, got '$target' and '$1'"; target=$1 ;;
    esac
    shift
  done
  [[ -n "$target" ]] || die_usage "view needs JOB_DIR_OR_TSDB (a job dir or a TSDB dir)"
  if [[ -n "$port" ]]; then
    [[ "$port" =~ ^[0-9]{1,5}$ && "$port" -ge 1 && "$port" -le 65535 ]] || die_usage "bad --port '$port': expected a number 1-65535"
  fi
  [[ "$bind" =~ ^[A-Za-z0-9._:-]+$ ]] || die_usage "bad --bind '$bind': expected an address such as 127.0.0.1 or 0.0.0.0"
  resolve_tsdb "$target"
  find_prometheus
  if [[ -n "$port" ]]; then
    ! port_in_use "$port" || die "port $port is in use: pick another --port, or leave --port out to take a free one"
    serve "$bind" "$port" 1
  else
    port=$(free_port 9190) || die "no free port in 9190-9289 (pass --port P)"
    serve "$bind" "$port" 0
  fi
  port=${api##*:}
  case $bind in 0.0.0.0 | ::) host=$(hostname -f 2>/dev/null || hostname) ;; *) host=${api#http://} host=${host%:*} ;; esac
  # the UI's start page (Debian: /classic/graph, upstream: /graph)
  path=$(http -o /dev/null -w '%{redirect_url}' "$api/") || path=""
  path=/${path#*://*/}
  [[ "$path" != / ]] || path=/graph
  url="http://$host:$port${path%/}"
  range=$(data_range)
  local stop=0
  trap 'stop=1' INT TERM HUP # from here on a stop request is the normal end: exit 0
  echo "Serving a copy of $tsdb (the saved TSDB is not touched)"
  if [[ -n "$range" ]]; then
    lo=$((${range% *} / 1000)) hi=$(((${range#* } + 999) / 1000))
    echo "Data:    $(utc "$lo") .. $(utc "$hi") UTC ($(duration $((hi - lo))))"
    # the UI takes the end to the minute and the range in whole units: round both outwards
    end=$(((hi + 59) / 60 * 60))
    url+="?g0.expr=&g0.tab=0&g0.range_input=$(((end - lo + 59) / 60))m&g0.end_input=$(date -u -d "@$end" '+%Y-%m-%d%%20%H%%3A%M')"
  else
    echo "Data:    none yet (empty TSDB)"
  fi
  echo "Open:    $url"
  if [[ "$bind" == 0.0.0.0 || "$bind" == :: ]]; then
    echo "Warning: listening on all interfaces: anyone who can reach $host:$port sees these metrics (no auth)"
  else
    echo "Tunnel:  ssh -N -L $port:$host:$port $(hostname -f 2>/dev/null || hostname)   (on your laptop, then open the URL there)"
  fi
  echo "Ctrl-C stops Prometheus and removes the copy in $work"
  # Not `wait $prom_pid`: a signal that lands just before it would be handled, then ignored.
  while ((!stop)) && kill -0 "$prom_pid" 2>/dev/null; do
    sleep 0.5 &
    wait $! || true # a trapped signal ends this wait at once
  done
  ((stop)) || die "prometheus stopped on its own: $(tail -n1 "$work/prometheus.log")"
}

cmd_query() {
  local args=() t="" range=() form=() range_s port code msg
  while (($#)); do
    case $1 in
      -h | --help) show_help query; exit 0 ;;
      --time) (($# >= 2)) || die_usage "--time needs a value: unix seconds or RFC3339"; t=$2; shift ;;
      --range) (($# >= 4)) || die_usage "--range needs START END STEP (e.g. --range 1714564800 1714568400 15s)"
        range=("$2" "$3" "$4"); shift 3 ;;
      --) shift; args+=("$@"); break ;;
      -?*) die_usage "unknown option $1 for query (expected --time T or --range START END STEP)" ;;
      *) args+=("$1") ;;
    esac
    shift
  done
  ((${#args[@]} == 2)) || die_usage "query needs JOB_DIR_OR_TSDB and one 'PROMQL' (quote it), got ${#args[@]} argument(s)"
  [[ -z "$t" || ${#range[@]} -eq 0 ]] || die_usage "use either --time or --range, not both"
  [[ -z "$t" ]] || check_time --time "$t"
  if ((${#range[@]})); then
    check_time START "${range[0]}"
    check_time END "${range[1]}"
    [[ "${range[2]}" =~ ^[0-9]+(\.[0-9]+)?$|^([0-9]+(ms|[smhdwy]))+$ ]] ||
      die_usage "bad STEP '${range[2]}': expected seconds (15) or a duration (15s, 1m)"
  fi
  resolve_tsdb "${args[0]}"
  find_prometheus
  # a random start keeps 9190 for view and makes parallel queries collide less
  port=$(free_port $((20000 + RANDOM % 10000))) || die "no free port for prometheus"
  serve 127.0.0.1 "$port" 0
  if ((${#range[@]})); then
    code=$(http -S -o "$work/response" -w '%{http_code}' "$api/api/v1/query_range" \
      --data-urlencode "query=${args[1]}" --data-urlencode "start=${range[0]}" \
      --data-urlencode "end=${range[1]}" --data-urlencode "step=${range[2]}")
  else
    if [[ -z "$t" ]]; then
      range_s=$(data_range)
      [[ -z "$range_s" ]] || t=$(printf '%d.%03d' $((${range_s#* } / 1000)) $((${range_s#* } % 1000)))
    fi
    form=(--data-urlencode "query=${args[1]}")
    [[ -z "$t" ]] || form+=(--data-urlencode "time=$t")
    code=$(http -S -o "$work/response" -w '%{http_code}' "$api/api/v1/query" "${form[@]}")
  fi
  if [[ "$code" == 200 ]] && grep -q '^{"status":"success"' "$work/response"; then
    cat "$work/response"
    echo
    return 0
  fi
  msg=$(sed -n 's/.*"errorType":"\([^"]*\)","error":"\(\([^"\\]\|\\.\)*\)".*/\1: \2/p' "$work/response" | sed 's/\\"/"/g; s/\\n/ /g; s/\\\\/\\/g')
  die "query failed: ${msg:-HTTP $code: $(head -c 300 "$work/response")}"
}

cmd_serve() {
  local target port range rc
  one_operand serve JOB_DIR_OR_TSDB "$@"
  target=$operand
  [[ -n "$target" ]] || die_usage "serve needs JOB_DIR_OR_TSDB (a job dir or a TSDB dir)"
  resolve_tsdb "$target"
  find_prometheus
  port=$(free_port $((20000 + RANDOM % 10000))) || die "no free port for prometheus"
  serve 127.0.0.1 "$port" 0
  range=$(data_range)
  if [[ -n "$range" ]]; then echo "url=$api first_ms=${range% *} last_ms=${range#* }"; else echo "url=$api first_ms= last_ms="; fi
  while :; do # until stdin reaches EOF; notice a Prometheus that died meanwhile
    rc=0
    read -r -t 1 _ || rc=$?
    ((rc == 0)) && continue
    ((rc > 128)) || return 0
    kill -0 "$prom_pid" 2>/dev/null || die "prometheus stopped on its own: $(tail -n1 "$work/prometheus.log")"
  done
}

main() {
  local cmd=${1:-}
  case $cmd in
    list | view | query | serve)
      shift
      trap cleanup EXIT
      trap 'exit 130' INT TERM HUP
      "cmd_$cmd" "$@"
      ;;
    -h | --help | help) show_help "${2:-}" ;;
    "") show_help >&2; exit 1 ;;
    *) die_usage "unknown command '$cmd' (expected list, view or query, or serve for programs; see --help)" ;;
  esac
}

main "$@"
