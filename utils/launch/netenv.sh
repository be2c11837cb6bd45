#!/usr/bin/env bash
# Usage: utils/launch/netenv.sh [--print | --report | --container-args]
#
# The network of this node's collectives, chosen from what the node has by one rule on every node, for
# the variables still unset (the user's environment, the site file, configs/MODEL.env.sh and _env_
# overrides win). NCCL reads them on NVIDIA GPUs; RCCL, on AMD GPUs, reads the same NCCL_* names:
#   NCCL_SOCKET_IFNAME (as "=IF", an exact name) and GLOO_SOCKET_IFNAME (IF): the interface that carries
#     this node's address (JOB_NODE_ADDRS at JOB_NODE_RANK; where the address is on no interface of the
#     node, the interface of the route to JOB_COORDINATOR_ADDR). Never a container or VM bridge (docker*,
#     podman*, cni-*, virbr*, ...) or a link that is down; lo only when every address of the job is a
#     loopback one (all nodes on one machine).
#   NCCL_IB_HCA ("=DEV:PORT,..." sorted): the RDMA ports in state ACTIVE of channel adapters whose driver
#     is in utils/launch/rdma_providers.tsv with nccl_ib=yes; the InfiniBand ones when the node has
#     any (an Ethernet port beside them is a front-end NIC), else the RoCE ones. Unset: no such port.
#   NCCL_IB_GID_INDEX (RoCE only): N when every chosen port has exactly one RoCE v2 GID holding an IPv4
#     address (gid_attrs/types/N, gids/N) and it is the same N on all; otherwise NCCL picks the GID.
#   --print           (default) NAME=VALUE for each choice of an unset variable; notes on stderr
#   --report          what the node has (its address, interfaces, RDMA ports and their states, the
#                     host's verbs providers) and what is chosen: preflight's lines; exit 1 when a
#                     multi-node job (JOB_NUM_NODES > 1) has no usable interface for this node's address
#   --container-args  the runtime flags that give a container this node's RDMA devices, one per line:
#                     --device /dev/infiniband, --ulimit memlock (unlimited where the hard limit or this
#                     user allows, else the hard limit), and read-only mounts of the host's
#                     /etc/libibverbs.d, libibverbs, its provider directory and the table's libraries;
#                     nothing when the node has no /dev/infiniband
# Sourced (bash), it defines functions only (netenv_scan, netenv_print, netenv_report, netenv_container_args,
# netenv_counter_globs).
# Reads /sys/class/net, /sys/class/infiniband, `ip -o addr show` and `ip -o route get` (without ip,
# /proc/net/route) and getent for a node address that is a name.
# Test hooks (docs/env-contract.md): MST_SYSFS_ROOT (/sys), MST_PROCFS_ROOT (/proc), MST_DEV_ROOT (/dev),
#   MST_HOST_ROOT (/: the host's libraries and /etc/libibverbs.d); "%h" in them is the node's name.

_netenv_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=utils/launch/lib.sh
source "$_netenv_here/lib.sh"
NETENV_TABLE=$_netenv_here/rdma_providers.tsv
# Interfaces of container runtimes and hypervisors: host-local bridges and their veth ends.
NETENV_BRIDGES=(docker* br-* podman* cni-* cni0 virbr* veth* lxcbr* lxdbr* flannel* cali*)

_ne_first_line() {  # _ne_first_line VAR FILE: VAR = the file's first line (false when unreadable or empty)
  local -n _nfl=$1
  _nfl=
  { IFS= read -r _nfl || [[ -n $_nfl ]]; } 2>/dev/null < "$2"
}
_ne_is_ipv4() { [[ $1 =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]]; }
_ne_is_loopback() { [[ $1 == 127.* || $1 == ::1 ]]; }
_ne_multinode() { [[ ${JOB_NUM_NODES:-1} =~ ^[0-9]+$ ]] && (( ${JOB_NUM_NODES:-1} > 1 )); }

# _ne_resolve NAME_OR_ADDRESS: the address (IPv4 first); a name through getent; false when none.
_ne_resolve() {
  local a=$1 line
  if _ne_is_ipv4 "$a" || [[ $a == *:* ]]; then printf '%s\n' "${a,,}"; return 0; fi
  command -v getent >/dev/null 2>&1 || return 1
  line=$(getent ahostsv4 "$a" 2>/dev/null | head -n 1) || true
  [[ -n $line ]] || line=$(getent ahosts "$a" 2>/dev/null | head -n 1) || true
  [[ -n $line ]] || return 1
  printf '%s\n' "${line%% *}"
}

