"""The offline diagnosis tools: they read what a job left behind (its log, job directory and TSDB)
and never run inside a job.

    joblog           the one parser of the launcher's log format (headers, stages, steps, errors)
    tsdb             a saved TSDB served by utils/prometheus.sh, queried over HTTP
    failure_classes  the failure-class registry triage decides from
    triage           job log -> status, failure class, culprit hosts, next steps
    diagnose         TSDB -> verdict (network, GPU, CPU, I/O, memory, hang, ...) with evidence
    perf             step lines and profiler traces -> TGS, TFLOP/s, MFU, where time goes
    sweep            plan, run and compare sweeps, node bisection and regression replays
    investigate      triage, then diagnose and perf where the skills hand over: one evidence bundle
    entry            how the thin commands in utils/ start a tool under the project's Python

Users run the thin commands (utils/triage.py, utils/diagnose.py, utils/perf.py, utils/sweep.py,
utils/investigate.py); tests and benchmarks import the modules.
"""
