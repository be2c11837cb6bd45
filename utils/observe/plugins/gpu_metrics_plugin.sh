#!/usr/bin/env bash
# Usage: gpu_metrics_plugin.sh [--help]
#
# GPU health as Prometheus text on stdout, with the same metric names for AMD and
# NVIDIA (labels gpu=<index>, vendor=amd|nvidia):
#   AMD    amdgpu sysfs, /sys/class/drm/card<N>/device with vendor 0x1002: hwmon temperatures and power,
#          gpu_busy_percent, mem_busy_percent, VRAM, current sclk/mclk (pp_dpm_*), RAS error counts.
#   NVIDIA ONE `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` call per poll.
#   Both   PCIe AER error totals and link width/speed from the GPU's PCI device in sysfs, and
#          hw_gpu_info{gpu,vendor,model,driver} 1 per GPU: AMD model = marketing name of the PCI device
#          and revision ids in libdrm's amdgpu.ids, else the card's product_name file, else the device id;
#          driver = /sys/module/amdgpu/version, else the kernel release (in-tree driver). NVIDIA: the
#          same nvidia-smi call's name and driver_version.
# Run by metrics_exporter.py at every poll (contract: docs/plugins.md; metrics: docs/metrics.md).
# Environment: METRICS_SYSFS_ROOT (default /sys), METRICS_PROCFS_ROOT (default /proc),
#   NVIDIA_SMI (default nvidia-smi), METRICS_STATE_DIR (remembers the nvidia-smi field names that work),
#   METRICS_AMDGPU_IDS (libdrm's table; default the first of /opt/amdgpu/share/libdrm/amdgpu.ids, from
#   AMD's amdgpu packages, and /usr/share/libdrm/amdgpu.ids, Debian/Ubuntu libdrm-amdgpu1).
# Standalone: utils/observe/plugins/gpu_metrics_plugin.sh   (prints this node's series once)
# NVIDIA GPUs are looked for only when $METRICS_PROCFS_ROOT/driver/nvidia/gpus/ lists some.
# Exit 64 (never run again in this job) when the node has no GPU of either vendor; 1 when nvidia-smi fails.
set -euo pipefail
export LC_ALL=C # numbers with a "." whatever the caller's locale

