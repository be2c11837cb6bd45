#!/usr/bin/env bash
# Usage: utils/launch/gpu_health.sh
#
# This node's GPUs, checked before training (utils/launch/preflight.sh runs it on every node; bash
# and coreutils only: a batch host may have no Python environment). One line per GPU:
#   gpu_health: gpu N (VENDOR PCI-ADDRESS): ok: ...         or   ...: FAILED: PROBLEM; PROBLEM
# A GPU fails on:
#   - uncorrectable ECC/RAS errors (AMD: the "ue:" counts of ras/*_err_count; NVIDIA:
#     ecc.errors.uncorrected.volatile.total; "[N/A]" / "[Not Supported]", a GPU without ECC,
#     only says so), and on NVIDIA pages pending retirement, rows pending remapping or a failed
#     remapping (retired_pages.pending, remapped_rows.pending, remapped_rows.failure);
#   - a process of another user on the GPU (its owner from /proc/PID/status);
#   - GPU memory in use that no process of this job and no other user's process holds, above
#     1 GiB: memory not released by an earlier job, or held by another process of yours (named).
#     The driver's own use of an idle GPU stays far below 1 GiB (MI300X ~0.3 GiB, H100 < 0.1 GiB).
#     A process is this job's when its environment holds JOB_ID=$JOB_ID.
# Only the GPUs the scheduler gave this job are checked and counted when it names them
# (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES: indices, NVIDIA also UUIDs): on a shared node the
# others are other jobs' ("not checked" lines).
# Then host checks (a GPU count below JOB_GPUS_PER_NODE, a vendor tool that fails) and one verdict:
#   gpu_health: HOST: FAILED: PROBLEM        gpu_health: verdict HOST: ok|FAILED: N VENDOR GPU(s) ...
# Vendors (table VENDORS below; the device file decides, as in _container.sh):
#   AMD    /dev/kfd: amdgpu sysfs /sys/class/drm/card*/device with vendor 0x1002 (ras/*_err_count,
#          mem_info_vram_used, mem_info_vram_total); processes from amdkfd's
#          /sys/class/kfd/kfd/proc/PID/vram_GPUID (bytes; GPUID from .../topology/nodes/N/gpu_id,
#          the card from that node's drm_render_minor).
#   NVIDIA /dev/nvidiactl: nvidia-smi --query-gpu and --query-compute-apps (csv,noheader,nounits).
# Test hooks (fixture trees, tests/fixtures/gpu/): MST_SYSFS_ROOT (default /sys), MST_PROCFS_ROOT
#   (/proc), MST_DEV_ROOT (/dev); "%h" in them stands for this node's name (JOB_HOSTNAME), so
#   the nodes of a local cluster on one machine can each see their own tree.
# Exit status: 0 healthy (or no GPU and none expected), 1 a problem.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { usage; exit; }
export LC_ALL=C

host=${JOB_HOSTNAME:-$(hostname)}
sys=$(node_root sys) proc=$(node_root proc) dev=$(node_root dev)
HELD_MIB=1024   # GPU memory that nobody on the GPU explains, above which the GPU fails
me=$(id -u)

# vendor, device file (under MST_DEV_ROOT), lister (how GPUs, errors, memory and processes are read),
# the variable by which the scheduler gives a job some of the node's GPUs (indices; NVIDIA also UUIDs)
VENDORS=(
  "amd     kfd        amd_gpus     ROCR_VISIBLE_DEVICES"
  "nvidia  nvidiactl  nvidia_gpus  CUDA_VISIBLE_DEVICES"
)

# What every lister fills, one entry per GPU, in index order:
gpu_bus=() gpu_uuid=() gpu_ue=() gpu_ue_detail=() gpu_used=() gpu_total=() gpu_extra=()
# and per process on a GPU: "GPU_INDEX PID MIB"
procs=()
host_problems=() notes=()

first_line() {  # first_line VAR FILE: VAR = the file's first line (false when unreadable or empty)
  local -n _fl=$1
  _fl=
  { IFS= read -r _fl || [[ -n $_fl ]]; } 2>/dev/null < "$2"
}
joined() {  # joined SEP ITEM...: the items with SEP between them
  local out="" x
  for x in "${@:2}"; do out+="${out:+$1}$x"; done
  printf '%s' "$out"
}
mib_of_bytes() { echo $(( ${1:-0} / 1048576 )); }
gib() { local m=${1:-0}; printf '%d.%d' $((m / 1024)) $((m % 1024 * 10 / 1024)); }

