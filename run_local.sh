#!/usr/bin/env bash
# Usage: run_local.sh MODEL[:TAG] [--run ALIAS [--checkpoint-every TIME]] [-- KEY=VALUE ... _env_NAME=VALUE ...]
#        run_local.sh            (no model: an interactive shell in the job's environment)
#
# Runs the same training as submit.sh on this one machine, without Slurm: same tiers
# (_container.sh -> _train.sh), same snapshot, log, job directory and JOB SUMMARY.
# --run ALIAS: a resumable run, as with submit.sh: checkpoints in $JOB_WORKSPACE/<user>/runs/ALIAS/, restored
# by the next job of the run; refused (one line, nothing written) while another job holds the run.
# --checkpoint-every TIME: checkpoint_period from the run's measured step time, as with submit.sh.
# Output goes to the terminal and to $JOB_WORKSPACE/<id>-JAX-<model>[-<tag>].log (a new file of ours).
# The snapshot is made in $JOB_WORKSPACE/<user>/.snapshots/; the job runs a private copy of it
# (in TMPDIR or /tmp) checked against the snapshot's hash, removed when the job ends.
# MODEL resolves as with submit.sh (exact, a config's "# Aliases:" short name, prefix, substring).
# Environment: as submit.sh (JOB_WORKSPACE, STAGE_TIMEOUTS, CONTAINER_RUNTIME, ...), and the same
# site settings (configs/site.env.sh or MST_SITE_FILE; the header's site: line shows them), except
# the site's sbatch flags, which it ignores (and says so).
# One machine: the config's "# Minimum nodes:" is not enforced (a scaled-down model through
# overrides is what runs here), only noted on stderr when it names more than one node; the GPU
# count is checked only where JOB_GPUS_PER_NODE is set (not from the config: a machine may have fewer).
# The first run creates the Python environment (~2-3 min); later runs reuse it.
# With CONTAINER_RUNTIME=none this machine's environment trains: a config whose attention kernel needs a
# module it lacks (cudnn_flash_te without Transformer Engine) is refused before the job starts, with the
# way out (utils/launch/check_attention.py); in an image, preflight checks it there.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$repo/utils/launch/lib.sh"
source "$repo/utils/launch/launch_lib.sh"
source "$repo/utils/launch/run_alias.sh"
PROG=run_local.sh

export JOB_SCHEDULER=local JOB_NUM_NODES=1 JOB_NODE_RANK=0
export JOB_HOSTNAME; JOB_HOSTNAME=$(hostname)
export JOB_NODELIST=$JOB_HOSTNAME JOB_COORDINATOR_ADDR=127.0.0.1 JOB_NODE_ADDRS=127.0.0.1

case "${1:-}" in
  -h|--help) usage; exit ;;
  "")
    settings_renamed
    site_load "$repo"
    "$repo/utils/setup_env.sh"
    export MST_REPO=$repo MST_VENV=${MAXTEXT_SLURM_VENV:-$repo/.venv} JOB_ID=local-shell
    exec "$repo/_container.sh" _train.sh --shell ;;
  -*) die_usage "first argument must be MODEL[:TAG] or nothing (see run_local.sh --help)" ;;
