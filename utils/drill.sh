#!/usr/bin/env bash
# Usage: utils/drill.sh FAULT [OPTIONS] [--node NODE] [--job ID] | clear | --help
#
# Inject a fault on one node of the local cluster (utils/local_cluster.sh up N --netns), to rehearse
# an incident and see what utils/triage.py and utils/diagnose.py say about it. NODE defaults to n2;
# the cluster is ${LOCAL_CLUSTER_DIR:-<repo>/.local_cluster}. Needs root (like --netns).
#   net --loss PCT [--inside]
#                    drop PCT % (0.1 .. 100) of the packets NODE sends (a bad NIC or cable): an
#                    nftables rule on NODE's port of the cluster's bridge (numgen random); TCP
#                    retransmits on NODE, its peers' counters stay near zero. --inside: drop them in
#                    NODE's own network namespace instead (an output rule on its eth0, like a driver
#                    that drops on transmit): NODE's kernel sees the drops, both ends of each
#                    connection retransmit on timeouts
#   net --delay MS   delay NODE's packets with tc netem (refused when the kernel has no sch_netem)
#   io [--seconds S] heavy IO on the workspace (JOB_WORKSPACE or --dir DIR) from NODE's cgroup:
#                    8 writers with direct IO for S seconds (default 60), throttled together to
#                    8 MB/s (a cgroup v1 blkio limit on the disk under DIR: a slow disk, so the
#                    stall shows however fast the real one is); IO pressure on NODE. A DIR in
#                    memory (tmpfs, ramfs) is refused: writes there never wait on a disk
#   oom              NODE's trainer into a memory cgroup (v1) limited to 256 MiB plus a memory hog:
#                    the kernel OOM-kills the trainer
#   freeze | thaw | kill   SIGSTOP / SIGCONT / SIGKILL to NODE's trainer
#   clear            undo every fault on this cluster: rules, delay, IO writers, memory and blkio cgroups
#                    (a frozen trainer is thawed); another cluster's drills are left alone
#   --job ID         the trainer of job ID (default: the only trainer on NODE)
# A fault stays until `clear` (io ends by itself after S seconds). Exit 1: the cluster or the
# trainer is not there, or the kernel cannot do it; exit 2: bad arguments.
set -euo pipefail

PROG=drill.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=utils/launch/lib.sh
source "$repo/utils/launch/lib.sh"
dir=$(realpath -m "${LOCAL_CLUSTER_DIR:-$repo/.local_cluster}")
PATH=$PATH:/usr/sbin:/sbin
TRAINER=maxtext.trainers.pre_train.train

bad_args() {
  printf '%s: %s\n' "$PROG" "$*" >&2
  exit 2
}

fault=${1:-}
[[ -n "$fault" ]] || bad_args "missing FAULT: expected net, io, oom, freeze, thaw, kill, clear or --help"
shift
case "$fault" in
  -h | --help | help) usage; exit 0 ;;
  net | io | oom | freeze | thaw | kill | clear) ;;
  *) bad_args "unknown FAULT '$fault': expected net, io, oom, freeze, thaw, kill, clear or --help" ;;
esac

node=n2 job="" loss="" delay="" seconds=60 wdir=${JOB_WORKSPACE:-} inside=0
need_value() { if (($# < 2)) || [[ -z "$2" ]]; then bad_args "$1 needs a value"; fi; }
while (($#)); do
  case "$1" in
    --node) need_value "$@"; node=$2; shift ;;
    --job) need_value "$@"; job=$2; shift ;;
    --loss) need_value "$@"; loss=$2; shift ;;
    --delay) need_value "$@"; delay=$2; shift ;;
    --seconds) need_value "$@"; seconds=$2; shift ;;
    --inside) inside=1 ;;
    --dir) need_value "$@"; wdir=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) bad_args "unknown argument '$1' for $fault (see --help)" ;;
  esac
  shift
