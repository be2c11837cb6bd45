#!/usr/bin/env bash
# Usage: utils/answer.sh TOOL JOB [TOOL_OPTION ...] [--fresh]
#
# The saved --json answer of a diagnosis tool for a job: prints the path of a file that holds
# `utils/TOOL.py JOB [TOOL_OPTION ...] --json`, running the tool only when no answer for the same
# job, options and log (its size and modification time) is saved yet. The agents' skills use it to
# ask a tool once and query the file with jq for every question, instead of running the tool again.
#   TOOL      triage, diagnose, perf or investigate
#   JOB       what the tool takes: a job id, job name, job directory or log file
#   --fresh   run the tool again (the answer is kept until the job's log or TSDB changes)
# Answers live in ${XDG_CACHE_HOME:-~/.cache}/maxtext-slurm/answers (mode 0700, files 0600). When the
# tool fails, its stderr is passed on, nothing is saved and the exit status is the tool's.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$repo/utils/launch/lib.sh"; usage; exit; }
PROG=answer.sh
bad() { printf '%s: %s\n' "$PROG" "$*" >&2; exit 2; }

(($# >= 2)) || bad "expected TOOL JOB [TOOL_OPTION ...] (see --help)"
tool=$1 job=$2
shift 2
case "$tool" in
  triage | diagnose | perf | investigate) ;;
  *) bad "unknown TOOL '$tool': expected triage, diagnose, perf or investigate" ;;
esac
[[ -n "$job" ]] || bad "empty JOB: give a job id, job name, job directory or log file"
fresh=0 opts=()
for a in "$@"; do
  case "$a" in
    --fresh) fresh=1 ;;
    --json) ;;
    *) opts+=("$a") ;;
  esac
done

# what the answer depends on: the job (locate.py's rule: its real path, its log's and TSDB's size and
# time; jobdir.fingerprint, the MCP server's cache key too) and the options. A JOB that names no job:
# the tool says why.
venv=${MAXTEXT_SLURM_VENV:-$repo/.venv}
py=python3
if [[ -x "$venv/bin/python" ]]; then py=$venv/bin/python; fi
if ! depends=$(PYTHONPATH="$repo/utils${PYTHONPATH:+:$PYTHONPATH}" "$py" -m diagnosis.locate key "$job" 2>/dev/null); then
  "$repo/utils/$tool.py" "$job" "${opts[@]}" --json >/dev/null  # its one line says why; its exit status
  bad "$job names no job that can be kept an answer for"
fi
key=$(printf '%s\0' "$tool" "$depends" "${opts[@]}" | sha256sum | cut -c1-24)

dir=${XDG_CACHE_HOME:-$HOME/.cache}/maxtext-slurm/answers
mkdir -p "$dir"
chmod 700 "$dir"
out="$dir/$tool-$key.json"
if ((fresh)) || [[ ! -s "$out" ]]; then
  tmp=$(mktemp "$dir/.$tool.XXXXXX")
  rc=0
  "$repo/utils/$tool.py" "$job" "${opts[@]}" --json >"$tmp" || rc=$?
  if ((rc != 0)); then
    rm -f "$tmp"
    exit "$rc"
  fi
  mv -f "$tmp" "$out"
fi
printf '%s\n' "$out"
