#!/usr/bin/env bash
# Usage: utils/launch/preflight.sh
#
# Per-node checks before training (run by the job on every node, outside the container):
#   - reports host, CPUs, memory, free disk;
#   - cleans what an earlier job of this user left behind on this node: processes that carry
#     another job's JOB_ID, this job's JOB_SCHEDULER and JOB_WORKSPACE and MST_REPO in their
#     environment whose job is not active (JOB_ACTIVE_IDS lists the user's active jobs), and
#     their private scratch dirs ${TMPDIR:-/tmp}/mst.* (owned by the user, labelled with the
#     job and workspace). Nothing else; and nothing at all when JOB_ACTIVE_IDS is unset.
#   - fails when free disk on JOB_DIR's or TMPDIR's filesystem is below PREFLIGHT_MIN_FREE_GB
#     (default 5), or when the node has GPUs (AMD /dev/kfd, NVIDIA /dev/nvidiactl) that the
#     vendor tool cannot list (or fewer than JOB_GPUS_PER_NODE when that is set).
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
: "${JOB_ID:?preflight.sh: JOB_ID is not set}" "${JOB_DIR:?preflight.sh: JOB_DIR is not set}"
uid=$(id -u)
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
active=" $JOB_ID ${JOB_ACTIVE_IDS:-} "
if [[ -n "${JOB_SCHEDULER:-}" && -v JOB_ACTIVE_IDS ]]; then
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

# Free disk.
min_gb=${PREFLIGHT_MIN_FREE_GB:-5}
for dir in "$JOB_DIR" "${TMPDIR:-/tmp}"; do
  free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
  free_gb=$(( free_kb / 1048576 ))
  echo "preflight: $dir: ${free_gb} GiB free"
  (( free_gb >= min_gb )) || problems+=("only ${free_gb} GiB free on $dir (need PREFLIGHT_MIN_FREE_GB=$min_gb)")
done

# GPUs, where the node has them.
gpus=-1
if [[ -e /dev/kfd ]]; then
  gpus=0
  for v in /sys/class/drm/card*/device/vendor; do [[ "$(cat "$v" 2>/dev/null)" == 0x1002 ]] && gpus=$((gpus + 1)); done
  (( gpus > 0 )) || problems+=("/dev/kfd exists but no AMD GPU is visible in /sys/class/drm")
elif [[ -e /dev/nvidiactl ]]; then
  if gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); then :; else gpus=0; fi
  (( gpus > 0 )) || problems+=("/dev/nvidiactl exists but nvidia-smi lists no GPU")
fi
if (( gpus >= 0 )); then
  echo "preflight: $gpus GPU(s) visible"
  if [[ -n "${JOB_GPUS_PER_NODE:-}" ]] && (( gpus < JOB_GPUS_PER_NODE )); then
    problems+=("$gpus GPU(s) visible, JOB_GPUS_PER_NODE=$JOB_GPUS_PER_NODE expected")
  fi
else
  echo "preflight: no GPU on this node (CPU run)"
fi
echo "preflight: uid $uid"

if (( ${#problems[@]} )); then
  for p in "${problems[@]}"; do echo "preflight: FAILED: $p" >&2; done
  exit 1
fi
echo "preflight: ok"
