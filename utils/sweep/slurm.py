"""What the sweep asks Slurm and does to its own jobs: the usable nodes (sinfo) and scancel of the jobs
it submitted, and only those. A job's state comes from diagnosis/scheduler.py.
"""

from __future__ import annotations

import shutil
import subprocess

from diagnosis.cli import InputError
from sweep.args import (
    parse_node_list,
)
from sweep.common import (
    USABLE_NODE_STATES,
    quiet_run,
    say,
)


def cluster_nodes() -> list[tuple[str, str]] | None:
    """[(node, short state)] from sinfo, or None when Slurm cannot be asked."""
    if not shutil.which("sinfo"):
        return None
    try:
        res = quiet_run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    seen: dict[str, str] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            seen.setdefault(parts[0], parts[1])
    return list(seen.items())


def node_usable(state: str) -> bool:
    return state.rstrip("~#$@!%^-+") in USABLE_NODE_STATES and not state.endswith("*")


def choose_nodes(spec: str) -> tuple[list[str], list[dict]]:
    """(nodes to run on, [{node, state}] left out) for --nodes all|n1,n2,..."""
    known = cluster_nodes()
    if spec == "all":
        if known is None:
            raise InputError("--nodes all needs sinfo (run on a Slurm login node, or list the nodes: --nodes n1,n2)")
        use = [n for n, st in known if node_usable(st)]
        left = [{"node": n, "state": st} for n, st in known if not node_usable(st)]
        return use, left
    nodes = parse_node_list(spec)
    if known is not None:
        names = {n for n, _ in known}
        unknown = [n for n in nodes if n not in names]
        if unknown:
            raise InputError(f"unknown node(s) {', '.join(unknown)}; sinfo lists {', '.join(sorted(names))}")
    return nodes, []


def scancel(job_ids: list[str]) -> None:
    """Cancel exactly these jobs (the sweep's own)."""
    if job_ids:
        try:
            quiet_run(["scancel", *job_ids], timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            say(f"scancel {' '.join(job_ids)} failed: {e}")
