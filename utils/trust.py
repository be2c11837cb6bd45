"""Trust in a shared workspace: which paths may decide what runs or where we write.

On a shared JOB_WORKSPACE (1777 scratch, 2775 group directory) anyone else may have made, replaced
or linked a path. A path is ours to trust when it is not a symbolic link, is owned by us, and
neither group nor others may write it; under a shared root every directory between the root and
the path must be so too. utils/launch/lib.sh (trust_problem, check_trusted...) is the same rule
for the launcher. Standard library only: every tool imports it.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path


class UntrustedPath(Exception):
    """A path that is not ours to trust; str() is one line naming it, its owner and mode."""


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def problem(st: os.stat_result, path: str | os.PathLike[str]) -> str | None:
    """Why a path with lstat() result ``st`` is not ours to trust (a phrase), or None when it is."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symbolic link (to {target}), owned by {_owner(st.st_uid)}"
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        return f"is owned by {_owner(st.st_uid)} (mode {mode:04o}), not by you ({_owner(os.geteuid())})"
    if mode & 0o022:
        return f"is writable by others (mode {mode:04o})"
    return None


def check(path: str | os.PathLike[str], what: str, advice: str = "") -> None:
    """Raise UntrustedPath unless ``path`` is ours to trust."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        why: str | None = "does not exist"
    except OSError as e:
        why = f"cannot be read ({e.strerror})"
    else:
        why = problem(st, path)
    if why:
        raise UntrustedPath(f"refusing {what} {path}: it {why}" + (f"; {advice}" if advice else ""))


def check_under(root: str | os.PathLike[str], path: str | os.PathLike[str], what: str, advice: str = "") -> None:
    """check() for ``path`` and every directory between ``root`` (itself excluded: it may be a shared
    workspace) and it. ``path`` must lie under ``root`` by its text (no '..')."""
    root_p, p = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    try:
        rel = p.relative_to(root_p)
    except ValueError:
        raise UntrustedPath(f"refusing {what} {path}: it is not under {root}") from None
    cur = root_p
    for part in rel.parts:
        cur = cur / part
        check(cur, what, advice)


def is_trusted(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is ours to trust (see check())."""
    try:
        return problem(os.lstat(path), path) is None
    except OSError:
        return False


def open_trusted(path: str | os.PathLike[str], what: str, flags: int = os.O_RDONLY, advice: str = "") -> int:
    """Open ``path`` without following a link and check the opened file itself (no race between
    check and use); returns the descriptor. Raises UntrustedPath."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        try:
            st = os.lstat(path)
        except OSError:
            raise UntrustedPath(f"refusing {what} {path}: it cannot be opened ({e.strerror})") from None
        raise UntrustedPath(f"refusing {what} {path}: it {problem(st, path) or e.strerror}") from None
    why = problem(os.fstat(fd), path)
    if why:
        os.close(fd)
        raise UntrustedPath(f"refusing {what} {path}: it {why}" + (f"; {advice}" if advice else ""))
    return fd


def read_trusted(path: str | os.PathLike[str], what: str, limit: int = 16 << 20, advice: str = "") -> bytes:
    """The first ``limit`` bytes of a file that is ours to trust. Raises UntrustedPath."""
    fd = open_trusted(path, what, advice=advice)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def own_dir(path: str | os.PathLike[str], mode: int = 0o755) -> Path:
    """``path`` as a directory of ours that only we can write: made with mkdir when missing (a name
    someone else made first is refused), ``mode`` without an inherited setgid bit. Raises UntrustedPath."""
    p = Path(path)
    try:
        os.mkdir(p, 0o700)
        os.chmod(p, mode)  # an explicit chmod also clears the setgid bit mkdir inherits
    except FileExistsError:
        pass
    except OSError as e:
        raise UntrustedPath(f"cannot create the directory {p}: {e.strerror}") from None
    check(p, "the directory", "remove it or use a JOB_WORKSPACE of your own")
    return p


def create_new(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """Create ``path`` as a new file (O_EXCL, never through a link); returns the descriptor.
    Raises UntrustedPath when it exists."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileExistsError:
        raise UntrustedPath(f"refusing to write {path}: it exists already") from None
    except OSError as e:
        raise UntrustedPath(f"cannot create {path}: {e.strerror}") from None


def read_under(root: str | os.PathLike[str], path: str | os.PathLike[str], what: str, limit: int = 4096) -> bytes:
    """The first ``limit`` bytes of ``path`` (a regular file) when it and every directory between
    ``root`` and it are ours to trust, walked with descriptors (O_NOFOLLOW, each checked as opened),
    so no swap between check and read can feed it another file. Raises FileNotFoundError when it
    does not exist yet and UntrustedPath (one line) when it is not ours."""
    root_p, p = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    try:
        parts = p.relative_to(root_p).parts
    except ValueError:
        raise UntrustedPath(f"refusing {what} {path}: it is not under {root}") from None
    if not parts:
        raise UntrustedPath(f"refusing {what} {path}: it is the workspace itself")
    fd = os.open(root_p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    cur = root_p
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            cur = cur / name
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                nxt = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as e:  # a link (ELOOP), not a directory, no access: say what it is
                try:
                    why = problem(os.lstat(name, dir_fd=fd), cur)
                except OSError:
                    why = None
                raise UntrustedPath(
                    f"refusing {what} {path}: {cur} {why or f'cannot be opened ({e.strerror})'}"
                ) from None
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            why = problem(st, cur)
            if why:
                raise UntrustedPath(f"refusing {what} {path}: {cur} {why}")
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPath(f"refusing {what} {path}: it is not a regular file")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read(limit)
    finally:
        if fd >= 0:
            os.close(fd)
