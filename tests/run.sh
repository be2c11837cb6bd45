#!/usr/bin/env bash
# Usage: tests/run.sh [--fast | --one-cluster | --side-by-side] [PYTEST_ARGS...]
#
# Sets everything up on a fresh machine and runs the whole suite:
#   1. system packages (Debian: Slurm, munge, Prometheus, ShellCheck, jq, ...): utils/setup_system.sh
#      installs the missing ones with apt-get as root, else names them on one line and stops;
#   2. the pinned Python environment (utils/setup_env.sh; ~2-3 min the first time);
#   3. pytest over tests/ in two phases: A, every test marked neither `cluster` nor `serial`, on one
#      worker more than cores (pytest-xdist, each test file on one worker); then B: the `cluster` tests
#      on two workers, each with a local Slurm cluster of its own that it starts (its jobs numbered
#      apart: LOCAL_CLUSTER_FIRST_JOB_ID), the longest files first (they mostly wait on jobs: ~60 %
#      of the CPU while MaxText trains, ~5 % while a drill waits on a timeout); then, in one process,
#      the `machine` tests (the live incidents: their drills load the whole machine) and
#      the `serial` tests (wall-clock bounds on real servers). The exit status is the worst; one line
#      gives the times. Arguments that choose the selection or the workers themselves
#      (-m, -n, -p no:xdist, --pdb) get one plain pytest run instead.
#   --one-cluster  B in one process on one shared cluster (slower by ~10 min on 2 cores).
#   --side-by-side  A beside B (one cluster), at the lowest CPU and IO priority (nice 19, ionice idle),
#           its output after B's; B's live incidents then share the disk and the CPU caches with A
#           (seen once: the heavy-IO drill diagnosed as network on the healthy peer).
#   --fast  the developer loop (~1.7-2 min and ~190 s of CPU on 2 cores; the goal is 1 min): only the tests marked neither `cluster`
#           (the local Slurm cluster) nor `slow` (MaxText training or config loads, a Ray cluster,
#           the repeats of the incident matrix), that is -m "not cluster and not slow", on one worker
#           more than cores (pytest-xdist, each test file on one worker; add -n 0 for one process, e.g. --pdb).
# Extra arguments go to pytest, e.g. tests/run.sh -k slurm -x, tests/run.sh --fast tests/test_triage.py
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../utils/launch/lib.sh"; usage; exit; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
start=$SECONDS
# One worker more than cores: many tests wait on a server or a sleep, and a third worker fills
# that time. At most 6: the longest file bounds the run. Whole files per worker, in file order
# (xdist would otherwise start the files with the most tests first).
workers=$(( $(nproc) + 1 ))
(( workers <= 6 )) || workers=6
parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
fast=0 sequential=1 two=1
if [[ "${1:-}" == --fast ]]; then
  shift
  fast=1
elif [[ "${1:-}" == --side-by-side ]]; then
  shift
  sequential=0 two=0
elif [[ "${1:-}" == --one-cluster ]]; then
  shift
  two=0
fi
# the caller picks the selection or the workers: one pytest run with exactly those arguments
plain=0
for a in "$@"; do
  case "$a" in -m | -m* | -n | -n* | --numprocesses* | no:xdist | -pno:xdist | --pdb) plain=1 ;; esac
done

"$repo/utils/setup_system.sh"
export PATH="$PATH:/usr/sbin:/sbin"

"$repo/utils/setup_env.sh"
cd "$repo"
# Let Python keep its bytecode (some containers set PYTHONDONTWRITEBYTECODE): else every pytest
# process rewrites the asserts of every test module again (collecting the suite: 5.7 CPU-s without
# the cached rewrite, 2.2 with it)
unset PYTHONDONTWRITEBYTECODE
py="${MAXTEXT_SLURM_VENV:-$repo/.venv}/bin/python"
rc=0
if (( fast )); then
  (( plain )) || set -- "${parallel[@]}" "$@"
  set -- -m "not cluster and not slow" "$@"
  "$py" -m pytest "$@" || rc=$?
  echo "tests/run.sh: finished in $((SECONDS - start)) s (exit $rc)" >&2
  exit "$rc"
fi
if (( plain )); then
  "$py" -m pytest "$@" || rc=$?
  echo "tests/run.sh: finished in $((SECONDS - start)) s (exit $rc)" >&2
  exit "$rc"
fi
# pytest's exit 5 is "nothing selected": fine for one phase (tests/run.sh -k X names tests of one
# kind), a failure only when neither phase ran anything
rc_a=0 rc_b=0
if (( sequential )); then
  t0=$SECONDS
  "$py" -m pytest -m "not cluster and not serial" "${parallel[@]}" "$@" || rc_a=$?
  t_a=$((SECONDS - t0))
  t0=$SECONDS
  if (( two )); then
    MST_CLUSTER_PER_WORKER=1 "$py" -m pytest -m "cluster and not machine and not serial" \
      -n 2 --dist loadfile --no-loadscope-reorder "$@" || rc_b=$?
    t_b1=$((SECONDS - t0))
    rc=0
    "$py" -m pytest -m "machine or serial" "$@" || rc=$?
    (( rc == 5 || (rc_b != 5 && rc <= rc_b) )) || rc_b=$rc
    rc=0
    t_b2=$((SECONDS - t0 - t_b1))
  else
    "$py" -m pytest -m "cluster or serial" "$@" || rc_b=$?
  fi
  t_b=$((SECONDS - t0))
else
  # A in the background, its output in a private file shown after B's; its time and status in another
  out_a=$(mktemp -d "${TMPDIR:-/tmp}/tests-run.XXXXXX")
  pid_a=""
  trap '[[ -z "$pid_a" ]] || pkill -TERM -P "$pid_a" 2>/dev/null; rm -rf "$out_a"' EXIT
  low=(nice -n 19)
  command -v ionice >/dev/null && ionice -c 3 true 2>/dev/null && low+=(ionice -c 3)
  (
    t0=$SECONDS rc=0
    "${low[@]}" "$py" -m pytest -m "not cluster and not serial" "${parallel[@]}" "$@" >"$out_a/log" 2>&1 || rc=$?
    echo "$((SECONDS - t0)) $rc" >"$out_a/result"
  ) &
  pid_a=$!
  t0=$SECONDS
  "$py" -m pytest -m "cluster or serial" "$@" || rc_b=$?
  t_b=$((SECONDS - t0))
  wait "$pid_a" || true
  pid_a=""
  echo "==================== phase A (neither cluster nor serial, alongside B) ===================="
  cat "$out_a/log"
  read -r t_a rc_a <"$out_a/result" || { t_a=0 rc_a=1; }
fi
said() { (( $1 == 5 )) && echo "nothing selected" || echo "exit $1"; }
if (( rc_a == 5 && rc_b == 5 )); then rc=5
else
  rc=$(( rc_a == 5 ? 0 : rc_a ))
  (( rc_b == 5 || rc_b <= rc )) || rc=$rc_b
fi
how=$( ((sequential)) && echo "one after the other" || echo "side by side")
b="one process"
((!two)) || b="two workers with a cluster each: $t_b1 s, then machine and serial in one process: $t_b2 s"
echo "tests/run.sh: finished in $((SECONDS - start)) s (exit $rc), $how: A, $workers workers: $t_a s ($(said "$rc_a")); B, cluster and serial, $b: $t_b s ($(said "$rc_b"))" >&2
exit "$rc"
