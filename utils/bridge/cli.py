"""The command line of utils/host_bridge.py: serve, call, stop (docs/host-bridge.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bridge import client
from bridge.policy import BridgeError
from diagnosis.cli import BAD_INPUT, Parser, fail

PROG = "host_bridge.py"
DESCRIPTION = """\
Runs an allowlist of read-only Slurm and launcher commands on the host for an agent in a
container (or anyone of yours), through a Unix socket in a directory only you may enter.
No shell: each request is an argv, checked, run with a time limit, and written to an audit log.

  serve   start the bridge on this host (login node); prints its directory DIR
  call    run one command through the bridge: call squeue --me; call utils/triage.py JOB --json
  stop    stop the bridge

Allowed: squeue, sacct, sinfo, scontrol show ENTITY [NAME], utils/triage.py, diagnose.py,
perf.py, investigate.py, prometheus.sh list|query, submit.sh --dry-run; submit.sh and scancel
(your own jobs) only when the config file (mode 600) says allow_submit / allow_scancel = true.
A container reaches the bridge with `-v DIR:DIR:ro -e MST_HOST_BRIDGE=DIR` (podman or docker).
call exits with the command's status; 124 a command killed at its time limit, 125 no bridge
answered, 126 the bridge refused the command; 2 bad usage. Details: docs/host-bridge.md."""


def parser() -> Parser:
    p = Parser(prog=PROG, description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", metavar="serve|call|stop", parser_class=Parser)
    s = sub.add_parser(
        "serve", prog=f"{PROG} serve", help="start the bridge", description="Start the bridge (foreground; --detach)."
    )
    s.add_argument(
        "--dir",
        metavar="DIR",
        help="its directory: made with mode 0700, or one of yours with 0700 "
        "(default: a new one under $XDG_RUNTIME_DIR or the temp dir)",
    )
    s.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help=f"settings, mode 600 (default {client.config_home() / 'host-bridge.toml'} when it exists)",
    )
    s.add_argument("--audit-log", metavar="FILE", type=Path, help="default DIR/audit.jsonl (or the config's)")
    s.add_argument(
        "--address-file",
        metavar="FILE",
        type=Path,
        default=None,
        help=f"where DIR is written for call/stop (default {client.address_file()})",
    )
    s.add_argument("--detach", action="store_true", help="run in the background (log: DIR/serve.log)")
    c = sub.add_parser(
        "call",
        prog=f"{PROG} call",
        help="run one command through the bridge",
        description="Run ARGV on the host through the bridge; exit with its status.",
    )
    c.add_argument(
        "--dir", metavar="DIR", help="the bridge's directory (default $MST_HOST_BRIDGE, else the address file)"
    )
    c.add_argument("--timeout", metavar="S", type=float, default=3600.0, help="give up waiting after S seconds")
    c.add_argument("argv", nargs=argparse.REMAINDER, metavar="ARGV...", help="the command and its arguments")
    t = sub.add_parser("stop", prog=f"{PROG} stop", help="stop the bridge", description="Stop the bridge serving DIR.")
    t.add_argument("--dir", metavar="DIR", help="default $MST_HOST_BRIDGE, else the address file")
    return p


def main() -> int:
    args = parser().parse_args()
    try:
        if args.command == "call":
            argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not argv:
                return fail(PROG, "call needs a command, e.g. call squeue --me (see host_bridge.py call --help)")
            return client.call(client.find_dir(args.dir), argv, args.timeout)
        if args.command in ("serve", "stop"):
            if sys.version_info < (3, 11):  # noqa: UP036 (call runs under 3.8)
                return fail(PROG, f"{args.command} needs Python 3.11 or newer (the project's environment)")
            from bridge import server

            if args.command == "stop":
                return server.stop(client.find_dir(args.dir))
            directory = Path(args.dir) if args.dir else None
            address = args.address_file or client.address_file()
            return server.serve(directory, args.config, args.audit_log, address, args.detach)
        return fail(PROG, "say serve, call or stop (see host_bridge.py --help)")
    except BridgeError as e:
        return fail(PROG, e, BAD_INPUT)
    except KeyboardInterrupt:
        return 130
