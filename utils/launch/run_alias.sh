# shellcheck shell=bash
# The run alias (submit.sh / run_local.sh --run ALIAS, exported as MST_RUN): a run directory
# $JOB_WORKSPACE/<user>/runs/ALIAS (in the user's own root: nobody else can write it) that outlives every job and holds the run's MaxText checkpoints. Each job
# of the run links MaxText's checkpoint directory (base_output_directory/run_name/checkpoints, which
# MaxText derives and a key cannot set) to RUN_DIR/checkpoints, so a resubmission restores the
# latest checkpoint while TensorBoard events and everything else stay in the job's own directory.
# One job of a run at a time: the job that runs holds RUN_DIR/lock (an atomic mkdir, with an
# `owner` line naming the job). Source after lib.sh.
#   check_run_alias ALIAS     dies unless ALIAS is a plain name (letters, digits, . _ -)
#   check_run_overrides       dies on a MaxText override (TRAIN_OVERRIDES) that contradicts --run
#   run_dir                   print $JOB_WORKSPACE/<user>/runs/$MST_RUN
#   run_prepare               at submit: make the run directory ours (own_dir), moving the run's
#                             directory from before the per-user layout ($JOB_WORKSPACE/runs/ALIAS)
#                             there once; dies with one line where that is not safe
#   run_latest_step DIR       print the highest step with a saved checkpoint in DIR/checkpoints
#                             (nothing when there is none)
#   run_describe              print "ALIAS RUN_DIR (latest checkpoint: ...)", the job header's run line
#   run_claim                 take the run's lock for this job (JOB_ID) and link the job's checkpoint
#                             directory to the run's; takes over the lock of a job that has ended
#                             (saying so); returns 1 with one line on stderr when another job holds it,
#                             or when the run directory (or a directory above it) is not ours to trust
#   run_release               give the lock back, if this job holds it
#   check_checkpoint_every DURATION
#                             dies unless DURATION is a time (900, 900s, 30m, 2h) and --run is given
#                             and no checkpoint_period override is; exports MST_CHECKPOINT_EVERY (seconds)
#   check_continue ON MAX_JOBS MAX_STALLED
#                             --continue's checks; exports MST_CONTINUE and MST_RUN_JOB (see there)
#   continue_describe         print the job header's continue: line
#   run_checkpoint_every      with MST_CHECKPOINT_EVERY: the checkpoint_period (steps) that saves about
#                             that often at the step time the run's earlier jobs measured (utils/run.py
#                             ALIAS --checkpoint-every), appended to TRAIN_OVERRIDES and said on stderr;
#                             before any job measured one the configured period stays, and that is said

# check_run_alias ALIAS
check_run_alias() {
  local a=$1
  [[ -n "$a" && "$(safe_name "$a")" == "$a" ]] ||
    die_usage "bad run alias '$a': use letters, digits, . _ - only (at most 64, not starting with . or -), e.g. --run exp1"
}

# With --run, the launcher decides where checkpoints go and turns checkpointing on; an override that
# moves MaxText's output or turns checkpointing off would leave nothing to resume from.
check_run_overrides() {
  local kv key value
  while IFS= read -r kv; do
    [[ -n "$kv" ]] || continue
    key=${kv%%=*} value=${kv#*=}
    case "$key" in
      run_name|base_output_directory)
        die "'$key=...' contradicts --run, which keeps the checkpoints in \$JOB_WORKSPACE/<user>/runs/$MST_RUN; drop the override" ;;
      enable_checkpointing)
        [[ "${value,,}" =~ ^[\'\"]?(false|no|off|n|f|0)[\'\"]?$ ]] &&
          die "'$kv' contradicts --run, which saves checkpoints to resume from; drop one of them" ;;
    esac
  done <<< "${TRAIN_OVERRIDES:-}"
  return 0
}

check_checkpoint_every() {
  local d=$1 n
  [[ "$d" =~ ^([1-9][0-9]{0,6})(s|m|h)?$ ]] ||
    die_usage "--checkpoint-every takes a time such as 900, 900s, 30m or 2h, got '$d'"
  n=${BASH_REMATCH[1]}
  case "${BASH_REMATCH[2]}" in m) n=$((n * 60)) ;; h) n=$((n * 3600)) ;; esac
  [[ -n "${MST_RUN:-}" ]] ||
    die_usage "--checkpoint-every needs --run ALIAS: the step time comes from the run's earlier jobs"
  grep -q '^checkpoint_period=' <<< "${TRAIN_OVERRIDES:-}" &&
    die_usage "give --checkpoint-every or checkpoint_period=..., not both"
  export MST_CHECKPOINT_EVERY=$n
}

