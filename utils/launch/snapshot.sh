#!/usr/bin/env bash
# Usage: utils/launch/snapshot.sh REPO DEST_PARENT COMMAND_TEXT
#
# Makes an immutable copy of REPO's code (tracked and untracked-but-not-ignored files;
# everything but .git/.venv/outputs/.submit when REPO is not a git checkout, e.g. a snapshot; never
# tests/, which no job runs and which is most of the bytes every node copies and hashes) under a new directory
# DEST_PARENT/<UTC time>-<random>/ (DEST_PARENT: the user's $JOB_WORKSPACE/<user>/.snapshots, which
# must exist and be ours to trust: not a link, writable by nobody else), records the submit command (as shown, secrets redacted by the
# caller) and the git state in its .submit/ folder, makes the copy read-only and prints its path.
set -euo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
(( $# == 3 )) || { echo "snapshot.sh: expected REPO DEST_PARENT COMMAND_TEXT (see --help)" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
repo=$1 parent=$2 cmd=$3

check_trusted "$parent" "the snapshot directory" "the launcher makes it in your own \$JOB_WORKSPACE/<user>/"
dest=$(mktemp -d "$parent/$(date -u +%Y%m%dT%H%M%SZ)-XXXXXX")
chmod 755 "$dest"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$repo" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [[ "$f" != tests/* && -e "$repo/$f" ]] && printf '%s\0' "$f"; done |
    tar -C "$repo" --null -T - -cf - | tar -C "$dest" -xf -
else
  tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude=./outputs --exclude=./.submit --exclude=./tests -cf - . | tar -C "$dest" -xf -
fi

mkdir "$dest/.submit"
printf '%s\n' "$cmd" > "$dest/.submit/command.txt"
{
  echo "submitted: $(date -u +%Y-%m-%dT%H:%M:%SZ) by ${USER:-$(id -un)} on $(hostname)"
  echo "source: $repo"
  if git -C "$repo" rev-parse HEAD >/dev/null 2>&1; then
    echo "commit: $(git -C "$repo" rev-parse HEAD)"
    echo "branch: $(git -C "$repo" rev-parse --abbrev-ref HEAD)"
    echo "status:"
    git -C "$repo" status --short | sed 's/^/  /'
  else
    echo "commit: none (not a git checkout)"
  fi
} > "$dest/.submit/git.txt"
git -C "$repo" diff HEAD > "$dest/.submit/git.diff" 2>/dev/null || : > "$dest/.submit/git.diff"
chmod -R a-w "$dest"
printf '%s\n' "$dest"
