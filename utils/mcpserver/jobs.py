"""list_jobs (the jobs of the workspace) and job_log_excerpt (a bounded piece of one job's log)."""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

from diagnosis import joblog, locate, tsdb
from mcpserver.reports import Context, triage_report

MAX_JOBS = 500  # list_jobs returns at most this many, newest id first
MAX_LINES = 200  # job_log_excerpt: lines returned at most
MAX_CHARS = 400  # ... and characters per line (a longer line is cut and says so)
# docs/security.md "Secret names" (utils/launch/lib.sh SECRET_NAME_RE) and MaxText's credential keys:
# a value the launcher missed is still not returned
SECRET_NAME = re.compile(
    r"TOKEN($|_)|SECRET|PASSW|PASSPHRASE|CREDENTIAL|COOKIE|PRIVATE|AUTH|APIKEY|(^|_)KEY($|_)|(^|_)PAT($|_)|(^|_)DSN($|_)"
)
SECRET_KEYS = {"HF_ACCESS_TOKEN"}
ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S+)")
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    """A secret-looking name (also as _env_NAME or M_NAME)."""
    bare = name.removeprefix("_env_").removeprefix("M_").upper()
    return bool(SECRET_NAME.search(bare)) or bare in SECRET_KEYS


def redact(line: str) -> str:
    """NAME=VALUE (VALUE up to the next blank) with a secret-looking NAME as NAME=<redacted>."""
    return ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}" if is_secret(m.group(1)) else m.group(0), line)


def redact_arg(arg: str) -> str:
    """One argument NAME=VALUE (VALUE whole, blanks and all) with a secret-looking NAME as NAME=<redacted>."""
    name, eq, _ = arg.partition("=")
    return f"{name}={REDACTED}" if eq and re.fullmatch(r"[A-Za-z_]\w*", name) and is_secret(name) else arg


def _status(job_dir: Path) -> str | None:
    summary = job_dir / "summary.txt"
    try:
        return joblog.parse_block(summary.read_text(errors="replace").splitlines()).get("status")
    except OSError:
        return None


def list_jobs(ctx: Context) -> dict[str, Any]:
    """The jobs of the workspace: directories and logs named <id>-JAX-<model>[-<tag>] (not the earlier
    results submit.sh moved aside)."""
    ws = ctx.workspace
    try:
        entries = list(ws.iterdir())
    except OSError as e:
        raise ToolError(f"mcp_server.py: cannot read the workspace {ws}: {e.strerror or e}") from None
    names: dict[str, dict[str, Any]] = {}
    for p in entries:
        if "-JAX-" not in p.name or locate.EARLIER.search(p.name):
            continue
        if p.is_dir():
            name = p.name
        elif p.is_file() and p.name.endswith(".log"):
            name = p.name.removesuffix(".log")
        else:
            continue
        names.setdefault(name, {})
    jobs = []
    for name in names:
        d = ws / name
        is_dir = d.is_dir()
        log = locate.log_of(d) if is_dir else (ws / f"{name}.log")
        jobs.append(
            {
                "name": name,
                "id": locate.job_id_of(name),
                "status": _status(d) if is_dir else None,
                "has_tsdb": is_dir and tsdb.is_tsdb(d / "prometheus"),
                "has_log": log is not None and log.is_file(),
                "dir": str(d) if is_dir else None,
            }
        )

    def order(j: dict) -> tuple:
        jid = j["id"] or ""
        return (int(jid) if jid.isdigit() else -1, j["name"])

    jobs.sort(key=order, reverse=True)
    return {
        "workspace": str(ws),
        "jobs": jobs[:MAX_JOBS],
        "total": len(jobs),
        "truncated": len(jobs) > MAX_JOBS,
    }


def job_log_excerpt(
    ctx: Context,
    job: str,
    line: int | None = None,
    pattern: str | None = None,
    before: int = 20,
    after: int = 20,
) -> dict[str, Any]:
    """LINE's neighbourhood, else the first match of PATTERN, else the line triage cites first (its decisive
    evidence; else the log's end): at most MAX_LINES lines, each cut at MAX_CHARS characters, secret values
    redacted."""
    prog = "job_log_excerpt"
    found = ctx.find(prog, job, need_log=True)
    assert found.log is not None
    if line is not None and pattern is not None:
        raise ToolError(f"{prog}: give line or pattern, not both")
    rx = None
    if pattern is not None:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ToolError(f"{prog}: pattern {pattern!r} is not a regular expression: {e}") from None
    before, after = max(0, before), max(0, after)
    if before + after + 1 > MAX_LINES:
        raise ToolError(f"{prog}: before + after + 1 = {before + after + 1} lines; at most {MAX_LINES}")
    how, why = ("line" if line is not None else "pattern"), None
    if line is None and rx is None:
        try:
            evidence = triage_report(ctx, found).value.get("evidence") or []
        except ToolError:  # not a job log triage can read: the log's end
            evidence = []
        first = next((e for e in evidence if e.get("file") == str(found.log) and e.get("line")), None)
        line, how, why = (first["line"], "triage_evidence", first.get("why")) if first else (None, "end", None)
    test = (lambda n, text: n == line) if line is not None else (lambda n, text: bool(rx and rx.search(text)))
    window: collections.deque[tuple[int, str]] = collections.deque(maxlen=before + 1)
    center, total, tail = None, 0, []
    try:
        with found.log.open(errors="replace") as fh:
            for total, text in enumerate(fh, 1):  # streamed: a log of gigabytes is read once, never held
                text = text.rstrip("\n")
                if center is None:
                    window.append((total, text))
                    if test(total, text):
                        center = total
                elif len(tail) < after:
                    tail.append((total, text))
    except OSError as e:
        raise ToolError(f"{prog}: cannot read {found.log}: {e.strerror or e}") from None
    if line is not None and center is None:  # (triage cites lines of this log: only a given line is outside)
        raise ToolError(f"{prog}: line {line} is outside the log (1..{total})")
    if center is None and rx is not None:
        return {
            "job": found.name,
            "log": str(found.log),
            "match": None,
            "lines": [],
            "total_lines": total,
            "lines_cut": 0,
        }
    if center is None:  # nothing triage cites: the log's end
        center = total
    out = []
    cut = 0
    for n, text in [*window, *tail]:
        text = redact(text)
        if len(text) > MAX_CHARS:
            text, cut = text[:MAX_CHARS] + f" [... {len(text) - MAX_CHARS} more characters]", cut + 1
        out.append({"line": n, "text": text})
    return {
        "job": found.name,
        "log": str(found.log),
        "match": {"how": how, "line": center, **({"why": why} if why else {})},
        "lines": out,
        "total_lines": total,
        "lines_cut": cut,
    }
