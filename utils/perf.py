#!/bin/sh
""":"
# sh reads these lines, Python a string: the command starts once, under the project's environment
# (MAXTEXT_SLURM_VENV, default <repo>/.venv) when it has a python, else under the first python3 on PATH
# (utils/entry.py then says what to set up; any python3 may also run this file itself).
me=$(readlink -f "$0" 2>/dev/null) || me=$0
py=${MAXTEXT_SLURM_VENV:-${me%/*}/../.venv}/bin/python
[ -x "$py" ] || py=python3
exec "$py" "$0" "$@"
":"""
# Thin command: runs diagnosis/perf.py under the project's Python (see utils/perf.py --help).

import entry

entry.run("perf")
