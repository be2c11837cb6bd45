"""The offline diagnosis tools (triage, diagnose, perf, investigate, verify, run): they read what a job
left behind (its log, job directory and TSDB) and never run inside a job. docs/layout.md lists the
modules, one line each.

Users run the thin commands in utils/ (utils/triage.py ...); tests and benchmarks import the modules.
The sweep (utils/sweep/) and the job monitor (utils/monitor/) build on this package; it imports
neither (utils/dev/import_graph.py checks). The log format's one parser is utils/joblog.py, beside it:
the launcher, the monitor and the sweep read logs too.
"""
