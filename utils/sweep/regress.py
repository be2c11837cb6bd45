"""regress: rerun a baseline job's MODEL:TAG, node count and MaxText overrides from the current code
and compare steady tokens/s/device and final loss (its sbatch flags and _env_ values replayed only
when asked, never a <redacted> one).
"""

from __future__ import annotations

import argparse
import math
import os
import pwd
import re
import shlex
from pathlib import Path

from diagnosis import cli, locate, triage
from diagnosis.cli import InputError
from sweep.args import (
    NODE_FLAGS,
    add_kind,
    check_sbatch_flags,
    is_env,
    merge_overrides,
    override_key,
    resolve_model,
    split_model_arg,
    split_passthrough,
)
from sweep.common import (
    OVERRIDE,
    SUBMIT,
    number,
)
from sweep.loop import Job, Sweep


def parse_submit_command(text: str) -> tuple[str, int, list[str], list[str]]:
    """A recorded 'submit.sh MODEL[:TAG] [-N N] [SBATCH...] [-- OVERRIDES...]' -> its parts
    (the same argument grammar as submit.sh)."""
    if "$'" in text:  # bash's printf %q for control characters: shlex would misread it
        raise InputError(
            f"the baseline command has a $'...'-quoted value (control characters), which regress does "
            f"not replay: rerun it by hand: {text}"
        )
    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise InputError(f"cannot read the baseline command '{text}': {e}") from None
    if len(tokens) < 2 or Path(tokens[0]).name != "submit.sh":
        raise InputError(f"the baseline command is not a submit.sh command: {text}")
    model_arg, rest, nodes, sbatch, overrides = tokens[1], tokens[2:], "1", [], []
    while rest:
        t = rest.pop(0)
        if t == "--":
            overrides = rest
            break
        if t in ("-N", "--nodes") and rest:
            nodes = rest.pop(0)
        elif t.startswith("--nodes="):
            nodes = t.removeprefix("--nodes=")
        elif t.startswith("-N") and t != "-N":
            nodes = t[2:]
        else:
            sbatch.append(t)
    if not re.fullmatch(r"[1-9]\d*", nodes):
        raise InputError(f"the baseline command has a bad node count '{nodes}': {text}")
    return model_arg, int(nodes), sbatch, overrides


REDACTED = "<redacted>"


MODEL_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9_][A-Za-z0-9._-]*)?")


def owner_of(path: Path) -> tuple[int, str]:
    """(uid, user name) of a file's owner."""
    uid = path.stat().st_uid
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, f"uid {uid}"


def baseline_of(job: str, workspace: Path) -> dict:
    """What regress needs of the baseline job; InputError when it cannot be rerun or compared.

    The recorded command is split into what regress replays by default (MODEL:TAG, node count,
    MaxText overrides) and what it only shows unless asked (sbatch flags, _env_ values): the
    command.txt may belong to someone else in a shared workspace."""
    try:
        found = locate.find_log(job, workspace)
    except InputError as e:
        raise InputError(f"baseline: {e}") from None
    log, job_dir = found.log, found.dir
    if job_dir is None:
        raise InputError(f"baseline {job} has no job directory next to {log} (its artifact holds the command)")
    path = job_dir / "artifact" / ".submit" / "command.txt"
    try:
        if not path.is_file():
            raise InputError(f"baseline {job}: no submit command at {path} (a job submitted by submit.sh has one)")
        command = path.read_text(errors="replace").strip()
        owner_uid, owner = owner_of(path)
    except OSError as e:
        raise InputError(f"baseline {job}: cannot read {path}: {e.strerror or e}") from None
    model_arg, nodes, sbatch, overrides = parse_submit_command(command)
    if not MODEL_ARG.fullmatch(model_arg):
        raise InputError(f"baseline {job}: its command's MODEL[:TAG] '{model_arg}' is not a model name ({path})")
    bad = [o for o in overrides if not OVERRIDE.match(o)]
    if bad:
        raise InputError(f"baseline {job}: its command has '{bad[0]}' after `--`, not KEY=VALUE ({path})")
    try:
        r = triage.Triage(log, job_dir, triage.Options())
        rep = r.report()
    except (InputError, OSError, ValueError) as e:
        raise InputError(f"baseline {job}: cannot read its log: {e}") from None
    if rep["tgs"]["steady"] is None:
        raise InputError(
            f"baseline {job} has no steady tokens/s/device to compare with (status {rep['status']}"
            f"{', ' + rep['failure_class'] if rep['failure_class'] else ''})"
        )
    steps = next((o.partition("=")[2] for o in overrides if override_key(o) == "steps"), None)
    return {
        "job_id": rep["job_id"],
        "log": str(log),
        "job_dir": str(job_dir),
        "command": command,
        "command_file": str(path),
        "command_owner": owner,
        "command_owner_is_you": owner_uid == os.getuid(),
        "model": (r.scan.header.get("model") or "").split(" ")[0] or None,
        "model_arg": model_arg,
        "nodes": nodes,
        "sbatch": sbatch,
        "overrides": [o for o in overrides if not is_env(o)],
        "env": [o for o in overrides if is_env(o)],
        "steps": steps,
        "status": rep["status"],
        "tgs_steady": rep["tgs"]["steady"],
        "final_loss": r.scan.steps.final_loss(),
        "last_step": rep["progress"]["last_step"],
    }


