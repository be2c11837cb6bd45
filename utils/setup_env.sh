#!/usr/bin/env bash
# Usage: utils/setup_env.sh [--check] [--help]
#
# Creates (once) the pinned Python environment the launcher, tools and tests use:
#   $MAXTEXT_SLURM_VENV (default: <repo>/.venv), Python >= 3.12,
#   MaxText 0.2.5 + the minimal trainer set (requirements/maxtext.txt, --no-deps)
#   and the tooling (requirements/tools.txt, constrained by requirements/constraints.txt),
#   with utils/ and tests/ on its import path (maxtext_slurm.pth).
# A stamp file records the hash of the requirement files; later calls return at once
# while it matches. First run: ~2-3 min and ~2 GB (network-bound).
#   --check   exit 0 if the environment is ready, 1 otherwise; installs nothing.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${MAXTEXT_SLURM_VENV:-$repo/.venv}
check=0
case "${1:-}" in
  -h|--help) source "$repo/utils/launch/lib.sh"; usage; exit ;;
  --check) check=1 ;;
  "") ;;
  *) echo "setup_env.sh: unknown argument '$1' (expected --check or --help)" >&2; exit 2 ;;
esac

# The import roots, utils/ (diagnosis, launch, observe) and tests/ (helpers), as a .pth file: the
# environment's python then imports the project's modules (benchmarks, utils/dev tools) the way
# an editable install would. A shared environment (MAXTEXT_SLURM_VENV) keeps the roots of the
# clone that made it; every command in utils/ and the tests use their own clone's code anyway.
import_roots() {
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  [[ "$venv" != "$repo/.venv" && -f "$site/maxtext_slurm.pth" ]] && return 0
  printf '%s\n' "$repo/utils" "$repo/tests" > "$site/maxtext_slurm.pth"
}

want=$(cat "$repo"/requirements/*.txt | sha256sum | cut -c1-16)
stamp="$venv/.maxtext-slurm-stamp"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  (( check )) || import_roots
  exit 0
fi
(( check )) && exit 1

py=""
cands=("${MAXTEXT_SLURM_PYTHON:-}" python3.12 python3.13 python3)
# pyenv installs that are not the active version: their shims refuse to run, so look behind them.
for d in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin; do cands+=("$d/python3"); done
for cand in "${cands[@]}"; do
  [[ -n "$cand" ]] || continue
  command -v "$cand" >/dev/null 2>&1 || continue
  if "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
    py=$cand; break
  fi
done
if [[ -z "$py" ]]; then
  echo "setup_env.sh: no Python >= 3.12 found (MaxText 0.2.5 needs it); install python3.12 or set MAXTEXT_SLURM_PYTHON=/path/to/python3.12" >&2
  exit 1
fi

echo "setup_env.sh: creating $venv with $($py --version) (first run takes ~2-3 min)" >&2
start=$SECONDS
trap '(($? == 0)) || echo "setup_env.sh: creating $venv failed (see above); rerun it once that is fixed" >&2' EXIT
pip_install() {  # pip install, without the noise of index locations a machine's pip.conf may name
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
  return "${PIPESTATUS[0]}"
}
"$py" -m venv "$venv"
pip_install --upgrade pip
pip_install --no-deps -r "$repo/requirements/maxtext.txt"
pip_install -r "$repo/requirements/tools.txt" -c "$repo/requirements/constraints.txt"
import_roots
echo "$want" > "$stamp"
echo "setup_env.sh: environment ready in $((SECONDS - start)) s" >&2
