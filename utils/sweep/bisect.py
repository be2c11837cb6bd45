"""bisect: 2-node jobs over disjoint pairs, then each node of a bad pair with a node of a good one:
which node makes multi-node jobs slow or fail.
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
    say,
)
from sweep.loop import Job, Sweep
from sweep.slurm import choose_nodes


def first_pairs(nodes: list[str]) -> list[tuple[str, str]]:
    """Disjoint neighbour pairs; an odd last node is paired with the first node."""
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2:
        pairs.append((nodes[-1], nodes[0]))
    return pairs


def pair_command(p: dict, a: str, b: str) -> list[str]:
    return submit_command(
        p["model"],
        join_tag(p["tag"], f"pair-{a}-{b}"),
        2,
        ["-w", f"{a},{b}", *p["sbatch"]],
        [f"steps={p['steps']}", *p["overrides"]],
    )


def drive_bisect(sw: Sweep) -> None:
    sw.policy_retries = False
    p = sw.params
    round1 = [sw.plan(f"r1-{a}-{b}", pair_command(p, a, b), round=1, nodes=[a, b]) for a, b in first_pairs(p["nodes"])]
    if sw.opts.dry_run:
        return
    sw.run(round1)
    threshold = p["slow_threshold_pct"] / 100
    ref = reference_rate([j.tgs_steady for j in round1 if j.measured])
    verdicts = {j.label: judge(j, ref, threshold) for j in round1}
    for a, b in cross_checks(round1, verdicts):
        sw.plan(f"r2-{a}-{b}", pair_command(p, a, b), round=2, nodes=[a, b], testing=a)
    sw.run([j for j in sw.jobs if j.info.get("round") == 2])
    sw.result = bisect_result(sw.jobs, threshold)


def reference_rate(rates: list[float]) -> float | None:
    """The rate of a healthy pair: the median of three or more pairs, else the best one."""
    if not rates:
        return None
    return statistics.median(rates) if len(rates) >= 3 else max(rates)


def judge(job: Job, ref: float | None, threshold: float) -> str:
    """good | slow | failed for one pair job."""
    if not job.measured:
        return "failed"
    if ref is not None and job.tgs_steady is not None and job.tgs_steady < (1 - threshold) * ref:
        return "slow"
    return "good"


def cross_checks(round1: list[Job], verdicts: dict[str, str]) -> list[tuple[str, str]]:
    """(node under test, a node of a good pair other than its bad partners) for every node of a bad
    pair that no good pair cleared; the good nodes take turns."""
    bad = [j.info["nodes"] for j in round1 if verdicts[j.label] != "good"]
    cleared = list(dict.fromkeys(n for j in round1 if verdicts[j.label] == "good" for n in j.info["nodes"]))
    todo = list(dict.fromkeys(n for pair in bad for n in pair if n not in cleared))
    out: list[tuple[str, str]] = []
    for n in todo:
        partners = {m for pair in bad if n in pair for m in pair}
        choices = [c for c in cleared if c not in partners]
        if choices:
            out.append((n, choices[len(out) % len(choices)]))
    return out


def evidence(job: Job, verdict: str) -> dict:
    return {
        "job_id": job.job_id,
        "label": job.label,
        "nodes": job.info["nodes"],
        "verdict": verdict,
        "status": job.status,
        "failure_class": job.failure_class,
        "tgs_steady": job.tgs_steady,
    }


def bisect_result(jobs: list[Job], threshold: float) -> dict:
    r1 = [j for j in jobs if j.info.get("round") == 1]
    r2 = [j for j in jobs if j.info.get("round") == 2]
    ref = reference_rate([j.tgs_steady for j in r1 if j.measured])
    verdict = {j.label: judge(j, ref, threshold) for j in jobs}
    pairs = [{**evidence(j, verdict[j.label]), "round": j.info["round"]} for j in jobs]
    bad1 = [j for j in r1 if verdict[j.label] != "good"]
    cleared = sorted({n for j in jobs if verdict[j.label] == "good" for n in j.info["nodes"]})
    suspects = []
    for j in r2:
        node = j.info["testing"]
        if verdict[j.label] != "good":
            ev = [evidence(x, verdict[x.label]) for x in bad1 if node in x.info["nodes"]] + [
                evidence(j, verdict[j.label])
            ]
            suspects.append({"node": node, "evidence": ev})
    suspect_pairs = [j.info["nodes"] for j in bad1 if all(n in cleared for n in j.info["nodes"])]
    if not bad1:
        conclusion = "no suspect: every pair ran at speed"
    elif not r2 and not any(verdict[j.label] == "good" for j in r1):
        conclusion = (
            "every pair was slow or failed: not one node; suspect the network fabric, a shared service "
            "or the job's configuration"
        )
    else:
        parts = []
        if suspects:
            parts.append(
                "suspect node(s): "
                + ", ".join(s["node"] for s in suspects)
                + " (bad with a partner that is good elsewhere)"
            )
        if suspect_pairs:
            parts.append(
                "pair(s) bad only together: "
                + ", ".join("+".join(x) for x in suspect_pairs)
                + " (both nodes are good with other partners: suspect the link between them)"
            )
        conclusion = "; ".join(parts) or "inconclusive: the cross-checks did not reproduce the bad pair(s)"
    return {
        "reference_tgs": round(ref, 3) if ref is not None else None,
        "slow_threshold_pct": round(100 * threshold, 2),
        "pairs": pairs,
        "cleared": cleared,
        "suspects": suspects,
        "suspect_pairs": suspect_pairs,
        "conclusion": conclusion,
    }


def bisect_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    p = common_params(a, passthrough)
    check_sbatch_flags(p["sbatch"], {**NODE_FLAGS, **PIN_FLAGS})
    check_overrides(p["overrides"], {"steps": "use --steps"})
    notes = min_nodes_notes(p["model"], 2, a.ignore_min_nodes)
    nodes, unavailable = choose_nodes(a.nodes)
    if len(nodes) < 3:
        raise InputError(
            f"bisect needs at least 3 usable nodes (got {len(nodes)}): with 2 a bad pair cannot be "
            "split; use 'sweep.py nodes' to check single nodes"
        )
    if unavailable:
        say("left out (not usable in Slurm): " + ", ".join(f"{u['node']} ({u['state']})" for u in unavailable))
    return {
        **p,
        "nodes": nodes,
        "unavailable": unavailable,
        "steps": a.steps,
        "slow_threshold_pct": a.slow_threshold,
        "notes": notes,
    }


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `bisect` subcommand's options (COMMON: the options every kind takes)."""
    p = add_kind(sub, "bisect", "find the node that spoils multi-node jobs", common)
    p.add_argument("model", metavar="MODEL[:TAG]")
    p.add_argument("--nodes", required=True, help="n1,n2,n3,... or all (at least 3)")
    p.add_argument("--steps", type=cli.positive_int, default=30, help="training steps per job (default 30)")
    p.add_argument(
        "--slow-threshold",
        type=cli.positive_float,
        default=10.0,
        help="a pair slower than the reference by this many percent is bad (default 10)",
    )

    add_ignore_min_nodes(p, "2-node jobs")
