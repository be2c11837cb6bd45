"""A sweep's record for people and programs: the text report, --json, the exit status, and reading a
record back (show, resume) with its schema checked.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from diagnosis import cli
from diagnosis.cli import InputError
from sweep.common import (
    KINDS,
    REPO,
    SCHEMA,
    fmt,
)
from sweep.loop import Sweep
from sweep.models import (
    models_table,
)


def render(rec: dict) -> str:
    """A record as text for people."""
    head = f"sweep {rec['sweep']} {rec['model']}: {rec['state']}"
    lines = [head + (f" (record {rec['record']})" if rec.get("record") else "")]
    if rec["state"] == "dry_run":
        lines.append(f"{len(rec['jobs'])} job(s) would be submitted (nothing submitted):")
        lines += [f"  {j['command']}" for j in rec["jobs"]]
        lines += [f"note: {n}" for n in rec.get("notes", [])]
        return "\n".join(lines)
    notes = [f"note: {n}" for n in rec.get("notes", [])]
    lines.append(f"  {'label':<22} {'job':>8} {'status':<13} {'class':<18} {'tokens/s/dev':>13} {'loss':>9}")
    for j in rec["jobs"]:
        lines.append(
            f"  {j['label']:<22} {j['job_id'] or '-':>8} {j['status']:<13} {j['failure_class'] or '-':<18} "
            f"{fmt(j['tgs_steady']):>13} {fmt(j['final_loss'], '.4g'):>9}"
        )
    res = rec.get("result") or {}
    if rec["sweep"] == "models" and res.get("models"):
        lines += models_table(res)
    if res.get("conclusion"):
        lines.append(res["conclusion"])
    for s in res.get("suspects", []):
        ev = "; ".join(
            f"job {e['job_id']} {'+'.join(e['nodes'])}: {e['verdict']} ({fmt(e['tgs_steady'])})" for e in s["evidence"]
        )
        lines.append(f"  suspect {s['node']}: {ev}")
    for o in res.get("outliers", []):
        lines.append(
            f"  outlier {o['node']}: {fmt(o['tgs_steady'])} tokens/s/device ({o['deviation_pct']:+.1f} % "
            f"from the median, {o['direction']})"
        )
    for f in res.get("failing", []):
        lines.append(f"  failing {f['node']}: job {f['job_id']} {f['status']}: {f['summary']}")
    lines += notes
    if rec["state"] == "interrupted":
        lines.append(
            "interrupted: the sweep cancelled its unfinished jobs; continue with: "
            f"{shlex.quote(str(REPO / 'utils' / 'sweep.py'))} resume {shlex.quote(str(rec['record']))}"
        )
    return "\n".join(lines)


def emit(rec: dict, as_json: bool) -> None:
    cli.emit(rec, as_json, render)


def exit_code(sw: Sweep) -> int:
    if sw.state == "interrupted":
        return cli.INTERRUPTED
    if sw.kind == "regress":
        return cli.FAILED if sw.result.get("verdict") in ("regression", "failed") else cli.OK
    return cli.OK if any(j.measured for j in sw.jobs) else cli.FAILED


RECORD_KEYS = {
    "state": str,
    "model": str,
    "workspace": str,
    "started_at": str,
    "options": dict,
    "argv": list,
    "params": dict,
    "jobs": list,
    "result": dict,
}


JOB_KEYS = ("label", "command", "status", "job_id", "failure_class", "tgs_steady", "final_loss")


def _this_schema(rec: dict) -> bool:
    """A record of this schema: "schema": "sweep/1", or "version": 1 as records were written before."""
    return rec.get("schema") == SCHEMA if "schema" in rec else rec.get("version") == 1


def load_record(path: Path) -> dict:
    """A sweep record as written by this tool; InputError (one line) for anything else."""
    where = "give a <workspace>/<user>/sweeps/<time>-<kind>.json file"
    try:
        if not path.is_file():
            raise InputError(
                f"cannot read record {path}: {'not a regular file' if path.exists() else 'no such file'} ({where})"
            )
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read record {path}: {getattr(e, 'strerror', None) or e} ({where})") from None
    if not isinstance(rec, dict) or rec.get("sweep") not in KINDS or not _this_schema(rec):
        raise InputError(f"{path} is not a sweep record (schema {SCHEMA})")
    bad = [k for k, t in RECORD_KEYS.items() if not isinstance(rec.get(k), t)]
    bad += [
        f"jobs[{i}]"
        for i, j in enumerate(rec.get("jobs") or [])
        if not isinstance(j, dict) or any(k not in j for k in JOB_KEYS)
    ]
    if not bad and not all(k in rec["options"] for k in ("timeout", "max_parallel", "poll")):
        bad = ["options"]
    if bad:
        raise InputError(f"{path} is not a complete sweep record (bad or missing: {', '.join(bad[:5])})")
    return rec
