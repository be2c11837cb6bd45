"""triage, diagnose, verify, perf, investigate and run over MCP: each tool's Python API in-process, its report
exactly as `utils/<tool>.py JOB --json` prints it (docs/<tool>.md), cached per job and arguments.

Bad input (no such job, a job outside the workspace, no TSDB) is a ToolError with the tool's one line,
"<tool>.py: message", which the client gets as an error result (isError); the server keeps serving.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from bridge import paths
from diagnosis import baseline, jobdir, locate, runs, tsdb
from diagnosis import diagnose as diag
from diagnosis import investigate as inv
from diagnosis import perf as perf_tool
from diagnosis import triage as tri
from diagnosis import verify as verify_tool
from diagnosis.cli import InputError, one_line
from mcpserver.cache import Cache, Hit, fingerprint

META = "maxtext-slurm/cache"  # the key in a result's _meta: {"cached", "seconds", "runs"}
ADVICE = "give a job of the workspace (list_jobs)"


@dataclasses.dataclass
class Context:
    """What every tool call shares: the workspace it may read (by its real path) and the results cache."""

    workspace: Path
    cache: Cache = dataclasses.field(default_factory=Cache)

    def __post_init__(self) -> None:
        self.workspace = Path(os.path.realpath(self.workspace))

    def confine(self, prog: str, path: Path | str, what: str) -> Path:
        """The real path of PATH when it leads into the workspace through no link but our own
        (bridge/paths.py); ToolError "PROG: refusing ..." otherwise."""
        try:
            return paths.confine(path, [self.workspace], what, advice=ADVICE)
        except paths.Outside as e:
            raise ToolError(f"{prog}: {e}") from None

    def find(self, prog: str, job: str, *, what: str = "JOB", need_log: bool = False) -> locate.Job:
        """The job JOB names (locate's rule), by its real paths, when the job, its directory and its
        log lead into the workspace (checked after every link is followed); ToolError "PROG: why"
        otherwise."""
        if "/" not in job and job not in (".", ".."):  # a name or id: looked up in the workspace, not here
            named: Path | None = None
        else:
            named = self.confine(prog, job, f"{what} path")
        try:
            arg = str(named) if named is not None else job
            found = locate.find_log(arg, self.workspace, what=what) if need_log else locate.find(arg, self.workspace)
        except InputError as e:
            raise ToolError(f"{prog}: {one_line(e)}") from None
        where = self.confine(prog, found.path, "job")
        job_dir = self.confine(prog, found.dir, "job directory") if found.dir else None
        log = None
        if found.log is not None:
            if job_dir is not None and os.path.islink(job_dir / "log"):
                self.confine(prog, job_dir / "log", "job log")  # the link's owner and where it leads
            log = self.confine(prog, found.log, "job log")
        return locate.Job(found.name, where, job_dir, log)

    def run(self, prog: str, tool: str, key: tuple, compute: Callable[[], Any]) -> Hit:
        """compute() through the cache; the tools' InputError and TSDBError become one-line ToolErrors."""
        try:
            return self.cache.get(tool, key, compute)
        except (InputError, tsdb.TSDBError) as e:
            raise ToolError(f"{prog}: {one_line(e)}") from None


def result(hit: Hit) -> CallToolResult:
    """A report as the tool's result: structured (the report) and as JSON text, the cache facts in _meta."""
    report = hit.value
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(report, separators=(",", ":")))],
        structured_content=report,
        meta={META: {"cached": hit.cached, "seconds": round(hit.seconds, 3), "runs": hit.runs}},
    )


def triage_report(ctx: Context, found: locate.Job, **opts: Any) -> Hit:
    """The triage report of a found job, through the cache (job_log_excerpt shares it): OPTS are the
    options the MCP tool offers (triage.OPTIONS), the others as triage.Options has them."""
    options = tri.Options(**opts, scheduler=False)
    key = (fingerprint(found), dataclasses.astuple(options))
    return ctx.run("triage.py", "triage", key, lambda: tri.triage(str(found.path), ctx.workspace, options))


