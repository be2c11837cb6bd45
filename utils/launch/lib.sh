# shellcheck shell=bash
shopt -s extglob
# Shared helpers for the launcher scripts. Source it; it defines functions only.
#   usage                 print the running script's usage header (its --help)
#   die MSG...            print "<prog>: MSG" to stderr and exit 1
#   die_usage MSG...      the same, exit 2: the command line is wrong (see "Exit status" below)
#   port_in_use PORT      true if something listens on TCP PORT (any address, IPv4 or IPv6)
#   free_port START [N]   print the first port >= START that nobody listens on (tries N, default 100)
#   private_dir PARENT    create a new directory only this user can enter, print its path
#   job_scratch           this job's private scratch on this node (labelled for preflight's cleanup)
#   trust_problem PATH    why PATH is not ours to trust (a link, someone else's, writable by others); nothing if it is
#   check_trusted PATH WHAT [ADVICE]  die with one line unless PATH is ours to trust
#   check_trusted_under ROOT PATH WHAT [ADVICE]  the same for PATH and every directory between ROOT and it
#   own_dir PATH [MODE]   PATH as a directory of ours (made with mkdir when missing; mode 755 default,
#                         no inherited setgid), or die with one line
#   new_file PATH         create PATH as a new empty file of ours (never through a link), or die
#   node_root KIND        where this node's sys|proc|dev files are read (test hooks MST_*_ROOT)
#   host_settings SPEC    PREFLIGHT_HOST_SETTINGS checked against the table HOST_SETTINGS
#   resubmit_excluding CMD HOST...  the submit command CMD with --exclude naming HOSTs too
#   container_mounts DST...  CONTAINER_MOUNTS checked, as runtime flags in MOUNT_ARGS
#   config_header ARG...  utils/launch/config_header.py (a config's header: aliases, minimum nodes)
#   settings_names COLUMN / setting_default NAME / settings_renamed
#                         the launcher's settings table, utils/launch/settings.tsv

# The one help mechanism of every shell entry point (-h/--help): a script's usage header is its
# comment block from the line "# Usage: ..." to the first line that is not a comment; it is printed
# without the leading "# ". Lines before it (#!, #SBATCH) are skipped. Fails if there is no header.
usage() {
  awk '/^# Usage:/ { on = 1 } on && !/^#/ { exit } on { sub(/^# ?/, ""); print } END { exit !on }' \
    "${BASH_SOURCE[-1]}"
}

