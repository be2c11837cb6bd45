"""Usage: verify.py JOB [--vs OTHER_JOB|auto] [--json] [--workspace DIR]

Checks a diagnosis against the job's metrics: diagnoses JOB (as utils/diagnose.py does, with --vs when
given), then reruns every finding's `verify` checks (one per deciding signal: a thermal finding's
temperature and clock, a hang's power and GPU utilization, a training spike and its throughput cost, a
comparison's family on both jobs) as range queries on a fresh private copy of each TSDB they name (the
job's and, with --vs, the other job's: utils/diagnosis/tsdb.py), reduces each host's values the way
diagnose did and compares them with the check's `expect`: a match when every value agrees within 1e-4
(relative). It prints one line per check, match or MISMATCH, with what it got and what diagnose got.

JOB and OTHER_JOB: as utils/diagnose.py takes them (a job id or name looked up in --workspace, default
$JOB_WORKSPACE or <repo>/outputs, a job dir, its log or a TSDB dir).
--json prints the result for programs (schema verify/1: docs/diagnose.md "Verify").
Exit 0 when every check matches (or there is none), 1 when one does not or Prometheus could not serve
the data, 2 on bad input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from diagnosis import cli, tsdb
from diagnosis import diagnose as diag
from diagnosis.cli import InputError
from diagnosis.evidence import TOLERANCE, check_values, close, fmt
from diagnosis.locate import default_workspace

SCHEMA = "verify/1"  # verify.py's report (docs/diagnose.md "Verify"); bumped when a field changes meaning


def _matches(got: dict, expect: dict) -> bool:
    """Whether every value of EXPECT (nested by group: culprits, accused) is what GOT holds, within TOLERANCE."""
    for k, want in expect.items():
        have = got.get(k)
        if isinstance(want, dict):
            if not isinstance(have, dict) or set(have) != set(want):
                return False
            if not all(close(have[h], want[h]) for h in want):
                return False
        elif not close(have, want):
            return False
    return True


def rerun(report: dict, serve: Callable[[str], tsdb.Served] = tsdb.Served) -> dict:
    """Rerun every verify check of a diagnose report (diagnose.py --json) on the TSDBs the checks name (each
    served once, by SERVE) and compare; the verify/1 report. TSDBError when a TSDB cannot be served."""
    todo = [(i, f, c) for i, f in enumerate(report["findings"]) for c in f.get("verify") or []]
    rows: list[dict] = []
    with ExitStack() as stack:
        served = {p: stack.enter_context(serve(p)) for p in dict.fromkeys(c["tsdb"] for _, _, c in todo)}
        with ThreadPoolExecutor(max_workers=4) as pool:
            futs = [
                pool.submit(served[c["tsdb"]].query_range, c["query"], c["start"], c["end"], c["step"])
                for _, _, c in todo
            ]
            for (i, f, c), fut in zip(todo, futs, strict=True):
                culprits, accused = list(c["expect"]["culprits"]), list(c["expect"].get("accused", {}))
                try:
                    per_host, got = check_values(fut.result(), c["reducer"], culprits, accused)
                    error = None
                except tsdb.TSDBError as e:
                    per_host, got, error = {}, {}, cli.one_line(e)
                ok = error is None and _matches(got, c["expect"])
                rows.append(
                    {
                        "finding": i,
                        "kind": f["kind"],
                        "signal": c["signal"],
                        "job": c["job"],
                        "tsdb": c["tsdb"],
                        "query": c["query"],
                        "start": c["start"],
                        "end": c["end"],
                        "step": c["step"],
                        "reducer": c["reducer"],
                        "match": ok,
                        "got": got,
                        "expect": c["expect"],
                        "per_host": per_host,
                        "error": error,
                    }
                )
    return {
        "schema": SCHEMA,
        "job_name": report["job_name"],
        "verdict": report["verdict"],
        "culprit_hosts": report["culprit_hosts"],
        "summary": report["summary"],
        "tolerance": TOLERANCE,
        "match": all(r["match"] for r in rows),
        "checks": rows,
        "mismatches": sum(not r["match"] for r in rows),
    }


def verify(target: diag.Target, vs: diag.Target | None = None, *, auto: dict | None = None) -> dict:
    """Diagnose TARGET (against VS; AUTO: how --vs auto picked it) and rerun its verify checks."""
    report = diag.diagnose(target, vs, auto=auto)
    report.pop("_report", None)
    return rerun(report)


def render(r: dict) -> str:
    def show(x: Any) -> str:
        return fmt(x if x is not None else math.nan)

    lines = [
        f"Job {r['job_name']}: verdict {r['verdict']}"
        + (f" ({' '.join(r['culprit_hosts'])})" if r["culprit_hosts"] else "")
    ]
    for c in r["checks"]:
        g, e = c["got"], c["expect"]
        vals = [
            f"{k} {show(g.get(k))} (diagnose {show(e[k])})" for k in ("job", "peers_median", "hosts_median") if k in e
        ]
        for group in ("culprits", "accused"):
            vals += [f"{h} {show(g.get(group, {}).get(h))} (diagnose {show(x)})" for h, x in e.get(group, {}).items()]
        where = "" if c["job"] == r["job_name"] else f" on {c['job']}"
        head = "match   " if c["match"] else "MISMATCH"
        lines.append(f"{head} {c['kind']} {c['signal']}{where}: {c['reducer']} of {c['query']}")
        lines.append("         " + (c["error"] or "; ".join(vals) or "no values"))
    if not r["checks"]:
        lines.append("nothing to check: no finding with a verify query")
    n = len(r["checks"])
    lines.append(
        f"{n - r['mismatches']}/{n} checks match (tolerance {r['tolerance']:g} relative)"
        + ("" if r["match"] else ": do not report a finding whose check does not match")
    )
    return "\n".join(lines)


# The options of verify.py, declared once: its parser below and the MCP tool `verify` (cli.Option).
OPTIONS = (diag.OPTIONS[0], cli.JSON, cli.WORKSPACE)  # --vs: diagnose's own declaration


def build_parser() -> cli.Parser:
    return cli.tool_parser("verify.py", __doc__, "JOB", "job id, job name, job dir, its log or TSDB dir", OPTIONS)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    ws: Path = a.workspace or default_workspace()
    try:
        target = diag.locate(a.job, ws)
        other, auto = diag.other_job(target, a.vs, ws)
        r = verify(target, other, auto=auto)
    except InputError as e:
        return cli.fail("verify.py", e)
    except tsdb.TSDBError as e:
        return cli.fail("verify.py", e, cli.FAILED)
    cli.emit(r, a.json, render)
    return cli.OK if r["match"] else cli.FAILED