done
[[ "$node" =~ ^n([1-9]|1[0-6])$ ]] || bad_args "--node must be n1 .. n16, got '$node'"
[[ -z "$job" || "$job" =~ ^[0-9]+$ ]] || bad_args "--job must be a job id (digits), got '$job'"
if [[ "$fault" == net ]]; then
  [[ -n "$loss" || -n "$delay" ]] || bad_args "net needs --loss PCT or --delay MS"
  [[ -z "$loss" || -z "$delay" ]] || bad_args "net takes one of --loss and --delay, not both"
  if [[ -n "$loss" ]]; then
    [[ "$loss" =~ ^(100|[0-9]{1,2}(\.[0-9])?)$ && ! "$loss" =~ ^0(\.0)?$ ]] ||
      bad_args "--loss must be a percentage from 0.1 to 100 (one decimal at most), got '$loss'"
  fi
  [[ -z "$delay" || "$delay" =~ ^[1-9][0-9]{0,4}$ ]] || bad_args "--delay must be milliseconds (1 .. 99999), got '$delay'"
  ((!inside)) || [[ -n "$loss" ]] || bad_args "--inside goes with --loss (a delay is made on the bridge port only)"
else
  [[ -z "$loss$delay" ]] || bad_args "--loss and --delay are options of net only"
  ((!inside)) || bad_args "--inside is an option of net --loss only"
fi
[[ "$fault" == io || ( "$seconds" == 60 && "$wdir" == "${JOB_WORKSPACE:-}" ) ]] ||
  bad_args "--seconds and --dir are options of io only"
[[ "$seconds" =~ ^[1-9][0-9]{0,4}$ ]] || bad_args "--seconds must be a whole number of seconds (1 .. 99999), got '$seconds'"

(($(id -u) == 0)) || die "needs root (nftables, cgroups, other users' processes)"
# The node table utils/local_cluster.sh up --netns writes: NODE VETH ADDRESS CGROUP.
nodes=$dir/run/netns
state=$dir/run/drill
if [[ "$fault" != clear ]]; then
  [[ -s "$nodes" ]] || die "no local cluster started with --netns in $dir (utils/local_cluster.sh up N --netns)"
  read -r _ veth _ cg < <(awk -v n="$node" '$1 == n' "$nodes") || true
  [[ -n "${cg:-}" ]] || die "the cluster in $dir has no node $node ($(cut -d' ' -f1 "$nodes" | tr '\n' ' '))"
fi
[[ ! -d "$dir/run" ]] || mkdir -p "$state"
tag=$(awk 'NR == 1 { sub(/^mst/, "", $2); sub(/n[0-9]+$/, "", $2); print $2 }' "$nodes" 2>/dev/null || true)
table=mst_drill_${tag:-none}

