#!/usr/bin/env python3
"""Usage: utils/dev/alert_rules.py [--check]

Writes utils/observe/alert_rules.yml, the rules file a RAY=1 job's Prometheus evaluates
(utils/observe/job_services.sh), from the alert table utils/diagnosis/alerts.tsv (through
utils/diagnosis/alerts.py: the same numbers diagnose's checks use). Without options it rewrites the
file when it differs; --check only compares and exits 1 when it differs (tests/test_alert_rules.py
runs the same check). It runs under the project's environment (utils/setup_env.sh), which it finds
as the utils/ commands do.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "entry.py"))["enter_venv"]()

from diagnosis import alerts

OUT = Path(__file__).resolve().parents[1] / "observe" / "alert_rules.yml"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print((__doc__ or "").strip())
        return 0
    if argv not in ([], ["--check"]):
        print("alert_rules.py: expected no argument or --check; see --help", file=sys.stderr)
        return 2
    want = alerts.rules_yaml()
    have = OUT.read_text() if OUT.exists() else ""
    if have == want:
        return 0
    if argv:
        print(f"alert_rules.py: {OUT} differs from its table: run utils/dev/alert_rules.py", file=sys.stderr)
        return 1
    OUT.write_text(want)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
