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
    """trust.read_under: the record when it and the path to it are ours (see there)."""
    return trust.read_under(root, path, what, limit)


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