def triage(ctx: Context, job: str, **opts: Any) -> CallToolResult:
    return result(triage_report(ctx, ctx.find("triage.py", job, need_log=True), **opts))


def _diagnose(ctx: Context, job: str, vs: str | None) -> dict:
    ws = ctx.workspace
    target = diag.locate(job, ws)
    other, auto = None, None
    if vs == "auto":
        picked = diag.pick_baseline(target)
        if picked is None:
            where = target.job_dir.parent if target.job_dir else None
            raise InputError(f"vs auto: {baseline.none_found(target.name, where)}; give vs=OTHER_JOB")
        other, auto = picked
        for p in (other.job_dir, other.tsdb):  # a teammate's link among the candidates is not followed
            if p is not None:
                ctx.confine("diagnose.py", p, "vs auto's baseline")
    elif vs:
        other = diag.locate(vs, ws, "vs")
    if other is not None and other.tsdb.resolve() == target.tsdb.resolve():
        raise InputError(f"vs {vs} is {target.name} itself: compare with another job (or vs auto)")
    report = diag.diagnose(target, other, auto=auto)
    report.pop("_report", None)
    return report


def baselines(ws: Path) -> tuple:
    """vs auto's key: the fingerprint (log and TSDB) of every job directory of the workspace."""
    try:
        return tuple(sorted(jobdir.fingerprint(p, p, jobdir.log_of(p)) for _, p in jobdir.listing(ws) if p.is_dir()))
    except OSError:  # the workspace cannot be read: diagnose says so
        return ()


def diagnose_report(ctx: Context, job: str, vs: str | None = None, prog: str = "diagnose.py") -> tuple[tuple, Hit]:
    """The diagnose report of JOB (against VS) through the cache, and its cache key (verify shares both)."""
    found = ctx.find(prog, job)
    key: tuple = (fingerprint(found), vs)
    if vs == "auto":  # the baseline may be any job beside this one: the key holds all of them
        key += (baselines(found.dir.parent if found.dir else ctx.workspace),)
    elif vs:
        key += (fingerprint(ctx.find(prog, vs, what="vs")),)
    return key, ctx.run(prog, "diagnose", key, lambda: _diagnose(ctx, str(found.path), vs))


def diagnose(ctx: Context, job: str, vs: str | None = None) -> CallToolResult:
    return result(diagnose_report(ctx, job, vs)[1])


def verify(ctx: Context, job: str, vs: str | None = None) -> CallToolResult:
    """verify.py JOB --json: the (cached) diagnose report's verify checks rerun on fresh copies of the TSDBs
    (the TSDBs' mtimes are in the key, so a cached result is one of the same data)."""
    key, hit = diagnose_report(ctx, job, vs, "verify.py")
    return result(ctx.run("verify.py", "verify", key, lambda: verify_tool.rerun(hit.value)))


def perf(ctx: Context, job: str, **opts: Any) -> CallToolResult:
    """OPTS: the options the MCP tool offers (perf.OPTIONS: gpu, peak_tflops)."""
    found = ctx.find("perf.py", job, need_log=True)
    key = (fingerprint(found), tuple(sorted(opts.items())))
    return result(ctx.run("perf.py", "perf", key, lambda: perf_tool.perf(str(found.path), ctx.workspace, **opts)))


def investigate(ctx: Context, job: str, **opts: Any) -> CallToolResult:
    """OPTS: the options the MCP tool offers (investigate.OPTIONS: metrics)."""
    found = ctx.find("investigate.py", job)
    key = (fingerprint(found), tuple(sorted(opts.items())))
    return result(
        ctx.run(
            "investigate.py",
            "investigate",
            key,
            lambda: inv.investigate(str(found.path), ctx.workspace, scheduler=False, **opts),
        )
    )


def run(ctx: Context, alias: str) -> dict[str, Any]:
    """run.py ALIAS --json over the server's workspace (not cached: it reads a few logs' headers and
    step lines)."""
    try:
        return runs.account(alias, ctx.workspace)
    except InputError as e:
        raise ToolError(f"run.py: {one_line(e)}") from None
