#!/usr/bin/env bash
# Usage: tests/run.sh [--fast | --in-turn | --one-cluster] [PYTEST_ARGS...]
#
# Sets everything up on a fresh machine and runs the whole suite:
#   1. system packages (Debian: Slurm, munge, Prometheus, ShellCheck, jq, ...): utils/setup_system.sh
#      installs the missing ones with apt-get as root, else names them on one line and stops;
#   2. the pinned Python environment (utils/setup_env.sh; ~2-3 min the first time);
#   3. pytest over tests/ in four parts: B1, the `cluster` and `heavy` tests on two workers, each
#      with a local Slurm cluster of its own that it starts (its jobs numbered apart:
#      LOCAL_CLUSTER_FIRST_JOB_ID), the longest files first, then B2, the `machine` tests (the live
#      incidents: their drills load the whole machine, which another cluster's jobs would see) in one
#      process; beside both A, every test neither `cluster` nor `heavy` nor `serial`, on two workers
#      more than cores (pytest-xdist, each test file on one worker), at a low CPU and IO priority
#      (nice 19, ionice best-effort 7): they take the CPU the cluster tests leave while waiting on
#      their jobs, and none of them waits on a heavy process against a clock (`heavy`: a trainer, a
#      Ray cluster, podman; those run in the foreground); A's output comes after theirs. Then,
#      alone, B3: the `serial` tests (wall-clock bounds). The exit status is the
#      worst; the last line gives the times. Arguments that choose the selection or the workers
#      themselves (-m, -n, -p no:xdist, --pdb) get one plain pytest run instead.
#   --in-turn  A (every test neither `cluster` nor `serial`), then B1 (`cluster`), B2 and B3, each alone.
#   --one-cluster  A, then every `cluster` and `serial` test in one process on one shared cluster (~15 min longer).
#   --fast  the developer loop (58-61 s and ~110 s of CPU on 2 cores in a quiet hour; 76-95 s and up to 180 s of CPU in a busy
#           one; the goal is under 1 min): only the tests marked neither `cluster`
#           (the local Slurm cluster) nor `slow` (MaxText training or config loads, a Ray cluster,
#           the repeats of the incident matrix), that is -m "not cluster and not slow", on two workers
#           more than cores (pytest-xdist, each test file on one worker; add -n 0 for one process, e.g. --pdb).
# Extra arguments go to pytest, e.g. tests/run.sh -k slurm -x, tests/run.sh --fast tests/test_triage.py
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../utils/launch/lib.sh"; usage; exit; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
start=$SECONDS
# Two workers more than cores: tests wait on servers and sleeps (a live Prometheus' first scrapes
# ~6.5 s); on 2 cores 4 workers took 68-70 s where 3 took 75 s (124 CPU-s either way), and with the
# longest files first 3, 4 and 5 workers alternated in one hour came out alike. At most 6: the
# longest file bounds the run. Whole files per worker, in the order tests/conftest.py gives them
# (its longest files first; xdist would otherwise start the files with the most tests first).
workers=$(( $(nproc) + 2 ))
(( workers <= 6 )) || workers=6
parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
fast=0 mode=beside
case "${1:-}" in
  --fast) fast=1 && shift ;;
  --in-turn | --one-cluster) mode=${1#--} && shift ;;
esac
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
# pytest's exit 5 is "nothing selected": fine for one part (tests/run.sh -k X names tests of one
# kind), a failure only when no part ran anything
worst() { # RC... -> the worst status; 5 only when every part selected nothing
  local r w=5
  for r in "$@"; do
    if ((w == 5)); then w=$r; elif ((r != 5 && r > w)); then w=$r; fi
  done
  echo "$w"
}
said() { (( $1 == 5 )) && echo "nothing selected" || echo "exit $1"; }
phase_a=(-m "not cluster and not serial" "${parallel[@]}")
two=(-n 2 --dist loadfile --no-loadscope-reorder)
rc_a=5 rc_b1=5 rc_b2=5 t_a=0 t_b1=0 t_b2=0
case $mode in
  one-cluster)
    t0=$SECONDS
    "$py" -m pytest "${phase_a[@]}" "$@" || rc_a=$?
    t_a=$((SECONDS - t0)) t0=$SECONDS rc_b2=0
    "$py" -m pytest -m "cluster or serial" "$@" || rc_b2=$?
    echo "tests/run.sh: finished in $((SECONDS - start)) s (exit $(worst "$rc_a" "$rc_b2")): A, $workers workers: $t_a s ($(said "$rc_a")); B, cluster and serial, one process on one cluster: $((SECONDS - t0)) s ($(said "$rc_b2"))" >&2
    exit "$(worst "$rc_a" "$rc_b2")"
    ;;
  in-turn)
    t0=$SECONDS rc_a=0
    "$py" -m pytest "${phase_a[@]}" "$@" || rc_a=$?
    t_a=$((SECONDS - t0)) t0=$SECONDS rc_b1=0
    MST_CLUSTER_PER_WORKER=1 "$py" -m pytest -m "cluster and not machine and not serial" "${two[@]}" "$@" || rc_b1=$?
    t_b1=$((SECONDS - t0)) t0=$SECONDS rc_b2=0
    "$py" -m pytest -m "machine and not serial" "$@" || rc_b2=$?
    t_b2=$((SECONDS - t0))
    ;;
  beside)
    # A in the background, its output in a private file shown after B1's and B2's; its time and
    # status in another
    out_a=$(mktemp -d "${TMPDIR:-/tmp}/tests-run.XXXXXX")
    pid_a=""
    trap '[[ -z "$pid_a" ]] || pkill -TERM -P "$pid_a" 2>/dev/null; rm -rf "$out_a"' EXIT
    # nice 19: B1's cluster tests bound how fast a job ends (with A at nice 10, a killed rank's Ray
    # job ended 30 s after the kill, its test's bound); A waits on no heavy process against a clock
    # (those are `heavy`, in B1). Best-effort IO 7, not idle: the idle class
    # would stop A's disk reads during the live incidents' IO drills.
    low=(nice -n 19)
    command -v ionice >/dev/null && ionice -c 2 -n 7 true 2>/dev/null && low+=(ionice -c 2 -n 7)
    (
      t0=$SECONDS rc=0
      "${low[@]}" "$py" -m pytest -m "not cluster and not heavy and not serial" "${parallel[@]}" "$@" >"$out_a/log" 2>&1 || rc=$?
      echo "$((SECONDS - t0)) $rc" >"$out_a/result"
    ) &
    pid_a=$!
    t0=$SECONDS rc_b1=0
    MST_CLUSTER_PER_WORKER=1 "$py" -m pytest -m "(cluster or heavy) and not machine and not serial" "${two[@]}" "$@" || rc_b1=$?
    t_b1=$((SECONDS - t0)) t0=$SECONDS rc_b2=0
    "$py" -m pytest -m "machine and not serial" "$@" || rc_b2=$?
    t_b2=$((SECONDS - t0))
    wait "$pid_a" || true
    pid_a=""
    echo "==================== A: neither cluster nor heavy nor serial (beside B1 and B2, at nice 19) ===================="
    cat "$out_a/log"
    read -r t_a rc_a <"$out_a/result" || { t_a=0 rc_a=1; }
    ;;
esac
t0=$SECONDS rc_b3=0
"$py" -m pytest -m "serial" "$@" || rc_b3=$?
t_b3=$((SECONDS - t0))
rc=$(worst "$rc_a" "$rc_b1" "$rc_b2" "$rc_b3")
if [[ $mode == beside ]]; then
  how="A beside B1 and B2, then B3" a="A, not heavy" b1="B1, cluster and heavy"
else
  how="A, B1, B2, B3 in turn" a="A, neither cluster nor serial" b1="B1, cluster"
fi
echo "tests/run.sh: finished in $((SECONDS - start)) s (exit $rc), $how: $a, $workers workers: $t_a s ($(said "$rc_a")); $b1, two workers with a cluster each: $t_b1 s ($(said "$rc_b1")); B2, machine, one process: $t_b2 s ($(said "$rc_b2")); B3, serial, one process: $t_b3 s ($(said "$rc_b3"))" >&2
exit "$rc"