# check_continue ON MAX_JOBS MAX_STALLED (submit.sh's --continue, --max-jobs, --max-stalled; counts may be
# empty: 20 and 3). With ON=1 it needs --run and counts of 1-1000 and 1-100, and exports
# MST_CONTINUE="MAX_JOBS MAX_STALLED" and MST_RUN_JOB (this job's place in the run's chain: what the job
# before it passed on, else 1: utils/run_next.py; MST_RUN_AFTER, that job's id, is kept when it is one).
# With ON=0 the counts are refused, MST_RUN_JOB and MST_RUN_AFTER are unset.
check_continue() {
  local on=$1 jobs=${2:-20} stalled=${3:-3}
  if [[ "$on" != 1 ]]; then
    [[ -z "$2$3" ]] || die_usage "--max-jobs and --max-stalled go with --continue (and --run ALIAS)"
    unset MST_RUN_JOB MST_RUN_AFTER
    return 0
  fi
  [[ -n "${MST_RUN:-}" ]] || die_usage "--continue needs --run ALIAS: the jobs of a run restore its checkpoints"
  if ! [[ "$jobs" =~ ^[1-9][0-9]{0,3}$ ]] || (( jobs > 1000 )); then die_usage "--max-jobs takes 1 .. 1000 jobs, got '$jobs'"; fi
  if ! [[ "$stalled" =~ ^[1-9][0-9]{0,2}$ ]] || (( stalled > 100 )); then die_usage "--max-stalled takes 1 .. 100 jobs, got '$stalled'"; fi
  [[ "${MST_RUN_JOB:-}" =~ ^[1-9][0-9]{0,3}$ ]] || MST_RUN_JOB=1
  [[ "${MST_RUN_AFTER:-}" =~ ^[0-9]{1,12}$ ]] || unset MST_RUN_AFTER
  export MST_CONTINUE="$jobs $stalled" MST_RUN_JOB
}

# continue_describe: the job header's and submit.sh's continue: line
continue_describe() {
  local jobs stalled
  read -r jobs stalled <<< "$MST_CONTINUE"
  printf 'job %s of at most %s (the next is queued when this one starts; the run stops when complete, on a failure a retry cannot fix, on scancel, or after %s jobs in a row without a new checkpoint)\n' \
    "${MST_RUN_JOB:-1}" "$jobs" "$stalled"
}

run_checkpoint_every() {
  local out n
  [[ -n "${MST_CHECKPOINT_EVERY:-}" ]] || return 0
  out=$("$(dirname "${BASH_SOURCE[0]}")/../run.py" "$MST_RUN" --workspace "$JOB_WORKSPACE" --checkpoint-every "$MST_CHECKPOINT_EVERY" 2>&1) ||
    die "--checkpoint-every: ${out#run.py: }"
  n=${out%% *}
  if [[ "$n" =~ ^[0-9]+$ ]]; then
    TRAIN_OVERRIDES+="checkpoint_period=$n"$'\n'
    echo "${PROG:-launch}: --checkpoint-every: checkpoint_period=$n (${out#* })" >&2
  else
    echo "${PROG:-launch}: --checkpoint-every: ${out#* }" >&2
  fi
}

run_dir() {
  printf '%s\n' "$JOB_WORKSPACE/$(id -un)/runs/$MST_RUN"
}

