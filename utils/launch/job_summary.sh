#!/usr/bin/env bash
# Usage: utils/launch/job_summary.sh STATUS STAGE
#
# Prints the JOB SUMMARY block that ends every job log and saves it as $JOB_DIR/summary.txt (a new
# file renamed into place, only when the job directory is ours from $JOB_WORKSPACE down).
# STATUS is what the caller saw (completed|failed|cancelled|timeout); a stage that hit its
# time limit turns it into stage_timeout. STAGE is the last stage that ran (none: the job ended
# before its first stage, e.g. refused because another job holds its run). Per-node outcomes
# come from $JOB_DIR/.stages/STAGE/<host> (written by run_stage.sh); the first error line is
# the first error-looking line of the first failing node in $JOB_LOG, from this run's JOB header
# on (a requeued job appends to the log of its earlier run).
# With ENABLE_COREDUMPS=1 it lists the core files under $JOB_DIR/cores (newest first, at most 5).
# When a node check failed (stage preflight or image) in a Slurm job, `resubmit:` is the submit
# command (MST_REPO/.submit/command.txt) with --exclude naming the failed nodes.
# Reads JOB_ID JOB_NAME JOB_DIR JOB_LOG JOB_NODELIST JOB_START_TIME (epoch seconds), JOB_SCHEDULER, MST_REPO.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { usage; exit; }
status=${1:?usage: job_summary.sh STATUS STAGE} stage=${2:?usage: job_summary.sh STATUS STAGE}
rec_dir="$JOB_DIR/.stages/$stage"
read -r -a nodes <<< "${JOB_NODELIST:-}"
checked=("${nodes[@]}")
[[ "$stage" != none ]] || checked=()   # no stage ran: no node has a record to miss

failed=() bad=() stopped=() missing=() culprit="" culprit_end=""
for n in "${checked[@]}"; do
  f="$rec_dir/$n"
  if [[ ! -f "$f" ]]; then missing+=("$n"); continue; fi
  rc=$(sed -n 's/.*rc=\([0-9]*\).*/\1/p' "$f"); end=$(sed -n 's/.*end=\([0-9.]*\).*/\1/p' "$f")
  reason=$(sed -n 's/.*reason=\([a-z]*\).*/\1/p' "$f")
  case "$reason" in
    stopped) stopped+=("$n") ;;
    *)
      [[ "$rc" == 0 ]] && continue
      [[ "$reason" == timeout ]] && status=stage_timeout
      if [[ "$reason" == timeout ]]; then failed+=("$n (timeout, exit $rc)"); else failed+=("$n (exit $rc)"); fi
      bad+=("$n")
      if [[ -z "$culprit" ]] || awk -v a="$end" -v b="$culprit_end" 'BEGIN { exit !(a < b) }'; then
        culprit=$n culprit_end=$end
      fi ;;
  esac
