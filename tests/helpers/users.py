"""Two real users of one Unix group for the shared-workspace attack tests (docs/security.md).

`ensure_users()` makes (once, as root: useradd) a victim and an attacker, both in the group
GROUP, with home directories. `as_user()` runs a command as one of them (setpriv: real and
effective uid/gid, the user's groups), with a chosen umask and a clean environment.
`shared_workspace()` makes the two kinds of shared JOB_WORKSPACE real clusters have: scratch with
the sticky bit (1777, root's) and a group project directory (2775, setgid, owned by root:GROUP),
under a base directory both users can reach (pytest's tmp_path is 0700 root's, so not there).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GROUP = "mstteam"
VICTIM = "mstvictim"
ATTACKER = "mstattacker"
# Fixed ids far from the usual 1000+ range: fixtures elsewhere use uid 1001 as "a user this machine
# does not know" (tests/fixtures/gpu: a foreign process on a GPU).
IDS = {GROUP: 64100, VICTIM: 64101, ATTACKER: 64102}


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path


def _user(name: str) -> User:
    pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir))


def reach_interpreter() -> None:
    """Let the other users run this test run's Python (the project's environment): every directory
    above its real interpreter and the environment gets the search bit for others (a pyenv under
    /root is 0700). Search only, no listing; left so, since other test workers may be running as
    these users."""
    for p in (Path(os.path.realpath(sys.executable)), Path(sys.prefix).resolve()):
        for d in p.parents:
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH:
                d.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def ensure_users() -> tuple[User, User]:
    """The victim and the attacker (created on first use; needs root), both able to run the
    project's Python environment (reach_interpreter)."""
    if os.geteuid() != 0:
        raise PermissionError("the two-user tests make real users: run them as root (CI does)")
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        res = subprocess.run(["groupadd", "-g", str(IDS[GROUP]), GROUP], capture_output=True, text=True)
        if res.returncode != 0:  # another test worker may have made it just now
            grp.getgrnam(GROUP)
    for name in (VICTIM, ATTACKER):
        try:
            pwd.getpwnam(name)
        except KeyError:
            res = subprocess.run(
                ["useradd", "-m", "-u", str(IDS[name]), "-U", "-s", "/bin/bash", "-G", GROUP, name],
                capture_output=True,
                text=True,
            )
            if res.returncode != 0:
                pwd.getpwnam(name)
    reach_interpreter()
    return _user(VICTIM), _user(ATTACKER)


def as_user(
    user: User,
    cmd: list[str],
    env: dict[str, str] | None = None,
    umask: int = 0o022,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 600,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``cmd`` as ``user`` with ``umask``, HOME/USER/LOGNAME/PATH of that user plus ``env``
    (nothing else of the caller's environment), stdout and stderr captured as text."""
    base = {
        "HOME": str(user.home),
        "USER": user.name,
        "LOGNAME": user.name,
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        # the repository belongs to root: let git read it as another user (snapshots list its files)
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
    }
    full = [
        "setpriv",
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--init-groups",
        "--",
        "bash",
        "-c",
        f'umask {umask:03o}; exec "$@"',
        "as_user",
        *cmd,
    ]
    return subprocess.run(
        full,
        env={**base, **(env or {})},
        cwd=cwd or user.home,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def reachable_base() -> Path:
    """A new directory every user can enter (0755, root's), for workspaces; remove it with
    shutil.rmtree when done."""
    d = Path(tempfile.mkdtemp(prefix="mst-shared-", dir="/var/tmp"))
    d.chmod(0o755)
    return d


def shared_workspace(base: Path, kind: str) -> Path:
    """A shared JOB_WORKSPACE under ``base``: kind "sticky" (1777 scratch) or "group" (2775, the
    group GROUP's project directory)."""
    ws = base / f"ws-{kind}"
    ws.mkdir()
    if kind == "sticky":
        ws.chmod(0o1777)
    elif kind == "group":
        shutil.chown(ws, "root", GROUP)
        ws.chmod(0o2775)
    else:
        raise ValueError(f"kind must be sticky or group, got {kind!r}")
    return ws
