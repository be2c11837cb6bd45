"""The sweep: it plans, submits, waits for and compares experiment jobs (utils/sweep.py). It sits
above the diagnosis tools and the job monitor, whose rules it uses on its running jobs; neither
imports it (utils/dev/import_graph.py checks).

    cli       the command line (build_parser, main), running a sweep, resume
    common    names, constants and small helpers every part shares; the user's sweeps folder
    args      MODEL[:TAG], the flags and overrides after `--`, the submit.sh command of a job
    slurm     the usable nodes (sinfo) and scancel of the sweep's own jobs
    loop      Job and Sweep: submit, poll, the failure policy, the record file
    policy    the one failure policy: what a sweep does with a job that measured nothing
    record    the report (text and --json), the exit status, reading a record back
    batch  nodes  bisect  regress  models   one module per kind: its jobs, its result, its options
"""
