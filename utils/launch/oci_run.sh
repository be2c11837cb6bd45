#!/usr/bin/env bash
# Usage: oci_run.sh RUNTIME [RUN-OPTION...] IMAGE [COMMAND...]   (by _container.sh)
#
# Runs `RUNTIME run --cidfile FILE RUN-OPTION... IMAGE COMMAND...` (RUNTIME: podman or docker) and
# owns the container's end. A stop signal (TERM, INT, HUP: a stage's timeout, a cancel) is passed on
# by the runtime's own proxy and also sent to the container by its ID; once `RUNTIME run` has returned
# after such a signal, a container that is still there is stopped (TERM, KILL 3 s later) and removed.
# The runtime's proxy alone loses a signal that lands while the container starts: podman 4.3 TERMed
# in its start-up exits 0 and leaves the container created (measured here), or gone with the container
# still running (a CI run's stage timeout); TERMed before it wrote the ID file, it can leave the container
# created without one (a CI run at 0.1 s), so the container also carries a label unique to this call
# (mst.oci_run=<the private directory's random name>) by which it is found then. The container ID file
# lives in a private mktemp directory.
# Exit status: the runtime's; 143 where a signal stopped it and the runtime said 0.
set -uo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
(( $# >= 2 )) || { echo "oci_run.sh: expected RUNTIME [RUN-OPTION...] IMAGE [COMMAND...] (see --help)" >&2; exit 2; }
runtime=$1
shift
case "$runtime" in podman|docker) ;; *) echo "oci_run.sh: RUNTIME '$runtime' is not podman or docker" >&2; exit 2 ;; esac

dir=$(mktemp -d) || exit 1
cidfile="$dir/cid"
trap 'rm -rf "$dir"' EXIT
signalled=0
token=${dir##*/}
# the container's ID: from the ID file, else by this call's label (podman stopped before it wrote the file)
cid() { [[ -s "$cidfile" ]] && cat "$cidfile"; }
ours() { cid || "$runtime" ps -aq --no-trunc --filter "label=mst.oci_run=$token" 2>/dev/null; }
on_signal() {
  signalled=1
  kill -TERM "$pid" 2>/dev/null
  local id
  id=$(cid) && "$runtime" kill --signal TERM "$id" >/dev/null 2>&1
}

"$runtime" run --cidfile "$cidfile" --label "mst.oci_run=$token" "$@" &
pid=$!
trap on_signal TERM INT HUP
while :; do
  wait "$pid"
  kill -0 "$pid" 2>/dev/null || break
done
wait "$pid"
rc=$?
trap '' TERM INT HUP
if (( signalled )); then
  for id in $(ours); do
    "$runtime" stop -t 3 "$id" >/dev/null 2>&1
    "$runtime" rm -f "$id" >/dev/null 2>&1
  done
fi
(( signalled && rc == 0 )) && rc=143
exit "$rc"
