#!/usr/bin/env bash
# Usage: utils/launch/preflight.sh
#
# Per-node checks before training (run by the job on every node, outside the container):
#   - reports host, CPUs, memory, free disk;
#   - cleans what an earlier job of this user left behind on this node, only for jobs that are
#     finished (JOB_ACTIVE_IDS lists the user's active jobs; a newer Slurm id is never touched),
#     and nothing at all when JOB_ACTIVE_IDS is unset:
#       containers (podman, docker: those installed) labelled mst.job=<id>, this job's
#       mst.scheduler and mst.workspace, whose job directory in JOB_WORKSPACE is the user's
#       (docker's daemon is shared by every user), removed with `rm -f`;
#       processes that carry another job's JOB_ID, this job's JOB_SCHEDULER and JOB_WORKSPACE
#       and MST_REPO in their environment; their private scratch dirs ${TMPDIR:-/tmp}/mst.*
#       (owned by the user, labelled with the job and workspace);
#   - applies the host settings the site asks for (PREFLIGHT_HOST_SETTINGS="numa_balancing=0
#     thp=never", table HOST_SETTINGS in utils/launch/lib.sh): reports the value found, sets it
#     where it can (root) and reports the change; where it cannot, a warning, not a failure;
#   - fails when free disk on JOB_DIR's or TMPDIR's filesystem is below PREFLIGHT_MIN_FREE_GB
#     (default 5), or when utils/launch/gpu_health.sh finds a GPU problem (uncorrectable errors,
#     another user's process, memory not released, fewer GPUs than JOB_GPUS_PER_NODE).
#   - reports the network (utils/launch/netenv.sh --report): this node's address and interface, its RDMA
#     ports and their states, the NCCL/RCCL settings chosen; fails a multi-node job when no usable
#     interface carries this node's address;
#   - fails when the attention kernel the config or overrides ask for (MODEL, TRAIN_OVERRIDES) needs a
#     module the trainer's interpreter lacks (utils/launch/check_attention.py, run through _container.sh
#     in the runtime that will train: natively or in the node's image; attention_kernels.tsv), e.g.
#     cudnn_flash_te without Transformer Engine, with the override or environment that fixes it;
# Every problem is a "preflight: FAILED: ..." line; they are also written to
# $JOB_DIR/.preflight/<host> ("ok" when there is none), from which the job prints one report for
# all nodes.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/lib.sh"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { usage; exit; }
: "${JOB_ID:?preflight.sh: JOB_ID is not set}" "${JOB_DIR:?preflight.sh: JOB_DIR is not set}"
uid=$(id -u)
host=${JOB_HOSTNAME:-$(hostname)}
problems=()

echo "preflight: host $(hostname), $(nproc) CPUs, $(awk '/MemAvailable/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo) GiB memory available, kernel $(uname -r)"

