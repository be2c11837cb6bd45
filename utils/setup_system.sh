#!/usr/bin/env bash
# Usage: utils/setup_system.sh [--check] [GROUP...]
#
# The system (Debian) packages the project's commands need, by group (no GROUP: all of them):
#   cluster   slurmctld slurmd slurm-client munge   utils/local_cluster.sh (Slurm on this machine)
#   observe   prometheus curl                       utils/prometheus.sh, utils/diagnose.py, RAY=1 TSDB
#   tests     shellcheck jq curl iproute2 procps gdb nftables chromium
#                                                   the suite (tests/run.sh), the skills' commands,
#                                                   utils/drill.sh and local_cluster.sh --netns,
#                                                   diagnose.py --report's page (headless chromium)
#   containers podman runc mmdebstrap                the image stage's tests: an image made offline
#                                                   (mmdebstrap), run with podman (runc; see tests/test_image_stage.py)
# A package counts as present when its commands are on PATH or in /usr/sbin, /sbin.
# As root the missing ones are installed with apt-get (quiet, no recommends; the package lists are
# updated only when apt-get cannot find a package). As another user it installs nothing: one line
# names the missing packages and the command that installs them, exit 1.
#   --check   install nothing: exit 0 if every package is present, else that one line and exit 1
# utils/local_cluster.sh up and tests/run.sh call it themselves. Exit 2: bad arguments.
set -euo pipefail

PROG=setup_system.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=utils/launch/lib.sh
source "$repo/utils/launch/lib.sh"

# GROUP -> "COMMAND:PACKAGE ...": a package is missing when one of its commands is not found.
declare -A GROUPS_OF=(
  [cluster]="slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client srun:slurm-client sinfo:slurm-client
             squeue:slurm-client scancel:slurm-client scontrol:slurm-client munged:munge"
  [observe]="prometheus:prometheus promtool:prometheus curl:curl"
  [tests]="shellcheck:shellcheck jq:jq curl:curl ip:iproute2 pgrep:procps gdb:gdb nft:nftables chromium:chromium"
  [containers]="podman:podman runc:runc mmdebstrap:mmdebstrap"
)
ALL=(cluster observe tests containers)

bad_args() {
  printf '%s: %s\n' "$PROG" "$*" >&2
  exit 2
}

check=0
groups=()
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    --check) check=1 ;;
    -*) bad_args "unknown option '$arg' (expected --check or --help)" ;;
    *)
      [[ -n "${GROUPS_OF[$arg]+x}" ]] || bad_args "unknown group '$arg': expected ${ALL[*]} (none: all)"
      groups+=("$arg")
      ;;
  esac
done
((${#groups[@]})) || groups=("${ALL[@]}")

found() { command -v "$1" >/dev/null 2>&1 || [[ -x "/usr/sbin/$1" || -x "/sbin/$1" ]]; }

# missing [cmd|pkg]: the packages (or commands) of the chosen groups that are not found, sorted.
missing() {
  local g pair
  for g in "${groups[@]}"; do
    for pair in ${GROUPS_OF[$g]}; do
      found "${pair%%:*}" || if [[ "${1:-pkg}" == cmd ]]; then echo "${pair%%:*}"; else echo "${pair#*:}"; fi
    done
  done | sort -u
}

mapfile -t need < <(missing)
((${#need[@]})) || exit 0
what="missing system packages for ${groups[*]}: ${need[*]}"
if ((check)) || (($(id -u) != 0)); then
  sudo=""; (($(id -u) == 0)) || sudo="sudo "
  die "$what; install them: ${sudo}apt-get install --no-install-recommends ${need[*]}"
fi
command -v apt-get >/dev/null 2>&1 ||
  die "$what, and apt-get is not here (not Debian): install the packages that provide them with this system's package manager"

echo "$PROG: installing ${need[*]} with apt-get (for ${groups[*]})" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -qq --no-install-recommends "${need[@]}" >"$log" 2>&1; }
if ! apt_install; then
  # a fresh image has no package lists, an old one may point at files the mirror no longer has
  if ! apt-get update -qq >"$log" 2>&1 || ! apt_install; then
    die "apt-get install ${need[*]} failed: $(grep -v '^\s*$' "$log" | tail -n 1)"
  fi
fi
mapfile -t still < <(missing cmd)
((${#still[@]} == 0)) || die "apt-get installed ${need[*]}, but ${still[*]} still cannot be found"
echo "$PROG: installed ${need[*]}" >&2
