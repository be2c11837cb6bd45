"""Usage: mcp_server.py [--workspace DIR] [--config FILE]

An MCP server (stdio) over the read-only diagnosis tools, for agents such as Claude Code and Cursor
(docs/mcp.md). Tools: list_jobs, triage, diagnose, verify, perf, investigate, query_tsdb, job_log_excerpt;
each returns the JSON its command prints with --json (docs/triage.md, docs/diagnose.md, ...).
Results are cached per job (its log size and mtime, its TSDB's mtime) and arguments.
The write tool `submit` (a dry run) is listed only when the owner's config enables it:
~/.config/maxtext-slurm/mcp.toml with `allow_submit = true`, mode 0600, owned by you.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diagnosis import cli, locate
from mcpserver import config as cfg

PROG = "mcp_server.py"


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").splitlines()
    ap = cli.Parser(prog=PROG, usage=doc[0].removeprefix("Usage: "), description="\n".join(doc[2:]))
    ap.add_argument(
        "--workspace",
        type=Path,
        metavar="DIR",
        help="where jobs are looked up (default $JOB_WORKSPACE or <repo>/outputs)",
    )
    ap.add_argument(
        "--config", type=Path, metavar="FILE", help=f"the write-tools config (default {cfg.default_path()})"
    )
    a: argparse.Namespace = ap.parse_args(argv)
    ws = (a.workspace or locate.default_workspace()).absolute()
    if not ws.is_dir():
        return cli.fail(PROG, f"the workspace {ws} is not a directory (give --workspace DIR or set JOB_WORKSPACE)")
    conf = cfg.load(a.config)
    if conf.refused:
        print(f"{PROG}: {conf.refused}", file=sys.stderr)
    from mcpserver import server  # the MCP SDK (~1 s to import): only to serve, not for --help or bad input

    server.build(ws, conf).run("stdio")
    return cli.OK