# ---- AMD ------------------------------------------------------------------------------------------
amd_gpus() {
  local d n v addr f kind count block blocks ue used total node gid minor props i
  local -a cards=()
  local -A index_of_bus=()
  for d in "$sys"/class/drm/card*; do
    n=${d##*/card}
    [[ $n =~ ^[0-9]+$ ]] || continue   # connectors: card0-DP-1
    if first_line v "$d/device/vendor" && [[ $v == 0x1002 ]]; then cards[n]=$d/device; fi
  done
  for n in "${!cards[@]}"; do
    d=${cards[n]}
    addr=$(cd -P "$d" 2>/dev/null && basename "$PWD") || addr="card$n"
    i=${#gpu_bus[@]}
    index_of_bus[$addr]=$i
    ue=0 blocks=""
    if compgen -G "$d/ras/*_err_count" >/dev/null; then
      for f in "$d"/ras/*_err_count; do
        block=${f##*/}
        while read -r kind count; do
          [[ $kind == ue: && $count =~ ^[0-9]+$ ]] || continue
          if (( count > 0 )); then ue=$((ue + count)); blocks+="${blocks:+, }${block%_err_count} $count"; fi
        done 2>/dev/null < "$f"
      done
    else
      ue=na
    fi
    first_line used "$d/mem_info_vram_used" && [[ $used =~ ^[0-9]+$ ]] || used=""
    first_line total "$d/mem_info_vram_total" && [[ $total =~ ^[0-9]+$ ]] || total=""
    gpu_bus+=("$addr") gpu_uuid+=("") gpu_ue+=("$ue") gpu_ue_detail+=("$blocks") gpu_extra+=("")
    gpu_used+=("${used:+$(mib_of_bytes "$used")}") gpu_total+=("${total:+$(mib_of_bytes "$total")}")
  done
  # amdkfd: gpu_id -> card (by the render node the topology names), then each process's vram_<gpu_id>
  local kfd=$sys/class/kfd/kfd
  local -A index_of_gid=()
  for node in "$kfd"/topology/nodes/*; do
    if ! first_line gid "$node/gpu_id" || ! [[ $gid =~ ^[1-9][0-9]*$ ]]; then continue; fi
    props=$(cat "$node/properties" 2>/dev/null) || continue
    minor=$(awk '$1 == "drm_render_minor" { print $2 }' <<< "$props")
    addr=$(cd -P "$sys/class/drm/renderD$minor/device" 2>/dev/null && basename "$PWD") || continue
    [[ -v "index_of_bus[$addr]" ]] && index_of_gid[$gid]=${index_of_bus[$addr]}
  done
  if [[ ! -d $kfd/proc ]]; then
    notes+=("no $kfd/proc (amdkfd too old?): processes on the GPUs not checked")
    return 0
  fi
  for d in "$kfd"/proc/[0-9]*; do
    for f in "$d"/vram_*; do
      gid=${f##*/vram_}
      if [[ ! -v "index_of_gid[$gid]" ]] || ! first_line v "$f" || ! [[ $v =~ ^[1-9][0-9]*$ ]]; then continue; fi
      procs+=("${index_of_gid[$gid]} ${d##*/} $(mib_of_bytes "$v")")
    done
  done
}