# Exit status of every shell entry point, on bad input one line on stderr and nothing done:
#   2  the command line is wrong: an unknown option or command, a missing or extra argument, an
#      option's value of the wrong form (-N two): checkable without looking at anything (die_usage)
#   1  everything else: a bad setting (environment, site file, settings.tsv's checks), a config or
#      override MaxText refuses, a path that does not exist or is not ours, a failure (die)
die() {
  printf '%s: %s\n' "${PROG:-${0##*/}}" "$*" >&2
  exit 1
}
die_usage() {
  printf '%s: %s\n' "${PROG:-${0##*/}}" "$*" >&2
  exit 2
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

# check_remote_write_url URL (check_settings at launch; job_services.sh again on the node):
# http(s)://HOST[:PORT]/PATH without credentials or quotes (it is written into the job's Prometheus
# configuration; the secret goes in METRICS_REMOTE_WRITE_CREDENTIALS).
check_remote_write_url() {
  local re='^https?://[][A-Za-z0-9.:-]+(/[A-Za-z0-9._~/%+=-]*)?$' shown=$1  # host: a name, IPv4, or [IPv6]
  [[ "$1" =~ $re ]] && return 0
  # the message never shows credentials put in the URL (it goes to the terminal or the job's log)
  [[ "$shown" =~ ^([a-z]+://)[^/]*@(.*)$ ]] && shown="${BASH_REMATCH[1]}<credentials>@${BASH_REMATCH[2]}"
  die "METRICS_REMOTE_WRITE_URL='$shown' must be http(s)://HOST[:PORT]/PATH (letters, digits, . _ ~ / % + = -), e.g. https://prom.example.org/api/v1/write; credentials go in METRICS_REMOTE_WRITE_CREDENTIALS"
}
# check_remote_write_credentials PATH: an absolute path to a file that group and others cannot read.
check_remote_write_credentials() {
  [[ "$1" == /* ]] || die "METRICS_REMOTE_WRITE_CREDENTIALS='$1' must be an absolute path (a file the job's first node sees)"
  [[ -f "$1" ]] || die "METRICS_REMOTE_WRITE_CREDENTIALS='$1' is not a file"
  (( (8#$(stat -L -c %a "$1") & 8#077) == 0 )) ||
    die "METRICS_REMOTE_WRITE_CREDENTIALS='$1' has mode $(stat -L -c %a "$1"): others can read your remote write secret; chmod 600 it"
}

# tsdb_place DIR: where a RAY=1 job's Prometheus writes its TSDB for a job directory DIR, as
# "in_place FSTYPE" or "node_local FSTYPE" (FSTYPE as `stat -f -c %T` names DIR's file system).
# Prometheus does not support NFS and other non-POSIX storage (network and FUSE file systems) for its
# TSDB: there it is written on node-local disk and copied into DIR (utils/observe/job_services.sh);
# local disks, Lustre and GPFS take it in place. MST_TSDB_FSTYPE, a test hook, stands for stat's answer.
tsdb_place() {
  local fs=${MST_TSDB_FSTYPE:-}
  [[ -n "$fs" ]] || fs=$(stat -f -c %T -- "$1" 2>/dev/null) || fs=unknown
  case $fs in
    nfs* | cifs | smb* | fuse* | 9p | v9fs | afs | coda | ncp* | sshfs) printf 'node_local %s\n' "$fs" ;;
    *) printf 'in_place %s\n' "$fs" ;;
  esac
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
# made it first; the setgid bit a group directory hands down (2700) is dropped; it is then checked
# (a directory, not a link, ours, mode 700) before it is used.
# The name is short on purpose: Ray puts Unix sockets below it (107-byte path limit).
# Dies with one line when PARENT is unusable.
private_dir() {
  local parent=$1 d mode
  d=$(mktemp -d "$parent/mst.XXXXXXXX" 2>/dev/null) ||
    die "cannot create a private directory in '$parent' (set TMPDIR to a writable node-local directory)"
  [[ -O "$d" && ! -L "$d" ]] && chmod g-s -- "$d"
  mode=$(stat -c %a "$d" 2>/dev/null || true)
  [[ -d "$d" && ! -L "$d" && -O "$d" && "$mode" == 700 ]] ||
    die "'$d' is not a private directory (owner or mode $mode changed under us); refusing to use it"
  printf '%s\n' "$d"
}

# job_scratch: a private_dir in ${TMPDIR:-/tmp} for this job on this node, labelled in its file
# `job` with "JOB_SCHEDULER JOB_ID HOST JOB_WORKSPACE" so preflight can tell a finished job's
# leftovers apart.
job_scratch() {
  local d
  d=$(private_dir "${TMPDIR:-/tmp}") || exit 1
  printf '%s %s %s %s\n' "${JOB_SCHEDULER:-unknown}" "${JOB_ID:-?}" "${JOB_HOSTNAME:-$(hostname)}" "${JOB_WORKSPACE:-?}" > "$d/job"
  printf '%s\n' "$d"
}

# --- trust in a shared workspace (docs/security.md#shared-workspaces) ---------------------------
# On a shared JOB_WORKSPACE (1777 scratch, 2775 group directory) anyone else may have made or
# replaced a path. A path decides what runs or where we write only when it is ours to trust: not a
# symbolic link, owned by us, and writable by neither group nor others. utils/trust.py is the same
# rule for the Python tools.

# trust_problem PATH: print why PATH is not ours to trust (one phrase), nothing when it is.
trust_problem() {
  local p=$1 uid user mode
  if [[ -L "$p" ]]; then
    printf 'is a symbolic link (to %s), owned by %s\n' "$(readlink -- "$p")" "$(stat -c %U -- "$p" 2>/dev/null || echo '?')"
    return 0
  fi
  [[ -e "$p" ]] || { printf 'does not exist\n'; return 0; }
  read -r uid user mode < <(stat -c '%u %U %a' -- "$p") || { printf 'cannot be read\n'; return 0; }
  if (( uid != EUID )); then
    printf 'is owned by %s (mode %04o), not by you (%s)\n' "$user" "$((8#$mode))" "$(id -un)"
  elif (( 8#$mode & 8#022 )); then
    printf 'is writable by others (mode %04o)\n' "$((8#$mode))"
  fi
}

# check_trusted PATH WHAT [ADVICE]: die with one line naming PATH, its owner and mode, unless it is
# ours to trust.
check_trusted() {
  local why
  why=$(trust_problem "$1")
  [[ -z "$why" ]] || die "refusing $2 $1: it $why${3:+; $3}"
}

# check_trusted_under ROOT PATH WHAT [ADVICE]: check_trusted for PATH and every directory between
# ROOT (not itself: a shared workspace) and PATH. PATH must lie under ROOT.
check_trusted_under() {
  local root=${1%/} p=$2 rel part cur
  [[ "$p" == "$root/"* ]] || die "refusing $3 $p: it is not under $root"
  rel=${p#"$root"/} cur=$root
  local -a parts
  IFS=/ read -r -a parts <<< "$rel"
  for part in "${parts[@]}"; do
    [[ -n "$part" ]] || continue
    cur+=/$part
    check_trusted "$cur" "$3" "${4:-}"
  done
}

# own_dir PATH [MODE]: PATH as a directory of ours that only we can write: made with mkdir when
# missing (the parent must exist; a name someone else made first is refused, never used), mode MODE
# (default 755) without the setgid bit a group directory hands down. Dies with one line otherwise.
own_dir() {
  local p=$1 mode=${2:-755}
  if [[ ! -e "$p" && ! -L "$p" ]]; then
    mkdir -- "$p" 2>/dev/null || [[ -d "$p" && ! -L "$p" ]] || die "cannot create the directory $p"
    [[ -O "$p" && ! -L "$p" ]] && chmod "0$mode" -- "$p" && chmod g-s -- "$p"
  fi
  check_trusted "$p" "the directory" "remove it or use a JOB_WORKSPACE of your own"
}

# new_file PATH: create PATH as a new empty regular file of ours (mode from the umask, at most 644),
# never through a link and never one that exists. Dies with one line otherwise.
new_file() {
  local p=$1
  [[ ! -e "$p" && ! -L "$p" ]] || die "refusing to write $p: it exists already"
  ( set -C; : > "$p" ) 2>/dev/null || die "cannot create $p (it appeared under us, or the directory is not writable)"
  [[ -f "$p" && ! -L "$p" && -O "$p" ]] || die "refusing $p: it $(trust_problem "$p")"
  chmod go-w -- "$p"
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

# config_header ARG...: utils/launch/config_header.py (the one reader of the configs' comment
# header; standard library only) under the project's Python when it exists, else the host's python3.
config_header() {
  local py
  for py in "${MST_VENV:+$MST_VENV/bin/python}" "${MAXTEXT_SLURM_VENV:-$(dirname "${BASH_SOURCE[0]}")/../../.venv}/bin/python" python3; do
    [[ -n "$py" ]] && command -v "$py" >/dev/null 2>&1 && { "$py" -I "$(dirname "${BASH_SOURCE[0]}")/config_header.py" "$@"; return; }
  done
  echo "config_header.py: no python3 here to read the configs' headers; install python3.12 (or set MAXTEXT_SLURM_PYTHON and run utils/setup_env.sh)" >&2
  return 1
}

# resolve_model NAME CONFIG_DIR: print the config name NAME stands for.
# Exact file name first, then a short name a config declares (its header's "# Aliases:" line),
# then a unique prefix, then a unique substring; an ambiguous name lists its candidates.
resolve_model() {
  local want=$1 dir=$2 n table alias model
  local -a names=() hits=()
  [[ "$want" =~ ^[A-Za-z0-9._-]+$ ]] || die "bad model name '$want': use letters, digits, '.', '_' or '-' (see configs/)"
  read -r -a names <<< "$(model_names "$dir")"
  for n in "${names[@]}"; do
    [[ "$n" == "$want" ]] && { printf '%s\n' "$n"; return 0; }
  done
  table=$(config_header aliases "$dir" 2>&1) || die "${table#config_header.py: }"
  while read -r alias model; do
    [[ "$alias" == "$want" ]] && { printf '%s\n' "$model"; return 0; }
  done <<< "$table"
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

# The launcher's settings, one row each: utils/launch/settings.tsv (its header says the columns).
SETTINGS_TSV=${BASH_SOURCE[0]%/*}
[[ "$SETTINGS_TSV" != "${BASH_SOURCE[0]}" ]] || SETTINGS_TSV=.
[[ "$SETTINGS_TSV" == /* ]] || SETTINGS_TSV=$PWD/$SETTINGS_TSV
SETTINGS_TSV+=/settings.tsv

# settings_rows: the table's rows, "NAME<TAB>DEFAULT<TAB>CHECK<TAB>SITE<TAB>CONTAINER<TAB>RESERVED<TAB>DOC".
settings_rows() { grep -v '^#' "$SETTINGS_TSV"; }

# settings_names site|container|reserved: the names whose column says yes, in the table's order.
settings_names() {
  local col
  case "$1" in site) col=4 ;; container) col=5 ;; reserved) col=6 ;; *) return 1 ;; esac
  settings_rows | awk -F'\t' -v c="$col" '$c == "yes" { print $1 }'
}

# setting_default NAME: NAME's default as the table writes it (nothing for "-").
setting_default() {
  settings_rows | awk -F'\t' -v n="$1" '$1 == n && $2 != "-" { print $2 }'
}

# settings_renamed: each old name of the table (check renamed:NEW) that is set hands its value to NEW
# (NEW set too: NEW wins), with one warning line on stderr each; the old name is unset. Accepted for
# one release (docs/env-contract.md "Renamed settings").
settings_renamed() {
  local old new
  while IFS=$'\t' read -r old new; do
    [[ -v "$old" ]] || continue
    if [[ -v "$new" ]]; then
      echo "${PROG:-launch}: warning: $old is renamed $new, which is set too and wins; unset $old" >&2
    else
      export "$new=${!old}"
      echo "${PROG:-launch}: warning: $old is renamed $new; its value is used this time, set $new instead (the old name goes in the next release)" >&2
    fi
    unset "$old"
  done < <(settings_rows | awk -F'\t' '$3 ~ /^renamed:/ { sub(/^renamed:/, "", $3); print $1 "\t" $3 }')
}

# Variables the launcher sets and checks itself: _env_ cannot set them (the trainer would run with
# values nobody validated). Prefixes MST_ JOB_ SLURM_ SLURMD_ SRUN_, and the table's reserved names
# (RESERVED_ENV, filled on first use).
RESERVED_ENV=""
OVERRIDES_MAX_BYTES=100000   # each list travels as one environment variable (Linux: 128 KiB at most)

# is_reserved_env NAME: true when NAME is one of the launcher's own variables.
is_reserved_env() {
  [[ -n "$RESERVED_ENV" ]] || RESERVED_ENV=$(settings_names reserved | grep -Ev '^(MST_|JOB_)' | tr '\n' ' ')
  [[ "$1" =~ ^(MST_|JOB_|SLURM_|SLURMD_|SRUN_) || " $RESERVED_ENV " == *" $1 "* ]]
}

# split_overrides ARG...: sort the arguments after `--` into two newline-separated lists,
# TRAIN_OVERRIDES (MaxText key=value) and TRAIN_ENV_OVERRIDES (NAME=VALUE from _env_NAME=VALUE,
# or from _env_NAME alone, which takes NAME's value from the caller's environment: a secret
# then never appears on a command line).
# Dies on an argument without '=', a bad key, a reserved name, a value with a newline, or lists
# longer than OVERRIDES_MAX_BYTES.
split_overrides() {
  local a key
  TRAIN_OVERRIDES="" TRAIN_ENV_OVERRIDES=""
  for a in "$@"; do
    if [[ "$a" =~ ^_env_([A-Za-z_][A-Za-z0-9_]*)$ ]]; then
      [[ -v "${BASH_REMATCH[1]}" ]] ||
        die "'$a' passes \$${BASH_REMATCH[1]} from your environment, but it is not set: export ${BASH_REMATCH[1]} first, or write $a=VALUE"
      a="$a=${!BASH_REMATCH[1]}"
    fi
    [[ "$a" == *=* ]] || die "override '$a' has no '=': write key=value (MaxText), _env_NAME=value or _env_NAME (environment)"
    key=${a%%=*}
    [[ "$a" != *$'\n'* ]] || die "override '$key' has a newline in its value; values must be one line"
    if [[ "$key" == _env_* ]]; then
      [[ "${key#_env_}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "bad environment name in '$key=...': use _env_NAME=value with NAME like [A-Za-z_][A-Za-z0-9_]*"
      [[ "$key" != _env_M_* ]] ||
        die "'$key' would set a MaxText key behind the schema check (MaxText reads M_<KEY> variables); write the key as an override, e.g. steps=100"
      is_reserved_env "${key#_env_}" &&
        die "'$key' sets a launcher variable, which _env_ cannot change; reserved: MST_* JOB_* SLURM_* SLURMD_* SRUN_* ${RESERVED_ENV% }"
      TRAIN_ENV_OVERRIDES+="${a#_env_}"$'\n'
    else
      [[ "$key" =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || die "bad MaxText key in override '$(shown_kv maxtext "$a")': keys look like per_device_batch_size=2"
      TRAIN_OVERRIDES+="$a"$'\n'
    fi
  done
  local n bytes LC_ALL=C
  for n in TRAIN_OVERRIDES TRAIN_ENV_OVERRIDES; do
    bytes=${#n}; bytes=${!n}; bytes=${#bytes}
    (( bytes <= OVERRIDES_MAX_BYTES )) ||
      die "the overrides after -- take $bytes bytes ($n); at most $OVERRIDES_MAX_BYTES fit: put long settings in configs/<model>.yml"
  done
}

# Secrets. An environment name is secret when, upper-cased, it matches SECRET_NAME_RE (HF_TOKEN,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD, OPENAI_KEY, GITHUB_PAT, PRIVATE_KEY, BASIC_AUTH, ...); a MaxText
# key is secret when it is one of SECRET_MAXTEXT_KEYS (MaxText's credential settings). Their whole
# values are hidden wherever the launcher shows them (docs/security.md). The pattern is the one line of
# utils/launch/secret_names.re (an extended regex that Python's re reads alike; utils/mcpserver/jobs.py
# holds the same, tests/test_settings.py checks).
read -r SECRET_NAME_RE < "${SETTINGS_TSV%/*}/secret_names.re" || true
[[ -n "$SECRET_NAME_RE" ]] || SECRET_NAME_RE=.   # file missing: every name is secret (hide, never show)
SECRET_MAXTEXT_KEYS="hf_access_token"

# is_secret_env NAME / is_secret_key KEY: true when the value of that variable / MaxText key is a secret.
is_secret_env() { [[ "${1^^}" =~ $SECRET_NAME_RE ]]; }
is_secret_key() {  # any part of a dotted key (student_overrides.hf_access_token)
  local part
  for part in ${1//./ }; do [[ " $SECRET_MAXTEXT_KEYS " == *" ${part,,} "* ]] && return 0; done
  return 1
}

# shown_kv KIND NAME=VALUE: the pair as it may be shown (KIND env or maxtext); VALUE is <redacted>
# when NAME is secret. Non-pairs pass unchanged.
shown_kv() {
  local kind=$1 kv=$2 name
  [[ "$kv" == *=* ]] || { printf '%s\n' "$kv"; return 0; }
  name=${kv%%=*}
  if { [[ "$kind" == env ]] && is_secret_env "$name"; } || { [[ "$kind" == maxtext ]] && is_secret_key "$name"; }; then
    printf '%s=<redacted>\n' "$name"
  else
    printf '%s\n' "$kv"
  fi
}

# shown_list KIND: read a newline-separated NAME=VALUE list on stdin, print it on one line
# (shell-quoted where needed), secret values redacted.
shown_list() {
  local kind=$1 kv out="" v
  while IFS= read -r kv; do
    [[ -n "$kv" ]] || continue
    v=$(shown_kv "$kind" "$kv")
    [[ "$v" == *=\<redacted\> ]] || printf -v v '%q' "$v"
    out+="${out:+ }$v"
  done
  printf '%s\n' "$out"
}

# shown_args ARG...: the arguments after `--` of a launcher command line as they may be shown:
# _env_NAME=VALUE and MaxText KEY=VALUE with secret values redacted, shell-quoted where needed.
shown_args() {
  local a v out=""
  for a in "$@"; do
    if [[ "$a" == _env_*=* ]]; then v=$(shown_kv env "${a#_env_}"); v="_env_$v"
    else v=$(shown_kv maxtext "$a"); fi
    [[ "$v" == *=\<redacted\> ]] || printf -v v '%q' "$v"
    out+=" $v"
  done
  printf '%s\n' "$out"
}

# shown_cmd ARG...: a command line as it may be shown (shown_args without the leading space).
shown_cmd() {
  local s
  s=$(shown_args "$@")
  printf '%s\n' "${s# }"
}

# node_root sys|proc|dev: the root this node's /sys, /proc or /dev files are read under. Test hooks
# MST_SYSFS_ROOT, MST_PROCFS_ROOT, MST_DEV_ROOT (docs/env-contract.md) point the node-side checks at
# fixture trees; "%h" in them stands for this node's name, so each node of a local cluster on one
# machine can be given its own tree.
node_root() {
  local v
  case "$1" in
    sys) v=${MST_SYSFS_ROOT:-/sys} ;;
    proc) v=${MST_PROCFS_ROOT:-/proc} ;;
    dev) v=${MST_DEV_ROOT:-/dev} ;;
    *) return 1 ;;
  esac
  printf '%s\n' "${v//%h/${JOB_HOSTNAME:-$(hostname)}}"
}

# Host settings preflight applies where the site asks for them (PREFLIGHT_HOST_SETTINGS, e.g.
# "numa_balancing=0 thp=never"): name, file (read under node_root proc|sys), allowed values
# ("|" between them, N-M a range). Files with a choice show it bracketed: "always [madvise] never".
HOST_SETTINGS="
numa_balancing       /proc/sys/kernel/numa_balancing               0|1
thp                  /sys/kernel/mm/transparent_hugepage/enabled   always|madvise|never
thp_defrag           /sys/kernel/mm/transparent_hugepage/defrag    always|defer|defer+madvise|madvise|never
swappiness           /proc/sys/vm/swappiness                       0-200
perf_event_paranoid  /proc/sys/kernel/perf_event_paranoid          -1|0|1|2|3
"

# host_settings SPEC: "NAME FILE VALUE" for each NAME=VALUE of SPEC; an unknown name or a value
# the table does not allow: one line on stderr naming it and what would be right, status 1.
host_settings() {
  local item name value row file allowed a ok lo hi
  local -a items alts
  read -r -a items <<< "$1"
  for item in "${items[@]}"; do
    name=${item%%=*} value=${item#*=}
    row=$(awk -v n="$name" '$1 == n { print $2, $3 }' <<< "$HOST_SETTINGS")
    if [[ "$item" != *=* || -z "$row" ]]; then
      echo "PREFLIGHT_HOST_SETTINGS: unknown setting '$item'; known:" \
        "$(awk 'NF { printf "%s%s", s, $1; s = " " }' <<< "$HOST_SETTINGS") (NAME=VALUE, space-separated)" >&2
      return 1
    fi
    read -r file allowed <<< "$row"
    IFS='|' read -r -a alts <<< "$allowed"
    ok=0
    for a in "${alts[@]}"; do
      if [[ "$a" =~ ^([0-9]+)-([0-9]+)$ ]]; then
        lo=${BASH_REMATCH[1]} hi=${BASH_REMATCH[2]}
        [[ "$value" =~ ^[0-9]{1,6}$ ]] && (( 10#$value >= lo && 10#$value <= hi )) && ok=1
      elif [[ "$value" == "$a" ]]; then
        ok=1
      fi
    done
    (( ok )) || { echo "PREFLIGHT_HOST_SETTINGS: '$item' is not allowed; $name takes ${allowed//|/, }" >&2; return 1; }
    printf '%s %s %s\n' "$name" "$file" "$value"
  done
}

# resubmit_excluding CMD HOST...: the submit command CMD (as recorded in .submit/command.txt)
# with --exclude=HOSTS before its "--", merged with the hosts it already excluded (--exclude=L,
# --exclude L, -x L).
resubmit_excluding() {
  local cmd=" $1 " list="" re=' (--exclude=|--exclude |-x ?)([^ ]+) ' h
  shift
  while [[ "$cmd" =~ $re ]]; do
    list+="${list:+,}${BASH_REMATCH[2]}"
    cmd=${cmd/"${BASH_REMATCH[0]}"/ }
  done
  for h in "$@"; do [[ ",$list," == *",$h,"* ]] || list+="${list:+,}$h"; done
  if [[ "$cmd" == *" -- "* ]]; then cmd="${cmd%% -- *} --exclude=$list -- ${cmd#* -- }"
  else cmd="${cmd% } --exclude=$list "; fi
  cmd=${cmd# }
  printf '%s\n' "${cmd% }"
}

# container_mounts [--shape] DST...: CONTAINER_MOUNTS ("SRC:DST[:ro] ...", split on spaces) checked, as
# runtime flags in the array MOUNT_ARGS (-v SRC:DST[:ro] each). SRC and DST are absolute paths, SRC
# exists on this node (not checked with --shape: at submission, on another machine), no DST is given
# twice or is one of DST... (the paths the container tier mounts itself). Dies with one line naming
# the bad entry and what would be right.
container_mounts() {
  local entry src dst opt rest d shape=0
  local -a entries=()
  local -A taken=()
  [[ "${1:-}" == --shape ]] && { shape=1; shift; }
  for d in "$@"; do [[ -n "$d" ]] && taken[$d]="the launcher"; done
  MOUNT_ARGS=()
  read -r -a entries <<< "${CONTAINER_MOUNTS:-}"
  for entry in "${entries[@]}"; do
    IFS=: read -r src dst opt rest <<< "$entry"
    if [[ -n "$rest" || "$src" != /* || "$dst" != /* || ( -n "$opt" && "$opt" != ro ) || "$entry" == *: ]]; then
      die "CONTAINER_MOUNTS entry '$entry' is not SRC:DST or SRC:DST:ro with absolute paths (e.g. /data:/data:ro)"
    fi
    (( shape )) || [[ -e "$src" ]] || die "CONTAINER_MOUNTS entry '$entry': '$src' does not exist on $(hostname)"
    dst=${dst%/}; dst=${dst:-/}
    [[ -z "${taken[$dst]:-}" ]] ||
      die "CONTAINER_MOUNTS entry '$entry' mounts over '$dst', which ${taken[$dst]} mounts already; pick another DST"
    taken[$dst]="'${entry}'"
    MOUNT_ARGS+=(-v "$src:$dst${opt:+:$opt}")
  done
}
