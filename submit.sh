#!/usr/bin/env bash
# Usage: submit.sh MODEL[:TAG] [-N NODES] [--ignore-min-nodes] [--run ALIAS [--checkpoint-every TIME] [--continue [--max-jobs N] [--max-stalled N]]] [--notify] [--auto-recover N [--recover-slowdowns]] [--dry-run] [SBATCH_FLAG ...] [-- KEY=VALUE ... _env_NAME=VALUE ...]
#
# Submits MaxText training of configs/MODEL.yml to Slurm from a login node.
#   MODEL     a config name: exact, else a short name a config declares ("# Aliases: 70b" in
#             llama2-70b.yml), else a unique prefix, else a unique substring (70b, mixtral, 405b)
#   TAG       added to the job name, so parallel experiments of one model stay apart
#   -N NODES  number of nodes (default 1); other flags go to sbatch unchanged, except those
#             that contradict the launcher (-J/--job-name, -o/--output, -e/--error, --nodes ...)
#   --ignore-min-nodes  submit below the config's "# Minimum nodes:" (refused otherwise: the
#             fewest nodes it names, or those for SITE_GPU_MEMORY_GB; e.g. with overrides that
#             shrink the model)
# GPUs: the job asks for the config's GPUs per node (--gpus-per-node=8 for "8x 80 GB GPUs"; none
#   for a CPU config such as tiny), or JOB_GPUS_PER_NODE's count; a GPU flag of yours
#   (--gpus-per-node, --gres=gpu:N, -G/--gpus) or of the site replaces the request, and
#   SITE_GPU_REQUEST=0 (whole-node clusters) asks for none. Preflight fails a node that shows
#   fewer GPUs than JOB_GPUS_PER_NODE; --dry-run's and the job header's gpus: line say which.
#   --run ALIAS  a resumable run: checkpoints on, kept in $JOB_WORKSPACE/<user>/runs/ALIAS/ (outside the
#             job dir; a run directory of before, $JOB_WORKSPACE/runs/ALIAS/, is moved there once); each job of the run restores the latest one. One job of a run at a time: a
#             job that starts while another holds the run fails at once (chain with --dependency)
#   --checkpoint-every TIME  with --run: checkpoint_period in steps that saves about every TIME
#             (900, 900s, 30m, 2h) at the median step time of the run's latest job that trained
#             (utils/run.py ALIAS --checkpoint-every; the run's first job keeps the configured period)
#   --continue  with --run: the run continues by itself until MaxText reaches `steps`: each job queues the
#             next (the same command, --dependency=afterany:<itself>) when it starts and cancels it at its
#             end when the run is complete, failed in a way a retry cannot fix, was cancelled (scancel),
#             or --max-stalled N jobs in a row (default 3) saved no new checkpoint; at most --max-jobs N
#             jobs (default 20) from this submission (docs/runs.md)
#   --notify  start utils/job_monitor.py for the job (detached): hang, slowdown, failure and
#             completion events to the destinations of your notification config
#             (docs/notifications.md; it must exist and be mode 0600). MST_NOTIFY=1 (e.g. from the
#             site file) does the same for every job; MST_NOTIFY=0 turns that off
#   --auto-recover N  the monitor resubmits the job without the nodes triage blames for a failure
#             or hang (node, GPU, heartbeat, collective faults), at most N times; implies --notify
#   --recover-slowdowns  also for a slowdown that diagnose pins on some nodes (RAY=1: from the job's
#             TSDB; a verdict scoped to hosts, never the model's own); with --auto-recover N (default 1)
#   --dry-run check everything and print what would be submitted; submit and write nothing
#   after --  KEY=VALUE is a MaxText override (checked against MaxText's schema); _env_NAME=VALUE
#             sets NAME in the trainer's environment (wins over the launcher defaults and
#             configs/MODEL.env.sh; the launcher's own variables are reserved); _env_NAME alone
#             passes NAME's value from your environment (for secrets: never on a command line)
# Environment: JOB_WORKSPACE (default <repo>/outputs), STAGE_TIMEOUTS ("image:1800,preflight:600,train:86400"),
#   RAY=0|1, CONTAINER_RUNTIME=auto|podman|docker|apptainer|pyxis|none, CONTAINER_IMAGE, ENABLE_COREDUMPS=0|1,
#   COREDUMP_DIR (docs/env-contract.md lists them all).
# Site settings: configs/site.env.sh, or the file MST_SITE_FILE names, holds the cluster's defaults
#   (SITE_SBATCH_FLAGS, CONTAINER_IMAGE, ...; configs/site.env.sh.example). They apply only where
#   your environment has not set the variable; the site's sbatch flags go before yours, and one
#   whose option you give is dropped. --dry-run and the job header's site: line show what it added.
# Makes a read-only snapshot of this repository (code, command, git state) in your own root
# $JOB_WORKSPACE/<user>/.snapshots/ (nobody else can write it; the job runs only code with the
# snapshot's hash), submits _job.sbatch from it and prints the job id, the log and the job directory:
#   $JOB_WORKSPACE/<jobid>-JAX-<model>[-<tag>].log and $JOB_WORKSPACE/<jobid>-JAX-<model>[-<tag>]/
# (made here, new and ours, while the job is held). A shared workspace (1777, 2775): docs/security.md.
# Secret values (docs/security.md) are redacted wherever the command is shown or recorded.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$repo/utils/launch/lib.sh"
source "$repo/utils/launch/launch_lib.sh"
source "$repo/utils/launch/run_alias.sh"
PROG=submit.sh
unset MST_RUN MST_CHECKPOINT_EVERY MST_CONTINUE   # set by --run, --checkpoint-every and --continue only