esac
model_arg=$1; shift
if [[ "${MST_OVERRIDES_IN_ENV:-}" == 1 && $# == 0 ]]; then
  # second pass (below): the overrides came by environment, out of this process's argv
  command_text=$MST_COMMAND_TEXT
  unset MST_OVERRIDES_IN_ENV MST_COMMAND_TEXT
else
  command_text="run_local.sh $(printf '%q' "$model_arg")$(shown_args "$@")"
  unset MST_RUN MST_CHECKPOINT_EVERY   # set by --run and --checkpoint-every only
  every=""
  while (( $# )) && [[ "$1" != -- ]]; do
    case "$1" in
      --run) (( $# >= 2 )) || die_usage "--run needs a run alias, e.g. --run exp1"; check_run_alias "$2"; export MST_RUN=$2; shift 2 ;;
      --run=*) check_run_alias "${1#--run=}"; export MST_RUN=${1#--run=}; shift ;;
      --checkpoint-every) (( $# >= 2 )) || die_usage "--checkpoint-every needs a time, e.g. --checkpoint-every 30m"; every=$2; shift 2 ;;
      --checkpoint-every=*) every=${1#--checkpoint-every=}; shift ;;
      *) die_usage "unexpected '$1': overrides go after --, e.g. run_local.sh $model_arg -- steps=10" ;;
    esac
  done
  (( $# )) && shift
  split_overrides "$@"
  [[ -z "$every" ]] || check_checkpoint_every "$every"   # exports MST_CHECKPOINT_EVERY for the re-run below
  if (( $# )); then
    # Everyone on the machine can read a process's argv (ps): run on without the overrides in it.
    export TRAIN_OVERRIDES TRAIN_ENV_OVERRIDES MST_OVERRIDES_IN_ENV=1 MST_COMMAND_TEXT=$command_text
    exec "$repo/run_local.sh" "$model_arg"
  fi
fi
[[ -z "${MST_RUN:-}" ]] || { check_run_alias "$MST_RUN"; check_run_overrides; }
prepare_launch "$model_arg" "$repo"
run_checkpoint_every   # --checkpoint-every: checkpoint_period from the run's measured step time
check_attention_here fail "$repo"   # natively, the trainer is this machine's environment: before the job starts
unset MST_GPU_REQUEST   # submit.sh's; the job header says what JOB_GPUS_PER_NODE checks
if [[ -n "$CONFIG_MIN_NODES" ]] && (( CONFIG_MIN_NODES > 1 )); then
  echo "run_local.sh: note: $MODEL needs at least $CONFIG_MIN_NODES nodes ($CONFIG_MIN_WHY); on one machine it fits only with overrides that shrink the model" >&2
fi
(( ${#SITE_SBATCH[@]} == 0 )) ||
  echo "run_local.sh: the site's sbatch flags do not apply here (no Slurm): ${SITE_SBATCH[*]}" >&2
umask 022   # what the job writes into a (possibly shared) workspace: readable by the group, writable by us only
make_workspace
make_user_root   # $JOB_WORKSPACE/<user>/{.snapshots,runs}: ours, or refused with one line
[[ -z "${MST_RUN:-}" ]] || run_prepare

# A new job id whose directory did not exist (mkdir is atomic): no earlier job is ever reused.
for try in 0 1 2 3 4 5 6 7 8 9; do
  suffix=""; (( try == 0 )) || suffix="-$try"
  export JOB_ID; JOB_ID="local-$(date +%Y%m%d-%H%M%S)-$$$suffix"
  export JOB_NAME="$JOB_ID-$MODEL_NAME"
  export JOB_DIR="$JOB_WORKSPACE/$JOB_NAME" JOB_LOG="$JOB_WORKSPACE/$JOB_NAME.log"
  [[ ! -e "$JOB_LOG" && ! -L "$JOB_LOG" ]] && mkdir "$JOB_DIR" 2>/dev/null && break
  (( try < 9 )) || die "could not create a new job directory in $JOB_WORKSPACE (every name tried exists)"
done
chmod 755 "$JOB_DIR" && chmod g-s "$JOB_DIR"
# the log: a new file of ours, opened once here (the job appends to this open file, never to
# whatever a name may point to later)
new_file "$JOB_LOG"
exec {log_fd}>>"$JOB_LOG"
[[ "$(stat -L -c %d:%i "/proc/$$/fd/$log_fd")" == "$(stat -c %d:%i -- "$JOB_LOG")" && ! -L "$JOB_LOG" ]] ||
  die "refusing the log $JOB_LOG: it was replaced while this job opened it"
code_copy=""
cleanup() {
  [[ -z "${MST_RUN:-}" ]] || run_release
  [[ -z "$code_copy" ]] || { chmod -R u+w -- "${code_copy%/repo}"; rm -rf -- "${code_copy%/repo}"; }
}
trap cleanup EXIT
if [[ -n "${MST_RUN:-}" ]]; then
  run_claim || { rmdir "$JOB_DIR"; rm -f -- "$JOB_LOG"; exit 1; }   # refused: nothing of this job is left
fi
export JOB_COORDINATOR_PORT; JOB_COORDINATOR_PORT=$(free_port $((61440 + $$ % 4096)))
export JOB_START_TIME; JOB_START_TIME=$(date +%s)
export MST_USER_ROOT; MST_USER_ROOT=$(user_root_path)
export MST_SNAPSHOT; MST_SNAPSHOT=$("$repo/utils/launch/snapshot.sh" "$repo" "$MST_USER_ROOT/.snapshots" "$command_text")
export MST_REPO_SHA256; MST_REPO_SHA256=$(bash "$repo/_job.sbatch" --snapshot-hash "$MST_SNAPSHOT") ||
  die "cannot hash the snapshot $MST_SNAPSHOT"
# the job runs a private copy checked against the hash (a later change of the snapshot changes nothing)
code_copy=$(bash "$repo/_job.sbatch" --code-copy "$MST_SNAPSHOT" "$MST_REPO_SHA256" "local $JOB_ID $JOB_HOSTNAME $JOB_WORKSPACE") || exit 1
export MST_REPO=$code_copy
export TRAIN_OVERRIDES TRAIN_ENV_OVERRIDES
ln -sfn "$MST_SNAPSHOT" "$JOB_DIR/artifact"
ln -sfn "$JOB_LOG" "$JOB_DIR/log"
declare -A limit=()
while read -r name secs; do limit[$name]=$secs; done < <(stage_timeouts "${STAGE_TIMEOUTS:-}")

job() {
  local stage="" rc=0 pid=""
  on_signal() {
    trap '' INT TERM HUP
    [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    "$MST_REPO/utils/launch/image.sh" --cleanup
    "$MST_REPO/utils/launch/job_summary.sh" cancelled "$stage"
    exit 130
  }
  trap on_signal INT TERM HUP
  "$MST_REPO/utils/launch/job_header.sh"
  for stage in image preflight train; do
    case "$stage" in
      image) "$MST_REPO/utils/launch/run_stage.sh" image "${limit[image]}" "$MST_REPO/utils/launch/image.sh" & ;;
      preflight)
        "$MST_REPO/utils/launch/run_stage.sh" preflight "${limit[preflight]}" "$MST_REPO/utils/launch/preflight.sh" & ;;
      train)
        trainer=_train.sh; [[ "${RAY:-0}" == 1 ]] && trainer=_train_with_ray.sh
        "$MST_REPO/utils/launch/run_stage.sh" train "${limit[train]}" "$MST_REPO/_container.sh" "$trainer" & ;;
    esac
    pid=$!
    wait "$pid" || rc=$?
    pid=""
    # the same check as a Slurm job's (one node here: its record must be there)
    if [[ "$stage" == image ]] && (( rc == 0 )); then "$MST_REPO/utils/launch/image.sh" --agree || rc=$?; fi
    if (( rc != 0 )); then
      "$MST_REPO/utils/launch/image.sh" --cleanup   # the image files the job built (apptainer, pyxis)
      "$MST_REPO/utils/launch/job_summary.sh" failed "$stage"
      return "$rc"
    fi
  done
  "$MST_REPO/utils/launch/image.sh" --cleanup
  "$MST_REPO/utils/launch/job_summary.sh" completed train
}

echo "run_local.sh: job $JOB_ID, log $JOB_LOG"
rc=0
# tee ignores SIGINT so the summary written after Ctrl-C still reaches the log
job 2>&1 | tee -i -a "/dev/fd/$log_fd" || rc=$?
exit "$rc"
