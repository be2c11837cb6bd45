#!/usr/bin/env bash
# Usage: utils/launch/snapshot.sh REPO DEST_PARENT COMMAND_TEXT
#
# Makes an immutable copy of REPO's code under a new directory DEST_PARENT/<UTC time>-<random>/
# (DEST_PARENT: the user's $JOB_WORKSPACE/<user>/.snapshots, which must exist and be ours to trust:
# not a link, writable by nobody else), records the submit command (as shown, secrets redacted by
# the caller) and the git state in its .submit/ folder, makes the copy read-only and prints its path.
#
# Which files, whatever the git state around REPO:
#   - REPO is the top of its own git work tree (`git rev-parse --show-toplevel` is REPO): its
#     tracked files and its untracked files that are not ignored (git ls-files), as they are now;
#   - otherwise (a snapshot, which has no .git, e.g. an --auto-recover resubmission from a
#     snapshot under the git-ignored outputs/; a release unpacked inside another git checkout;
#     a directory that an outer checkout ignores; no git at all): the whole tree, less .git,
#     .venv, outputs, .local_cluster, .submit (the source snapshot's record) and every
#     __pycache__/*.pyc (caches, not code). .submit/git.txt then says "not a git checkout of its
#     own" and, for a snapshot, carries the source snapshot's own record (and git.diff its diff);
#     a checkout that git will not read here (e.g. "dubious ownership"): "commit: unknown (why)".
# Never tests/ (no job runs it; most of the bytes every node copies and hashes), and never the job
# workspace (DEST_PARENT/../..) when it lies inside REPO.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
(( $# == 3 )) || { echo "snapshot.sh: expected REPO DEST_PARENT COMMAND_TEXT (see --help)" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
repo=$1 parent=$2 cmd=$3

check_trusted "$parent" "the snapshot directory" "the launcher makes it in your own \$JOB_WORKSPACE/<user>/"
real=$(cd "$repo" && pwd -P) || die "no repository directory '$repo'"
ws=$(cd "$parent/../.." && pwd -P)
skip=   # the workspace, relative to REPO, when it lies inside REPO (a workspace of its own choosing)
[[ "$ws" == "$real"/* ]] && skip=${ws#"$real"/}
own_git=0 why=
top=$(git -C "$real" rev-parse --show-toplevel 2>&1) || why=$(head -n1 <<< "$top")
[[ "$top" == "$real" ]] && own_git=1

dest=$(mktemp -d "$parent/$(date -u +%Y%m%dT%H%M%SZ)-XXXXXX")
chmod 755 "$dest"
if (( own_git )); then
  git -C "$real" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do
      [[ "$f" != tests/* && ( -z "$skip" || "$f" != "$skip"/* ) && ( -e "$real/$f" || -L "$real/$f" ) ]] &&
        printf '%s\0' "$f"
    done |
    tar -C "$real" --null -T - -cf - | tar -C "$dest" -xf -
else
  excl=(--exclude=./.git --exclude=./.venv --exclude=./outputs --exclude=./.local_cluster --exclude=./.submit
        --exclude=./tests --exclude=__pycache__ --exclude='*.pyc')
  [[ -z "$skip" ]] || excl+=("--exclude=./$skip")
  tar -C "$real" "${excl[@]}" -cf - . | tar -C "$dest" -xf -
fi

mkdir "$dest/.submit"
printf '%s\n' "$cmd" > "$dest/.submit/command.txt"
from=$real/.submit   # the source's own record when the source is a snapshot
{
  echo "submitted: $(date -u +%Y-%m-%dT%H:%M:%SZ) by ${USER:-$(id -un)} on $(hostname)"
  echo "source: $repo"
  if (( own_git )) && git -C "$real" rev-parse HEAD >/dev/null 2>&1; then
    echo "commit: $(git -C "$real" rev-parse HEAD)"
    echo "branch: $(git -C "$real" rev-parse --abbrev-ref HEAD)"
    echo "status:"
    git -C "$real" status --short | sed 's/^/  /'
  elif (( own_git )); then
    echo "commit: none (a git checkout without a commit yet)"
  elif [[ -e "$real/.git" ]]; then   # a checkout that git refuses to read here (e.g. "dubious ownership")
    echo "commit: unknown (git cannot read this checkout: ${why:-no work tree}; the whole tree was copied)"
  else
    echo "commit: none (not a git checkout of its own; the whole tree was copied)"
    if [[ -f "$from/git.txt" && ! -L "$from/git.txt" ]]; then
      echo "source snapshot's record ($from/git.txt):"
      sed 's/^/  /' "$from/git.txt"
    fi
  fi
} > "$dest/.submit/git.txt"
if (( own_git )); then
  git -C "$real" diff HEAD > "$dest/.submit/git.diff" 2>/dev/null || : > "$dest/.submit/git.diff"
elif [[ -f "$from/git.diff" && ! -L "$from/git.diff" && -f "$from/git.txt" && ! -L "$from/git.txt" ]]; then
  cat "$from/git.diff" > "$dest/.submit/git.diff"
else
  : > "$dest/.submit/git.diff"
fi
chmod -R a-w "$dest"
printf '%s\n' "$dest"
