"""What every part of the sweep shares: its names and constants, progress lines, strict JSON, the
helpers it runs, and where its records and checkouts may live (a shared workspace).
"""

from __future__ import annotations

import math
import os
import pwd
import re
import subprocess
import sys
import time
from pathlib import Path

import trust
from diagnosis.cli import InputError

REPO = Path(__file__).resolve().parents[2]


SUBMIT = REPO / "submit.sh"


PROG = "sweep.py"


SCHEMA = "sweep/1"  # the record's "schema" (docs/sweep.md); records written before it have "version": 1


KINDS = ("batch", "nodes", "bisect", "regress", "models")  # the kinds that submit jobs (cli.DRIVERS)
OOM_CLASSES = ("oom_device", "oom_host")


ENDED = {"completed", "failed", "cancelled", "timeout", "unknown", "submit_failed"}


USABLE_NODE_STATES = {"idle", "alloc", "mix", "comp", "plnd"}


OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*=")


class Interrupted(Exception):
    """A stop signal arrived while the sweep ran."""


def now_iso(ts: float | None = None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def say(msg: str) -> None:
    """Progress for people, on stderr (stdout is the report)."""
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def strict(x: object) -> object:
    """X with every nan/inf float written as the string "nan", "inf" or "-inf" (a diverged loss):
    the record and --json stay strict JSON, which json.loads of any language reads."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict(v) for v in x]
    return x


def number(x: object) -> float | None:
    """A number of a record back as a float ("nan", "inf", "-inf" too); None for anything else."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return float(x)
    if x in ("nan", "inf", "-inf"):
        return float(str(x))
    return None


def quiet_run(cmd: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a helper in its own session: a Ctrl-C meant for the sweep never reaches it half-way."""
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env, start_new_session=True
    )


def sweeps_dir(workspace: Path) -> Path:
    """This user's sweep folder, <workspace>/<user>/sweeps (the user's root, docs/security.md#shared-
    workspaces): made ours when missing; InputError (one line) when it, or the root, is someone else's,
    a link or writable by others. Records there are resubmitted by --resume, checkouts there run."""
    root = workspace / pwd.getpwuid(os.geteuid()).pw_name
    try:
        for d in (root, root / "sweeps"):
            trust.own_dir(d)
    except trust.UntrustedPath as e:
        raise InputError(f"{e} (set --workspace to a directory you can write)") from None
    return root / "sweeps"


def check_submit(workspace: Path, argv0: str) -> None:
    """A job's submit.sh runs only from this repository or from a checkout of ours in
    sweeps_dir(): InputError otherwise (a record can name anything)."""
    if argv0 == str(SUBMIT):
        return
    checkouts = workspace / pwd.getpwuid(os.geteuid()).pw_name / "sweeps" / "checkouts"
    path = Path(argv0)
    if path.name != "submit.sh" or path.parent.parent != checkouts:
        raise InputError(f"refusing to run {argv0}: a sweep runs {SUBMIT} or a checkout in {checkouts} only")
    try:
        trust.check_under(workspace, path, "the sweep's checkout")
    except trust.UntrustedPath as e:
        raise InputError(str(e)) from None


def fmt(x: float | str | None, spec: str = ".6g") -> str:
    """A number of a record for people ("nan"/"inf" as they are)."""
    return "-" if x is None else x if isinstance(x, str) else format(x, spec)
