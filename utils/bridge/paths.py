"""Where a path really leads, and whether we may read it: one rule for the host bridge and the MCP server.

A path argument is checked by where it leads, not by its text: every symbolic link on the way is
followed here, one component at a time, so that `<ws>/../../home/u/.ssh/id_rsa`, a bare job name that
is a link in a shared workspace, or `--workspace NAME` with NAME a link all end where they really point.
`confine()` accepts the path when it ends inside one of the allowed roots and every link it followed
belongs to us or to root (a teammate's link in a shared workspace is refused wherever it points: it
is the teammate who chooses, and may later change, what we would read). docs/mcp.md, docs/host-bridge.md.
Standard library only (the bridge's server imports it; its `call` side does not).
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

MAX_LINKS = 40  # as the kernel's ELOOP limit


class Outside(Exception):
    """A path that leads out of the allowed roots or through someone else's link; str() is one line.
    ``real``: where the path leads; ``link``: the link of someone else's on the way (None: no such link)."""

    def __init__(self, message: str, real: str = "", link: str | None = None) -> None:
        super().__init__(message)
        self.real, self.link = real, link


def owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def describe(path: str) -> str:
    """'owner U, mode 0644' of what PATH leads to ('missing' when nothing)."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return f"owner {owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}"


def walk(path: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> tuple[str, list[tuple[str, int]]]:
    """(the real path PATH leads to, [(link, its owner's uid)] for each link followed on the way).
    A relative PATH starts at BASE (default the working directory). Components that do not exist are
    kept as they are (the end of a path that is not there yet). OSError for a link loop."""
    start = os.fspath(base) if base is not None else os.getcwd()
    text = os.fspath(path)
    todo = list(reversed(Path(text).parts)) if text else []
    cur = "/" if text.startswith("/") else os.path.realpath(start)
    links: list[tuple[str, int]] = []
    missing = False
    while todo:
        part = todo.pop()
        if part in ("", ".", "/"):
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, part)
        if missing:
            cur = nxt
            continue
        try:
            st = os.lstat(nxt)
        except (FileNotFoundError, NotADirectoryError):
            missing, cur = True, nxt
            continue
        if stat.S_ISLNK(st.st_mode):
            links.append((nxt, st.st_uid))
            if len(links) > MAX_LINKS:
                raise OSError(f"more than {MAX_LINKS} symbolic links (a loop?) in {text}")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo.extend(reversed(Path(target).parts))
            continue
        cur = nxt
    return cur, links


def confine(
    path: str | os.PathLike[str],
    roots: Iterable[str | os.PathLike[str]],
    what: str,
    base: str | os.PathLike[str] | None = None,
    advice: str = "",
) -> Path:
    """The real path PATH leads to, when it lies in one of ROOTS (each taken by its real path) and
    every link followed on the way is ours or root's; else Outside with one line naming the path,
    where it leads, its owner and mode, and ADVICE."""
    tail = f"; {advice}" if advice else ""
    try:
        real, links = walk(path, base)
    except OSError as e:
        raise Outside(f"refusing {what} {path}: {e.strerror or e}{tail}") from None
    me = os.geteuid()
    for link, uid in links:
        if uid not in (me, 0):
            raise Outside(
                f"refusing {what} {path}: {link} is a symbolic link of {owner(uid)} (to {os.readlink(link)}), "
                f"not yours; only your own links are followed{tail}",
                real,
                link,
            )
    real_roots = [os.path.realpath(r) for r in roots]
    if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in real_roots):
        where = real if real != os.fspath(path) else "it"
        raise Outside(
            f"refusing {what} {path}: {where} ({describe(real)}) is outside {', '.join(real_roots)}{tail}", real
        )
    return Path(real)