case "${1:-}" in
  -h|--help) usage; exit ;;
  ""|-*) die_usage "first argument must be MODEL[:TAG] (see submit.sh --help; models: $(model_names "$repo/configs"))" ;;
esac
model_arg=$1; shift
command_text="submit.sh $(printf '%q' "$model_arg")$(shown_args "$@")"

nodes=1 sbatch_flags=() dry_run=0 user_hold=0 notify="" recover=0 slowdowns=0 ignore_min=0 every="" continue=0 max_jobs="" max_stalled=""
while (( $# )); do
  case "$1" in
    --) shift; break ;;
    --dry-run) dry_run=1; shift ;;
    --ignore-min-nodes) ignore_min=1; shift ;;
    --notify) notify=flag; shift ;;
    --recover-slowdowns) slowdowns=1 notify=flag; shift ;;
    --auto-recover|--auto-recover=*)
      if [[ "$1" == *=* ]]; then recover=${1#*=}; shift; else (( $# >= 2 )) || die_usage "--auto-recover needs a count, e.g. --auto-recover 2"; recover=$2; shift 2; fi
      [[ "$recover" =~ ^([1-9]|10)$ ]] || die_usage "--auto-recover takes 1 .. 10 resubmissions, got '$recover'"
      notify=flag ;;
    --run) (( $# >= 2 )) || die_usage "--run needs a run alias, e.g. --run exp1"; check_run_alias "$2"; export MST_RUN=$2; shift 2 ;;
    --run=*) check_run_alias "${1#--run=}"; export MST_RUN=${1#--run=}; shift ;;
    --checkpoint-every) (( $# >= 2 )) || die_usage "--checkpoint-every needs a time, e.g. --checkpoint-every 30m"; every=$2; shift 2 ;;
    --checkpoint-every=*) every=${1#--checkpoint-every=}; shift ;;
    --continue) continue=1; shift ;;
    --max-jobs) (( $# >= 2 )) || die_usage "--max-jobs needs a count, e.g. --max-jobs 10"; max_jobs=$2; shift 2 ;;
    --max-jobs=*) max_jobs=${1#--max-jobs=}; shift ;;
    --max-stalled) (( $# >= 2 )) || die_usage "--max-stalled needs a count, e.g. --max-stalled 3"; max_stalled=$2; shift 2 ;;
    --max-stalled=*) max_stalled=${1#--max-stalled=}; shift ;;
    -N|--nodes) (( $# >= 2 )) || die_usage "$1 needs a node count"; nodes=$2; shift 2 ;;
    -N*) nodes=${1#-N}; shift ;;
    --nodes=*) nodes=${1#--nodes=}; shift ;;
    -H|--ho|--hol|--hold) user_hold=1; sbatch_flags+=("$1"); shift ;;
    *) sbatch_flags+=("$1"); shift ;;
  esac
done
if ! [[ "$nodes" =~ ^[1-9][0-9]{0,5}$ ]] || (( nodes > MAX_NODES )); then
  die_usage "bad node count '$nodes': -N takes a whole number from 1 to $MAX_NODES, e.g. -N 8"
fi
check_sbatch_flags "${sbatch_flags[@]}"
# before the Python environment is set up (minutes on a fresh machine)
(( dry_run )) || command -v sbatch >/dev/null 2>&1 ||
  die "sbatch not found: run on a Slurm login node, or try Slurm on this machine: utils/local_cluster.sh up 2 (installs Slurm as root), then eval \"\$(utils/local_cluster.sh env)\""
split_overrides "$@"
[[ -z "${MST_RUN:-}" ]] || check_run_overrides
[[ -z "$every" ]] || check_checkpoint_every "$every"
check_continue "$continue" "$max_jobs" "$max_stalled"   # exports MST_CONTINUE, MST_RUN_JOB with --continue
prepare_launch "$model_arg" "$repo" "$nodes" "$ignore_min"   # a count below the config's minimum: refused
run_checkpoint_every   # --checkpoint-every: checkpoint_period from the run's measured step time
check_attention_here warn "$repo"   # CONTAINER_RUNTIME=none: the login node's look at the nodes' environment (preflight decides)
site_sbatch "${sbatch_flags[@]}"   # the site's sbatch flags go first; those whose option you gave are dropped
gpu_request "$nodes" "${sbatch_flags[@]}"   # --gpus-per-node from the config (GPU_SBATCH), JOB_GPUS_PER_NODE
[[ -n "$notify" || "${MST_NOTIFY:-0}" != 1 ]] || notify="env"
[[ "${MST_NOTIFY:-0}" =~ ^[01]$ ]] || die "MST_NOTIFY must be 0 or 1, got '${MST_NOTIFY}'"
if [[ -n "$notify" ]]; then
  # the config is checked before anything is submitted: a job must not go unwatched by mistake
  notify_conf=${MST_NOTIFY_CONFIG:-$HOME/.config/maxtext-slurm/notify.conf}
  if [[ -e "$notify_conf" || "$notify" == flag ]]; then
    out=$("$repo/utils/job_monitor.py" --check-notify --notify-config "$notify_conf" 2>&1 >/dev/null) ||
      die "--notify: ${out#job_monitor.py: } (docs/notifications.md; or submit without --notify)"
  fi
fi
monitor_cmd=("$repo/utils/job_monitor.py")
if (( dry_run )); then
  # what the submission would refuse, without making anything: your root in the workspace
  root=$(user_root_path)
  [[ ! -e "$root" && ! -L "$root" ]] || check_trusted "$root" "your root in the workspace" "remove it or use a JOB_WORKSPACE of your own"
  echo "dry run: nothing submitted"
  echo "model: $MODEL ($repo/configs/$MODEL.yml${MODEL_TAG:+, tag $MODEL_TAG})"
  echo "sbatch: sbatch --parsable --job-name=$MODEL_NAME --nodes=$nodes --output=$JOB_WORKSPACE/%j-$MODEL_NAME.log$(
    shown_args "${SITE_SBATCH_KEPT[@]}" "${GPU_SBATCH[@]}" "${sbatch_flags[@]}") <snapshot>/_job.sbatch"
  echo "gpus: $MST_GPU_REQUEST"
  (( ! ignore_min )) || [[ -z "$CONFIG_MIN_NODES" ]] || (( nodes >= CONFIG_MIN_NODES )) ||
    echo "min_nodes: ignored (--ignore-min-nodes): $CONFIG_MIN_WHY"
  echo "site: ${MST_SITE_APPLIED:-none}"
  (( ${#SITE_SBATCH_DROPPED[@]} == 0 )) ||
    echo "site_sbatch_dropped: ${SITE_SBATCH_DROPPED[*]} (you gave these options)"
  echo "overrides: $(shown_list maxtext <<< "$TRAIN_OVERRIDES")"
  echo "env_overrides: $(shown_list env <<< "$TRAIN_ENV_OVERRIDES")"
  [[ -z "${MST_RUN:-}" ]] || echo "run: $(run_describe)"
  [[ -z "${MST_CONTINUE:-}" ]] || echo "continue: $(continue_describe)"
  [[ -z "$notify" ]] || echo "monitor: ${monitor_cmd[*]} <job id> --detach$( (( recover || slowdowns )) && echo " --auto-recover $(( recover ? recover : 1 ))")$( (( slowdowns )) && echo " --recover-slowdowns")"
  exit 0
fi

umask 022   # what the job writes into a (possibly shared) workspace: readable by the group, writable by us only
make_workspace
make_user_root   # $JOB_WORKSPACE/<user>/{.snapshots,runs}: ours, or refused with one line
[[ -z "${MST_RUN:-}" ]] || run_prepare
snapshot=$("$repo/utils/launch/snapshot.sh" "$repo" "$(user_root_path)/.snapshots" "$command_text")
# the job runs only code with this hash (the job's environment is the job's own: nobody can change it)
MST_REPO_SHA256=$(bash "$repo/_job.sbatch" --snapshot-hash "$snapshot") || die "cannot hash the snapshot $snapshot"
MST_USER_ROOT=$(user_root_path)
export MST_SNAPSHOT=$snapshot MST_REPO=$snapshot MST_REPO_SHA256 MST_USER_ROOT TRAIN_OVERRIDES TRAIN_ENV_OVERRIDES
log_pattern="$JOB_WORKSPACE/%j-$MODEL_NAME.log"
# Held until an earlier job's files with the same id (Slurm's ids restart after a state reset)
# are moved aside, so the new job never appends to or replaces them.
if ! out=$(sbatch --parsable --hold --job-name="$MODEL_NAME" --nodes="$nodes" --output="$log_pattern" \
             "${SITE_SBATCH_KEPT[@]}" "${GPU_SBATCH[@]}" "${sbatch_flags[@]}" "$snapshot/_job.sbatch" 2>&1); then
  chmod -R u+w "$snapshot" && rm -rf "$snapshot"
  die "sbatch refused the job: $(tr '\n' ' ' <<< "$out")"
fi
job_id=${out%%;*}
job_id=${job_id##*$'\n'}
name="$job_id-$MODEL_NAME"
# From here until the release, a failure cancels the held job: it never runs half set up.
trap '[[ $? == 0 ]] || scancel "$job_id" 2>/dev/null' EXIT
move_aside_job "$JOB_WORKSPACE/$name"
# The job's log and directory are made here, ours and new, before the job can start: Slurm then
# appends to this file (never through a link someone put at its path) and the job checks it.
new_file "$JOB_WORKSPACE/$name.log"
own_dir "$JOB_WORKSPACE/$name"
ln -sfn "$snapshot" "$JOB_WORKSPACE/$name/artifact"
ln -sfn "$JOB_WORKSPACE/$name.log" "$JOB_WORKSPACE/$name/log"
# the record the job monitor checks a snapshot against before it resubmits anything
( umask 022; new_file "$JOB_WORKSPACE/$name/snapshot.sha256"
  printf '%s  %s\n' "$MST_REPO_SHA256" "$snapshot" > "$JOB_WORKSPACE/$name/snapshot.sha256" )
trap - EXIT
if (( ! user_hold )) && ! out=$(scontrol release "$job_id" 2>&1); then
  die "job $job_id is submitted but held, and 'scontrol release $job_id' failed: $(tr '\n' ' ' <<< "$out")"
fi
cat <<EOM
Submitted job $job_id ($MODEL_NAME) on $nodes node(s)$( (( user_hold )) && echo ", held (--hold): scontrol release $job_id")
  log:     $JOB_WORKSPACE/$name.log
  job dir: $JOB_WORKSPACE/$name
  follow:  tail -F $(printf '%q' "$JOB_WORKSPACE/$name.log")
EOM
[[ -z "${MST_RUN:-}" ]] || echo "  run:     $(run_describe)"
[[ -z "${MST_CONTINUE:-}" ]] || echo "  continue: $(continue_describe)"
if [[ -n "$notify" ]]; then
  monitor_cmd+=("$job_id" --detach)
  (( ! slowdowns || recover )) || recover=1
  if (( recover )); then monitor_cmd+=(--auto-recover "$recover"); fi
  (( ! slowdowns )) || monitor_cmd+=(--recover-slowdowns)
  if out=$(MST_NOTIFY=0 "${monitor_cmd[@]}" 2>&1); then
    echo "  monitor: $(sed -n 's/^monitor started: //p' <<< "$out"), log $JOB_WORKSPACE/$name/monitor/monitor.log"
  else
    echo "submit.sh: job $job_id is submitted, but its monitor did not start: $(tr '\n' ' ' <<< "$out")" >&2
  fi
fi
