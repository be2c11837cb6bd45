# shellcheck shell=bash
# Core dumps of a job (ENABLE_COREDUMPS=1). Source it after lib.sh; it defines functions only.
#   core_dir                 print this node's core directory: $COREDUMP_DIR/$JOB_NAME/<host> when
#                            COREDUMP_DIR is set (a place with room; $JOB_DIR/cores links to it),
#                            else $JOB_DIR/cores/<host>
#   core_setup PYTHON        in the trainer's shell, before exec: make the directory, cd into it,
#                            lift the core size limit, say where cores will go (kernel.core_pattern)
#                            and warn when the disk has less room than the node's memory; write
#                            context.txt there: the binaries and versions that read the core
#   core_writing DIR PGID    true while a process of group PGID is writing a core (CoreDumping in
#                            /proc/PID/status) or a file in DIR grew in the last 2 s
#   core_files DIR           print "path size" of each core file under DIR (newest first)
# kernel.core_pattern is the machine's: a relative name ("core", "core.%p") puts cores in the
# crashing process's working directory, which core_setup makes the core directory; an absolute
# path or a pipe (systemd-coredump, apport) sends them elsewhere, and core_setup says where.

core_dir() {
  local host=${JOB_HOSTNAME:-$(hostname)}
  if [[ -n "${COREDUMP_DIR:-}" ]]; then
    printf '%s\n' "$COREDUMP_DIR/${JOB_NAME:-job}/$host"
  else
    printf '%s\n' "${JOB_DIR:?JOB_DIR is not set}/cores/$host"
  fi
}

core_setup() {
  local python=$1 dir pattern free_kb mem_kb
  dir=$(core_dir)
  mkdir -p "$dir" || die "cannot create the core directory $dir (ENABLE_COREDUMPS=1; set COREDUMP_DIR to a writable place)"
  if [[ -n "${COREDUMP_DIR:-}" && ! -e "$JOB_DIR/cores" ]]; then
    ln -s "$COREDUMP_DIR/${JOB_NAME:-job}" "$JOB_DIR/cores" 2>/dev/null || true   # another node may be first
  fi
  cd "$dir" || die "cannot enter the core directory $dir"
  ulimit -c unlimited 2>/dev/null || ulimit -c "$(ulimit -H -c)"
  pattern=$(cat /proc/sys/kernel/core_pattern 2>/dev/null || echo "?")
  case "$pattern" in
    *systemd-coredump*)
      echo "${PROG:-coredump}: core dumps enabled, but kernel.core_pattern hands cores to systemd-coredump, not $dir: on this node, coredumpctl list; coredumpctl dump PID -o FILE" >&2 ;;
    \|*) echo "${PROG:-coredump}: core dumps enabled, but kernel.core_pattern='$pattern' pipes cores to that program, not to $dir" >&2 ;;
    /*) echo "${PROG:-coredump}: core dumps enabled, but kernel.core_pattern='$pattern' writes cores to ${pattern%/*}/, not to $dir" >&2 ;;
    *) echo "${PROG:-coredump}: core dumps enabled: $dir (ulimit -c $(ulimit -c), kernel.core_pattern=$pattern)" >&2 ;;
  esac
  free_kb=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { print $4 }')
  mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
  if [[ -n "$free_kb" && -n "$mem_kb" ]] && (( free_kb < mem_kb )); then
    echo "${PROG:-coredump}: warning: $((free_kb / 1048576)) GiB free for cores in $dir, less than this node's memory ($((mem_kb / 1048576)) GiB): a core can be cut short; set COREDUMP_DIR to a place with room" >&2
  fi
  {
    echo "host: ${JOB_HOSTNAME:-$(hostname)}"
    echo "kernel: $(uname -r)"
    echo "core_pattern: $pattern"
    echo "container: ${MST_CONTAINER:-none}${MST_IMAGE_REF:+ $MST_IMAGE_REF}"
    echo "python: $(command -v "$python" 2>/dev/null | xargs -r readlink -f)"
    "$python" - <<'PY' 2>/dev/null || echo "python_version: ? (the interpreter did not run)"
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
  } > context.txt
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