done
[[ "$status" == completed && ${#failed[@]} -gt 0 ]] && status=failed

# First error of the first failing node: an exception line (not indented, e.g. "ValueError: ..."),
# else any other error-looking line that is not source code quoted in a traceback (a launcher's
# one-line refusal included: "_train.sh: refusing the directory ...").
# A guess for the person reading the log, not a diagnosis, and the only reading of the log outside
# utils/joblog.py: it stays here, in bash, because the summary must be printed at the end of
# every job, also when Python is what failed (a broken environment; in container mode the batch host
# need not have the project's .venv at all), and joblog.py needs the .venv's Python (>= 3.11). The
# signatures that decide a failure class live only in joblog.py; triage.py cites first_error as the
# launcher's guess and never classifies from it. Keep these patterns generic: add signatures there.
exc_re='[A-Za-z_.]*(Error|Exception|Exit|Interrupt)(: |$)'
error_re='(Error|Exception|error:|FAILED|FATAL|Fatal|Aborted|Segmentation fault|Killed|core dumped|exceeded its|: refusing )'
info_re='([IW][0-9]{4} [0-9:.]+ |\[NO-OP\] )'   # absl INFO/WARNING lines are not errors, nor MaxText's
# notes that an optional Google Cloud module is left out ("[NO-OP] ...: dependency missing; using stub.
# (ModuleNotFoundError)": requirements/maxtext.txt leaves them out)
first_error=""
this_run() {  # the log from the last JOB header on
  local start
  start=$(grep -an '^==================== JOB ====================$' "$JOB_LOG" | tail -n 1 | cut -d: -f1)
  tail -n +"${start:-1}" "$JOB_LOG"
}
if [[ -f "${JOB_LOG:-}" && "$status" =~ ^(failed|stage_timeout)$ ]]; then
  prefix="${culprit:+$culprit: }"
  first_error=$(this_run | grep -a -m1 -E "^${prefix:-[^ ]*: }${exc_re}" | cut -c1-400)
  [[ -n "$first_error" ]] ||
    first_error=$(this_run | grep -a -E "^${prefix:-[^ ]*: }([^ ].*)?${error_re}" | grep -avE -m1 "Traceback|^[^ ]*: ${info_re}" | cut -c1-400)
  if [[ -z "$first_error" && -n "$culprit" ]]; then
    rc=$(sed -n 's/.*rc=\([0-9]*\).*/\1/p' "$rec_dir/$culprit")
    (( rc > 128 )) && first_error="$culprit: killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))$([[ $rc == 137 ]] && echo ", e.g. the kernel OOM killer or kill -9")"
  fi
fi

# The steps this run logged, read by the one parser of step lines (utils/joblog.py, standard
# library only) with the job's Python environment (MST_VENV), else the host's python3 (3.11 or newer):
# "FIRST..LAST (N lines on HOST)" or "none" (a completed job without one is no healthy job: triage's
# no_steps). No such Python, or a log too big to read in 15 s (~1 GB; a cancelled job has KillWait,
# 30 s by default, for its summary): "unknown (why)", never a guess in bash.
steps=none
if [[ "$stage" == train && -f "${JOB_LOG:-}" ]]; then
  joblog="$(dirname "${BASH_SOURCE[0]}")/../joblog.py" steps="" py=""
  for cand in "${MST_VENV:+$MST_VENV/bin/python}" python3; do
    [[ -n "$cand" ]] && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { py=$cand; break; }
  done
  if [[ -z "$py" ]]; then
    steps="unknown (no Python 3.11 or newer here to read the log: utils/triage.py reads it)"
  else
    out=$(timeout 15 "$py" -P "$joblog" steps "$JOB_LOG" 2>&1); rc=$?
    steps=$(head -n 1 <<< "$out" | cut -c1-300)
    if (( rc == 124 )); then steps="unknown (reading the log took over 15 s)"
    elif (( rc != 0 )); then steps="unknown (${steps:-joblog.py exited $rc})"
    fi
  fi
fi

cores=""
if [[ "${ENABLE_COREDUMPS:-0}" == 1 ]]; then
  source "$(dirname "${BASH_SOURCE[0]}")/coredump.sh"
  cores=$(core_files "$JOB_DIR/cores" | head -n 5 | awk '{ printf "%s%s (%d bytes)", sep, $1, $2; sep = ", " }')
fi

# the nodes that failed a node check (or never finished it) left out of the next submission
resubmit=""
command_file="${MST_REPO:-/nonexistent}/.submit/command.txt"
if [[ "$stage" =~ ^(preflight|image)$ && "$status" =~ ^(failed|stage_timeout)$ && "${JOB_SCHEDULER:-}" == slurm ]] &&
   (( ${#bad[@]} + ${#missing[@]} )) && [[ -f "$command_file" ]]; then
  resubmit=$(resubmit_excluding "$(head -n 1 "$command_file")" "${bad[@]}" "${missing[@]}")
fi

block=$(mktemp "${TMPDIR:-/tmp}/mst-summary.XXXXXX")
now=$(date +%s); wall=$(( now - ${JOB_START_TIME:-$now} ))
{
  echo "==================== JOB SUMMARY ===================="
  echo "status: $status"
  echo "job: ${JOB_ID:-?} ${JOB_NAME:-?}"
  echo "nodes: ${#nodes[@]} (${nodes[*]})"
  echo "stage: $stage"
  echo "steps: $steps"
  printf 'wall_time: %02d:%02d:%02d (%d s)\n' $((wall / 3600)) $((wall % 3600 / 60)) $((wall % 60)) "$wall"
  echo "failed_nodes: ${failed[*]:-none}"
  [[ -n "$culprit" ]] && echo "first_failure: $culprit"
  (( ${#stopped[@]} )) && echo "stopped_nodes: ${stopped[*]}"
  (( ${#missing[@]} )) && echo "no_exit_record: ${missing[*]}"
  [[ -n "$first_error" ]] && echo "first_error: $first_error"
  [[ -n "$cores" ]] && echo "cores: $cores"
  [[ -n "$resubmit" ]] && echo "resubmit: $resubmit"
  echo "job_dir: $JOB_DIR"
  echo "log: ${JOB_LOG:-?}"
  echo "====================================================="
} > "$block"
cat "$block"
# summary.txt: a new file of ours renamed into place (never written through a link), and only
# into a job directory that is ours from the workspace down
root=${JOB_WORKSPACE:-}; [[ -n "$root" && "$JOB_DIR" == "${root%/}/"* ]] || root=$(dirname "$JOB_DIR")
if why=$( (check_trusted_under "$root" "$JOB_DIR" "the job directory") 2>&1 ) &&
   tmp=$(mktemp "$JOB_DIR/.summary.XXXXXX" 2>/dev/null) && cat "$block" > "$tmp" && chmod 644 "$tmp" &&
   mv -f -T -- "$tmp" "$JOB_DIR/summary.txt"; then
  :
else
  echo "job_summary.sh: summary.txt not written: ${why:-cannot write into $JOB_DIR}" >&2
  [[ -z "${tmp:-}" ]] || rm -f -- "$tmp"
fi
rm -f -- "$block"
