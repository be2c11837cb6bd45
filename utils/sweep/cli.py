"""Usage: sweep.py KIND [MODEL[:TAG]] [options] [-- SBATCH_FLAG ... [-- KEY=VALUE ...]]

Drives an experiment sweep through submit.sh, waits for its jobs (polling `scontrol show job -o
ID`), reads each result with utils/triage.py (which reads the log through utils/joblog.py) and
reports what the sweep found.

  batch MODEL --values 1,2,4,8   batch-size search, one job per value (tag bs<value>); stops going
                                 up at the first out-of-memory; reports the best value
  nodes MODEL [--nodes all]      the same 1-node job on each node (sbatch -w NODE -N 1): tokens/s
                                 per node, outliers (median absolute deviation), failing nodes
  bisect MODEL --nodes LIST      2-node jobs over disjoint pairs, then each node of a bad pair with
                                 a node of a good one: which node makes multi-node jobs slow or fail
  regress MODEL --baseline JOB   reruns the baseline's MODEL:TAG, node count and MaxText overrides
                                 from the current code and compares steady tokens/s/device and
                                 final loss with it; the baseline's recorded sbatch flags and
                                 _env_ values are shown, and replayed only with --replay-sbatch /
                                 --replay-env (never a <redacted> value)
  models [--commits A,B]         every model (or --models LIST) at its config header's node count,
                                 synthetic data, on one commit or two side by side (a scratch
                                 clone per commit runs its own submit.sh); tokens/s deltas
  resume RECORD                  continues an interrupted sweep from its record
  show RECORD                    prints a record's report again (submits nothing)

After `--`: sbatch flags for every job; MaxText overrides (KEY=VALUE, _env_NAME=VALUE) after a
second `--`, or given directly as KEY=VALUE tokens.
Every sweep writes <workspace>/<user>/sweeps/<UTC time>-<kind>.json (each job's id, command and result),
updated as it goes. Ctrl-C, SIGTERM or SIGHUP cancel the jobs this sweep submitted, and only those.
--json prints the record for programs (docs/sweep.md).
Exit: 0 done; 1 done, but no job produced a measurement, or regress found a regression or its
rerun failed; 2 bad input (nothing submitted); 130 interrupted (its jobs cancelled).
"""

from __future__ import annotations

import argparse
import calendar
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trust
from diagnosis import cli, locate
from diagnosis.cli import InputError
from sweep import batch, bisect, models, nodes, regress
from sweep.args import (
    add_kind,
    nonempty_path,
)
from sweep.batch import batch_params, drive_batch
from sweep.bisect import (
    bisect_params,
    drive_bisect,
)
from sweep.common import (
    PROG,
    Interrupted,
    say,
)
from sweep.loop import Job, Options, Sweep
from sweep.models import (
    drive_models,
    models_params,
)
from sweep.nodes import drive_nodes, nodes_params
from sweep.record import emit, exit_code, load_record
from sweep.regress import (
    drive_regress,
    regress_params,
)

DRIVERS: dict[str, Callable[[Sweep], None]] = {
    "batch": drive_batch,
    "nodes": drive_nodes,
    "bisect": drive_bisect,
    "regress": drive_regress,
    "models": drive_models,
}


def execute(sw: Sweep, as_json: bool) -> int:
    """Plan, submit, wait and report; cancels the sweep's own jobs on a stop signal or an error."""
    driver = DRIVERS[sw.kind]
    if sw.opts.dry_run:
        driver(sw)
        sw.state = "dry_run"
        rec = sw.to_json()
        if sw.kind == "bisect":
            rec["notes"] += [
                "round 2 depends on round 1: each node of a slow or failed pair that no good pair "
                "cleared is run again with a node of a good pair (tag pair-NODE-GOOD)"
            ]
        emit(rec, as_json)
        return cli.OK
    if not shutil.which("sbatch") or not shutil.which("scontrol"):
        raise InputError(
            "sbatch/scontrol not found: run on a Slurm login node, or try Slurm on this machine: "
            'utils/local_cluster.sh up 2 (installs Slurm as root), then eval "$(utils/local_cluster.sh env)"'
        )
    if sw.record is None:
        sw.open_record()
    say(f"record: {sw.record}")
    for n in sw.params.get("notes", []):
        say(f"note: {n}")

    def on_signal(signum: int, _frame: object) -> None:
        sw.stop_requested = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        driver(sw)
        sw.state = "stopped" if sw.stop_reason else "done"
    except Interrupted as e:
        for s in old:
            signal.signal(s, signal.SIG_IGN)  # finish the clean-up whatever arrives now
        ids = sw.cancel_active(f"sweep stopped by {e}")
        say(f"stopped by {e}: cancelled the sweep's job(s) {' '.join(ids) or '(none running)'}")
        sw.state = "interrupted"
    except BaseException:
        ids = sw.cancel_active("the sweep failed")
        sw.state = "error"
        sw.save()
        say(f"internal error: cancelled the sweep's job(s) {' '.join(ids) or '(none running)'}")
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    sw.save()
    emit(sw.to_json(), as_json)
    return exit_code(sw)


