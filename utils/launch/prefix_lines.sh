#!/usr/bin/env bash
# Usage: utils/launch/prefix_lines.sh HOST [--with perl|python3|bash]
#
# Copies standard input to standard output with "HOST: " before every line, one write per line
# as soon as the line is complete (a hung trainer's last line reaches the log at once). Lines that
# already start with "<node>: " for a node of $JOB_NODELIST (space-separated; the Ray driver relays
# other nodes' lines) are copied as they are. Every byte is kept: lines of any length (held whole
# in memory), invalid UTF-8, a last line without newline (one is added). The bash fallback alone
# drops NUL bytes (bash cannot hold them).
#
# It does not use awk or sed: Ubuntu 24.04's mawk (1.3.4 20240123) under -W interactive cuts a
# line over 4096 bytes and drops every later line (issue 20), and GNU sed -u reads one byte per
# system call. It uses the first of perl (Essential on Debian/Ubuntu), python3, bash that runs;
# --with picks one (tests, bench/log_prefixer.py). Measured: bench/log_prefixer.py.
set -uo pipefail
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; usage; exit; }
[[ $# == 1 || ($# == 3 && "$2" == --with) ]] || { echo "prefix_lines.sh: expected HOST [--with perl|python3|bash] (see --help)" >&2; exit 2; }
export LC_ALL=C MST_PREFIX_HOST=$1 MST_PREFIX_KNOWN=" ${JOB_NODELIST:-} "
with=${3:-}
if [[ -z "$with" ]]; then
  if perl -e 1 2>/dev/null; then with=perl
  elif python3 -I -c '' 2>/dev/null; then with=python3
  else with=bash; fi
fi

# shellcheck disable=SC2016  # the perl and python programs
case $with in
  perl) exec perl -e '
    binmode STDIN; binmode STDOUT; $| = 1;
    my $h = $ENV{MST_PREFIX_HOST};
    my %known = map { $_ => 1 } split " ", $ENV{MST_PREFIX_KNOWN};
    while (defined(my $l = <STDIN>)) {
      $l .= "\n" unless substr($l, -1) eq "\n";
      my $p = index($l, ": ");
      print(($p > 0 && $known{substr($l, 0, $p)}) ? $l : "$h: $l");
    }' ;;
  python3) exec python3 -I -c '
import os, sys
h = os.environb[b"MST_PREFIX_HOST"] + b": "
known = set(os.environb[b"MST_PREFIX_KNOWN"].split())
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    if not line.endswith(b"\n"):
        line += b"\n"
    p = line.find(b": ")
    out.write(line if p > 0 and line[:p] in known else h + line)
    out.flush()' ;;
  bash)
    line=""
    while IFS= read -r line || [[ -n "$line" ]]; do
      pre=${line%%": "*}
      if [[ "$pre" != "$line" && -n "$pre" && "$pre" != *" "* && "$MST_PREFIX_KNOWN" == *" $pre "* ]]; then
        printf '%s\n' "$line"
      else
        printf '%s: %s\n' "$MST_PREFIX_HOST" "$line"
      fi
    done ;;
  *) echo "prefix_lines.sh: --with takes perl, python3 or bash, not '$with'" >&2; exit 2 ;;
esac
