"""The monitor's files in a (possibly shared) workspace, opened only when they are ours to trust.

A job directory, its `monitor/` directory and the files in them are opened once by path and then
used through the open descriptor (openat: `dir_fd=`), never through a link, so a directory that
someone renames or replaces afterwards cannot redirect a read or a write; a replacement is noticed
at the next poll (`Dir.verify`). The rule is utils/trust.py's: ours, not a link, not writable by
group or others; a refusal is trust.UntrustedPath, one line naming the path, its owner and mode.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

import trust
from trust import UntrustedPath

ADVICE = "the monitor acts only on a job directory, log and state of yours that nobody else can write"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse(what: str, path: Path | str, why: str, advice: str = ADVICE) -> UntrustedPath:
    return UntrustedPath(f"refusing {what} {path}: it {why}" + (f"; {advice}" if advice else ""))


def checked_fd(fd: int, what: str, path: Path | str, regular: bool = False) -> int:
    """fd when the file it opened is ours to trust (and a regular file when ``regular``); else
    the fd is closed and UntrustedPath raised."""
    st = os.fstat(fd)
    why = trust.problem(st, path)
    if why is None and regular and not stat.S_ISREG(st.st_mode):
        why = f"is not a regular file (mode {stat.S_IMODE(st.st_mode):04o})"
    if why:
        os.close(fd)
        raise _refuse(what, path, why)
    return fd


def _why_not(path: Path | str, dir_fd: int | None, e: OSError) -> str:
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except OSError:
        return f"cannot be opened ({e.strerror})"
    return trust.problem(st, path) or f"cannot be opened ({e.strerror})"


def open_file(name: str | Path, what: str, shown: Path | str, dir_fd: int | None = None) -> int | None:
    """A regular file of ours, opened for reading without following a link (``name`` relative to
    ``dir_fd``, shown as ``shown``); None when it does not exist."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _refuse(what, shown, _why_not(name, dir_fd, e)) from None
    return checked_fd(fd, what, shown, regular=True)


def read_file(
    name: str | Path, what: str, shown: Path | str, dir_fd: int | None = None, limit: int = 64 << 20
) -> bytes | None:
    """The first ``limit`` bytes of a trusted regular file (see open_file); None when it does not exist."""
    fd = open_file(name, what, shown, dir_fd)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


class Dir:
    """A directory of ours, held open; its files are read and written by name through the descriptor."""

    def __init__(self, fd: int, path: Path, what: str) -> None:
        self.fd, self.path, self.what = fd, path, what
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)

    @classmethod
    def open(cls, path: Path, what: str = "the job directory") -> Dir:
        """``path`` (no link, ours, writable by us only), held open. Raises UntrustedPath."""
        try:
            fd = os.open(path, _DIR)
        except OSError as e:
            raise _refuse(what, path, _why_not(path, None, e)) from None
        return cls(checked_fd(fd, what, path), path, what)

    def sub(self, name: str, what: str, mode: int = 0o700) -> Dir:
        """The directory ``name`` in this one, made ``mode`` when missing (never an inherited setgid
        bit); an existing one must be ours and writable by us only (then it is made ``mode``)."""
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        except OSError as e:
            raise UntrustedPath(f"cannot create the directory {self.path / name}: {e.strerror}") from None
        try:
            fd = os.open(name, _DIR, dir_fd=self.fd)
        except OSError as e:
            raise _refuse(what, self.path / name, _why_not(name, self.fd, e)) from None
        checked_fd(fd, what, self.path / name)
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
        return Dir(fd, self.path / name, what)

    def verify(self) -> None:
        """Raise UntrustedPath when the path no longer names this directory, or it is no longer ours
        to trust (renamed and replaced, linked, opened to others)."""
        try:
            st = os.lstat(self.path)
        except OSError as e:
            raise _refuse(
                self.what, self.path, f"is gone ({e.strerror}): renamed or removed since the monitor opened it"
            ) from None
        why = trust.problem(st, self.path)
        if why is None and (st.st_dev, st.st_ino) != self.ident:
            why = "was replaced by another directory since the monitor opened it"
        why = why or trust.problem(os.fstat(self.fd), self.path)
        if why:
            raise _refuse(self.what, self.path, why)

    @property
    def proc(self) -> Path:
        """A path that names this very directory for tools that take a path (Linux /proc)."""
        return Path(f"/proc/self/fd/{self.fd}")

    def read(self, name: str, what: str, limit: int = 64 << 20) -> bytes | None:
        return read_file(name, what, self.path / name, self.fd, limit)

    def read_json(self, name: str, what: str) -> object | None:
        """The JSON in ``name``; None when missing or damaged."""
        data = self.read(name, what)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def write(self, name: str, data: bytes) -> None:
        """Atomically: a new file (O_EXCL, mode 0600) renamed over ``name``; never through a link."""
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def write_json(self, name: str, data: object) -> None:
        self.write(name, json.dumps(data, indent=1).encode())

    def open_private(self, name: str, what: str, flags: int) -> int:
        """``name`` opened with ``flags`` | O_CREAT (mode 0600 when new), never through a link, and ours."""
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        except OSError as e:
            raise _refuse(what, self.path / name, _why_not(name, self.fd, e)) from None
        return checked_fd(fd, what, self.path / name, regular=True)

    def append(self, name: str, what: str, data: bytes) -> None:
        fd = self.open_private(name, what, os.O_WRONLY | os.O_APPEND)
        with os.fdopen(fd, "ab") as f:
            f.write(data)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