def resume(a: argparse.Namespace) -> int:
    """Go on with a record: ended jobs are kept, running ones waited for, the rest (re)submitted."""
    path = a.record
    try:  # its commands are submitted again: only a record nobody else can have written
        trust.check(path, "the sweep record", "resume only a record of your own")
    except trust.UntrustedPath as e:
        raise InputError(str(e)) from None
    rec = load_record(path)
    o = rec["options"]
    opts = Options(
        Path(rec["workspace"]), a.timeout or o["timeout"], a.max_parallel or o["max_parallel"], a.poll or o["poll"]
    )
    sw = Sweep(rec["sweep"], rec["model"], rec["params"], opts, rec["argv"])
    sw.jobs = [Job.from_json(j) for j in rec["jobs"]]
    sw.decisions = list(rec.get("decisions") or [])  # kept; a stopped sweep resumed runs its skipped jobs
    for j in sw.jobs:
        if j.status == "submitted":
            j._t0 = time.time()
        if j.status in ("interrupted", "skipped", "submit_failed"):
            if j.job_id:
                j.previous_job_ids.append(j.job_id)
            j.status, j.job_id, j.note = "planned", None, ""
    sw.record = path
    sw.started_at = calendar.timegm(time.strptime(rec["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
    return execute(sw, a.json)


def build_parser() -> argparse.ArgumentParser:
    doc = (__doc__ or "").strip()
    ap = cli.Parser(
        prog=PROG,
        usage=doc.splitlines()[0].removeprefix("Usage: "),
        description="\n".join(doc.splitlines()[2:]),
    )
    common = cli.Parser(add_help=False)
    common.add_argument(
        "--workspace", type=nonempty_path, help="job workspace (default $JOB_WORKSPACE or <repo>/outputs)"
    )
    common.add_argument("--dry-run", action="store_true", help="print the submit commands; submit nothing")
    common.add_argument(
        "--timeout",
        type=cli.positive_float,
        default=3600.0,
        help="seconds a job may take from submission before the sweep cancels it (default 3600)",
    )
    common.add_argument("--max-parallel", type=cli.positive_int, default=1, help="jobs in flight at once (default 1)")
    common.add_argument(
        "--poll", type=cli.positive_float, default=2.0, help="seconds between scontrol polls (default 2)"
    )
    common.add_argument("--json", action="store_true", help="print the record as JSON (for agents and scripts)")
    sub = ap.add_subparsers(dest="kind", required=True, parser_class=cli.Parser, metavar="KIND")

    for kind in (batch, models, nodes, bisect, regress):  # the order --help lists them in
        kind.add_parser(sub, common)

    x = add_kind(sub, "resume", "continue an interrupted sweep", _json_only())
    x.add_argument("record", type=nonempty_path, metavar="RECORD")
    x.add_argument("--timeout", type=cli.positive_float, help="per-job timeout (default: the record's)")
    x.add_argument("--max-parallel", type=cli.positive_int, help="jobs in flight at once (default: the record's)")
    x.add_argument("--poll", type=cli.positive_float, help="seconds between polls (default: the record's)")
    x = add_kind(sub, "show", "print a record's report", _json_only())
    x.add_argument("record", type=nonempty_path, metavar="RECORD")
    return ap


def _json_only() -> argparse.ArgumentParser:
    p = cli.Parser(add_help=False)
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, passthrough = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    a = build_parser().parse_args(head)
    try:
        if a.kind == "show":
            emit(load_record(a.record), a.json)
            return cli.OK
        if a.kind == "resume":
            return resume(a)
        workspace = (a.workspace or locate.default_workspace()).absolute()
        if workspace.exists() and not workspace.is_dir():
            raise InputError(f"workspace {workspace} is not a directory (set --workspace or JOB_WORKSPACE)")
        if a.kind == "regress":
            params = regress_params(a, passthrough, workspace)
        else:
            params = {"batch": batch_params, "nodes": nodes_params, "bisect": bisect_params, "models": models_params}[
                a.kind
            ](a, passthrough)
        opts = Options(workspace, a.timeout, a.max_parallel, a.poll, a.dry_run)
        return execute(Sweep(a.kind, params["model"], params, opts, argv), a.json)
    except InputError as e:
        return cli.fail(PROG, e)
