#!/usr/bin/env bash
# Usage: host_metrics_plugin.sh [--help]
#
# Node health from /proc and /sys as Prometheus text on stdout:
#   NICs (/proc/net/dev), TCP (/proc/net/snmp, /proc/net/netstat), run queue, context switches, forks and
#   CPU time (/proc/stat), OOM kills and major faults (/proc/vmstat), memory (/proc/meminfo), pressure stall
#   information (/proc/pressure/*), load average, and InfiniBand/RoCE ports
#   (/sys/class/infiniband/*/ports/*/{counters,hw_counters}; which hw_counters files are retransmits,
#   errors, congestion or traffic is per driver in utils/launch/rdma_providers.tsv).
#   GPU error events of the kernel log ($METRICS_KMSG, default /dev/kmsg: NVIDIA Xid, amdgpu RAS and GPU
#   reset), counted once each (its state: $METRICS_STATE_DIR/kmsg).
# Run by metrics_exporter.py at every poll (contract: docs/plugins.md; metrics: docs/metrics.md).
# Environment: METRICS_PROCFS_ROOT (default /proc), METRICS_SYSFS_ROOT (default /sys), METRICS_KMSG
# (default /dev/kmsg), METRICS_STATE_DIR (none: count the whole kernel log, as when run by hand).
# All of /proc is read by one awk; the sysfs counters with bash builtins (no process per value).
# A missing or unreadable file only drops its own series. Exit 0, or 1 if the awk pass failed or
# the NIC table (rdma_providers.tsv, through utils/launch/netenv.sh) could not be read.
set -euo pipefail
export LC_ALL=C # numbers with a "." whatever the caller's locale

