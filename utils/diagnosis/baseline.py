"""Which run to compare a job with: the one rule of `diagnose.py --vs auto`, of the baseline
investigate.py compares with when the metrics alone find nothing, and of the MCP tools' `vs auto`
(skills/tsdb-diagnosis step 5).

The baseline is the nearest clean run of the same model by time, before or after the job: another
job directory of the job's own workspace (the directory that holds the job, whatever JOB_WORKSPACE
says) with a TSDB, the same `model:` in its JOB header, a JOB SUMMARY that says `completed` and a
log that triage reads as completed with no failure class, whose TSDB's time range does not overlap
the job's. Runs that share hosts with the job come first; among them (or, when none shares a host,
among all) the one whose time range is nearest to the job's wins (ties: more shared hosts, then the
later one).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from diagnosis import jobdir, triage
from diagnosis.cli import InputError

RULE = "the nearest clean run of the same model by time (before or after), sharing hosts where one does"


@dataclasses.dataclass
class Facts:
    """What the pick needs to know of a job: its JOB header, summary.txt and TSDB blocks."""

    dir: Path
    model: str | None
    hosts: list[str]
    status: str | None
    first: float | None  # the TSDB's time range (unix s), from its blocks' meta.json
    last: float | None


def facts(job_dir: Path, db: Path | None = None) -> Facts:
    head = jobdir.header(jobdir.log_of(job_dir))
    nodes = re.search(r"\(([^)]*)\)", head.get("nodes", ""))
    span = jobdir.tsdb_span(db or jobdir.tsdb_dir(job_dir))
    return Facts(
        job_dir,
        jobdir.model(head),
        nodes.group(1).split() if nodes else [],
        jobdir.summary(job_dir).get("status"),
        span[0] if span else None,
        span[1] if span else None,
    )


def clean(job_dir: Path) -> bool:
    """Triage reads the job's log as completed with no failure class (a `completed` summary with no
    step line is `no_steps`: not clean)."""
    log = jobdir.log_of(job_dir)
    if log is None:
        return False
    try:
        r = triage.triage(str(log), job_dir.parent, triage.Options(scheduler=False))
    except (InputError, OSError):
        return False
    return r["status"] == "completed" and r["failure_class"] is None


def gap(me: Facts, f: Facts) -> float | None:
    """Seconds between the two runs' time ranges (None when they overlap or one has none)."""
    if me.first is None or me.last is None or f.first is None or f.last is None:
        return None
    if f.last <= me.first:
        return me.first - f.last
    if f.first >= me.last:
        return f.first - me.last
    return None


def _ago(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def pick(job_dir: Path | None, db: Path | None = None) -> tuple[Path, dict] | None:
    """The baseline of the job in job_dir (db: its TSDB, default job_dir/prometheus): (its job
    directory, what was picked and why) or None when there is none."""
    if job_dir is None:
        return None
    me = facts(job_dir, db)
    if me.model is None or me.first is None:
        return None
    try:
        entries = [p for _, p in jobdir.listing(job_dir.parent) if p.is_dir() and p != job_dir]
    except OSError:
        return None
    cands = []
    for p in entries:
        if not jobdir.is_tsdb(jobdir.tsdb_dir(p)):
            continue
        f = facts(p)
        g = gap(me, f)
        if f.model == me.model and f.status == "completed" and g is not None:
            cands.append((len(set(f.hosts) & set(me.hosts)), g, f))
    order = sorted(cands, key=lambda c: (not c[0], c[1], -c[0], -(c[2].last or 0)))
    n, g, best = next(((n, g, f) for n, g, f in order if clean(f.dir)), (0, 0.0, None))
    if best is None:
        return None
    when = "before" if (best.last or 0) <= (me.first or 0) else "after"
    verb = "ended" if when == "before" else "started"
    why = f"the nearest clean {me.model} run: it {verb} {_ago(g)} {when} this one" + (
        f" and shares hosts with it ({n} of {len(me.hosts)})" if n else " (on other hosts: a comparison across hosts)"
    )
    info = {
        "picked": best.dir.name,
        "when": when,
        "started": best.first,
        "ended": best.last,
        "gap_seconds": round(g, 3),
        "shared_hosts": n,
        "candidates": len(cands),
        "why": why,
    }
    return best.dir, info


def none_found(name: str, workspace: Path | None) -> str:
    """The line that says why there is no baseline."""
    where = f" (in {workspace})" if workspace is not None else ""
    return f"no clean completed run of the same model as {name} beside it{where} whose time does not overlap it"