# ---- NVIDIA ---------------------------------------------------------------------------------------
nv_val() {  # nv_val VALUE: the value without blanks; "" for [N/A], [Not Supported], N/A ...
  local v=${1//[[:space:]]/}
  [[ $v == \[* || $v == N/A || -z $v ]] && v=""
  printf '%s' "$v"
}
nvidia_gpus() {
  local out idx bus uuid ecc used total rp rr rf line extra uu pid mem
  local -A index_of_uuid=()
  local base=index,pci.bus_id,uuid,ecc.errors.uncorrected.volatile.total,memory.used,memory.total
  if ! out=$(nvidia-smi --query-gpu="$base" --format=csv,noheader,nounits 2>&1); then
    host_problems+=("nvidia-smi failed: $(head -c 200 <<< "$out" | tr '\n' ' ')")
    return 0
  fi
  while IFS=, read -r idx bus uuid ecc used total; do
    idx=$(nv_val "$idx")
    [[ $idx =~ ^[0-9]+$ ]] || continue
    uuid=$(nv_val "$uuid") ecc=$(nv_val "$ecc")
    index_of_uuid[$uuid]=${#gpu_bus[@]}
    [[ $ecc =~ ^[0-9]+$ ]] || ecc=na
    gpu_bus+=("$(nv_val "$bus")") gpu_uuid+=("$uuid") gpu_ue+=("$ecc") gpu_ue_detail+=("") gpu_extra+=("")
    gpu_used+=("$(nv_val "$used")") gpu_total+=("$(nv_val "$total")")
  done <<< "$out"
  # pending retirement / remapping: fields older drivers do not know; then only a note
  if out=$(nvidia-smi --query-gpu=index,retired_pages.pending,remapped_rows.pending,remapped_rows.failure \
             --format=csv,noheader,nounits 2>&1); then
    while IFS=, read -r idx rp rr rf; do
      idx=$(nv_val "$idx")
      [[ $idx =~ ^[0-9]+$ && $idx -lt ${#gpu_bus[@]} ]] || continue
      extra=""
      [[ $(nv_val "$rp") == Yes ]] && extra+="${extra:+; }pages pending retirement (reset the GPU)"
      [[ $(nv_val "$rr") == Yes ]] && extra+="${extra:+; }rows pending remapping (reset the GPU)"
      [[ $(nv_val "$rf") == Yes ]] && extra+="${extra:+; }a row remapping failed (replace the GPU)"
      gpu_extra[idx]=$extra
    done <<< "$out"
  else
    out=$(head -c 120 <<< "$out" | tr '\n' ' ')
    notes+=("nvidia-smi knows no retired_pages/remapped_rows fields: not checked ($out)")
  fi
  if ! out=$(nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits 2>&1); then
    host_problems+=("nvidia-smi --query-compute-apps failed: $(head -c 200 <<< "$out" | tr '\n' ' ')")
    return 0
  fi
  while IFS=, read -r uu pid mem; do
    uu=$(nv_val "$uu") pid=$(nv_val "$pid") mem=$(nv_val "$mem")
    [[ -v "index_of_uuid[$uu]" && $pid =~ ^[0-9]+$ ]] || continue
    [[ $mem =~ ^[0-9]+$ ]] || mem=0
    procs+=("${index_of_uuid[$uu]} $pid $mem")
  done <<< "$out"
}

# ---- whose process ---------------------------------------------------------------------------------
# owner_of PID: prints "UID" (real uid from /proc/PID/status), nothing when the process is not visible
owner_of() { awk '$1 == "Uid:" { print $2; exit }' "$proc/$1/status" 2>/dev/null; }
user_name() {  # user_name UID: "user NAME", or "uid UID" when the name is unknown here
  local n
  n=$(getent passwd "$1" 2>/dev/null | cut -d: -f1)
  if [[ -n $n ]]; then printf 'user %s' "$n"; else printf 'uid %s' "$1"; fi
}
job_of() {  # job_of PID: the JOB_ID in its environment (readable for your own processes only)
  tr '\0' '\n' 2>/dev/null < "$proc/$1/environ" | sed -n 's/^JOB_ID=//p' | head -n 1
}

# ---- the checks -----------------------------------------------------------------------------------
vendor="" lister="" visvar=""
for row in "${VENDORS[@]}"; do
  read -r v file fn var <<< "$row"
  if [[ -e $dev/$file ]]; then vendor=$v lister=$fn visvar=$var; break; fi
done
[[ -n $lister ]] && "$lister"
if [[ -n $vendor ]] && (( ${#gpu_bus[@]} == 0 )) && (( ${#host_problems[@]} == 0 )); then
  host_problems+=("$dev/$file exists but no $vendor GPU is visible")
fi
# On a node shared with other jobs, the scheduler names this job's GPUs: only those are checked
# and counted (another job's GPU is busy by right).
given=${visvar:+${!visvar-}}
mine() {  # mine INDEX: the GPU is this job's (all are, when the scheduler named none)
  [[ -z $given ]] && return 0
  [[ ",$given," == *",$1,"* || ( -n ${gpu_uuid[$1]} && ",$given," == *",${gpu_uuid[$1]},"* ) ]]
}
if [[ -n $given && ! $given =~ ^[0-9A-Za-z,-]+$ ]]; then
  notes+=("$visvar='$given' names no GPU list this check understands: every GPU checked")
  given=""
fi
count=0 bad=()
for (( i = 0; i < ${#gpu_bus[@]}; i++ )); do
  if ! mine "$i"; then
    echo "gpu_health: gpu $i ($vendor ${gpu_bus[i]}): not checked: another job's ($visvar=$given)"
    continue
  fi
  count=$((count + 1))
  problems=() held_by_mine=() explained=0 users=() detail=""
  if [[ ${gpu_ue[i]} == na ]]; then ecc="ECC/RAS error counts not reported"
  else
    ecc="${gpu_ue[i]} uncorrectable errors"
    detail=${gpu_ue_detail[i]:+ (${gpu_ue_detail[i]})}
    (( gpu_ue[i] > 0 )) && problems+=("${gpu_ue[i]} uncorrectable ECC/RAS errors$detail")
  fi
  [[ -n ${gpu_extra[i]} ]] && problems+=("${gpu_extra[i]}")
  for p in "${procs[@]}"; do
    read -r g pid mib <<< "$p"
    (( g == i )) || continue
    uid=$(owner_of "$pid")
    if [[ -z $uid ]]; then
      problems+=("pid $pid (not visible here: another container or user) holds $(gib "$mib") GiB")
      explained=$((explained + mib))
    elif [[ $uid != "$me" ]]; then
      problems+=("pid $pid of $(user_name "$uid") holds $(gib "$mib") GiB")
      explained=$((explained + mib))
    elif [[ -n ${JOB_ID:-} && $(job_of "$pid") == "$JOB_ID" ]]; then
      explained=$((explained + mib)) users+=("pid $pid of this job")
    else
      j=$(job_of "$pid")
      held_by_mine+=("pid $pid of yours${j:+ (job $j)}, $(gib "$mib") GiB")
    fi
  done
  used=${gpu_used[i]} total=${gpu_total[i]}
  if [[ $used =~ ^[0-9]+$ ]]; then
    mem="$(gib "$used")${total:+ of $(gib "$total")} GiB in use"
    held=$((used - explained))
    if (( held > HELD_MIB )); then
      if (( ${#held_by_mine[@]} )); then
        problems+=("$(gib "$held") GiB in use by no process of this job: $(joined '; ' "${held_by_mine[@]}")")
      else
        problems+=("$(gib "$held") GiB in use with no process on the GPU (not released by an earlier job?)")
      fi
    fi
  else
    mem="memory use not reported"
  fi
  line="gpu $i ($vendor ${gpu_bus[i]})"
  if (( ${#problems[@]} )); then
    bad+=("$i")
    printf 'gpu_health: %s: FAILED: %s\n' "$line" "$(joined '; ' "${problems[@]}")"
  else
    printf 'gpu_health: %s: ok: %s, %s, %s\n' "$line" "$ecc" "$mem" "${users[*]:-no process}"
  fi
done
want=${JOB_GPUS_PER_NODE:-}
if [[ $want =~ ^[0-9]+$ ]] && (( count < want )) && [[ ${host_problems[*]:-} != *"nvidia-smi failed"* ]]; then
  host_problems+=("$count GPU(s) visible, JOB_GPUS_PER_NODE=$want expected")
fi
for n in "${notes[@]}"; do printf 'gpu_health: %s: note: %s\n' "$host" "$n"; done
for p in "${host_problems[@]}"; do printf 'gpu_health: %s: FAILED: %s\n' "$host" "$p"; done

what="$count $vendor GPU(s)"
[[ -n $vendor ]] || what="no GPU (no $dev/kfd or $dev/nvidiactl)"
if (( ${#bad[@]} || ${#host_problems[@]} )); then
  why=()
  (( ${#bad[@]} )) && why+=("${#bad[@]} unhealthy (gpu ${bad[*]})")
  (( ${#host_problems[@]} )) && why+=("${host_problems[@]}")
  printf 'gpu_health: verdict %s: FAILED: %s, %s\n' "$host" "$what" "$(joined '; ' "${why[@]}")"
  exit 1
fi
printf 'gpu_health: verdict %s: ok: %s%s\n' "$host" "$what" "$( (( count )) && echo ", healthy")"
