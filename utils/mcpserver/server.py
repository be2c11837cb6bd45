"""The MCP server over the read-only diagnosis tools: build() registers them (mcpserver/command.py
parses the command line and imports this module, the MCP SDK with it, only to serve)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from diagnosis import cli
from diagnosis import diagnose as diag
from diagnosis import investigate as inv
from diagnosis import perf as perf_tool
from diagnosis import triage as tri
from diagnosis import verify as verify_tool
from mcpserver import config as cfg
from mcpserver import jobs, promql, reports, submit

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
CACHED = (
    " Cached per job (its log size and mtime, its TSDB's mtime) and arguments: a repeated call is a look-up; "
    "_meta['maxtext-slurm/cache'] says {cached, seconds, runs}."
)
Report = Annotated[CallToolResult, dict[str, Any]]
Job = Annotated[str, Field(description="job id, job name (<id>-JAX-<model>[-<tag>]) or job dir in the workspace")]


def argument(o: cli.Option) -> Any:
    """The MCP argument type of option O: its type (its choices as a Literal; None allowed when it has
    no default), its help as the description, its bounds as the schema's minimum and maximum."""
    kind: Any = Literal[o.choices] if o.choices else o.type
    if o.default is None:
        kind = kind | None
    bounds = {k: v for k, v in (("ge", o.ge), ("gt", o.gt), ("le", o.le), ("lt", o.lt)) if v is not None}
    return Annotated[kind, Field(description=o.help, **bounds)]


def offers(prog: str, options: tuple[cli.Option, ...]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A tool function `fn(job, **opts)` with the arguments of its command's OPTIONS that are not
    cli_only (cli.Option): the signature the MCP SDK builds the tool's input schema from, and the
    groups' "give A or B, not both" checked before FN runs (ToolError "PROG: ...")."""
    offered = [o for o in options if not o.cli_only]

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(fn, eval_str=True)
        params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        params += [
            inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=argument(o))
            for o in offered
        ]

        @functools.wraps(fn)
        def tool(*args: Any, **kw: Any) -> Any:
            for group in {o.group for o in offered if o.group}:
                given = [o.name for o in offered if o.group == group and kw.get(o.name) is not None]
                if len(given) > 1:
                    raise ToolError(f"{prog}: give {' or '.join(given)}, not both")
            return fn(*args, **kw)

        tool.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        tool.__annotations__ = {p.name: p.annotation for p in params} | {"return": own.return_annotation}
        return tool

    return wrap


