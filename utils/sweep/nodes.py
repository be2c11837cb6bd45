"""nodes: the same 1-node job on each node; tokens/s per node, outliers by the median absolute
deviation, failing nodes.
"""

from __future__ import annotations

import argparse
import statistics

from diagnosis import cli
from diagnosis.cli import InputError
from diagnosis.min_nodes import min_nodes_notes
from sweep.args import (
    NODE_FLAGS,
    PIN_FLAGS,
    add_ignore_min_nodes,
    add_kind,
    check_overrides,
    check_sbatch_flags,
    common_params,
    join_tag,
    submit_command,
)
from sweep.common import (
    ENDED,
)
from sweep.loop import Job, Sweep
from sweep.slurm import choose_nodes


def mad_outliers(rates: dict[str, float], z: float, min_deviation: float) -> dict:
    """Robust outliers: modified z-score 0.6745 * (x - median) / MAD beyond z, and at least
    min_deviation (fraction) away from the median. Needs three values."""
    if len(rates) < 3:
        return {
            "median": statistics.median(rates.values()) if rates else None,
            "mad": None,
            "outliers": [],
            "note": "outliers need at least 3 measured nodes" if rates else "no node was measured",
        }
    med = statistics.median(rates.values())
    mad = statistics.median(abs(x - med) for x in rates.values())
    out = []
    for node, x in rates.items():
        dev = (x - med) / med if med else 0.0
        score = 0.6745 * (x - med) / mad if mad else (0.0 if x == med else float("inf") * (1 if x > med else -1))
        if abs(score) > z and abs(dev) >= min_deviation:
            out.append(
                {
                    "node": node,
                    "tgs_steady": x,
                    "deviation_pct": round(100 * dev, 1),
                    "score": round(score, 2) if abs(score) != float("inf") else None,
                    "direction": "slow" if x < med else "fast",
                }
            )
    return {
        "median": round(med, 3),
        "mad": round(mad, 3),
        "outliers": sorted(out, key=lambda o: o["deviation_pct"]),
        "note": "",
    }


def drive_nodes(sw: Sweep) -> None:
    p = sw.params
    sw.policy_retries = False
    for node in p["nodes"]:
        cmd = submit_command(
            p["model"],
            join_tag(p["tag"], f"node-{node}"),
            1,
            ["-w", node, *p["sbatch"]],
            [f"steps={p['steps']}", *p["overrides"]],
        )
        sw.plan(f"node-{node}", cmd, node=node)
    if sw.opts.dry_run:
        return
    sw.run(sw.jobs)
    sw.result = nodes_result(sw.jobs, p["unavailable"], p["z"], p["min_deviation_pct"] / 100)


def nodes_result(jobs: list[Job], unavailable: list[dict], z: float, min_deviation: float) -> dict:
    rates = {j.info["node"]: j.tgs_steady for j in jobs if j.measured}
    stats = mad_outliers(rates, z, min_deviation)
    failing = [
        {
            "node": j.info["node"],
            "job_id": j.job_id,
            "status": j.status,
            "failure_class": j.failure_class,
            "summary": j.summary or j.note,
        }
        for j in jobs
        if j.status in ENDED and not j.measured
    ]
    slow = [o["node"] for o in stats["outliers"] if o["direction"] == "slow"]
    parts = [f"{len(rates)} of {len(jobs)} node(s) measured"]
    if stats["median"] is not None:
        parts.append(f"median {stats['median']:.6g} tokens/s/device")
    parts.append(f"slow outliers: {', '.join(slow)}" if slow else "no slow outlier")
    if failing:
        parts.append("failing: " + ", ".join(f"{f['node']} ({f['failure_class'] or f['status']})" for f in failing))
    if unavailable:
        parts.append("not usable in Slurm: " + ", ".join(f"{u['node']} ({u['state']})" for u in unavailable))
    if stats["note"]:
        parts.append(stats["note"])
    return {
        "rates": rates,
        "median": stats["median"],
        "mad": stats["mad"],
        "z": z,
        "min_deviation_pct": round(100 * min_deviation, 2),
        "outliers": stats["outliers"],
        "failing": failing,
        "unavailable": unavailable,
        "conclusion": "; ".join(parts),
    }


def nodes_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    p = common_params(a, passthrough)
    check_sbatch_flags(p["sbatch"], {**NODE_FLAGS, **PIN_FLAGS})
    check_overrides(p["overrides"], {"steps": "use --steps"})
    notes = min_nodes_notes(p["model"], 1, a.ignore_min_nodes)
    nodes, unavailable = choose_nodes(a.nodes)
    if not nodes:
        raise InputError("no usable node to run on" + (f" (Slurm: {unavailable})" if unavailable else ""))
    return {
        **p,
        "nodes": nodes,
        "unavailable": unavailable,
        "steps": a.steps,
        "z": a.z,
        "min_deviation_pct": a.min_deviation,
        "notes": notes,
    }


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `nodes` subcommand's options (COMMON: the options every kind takes)."""
    p = add_kind(sub, "nodes", "per-node health", common)
    p.add_argument("model", metavar="MODEL[:TAG]")
    p.add_argument("--nodes", default="all", help="n1,n2,... or all (default: every usable node sinfo lists)")
    p.add_argument("--steps", type=cli.positive_int, default=30, help="training steps per job (default 30)")
    p.add_argument(
        "--z",
        type=cli.positive_float,
        default=3.5,
        help="modified z-score beyond which a node is an outlier (default 3.5)",
    )
    p.add_argument(
        "--min-deviation",
        type=cli.positive_float,
        default=5.0,
        help="... and at least this many percent from the median (default 5)",
    )

    add_ignore_min_nodes(p, "1-node jobs")
