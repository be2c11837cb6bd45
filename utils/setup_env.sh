#!/usr/bin/env bash
# Usage: utils/setup_env.sh [--adopt PYTHON] [--wheelhouse DIR] [--check] [--help]
#
# Creates (once) the pinned Python environment the launcher, tools and tests use:
#   $MAXTEXT_SLURM_VENV (default: <repo>/.venv), Python >= 3.12,
#   MaxText 0.2.5 + the minimal trainer set (requirements/maxtext.txt, --no-deps)
#   and the tooling (requirements/tools.txt, constrained by requirements/constraints.txt),
#   with utils/ and tests/ on its import path (maxtext_slurm.pth).
# A stamp file records the hash of the requirement files; later calls return at once
# while it matches. First run: ~2-3 min and ~2 GB (network-bound). Each build records the versions
# of JAX, jaxlib, its GPU plugin and MaxText in $venv/.mst-versions (the JOB header's environment line).
#   MST_ACCELERATOR=cpu|cuda|rocm  what the environment's JAX runs on: cpu (a new environment's
#             default), or the JAX GPU plugin pinned in requirements/accelerators/ added (cuda: NVIDIA,
#             with CUDA from PyPI, several GB; rocm: AMD, using the node's ROCm). Recorded in
#             $venv/.mst-accelerator, which the image stage reads before it runs natively on a GPU node
#             (CONTAINER_RUNTIME=none). Unset: the environment keeps what it has.
#   --adopt PYTHON  make the environment from a site's or an image's interpreter that already has JAX
#             for the node's GPUs (a venv with its site packages: its jax, jaxlib and GPU plugin are used,
#             never replaced); only what it lacks of the pins is installed (by name; a present package
#             of another version is kept: jax, jaxlib, the plugin and MaxText warn). The accelerator
#             record follows the plugin found (cpu|cuda|rocm); MST_ACCELERATOR, when set, must agree.
#             Later calls (also without --adopt) keep the adopted interpreter.
#   --wheelhouse DIR  install offline from a directory of wheels (pip --no-index --find-links DIR), for a
#             new environment or with --adopt; a missing wheel: one line with the `pip download`
#             command that fills DIR on a machine with network.
#   --check   exit 0 if the environment is ready (and has MST_ACCELERATOR, when set), 1 otherwise;
#             installs nothing.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${MAXTEXT_SLURM_VENV:-$repo/.venv}
check=0 adopt="" wheelhouse=""
bad() { echo "setup_env.sh: $*" >&2; exit 2; }
while (( $# )); do
  case "$1" in
    -h|--help) source "$repo/utils/launch/lib.sh"; usage; exit ;;
    --check) check=1 ;;
    --adopt|--wheelhouse)
      [[ -n "${2:-}" ]] || bad "$1 needs a value ($1 ${1#--}; see --help)"
      if [[ "$1" == --adopt ]]; then
        adopt=$(command -v -- "$2") || bad "--adopt '$2' is not an executable Python interpreter"
        [[ "$adopt" == /* ]] || adopt=$PWD/$adopt   # absolute, links kept (a venv's python is a link)
      else
        [[ -d "$2" ]] || bad "--wheelhouse '$2' is not a directory (a directory of .whl files)"
        wheelhouse=$(cd "$2" && pwd)
      fi
      shift ;;
    *) bad "unknown argument '$1' (expected --adopt PYTHON, --wheelhouse DIR, --check or --help)" ;;
  esac
  shift
done
pins_py="$repo/utils/launch/env_pins.py"

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

# An adopted environment (--adopt) records its interpreter in $venv/.mst-adopted; it is never made
# again from another one (that would hide the site's JAX), and later calls keep it.
adopted_from=""
[[ -f "$venv/.mst-adopted" ]] && { read -r adopted_from < "$venv/.mst-adopted" || true; }
if [[ -n "$adopt" && "$adopt" != "$adopted_from" && -n "$(ls -A "$venv" 2>/dev/null)" ]]; then
  made="made by setup_env.sh"
  [[ -z "$adopted_from" ]] || made="adopted from $adopted_from"
  echo "setup_env.sh: --adopt $adopt: $venv already holds an environment ($made); remove it, or set MAXTEXT_SLURM_VENV to a new directory" >&2
  exit 1
fi
adopt=${adopt:-$adopted_from}

# The accelerator: requirements/accelerators/<name>.txt (none for cpu). The record holds the name and
# the hash of that file, so a change of its pins installs them again; an adopted environment's holds
# "adopted": its accelerator is the adopted JAX's.
acc_file="$venv/.mst-accelerator"
have_acc=cpu have_acc_hash=""
[[ -f "$acc_file" ]] && { read -r have_acc have_acc_hash < "$acc_file" || true; }
[[ "$have_acc" =~ ^(cpu|cuda|rocm)$ ]] || have_acc=cpu   # an unreadable record: the plugin goes in again
acc=${MST_ACCELERATOR:-$have_acc}
case "$acc" in
  cpu) acc_reqs="" ;;
  cuda|rocm) acc_reqs="$repo/requirements/accelerators/$acc.txt" ;;
  *) echo "setup_env.sh: MST_ACCELERATOR='$acc' is not one of cpu, cuda (NVIDIA), rocm (AMD)" >&2; exit 1 ;;  # a bad setting: 1 (2 is for the command line, lib.sh)
esac
acc_hash=cpu
[[ -n "$acc_reqs" ]] && acc_hash=$(sha256sum < "$acc_reqs" | cut -c1-16)
[[ -n "$adopt" ]] && acc_hash=adopted

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
if (( base_ready )) && [[ -n "$adopt" ]]; then
  echo "setup_env.sh: $venv is adopted from $adopt, whose JAX runs on $have_acc; MST_ACCELERATOR=$acc cannot change that: adopt an interpreter with JAX for $acc into a new MAXTEXT_SLURM_VENV, or unset MST_ACCELERATOR" >&2
  exit 1
fi

start=$SECONDS
pip_log=$(mktemp)
trap 'rc=$?; rm -f -- "$pip_log" "${cons:-}"; ((rc == 0)) || echo "setup_env.sh: setting up $venv failed (see above); rerun it once that is fixed" >&2' EXIT
# missing_wheels PYTHON SPEC...: with a wheelhouse, exit with the one line naming what it lacks
missing_wheels() {
  local py=$1; shift
  [[ -n "$wheelhouse" ]] || return 0
  "$py" "$pins_py" wheels "$repo" "$wheelhouse" "$@" || { trap 'rm -f -- "$pip_log" "${cons:-}"' EXIT; exit 1; }
}
wh=()
[[ -n "$wheelhouse" ]] && wh=(--no-index --find-links "$wheelhouse")
pip_install() {  # pip install (offline from the wheelhouse, if any); its output only when it fails
  local rc=0 dep
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${wh[@]}" "$@" > "$pip_log" 2>&1 || rc=$?
  (( rc == 0 )) && return 0
  dep=$(grep -o -m1 'No matching distribution found for [^ ]*' "$pip_log" || true)
  [[ -n "$dep" && -n "$wheelhouse" ]] && missing_wheels "$venv/bin/python" "${dep##* }"
  # without the noise of index locations a machine's pip.conf may name, nor pip's "X requires Y, which
  # is not installed": requirements/maxtext.txt is --no-deps on purpose (only what the trainer imports),
  # so e.g. xprof's cheroot/duckdb/gviz-api are left out; version conflicts still show
  grep -Ev "is ignored: it is neither a file nor a directory|^ERROR: pip's dependency resolver does not currently take|, which is not installed\.$" "$pip_log" >&2 || true
  return "$rc"
}

if [[ -n "$adopt" ]]; then
  # the site's interpreter: its JAX is used as it is, what it lacks of the pins goes into $venv
  [[ "$("$adopt" -c 'import sys; print(sys.version_info >= (3, 12))' 2>/dev/null)" == True ]] || {
    trap - EXIT
    echo "setup_env.sh: --adopt $adopt: not a Python >= 3.12 (MaxText 0.2.5 needs it); adopt the site's Python 3.12+ with JAX" >&2
    exit 1
  }
  pth=$("$adopt" "$pins_py" pth) || { trap - EXIT; exit 1; }
  plan_py=$adopt
  [[ -x "$venv/bin/python" ]] && plan_py="$venv/bin/python"
  nodeps=() deps=()
  while read -r kind spec; do
    if [[ "$kind" == nodeps ]]; then nodeps+=("$spec"); else deps+=("$spec"); fi
  done < <("$plan_py" "$pins_py" plan "$repo")
  missing_wheels "$plan_py" "${nodeps[@]}" "${deps[@]}"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup_env.sh: adopting $adopt ($("$adopt" --version 2>&1)) into $venv" >&2
    "$adopt" -m venv --system-site-packages --without-pip "$venv"
    printf '%s\n' "$adopt" > "$venv/.mst-adopted"
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '%s\n' "$pth" > "$site/mst_adopted.pth"   # the adopted interpreter's site directories
  if (( ${#nodeps[@]} + ${#deps[@]} )); then
    echo "setup_env.sh: installing what $adopt lacks: ${nodeps[*]} ${deps[*]}" >&2
    "$venv/bin/python" -m pip --version > /dev/null 2>&1 || "$venv/bin/python" -m ensurepip -q --default-pip >&2
    cons=$(mktemp)
    "$venv/bin/python" "$pins_py" constraints "$repo" > "$cons"   # nothing present is replaced
    (( ${#nodeps[@]} )) && pip_install --no-deps -c "$cons" "${nodeps[@]}"
    (( ${#deps[@]} )) && pip_install -c "$cons" "${deps[@]}"
  fi
  got_acc=$("$venv/bin/python" "$pins_py" finish "$repo" "adopted:$adopt")
  if [[ -n "${MST_ACCELERATOR:-}" && "$MST_ACCELERATOR" != "$got_acc" ]]; then
    echo "setup_env.sh: MST_ACCELERATOR=$MST_ACCELERATOR but $adopt's JAX runs on $got_acc (its GPU plugin); adopt an interpreter with JAX for $MST_ACCELERATOR, or unset MST_ACCELERATOR" >&2
    exit 1
  fi
  printf '%s adopted\n' "$got_acc" > "$acc_file"
  import_roots
  echo "$want" > "$stamp"
  echo "setup_env.sh: environment ready ($got_acc, adopted from $adopt) in $((SECONDS - start)) s: $(cut -d' ' -f1-4 "$venv/.mst-versions")" >&2
  exit 0
fi

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
  trap - EXIT
  echo "setup_env.sh: no Python >= 3.12 found (MaxText 0.2.5 needs it); install python3.12 or set MAXTEXT_SLURM_PYTHON=/path/to/python3.12" >&2
  exit 1
fi

if (( ! base_ready )); then
  mapfile -t specs < <(sed -n 's/^\([A-Za-z0-9][^ #]*==[^ #]*\).*/\1/p' "$repo/requirements/maxtext.txt" "$repo/requirements/tools.txt")
  missing_wheels "$py" "${specs[@]}"
  echo "setup_env.sh: creating $venv with $($py --version) (first run takes ~2-3 min)" >&2
  "$py" -m venv "$venv"
  [[ -n "$wheelhouse" ]] || pip_install --upgrade pip
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
  mapfile -t specs < <(sed -n 's/^\([A-Za-z0-9][^ #]*==[^ #]*\).*/\1/p' "$acc_reqs")
  missing_wheels "$venv/bin/python" "${specs[@]}"
  echo "setup_env.sh: adding JAX's $acc plugin to $venv (${acc_reqs#"$repo"/})" >&2
  pip_install -r "$acc_reqs" -c "$repo/requirements/constraints.txt"
fi
"$venv/bin/python" "$pins_py" finish "$repo" pinned > /dev/null   # the versions record, and the imports
printf '%s %s\n' "$acc" "$acc_hash" > "$acc_file"
import_roots
echo "$want" > "$stamp"
echo "setup_env.sh: environment ready ($acc) in $((SECONDS - start)) s" >&2