# Leftovers of this user's earlier jobs, only when the scheduler said which jobs are active: a
# job it did not list is finished. A job newer than this one (a larger Slurm id) may have started
# after that list was made, so it is never touched.
finished() {  # ID: true when job ID is over
  [[ "$active" != *" $1 "* ]] || return 1
  [[ "${JOB_SCHEDULER:-}" == slurm && "$1" =~ ^[0-9]+$ && "$JOB_ID" =~ ^[0-9]+$ ]] && (( $1 > JOB_ID )) && return 1
  return 0
}
ours() {  # ID: the job's directory in this workspace (<id>-JAX-...) belongs to this user
  local d
  for d in "${JOB_WORKSPACE:-/nonexistent}/$1"-*; do [[ -d "$d" && ! -L "$d" && -O "$d" ]] && return 0; done
  return 1
}
# Containers that _container.sh started for a finished job (labels mst.job, mst.workspace, mst.scheduler).
remove_leftover_containers() {
  local rt ids id job state name
  for rt in podman docker; do
    command -v "$rt" >/dev/null 2>&1 || continue
    ids=$(timeout 30 "$rt" ps -a -q --filter "label=mst.scheduler=$JOB_SCHEDULER" \
            --filter "label=mst.workspace=${JOB_WORKSPACE:-}" 2>/dev/null) || continue
    [[ -n "$ids" ]] || continue
    # shellcheck disable=SC2086 # one id per word
    while read -r id job state name; do
      if ! [[ "$job" =~ ^[A-Za-z0-9._-]+$ ]] || ! finished "$job" || ! ours "$job"; then continue; fi
      if timeout 60 "$rt" rm -f "$id" >/dev/null 2>&1; then
        echo "preflight: removed leftover $rt container ${name#/} ($state) of finished job $job"
      else
        echo "preflight: warning: could not remove leftover $rt container ${name#/} of finished job $job"
      fi
    done < <(timeout 30 "$rt" inspect $ids 2>/dev/null \
               --format '{{.Id}} {{index .Config.Labels "mst.job"}} {{.State.Status}} {{.Name}}')
  done
}
active=" $JOB_ID ${JOB_ACTIVE_IDS:-} "
if [[ -n "${JOB_SCHEDULER:-}" && -v JOB_ACTIVE_IDS ]]; then
  remove_leftover_containers
  for envf in /proc/[0-9]*/environ; do
    pid=${envf#/proc/}; pid=${pid%/environ}
    [[ -O "$envf" && "$pid" != "$$" ]] || continue
    other=$(tr '\0' '\n' 2>/dev/null < "$envf" | awk -v s="JOB_SCHEDULER=${JOB_SCHEDULER:-}" -v w="JOB_WORKSPACE=${JOB_WORKSPACE:-}" '
      /^JOB_ID=/ { id = substr($0, 8) } /^MST_REPO=/ { repo = 1 } $0 == s { same = 1 } $0 == w { ws = 1 }
      END { if (repo && same && ws && id != "") print id }') || continue
    if [[ -z "$other" ]] || ! finished "$other"; then continue; fi
    echo "preflight: stopping leftover pid $pid of finished job $other: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-120)"
    kill -KILL "$pid" 2>/dev/null || true
  done
  # private scratch dirs of finished jobs (utils/launch/lib.sh job_scratch: "SCHEDULER JOB_ID HOST WORKSPACE")
  for d in "${TMPDIR:-/tmp}"/mst.*; do
    [[ -d "$d" && ! -L "$d" && -O "$d" && -f "$d/job" && ! -L "$d/job" ]] || continue
    read -r sched other _ ws < "$d/job" || continue
    if [[ "$sched" != "$JOB_SCHEDULER" || "$ws" != "${JOB_WORKSPACE:-}" ]] || ! finished "$other"; then continue; fi
    echo "preflight: removing leftover scratch $d of finished job $other"
    rm -rf -- "$d"
  done
else
  echo "preflight: the scheduler did not say which of your jobs are active (JOB_ACTIVE_IDS unset): not cleaning up after earlier jobs"
fi

# Host settings the site asks for: found value, and the change where this user may make it.
settings=${PREFLIGHT_HOST_SETTINGS:-}
if [[ -n "${settings// /}" ]]; then
  if ! wanted=$(host_settings "$settings" 2>&1); then
    echo "preflight: warning: host settings not applied: $wanted"
    wanted=""
  fi
  current() {  # FILE: the value set in it (the bracketed choice of "always [madvise] never")
    local v
    v=$(head -c 200 "$1" 2>/dev/null) || return 1
    [[ "$v" =~ \[([^]]*)\] ]] && v=${BASH_REMATCH[1]}
    printf '%s' "$v"
  }
  while read -r name file value; do
    [[ -n "$name" ]] || continue
    top=${file#/}; top=${top%%/*}
    f=$(node_root "$top")/${file#/"$top"/}
    if ! now=$(current "$f"); then
      echo "preflight: warning: host setting $name: $file cannot be read on this node: not applied"
    elif [[ "$now" == "$value" ]]; then
      echo "preflight: host setting $name=$value ($file): already so"
    elif printf '%s\n' "$value" 2>/dev/null > "$f" && [[ "$(current "$f")" == "$value" ]]; then
      echo "preflight: host setting $name=$value ($file): changed from $now"
    else
      echo "preflight: warning: host setting $name: $file is $now, the site asks for $value," \
        "and uid $uid cannot change it (root can): left as it is"
    fi
  done <<< "$wanted"
fi

# Free disk.
min_gb=${PREFLIGHT_MIN_FREE_GB:-5}
for dir in "$JOB_DIR" "${TMPDIR:-/tmp}"; do
  free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
  free_gb=$(( free_kb / 1048576 ))
  echo "preflight: $dir: ${free_gb} GiB free"
  (( free_gb >= min_gb )) || problems+=("only ${free_gb} GiB free on $dir (need PREFLIGHT_MIN_FREE_GB=$min_gb)")
done

# GPUs: one line per GPU and a verdict (utils/launch/gpu_health.sh); its FAILED lines are problems here.
gh_rc=0
gh_out=$("$here/gpu_health.sh" 2>&1) || gh_rc=$?
printf '%s\n' "$gh_out"
gh_problems=0
while IFS= read -r line; do
  [[ "$line" == "gpu_health: "*": FAILED: "* && "$line" != "gpu_health: verdict "* ]] || continue
  what=${line#gpu_health: }; what=${what%%: FAILED: *}
  [[ "$what" == "$host" ]] && what="GPUs"
  problems+=("$what: ${line#*: FAILED: }")
  gh_problems=$((gh_problems + 1))
done <<< "$gh_out"
(( gh_rc == 0 || gh_problems > 0 )) || problems+=("utils/launch/gpu_health.sh failed (exit $gh_rc)")

# Network: address, interface, RDMA ports (utils/launch/netenv.sh); its FAILED line is a problem here.
net_rc=0
net_out=$("$here/netenv.sh" --report 2>&1) || net_rc=$?
printf '%s\n' "$net_out"
net_failed=$(sed -n 's/^netenv: FAILED: //p' <<< "$net_out" | head -n 1)
(( net_rc == 0 )) || problems+=("network: ${net_failed:-utils/launch/netenv.sh failed (exit $net_rc)}")

# The attention kernel the config (and overrides) ask for: its modules (utils/launch/attention_kernels.tsv)
# must be there for the interpreter that will run MaxText, so _container.sh runs the check where training
# will run (natively with the job's environment, or in the node's image); its FAILED line is a problem here.
if [[ -n "${MODEL:-}" ]]; then
  repo=$(cd "$here/../.." && pwd)
  att_rc=0
  # shellcheck disable=SC2016  # expanded by the bash that _container.sh starts, with its MST_PYTHON
  att_out=$(MST_REPO=$repo "$repo/_container.sh" bash -c \
    'PYTHONPATH="$MST_REPO/utils${PYTHONPATH:+:$PYTHONPATH}" "$MST_PYTHON" "$MST_REPO/utils/launch/check_attention.py" "$MST_REPO/configs/$MODEL.yml"' 2>&1) || att_rc=$?
  att_line=$(grep -m 1 '^attention: ' <<< "$att_out" || true)
  if [[ "$att_line" == "attention: FAILED: "* ]]; then
    problems+=("${att_line#attention: FAILED: }")
  elif (( att_rc != 0 )); then
    problems+=("the attention kernel check could not run in the trainer's runtime (exit $att_rc): $(tail -n 1 <<< "$att_out")")
  else
    echo "preflight: $att_line"
  fi
fi
echo "preflight: uid $uid"

# This node's report, read by the job when preflight failed somewhere (_job.sbatch).
own_dir "$JOB_DIR/.preflight"   # ours, or refused: the report is never written into someone else's directory
tmp=$(mktemp "$JOB_DIR/.preflight/.$host.XXXXXX")
if (( ${#problems[@]} )); then printf 'FAILED: %s\n' "${problems[@]}" > "$tmp"; else echo ok > "$tmp"; fi
mv -f "$tmp" "$JOB_DIR/.preflight/$host"

if (( ${#problems[@]} )); then
  for p in "${problems[@]}"; do echo "preflight: FAILED: $p" >&2; done
  exit 1
fi
echo "preflight: ok"
