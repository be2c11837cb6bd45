"""models: every model (or a list) at its config header's node count on synthetic data, on one commit
or two side by side (a scratch clone per commit runs its own submit.sh).
"""

from __future__ import annotations

import argparse
import os
import pwd
from pathlib import Path

import trust
from diagnosis import cli
from diagnosis.cli import InputError
from launch import config_header
from sweep import policy
from sweep.args import (
    NODE_FLAGS,
    PIN_FLAGS,
    add_kind,
    check_overrides,
    check_sbatch_flags,
    join_tag,
    parse_node_list,
    resolve_model,
    split_passthrough,
    submit_command,
)
from sweep.common import (
    ENDED,
    REPO,
    fmt,
    quiet_run,
    sweeps_dir,
)
from sweep.loop import Job, Sweep

CONFIGS = REPO / "configs"


def all_models() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.yml"))


def documented_nodes(model: str) -> int:
    """The config header's `# Minimum nodes: N with 8x 80 GB GPUs` N (config_header.read_header); 1 without it."""
    try:
        nodes = config_header.read_header(CONFIGS / f"{model}.yml").min_nodes
    except (OSError, ValueError):
        return 1
    return nodes[0].nodes if nodes else 1


def resolve_commit(ref: str) -> str:
    res = quiet_run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
    if res.returncode != 0 or not res.stdout.strip():
        raise InputError(f"--commits: '{ref}' is not a commit of {REPO}")
    return res.stdout.strip()


def checkout_of(sw: Sweep, sha: str) -> Path:
    """A scratch clone of the repository at commit sha under <workspace>/<user>/sweeps/checkouts/
    (made once, reused when it is ours to trust; `git clone --shared`, so the repository's own
    worktree list is untouched): its submit.sh snapshots that checkout, so each job runs the
    commit's code."""
    if sw.opts.dry_run:
        return sw.opts.workspace / pwd.getpwuid(os.geteuid()).pw_name / "sweeps" / "checkouts" / sha[:12]
    checkouts = sweeps_dir(sw.opts.workspace) / "checkouts"
    path = checkouts / sha[:12]
    try:
        trust.own_dir(checkouts)
        if (path / "submit.sh").exists() or (path / "submit.sh").is_symlink():
            trust.check_under(sw.opts.workspace, path / "submit.sh", "the sweep's checkout")
            return path
    except trust.UntrustedPath as e:
        raise InputError(str(e)) from None
    old_umask = os.umask(0o022)  # nobody else writes into the code a job will run
    try:
        for cmd in (
            ["git", "clone", "--quiet", "--shared", "--no-checkout", str(REPO), str(path)],
            ["git", "-C", str(path), "checkout", "--quiet", "--detach", sha],
        ):
            res = quiet_run(cmd, timeout=300)
            if res.returncode != 0:
                raise InputError(f"cannot make a checkout of {sha[:12]} at {path}: {res.stderr.strip()}")
    finally:
        os.umask(old_umask)
    return path


def drive_models(sw: Sweep) -> None:
    p = sw.params
    commits = p["commits"] or [None]
    for model in p["models"]:  # model by model, the commits side by side: deltas come early
        for sha in commits:
            repo = checkout_of(sw, sha) if sha else REPO
            label = f"{model}@{sha[:8]}" if sha else model
            sbatch = [*(["-w", ",".join(p["node_lists"][model])] if p["node_lists"].get(model) else []), *p["sbatch"]]
            cmd = submit_command(
                model,
                join_tag(p["tag"], f"c{sha[:8]}" if sha else "models"),
                p["nodes_per_model"][model],
                sbatch,
                [f"steps={p['steps']}", "dataset_type=synthetic", *p["overrides"]],
            )
            cmd[0] = str(repo / "submit.sh")
            sw.plan(label, cmd, config=model, commit=sha)
    if sw.opts.dry_run:
        return

    def after(job: Job) -> None:
        if len(commits) < 2 or sw.stop_reason:
            return
        done = {c: {} for c in commits}
        for j in sw.jobs:
            if j.status in ENDED and not j.info.get("retried_as"):
                done[j.info["commit"]][j.info["config"]] = j.status == "completed"
        bad = policy.candidate_only_failures(done[commits[0]], done[commits[1]])
        if len(bad) >= 2:
            sw.stop_reason = f"{len(bad)} models fail on {commits[1][:8]} but not on {commits[0][:8]}: {', '.join(bad)}"
            sw.decisions.append({"label": job.label, "action": policy.STOP, "reason": sw.stop_reason})

    sw.run(sw.jobs, after)
    sw.result = models_result(sw.jobs, p)


