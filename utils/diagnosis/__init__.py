"""The offline diagnosis tools: they read what a job left behind (its log, job directory and TSDB)
and never run inside a job.

    tsdb             a saved TSDB served by utils/prometheus.sh, queried over HTTP
    failure_classes  the failure-class registry triage decides from
    triage           job log -> status, failure class, culprit hosts, next steps
    diagnose         TSDB -> verdict (network, GPU, CPU, I/O, memory, hang, ...) with evidence
    evidence, load, checks   diagnose's data model, its queries, the registry of its checks
    report           diagnose --report: the HTML page, from the report's data (evidence only)
    perf             step lines and profiler traces -> TGS, TFLOP/s, MFU, where time goes
    jobdir           the job directory read in one place: paths, listing, header, summary, planned steps
    scheduler        the only place that asks Slurm (job state, the user's jobs, queue owners)
    min_nodes        a job's node count against its config's minimum-nodes header
    investigate      triage, then diagnose and perf where the skills hand over: one evidence bundle
    entry            how the thin commands in utils/ start a tool under the project's Python

Users run the thin commands (utils/triage.py, utils/diagnose.py, utils/perf.py, utils/investigate.py);
tests and benchmarks import the modules. The sweep (utils/sweep/) and the job monitor (utils/monitor/)
build on this package; it imports neither (utils/dev/import_graph.py checks). The log format's one
parser is utils/joblog.py, beside it: the launcher, the monitor and the sweep read logs too.
"""
