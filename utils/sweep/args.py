"""The command line pieces every kind of sweep builds its jobs from: MODEL[:TAG], the sbatch flags and
MaxText overrides after `--`, value and node lists, and the submit.sh command of one job.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from diagnosis.cli import InputError
from sweep.common import (
    OVERRIDE,
    PROG,
    REPO,
    SUBMIT,
    quiet_run,
)


def resolve_model(name: str) -> str:
    """The config name MODEL stands for, resolved by the launcher's own resolve_model (utils/launch/lib.sh)."""
    script = 'source "$1/utils/launch/lib.sh"; PROG=sweep.py; resolve_model "$2" "$1/configs"'
    res = quiet_run(["bash", "-c", script, "_", str(REPO), name])
    if res.returncode != 0:
        raise InputError((res.stderr.strip().splitlines() or [f"unknown model '{name}'"])[-1].removeprefix(f"{PROG}: "))
    return res.stdout.strip()


def split_model_arg(arg: str) -> tuple[str, str]:
    """MODEL[:TAG] -> (MODEL, TAG); the tag must already be a safe name (submit.sh would rewrite it)."""
    model, _, tag = arg.partition(":")
    if tag and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", tag):
        raise InputError(f"bad tag '{tag}': use letters, digits, '.', '_' or '-'")
    return model, tag


def join_tag(*parts: str) -> str:
    return "-".join(p for p in parts if p)


def submit_command(model: str, tag: str, nodes: int, sbatch: list[str], overrides: list[str]) -> list[str]:
    """The submit.sh argv of one job."""
    cmd = [str(SUBMIT), f"{model}:{tag}" if tag else model, "-N", str(nodes), *sbatch]
    return cmd + ["--", *overrides] if overrides else cmd


def override_key(item: str) -> str:
    return item.partition("=")[0]


def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """KEY=VALUE lists merged by key: extra wins, in the place of the value it replaces."""
    merged = {override_key(x): x for x in base}
    for x in extra:
        merged[override_key(x)] = x
    return list(merged.values())


def split_passthrough(rest: list[str]) -> tuple[list[str], list[str]]:
    """Arguments after `--` -> (sbatch flags, overrides): overrides after a second `--`; without
    one, KEY=VALUE tokens are overrides and everything else is an sbatch flag."""
    if "--" in rest:
        i = rest.index("--")
        sbatch, overrides = rest[:i], rest[i + 1 :]
    else:
        sbatch = [t for t in rest if not OVERRIDE.match(t)]
        overrides = [t for t in rest if OVERRIDE.match(t)]
    for t in overrides:
        if not OVERRIDE.match(t):
            raise InputError(f"override '{t}' is not KEY=VALUE (MaxText) or _env_NAME=VALUE (environment)")
    return sbatch, overrides


def flag_name(token: str) -> str:
    """'--nodes=2' -> '--nodes', '-N2' -> '-N', '-w' -> '-w'."""
    return token.partition("=")[0] if token.startswith("--") else token[:2]


def check_sbatch_flags(flags: list[str], forbidden: dict[str, str]) -> None:
    """Refuse flags the sweep sets itself. forbidden: flag -> what to use instead."""
    for f in flags:
        if f.startswith("-") and flag_name(f) in forbidden:
            raise InputError(f"sbatch flag '{f}' is set by the sweep: {forbidden[flag_name(f)]}")


def check_overrides(overrides: list[str], forbidden: dict[str, str]) -> None:
    for o in overrides:
        if override_key(o) in forbidden:
            raise InputError(f"override '{o}' is set by the sweep: {forbidden[override_key(o)]}")


def nonempty_path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (give a path)")
    return Path(text)


def is_env(item: str) -> bool:
    return item.startswith("_env_")


def parse_values(text: str) -> list[str]:
    """'1,2,4' -> ['1', '2', '4']: positive numbers, deduplicated, ascending."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError("--values needs at least one number, e.g. --values 1,2,4,8")
    out: dict[float, str] = {}
    for t in items:
        if not re.fullmatch(r"\d+(\.\d+)?|\.\d+", t) or float(t) <= 0:
            raise InputError(f"--values: '{t}' is not a positive number (e.g. --values 1,2,4,8)")
        out.setdefault(float(t), t)
    return [out[k] for k in sorted(out)]


def parse_node_list(text: str) -> list[str]:
    nodes = [t.strip() for t in text.split(",") if t.strip()]
    for n in nodes:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n):
            raise InputError(f"bad node name '{n}' (give host names, comma-separated: --nodes n1,n2,n3)")
    if len(set(nodes)) != len(nodes):
        raise InputError(f"--nodes lists a node twice: {text}")
    return nodes


NODE_FLAGS = {
    "-N": "use -N",
    "--nodes": "use -N",
    "-W": "the sweep polls scontrol",
    "--wait": "the sweep polls scontrol",
}


PIN_FLAGS = {"-w": "the sweep picks the nodes (--nodes)", "--nodelist": "the sweep picks the nodes (--nodes)"}


def common_params(a: argparse.Namespace, passthrough: list[str]) -> dict:
    model, tag = split_model_arg(a.model)
    model = resolve_model(model)
    sbatch, overrides = split_passthrough(passthrough)
    if getattr(a, "ignore_min_nodes", False):  # the sweep judged it (min_nodes_notes); submit.sh must not refuse
        sbatch += ["--ignore-min-nodes"]
    return {"model": model, "tag": tag, "sbatch": sbatch, "overrides": overrides}


def add_ignore_min_nodes(p: argparse.ArgumentParser, jobs: str) -> None:
    """--ignore-min-nodes for a kind that plans JOBS ("jobs", "2-node jobs", ...): min_nodes_notes reads it."""
    p.add_argument(
        "--ignore-min-nodes",
        action="store_true",
        help=f"plan {jobs} below the minimum node count of the config's header (refused by default)",
    )


def add_kind(
    sub: argparse._SubParsersAction, name: str, what: str, parent: argparse.ArgumentParser
) -> argparse.ArgumentParser:
    return sub.add_parser(name, parents=[parent], prog=f"{PROG} {name}", help=what)
