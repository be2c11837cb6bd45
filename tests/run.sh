#!/usr/bin/env bash
# Usage: tests/run.sh [--fast] [PYTEST_ARGS...]
#
# Sets everything up on a fresh machine and runs the whole suite:
#   1. system packages (Debian: Slurm, munge, Prometheus, ShellCheck, jq, ...): utils/setup_system.sh
#      installs the missing ones with apt-get as root, else names them on one line and stops;
#   2. the pinned Python environment (utils/setup_env.sh; ~2-3 min the first time);
#   3. pytest over tests/ (the tests start the local Slurm cluster themselves).
#   --fast  the developer loop (~2.5 min and ~330 s of CPU on 2 cores; the goal is 1 min): only the tests marked neither `cluster`
#           (the local Slurm cluster) nor `slow` (MaxText training or config loads, a Ray cluster,
#           the repeats of the incident matrix), that is -m "not cluster and not slow", on one worker
#           more than cores (pytest-xdist, each test file on one worker; add -n 0 for one process, e.g. --pdb).
# Extra arguments go to pytest, e.g. tests/run.sh -k slurm -x, tests/run.sh --fast tests/test_triage.py
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../utils/launch/lib.sh"; usage; exit; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
start=$SECONDS
if [[ "${1:-}" == --fast ]]; then
  shift
  # One worker more than cores: many tests wait on a server or a sleep, and a third worker fills
  # that time (2 cores: ~55 s instead of ~63 s). At most 6: test_diagnose, the longest file, is a
  # fifth of the work (~65 of ~330 s of CPU). Whole files per worker, in file order (xdist would otherwise start the
  # files with the most tests first, and test_diagnose has few).
  workers=$(( $(nproc) + 1 ))
  (( workers <= 6 )) || workers=6
  set -- -m "not cluster and not slow" -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi

"$repo/utils/setup_system.sh"
export PATH="$PATH:/usr/sbin:/sbin"

"$repo/utils/setup_env.sh"
cd "$repo"
rc=0
"${MAXTEXT_SLURM_VENV:-$repo/.venv}/bin/python" -m pytest "$@" || rc=$?
echo "tests/run.sh: finished in $((SECONDS - start)) s (exit $rc)" >&2
exit "$rc"