# trainer: the pid of the node's trainer (of --job), from the node's cgroup; exactly one.
trainer() {
  local pid found=()
  while read -r pid; do
    [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *"$TRAINER"* ]] || continue
    [[ -z "$job" ]] || tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "JOB_ID=$job" || continue
    found+=("$pid")
  done <"$cg/cgroup.procs"
  ((${#found[@]})) || die "no trainer running on $node${job:+ for job $job}"
  ((${#found[@]} == 1)) || die "several trainers on $node (pids ${found[*]}): pick one with --job ID"
  echo "${found[0]}"
}

# v1cg CONTROLLER FAULT: this process's cgroup v1 directory of CONTROLLER (memory, blkio), where
# the drill's limited cgroup goes.
v1cg() {
  local rel
  rel=$(awk -F: -v c="$1" '$2 == c { print $3 }' /proc/self/cgroup)
  [[ -n "$rel" && -d "/sys/fs/cgroup/$1$rel" ]] ||
    die "$2 needs the cgroup v1 $1 controller (no $1 line in /proc/self/cgroup)"
  echo "/sys/fs/cgroup/$1${rel%/}"
}

# disk_of DIR: MAJ:MIN of the whole disk under DIR's file system (blkio limits take disks, not
# partitions); dies for a file system with no block device under it.
disk_of() {
  local dev
  dev=$(findmnt -n -o MAJ:MIN -T "$1" | tr -d ' ')
  [[ -e "/sys/dev/block/$dev" ]] ||
    die "io: '$1' is on a file system with no block device under it ($(stat -f -c %T "$1"), dev $dev): pass --dir DIR on a disk"
  if [[ -e "/sys/dev/block/$dev/partition" ]]; then
    dev=$(cat "$(realpath "/sys/dev/block/$dev")/../dev")
  fi
  echo "$dev"
}

# in_node CGROUP CMD...: CMD in the network namespace of the node whose cgroup is CGROUP (that of
# its slurmd, the first process there; the namespaces lose their names once slurmd runs in them).
in_node() {
  local pid
  pid=$(head -n 1 "$1/cgroup.procs" 2>/dev/null) || true
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  shift
  nsenter "--net=/proc/$pid/ns/net" "$@"
}

clear_all() {
  local f pid d c
  if [[ -n "$tag" ]] && command -v nft >/dev/null && nft list table bridge "$table" >/dev/null 2>&1; then
    nft delete table bridge "$table"
  fi
  [[ ! -s "$nodes" ]] || while read -r _ veth _ c; do
    tc qdisc del dev "$veth" root 2>/dev/null || true
    if [[ -n "$tag" ]] && in_node "$c" nft list table inet "$table" >/dev/null 2>&1; then
      in_node "$c" nft delete table inet "$table" || true
    fi
  done <"$nodes"
  for f in "$state"/io-*.pid; do
    [[ -e "$f" ]] || continue
    pid=$(cat "$f")
    if [[ "$pid" =~ ^[0-9]+$ ]]; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
    rm -f "$f"
  done
  for f in "$state"/frozen-*; do
    [[ -e "$f" ]] || continue
    kill -CONT "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  for d in /sys/fs/cgroup/{memory,blkio}{,/*,/*/*}/mst-drill-"$tag"-*; do
    [[ -d "$d" ]] || continue
    while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$d/cgroup.procs"
    rmdir "$d" 2>/dev/null || true
  done
  echo "drill: cleared ($dir)"
}

case "$fault" in
  clear) clear_all ;;
  net)
    [[ -e "/sys/class/net/$veth" ]] || die "$node's port $veth is gone: is the cluster in $dir still up?"
    if [[ -n "$delay" ]]; then
      tc qdisc add dev "$veth" root netem delay "${delay}ms" 2>/dev/null ||
        die "--delay needs tc netem, which this kernel lacks (no sch_netem module); use --loss"
      echo "drill: $node: every packet from the bridge to $node delayed by $delay ms ($veth netem); undo: $0 clear"
      exit 0
    fi
    command -v nft >/dev/null || die "net --loss needs nft (nftables): utils/setup_system.sh tests"
    per_mille=$(awk -v p="$loss" 'BEGIN { printf "%d", p * 10 + 0.5 }')
    drop="numgen random mod 1000 < $per_mille counter drop"
    if ((inside)); then
      in_node "$cg" nft -f - <<EOF || die "nft could not add the loss rule inside $node's network namespace"
table inet $table {
  chain output { type filter hook output priority 0; oifname "eth0" $drop; }
}
EOF
      echo "drill: $node: dropping $loss % of the packets it sends, inside its namespace (nft table inet $table, output on eth0); undo: $0 clear"
      exit 0
    fi
    nft -f - <<EOF || die "nft could not add the loss rule on $veth"
table bridge $table {
  chain forward { type filter hook forward priority 0; iifname "$veth" $drop; }
  chain input { type filter hook input priority 0; iifname "$veth" $drop; }
}
EOF
    echo "drill: $node: dropping $loss % of the packets it sends (nft table bridge $table on $veth); undo: $0 clear"
    ;;
  io)
    [[ -n "$wdir" ]] || bad_args "io needs the workspace: set JOB_WORKSPACE or pass --dir DIR"
    [[ -d "$wdir" && -w "$wdir" ]] || die "io: '$wdir' is not a writable directory"
    case "$(stat -f -c %T "$wdir")" in
      tmpfs | ramfs) die "io: '$wdir' is in memory ($(stat -f -c %T "$wdir")): writes there never wait on a disk; pass --dir DIR on a disk" ;;
    esac
    disk=$(disk_of "$wdir")
    bcg=$(v1cg blkio io)/mst-drill-$tag-$node-io
    mkdir -p "$bcg"
    echo "$disk $((8 << 20))" >"$bcg/blkio.throttle.write_bps_device" ||
      die "io: the kernel refused a blkio write limit on disk $disk"
    io_dir=$(mktemp -d "$wdir/.drill-io.XXXXXX")
    # 8 writers in NODE's cgroup (its PSI) and in the throttled blkio cgroup, each rewriting 2 MiB
    # with direct IO (past the page cache; with fsync where the file system refuses O_DIRECT) until
    # S seconds are up; setsid: one process group that `clear` stops.
    # shellcheck disable=SC2016 # expanded by the inner sh
    setsid sh -c 'echo $$ >"$1/cgroup.procs" && echo $$ >"$4/cgroup.procs" || exit 1
      end=$(($(date +%s) + $3))
      flag=oflag=direct
      dd if=/dev/zero of="$2/probe" bs=1M count=1 $flag status=none 2>/dev/null || flag=conv=fsync
      for w in 1 2 3 4 5 6 7 8; do
        (while [ "$(date +%s)" -lt "$end" ]; do
          dd if=/dev/zero of="$2/w$w" bs=1M count=2 $flag status=none 2>/dev/null || break
        done) &
      done
      wait
      rm -rf "$2"' sh "$cg" "$io_dir" "$seconds" "$bcg" </dev/null >/dev/null 2>&1 &
    echo $! >"$state/io-$node.pid"
    echo "drill: $node: heavy IO on $wdir for $seconds s (8 direct-IO writers at 8 MB/s on disk $disk, pid $!); stop early: $0 clear"
    ;;
  oom)
    pid=$(trainer)
    d=$(v1cg memory oom)/mst-drill-$tag-$node
    mkdir -p "$d"
    echo $((256 << 20)) >"$d/memory.limit_in_bytes"
    echo "$pid" >"$d/cgroup.procs" || die "could not move the trainer (pid $pid) into $d"
    echo 1000 >"/proc/$pid/oom_score_adj" 2>/dev/null || true # the trainer is the one to go
    # the hog: in the same cgroup, writes 320 MiB of memory, past the limit: the kernel kills the
    # trainer first (oom_score_adj 1000), then the hog itself if it is still over the limit
    # shellcheck disable=SC2016 # expanded by the inner sh
    setsid sh -c 'echo $$ >"$1/cgroup.procs" &&
      exec python3 -c "import time; b = [bytearray(1 << 20) for _ in range(320)]; time.sleep(120)"' \
      sh "$d" </dev/null >/dev/null 2>&1 &
    echo "drill: $node: trainer (pid $pid) limited to 256 MiB with a memory hog beside it ($d); undo: $0 clear"
    ;;
  freeze | thaw | kill)
    pid=$(trainer)
    case "$fault" in
      freeze) kill -STOP "$pid" && echo "$pid" >"$state/frozen-$node" && did="frozen (undo: $0 thaw)" ;;
      thaw) kill -CONT "$pid" && rm -f "$state/frozen-$node" && did=thawed ;;
      kill) kill -KILL "$pid" && did=killed ;;
    esac
    echo "drill: $node: trainer (pid $pid) $did"
    ;;
esac
