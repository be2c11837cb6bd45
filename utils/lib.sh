# shellcheck shell=bash
# Shared helpers for the launcher scripts. Source it; it defines functions only.
#   die MSG...            print "<prog>: MSG" to stderr and exit 1
#   port_in_use PORT      true if something listens on TCP PORT (any address, IPv4 or IPv6)
#   free_port START [N]   print the first port >= START that nobody listens on (tries N, default 100)

die() {
  printf '%s: %s\n' "${PROG:-${0##*/}}" "$*" >&2
  exit 1
}

# Reads /proc/net/tcp{,6} directly: no ss/netstat/python needed on compute nodes.
port_in_use() {
  local hex f
  printf -v hex ':%04X' "$1"
  for f in /proc/net/tcp /proc/net/tcp6; do
    [[ -r "$f" ]] || continue
    # field 2 is local_address (ADDR:PORT in hex), field 4 is the state (0A = LISTEN)
    if awk -v p="$hex" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' "$f"; then
      return 0
    fi
  done
  return 1
}

free_port() {
  local port=$1 tries=${2:-100}
  while (( tries-- > 0 )); do
    if ! port_in_use "$port"; then
      printf '%s\n' "$port"
      return 0
    fi
    port=$((port + 1))
  done
  return 1
}
