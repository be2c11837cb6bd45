#!/usr/bin/env bash
# Usage: tests/run.sh [PYTEST_ARGS...]
#
# Sets everything up on a fresh machine and runs the whole suite:
#   1. system packages (Debian: Slurm, munge, Prometheus, ShellCheck, jq, ...): utils/setup_system.sh
#      installs the missing ones with apt-get as root, else names them on one line and stops;
#   2. the pinned Python environment (utils/setup_env.sh; ~2-3 min the first time);
#   3. pytest over tests/ (the tests start the local Slurm cluster themselves).
# Extra arguments go to pytest, e.g. tests/run.sh -k slurm -x
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/../utils/launch/lib.sh"; usage; exit; }
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
start=$SECONDS

"$repo/utils/setup_system.sh"
export PATH="$PATH:/usr/sbin:/sbin"

"$repo/utils/setup_env.sh"
cd "$repo"
rc=0
"$repo/.venv/bin/python" -m pytest "$@" || rc=$?
echo "tests/run.sh: finished in $((SECONDS - start)) s (exit $rc)" >&2
exit "$rc"
