# shellcheck shell=bash
# Core dumps of a job (ENABLE_COREDUMPS=1). Source it after lib.sh; it defines functions only.
#   core_dir                 print this node's core directory: $COREDUMP_DIR/$JOB_NAME/<host> when
#                            COREDUMP_DIR is set (a place with room; $JOB_DIR/cores links to it),
#                            else $JOB_DIR/cores/<host>
#   core_setup PYTHON        in the trainer's shell, before exec: make the directory ours and private
#                            (see below), cd into it, lift the core size limit, say where cores will
#                            go (kernel.core_pattern) and warn when the disk has less room than the
#                            node's memory; write context.txt there (a new file, never through a
#                            link): the binaries and versions that read the core
#   core_writing DIR PGID    true while a process of group PGID is writing a core (CoreDumping in
#                            /proc/PID/status) or a file in DIR grew in the last 2 s
#   core_files DIR           print "path size" of each core file under DIR (newest first)
# kernel.core_pattern is the machine's: a relative name ("core", "core.%p") puts cores in the
# crashing process's working directory, which core_setup makes the core directory; an absolute
# path or a pipe (systemd-coredump, apport) sends them elsewhere, and core_setup says where.
# COREDUMP_DIR may be shared scratch (1777) or a group directory: the job's directory there is made
# by us (own_dir: one that someone else made first, or that others may write, is refused with one
# line), the host's directory in it is private (0700: a core holds the trainer's memory, secrets
# included), and the trainer's working directory is checked after the cd (by what it is, not by its
# name) before anything runs there. The trainer never imports from it (python -P, _train.sh).

core_dir() {
  local host=${JOB_HOSTNAME:-$(hostname)}
  if [[ -n "${COREDUMP_DIR:-}" ]]; then
    printf '%s\n' "$COREDUMP_DIR/${JOB_NAME:-job}/$host"
  else
    printf '%s\n' "${JOB_DIR:?JOB_DIR is not set}/cores/$host"
  fi
}

core_setup() {
  local python=$1 dir pattern free_kb mem_kb top why
  dir=$(core_dir)
  if [[ -n "${COREDUMP_DIR:-}" ]]; then
    top="$COREDUMP_DIR/${JOB_NAME:-job}"
    mkdir -p -- "$COREDUMP_DIR" 2>/dev/null ||
      die "cannot create COREDUMP_DIR=$COREDUMP_DIR (ENABLE_COREDUMPS=1; set COREDUMP_DIR to a writable place every node sees)"
  else
    top="${JOB_DIR:?JOB_DIR is not set}/cores"
  fi
  # made under umask 022, so that another node never sees them group-writable before own_dir's chmod
  local umask_was
  umask_was=$(umask)
  umask 022
  own_dir "$top" 755
  own_dir "$dir" 700
  umask "$umask_was"
  if [[ -n "${COREDUMP_DIR:-}" && ! -e "$JOB_DIR/cores" && ! -L "$JOB_DIR/cores" ]]; then
    ln -s -- "$top" "$JOB_DIR/cores" 2>/dev/null || true   # another node may be first
  fi
  cd -- "$dir" || die "cannot enter the core directory $dir"
  # what we are in now, whatever its name points at since: ours, private, not a link
  why=$(trust_problem .)
  [[ -z "$why" && $(stat -c %a .) == 700 ]] ||
    die "refusing the core directory $dir as the trainer's working directory: it ${why:-has mode $(stat -c %04a .), not 0700 (it changed under us)}; set COREDUMP_DIR to a directory of yours"
  ulimit -c unlimited 2>/dev/null || ulimit -c "$(ulimit -H -c)"
  pattern=$(cat /proc/sys/kernel/core_pattern 2>/dev/null || echo "?")
  case "$pattern" in
    *systemd-coredump*)
      echo "${PROG:-coredump}: core dumps enabled, but kernel.core_pattern hands cores to systemd-coredump, not $dir: on this node, coredumpctl list; coredumpctl dump PID -o FILE" >&2 ;;
    \|*) echo "${PROG:-coredump}: core dumps enabled, but kernel.core_pattern='$pattern' pipes cores to that program, not to $dir" >&2 ;;
    /*) echo "${PROG:-coredump}: core dumps enabled, but kernel.core_pattern='$pattern' writes cores to ${pattern%/*}/, not to $dir" >&2 ;;
    *) echo "${PROG:-coredump}: core dumps enabled: $dir (ulimit -c $(ulimit -c), kernel.core_pattern=$pattern)" >&2 ;;
  esac
  free_kb=$(df -Pk . 2>/dev/null | awk 'NR == 2 { print $4 }')
  mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
  if [[ -n "$free_kb" && -n "$mem_kb" ]] && (( free_kb < mem_kb )); then
    echo "${PROG:-coredump}: warning: $((free_kb / 1048576)) GiB free for cores in $dir, less than this node's memory ($((mem_kb / 1048576)) GiB): a core can be cut short; set COREDUMP_DIR to a place with room" >&2
  fi
  # a new file in our private directory (an earlier run's on this host is replaced: unlink follows no link)
  rm -f -- context.txt
  new_file context.txt
  {
    echo "host: ${JOB_HOSTNAME:-$(hostname)}"
    echo "kernel: $(uname -r)"
    echo "core_pattern: $pattern"
    echo "container: ${MST_CONTAINER:-none}${MST_IMAGE_REF:+ $MST_IMAGE_REF}"
    echo "python: $(command -v "$python" 2>/dev/null | xargs -r readlink -f)"
    # -P: the working directory is not on the import path (a Python >= 3.11; _train.sh checked)
    "$python" -P - <<'PY' 2>/dev/null || echo "python_version: ? (the interpreter did not run)"
import importlib.metadata as md
import platform
import sys

print(f"python_version: {platform.python_version()}")
print(f"executable: {sys.executable}")
for name in ("jax", "jaxlib", "maxtext"):
    try:
        print(f"{name}: {md.version(name)}")
    except md.PackageNotFoundError:
        pass
PY
  } >> context.txt
}

core_writing() {
  local dir=$1 pgid=$2 pid
  for pid in $(pgrep -g "$pgid" 2>/dev/null); do
    grep -qs '^CoreDumping:[[:space:]]*1' "/proc/$pid/status" && return 0
  done
  [[ -d "$dir" ]] && [[ -n "$(find "$dir" -maxdepth 1 -type f -name 'core*' -newermt '2 seconds ago' -print -quit 2>/dev/null)" ]]
}

core_files() {
  [[ -d "$1" ]] || return 0
  find -L "$1" -type f -name 'core*' -printf '%T@ %p %s\n' 2>/dev/null | sort -rn | cut -d' ' -f2-
}
