#!/usr/bin/env python3
"""Usage: utils/dev/joblog_dump.py LOG

Prints what the one job-log parser (utils/joblog.py) found in LOG, as JSON: for
debugging the parser. It runs under the project's environment (utils/setup_env.sh), which it
finds as the utils/ commands do.
"""

from __future__ import annotations

import dataclasses
import json
import runpy
import signal
import sys
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "entry.py"))["enter_venv"]()

try:
    import joblog
except ImportError:
    sys.exit(
        "joblog_dump.py: needs the project's environment: make it with utils/setup_env.sh (or set MAXTEXT_SLURM_VENV)"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = (__doc__ or "").strip().splitlines()[0]
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        return 0
    if len(argv) != 1:
        print(f"joblog_dump.py: expected one LOG argument (a job's .log file); {usage}", file=sys.stderr)
        return 2
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `joblog_dump.py LOG | head` ends quietly
    path = Path(argv[0])
    try:
        if not path.is_file():
            what = "no such file" if not path.exists() else "not a regular file"
            raise joblog.NotALog(f"'{argv[0]}': {what} (give a job's .log file)")
        s = joblog.scan(path)
    except OSError as e:
        print(f"joblog_dump.py: cannot read '{argv[0]}': {e.strerror or e} (give a job's .log file)", file=sys.stderr)
        return 2
    except joblog.NotALog as e:
        print(f"joblog_dump.py: {e}", file=sys.stderr)
        return 2
    out = dataclasses.asdict(s)
    out["steps"] = {
        "host": s.steps.host,
        "count": len(s.steps.step),
        "rampup": s.steps.rampup,
        "first": s.steps.step[:1],
        "last": s.steps.step[-1:],
    }
    out["hosts"] = {str(k): dataclasses.asdict(v) for k, v in s.hosts.items()}
    out["counts"] = dict(s.counts)
    json.dump(out, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