[[ ${1-} == -h || ${1-} == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../../launch/lib.sh"; usage; exit; }

proc=${METRICS_PROCFS_ROOT:-/proc}
sys=${METRICS_SYSFS_ROOT:-/sys}
status=0

# ---- /proc: one awk over every file that exists --------------------------------------------------
files=()
for f in net/dev net/snmp net/netstat stat vmstat meminfo loadavg pressure/cpu pressure/memory pressure/io; do
  if [[ -r $proc/$f ]]; then files+=("$proc/$f"); fi
done

if (( ${#files[@]} )); then
  awk -v root="$proc" '
    function esc(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\n/, "\\n", s); return s }
    function out(name, type, help, labels, value) {
      if (!(name in announced)) { announced[name] = 1; printf "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type }
      if (labels != "") printf "%s{%s} %s\n", name, labels, value; else printf "%s %s\n", name, value
    }
    # def(source key, metric, type, scale, help): key is "<file>:<field>"; scale "1" prints the raw string.
    function def(key, metric, type, scale, help) { n_def++; d_key[n_def] = key; d_metric[n_def] = metric
      d_type[n_def] = type; d_scale[n_def] = scale; d_help[n_def] = help }
    BEGIN {
      def("snmp:Ip:OutRequests", "hw_ip_out_requests_total", "counter", 1, "IPv4 packets the local protocols handed to IP to send (Ip OutRequests).")
      def("snmp:Ip:OutTransmits", "hw_ip_out_transmits_total", "counter", 1, "IPv4 packets IP passed on to the network devices, forwarded ones included (Ip OutTransmits, Linux 6.3+).")
      def("snmp:Tcp:RetransSegs", "hw_tcp_retransmits_total", "counter", 1, "TCP segments retransmitted (Tcp RetransSegs).")
      def("snmp:Tcp:InSegs", "hw_tcp_in_segments_total", "counter", 1, "TCP segments received (Tcp InSegs).")
      def("snmp:Tcp:OutSegs", "hw_tcp_out_segments_total", "counter", 1, "TCP segments sent (Tcp OutSegs).")
      def("snmp:Tcp:EstabResets", "hw_tcp_estab_resets_total", "counter", 1, "TCP connections reset from ESTABLISHED or CLOSE-WAIT (Tcp EstabResets).")
      def("snmp:Tcp:OutRsts", "hw_tcp_out_resets_total", "counter", 1, "TCP segments sent with RST (Tcp OutRsts).")
      def("snmp:Tcp:InErrs", "hw_tcp_in_errors_total", "counter", 1, "TCP segments received in error (Tcp InErrs).")
      def("snmp:Tcp:AttemptFails", "hw_tcp_attempt_fails_total", "counter", 1, "TCP connection attempts that failed (Tcp AttemptFails).")
      def("snmp:Tcp:CurrEstab", "hw_tcp_current_established", "gauge", 1, "TCP connections now ESTABLISHED or CLOSE-WAIT (Tcp CurrEstab).")
      def("netstat:TcpExt:TCPTimeouts", "hw_tcp_timeouts_total", "counter", 1, "TCP retransmission timeouts (TcpExt TCPTimeouts).")
      def("netstat:TcpExt:TCPSynRetrans", "hw_tcp_syn_retransmits_total", "counter", 1, "TCP SYN and SYN-ACK retransmissions (TcpExt TCPSynRetrans).")
      def("netstat:TcpExt:TCPFastRetrans", "hw_tcp_fast_retransmits_total", "counter", 1, "TCP fast retransmissions (TcpExt TCPFastRetrans).")
      def("netstat:TcpExt:TCPLostRetransmit", "hw_tcp_lost_retransmits_total", "counter", 1, "TCP retransmissions that were lost again (TcpExt TCPLostRetransmit).")
      def("netstat:TcpExt:TCPAbortOnTimeout", "hw_tcp_abort_on_timeout_total", "counter", 1, "TCP connections aborted after too many retransmission timeouts (TcpExt TCPAbortOnTimeout).")
      def("netstat:TcpExt:ListenOverflows", "hw_tcp_listen_overflows_total", "counter", 1, "Connections dropped because a listen queue was full (TcpExt ListenOverflows).")
      def("netstat:TcpExt:ListenDrops", "hw_tcp_listen_drops_total", "counter", 1, "Connections dropped by a listening socket for any reason (TcpExt ListenDrops).")
      def("stat:procs_running", "hw_procs_running", "gauge", 1, "Runnable tasks (run queue length, /proc/stat procs_running).")
      def("stat:procs_blocked", "hw_procs_blocked", "gauge", 1, "Tasks blocked on I/O (/proc/stat procs_blocked).")
      def("stat:ctxt", "hw_context_switches_total", "counter", 1, "Context switches (/proc/stat ctxt).")
      def("stat:processes", "hw_forks_total", "counter", 1, "Processes and threads created (/proc/stat processes).")
      def("vmstat:oom_kill", "hw_oom_kills_total", "counter", 1, "Processes killed by the OOM killer (/proc/vmstat oom_kill).")
      def("vmstat:pgmajfault", "hw_major_page_faults_total", "counter", 1, "Major page faults (/proc/vmstat pgmajfault).")
      def("meminfo:MemTotal", "hw_memory_total_bytes", "gauge", 1024, "Usable RAM (/proc/meminfo MemTotal).")
      def("meminfo:MemAvailable", "hw_memory_available_bytes", "gauge", 1024, "Memory available for new work without swapping (/proc/meminfo MemAvailable).")
      def("meminfo:Dirty", "hw_memory_dirty_bytes", "gauge", 1024, "Memory waiting to be written back to disk (/proc/meminfo Dirty).")
      def("meminfo:Writeback", "hw_memory_writeback_bytes", "gauge", 1024, "Memory being written back now (/proc/meminfo Writeback).")
      def("meminfo:Shmem", "hw_memory_shmem_bytes", "gauge", 1024, "Shared memory and tmpfs, /dev/shm included (/proc/meminfo Shmem).")
      def("loadavg:1", "hw_load1", "gauge", 1, "Load average over 1 minute (/proc/loadavg).")
      def("loadavg:2", "hw_load5", "gauge", 1, "Load average over 5 minutes (/proc/loadavg).")
      def("loadavg:3", "hw_load15", "gauge", 1, "Load average over 15 minutes (/proc/loadavg).")
      split("user nice system idle iowait irq softirq steal", cpu_mode, " ")
      n_nic = split("receive_bytes:1:Bytes_received receive_packets:2:Packets_received receive_errors:3:Receive_errors receive_drops:4:Received_packets_dropped transmit_bytes:9:Bytes_sent transmit_packets:10:Packets_sent transmit_errors:11:Transmit_errors transmit_drops:12:Outgoing_packets_dropped", nic_def, " ")
    }
    { file = substr(FILENAME, length(root) + 2) }
    file == "net/dev" {
      if (FNR <= 2) next
      i = index($0, ":"); if (i == 0) next
      dev = substr($0, 1, i - 1); gsub(/^[ \t]+/, "", dev)
      if (dev == "lo") next
      nf = split(substr($0, i + 1), v, " "); if (nf < 16) next
      n_dev++; devs[n_dev] = dev
      for (k = 1; k <= 16; k++) nic[dev, k] = v[k]
      next
    }
    file == "net/snmp" || file == "net/netstat" {
      short = (file == "net/snmp") ? "snmp" : "netstat"
      if (($1) in header) { for (k = 2; k <= NF; k++) kv[short ":" $1 hname[$1, k]] = $k; delete header[$1] }
      else { header[$1] = 1; for (k = 2; k <= NF; k++) hname[$1, k] = $k }
      next
    }
    file == "stat" {
      if ($1 == "cpu") { for (k = 1; k <= 8; k++) cpu[k] = $(k + 1); have_cpu = 1 }
      else if (NF == 2) kv["stat:" $1] = $2
      next
    }
    file == "vmstat" { kv["vmstat:" $1] = $2; next }
    file == "meminfo" { k = $1; sub(/:$/, "", k); kv["meminfo:" k] = $2; next }
    file == "loadavg" { kv["loadavg:1"] = $1; kv["loadavg:2"] = $2; kv["loadavg:3"] = $3; next }
    file ~ /^pressure\// {
      res = substr(file, 10)
      for (k = 2; k <= NF; k++) { split($k, p, "="); psi[res, $1, p[1]] = p[2] }
      psi_seen[res, $1] = 1
      next
    }
    END {
      for (m = 1; m <= n_nic; m++) {
        split(nic_def[m], nd, ":"); what = nd[3]; gsub(/_/, " ", what)
        for (j = 1; j <= n_dev; j++)
          out("hw_net_" nd[1] "_total", "counter", what " by the network interface (/proc/net/dev).",
              "device=\"" esc(devs[j]) "\"", nic[devs[j], nd[2]])
      }
      for (j = 1; j <= n_def; j++) {
        if (!(d_key[j] in kv)) continue
        val = kv[d_key[j]]
        if (d_scale[j] != 1) val = sprintf("%.0f", val * d_scale[j])
        out(d_metric[j], d_type[j], d_help[j], "", val)
      }
      if (have_cpu)
        for (k = 1; k <= 8; k++)
          out("hw_cpu_seconds_total", "counter", "CPU time of all CPUs by mode (/proc/stat cpu line, USER_HZ=100).",
              "mode=\"" cpu_mode[k] "\"", sprintf("%.2f", cpu[k] / 100))
      split("cpu memory io", resources, " "); split("some full", kinds, " ")
      for (r = 1; r <= 3; r++) for (q = 1; q <= 2; q++) {
        if (!((resources[r], kinds[q]) in psi_seen)) continue
        out("hw_" resources[r] "_pressure_" kinds[q] "_pct", "gauge",
            "Share of the last 10 s in which " kinds[q] " tasks stalled on " resources[r] " (/proc/pressure/" resources[r] " avg10).",
            "", psi[resources[r], kinds[q], "avg10"])
        out("hw_" resources[r] "_pressure_" kinds[q] "_seconds_total", "counter",
            "Time " kinds[q] " tasks stalled on " resources[r] " (/proc/pressure/" resources[r] " total).",
            "", sprintf("%.6f", psi[resources[r], kinds[q], "total"] / 1000000))
      }
    }
  ' "${files[@]}" || status=1
fi

# ---- /sys/class/infiniband: bash builtins only --------------------------------------------------
# read_num VAR FILE: VAR = first line of FILE when it is a non-negative integer; false otherwise.
read_num() {
  local -n _rn_dst=$1
  _rn_dst=
  { IFS= read -r _rn_dst || [[ -n $_rn_dst ]]; } 2>/dev/null < "$2" || return 1
  [[ $_rn_dst =~ ^[0-9]+$ ]]
}

declare -A HELP=(
  [hw_ib_port_transmit_bytes_total]="Data sent by the port (counters/port_xmit_data x 4)."
  [hw_ib_port_receive_bytes_total]="Data received by the port (counters/port_rcv_data x 4)."
  [hw_ib_port_transmit_packets_total]="Packets sent by the port (counters/port_xmit_packets)."
  [hw_ib_port_receive_packets_total]="Packets received by the port (counters/port_rcv_packets)."
  [hw_ib_port_transmit_wait_total]="Ticks the port had data to send but no flow-control credits (counters/port_xmit_wait)."
  [hw_ib_port_errors_total]="Link-level error counters of the port (counters/<counter>)."
  [hw_ib_port_transport_errors_total]="Transport errors and retransmission events of the port (hw_counters/<counter>)."
  [hw_ib_port_congestion_events_total]="RoCE congestion notifications of the port (hw_counters/<counter>)."
  [hw_ib_port_state]="Logical port state number (state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER)."
  [hw_ib_port_rate_gbps]="Negotiated link rate of the port in Gb/s (rate)."
)
ERRORS=(symbol_error link_error_recovery link_downed port_rcv_errors port_rcv_remote_physical_errors
  port_rcv_switch_relay_errors port_xmit_discards port_xmit_constraint_errors port_rcv_constraint_errors
  local_link_integrity_errors excessive_buffer_overrun_errors VL15_dropped)
TRAFFIC=(hw_ib_port_transmit_bytes_total hw_ib_port_receive_bytes_total hw_ib_port_transmit_packets_total
  hw_ib_port_receive_packets_total)
declare -A SAMPLES=()
ORDER=()
emit() { # emit METRIC LABELS VALUE
  if [[ ! -v SAMPLES[$1] ]]; then ORDER+=("$1"); SAMPLES[$1]=; fi
  if [[ -n $2 ]]; then SAMPLES[$1]+="$1{$2} $3"$'\n'; else SAMPLES[$1]+="$1 $3"$'\n'; fi
}
# hw_counters names per driver: utils/launch/rdma_providers.tsv, read by netenv.sh's netenv_counter_globs.
have_globs=0
if compgen -G "$sys/class/infiniband/*/ports/*/hw_counters" >/dev/null; then
  # shellcheck source=utils/launch/netenv.sh
  source "$(dirname "${BASH_SOURCE[0]}")/../../launch/netenv.sh" && netenv_counter_globs && have_globs=1 || status=1
fi
# port_driver VAR DEVICE_DIR: VAR = the table's PCI driver of the device's parent function, else "*".
port_driver() {
  local -n _pd=$1
  local k
  _pd='*'
  for k in "${!NE_GLOBS[@]}"; do
    [[ $k == */retransmit && $k != '*/retransmit' ]] || continue
    if [[ $2/device/driver -ef $sys/bus/pci/drivers/${k%/*} ]]; then _pd=${k%/*}; return 0; fi
  done
}
# matches NAME GLOBS: NAME matches one of the space-separated GLOBS.
matches() {
  local -a gl
  local g
  read -ra gl <<< "$2"
  for g in "${gl[@]}"; do
    # shellcheck disable=SC2053 # $g is a glob
    [[ $1 == $g ]] && return 0
  done
  return 1
}

for port_dir in "$sys"/class/infiniband/*/ports/*; do
  [[ -d $port_dir ]] || continue
  port=${port_dir##*/}
  dev=${port_dir%/ports/*}; dev=${dev##*/}
  labels="device=\"$dev\",port=\"$port\""
  c=$port_dir/counters
  if read_num v "$c/port_xmit_data"; then emit hw_ib_port_transmit_bytes_total "$labels" "$((v * 4))"; fi
  if read_num v "$c/port_rcv_data"; then emit hw_ib_port_receive_bytes_total "$labels" "$((v * 4))"; fi
  if read_num v "$c/port_xmit_packets"; then emit hw_ib_port_transmit_packets_total "$labels" "$v"; fi
  if read_num v "$c/port_rcv_packets"; then emit hw_ib_port_receive_packets_total "$labels" "$v"; fi
  if read_num v "$c/port_xmit_wait"; then emit hw_ib_port_transmit_wait_total "$labels" "$v"; fi
  for name in "${ERRORS[@]}"; do
    if read_num v "$c/$name"; then emit hw_ib_port_errors_total "$labels,counter=\"$name\"" "$v"; fi
  done
  if (( have_globs )) && [[ -d $port_dir/hw_counters ]]; then
    port_driver drv "${port_dir%/ports/*}"
    # traffic from hw_counters only where the port has no PMA counters (bnxt_re has both: count once)
    read -ra tn <<< "${NE_GLOBS[$drv/traffic]:-}"
    for i in 0 1 2 3; do
      [[ -n ${tn[i]:-} && ${tn[i]} != - && ! -e $c/port_xmit_data ]] || continue
      if read_num v "$port_dir/hw_counters/${tn[i]}"; then emit "${TRAFFIC[i]}" "$labels" "$v"; fi
    done
    for f in "$port_dir"/hw_counters/*; do
      name=${f##*/}
      if matches "$name" "${NE_GLOBS[$drv/retransmit]:-} ${NE_GLOBS[$drv/errors]:-}"; then
        metric=hw_ib_port_transport_errors_total
      elif matches "$name" "${NE_GLOBS[$drv/congestion]:-}"; then
        metric=hw_ib_port_congestion_events_total
      else
        continue
      fi
      if read_num v "$f"; then emit "$metric" "$labels,counter=\"$name\"" "$v"; fi
    done
  fi
  if { IFS= read -r v || [[ -n $v ]]; } 2>/dev/null < "$port_dir/state" && [[ ${v%%:*} =~ ^[0-9]+$ ]]; then
    emit hw_ib_port_state "$labels" "${v%%:*}"
  fi
  if { IFS= read -r v || [[ -n $v ]]; } 2>/dev/null < "$port_dir/rate" && [[ ${v%% *} =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
    emit hw_ib_port_rate_gbps "$labels" "${v%% *}"
  fi
done

# ---- the kernel log: GPU error events ----------------------------------------------------------
# /dev/kmsg records are "prio,seq,usec,flags;message" (continuation lines start with a space; kernel
# Documentation/ABI/testing/dev-kmsg). Counted: NVIDIA "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., ..."
# (code = the Xid number) and amdgpu "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!" (code gpu_reset) and
# "... N [new ]uncorrectable hardware errors detected in UMC block" (code ras_uncorrectable; not the
# "... detected in total in ..." line that repeats it). Incremental: the state file keeps the boot id, the
# last sequence number read and the counts, so no record is counted twice; the first poll of a job only
# takes the newest sequence number (what the log held before the exporter started is not counted). Run
# without a state dir (by hand) it counts the whole log. A kernel log this user may not read
# (kernel.dmesg_restrict) is tried once: the state remembers it, hw_gpu_kernel_log_readable says 0.
kmsg=${METRICS_KMSG:-/dev/kmsg}
kstate=
if [[ -n ${METRICS_STATE_DIR-} && -d ${METRICS_STATE_DIR-} ]]; then kstate=$METRICS_STATE_DIR/kmsg; fi
boot=
{ IFS= read -r boot; } 2>/dev/null < "$proc/sys/kernel/random/boot_id" || boot=
HELP[hw_gpu_kernel_log_readable]="1 when the kernel log ($kmsg) could be read for GPU error events, 0 when not."
HELP[hw_gpu_kernel_errors_total]="GPU error events in the kernel log since the exporter started (NVRM Xid, amdgpu RAS and GPU reset)."
# Reading the log costs one read(2) per record (a node's buffer holds thousands): it is read at most
# every METRICS_KMSG_EVERY seconds (default 30); the polls between give the counts the state holds.
kmsg_every=${METRICS_KMSG_EVERY:-30}
[[ $kmsg_every =~ ^[0-9]+$ ]] || kmsg_every=30
printf -v now '%(%s)T' -1
unreadable=0 read_at=0 counts=""
if [[ -n $kstate && -f $kstate ]]; then
  while read -r k a b c; do
    case $k in
      unreadable) unreadable=1 ;;
      read_at) if [[ $a =~ ^[0-9]+$ ]]; then read_at=$a; fi ;;
      count) counts+="$a $b $c"$'\n' ;;
    esac
  done < "$kstate" 2>/dev/null || true
fi
kfd=
unset records
if (( unreadable )); then
  emit hw_gpu_kernel_log_readable "" 0
elif [[ -n $kstate && -f $kstate ]] && (( now - read_at < kmsg_every )); then
  emit hw_gpu_kernel_log_readable "" 1  # not read this time: the counts of the state
elif ! { exec {kfd}<"$kmsg"; } 2>/dev/null; then
  emit hw_gpu_kernel_log_readable "" 0
  if [[ -n $kstate ]]; then echo unreadable > "$kstate"; fi
else
  emit hw_gpu_kernel_log_readable "" 1
  # dd returns at the end of the buffer (EAGAIN with nonblock): each read(2) gives one whole record
  records=$(dd bs=65536 iflag=nonblock status=none <&"$kfd" 2>/dev/null || true)
  exec {kfd}<&-
  read_at=$now
fi
if [[ -n ${records+set} ]]; then
  counts=$(awk -v boot="$boot" -v statef="$kstate" -v read_at="$read_at" '
    BEGIN {
      last = -1; fresh = 1
      if (statef != "" && (getline line < statef) > 0) {
        fresh = 0
        do {
          split(line, f, " ")
          if (f[1] == "boot") sboot = f[2]
          else if (f[1] == "seq") last = f[2] + 0
          else if (f[1] == "count") n[f[2] " " f[3]] += f[4]
        } while ((getline line < statef) > 0)
        close(statef)
        if (sboot != boot) last = -1  # a new boot numbers its records from 0 again
      }
      top = last
    }
    /^[0-9]+,[0-9]+,[0-9]+,[^;]*;/ {
      split($0, h, ","); seq = h[2] + 0
      if (seq > top) top = seq
      if (seq <= last || (fresh && statef != "")) next
      msg = substr($0, index($0, ";") + 1)
      if (match(msg, /NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): [0-9]+/)) {
        x = substr(msg, RSTART, RLENGTH); sub(/^NVRM: Xid \(PCI:/, "", x)
        pci = substr(x, 1, index(x, ")") - 1); code = substr(x, index(x, ": ") + 2)
        n[tolower(pci) " " code]++
      } else if (match(msg, /^amdgpu [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-7]: /)) {
        pci = tolower(substr(msg, 8, RLENGTH - 9))
        if (msg ~ /GPU reset begin!/) n[pci " gpu_reset"]++
        else if (msg ~ /uncorrectable hardware errors detected in / && msg !~ /detected in total in/) n[pci " ras_uncorrectable"]++
      }
    }
    END {
      for (k in n) print k, n[k]
      if (statef != "") {
        printf "boot %s\nseq %d\nread_at %s\n", boot, top, read_at > (statef ".new")
        for (k in n) printf "count %s %d\n", k, n[k] > (statef ".new")
        close(statef ".new")
      }
    }
  ' <<< "$records") || status=1
  if [[ -n $kstate && -f $kstate.new ]]; then mv -f "$kstate.new" "$kstate"; fi
fi
if (( ! unreadable )) && [[ -n $counts ]]; then
  # the gpu label: the GPU index as gpu_metrics_plugin.sh numbers it (NVIDIA: PCI order of the nvidia
  # driver's functions, as nvidia-smi does; AMD: amdgpu cards in /sys/class/drm/cardN order)
  declare -A GPU_OF=()
  i=0
  for d in "$sys"/bus/pci/drivers/nvidia/[0-9a-f]*:*; do
    [[ -e $d ]] || continue
    a=${d##*/}; GPU_OF[${a%.*}]=$i; i=$((i + 1))  # Xid names the function without ".0"
  done
  i=0
  for d in "$sys"/class/drm/card*; do
    v=
    { IFS= read -r v; } 2>/dev/null < "$d/device/vendor" || true
    if [[ ! ${d##*/} =~ ^card[0-9]+$ || $v != 0x1002 ]]; then continue; fi
    a=$(cd -P "$d/device" 2>/dev/null && pwd) || continue
    GPU_OF[${a##*/}]=$i; i=$((i + 1))
  done
  while read -r pci code v; do
    if [[ -z $v ]]; then continue; fi
    if [[ -v GPU_OF[$pci] ]]; then
      emit hw_gpu_kernel_errors_total "gpu=\"${GPU_OF[$pci]}\",code=\"$code\"" "$v"
    else
      emit hw_gpu_kernel_errors_total "code=\"$code\"" "$v"
    fi
  done <<< "$counts"
fi

for m in "${ORDER[@]}"; do
  type=counter
  [[ $m == *_total ]] || type=gauge
  printf '# HELP %s %s\n# TYPE %s %s\n%s' "$m" "${HELP[$m]}" "$m" "$type" "${SAMPLES[$m]}"
done
exit "$status"