# _ne_addresses: "IF ADDRESS/PREFIX" for each address of this node (ip -o addr show); false without ip.
_ne_addresses() {
  local out
  out=$(ip -o addr show 2>/dev/null) && [[ -n $out ]] || return 1
  awk '$3 == "inet" || $3 == "inet6" { i = $2; sub(/@.*/, "", i); print i, tolower($4) }' <<< "$out"
}

# _ne_route_dev ADDRESS: the interface the route to ADDRESS leaves by (ip -o route get; without ip, the
# longest matching prefix of /proc/net/route, IPv4 only).
_ne_route_dev() {
  local out a b c d want ifc dst flags metric mask bits m best="" bestbits=-1 bestmetric=0
  if out=$(ip -o route get "$1" 2>/dev/null) && [[ " $out " =~ \ dev\ ([^ ]+)\  ]]; then
    printf '%s\n' "${BASH_REMATCH[1]}"
    return 0
  fi
  _ne_is_ipv4 "$1" || return 1
  IFS=. read -r a b c d <<< "$1"
  want=$(( (d << 24) | (c << 16) | (b << 8) | a ))   # /proc/net/route prints addresses little-endian
  while read -r ifc dst _ flags _ _ metric mask _; do
    [[ $dst =~ ^[0-9A-Fa-f]{8}$ && $mask =~ ^[0-9A-Fa-f]{8}$ && $flags =~ ^[0-9A-Fa-f]+$ ]] || continue
    (( 16#$flags & 1 )) || continue   # RTF_UP
    (( (want & 16#$mask) == (16#$dst & 16#$mask) )) || continue
    bits=0
    for (( m = 16#$mask; m; m >>= 1 )); do (( bits += m & 1 )); done
    if (( bits > bestbits || (bits == bestbits && metric < bestmetric) )); then
      best=$ifc bestbits=$bits bestmetric=$metric
    fi
  done 2>/dev/null < "$(node_root proc)/net/route"
  [[ -n $best ]] && printf '%s\n' "$best"
}

# _ne_unusable IF: why IF cannot carry the job's traffic ("" when it can).
_ne_unusable() {
  local name=$1 pat st t sys
  sys=$(node_root sys)
  for pat in "${NETENV_BRIDGES[@]}"; do
    # shellcheck disable=SC2053 # the table's entries are patterns
    [[ $name == $pat ]] && { echo "a container or VM bridge"; return; }
  done
  if [[ $name == lo ]] || { _ne_first_line t "$sys/class/net/$name/type" && [[ $t == 772 ]]; }; then
    echo "the loopback"; return
  fi
  if _ne_first_line st "$sys/class/net/$name/operstate"; then
    case $st in up|unknown) ;; *) echo "$st"; return ;; esac
  fi
  echo ""
}

# _ne_provider DRIVER: the table's row for a PCI driver in NE_ROW (vendor family provider libraries nccl_ib).
_ne_provider() {
  local pci rdma vendor family provider libs ib
  NE_ROW=()
  while IFS=$'\t' read -r pci rdma vendor family provider libs ib _; do
    [[ $pci == "$1" ]] && { NE_ROW=("$rdma" "$vendor" "$family" "$provider" "$libs" "$ib"); return 0; }
  done < <(grep -v '^#' "$NETENV_TABLE")
  return 1
}

# _ne_libdir ROOT: the host's library directory that holds libibverbs (under ROOT).
# netenv_counter_globs: NE_GLOBS[PCI_DRIVER/COLUMN] = the table's hw_counters globs (COLUMN: retransmit,
# errors, congestion, traffic; empty for "-"), and NE_GLOBS[*/COLUMN] every row's together (for a driver
# the table lacks). Read by utils/observe/plugins/host_metrics_plugin.sh.
netenv_counter_globs() {
  declare -gA NE_GLOBS=()
  local pci col v i
  local -a cols=(retransmit errors congestion traffic) vals
  while IFS=$'\t' read -r pci _ _ _ _ _ _ 'vals[0]' 'vals[1]' 'vals[2]' 'vals[3]' _; do
    for i in 0 1 2 3; do
      col=${cols[i]} v=${vals[i]}
      [[ $v == - ]] && v=
      NE_GLOBS[$pci/$col]=$v
      [[ $col == traffic || -z $v ]] || NE_GLOBS[*/$col]+="${NE_GLOBS[*/$col]:+ }$v"
    done
  done < <(grep -v '^#' "$NETENV_TABLE")
}

_ne_libdir() {
  local d
  for d in "/usr/lib/$(uname -m)-linux-gnu" /usr/lib64 /usr/lib; do
    compgen -G "$1$d/libibverbs.so.*" >/dev/null && { printf '%s\n' "$d"; return 0; }
  done
  return 1
}

# netenv_scan: looks at the node and sets
#   NE_HOST NE_ADDR (this node's address, as given) NE_IF NE_SEEN (its interfaces and addresses) NE_PROBLEM
#   NE_NOTES (array) NE_PORTS (array of report lines) NE_HCA NE_GID NE_CHOICES (array NAME=VALUE)
netenv_scan() {
  local sys ip coord rank own_is_coord=0 all_loop=1 a r line ifname why dev d p port out
  local state phys link rate drv node_type n desc use ndev layer idx t g gid_set="" disagree=0 c seen=""
  local -a addrs lines=() ib=() roce=() chosen=() warn_down=()
  local -A gids=()
  sys=$(node_root sys)
  NE_HOST=${JOB_HOSTNAME:-$(hostname)} NE_ADDR="" NE_IF="" NE_SEEN="" NE_PROBLEM="" NE_HCA="" NE_GID=""
  NE_NOTES=() NE_PORTS=() NE_CHOICES=()

  # --- this node's address and the interface that carries it ---------------------------------------
  read -r -a addrs <<< "${JOB_NODE_ADDRS:-}"
  rank=${JOB_NODE_RANK:-0}
  coord=${JOB_COORDINATOR_ADDR:-}
  if [[ $rank =~ ^[0-9]+$ && -n ${addrs[rank]:-} ]]; then NE_ADDR=${addrs[rank]}
  elif [[ $rank == 0 && -n $coord ]]; then NE_ADDR=$coord
  fi
  [[ -n $NE_ADDR && $NE_ADDR == "$coord" ]] && own_is_coord=1
  if out=$(_ne_addresses); then mapfile -t lines <<< "$out"; fi
  for line in "${lines[@]}"; do
    ifname=${line%% *}
    [[ ${line#* } == fe80:* || ${line#* } == ::1/* ]] && continue   # IPv6 link-local and loopback
    why=$(_ne_unusable "$ifname")
    NE_SEEN+="${NE_SEEN:+, }$ifname ${line#* }${why:+ ($why)}"
  done
  [[ -n $NE_SEEN ]] || NE_SEEN="no interface addresses (no ip command, or it lists none)"
  ip=""
  if [[ -n $NE_ADDR ]] && ! ip=$(_ne_resolve "$NE_ADDR"); then
    NE_NOTES+=("this node's address $NE_ADDR does not resolve here")
    ip=""
  fi
  if [[ -n $ip ]] && _ne_is_loopback "$ip"; then
    # lo carries it: right when every node of the job is on this machine (a local cluster), else not
    for a in "${addrs[@]}" "$coord"; do
      [[ -n $a ]] || continue
      r=$(_ne_resolve "$a") || r=""
      _ne_is_loopback "$r" || { all_loop=0; break; }
    done
    if (( all_loop )); then
      NE_IF=lo
      NE_NOTES+=("lo carries this node's address $NE_ADDR: every node of the job is on this machine")
    else
      a=$NE_ADDR; [[ $ip == "$NE_ADDR" ]] || a="$NE_ADDR ($ip here: /etc/hosts?)"
      NE_NOTES+=("this node's address $a is a loopback address, while other nodes' are not")
      (( ! own_is_coord )) || NE_PROBLEM="its address $a is a loopback address, which the other nodes cannot reach"
    fi
  elif [[ -n $ip ]]; then
    for line in "${lines[@]}"; do
      a=${line#* }; a=${a%/*}
      [[ $a == "$ip" ]] && { NE_IF=${line%% *}; break; }
    done
    if [[ -z $NE_IF ]] && (( ${#lines[@]} == 0 )) && ifname=$(_ne_route_dev "$ip"); then
      NE_IF=$ifname
      NE_NOTES+=("no ip command: $ifname from $(node_root proc)/net/route's route to $ip")
    fi
    if [[ -n $NE_IF ]]; then
      why=$(_ne_unusable "$NE_IF")
      [[ -z $why ]] || { NE_PROBLEM="its address $NE_ADDR is on $NE_IF, which is $why"; NE_IF=""; }
    else
      NE_NOTES+=("this node's address $NE_ADDR ($ip) is on no interface of this node")
    fi
  fi
  if [[ -z $NE_IF && -z $NE_PROBLEM ]]; then
    # the route toward the coordinator: the way this node reaches the job (not for the coordinator itself)
    if [[ -n $coord ]] && (( ! own_is_coord )) && r=$(_ne_resolve "$coord") && ifname=$(_ne_route_dev "$r"); then
      why=$(_ne_unusable "$ifname")
      if [[ -z $why ]]; then
        NE_IF=$ifname
        NE_NOTES+=("the route to the coordinator $coord leaves by $ifname")
      else
        NE_PROBLEM="the route to the coordinator $coord leaves by $ifname, which is $why"
      fi
    elif [[ -n $NE_ADDR ]]; then
      NE_PROBLEM="no usable interface carries its address $NE_ADDR"
    else
      NE_PROBLEM="no address for it (JOB_NODE_ADDRS and JOB_COORDINATOR_ADDR unset)"
    fi
  fi
  if [[ -n $NE_IF ]]; then NE_CHOICES+=("NCCL_SOCKET_IFNAME==$NE_IF" "GLOO_SOCKET_IFNAME=$NE_IF"); fi

  # --- RDMA ports -----------------------------------------------------------------------------------
  for d in "$sys"/class/infiniband/*; do
    [[ -d $d ]] || continue
    dev=${d##*/}
    drv=$(readlink "$d/device/driver" 2>/dev/null) || drv="?"
    drv=${drv##*/}
    _ne_first_line node_type "$d/node_type" || node_type="?"
    if _ne_provider "$drv"; then
      desc="${NE_ROW[1]} ${NE_ROW[2]} ($drv, ${NE_ROW[0]}, provider ${NE_ROW[3]})"
    else
      desc="driver $drv, not in $(basename "$NETENV_TABLE")"
    fi
    for p in "$d"/ports/*; do
      [[ -d $p ]] || continue
      port=${p##*/}
      _ne_first_line state "$p/state" || state="?"
      _ne_first_line phys "$p/phys_state" || phys="?"
      _ne_first_line link "$p/link_layer" || link="?"
      _ne_first_line rate "$p/rate" || rate="?"
      use=""
      _ne_first_line ndev "$p/gid_attrs/ndevs/0" || ndev=""
      if [[ ${state#*: } != ACTIVE ]]; then use="not used: port not ACTIVE"
      elif (( ${#NE_ROW[@]} == 0 )); then use="not used: driver $drv is not in $(basename "$NETENV_TABLE")"
      elif [[ ${NE_ROW[5]} != yes ]]; then use="not used: NCCL reaches ${NE_ROW[1]} NICs through a network plugin"
      elif [[ ${node_type%%:*} != 1 ]]; then use="not used: node type ${node_type#*: } (not a channel adapter)"
      elif [[ $link == InfiniBand ]]; then ib+=("$dev:$port")
      elif [[ $link == Ethernet ]]; then roce+=("$dev:$port")
      else use="not used: link layer $link"
      fi
      NE_PORTS+=("rdma $dev port $port${ndev:+ ($ndev)}: ${state#*: }, ${phys#*: }, $link, $rate; $desc${use:+; $use}")
      [[ ${state#*: } == ACTIVE ]] || warn_down+=("$dev:$port:$link")
    done
  done
  if (( ${#ib[@]} )); then
    chosen=("${ib[@]}")
    (( ${#roce[@]} )) && NE_NOTES+=("RoCE ports ${roce[*]} left out: the node has InfiniBand ports")
  else
    chosen=("${roce[@]}")
  fi
  if (( ${#chosen[@]} )); then
    mapfile -t chosen < <(printf '%s\n' "${chosen[@]}" | sort -V)
    NE_HCA="=$(IFS=,; echo "${chosen[*]}")"
    NE_CHOICES+=("NCCL_IB_HCA=$NE_HCA")
    layer=InfiniBand
    (( ${#ib[@]} )) || layer=Ethernet
    for a in "${warn_down[@]}"; do
      [[ ${a##*:} == "$layer" ]] &&
        NE_NOTES+=("warning: ${a%:*} is not ACTIVE while ${#chosen[@]} other $layer port(s) are: cable, switch?")
    done
  fi
  # RoCE: the one RoCE v2 GID with an IPv4 address of each chosen port; the index when all agree
  if (( ! ${#ib[@]} && ${#chosen[@]} )); then
    for c in "${chosen[@]}"; do
      p=$sys/class/infiniband/${c%:*}/ports/${c##*:}
      n=0 g=""
      for t in "$p"/gid_attrs/types/*; do
        idx=${t##*/}
        if ! _ne_first_line a "$t" || [[ $a != "RoCE v2" ]]; then continue; fi   # unset entries: unreadable
        if ! _ne_first_line r "$p/gids/$idx" || [[ ${r,,} != 0000:0000:0000:0000:0000:ffff:* ]]; then continue; fi
        n=$((n + 1)) g=$idx
      done
      gids[$c]="$n:$g"
      if (( n != 1 )); then disagree=1
      elif [[ -z $gid_set ]]; then gid_set=$g
      elif [[ $gid_set != "$g" ]]; then disagree=1
      fi
    done
    if (( ! disagree )) && [[ -n $gid_set ]]; then
      NE_GID=$gid_set
      NE_CHOICES+=("NCCL_IB_GID_INDEX=$NE_GID")
    else
      for c in "${chosen[@]}"; do
        case ${gids[$c]%%:*} in 0) g=none ;; 1) g="index ${gids[$c]#*:}" ;; *) g="${gids[$c]%%:*} of them" ;; esac
        seen+="${seen:+, }$c $g"
      done
      NE_NOTES+=("NCCL_IB_GID_INDEX left to NCCL: not one RoCE v2 IPv4 GID at the same index on every port: $seen")
    fi
  fi
}

# netenv_print: NAME=VALUE for each choice whose variable is unset; notes on stderr.
netenv_print() {
  local kv n kept=()
  netenv_scan
  for kv in "${NE_CHOICES[@]}"; do
    n=${kv%%=*}
    if [[ -v $n ]]; then kept+=("$n=${!n}"); else printf '%s\n' "$kv"; fi
  done
  (( ${#kept[@]} )) && echo "netenv: kept (set before): ${kept[*]}" >&2
  if [[ -n $NE_PROBLEM ]] && _ne_multinode; then echo "netenv: node $NE_HOST: $NE_PROBLEM" >&2; fi
  return 0
}

# netenv_report: preflight's lines; status 1 when a multi-node job has no usable interface here.
netenv_report() {
  local l kv n chose=() kept=()
  netenv_scan
  echo "netenv: address ${NE_ADDR:-none}${NE_IF:+ on $NE_IF}; interfaces: $NE_SEEN"
  for l in "${NE_PORTS[@]}"; do echo "netenv: $l"; done
  (( ${#NE_PORTS[@]} )) || echo "netenv: no RDMA device in $(node_root sys)/class/infiniband: collectives use TCP"
  netenv_libraries
  for l in "${NE_NOTES[@]}"; do echo "netenv: $l"; done
  for kv in "${NE_CHOICES[@]}"; do
    n=${kv%%=*}
    if [[ -v $n ]]; then kept+=("$n=${!n}"); else chose+=("$kv"); fi
  done
  echo "netenv: chosen: ${chose[*]:-nothing}${kept[*]:+; set before, kept: ${kept[*]}}"
  if [[ -n $NE_PROBLEM ]]; then
    if _ne_multinode; then
      echo "netenv: FAILED: node $NE_HOST: $NE_PROBLEM; seen: $NE_SEEN"
      return 1
    fi
    echo "netenv: node $NE_HOST: $NE_PROBLEM (one node: not needed)"
  fi
  return 0
}

# netenv_libraries: for each provider of this node's RDMA devices, whether the host has its libraries.
netenv_libraries() {
  local root libdir d drv provider libs g found f
  local -A done_=()
  root=${MST_HOST_ROOT:-}; root=${root//%h/$NE_HOST}; root=${root%/}
  libdir=$(_ne_libdir "$root") || libdir=""
  for d in "$(node_root sys)"/class/infiniband/*; do
    [[ -d $d ]] || continue
    drv=$(readlink "$d/device/driver" 2>/dev/null) || continue
    drv=${drv##*/}
    _ne_provider "$drv" || continue
    provider=${NE_ROW[3]} libs=${NE_ROW[4]}
    [[ -z ${done_[$provider]:-} ]] || continue
    done_[$provider]=1
    found=""
    if [[ -n $libdir ]]; then
      for g in $libs; do
        for f in "$root$libdir"/$g; do [[ -e $f ]] && found+="${found:+ }${f#"$root"}"; done
      done
    fi
    if [[ -n $found ]]; then echo "netenv: verbs provider $provider on this host: $found"
    else echo "netenv: warning: verbs provider $provider ($libs) not on this host: a container uses the image's own"
    fi
  done
}

# _ne_memlock: the locked-memory limit a container started from here can get: -1 (unlimited) where the
# hard limit is unlimited or this process may raise it (CAP_SYS_RESOURCE: root, or docker's daemon);
# else the hard limit in bytes (rootless podman cannot go above it: asking more fails the container),
# with a warning on stderr.
_ne_memlock() {
  local hard cap
  hard=$(ulimit -H -l)
  cap=$(awk '$1 == "CapEff:" { print $2 }' /proc/self/status 2>/dev/null) || cap=""
  if [[ $hard == unlimited ]] || { [[ $cap =~ ^[0-9a-fA-F]{1,16}$ ]] && (( (16#$cap >> 24) & 1 )); }; then
    echo -1
    return
  fi
  echo "$((hard * 1024)):$((hard * 1024))"
  echo "netenv: warning: locked memory is limited to $hard KiB for uid $(id -u) here (hard limit), so in the" \
    "container too; RDMA wants it unlimited (memlock in /etc/security/limits.conf)" >&2
}

# netenv_container_args: the runtime flags for the node's RDMA devices, one per line (see the header).
netenv_container_args() {
  local dev root libdir libs g f src dst e taken
  local -a files=()
  local -A seen=()
  dev=$(node_root dev)
  [[ -d $dev/infiniband ]] || return 0
  printf '%s\n' --device "$dev/infiniband:/dev/infiniband" --ulimit "memlock=$(_ne_memlock)"
  root=${MST_HOST_ROOT:-}; root=${root//%h/${JOB_HOSTNAME:-$(hostname)}}; root=${root%/}
  [[ -d $root/etc/libibverbs.d ]] && files+=("$root/etc/libibverbs.d")
  if libdir=$(_ne_libdir "$root"); then
    files+=("$root$libdir"/libibverbs.so.*)
    [[ -d $root$libdir/libibverbs ]] && files+=("$root$libdir/libibverbs")
    while IFS=$'\t' read -r _ _ _ _ _ libs _; do
      for g in $libs; do
        [[ $g == */* ]] && continue   # in the provider directory, mounted whole
        for f in "$root$libdir"/$g; do [[ -e $f ]] && files+=("$f"); done
      done
    done < <(grep -v '^#' "$NETENV_TABLE")
  fi
  for f in "${files[@]}"; do
    dst=${f#"$root"}
    [[ -z ${seen[$dst]:-} ]] || continue
    seen[$dst]=1
    # a site's CONTAINER_MOUNTS entry for the same destination wins
    taken=0
    for e in ${CONTAINER_MOUNTS:-}; do e=${e#*:}; [[ ${e%:ro} == "$dst" ]] && taken=1; done
    (( taken )) && continue
    src=$(readlink -f "$f") || continue
    printf '%s\n' -v "$src:$dst:ro"
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  export LC_ALL=C
  case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    ""|--print|--report|--container-args) ;;
    *) echo "netenv.sh: unknown option '$1' (expected --print, --report, --container-args or --help)" >&2; exit 2 ;;
  esac
  (( $# <= 1 )) || { echo "netenv.sh: one option at a time, got: $*" >&2; exit 2; }
  case "${1:-}" in
    --report) netenv_report ;;
    --container-args) netenv_container_args ;;
    *) netenv_print ;;
  esac
fi
