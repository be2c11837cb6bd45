"""Usage: run.py ALIAS [--workspace DIR] [--json] [--checkpoint-every SECONDS]

A run (--run ALIAS) as one object, from its jobs' logs: each job's nodes, how it ended, the steps it
trained and the ones a later job trained again, and where the allocated time went. Its jobs are the
logs of the workspace, yours, whose JOB header names the run (`run: ALIAS <workspace>/<you>/runs/ALIAS
...`), in the order they started (docs/runs.md). For each job, from its log alone (nothing asks Slurm):
  queued      its start (the header's started:) minus its submission (the UTC time in the name of the
              code snapshot submit.sh made, the header's code: line)
  start-up    its start to the start of its first step (image, preflight, Python, compilation,
              the checkpoint's restore)
  productive  MaxText's step times (the step lines' `seconds:`) of the steps no later job trained again
  redone      the step times of the steps a later job trained again (lost since the last checkpoint)
  other       the rest of its wall time (checkpoint saves between steps, a hang, the end)
and, for a run that continues by itself (--continue), what each job decided at its end (its log's
`run_next:` line: the next job goes on, or the run stops and why). A requeued job (Slurm reran it
under its id, appending to its log) counts each of its runs as a job: ID#1, ID#2, ...
Goodput is the run's productive step time over its allocated time (each job's wall time), both
weighted by the job's node count. Exit 0 with the report; 2 with one line for bad input (no such run).
--checkpoint-every SECONDS prints instead one line, "N WHY": the checkpoint_period in steps that
saves about every SECONDS at the median step time of the run's latest job that trained (its first
steps left out), or "- WHY" when no job of the run has measured one yet (submit.sh and run_local.sh
--checkpoint-every use it).
"""

from __future__ import annotations

import os
import pwd
import re
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import joblog
from diagnosis import cli, jobdir, locate

SNAPSHOT_TIME = re.compile(r"/\.snapshots/(\d{8}T\d{6}Z)-")  # utils/launch/snapshot.sh: <UTC time>-<random>
WALL = re.compile(r"\((\d+) s\)")  # the JOB SUMMARY's wall_time: "00:01:10 (70 s)"
ALIAS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")  # utils/launch/run_alias.sh check_run_alias


