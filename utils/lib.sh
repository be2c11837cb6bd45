# shellcheck shell=bash
shopt -s extglob
# Shared helpers for the launcher scripts. Source it; it defines functions only.
#   die MSG...            print "<prog>: MSG" to stderr and exit 1
#   port_in_use PORT      true if something listens on TCP PORT (any address, IPv4 or IPv6)
#   free_port START [N]   print the first port >= START that nobody listens on (tries N, default 100)
#   private_dir PARENT    create a new directory only this user can enter, print its path
#   job_scratch           this job's private scratch on this node (labelled for preflight's cleanup)

die() {
  printf '%s: %s\n' "${PROG:-${0##*/}}" "$*" >&2
  exit 1
}

# Reads /proc/net/tcp{,6} directly: no ss/netstat/python needed on compute nodes.
port_in_use() {
  local hex f
  printf -v hex ':%04X' "$1"
  for f in /proc/net/tcp /proc/net/tcp6; do
    [[ -r "$f" ]] || continue
    # field 2 is local_address (ADDR:PORT in hex), field 4 is the state (0A = LISTEN)
    if awk -v p="$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' "$f"; then
      return 0
    fi
  done
  return 1
}

free_port() {
  local port=$1 tries=${2:-100}
  while (( tries-- > 0 )); do
    if ! port_in_use "$port"; then
      printf '%s\n' "$port"
      return 0
    fi
    port=$((port + 1))
  done
  return 1
}

# private_dir PARENT: a fresh directory PARENT/mst.XXXXXXXX for one job's secrets and sockets on
# this node. mktemp -d makes it atomically (a new random name, mode 0700) so nobody else can have
# made it first; it is then checked (a directory, not a link, ours, mode 700) before it is used.
# The name is short on purpose: Ray puts Unix sockets below it (107-byte path limit).
# Dies with one line when PARENT is unusable.
private_dir() {
  local parent=$1 d mode
  d=$(mktemp -d "$parent/mst.XXXXXXXX" 2>/dev/null) ||
    die "cannot create a private directory in '$parent' (set TMPDIR to a writable node-local directory)"
  mode=$(stat -c %a "$d" 2>/dev/null || true)
  [[ -d "$d" && ! -L "$d" && -O "$d" && "$mode" == 700 ]] ||
    die "'$d' is not a private directory (owner or mode $mode changed under us); refusing to use it"
  printf '%s\n' "$d"
}

# job_scratch: a private_dir in ${TMPDIR:-/tmp} for this job on this node, labelled in its file
# `job` with "JOB_SCHEDULER JOB_ID HOST" so preflight can tell a finished job's leftovers apart.
job_scratch() {
  local d
  d=$(private_dir "${TMPDIR:-/tmp}") || exit 1
  printf '%s %s %s\n' "${JOB_SCHEDULER:-unknown}" "${JOB_ID:-?}" "${JOB_HOSTNAME:-$(hostname)}" > "$d/job"
  printf '%s\n' "$d"
}

# safe_name STRING: a name safe for any shell and filesystem: [A-Za-z0-9._-] only,
# no leading dot or dash, at most 64 characters ("x" if nothing is left).
safe_name() {
  local s=${1//[^A-Za-z0-9._-]/_}
  s=${s##[.-]*([.-])}
  s=${s:0:64}
  printf '%s\n' "${s:-x}"
}

# model_names CONFIG_DIR: print the model names (config files without .yml), space-separated.
model_names() {
  local f n found=()
  for f in "$1"/*.yml; do [[ -e "$f" ]] && { n=${f##*/}; found+=("${n%.yml}"); }; done
  printf '%s\n' "${found[*]}"
}

# resolve_model NAME CONFIG_DIR: print the config name NAME stands for.
# Exact file name first, then a unique prefix, then a unique substring.
resolve_model() {
  local want=$1 dir=$2 n
  local -a names=() hits=()
  [[ "$want" =~ ^[A-Za-z0-9._-]+$ ]] || die "bad model name '$want': use letters, digits, '.', '_' or '-' (see configs/)"
  read -r -a names <<< "$(model_names "$dir")"
  for n in "${names[@]}"; do
    [[ "$n" == "$want" ]] && { printf '%s\n' "$n"; return 0; }
  done
  for n in "${names[@]}"; do [[ "$n" == "$want"* ]] && hits+=("$n"); done
  if (( ${#hits[@]} == 0 )); then
    for n in "${names[@]}"; do [[ "$n" == *"$want"* ]] && hits+=("$n"); done
  fi
  case ${#hits[@]} in
    1) printf '%s\n' "${hits[0]}" ;;
    0) die "unknown model '$want'; available: ${names[*]}" ;;
    *) die "ambiguous model '$want' matches: ${hits[*]}; give more of the name" ;;
  esac
}

# split_overrides ARG...: sort the arguments after `--` into two newline-separated lists,
# TRAIN_OVERRIDES (MaxText key=value) and TRAIN_ENV_OVERRIDES (NAME=VALUE from _env_NAME=VALUE).
# Dies on an argument without '=', a bad key or a value with a newline.
split_overrides() {
  local a key
  TRAIN_OVERRIDES="" TRAIN_ENV_OVERRIDES=""
  for a in "$@"; do
    [[ "$a" == *=* ]] || die "override '$a' has no '=': write key=value (MaxText) or _env_NAME=value (environment)"
    key=${a%%=*}
    [[ "$a" != *$'\n'* ]] || die "override '$key' has a newline in its value; values must be one line"
    if [[ "$key" == _env_* ]]; then
      [[ "${key#_env_}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "bad environment name in '$key=...': use _env_NAME=value with NAME like [A-Za-z_][A-Za-z0-9_]*"
      TRAIN_ENV_OVERRIDES+="${a#_env_}"$'\n'
    else
      [[ "$key" =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || die "bad MaxText key in override '$a': keys look like per_device_batch_size=2"
      TRAIN_OVERRIDES+="$a"$'\n'
    fi
  done
}

# redact_secrets: read text on stdin, hide the values of NAME=VALUE pairs whose NAME looks secret.
redact_secrets() {
  sed -E 's/((_env_)?[A-Za-z0-9_]*(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)[A-Za-z0-9_]*=)[^ ]*/\1<redacted>/Ig'
}