def models_result(jobs: list[Job], p: dict) -> dict:
    commits = p["commits"] or [None]
    live = [j for j in jobs if not j.info.get("retried_as")]
    rows = []
    for model in p["models"]:
        row: dict = {"model": model, "nodes": p["nodes_per_model"][model], "node_list": p["node_lists"].get(model)}
        per = []
        for sha in commits:
            j = next((j for j in live if j.info["config"] == model and j.info["commit"] == sha), None)
            per.append(
                {
                    "commit": sha,
                    "job_id": j.job_id if j else None,
                    "status": j.status if j else "planned",
                    "failure_class": j.failure_class if j else None,
                    "tgs_steady": j.tgs_steady if j else None,
                }
            )
        row["runs"] = per
        a, b = per[0]["tgs_steady"], per[-1]["tgs_steady"]
        row["tgs_delta_pct"] = round(100 * (b - a) / a, 2) if len(per) == 2 and a and b is not None else None
        rows.append(row)
    measured = sum(1 for r in rows for x in r["runs"] if x["tgs_steady"] is not None)
    deltas = [f"{r['model']} {r['tgs_delta_pct']:+.2f} %" for r in rows if r["tgs_delta_pct"] is not None]
    conclusion = f"{measured} of {len(rows) * len(commits)} job(s) measured"
    if deltas:
        conclusion += f"; tokens/s/device {commits[-1][:8]} vs {commits[0][:8]}: " + ", ".join(deltas)
    return {"commits": commits, "models": rows, "conclusion": conclusion}


def models_table(res: dict) -> list[str]:
    """The side-by-side table: one line per model, tokens/s/device per commit and the delta."""
    commits = res.get("commits") or [None]
    heads = [(c or "current")[:8] for c in commits]
    lines = [
        f"  {'model':<20} {'nodes':>5} "
        + " ".join(f"{h:>14}" for h in heads)
        + (f" {'delta':>9}" if len(commits) == 2 else "")
    ]
    for r in res.get("models", []):
        cells = [
            fmt(x["tgs_steady"]) if x["tgs_steady"] is not None else (x["failure_class"] or x["status"])
            for x in r["runs"]
        ]
        d = (
            f" {r['tgs_delta_pct']:+8.2f}%"
            if r.get("tgs_delta_pct") is not None
            else (" " * 10 if len(commits) == 2 else "")
        )
        lines.append(f"  {r['model']:<20} {r['nodes']:>5} " + " ".join(f"{c:>14}" for c in cells) + d)
    return lines


def models_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    sbatch, overrides = split_passthrough(passthrough)
    check_sbatch_flags(sbatch, {**NODE_FLAGS, **PIN_FLAGS})
    check_overrides(overrides, {"steps": "use --steps", "dataset_type": "the sweep runs synthetic data"})
    names = all_models() if a.models == "all" else [t.strip() for t in a.models.split(",") if t.strip()]
    if not names:
        raise InputError("--models needs config names or all")
    models = list(dict.fromkeys(resolve_model(m) for m in names))
    commits = [resolve_commit(c.strip()) for c in a.commits.split(",") if c.strip()] if a.commits else []
    if len(commits) > 2 or (commits and len(set(commits)) != len(commits)):
        raise InputError("--commits takes one commit or two different ones (A,B: B is compared with A)")
    per_model = {m: a.nodes_per_model or documented_nodes(m) for m in models}
    node_lists: dict[str, list[str]] = {}
    if a.nodes:
        pool = parse_node_list(a.nodes)
        for m in models:
            if per_model[m] > len(pool):
                raise InputError(f"{m} needs {per_model[m]} node(s); --nodes names {len(pool)}")
            node_lists[m] = pool[: per_model[m]]  # the same nodes per model in every sweep given this list
    return {
        "model": ",".join(models),
        "models": models,
        "tag": a.tag,
        "commits": commits,
        "nodes_per_model": per_model,
        "node_lists": node_lists,
        "steps": a.steps,
        "sbatch": sbatch,
        "overrides": overrides,
        "notes": [],
    }


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `models` subcommand's options (COMMON: the options every kind takes)."""
    p = add_kind(sub, "models", "every model (or a list) at its documented node count, one or two commits", common)
    p.add_argument("--models", default="all", help="config names, comma-separated, or all (default)")
    p.add_argument("--commits", help="A or A,B: run each commit's checkout (a scratch clone); B vs A")
    p.add_argument(
        "--nodes-per-model", type=cli.positive_int, help="nodes per job (default: the config header's minimum, 80 GB)"
    )
    p.add_argument("--nodes", help="n1,n2,...: each model runs on the first N of them (the same list every sweep)")
    p.add_argument("--steps", type=cli.positive_int, default=10, help="training steps per job (default 10)")
    p.add_argument("--tag", default="", help="tag in front of each job's own tag")