[[ ${1-} == -h || ${1-} == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../../launch/lib.sh"; usage; exit; }

sys=${METRICS_SYSFS_ROOT:-/sys}
proc=${METRICS_PROCFS_ROOT:-/proc}
never_again=${METRICS_NEVER_AGAIN_EXIT:-64}
status=0

declare -A HELP=(
  [hw_gpu_temperature_celsius]="GPU temperature by sensor (AMD hwmon temp*_input; NVIDIA temperature.gpu/.memory)."
  [hw_gpu_power_watts]="GPU power draw (AMD hwmon power1_average or power1_input; NVIDIA power.draw)."
  [hw_gpu_power_limit_watts]="GPU power cap (AMD hwmon power1_cap; NVIDIA power.limit)."
  [hw_gpu_utilization_pct]="Share of time the GPU was busy (AMD gpu_busy_percent; NVIDIA utilization.gpu)."
  [hw_gpu_memory_utilization_pct]="Share of time GPU memory was busy (AMD mem_busy_percent; NVIDIA utilization.memory)."
  [hw_gpu_clock_mhz]="Current clock: type=core (AMD sclk, NVIDIA clocks.sm) or memory (AMD mclk, NVIDIA clocks.mem)."
  [hw_gpu_vram_used_bytes]="GPU memory in use (AMD mem_info_vram_used; NVIDIA memory.used)."
  [hw_gpu_vram_total_bytes]="GPU memory size (AMD mem_info_vram_total; NVIDIA memory.total)."
  [hw_gpu_ras_errors_total]="ECC/RAS errors by kind (ue uncorrectable, ce correctable, de deferred) and block."
  [hw_gpu_pcie_aer_errors_total]="PCIe AER errors of the GPU's PCI function by severity (aer_dev_*)."
  [hw_gpu_pcie_link_width]="Negotiated PCIe link width (lanes) of the GPU (current_link_width)."
  [hw_gpu_pcie_link_speed_gts]="Negotiated PCIe link speed in GT/s of the GPU (current_link_speed)."
  [hw_gpu_throttle_reasons]="Bitmask of active clock throttle reasons (NVIDIA clocks_throttle_reasons.active)."
  [hw_gpu_info]="Always 1: the GPU's model (marketing name) and driver version as labels."
)
declare -A SAMPLES=()
ORDER=()
emit() { # emit METRIC LABELS VALUE
  if [[ ! -v SAMPLES[$1] ]]; then ORDER+=("$1"); SAMPLES[$1]=; fi
  SAMPLES[$1]+="$1{$2} $3"$'\n'
}

# read_line VAR FILE: VAR = first line of FILE (false if it cannot be read or is empty).
read_line() {
  local -n _rl_dst=$1
  _rl_dst=
  { IFS= read -r _rl_dst || [[ -n $_rl_dst ]]; } 2>/dev/null < "$2"
}
is_num() { [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; }
# label VAR TEXT: TEXT as a Prometheus label value (backslash, double quote and newline escaped).
label() {
  local -n _lb_dst=$1
  _lb_dst=${2//\\/\\\\}
  _lb_dst=${_lb_dst//\"/\\\"}
  _lb_dst=${_lb_dst//$'\n'/\\n}
}
info() { # info LABELS MODEL DRIVER
  local m d
  label m "$2"
  label d "$3"
  emit hw_gpu_info "$1,model=\"$m\",driver=\"$d\"" 1
}
is_int() { [[ $1 =~ ^-?[0-9]+$ ]]; }
# scaled VAR INT DIGITS: VAR = INT / 10^DIGITS as an exact decimal string (no floating point).
scaled() {
  local -n _sc_dst=$1
  local _sc_v=$2 _sc_digits=$3 _sc_sign=""
  if [[ $_sc_v == -* ]]; then _sc_sign=-; _sc_v=${_sc_v#-}; fi
  while (( ${#_sc_v} <= _sc_digits )); do _sc_v=0$_sc_v; done
  local _sc_int=${_sc_v:0:${#_sc_v}-_sc_digits} _sc_frac=${_sc_v:${#_sc_v}-_sc_digits}
  while [[ $_sc_frac == *0 ]]; do _sc_frac=${_sc_frac%0}; done
  _sc_dst=$_sc_sign$_sc_int${_sc_frac:+.$_sc_frac}
}

# pci_health DEV LABELS: AER totals and link state of one PCI function (either vendor).
pci_health() {
  local dev=$1 labels=$2 sev key val v
  for sev in correctable nonfatal fatal; do
    [[ -r $dev/aer_dev_$sev ]] || continue
    while read -r key val; do
      if [[ $key == TOTAL_ERR_* ]] && is_int "$val"; then
        emit hw_gpu_pcie_aer_errors_total "$labels,severity=\"$sev\"" "$val"
      fi
    done 2>/dev/null < "$dev/aer_dev_$sev" || true
  done
  if read_line v "$dev/current_link_width" && is_int "$v"; then emit hw_gpu_pcie_link_width "$labels" "$v"; fi
  if read_line v "$dev/current_link_speed" && is_num "${v%% *}"; then
    emit hw_gpu_pcie_link_speed_gts "$labels" "${v%% *}"
  fi
}

# dpm_current VAR FILE: VAR = the MHz of the line marked '*' in an amdgpu pp_dpm_* table.
dpm_current() {
  local -n _dc_dst=$1
  local _dc_line
  _dc_dst=
  while IFS= read -r _dc_line; do
    if [[ $_dc_line == *'*'* && $_dc_line =~ ([0-9]+)[Mm][Hh][Zz] ]]; then
      _dc_dst=${BASH_REMATCH[1]}
      return 0
    fi
  done 2>/dev/null < "$2" || true
  return 1
}

# amd_model VAR DEVICE_DIR: the card's marketing name: its PCI device and revision ids looked up in libdrm's
# amdgpu.ids (lines "74A1,<tab>00,<tab>AMD Instinct MI300X"; the device id with another revision when the
# exact pair is missing), else the product_name file (the board's FRU), else "AMD device 0x74a1".
# Remembered per id pair in METRICS_STATE_DIR: the table is read once per exporter, not at every poll.
amd_model() {
  local -n _am_dst=$1
  local dev=$2 id rev d r name any="" cache=""
  _am_dst=
  read_line id "$dev/device" || id=""
  read_line rev "$dev/revision" || rev=""
  id=${id#0x} rev=${rev#0x}
  id=${id^^} rev=${rev^^}
  [[ -z ${METRICS_STATE_DIR:-} || -z $id ]] || cache=$METRICS_STATE_DIR/amdgpu_name_${id}_${rev:-none}
  if [[ -n $cache ]] && read_line _am_dst "$cache"; then return 0; fi
  if [[ -n $id && -n $ids_file ]]; then
    while IFS=, read -r d r name; do
      [[ ${d^^} == "$id" ]] || continue
      r=${r//[[:space:]]/} name=${name#"${name%%[![:space:]]*}"}
      if [[ ${r^^} == "$rev" ]]; then _am_dst=$name; break; fi
      [[ -n $any ]] || any=$name
    done 2>/dev/null < "$ids_file" || true
    [[ -n $_am_dst ]] || _am_dst=$any
  fi
  [[ -n $_am_dst ]] || read_line _am_dst "$dev/product_name" || true
  if [[ -z $_am_dst ]]; then
    _am_dst="AMD device ${id:+0x${id,,}}"
    return 0 # not remembered: a later table may know it
  fi
  if [[ -n $cache ]]; then printf '%s\n' "$_am_dst" > "$cache" 2>/dev/null || true; fi
}

amd_card() { # amd_card INDEX DEVICE_DIR
  local dev=$2 labels="gpu=\"$1\",vendor=\"amd\"" hw="" h t n label v w f block kind clk
  for h in "$dev"/hwmon/hwmon*; do
    if [[ -d $h ]]; then hw=$h; break; fi
  done
  if [[ -n $hw ]]; then
    for t in "$hw"/temp*_input; do
      n=${t##*/temp}; n=${n%_input}
      read_line label "$hw/temp${n}_label" || label="temp$n"
      if read_line v "$t" && is_int "$v"; then
        scaled v "$v" 3
        emit hw_gpu_temperature_celsius "$labels,sensor=\"$label\"" "$v"
      fi
    done
    for f in power1_average power1_input; do
      if read_line v "$hw/$f" && is_int "$v"; then
        scaled w "$v" 6
        emit hw_gpu_power_watts "$labels" "$w"
        break
      fi
    done
    if read_line v "$hw/power1_cap" && is_int "$v"; then
      scaled w "$v" 6
      emit hw_gpu_power_limit_watts "$labels" "$w"
    fi
  fi
  if read_line v "$dev/gpu_busy_percent" && is_int "$v"; then emit hw_gpu_utilization_pct "$labels" "$v"; fi
  if read_line v "$dev/mem_busy_percent" && is_int "$v"; then emit hw_gpu_memory_utilization_pct "$labels" "$v"; fi
  if dpm_current clk "$dev/pp_dpm_sclk"; then emit hw_gpu_clock_mhz "$labels,type=\"core\"" "$clk"; fi
  if dpm_current clk "$dev/pp_dpm_mclk"; then emit hw_gpu_clock_mhz "$labels,type=\"memory\"" "$clk"; fi
  if read_line v "$dev/mem_info_vram_used" && is_int "$v"; then emit hw_gpu_vram_used_bytes "$labels" "$v"; fi
  if read_line v "$dev/mem_info_vram_total" && is_int "$v"; then emit hw_gpu_vram_total_bytes "$labels" "$v"; fi
  for f in "$dev"/ras/*_err_count; do
    [[ -r $f ]] || continue
    block=${f##*/}; block=${block%_err_count}
    while read -r kind v; do
      kind=${kind%:}
      if [[ $kind == ue || $kind == ce || $kind == de ]] && is_int "$v"; then
        emit hw_gpu_ras_errors_total "$labels,kind=\"$kind\",block=\"$block\"" "$v"
      fi
    done 2>/dev/null < "$f" || true
  done
  pci_health "$dev" "$labels"
  amd_model v "$dev"
  info "$labels" "$v" "$amd_driver"
}

# ---- AMD: cards in card-number order; gpu = ordinal among the amdgpu cards ---------------------------
declare -a amd=()
for d in "$sys"/class/drm/card*; do
  n=${d##*/card}
  [[ $n =~ ^[0-9]+$ ]] || continue # skips connectors such as card0-DP-1
  if read_line v "$d/device/vendor" && [[ $v == 0x1002 ]]; then amd[n]=$d/device; fi
done
ids_file=${METRICS_AMDGPU_IDS-}
if [[ -z ${METRICS_AMDGPU_IDS+set} ]]; then
  for f in /opt/amdgpu/share/libdrm/amdgpu.ids /usr/share/libdrm/amdgpu.ids; do
    if [[ -r $f ]]; then ids_file=$f; break; fi
  done
fi
amd_driver=""
(( ${#amd[@]} == 0 )) || read_line amd_driver "$sys/module/amdgpu/version" ||
  read_line amd_driver "$proc/sys/kernel/osrelease" || true
i=0
for n in "${!amd[@]}"; do
  amd_card "$i" "${amd[n]}"
  i=$((i + 1))
done

# ---- NVIDIA: one nvidia-smi call ---------------------------------------------------------------------
nvidia=0
for d in "$proc"/driver/nvidia/gpus/*; do
  if [[ -e $d ]]; then nvidia=1; break; fi
done

nvidia_query() { # nvidia_query FIELDS: run nvidia-smi once; stdout+stderr in NV_OUT, its status returned
  local rc=0
  NV_OUT=$("${NVIDIA_SMI:-nvidia-smi}" --query-gpu="$1" --format=csv,noheader,nounits 2>&1) || rc=$?
  return "$rc"
}

if (( nvidia )); then
  base="index,pci.bus_id,temperature.gpu,temperature.memory,power.draw,power.limit,clocks.sm,clocks.mem"
  base+=",memory.used,memory.total,utilization.gpu,utilization.memory,%s"
  base+=",ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total,driver_version,name"
  state=${METRICS_STATE_DIR:-}
  throttle=clocks_throttle_reasons.active
  if [[ -n $state ]] && read_line v "$state/nvidia_throttle_field"; then throttle=$v; fi
  # shellcheck disable=SC2059 # base is our own format string
  printf -v fields "$base" "$throttle"
  NV_OUT=""
  if ! nvidia_query "$fields"; then
    if [[ $NV_OUT == *"is not a valid field"* ]]; then # drivers rename these fields (R535+ has both, R560+ ...)
      if [[ $throttle == clocks_throttle_reasons.active ]]; then throttle=clocks_event_reasons.active
      else throttle=clocks_throttle_reasons.active; fi
      # shellcheck disable=SC2059
      printf -v fields "$base" "$throttle"
      if nvidia_query "$fields" && [[ -n $state ]]; then
        printf '%s\n' "$throttle" > "$state/nvidia_throttle_field" || true
      fi
    fi
  fi
  if [[ $NV_OUT == *"is not a valid field"* || $NV_OUT == *"NVIDIA-SMI has failed"* ]] || ! is_int "${NV_OUT%%,*}"; then
    printf 'gpu_metrics_plugin: nvidia-smi failed: %s\n' "${NV_OUT:0:300}" >&2
    status=1
  else
    # name last: the one free-text field (read takes the rest of the line, commas included)
    while IFS=',' read -r idx bus t_gpu t_mem p_draw p_limit c_sm c_mem m_used m_total u_gpu u_mem thr e_unc e_cor drv name; do
      idx=${idx// /}
      is_int "$idx" || continue
      labels="gpu=\"$idx\",vendor=\"nvidia\""
      for var in bus t_gpu t_mem p_draw p_limit c_sm c_mem m_used m_total u_gpu u_mem thr e_unc e_cor; do
        printf -v "$var" '%s' "${!var// /}" # drop the blanks after each comma
      done
      if is_num "$t_gpu"; then emit hw_gpu_temperature_celsius "$labels,sensor=\"gpu\"" "$t_gpu"; fi
      if is_num "$t_mem"; then emit hw_gpu_temperature_celsius "$labels,sensor=\"mem\"" "$t_mem"; fi
      if is_num "$p_draw"; then emit hw_gpu_power_watts "$labels" "$p_draw"; fi
      if is_num "$p_limit"; then emit hw_gpu_power_limit_watts "$labels" "$p_limit"; fi
      if is_num "$u_gpu"; then emit hw_gpu_utilization_pct "$labels" "$u_gpu"; fi
      if is_num "$u_mem"; then emit hw_gpu_memory_utilization_pct "$labels" "$u_mem"; fi
      if is_num "$c_sm"; then emit hw_gpu_clock_mhz "$labels,type=\"core\"" "$c_sm"; fi
      if is_num "$c_mem"; then emit hw_gpu_clock_mhz "$labels,type=\"memory\"" "$c_mem"; fi
      if is_int "$m_used"; then emit hw_gpu_vram_used_bytes "$labels" "$((m_used * 1048576))"; fi
      if is_int "$m_total"; then emit hw_gpu_vram_total_bytes "$labels" "$((m_total * 1048576))"; fi
      if [[ $thr =~ ^0x[0-9a-fA-F]+$ ]]; then emit hw_gpu_throttle_reasons "$labels" "$((thr))"; fi
      if is_int "$e_unc"; then emit hw_gpu_ras_errors_total "$labels,kind=\"ue\",block=\"total\"" "$e_unc"; fi
      if is_int "$e_cor"; then emit hw_gpu_ras_errors_total "$labels,kind=\"ce\",block=\"total\"" "$e_cor"; fi
      name=${name#"${name%%[![:space:]]*}"}
      info "$labels" "${name%"${name##*[![:space:]]}"}" "${drv// /}"
      # sysfs names the PCI function 0000:18:00.0 where nvidia-smi says 00000000:18:00.0
      if [[ $bus =~ ^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$ ]]; then
        bus=${bus:4}
        pci_health "$sys/bus/pci/devices/${bus,,}" "$labels"
      fi
    done <<< "$NV_OUT"
  fi
fi

if (( ${#amd[@]} == 0 && nvidia == 0 )); then
  echo "gpu_metrics_plugin: no amdgpu card under $sys/class/drm and no NVIDIA GPU under $proc/driver/nvidia/gpus" >&2
  exit "$never_again"
fi

for m in "${ORDER[@]}"; do
  type=gauge
  [[ $m != *_total ]] || type=counter
  printf '# HELP %s %s\n# TYPE %s %s\n%s' "$m" "${HELP[$m]}" "$m" "$type" "${SAMPLES[$m]}"
done
exit "$status"