def build(workspace: Path, conf: cfg.Config) -> MCPServer:
    """The server with its tools registered (the write tool only when CONF allows it)."""
    ctx = reports.Context(workspace)
    server = MCPServer(
        "maxtext-slurm",
        instructions="Read-only diagnosis of MaxText jobs on Slurm. Start with list_jobs, then triage a job; "
        "triage hands over to diagnose (metrics), perf (throughput) or investigate (the whole chain). Quote "
        "the evidence the reports carry (file:line, PromQL and values).",
        log_level="WARNING",
    )

    def list_jobs() -> dict[str, Any]:
        """The jobs of the workspace, newest id first: name, id, status (from summary.txt, null while
        running or when the job never ended cleanly), has_tsdb (RAY=1 jobs), has_log."""
        return jobs.list_jobs(ctx)

    @offers("triage.py", tri.OPTIONS)
    def triage(job: Job, **opts: Any) -> Report:
        """Triage a job from its log (utils/triage.py JOB --json, docs/triage.md): status, failure class,
        culprit hosts, evidence (file, line, text), hang, throughput phases, next steps. Slurm is not asked."""
        return reports.triage(ctx, job, **opts)

    @offers("diagnose.py", diag.OPTIONS)
    def diagnose(job: Job, **opts: Any) -> Report:
        """Diagnose a RAY=1 job from its saved TSDB (utils/diagnose.py JOB --json, docs/diagnose.md): verdict,
        culprits, findings with their PromQL, window and values; serves the TSDB through Prometheus (~1-2 s)."""
        return reports.diagnose(ctx, job, **opts)

    @offers("verify.py", verify_tool.OPTIONS)
    def verify(job: Job, **opts: Any) -> Report:
        """Check a diagnosis against the metrics (utils/verify.py JOB --json, docs/diagnose.md "Verify"): every
        finding's verify checks (each deciding signal; both jobs of a --vs comparison) rerun on fresh copies
        of the TSDBs, match or mismatch per check within 1e-4; report no finding whose check does not match."""
        return reports.verify(ctx, job, **opts)

    @offers("perf.py", perf_tool.OPTIONS)
    def perf(job: Job, **opts: Any) -> Report:
        """Throughput, MFU, step-time breakdown and traces of a job (utils/perf.py JOB --json, docs/perf.md)."""
        return reports.perf(ctx, job, **opts)

    @offers("investigate.py", inv.OPTIONS)
    def investigate(job: Job, **opts: Any) -> Report:
        """The whole chain in one bundle (utils/investigate.py JOB --json, docs/investigate.md): triage, then
        diagnose and perf where triage hands over; a verdict with evidence and next steps. Slurm is not asked."""
        return reports.investigate(ctx, job, **opts)

    def run(
        alias: Annotated[str, Field(description="the run's alias, as given to submit.sh / run_local.sh --run")],
    ) -> dict[str, Any]:
        """A run (--run ALIAS) across its jobs (utils/run.py ALIAS --json, docs/runs.md): each job's nodes,
        status, steps trained and redone by a later job, time by kind (queued, start-up, productive, redone,
        other); the run's goodput. From the jobs' logs; Slurm is not asked."""
        return reports.run(ctx, alias)

    def query_tsdb(
        job: Job,
        query: Annotated[str, Field(description="a PromQL expression (metric names: docs/metrics.md)")],
        mode: Annotated[Literal["instant", "range"], Field(description="instant (at time) or range")] = "instant",
        time: Annotated[float | None, Field(description="instant: unix seconds (default: the last sample)")] = None,
        start: Annotated[float | None, Field(description="range: unix seconds (default: the first sample)")] = None,
        end: Annotated[float | None, Field(description="range: unix seconds (default: the last sample)")] = None,
        step: Annotated[float | None, Field(gt=0, description="range: seconds (default: span / 480)")] = None,
    ) -> Report:
        """Run one PromQL query over a job's saved TSDB (a private Prometheus on a copy). A range has at most
        11000 points per series (else an error says which step fits); at most 50 series come back, with
        series_total and truncated saying what was left out."""
        return reports.result(promql.query_tsdb(ctx, job, query, mode, time, start, end, step))

    def job_log_excerpt(
        job: Job,
        line: Annotated[int | None, Field(ge=1, description="the line to show (1-based)")] = None,
        pattern: Annotated[
            str | None,
            Field(description="a Python regex, searched in each line as shown (secret values redacted)"),
        ] = None,
        before: Annotated[int, Field(ge=0, le=199, description="lines before")] = 20,
        after: Annotated[int, Field(ge=0, le=199, description="lines after")] = 20,
    ) -> dict[str, Any]:
        """Lines of a job's log around LINE, else around the first match of PATTERN, else around the line
        triage cites first (the error, the last step of a hung run; else the log's end): at most 200 lines,
        each cut at 400 characters; secret values stay <redacted>."""
        return jobs.job_log_excerpt(ctx, job, line, pattern, before, after)

    for fn, cached in (
        (list_jobs, False),
        (triage, True),
        (diagnose, True),
        (verify, True),
        (perf, True),
        (investigate, True),
        (run, False),
        (query_tsdb, True),
        (job_log_excerpt, False),
    ):
        server.add_tool(fn, description=(fn.__doc__ or "").strip() + (CACHED if cached else ""), annotations=READ_ONLY)

    if conf.allow_submit:

        def submit_job(
            model: Annotated[str, Field(description="MODEL[:TAG] as submit.sh takes it (configs/<model>.yml)")],
            args: Annotated[
                list[str] | None, Field(description="submit.sh's further arguments: -N 2, sbatch flags, -- KEY=VALUE")
            ] = None,
            confirm: Annotated[bool, Field(description="submit for real (refused: this server runs dry runs)")] = False,
        ) -> dict[str, Any]:
            """Check a submission: runs submit.sh MODEL ARGS --dry-run and returns what it checked and would
            submit. Nothing is submitted (confirm: true is refused with the command to run yourself)."""
            return submit.submit(model, args, confirm)

        server.add_tool(
            submit_job,
            name="submit",
            description=(submit_job.__doc__ or "").strip(),
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True),
        )
    return server