# The run directories of before the per-user roots ($JOB_WORKSPACE/runs/ALIAS) hold checkpoints a
# run must go on from: an old directory of ours, checked, moves to the new place once (one line
# says so); one that cannot be trusted (a directory above it someone else's or writable by others)
# or that a job still holds is refused with the mv command to run, never silently left behind.
run_prepare() {
  local old="$JOB_WORKSPACE/runs/$MST_RUN" new why
  new=$(run_dir)
  if [[ -e "$old" || -L "$old" ]] && [[ "$(stat -c %u -- "$old" 2>/dev/null)" == "$EUID" ]]; then
    if [[ -e "$new" || -L "$new" ]]; then
      die "run '$MST_RUN' has two directories: $old (from before the per-user layout) and $new; keep the one to go on from (e.g. mv -T $old $new after removing the other)"
    fi
    if ! why=$( (check_trusted_under "$JOB_WORKSPACE" "$old" "the earlier run directory") 2>&1 ); then
      die "${why#"${PROG:-launch}: "}; if its checkpoints are yours, check them and move them yourself: mv -T $old $new"
    fi
    [[ ! -e "$old/lock" ]] ||
      die "run '$MST_RUN': its earlier directory $old is held by a job ($old/lock); when that job has ended: mv -T $old $new"
    mv -T -- "$old" "$new" || die "cannot move the run directory $old to $new; move it yourself: mv -T $old $new"
    echo "${PROG:-launch}: run '$MST_RUN': moved its directory $old to $new (runs live in your own root now)" >&2
  fi
  own_dir "$new"
}

# Orbax writes a step to "<step>.orbax-checkpoint-tmp..." and renames it to "<step>" when it is
# complete, so only all-digit names are saved checkpoints.
run_latest_step() {
  local d best="" n
  for d in "$1"/checkpoints/*/; do
    n=${d%/}; n=${n##*/}
    [[ "$n" =~ ^[0-9]{1,15}$ ]] || continue
    if [[ -z "$best" ]] || (( 10#$n > 10#$best )); then best=$n; fi
  done
  [[ -z "$best" ]] || printf '%s\n' "$((10#$best))"
}

run_describe() {
  local step why
  if [[ -e "$(run_dir)" || -L "$(run_dir)" ]] &&
     ! why=$( (check_trusted_under "$JOB_WORKSPACE" "$(run_dir)" "the run directory") 2>&1 ); then
    printf '%s %s (%s)\n' "$MST_RUN" "$(run_dir)" "${why#"${PROG:-launch}: "}"
    return 0
  fi
  step=$(run_latest_step "$(run_dir)")
  if [[ -n "$step" ]]; then
    printf '%s %s (latest checkpoint: step %s, training goes on at step %s)\n' \
      "$MST_RUN" "$(run_dir)" "$step" "$((step + 1))"
  else
    printf '%s %s (no checkpoint: starts from step 0)\n' "$MST_RUN" "$(run_dir)"
  fi
}

# _run_field LINE KEY: the value of KEY=VALUE in an owner line
_run_field() {
  local kv kvs=()
  read -r -a kvs <<< "$1"
  for kv in "${kvs[@]}"; do [[ "$kv" == "$2="* ]] && { printf '%s\n' "${kv#*=}"; return 0; }; done
  printf '?\n'
}

# _run_owner_state LINE: running, ended or unknown (this job cannot tell). A Slurm job runs while
# squeue lists it (JOB_ACTIVE_IDS, the user's active jobs, from _job.sbatch); a local job runs while a
# process on its machine has its JOB_ID in the environment (its stages, trainer and log writer do).
_run_owner_state() {
  local id sched user host
  id=$(_run_field "$1" job) sched=$(_run_field "$1" scheduler) user=$(_run_field "$1" user) host=$(_run_field "$1" host)
  if [[ "$id" == "${JOB_ID:-}" ]]; then echo ended; return; fi   # an earlier run of this job (requeued)
  if [[ "$user" != "$(id -un)" ]]; then echo unknown; return; fi
  case "$sched" in
    slurm)
      if [[ "${JOB_SCHEDULER:-}" == slurm && -v JOB_ACTIVE_IDS ]]; then
        if [[ " $JOB_ACTIVE_IDS " == *" $id "* ]]; then echo running; else echo ended; fi
      else
        echo unknown
      fi ;;
    local)
      if [[ "$host" != "$(hostname)" ]]; then echo unknown
      elif grep -qsxzF -- "JOB_ID=$id" /proc/[0-9]*/environ; then echo running
      else echo ended
      fi ;;
    *) echo unknown ;;
  esac
}

