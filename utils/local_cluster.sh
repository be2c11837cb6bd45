#!/usr/bin/env bash
# Usage: utils/local_cluster.sh up [NODES] [--netns] | down | status | env | --help
#
# A real multi-node Slurm cluster on this one machine: a munged, a slurmctld and NODES slurmd
# daemons (n1..nN, default 2, at most 16), each slurmd in its own UTS and mount namespace, so
# `hostname` in a job step on n2 prints n2 and n1..nN resolve (a private /etc/hosts view).
# Everything (munge key and socket, slurm.conf, state, spool, logs, pid files) lives in
# ${LOCAL_CLUSTER_DIR:-<repo>/.local_cluster} (at most 64 characters; munged wants its parents
# a+x). Nothing under /etc is changed; ports are free ones from 16817 up (not Slurm's defaults),
# picked under a lock of the user's (~/.cache/maxtext-slurm/local_cluster.ports.lock), so clusters
# that come up at the same moment take different ones. LOCAL_CLUSTER_FIRST_JOB_ID=N numbers the
# cluster's jobs from N (Slurm's FirstJobId; default 1): clusters side by side then give their jobs
# different ids, and the per-job ports the launcher derives from the id differ too.
#   up [NODES]  start it and wait until every node is idle; if it is already up with NODES
#               nodes just print the status (with another count: exit 1, run down first)
#   --netns     (root only) each node (slurmd and its jobs) also gets its own network namespace,
#               a veth on the cluster's own bridge with address 10.A.B.(10+I) (A.B from a hash of
#               the cluster dir; the bridge is 10.A.B.1), and its own cgroup v2 whose pressure
#               files are mounted over /proc/pressure/*, so a node's TCP counters and PSI are its
#               own; <dir>/run/netns lists "NODE VETH ADDRESS CGROUP" (utils/drill.sh reads it).
#               `down` kills what is left in the node cgroups and removes the namespaces and bridge.
#   down        cancel its jobs, stop the daemons it started (pid files); safe when not up
#   status      print the node states; exit 0 if up and every node is idle/alloc/mix/comp
#   env         print the settings for clients: eval "$(utils/local_cluster.sh env)"
# Needs Debian's slurmctld, slurmd, slurm-client and munge: `up` installs the missing ones as root
# (utils/setup_system.sh cluster); as another user it names them on one line and stops. Runs as
# root; as another user the daemons run as that user (needs unprivileged user namespaces for the
# per-node hostnames).
set -euo pipefail

PROG=local_cluster.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=utils/launch/lib.sh
source "$repo/utils/launch/lib.sh"
dir=$(realpath -m "${LOCAL_CLUSTER_DIR:-$repo/.local_cluster}")
conf=$dir/slurm.conf
export SLURM_CONF=$conf
PATH=$PATH:/usr/sbin:/sbin # munged, slurmctld, slurmd (not on a non-root user's PATH)
UP_TIMEOUT=30   # seconds for all nodes to become idle
STOP_TIMEOUT=20 # seconds for the daemons to exit after SIGTERM (then SIGKILL)

usage_error() {
  printf '%s: %s\n' "$PROG" "$*" >&2
  exit 2
}

# alive PID: the process exists and is not a zombie (an exited daemon stays a zombie until
# init reaps it, which some container inits do only every few seconds).
alive() {
  local state
  state=$(grep -m1 '^State:' "/proc/$1/status" 2>/dev/null) && [[ "$state" != *Z* ]]
}

# live_pid FILE NAME: print the pid in FILE if that process is alive and is program NAME.
live_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2" ]] && alive "$pid" || return 1
  printf '%s\n' "$pid"
}

# netns_plan: set tag, subnet (10.A.B), bridge and cg from a hash of the cluster dir; a subnet
# that a route of this machine (not our bridge) already covers moves on to the next B.
netns_plan() {
  local h try
  h=$(cksum <<<"$dir" | cut -d' ' -f1)
  tag=$(printf '%06x' $((h % 16777216)))
  bridge=mst$tag
  for ((try = 0; try < 16; try++)); do
    subnet=10.$(((h >> 8) % 256)).$(((h + try) % 256))
    ip -o route show to match "$subnet.1" | grep -v " dev $bridge " | grep -qv '^default' || break
  done
  ((try < 16)) || die "no free 10.x.y.0/24 subnet near $subnet for the --netns bridge"
  cg=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
  [[ -n "$cg" ]] || die "--netns needs a cgroup v2 mount (none in /proc/mounts)"
  cg=$cg/mst-$tag
}