def _snapshot_time(code: str) -> float | None:
    """When submit.sh made the job's code snapshot (the header's code: path), in unix seconds."""
    m = SNAPSHOT_TIME.search(code)
    return datetime.strptime(m.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp() if m else None


def _job(log: Path, scan: joblog.Scan) -> dict[str, Any]:
    """One job of the run: what its log says (times in unix seconds, durations in seconds)."""
    head, summ, st = scan.header, scan.summary, scan.steps
    job_id, name = locate.job_id_and_name(scan, log)
    started = jobdir.started(head)
    submitted = _snapshot_time(head.get("code", ""))
    w = WALL.search(summ.get("wall_time", ""))
    seconds: dict[int, float] = {}  # step -> its time (a log without host prefixes repeats each step)
    first_ts = None  # when the first step began: its line's time less its step time
    for i, step in enumerate(st.step):
        if step not in seconds:
            seconds[step] = st.seconds[i]
        if first_ts is None and st.ts(i) is not None:
            first_ts = st.ts(i) - st.seconds[i]
    run = joblog.run_of(scan) or {}
    return {
        "id": job_id,
        "name": name,
        "log": str(log),
        "nodes": scan.nodes(),
        "status": summ.get("status") or "running or cut off",
        "stage": summ.get("stage"),
        "submitted": submitted,
        "started": started,
        "wall_seconds": float(w.group(1)) if w else None,
        "first_step_at": first_ts,  # unix s the first step began
        "restored_from_step": run.get("restored_from_step"),
        "checkpoint_at_start": run.get("checkpoint_at_start"),
        "run_next": joblog.run_next_end(scan.run_next),  # --continue: what the job decided at its end
        "_seconds": seconds,
    }


def run_dir(alias: str, workspace: Path) -> Path:
    """$JOB_WORKSPACE/<user>/runs/ALIAS, the user as `id -un` names them (utils/launch/run_alias.sh run_dir)."""
    return workspace / pwd.getpwuid(os.geteuid()).pw_name / "runs" / alias


def latest_checkpoint(alias: str, workspace: Path) -> int | None:
    """The highest step saved in the run's checkpoint directory now (all-digit names only: Orbax renames
    a step's temporary directory to its number when it is complete; utils/launch/run_alias.sh's rule)."""
    d = run_dir(alias, workspace) / "checkpoints"
    try:
        steps = [int(e.name) for e in os.scandir(d) if e.name.isdigit() and e.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    return max(steps, default=None)


def logs_of(alias: str, workspace: Path) -> list[tuple[Path, dict[str, str]]]:
    """The run's job logs in the workspace with their headers: logs of ours whose header's `run:` names
    the run's directory in our own root, oldest start first (their headers only are read)."""
    mine = os.path.realpath(run_dir(alias, workspace))
    out = []
    try:
        entries = sorted(jobdir.listing(workspace))
    except OSError as e:
        raise cli.InputError(
            f"cannot read workspace {workspace}: {e.strerror or e} (set --workspace or JOB_WORKSPACE)"
        ) from None
    for name, path in entries:
        if path.is_dir() or not name:
            continue
        try:
            if path.stat().st_uid != os.geteuid():  # someone else's log says nothing about our run
                continue
        except OSError:
            continue
        head = jobdir.header(path)
        words = head.get("run", "").split()
        if len(words) < 2 or words[0] != alias or os.path.realpath(words[1]) != mine:
            continue
        out.append((path, head))
    out.sort(key=lambda p: jobdir.started(p[1]) or 0)
    return out


def jobs_of(alias: str, workspace: Path) -> list[dict[str, Any]]:
    """The run's jobs in the workspace (logs of ours whose header names the run), oldest first; a
    requeued job's runs (Slurm reran it under its id, in the same log) each count as a job of their
    own, with `attempt` K of `attempts`."""
    out = []
    for path, _ in logs_of(alias, workspace):
        scans = joblog.scan_runs(path)
        for k, scan in enumerate(scans, 1):
            out.append({**_job(path, scan), "attempt": k, "attempts": len(scans)})
    out.sort(key=lambda j: (j["started"] or 0, int(j["id"]) if str(j["id"]).isdigit() else 0, j["attempt"]))
    return out


def startups(alias: str, workspace: Path, before: float | None) -> list[float]:
    """The start-up (start to the first step) of each job of the run that started before BEFORE (unix
    s: the start of the job asking) and reached a step: the job monitor's first-step limit."""
    limit = before or float("inf")
    return [
        j["first_step_at"] - j["started"]
        for j in jobs_of(alias, workspace)
        if j["started"] is not None and j["started"] < limit and j["first_step_at"] is not None
    ]


def checkpoint_period(alias: str, workspace: Path, seconds: float) -> tuple[int | None, str]:
    """(steps, why): the checkpoint_period that saves about every SECONDS at the median step time of
    the run's latest job with steady steps (its first joblog.WARMUP_STEPS steps left out); (None, why)
    before any job of the run measured one."""
    try:
        jobs = jobs_of(alias, workspace)
    except cli.InputError:
        jobs = []
    for j in reversed(jobs):
        steps = sorted(j["_seconds"])
        steady = [j["_seconds"][s] for s in steps[joblog.WARMUP_STEPS :]]
        if steady:
            med = statistics.median(steady)
            n = max(1, int(seconds // med)) if med > 0 else 1
            return n, f"every {seconds:g} s at the median step time {med:.3g} s of job {j['id']}'s {len(steady)} steps"
    return None, f"no job of run {alias} has measured a step time yet: checkpoint_period stays as configured"


def _queued(j: dict[str, Any], jobs: list[dict[str, Any]]) -> float | None:
    """From the job's submission, or from the end of an earlier job of the run that ended after it (a job
    queued behind another, as --continue queues them, waits for that one first), to its start."""
    if not (j["started"] and j["submitted"]):
        return None
    ends = [
        k["started"] + k["wall_seconds"]
        for k in jobs
        if k is not j and k["started"] and k["wall_seconds"] is not None and k["started"] < j["started"]
    ]
    since = max([j["submitted"], *(e for e in ends if e <= j["started"])])
    return round(j["started"] - since, 3)


def account(alias: str, workspace: Path) -> dict[str, Any]:
    """The run's report (docs/runs.md): its jobs, the steps trained and redone, time by kind, goodput."""
    if not ALIAS.fullmatch(alias):
        raise cli.InputError(f"bad run alias '{alias}': use letters, digits, . _ - only, as given to --run")
    jobs = jobs_of(alias, workspace)
    if not jobs:
        raise cli.InputError(f"no job of run '{alias}' in {workspace} (submit.sh ... --run {alias} starts one)")
    later: set[int] = set()
    for j in reversed(jobs):  # a step is redone when a later job trained it again
        steps = j.pop("_seconds")
        redone = {s: t for s, t in steps.items() if s in later}
        kept = {s: t for s, t in steps.items() if s not in later}
        later |= set(steps)
        j["steps"] = [min(steps), max(steps)] if steps else None
        j["steps_trained"] = len(steps)
        j["steps_redone"] = len(redone)
        wall = j["wall_seconds"]
        startup = (j["first_step_at"] - j["started"]) if (j["first_step_at"] and j["started"]) else None
        if startup is None and not steps and wall is not None:
            startup = wall  # it never reached a step
        productive, lost = sum(kept.values()), sum(redone.values())
        if startup is not None and wall is not None:
            # the step times are MaxText's own; the first step's start comes from when its line was
            # logged, late under load (a line waits in a pipe): start-up gets what the steps leave
            startup = max(0.0, min(startup, wall - productive - lost))
        other = max(0.0, wall - (startup or 0) - productive - lost) if wall is not None else None
        j["time"] = {
            "queued": _queued(j, jobs),
            "startup": None if startup is None else round(startup, 3),
            "productive": round(productive, 3),
            "redone": round(lost, 3),
            "other": None if other is None else round(other, 3),
        }
    n = [max(1, len(j["nodes"])) for j in jobs]
    allocated = sum(k * j["wall_seconds"] for k, j in zip(n, jobs, strict=True) if j["wall_seconds"] is not None)
    productive = sum(k * j["time"]["productive"] for k, j in zip(n, jobs, strict=True) if j["wall_seconds"] is not None)
    totals = {
        kind: round(sum(k * (j["time"][kind] or 0) for k, j in zip(n, jobs, strict=True)), 3)
        for kind in ("queued", "startup", "productive", "redone", "other")
    }
    last = jobs[-1]
    planned = jobdir.planned_steps(jobdir.header(Path(last["log"])), jobdir.dir_of(Path(last["log"])))
    highest = max((j["steps"][1] for j in jobs if j["steps"]), default=None)
    return {
        "run": alias,
        "workspace": str(workspace),
        "jobs": jobs,
        "planned_steps": planned,
        "highest_step": highest,
        "done": bool(planned is not None and highest is not None and highest >= planned - 1),
        "steps_trained": sum(j["steps_trained"] for j in jobs),
        "steps_redone": sum(j["steps_redone"] for j in jobs),
        "node_seconds": {"allocated": round(allocated, 3), **totals},
        "goodput": round(productive / allocated, 4) if allocated > 0 else None,
    }


def _hms(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _label(j: dict[str, Any]) -> str:
    """The job's id; ID#K for the K-th run of a requeued job."""
    return f"{j['id']}#{j['attempt']}" if j["attempts"] > 1 else str(j["id"])


def render(r: dict[str, Any]) -> str:
    planned = f" of {r['planned_steps']}" if r["planned_steps"] is not None else ""
    highest = "none" if r["highest_step"] is None else f"0..{r['highest_step']}"
    lines = [
        f"run {r['run']}: {len(r['jobs'])} job(s), steps {highest}{planned} ({'done' if r['done'] else 'not done'}); "
        f"{r['steps_trained']} steps trained, {r['steps_redone']} of them again by a later job",
        "goodput: "
        + ("-" if r["goodput"] is None else f"{100 * r['goodput']:.1f} %")
        + " (productive step time / allocated node time)",
        "node time: " + ", ".join(f"{k} {_hms(v)}" for k, v in r["node_seconds"].items()),
    ]
    w = max([3] + [len(_label(j)) for j in r["jobs"]])
    lines.append(
        f"{'job':<{w}} {'status':<18} {'nodes':>5} {'started (UTC)':<20} {'queued':>8} {'wall':>8} "
        f"{'steps':<12} {'redone':>6} {'start-up':>8} {'productive':>10}"
    )
    for j in r["jobs"]:
        started = datetime.fromtimestamp(j["started"], UTC).strftime("%Y-%m-%dT%H:%M:%S") if j["started"] else "-"
        steps = f"{j['steps'][0]}..{j['steps'][1]}" if j["steps"] else "none"
        t = j["time"]
        lines.append(
            f"{_label(j):<{w}} {j['status']:<18} {len(j['nodes']):>5} {started:<20} {_hms(t['queued']):>8} "
            f"{_hms(j['wall_seconds']):>8} {steps:<12} {j['steps_redone']:>6} {_hms(t['startup']):>8} "
            f"{_hms(t['productive']):>10}"
        )
    lines += [f"{_label(j):<{w}} run_next: {j['run_next']}" for j in r["jobs"] if j["run_next"]]
    return "\n".join(lines)


OPTIONS = (
    cli.JSON,
    cli.WORKSPACE,
    cli.Option(
        "checkpoint_every",
        "print the checkpoint_period that saves every SECONDS (see above) instead of the report",
        float,
        gt=0,
        metavar="SECONDS",
        must="a positive number of seconds",
        cli_only="the launcher's question (submit.sh --checkpoint-every)",
    ),
)


def build_parser() -> cli.Parser:
    return cli.tool_parser(
        "run.py", __doc__, "ALIAS", "the run's alias, as given to submit.sh / run_local.sh --run", OPTIONS
    )


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    ws = a.workspace or locate.default_workspace()
    if a.checkpoint_every is not None:
        if not ALIAS.fullmatch(a.alias):
            return cli.fail("run.py", f"bad run alias '{a.alias}': use letters, digits, . _ - only, as given to --run")
        n, why = checkpoint_period(a.alias, ws, a.checkpoint_every)
        print(f"{'-' if n is None else n} {why}")
        return cli.OK
    try:
        r = account(a.alias, ws)
    except cli.InputError as e:
        return cli.fail("run.py", e)
    cli.emit(r, a.json, render)
    return cli.OK