_run_refuse() {
  printf '%s: run %s is in use%s\n' "${PROG:-launch}" "'$MST_RUN'" "$*" >&2
  return 1
}

run_claim() {
  local run lock owner me id who age wait why _
  run=$(run_dir) lock="$(run_dir)/lock"
  me="job=$JOB_ID scheduler=${JOB_SCHEDULER:-?} user=$(id -un) host=$(hostname) pid=$$"
  me+=" since=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # every directory from the workspace down is ours (not a link, nobody else can write it): no
  # checkpoint is read from or written to someone else's directory
  if ! why=$( (own_dir "${run%/runs/*}"; own_dir "${run%/*}"; own_dir "$run"; own_dir "$run/checkpoints") 2>&1 ); then
    printf '%s\n' "$why" >&2
    return 1
  fi
  for _ in 1 2 3; do
    if mkdir "$lock" 2>/dev/null; then
      printf '%s\n' "$me" > "$lock/owner.new" && mv -f "$lock/owner.new" "$lock/owner"
      _run_link "$run"
      return
    fi
    owner=$(cat "$lock/owner" 2>/dev/null) || owner=""
    if [[ -e "$lock/takeover" ]]; then
      _run_refuse ": another job is taking its lock over ($lock/takeover); if no other job of the run is starting," \
        "remove $lock and resubmit"
      return 1
    fi
    if [[ -z "$owner" ]]; then
      age=$(( $(date +%s) - $(stat -c %Y "$lock" 2>/dev/null || date +%s) ))
      if (( age < 60 )); then
        _run_refuse ": another job is taking it right now ($lock)"
        return 1
      fi
    else
      id=$(_run_field "$owner" job)
      who="job $id ($(_run_field "$owner" scheduler) job of $(_run_field "$owner" user) on $(_run_field "$owner" host)"
      who+=" since $(_run_field "$owner" since))"
      case $(_run_owner_state "$owner") in
        running)
          wait="wait for it to end"
          [[ "$owner" != *" scheduler=slurm "* ]] || wait+=" (submit.sh ... --run $MST_RUN --dependency=afterany:$id)"
          _run_refuse " by $who: two jobs of one run would overwrite each other's checkpoints; $wait or choose another --run"
          return 1 ;;
        unknown)
          _run_refuse " by $who, which this job cannot check: if it has ended, remove $lock and resubmit;" \
            "else wait for it or choose another --run"
          return 1 ;;
      esac
    fi
    # The holder has ended without giving the lock back (killed): take it over. Only the job that
    # creates lock/takeover may rewrite the owner, and the lock cannot be released meanwhile (rmdir
    # fails on a non-empty directory).
    mkdir "$lock/takeover" 2>/dev/null || continue
    if [[ "$(cat "$lock/owner" 2>/dev/null || true)" == "$owner" ]]; then
      printf '%s\n' "$me" > "$lock/owner.new" && mv -f "$lock/owner.new" "$lock/owner"
      rmdir "$lock/takeover"
      printf '%s: run %s: took over the lock of job %s, which has ended without giving it back\n' \
        "${PROG:-launch}" "'$MST_RUN'" "${id:-? (no owner recorded)}" >&2
      _run_link "$run"
      return
    fi
    rmdir "$lock/takeover"
  done
  _run_refuse ": its lock $lock changed hands while this job tried to take it; resubmit"
}

# MaxText writes checkpoints to base_output_directory/run_name/checkpoints, which _train.sh sets to
# $JOB_DIR/$JOB_NAME/checkpoints: that path becomes a link to the run's checkpoints.
_run_link() {
  local out="$JOB_DIR/$JOB_NAME"
  if ! { (own_dir "$out") && ln -sfn "$1/checkpoints" "$out/checkpoints" && [[ -L "$out/checkpoints" ]]; }; then
    printf '%s: cannot link %s to the run directory %s\n' "${PROG:-launch}" "$out/checkpoints" "$1" >&2
    run_release
    return 1
  fi
}

run_release() {
  local lock
  lock="$(run_dir)/lock"
  [[ "$(_run_field "$(cat "$lock/owner" 2>/dev/null)" job)" == "$JOB_ID" ]] || return 0
  rm -f "$lock/owner" && rmdir "$lock" 2>/dev/null
  return 0
}
