#!/usr/bin/env python3
"""Usage: utils/observe/job_record.py read ROOT PATH [--what TEXT] [--advice TEXT] [--max BYTES]

Reads a small record a job's own node wrote into its job directory (the Ray head's address,
<job dir>/ray/head), trusting it only when it is ours: PATH and every directory between ROOT (the
workspace, which may be shared: itself not checked) and PATH must be owned by us, not a symbolic
link, and writable by neither group nor others (utils/trust.py's rule). The walk is race-free:
each directory is opened without following a link and checked on the opened descriptor, and the
next name is looked up in that descriptor, so a directory renamed or replaced under us (a 2775
group workspace lets any member rename the job dir) is never read through.

Prints the record (at most --max bytes, default 4096) on stdout.
Exit status: 0 read; 1 refused (one line on stderr naming the path, its owner and mode);
3 PATH does not exist yet (the caller may wait for it); 2 usage.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import stat
import sys
import types
from pathlib import Path


def _own_trust() -> types.ModuleType:
    """utils/trust.py of this clone (the one rule), by its path: never another clone's module that an
    environment's import roots may name."""
    spec = importlib.util.spec_from_file_location("trust", Path(__file__).resolve().parent.parent / "trust.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


trust = _own_trust()

MISSING = 3


def read_record(root: str, path: str, what: str, limit: int = 4096) -> bytes:
    """The first ``limit`` bytes of ``path`` (a regular file) when it and every directory between
    ``root`` and it are ours to trust. Raises FileNotFoundError when it does not exist yet and
    trust.UntrustedPath (one line) when it is not ours."""
    root_p, p = Path(os.path.abspath(root)), Path(os.path.abspath(path))
    try:
        parts = p.relative_to(root_p).parts
    except ValueError:
        raise trust.UntrustedPath(f"refusing {what} {path}: it is not under {root}") from None
    if not parts:
        raise trust.UntrustedPath(f"refusing {what} {path}: it is the workspace itself")
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
                    why = trust.problem(os.lstat(name, dir_fd=fd), cur)
                except OSError:
                    why = None
                raise trust.UntrustedPath(
                    f"refusing {what} {path}: {cur} {why or f'cannot be opened ({e.strerror})'}"
                ) from None
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            why = trust.problem(st, cur)
            if why:
                raise trust.UntrustedPath(f"refusing {what} {path}: {cur} {why}")
        if not stat.S_ISREG(st.st_mode):
            raise trust.UntrustedPath(f"refusing {what} {path}: it is not a regular file")
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read(limit)
    finally:
        if fd >= 0:
            os.close(fd)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="job_record.py", description="Read a job record that is ours to trust.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rd = sub.add_parser("read", help="print the record at PATH (exit 3 while it does not exist)")
    rd.add_argument("root", help="the workspace (may be shared; itself not checked)")
    rd.add_argument("path", help="the record, under ROOT")
    rd.add_argument("--what", default="the record", help="what it is, for the refusal line")
    rd.add_argument("--advice", default="", help="what to do, appended to the refusal line")
    rd.add_argument("--max", type=int, default=4096, help="read at most this many bytes (4096)")
    args = ap.parse_args(argv)
    try:
        data = read_record(args.root, args.path, args.what, args.max)
    except FileNotFoundError:
        return MISSING
    except trust.UntrustedPath as e:
        print(f"{e}" + (f"; {args.advice}" if args.advice else ""), file=sys.stderr)
        return 1
    except OSError as e:  # the workspace itself cannot be opened
        print(f"cannot read {args.what} {args.path}: {e.strerror}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