def check_not_redacted(job: str, items: list[str], how: str) -> None:
    """A redacted value can never be replayed: InputError naming it and what to do instead."""
    for item in items:
        if REDACTED in item:
            name = override_key(item) if OVERRIDE.match(item) else item
            what = f"'{name}' was redacted in its command.txt" + (f" ({item})" if name != item else "")
            raise InputError(f"baseline {job}: {what}; a redacted value cannot be replayed: {how.format(name=name)}")


def drive_regress(sw: Sweep) -> None:
    p = sw.params
    sw.plan("rerun", shlex.split(p["command"]), baseline=p["baseline"]["job_id"])
    if sw.opts.dry_run:
        return
    sw.run(sw.jobs)
    sw.result = regress_result(p["baseline"], sw.jobs[0], p["threshold_pct"], p["loss_tolerance_pct"], p["same_steps"])


def regress_result(base: dict, job: Job, threshold_pct: float, loss_tol_pct: float, same_steps: bool) -> dict:
    delta = None
    if job.measured and base["tgs_steady"]:
        delta = round(100 * (job.tgs_steady - base["tgs_steady"]) / base["tgs_steady"], 2)
    if not job.measured:
        verdict = "failed"
    elif delta is not None and delta <= -threshold_pct:
        verdict = "regression"
    elif delta is not None and delta >= threshold_pct:
        verdict = "faster"
    else:
        verdict = "same"
    loss_delta, loss_verdict = None, "not_compared"
    old_loss = number(base["final_loss"])  # "nan"/"inf" in a resumed sweep's record
    if same_steps and job.final_loss is not None and old_loss is not None:
        new, old = job.final_loss, old_loss
        if math.isfinite(new) and math.isfinite(old):
            loss_delta = round(new - old, 6)
            rel = abs(loss_delta) / max(abs(old), 1e-12)
            loss_verdict = "changed" if 100 * rel > loss_tol_pct else "same"
        else:  # nan or inf: training diverged, on one side or on both alike
            loss_verdict = "same" if str(new) == str(old) else "changed"
    if verdict == "failed":
        conclusion = f"the rerun did not complete ({job.status}{', ' + job.failure_class if job.failure_class else ''})"
    else:
        conclusion = (
            f"{job.tgs_steady:.6g} vs {base['tgs_steady']:.6g} tokens/s/device ({delta:+.2f} %, "
            f"threshold {threshold_pct:g} %): {verdict}"
        )
    if loss_verdict != "not_compared":
        conclusion += f"; final loss {job.final_loss:g} vs {old_loss:g}: {loss_verdict}"
    elif not same_steps:
        conclusion += "; final loss not compared (different step count)"
    return {
        "baseline": {k: base[k] for k in ("job_id", "status", "tgs_steady", "final_loss", "last_step", "command")},
        "rerun": {
            "job_id": job.job_id,
            "status": job.status,
            "failure_class": job.failure_class,
            "tgs_steady": job.tgs_steady,
            "final_loss": job.final_loss,
            "last_step": job.last_step,
        },
        "tgs_delta_pct": delta,
        "threshold_pct": threshold_pct,
        "verdict": verdict,
        "loss_delta": loss_delta,
        "loss_tolerance_pct": loss_tol_pct,
        "loss_verdict": loss_verdict,
        "conclusion": conclusion,
    }