# netns_down: kill what is left in the node cgroups (processes that left slurmd's tree, e.g. Ray's
# daemons), then remove the cgroups, veths, bridge and any namespace name left; silent when none.
netns_down() {
  local f veth cgdir end cmds=() ns
  f=$dir/run/netns
  [[ -s "$f" ]] || return 0
  while read -r _ veth _ cgdir; do
    [[ -d "$cgdir" ]] || continue
    if [[ -e "$cgdir/cgroup.kill" ]]; then
      echo 1 >"$cgdir/cgroup.kill" 2>/dev/null || true
    else
      xargs -r kill -KILL <"$cgdir/cgroup.procs" 2>/dev/null || true
    fi
  done <"$f"
  end=$((SECONDS + STOP_TIMEOUT))
  while read -r _ veth _ cgdir; do
    # cgroup.procs always has size 0: wait on cgroup.events' "populated 0" instead
    while grep -qx 'populated 1' "$cgdir/cgroup.events" 2>/dev/null && ((SECONDS < end)); do sleep 0.05; done
    rmdir "$cgdir" 2>/dev/null || true
    ns=mst-${veth#mst}
    ns=${ns%n*}-n${veth##*n}
    [[ ! -e "/run/netns/$ns" ]] || cmds+=("netns del $ns")
    # the host end: deleting it removes the pair even if something still pins the namespace
    [[ ! -e "/sys/class/net/$veth" ]] || cmds+=("link del $veth")
  done <"$f"
  read -r _ veth _ cgdir <"$f"
  [[ ! -e "/sys/class/net/${veth%n*}" ]] || cmds+=("link del ${veth%n*}") # the bridge: the veth name less nI
  ((${#cmds[@]} == 0)) || printf '%s\n' "${cmds[@]}" | ip -force -batch - 2>/dev/null || true
  rmdir "${cgdir%/*}" 2>/dev/null || true
  rm -f "$f"
}

# netns_up NODES: the bridge, one namespace + veth + cgroup per node, written to run/netns. The
# namespaces are named (/run/netns/mst-<tag>-nI) only until their slurmd runs in them (netns_unname).
netns_up() {
  local n=$1 i ns
  {
    # leftovers of a cluster that was not taken down
    [[ ! -e "/sys/class/net/$bridge" ]] || echo "link del $bridge"
    for ((i = 1; i <= n; i++)); do
      [[ ! -e "/sys/class/net/mst${tag}n$i" ]] || echo "link del mst${tag}n$i"
      [[ ! -e "/run/netns/mst-$tag-n$i" ]] || echo "netns del mst-$tag-n$i"
    done
  } | ip -force -batch - 2>/dev/null || true
  mkdir -p "$cg"
  {
    echo "link add $bridge type bridge"
    echo "addr add $subnet.1/24 dev $bridge"
    echo "link set $bridge up"
    for ((i = 1; i <= n; i++)); do
      ns=mst-$tag-n$i
      echo "netns add $ns"
      echo "link add mst${tag}n$i type veth peer name eth0 netns $ns"
      echo "link set mst${tag}n$i master $bridge up"
    done
  } | ip -batch - || die "could not set up the --netns bridge $bridge (ip -batch failed)"
  : >"$dir/run/netns"
  for ((i = 1; i <= n; i++)); do
    ns=mst-$tag-n$i
    printf '%s\n' "addr add $subnet.$((10 + i))/24 dev eth0" "link set eth0 up" "link set lo up" |
      ip -n "$ns" -batch - || die "could not configure node n$i's namespace $ns"
    mkdir -p "$cg/n$i"
    echo "n$i mst${tag}n$i $subnet.$((10 + i)) $cg/n$i" >>"$dir/run/netns"
  done
}

# netns_unname NODES: drop the namespaces' names once each slurmd holds its own. A name is a bind
# mount that every mount namespace made meanwhile (another cluster's nodes, a container) copies
# and keeps, pinning the namespace and its veth long after `down`.
netns_unname() {
  local i
  for ((i = 1; i <= $1; i++)); do echo "netns del mst-$tag-n$i"; done | ip -force -batch - 2>/dev/null || true
}

ctld_up() { live_pid "$dir/run/slurmctld.pid" slurmctld >/dev/null; }

# Ports are free when picked and taken when the daemons bind them: clusters that come up at the
# same moment pick under one lock of the user's, held until their nodes answer.
take_ports_lock() {
  local d=${XDG_CACHE_HOME:-$HOME/.cache}/maxtext-slurm
  mkdir -p "$d"
  exec 8>>"$d/local_cluster.ports.lock"
  flock -w 120 8 || die "another cluster's up held $d/local_cluster.ports.lock for 120 s"
}

# Serialise up/down between concurrent callers (test sessions sharing one cluster).
take_lock() {
  exec 9>>"$dir/lock"
  flock -w 120 9 || die "another up/down on $dir did not finish in 120 s"
}

# stop_pids PID...: SIGTERM, wait up to STOP_TIMEOUT s for them to exit, then SIGKILL.
stop_pids() {
  local end=$((SECONDS + STOP_TIMEOUT)) pid left=("$@")
  ((${#left[@]})) || return 0
  kill -TERM "${left[@]}" 2>/dev/null || true
  while ((${#left[@]})) && ((SECONDS < end)); do
    sleep 0.1
    for pid in "${!left[@]}"; do alive "${left[pid]}" || unset 'left[pid]'; done
  done
  ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2>/dev/null || true
}

stop_all() {
  local f pid slurm=() munge=() jobs end
  if ctld_up; then
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n "$jobs" ]]; then
      # shellcheck disable=SC2086 # one job id per word
      scancel $jobs 2>/dev/null || true
      end=$((SECONDS + STOP_TIMEOUT))
      while [[ -n "$(squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS < end)); do sleep 0.2; done
    fi
  fi
  for f in "$dir"/run/slurmd-*.pid; do
    pid=$(live_pid "$f" slurmd) && slurm+=("$pid")
  done
  pid=$(live_pid "$dir/run/slurmctld.pid" slurmctld) && slurm+=("$pid")
  stop_pids "${slurm[@]}"
  pid=$(live_pid "$dir/run/munged.pid" munged) && munge+=("$pid")
  stop_pids "${munge[@]}"
  netns_down
  rm -f "$dir"/run/*.pid "$dir/run/nodes"
}

status() {
  local lines bad
  if ! ctld_up; then
    echo "local cluster: down ($dir)"
    return 1
  fi
  lines=$(sinfo -h -N -o '%N %t' 2>&1) || { echo "local cluster: slurmctld not answering: $lines"; return 1; }
  echo "local cluster: up, $(wc -l <<<"$lines") nodes, SLURM_CONF=$conf"
  echo "$lines"
  bad=$(awk '$2 !~ /^(idle|alloc|mix|comp)$/' <<<"$lines")
  [[ -z "$bad" ]]
}

write_conf() { # NODES
  local n=$1 i port ctld=127.0.0.1 addr=127.0.0.1
  ((!netns)) || ctld=$subnet.1
  port=$(free_port 16817) || die "no free port from 16817 for slurmctld"
  {
    cat <<EOF
# Written by utils/local_cluster.sh up $n; rewritten on every fresh up.
ClusterName=local
SlurmctldHost=$(hostname -s)($ctld)
SlurmctldPort=$port
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=10
MessageTimeout=5
InactiveLimit=0
EOF
    [[ -z "${LOCAL_CLUSTER_FIRST_JOB_ID:-}" ]] || echo "FirstJobId=$LOCAL_CLUSTER_FIRST_JOB_ID"
    for ((i = 1; i <= n; i++)); do
      port=$(free_port $((port + 1))) || die "no free port for slurmd n$i"
      ((!netns)) || addr=$subnet.$((10 + i))
      echo "NodeName=n$i NodeAddr=$addr Port=$port CPUs=2 RealMemory=4000 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP"
  } >"$conf"
}

# fail MSG LOG: stop what was started, keep the logs, one line on stderr (with LOG's last line).
fail() {
  stop_all
  die "$1 ($(tail -n 1 "$2" 2>/dev/null)); see $2 (cluster stopped)"
}

up() {
  local n=$1 have i end log states
  mkdir -p "$dir"
  take_lock
  if ctld_up; then
    have=$(cat "$dir/run/nodes" 2>/dev/null || echo unknown)
    [[ "$have" == "$n" ]] || die "already up with $have nodes, not $n: run '$0 down' first"
    local had=0
    [[ ! -s "$dir/run/netns" ]] || had=1
    ((had == netns)) || die "already up $( ((had)) && echo with || echo without) --netns: run '$0 down' first"
    status
    return
  fi
  stop_all # leftovers of a half-dead cluster
  rm -rf "$dir/state" "$dir/spool" "$dir/run" "$dir/log"
  mkdir -p "$dir/state" "$dir/spool" "$dir/run" "$dir/log" "$dir/munge"
  chmod 0755 "$dir/munge" # munged rejects a group/other-writable socket dir; clients need a+x
  if [[ ! -s "$dir/munge/munge.key" ]]; then
    (umask 077 && head -c 1024 /dev/urandom >"$dir/munge/munge.key")
  fi
  ((!netns)) || netns_up "$n"
  take_ports_lock
  write_conf "$n"
  echo "$n" >"$dir/run/nodes"

  munged --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --seed-file="$dir/munge/munged.seed" \
    --log-file="$dir/log/munged.log" 8>&- 9>&- 2>>"$dir/log/munged.log" ||
    fail "munged did not start" "$dir/log/munged.log"
  slurmctld -f "$conf" 8>&- 9>&- 2>>"$dir/log/slurmctld.log" ||
    fail "slurmctld did not start" "$dir/log/slurmctld.log"
  # Each node: own hostname (UTS namespace) and, in a private mount namespace, its own view of
  # /etc/hosts that also resolves n1..nN (JAX and friends connect to "n1"); the host's is untouched.
  {
    cat /etc/hosts
    if ((netns)); then
      for ((i = 1; i <= n; i++)); do echo "$subnet.$((10 + i)) n$i"; done
    else
      printf '127.0.0.1'
      printf ' n%s' $(seq "$n")
      echo
    fi
  } >"$dir/hosts"
  local ns=(--uts --mount) pre=()
  (($(id -u) == 0)) || ns=(--user --map-current-user --keep-caps --uts --mount)
  for ((i = 1; i <= n; i++)); do
    log=$dir/log/slurmd-n$i.log
    # --netns: enter the node's network namespace, join its cgroup (so its jobs do too) and mount
    # that cgroup's pressure files over /proc/pressure/* in the node's own mount namespace
    ((!netns)) || pre=(nsenter "--net=/run/netns/mst-$tag-n$i")
    # shellcheck disable=SC2016 # $1.. expand in the inner sh
    "${pre[@]}" unshare "${ns[@]}" sh -c 'hostname "$1" && mount --bind "$3" /etc/hosts || exit 1
      if [ -n "$4" ]; then
        echo $$ >"$4/cgroup.procs" || exit 1
        for r in cpu io memory; do mount --bind "$4/$r.pressure" "/proc/pressure/$r" || exit 1; done
      fi
      exec slurmd -f "$2" -N "$1"' \
      sh "n$i" "$conf" "$dir/hosts" "$( ((!netns)) || echo "$cg/n$i")" 8>&- 9>&- 2>>"$log" ||
      fail "slurmd n$i did not start" "$log"
  done
  ((!netns)) || netns_unname "$n"

  end=$((SECONDS + UP_TIMEOUT))
  while :; do
    states=$(sinfo -h -N -o %t 2>/dev/null || true)
    [[ "$(grep -cx idle <<<"$states")" == "$n" ]] && break
    if ((SECONDS >= end)); then
      log=$dir/log/slurmctld.log
      for ((i = n; i >= 1; i--)); do # point at the first dead slurmd, if any
        live_pid "$dir/run/slurmd-n$i.pid" slurmd >/dev/null || log=$dir/log/slurmd-n$i.log
      done
      ctld_up || log=$dir/log/slurmctld.log
      fail "nodes not idle after ${UP_TIMEOUT} s (states: ${states//$'\n'/ })" "$log"
    fi
    sleep 0.1
  done
  exec 8>&-
  status
}

case "${1:-}" in
  -h | --help | help) usage ;;
  up)
    shift
    netns=0
    args=()
    for a in "$@"; do
      if [[ "$a" == --netns ]]; then netns=1; else args+=("$a"); fi
    done
    ((${#args[@]} <= 1)) || usage_error "up takes at most NODES and --netns (got '${args[*]}')"
    n=${args[0]:-2}
    if [[ ! "$n" =~ ^[1-9][0-9]?$ ]] || ((n > 16)); then
      usage_error "NODES must be an integer from 1 to 16, got '$n'"
    fi
    first=${LOCAL_CLUSTER_FIRST_JOB_ID:-}
    [[ -z "$first" || "$first" =~ ^[1-9][0-9]{0,6}$ ]] ||
      usage_error "LOCAL_CLUSTER_FIRST_JOB_ID must be a job id from 1 to 9999999, got '$first'"
    [[ "$dir" != *[[:space:]]* ]] || usage_error "LOCAL_CLUSTER_DIR must not contain spaces, got '$dir'"
    # Unix socket paths (munge, slurmstepd) under it must fit in 108 bytes.
    ((${#dir} <= 64)) || usage_error "LOCAL_CLUSTER_DIR must be at most 64 characters, got ${#dir}: '$dir'"
    if ((netns)); then
      (($(id -u) == 0)) || usage_error "--netns needs root (network namespaces, a bridge, cgroups)"
      command -v ip >/dev/null || usage_error "--netns needs ip (iproute2): utils/setup_system.sh tests"
      netns_plan
    fi
    "$repo/utils/setup_system.sh" cluster || exit 1 # it said what is missing and how to install it
    up "$n"
    ;;
  down | status | env)
    (($# == 1)) || usage_error "$1 takes no arguments (got '${*:2}')"
    case "$1" in
      down)
        if [[ -d "$dir" ]]; then
          take_lock
          stop_all
        fi
        echo "local cluster: down ($dir)"
        ;;
      status) status ;;
      env) printf 'export SLURM_CONF=%q\n' "$conf" ;;
    esac
    ;;
  "") usage_error "missing subcommand: expected up [NODES] [--netns], down, status, env or --help" ;;
  *) usage_error "unknown subcommand '$1': expected up [NODES] [--netns], down, status, env or --help" ;;
esac
