"""batch: the batch-size (or any key's) search, one job per value; stops going up at the first
out-of-memory and reports the best value.
"""

from __future__ import annotations

import argparse
import re

from diagnosis import cli
from diagnosis.cli import InputError
from diagnosis.min_nodes import min_nodes_notes
from sweep.args import (
    NODE_FLAGS,
    add_ignore_min_nodes,
    add_kind,
    check_overrides,
    check_sbatch_flags,
    common_params,
    is_env,
    join_tag,
    parse_values,
    submit_command,
)
from sweep.common import (
    ENDED,
    OOM_CLASSES,
)
from sweep.loop import Job, Sweep


def numeric(values: list[str]) -> bool:
    return all(re.fullmatch(r"\d+(\.\d+)?|\.\d+", v) for v in values)


def batch_label(p: dict, i: int, v: str) -> str:
    """bs<value> for numbers; v<n> (1-based, in the given order) for free-form values (_env_)."""
    return f"bs{v}" if numeric(p["values"]) else f"v{i + 1}"


def drive_batch(sw: Sweep) -> None:
    p = sw.params
    for i, v in enumerate(p["values"]):
        overrides = [f"{p['key']}={v}", f"steps={p['steps']}", *p["overrides"]]
        label = batch_label(p, i, v)
        sw.plan(
            label,
            submit_command(p["model"], join_tag(p["tag"], label), p["nodes"], p["sbatch"], overrides),
            value=v,
        )
    if sw.opts.dry_run:
        return
    ordered = numeric(p["values"])

    def after(job: Job) -> None:
        # failure policy: out of memory -> skip the value; larger numeric values would not fit either
        if job.failure_class in OOM_CLASSES and ordered:
            for other in sw.jobs:
                if other.status == "planned" and float(other.info["value"]) > float(job.info["value"]):
                    other.status = "skipped"
                    other.note = f"not run: {p['key']}={job.info['value']} ran out of memory ({job.failure_class})"
            sw.save()

    sw.run(sw.jobs, after)
    sw.result = batch_result(sw.jobs, p["key"])


def batch_result(jobs: list[Job], key: str) -> dict:
    jobs = [j for j in jobs if not j.info.get("retried_as")]  # a retried job counts by its retry
    order = (lambda j: float(j.info["value"])) if numeric([j.info["value"] for j in jobs]) else None
    rows = [
        {
            "value": j.info["value"],
            "job_id": j.job_id,
            "status": j.status,
            "failure_class": j.failure_class,
            "tgs_steady": j.tgs_steady,
            "final_loss": j.final_loss,
        }
        for j in jobs
    ]
    done = [j for j in jobs if j.measured]
    best = max(done, key=lambda j: j.tgs_steady or 0.0, default=None)
    fits = max(done, key=order, default=None) if order else None
    ooms = [j for j in jobs if j.failure_class in OOM_CLASSES]
    oom = min(ooms, key=order, default=None) if order else next(iter(ooms), None)
    skipped = [j.info["value"] for j in jobs if j.status == "skipped"]
    parts = []
    if best:
        parts.append(f"best {key}={best.info['value']}: {best.tgs_steady:.6g} tokens/s/device (job {best.job_id})")
    else:
        parts.append(f"no {key} value completed with a measured rate")
    if oom:
        parts.append(f"{key}={oom.info['value']} ran out of memory ({oom.failure_class}, job {oom.job_id})")
    if skipped:
        parts.append(f"not run: {', '.join(skipped)}")
    failed = [j for j in jobs if j.status in ENDED and not j.measured and j.failure_class not in OOM_CLASSES]
    if failed:
        parts.append(
            "other failures: "
            + ", ".join(
                f"{j.info['value']} ({j.status}{', ' + j.failure_class if j.failure_class else ''})" for j in failed
            )
        )
    return {
        "key": key,
        "values": rows,
        "best": {"value": best.info["value"], "job_id": best.job_id, "tgs_steady": best.tgs_steady} if best else None,
        "largest_fitting": fits.info["value"] if fits else None,
        "first_oom": {"value": oom.info["value"], "job_id": oom.job_id, "failure_class": oom.failure_class}
        if oom
        else None,
        "skipped": skipped,
        "conclusion": "; ".join(parts),
    }


def batch_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    p = common_params(a, passthrough)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", a.key):
        raise InputError(f"--key '{a.key}' is not a MaxText key (like per_device_batch_size)")
    check_sbatch_flags(p["sbatch"], NODE_FLAGS)
    check_overrides(p["overrides"], {a.key: "use --values", "steps": "use --steps"})
    notes = min_nodes_notes(p["model"], a.num_nodes, a.ignore_min_nodes)
    if (a.values is None) == (not a.value):
        raise InputError("give the values with --values 1,2,4 (numbers) or --value V once per value (any text)")
    if a.value:
        if not is_env(a.key):
            raise InputError(f"--value (free-form values) is for _env_ keys; '{a.key}' takes --values 1,2,4")
        values = list(dict.fromkeys(a.value))  # as given, each one token: never through a shell
    else:
        values = parse_values(a.values)
    return {**p, "values": values, "key": a.key, "nodes": a.num_nodes, "steps": a.steps, "notes": notes}


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `batch` subcommand's options (COMMON: the options every kind takes)."""
    p = add_kind(sub, "batch", "batch-size search", common)
    p.add_argument("model", metavar="MODEL[:TAG]")
    p.add_argument("--values", help="comma-separated numbers, e.g. 1,2,4,8")
    p.add_argument(
        "--value",
        action="append",
        default=[],
        help="one value, any text (repeat; --value=V when V starts with -); for --key _env_NAME",
    )
    p.add_argument("-N", dest="num_nodes", type=cli.positive_int, default=1, help="nodes per job (default 1)")
    p.add_argument("--steps", type=cli.positive_int, default=30, help="training steps per job (default 30)")
    p.add_argument(
        "--key", default="per_device_batch_size", help="MaxText key to sweep (default per_device_batch_size)"
    )

    add_ignore_min_nodes(p, "jobs")