def regress_params(a: argparse.Namespace, passthrough: list[str], workspace: Path) -> dict:
    model, tag = split_model_arg(a.model)
    if tag:
        raise InputError("regress reruns the baseline's own MODEL:TAG; give MODEL without a tag")
    model = resolve_model(model)
    base = baseline_of(a.baseline, workspace)
    base_model = base["model"] or resolve_model(split_model_arg(base["model_arg"])[0])
    if base_model != model:
        raise InputError(f"baseline {a.baseline} trained '{base_model}', not '{model}'")
    sbatch, extra = split_passthrough(passthrough)
    check_sbatch_flags(sbatch, NODE_FLAGS)
    job = a.baseline
    replayed = base["overrides"] + (base["env"] if a.replay_env else [])
    overrides = merge_overrides(replayed, extra)
    if a.steps is not None:
        overrides = merge_overrides(overrides, [f"steps={a.steps}"])
    check_not_redacted(
        job,
        [o for o in overrides if not is_env(o)],
        "give {name}=VALUE yourself after `-- --` (it replaces the recorded one)",
    )
    check_not_redacted(
        job, [o for o in overrides if is_env(o)], "give {name}=VALUE yourself after `-- --`, or leave out --replay-env"
    )
    base_sbatch = base["sbatch"] if a.replay_sbatch else []
    if a.replay_sbatch:
        check_not_redacted(job, base_sbatch, "give the flag yourself after `--`, or leave out --replay-sbatch")
        try:
            check_sbatch_flags(base_sbatch, NODE_FLAGS)
        except InputError as e:
            raise InputError(f"baseline {job}: {e} (leave out --replay-sbatch)") from None
    new_steps = next((o.partition("=")[2] for o in overrides if override_key(o) == "steps"), None)
    nodes = a.num_nodes or base["nodes"]
    argv = [str(SUBMIT), base["model_arg"], "-N", str(nodes), *base_sbatch, *sbatch]
    argv += ["--", *overrides] if overrides else []
    notes = []
    if not base["command_owner_is_you"]:
        notes.append(
            f"the baseline's command.txt ({base['command_file']}) is owned by {base['command_owner']}, not "
            "by you: read what it asks for before replaying its sbatch flags or environment"
        )
    for what, items, flag, on in (
        ("sbatch flags", base["sbatch"], "--replay-sbatch", a.replay_sbatch),
        ("environment values (_env_)", base["env"], "--replay-env", a.replay_env),
    ):
        if items and on:
            notes.append(f"replaying the baseline's {what} ({flag}): {shlex.join(items)}")
        elif items:
            notes.append(
                f"the baseline's {what} are NOT replayed: {shlex.join(items)} (add {flag} to replay them, "
                "or give the ones you want after `--`)"
            )
    return {
        "model": model,
        "baseline": base,
        "command": shlex.join(argv),
        "same_steps": new_steps == base["steps"],
        "threshold_pct": a.threshold,
        "loss_tolerance_pct": a.loss_tolerance,
        "replay": {"sbatch": a.replay_sbatch, "env": a.replay_env},
        "not_replayed": {
            "sbatch": [] if a.replay_sbatch else base["sbatch"],
            "env": [] if a.replay_env else base["env"],
        },
        "notes": notes,
    }


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `regress` subcommand's options (COMMON: the options every kind takes)."""
    p = add_kind(sub, "regress", "rerun a baseline job and compare", common)
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--baseline", required=True, help="baseline job id, job name, job directory or log")
    p.add_argument("--steps", type=cli.positive_int, help="training steps (default: the baseline's)")
    p.add_argument("-N", dest="num_nodes", type=cli.positive_int, help="nodes (default: the baseline's)")
    p.add_argument(
        "--threshold",
        type=cli.positive_float,
        default=3.0,
        help="slower than the baseline by this many percent is a regression (default 3)",
    )
    p.add_argument(
        "--loss-tolerance",
        type=cli.positive_float,
        default=1.0,
        help="final loss differing by more than this many percent is 'changed' (default 1)",
    )
    p.add_argument(
        "--replay-sbatch",
        action="store_true",
        help="also replay the baseline's recorded sbatch flags (default: shown, not replayed)",
    )
    p.add_argument(
        "--replay-env",
        action="store_true",
        help="also replay the baseline's recorded _env_NAME=VALUE values (default: shown, not replayed)",
    )
