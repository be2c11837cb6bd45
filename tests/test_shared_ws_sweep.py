"""Sweeps in a shared workspace (docs/security.md#shared-workspaces): a sweep submits the commands of
its record and runs the submit.sh of its checkouts, so both live in the user's own root
(<workspace>/<user>/sweeps) and are used only when they are the user's. Two real users
(tests/helpers/users.py); here root is the victim who runs the sweep."""

import getpass
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, VENV, launcher_env, run

from helpers.users import as_user, ensure_users, reachable_base, shared_workspace

TOOL = str(REPO / "utils" / "sweep.py")


@pytest.fixture
def base():
    d = reachable_base()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def sweep(ws: Path, *args: str) -> subprocess.CompletedProcess:
    return run([str(VENV / "bin" / "python"), TOOL, *args], env=launcher_env(ws), timeout=120)


def payload(canary: Path) -> str:
    return f"#!/bin/sh\necho pwned > {canary}\n"


@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_a_planted_checkout_never_runs(base, kind):
    """The attacker makes the victim's root first and plants a checkout of the commit the victim will
    compare: `models --commits` refuses the root in one line; the planted submit.sh never runs."""
    import sweep.common as sweep_mod
    from diagnosis.cli import InputError

    _, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    canary = base / "canary"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    planted = ws / getpass.getuser() / "sweeps" / "checkouts" / head[:12]
    script = f"mkdir -p {planted} && printf '%s' \"$0\" > {planted}/submit.sh && chmod 755 {planted}/submit.sh"
    res = as_user(attacker, ["bash", "-c", script, payload(canary)], umask=0o002)
    assert res.returncode == 0, res.stderr
    with pytest.raises(
        InputError, match=rf"refusing the directory {ws}/{getpass.getuser()}: it is owned by mstattacker"
    ):
        sweep_mod.sweeps_dir(ws)
    with pytest.raises(InputError, match="owned by mstattacker"):
        sweep_mod.check_submit(ws, str(planted / "submit.sh"))
    with pytest.raises(InputError, match="a sweep runs .*submit.sh or a checkout in"):
        sweep_mod.check_submit(ws, str(base / "elsewhere" / "submit.sh"))
    assert not canary.exists()


@pytest.mark.parametrize("kind", ["sticky", "group"])
def test_a_record_someone_else_wrote_is_never_resumed(base, kind):
    """A record is a list of commands that resume submits: a record of the attacker's (or one others
    may write) is refused in one line, exit 2, and nothing of it runs."""
    _, attacker = ensure_users()
    ws = shared_workspace(base, kind)
    canary = base / "canary"
    evil = base / "evil.sh"
    evil.write_text(payload(canary))
    evil.chmod(0o755)
    rec = {
        "schema": "sweep/1",
        "sweep": "batch",
        "model": "tiny",
        "state": "interrupted",
        "started_at": "2026-11-27T00:00:00Z",
        "workspace": str(ws),
        "argv": ["batch", "tiny"],
        "params": {"model": "tiny", "values": ["1"]},
        "options": {"timeout": 60, "max_parallel": 1, "poll": 1},
        "jobs": [
            {
                "label": "bs1",
                "command": f"{evil} tiny",
                "status": "planned",
                "job_id": None,
                "failure_class": None,
                "tgs_steady": None,
                "final_loss": None,
            }
        ],
    }
    path = ws / "x-batch.json"
    res = as_user(attacker, ["bash", "-c", f"printf '%s' \"$0\" > {path}", json.dumps(rec)], umask=0o002)
    assert res.returncode == 0, res.stderr
    res = sweep(ws, "resume", str(path))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "refusing the sweep record" in res.stderr
    assert "owned by mstattacker" in res.stderr and "resume only a record of your own" in res.stderr
    # the victim's own record, but open to the group: refused as well
    mine = ws / "mine-batch.json"
    mine.write_text(json.dumps(rec))
    mine.chmod(0o664)
    res = sweep(ws, "resume", str(mine))
    assert res.returncode == 2 and "writable by others (mode 0664)" in res.stderr, res.stderr
    assert not canary.exists()
