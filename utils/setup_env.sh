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
#   MST_ACCELERATOR=cpu|cuda|rocm  what the environment's JAX runs on: cpu (a new environment's
#             default), or the JAX GPU plugin pinned in requirements/accelerators/ added (cuda: NVIDIA,
#             with CUDA from PyPI, several GB; rocm: AMD, using the node's ROCm). Recorded in
#             $venv/.mst-accelerator, which the image stage reads before it runs natively on a GPU node
#             (CONTAINER_RUNTIME=none). Unset: the environment keeps what it has.
#   --check   exit 0 if the environment is ready (and has MST_ACCELERATOR, when set), 1 otherwise;
#             installs nothing.
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
  # written only when it changes: another user of this clone (who may not write the environment)
  # finds it right already
  [[ "$(cat "$site/maxtext_slurm.pth" 2>/dev/null)" == "$repo/utils"$'\n'"$repo/tests" ]] && return 0
  printf '%s\n' "$repo/utils" "$repo/tests" > "$site/maxtext_slurm.pth"
}

# The accelerator: requirements/accelerators/<name>.txt (none for cpu). The record holds the name and
# the hash of that file, so a change of its pins installs them again.
acc_file="$venv/.mst-accelerator"
have_acc=cpu have_acc_hash=""
[[ -f "$acc_file" ]] && { read -r have_acc have_acc_hash < "$acc_file" || true; }
[[ "$have_acc" =~ ^(cpu|cuda|rocm)$ ]] || have_acc=cpu   # an unreadable record: the plugin goes in again
acc=${MST_ACCELERATOR:-$have_acc}
case "$acc" in
  cpu) acc_reqs="" ;;
  cuda|rocm) acc_reqs="$repo/requirements/accelerators/$acc.txt" ;;
  *) echo "setup_env.sh: MST_ACCELERATOR='$acc' is not one of cpu, cuda (NVIDIA), rocm (AMD)" >&2; exit 2 ;;
esac
acc_hash=cpu
[[ -n "$acc_reqs" ]] && acc_hash=$(sha256sum < "$acc_reqs" | cut -c1-16)

want=$(cat "$repo"/requirements/*.txt | sha256sum | cut -c1-16)
stamp="$venv/.maxtext-slurm-stamp"
base_ready=0
[[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && base_ready=1
acc_ready=0
[[ "$acc" == "$have_acc" && ( "$acc" == cpu || "$acc_hash" == "$have_acc_hash" ) ]] && acc_ready=1
if (( base_ready && acc_ready )); then
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
if (( ! base_ready )) && [[ -z "$py" ]]; then
  echo "setup_env.sh: no Python >= 3.12 found (MaxText 0.2.5 needs it); install python3.12 or set MAXTEXT_SLURM_PYTHON=/path/to/python3.12" >&2
  exit 1
fi

start=$SECONDS
trap '(($? == 0)) || echo "setup_env.sh: setting up $venv failed (see above); rerun it once that is fixed" >&2' EXIT
pip_install() {  # pip install, without the noise of index locations a machine's pip.conf may name
  # nor pip's "X requires Y, which is not installed": requirements/maxtext.txt is --no-deps on purpose
  # (only what the trainer imports), so e.g. xprof's cheroot/duckdb/gviz-api are left out; conflicts still show
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 |
    { grep -Ev "is ignored: it is neither a file nor a directory|^ERROR: pip's dependency resolver does not currently take|, which is not installed\.$" || true; } >&2
  return "${PIPESTATUS[0]}"
}
if (( ! base_ready )); then
  echo "setup_env.sh: creating $venv with $($py --version) (first run takes ~2-3 min)" >&2
  "$py" -m venv "$venv"
  pip_install --upgrade pip
  pip_install --no-deps -r "$repo/requirements/maxtext.txt"
  pip_install -r "$repo/requirements/tools.txt" -c "$repo/requirements/constraints.txt"
fi
if [[ "$have_acc" != cpu && "$have_acc" != "$acc" && -f "$repo/requirements/accelerators/$have_acc.txt" ]]; then
  # the other accelerator's plugin out (its CUDA/ROCm libraries are inert without it)
  echo "setup_env.sh: removing the $have_acc plugin from $venv" >&2
  mapfile -t old_pkgs < <(sed -n 's/^\([A-Za-z0-9_.-]*\).*==.*/\1/p' "$repo/requirements/accelerators/$have_acc.txt")
  "$venv/bin/python" -m pip uninstall -q -y "${old_pkgs[@]}" >&2
fi
if [[ -n "$acc_reqs" ]]; then
  echo "setup_env.sh: adding JAX's $acc plugin to $venv (${acc_reqs#"$repo"/})" >&2
  pip_install -r "$acc_reqs" -c "$repo/requirements/constraints.txt"
fi
printf '%s %s\n' "$acc" "$acc_hash" > "$acc_file"
import_roots
echo "$want" > "$stamp"
echo "setup_env.sh: environment ready ($acc) in $((SECONDS - start)) s" >&2
