"""A machine without some system program, for tests of what a command says when one is missing.

`path_without(bindir, "prometheus")` fills BINDIR with links to every program in /usr/local/bin,
/usr/bin and /bin except the ones named, and returns it as a PATH. Programs in /usr/sbin (munged,
slurmctld, slurmd) are found by the commands themselves whatever PATH says: `without_sbin(argv)`
runs ARGV in a private mount namespace where /usr/sbin (and /sbin, a link to it on Debian) is an
empty tmpfs, optionally as the user nobody (needs root; nothing outside the namespace changes).
"""

import re
from pathlib import Path

SYSTEM_BIN = ("/usr/local/bin", "/usr/bin", "/bin")


def path_without(bindir: Path, *names: str, pattern: str = "") -> str:
    """A PATH holding every program of SYSTEM_BIN but NAMES (and names matching PATTERN)."""
    bindir.mkdir(parents=True, exist_ok=True)
    hide = re.compile(pattern) if pattern else None
    for d in map(Path, SYSTEM_BIN):
        for exe in sorted(d.iterdir()) if d.is_dir() else []:
            link = bindir / exe.name
            if exe.name in names or (hide and hide.fullmatch(exe.name)) or link.exists() or link.is_symlink():
                continue
            link.symlink_to(exe)
    return str(bindir)


def without_sbin(argv: list[str], as_nobody: bool = False) -> list[str]:
    """ARGV run where /usr/sbin is empty (a tmpfs in a private mount namespace); as nobody if asked."""
    user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if as_nobody else []
    script = 'mount -t tmpfs none /usr/sbin && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *user, *argv]
