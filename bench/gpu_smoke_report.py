#!/usr/bin/env python3
"""Usage: gpu_smoke_report.py STEPS (LABEL EXIT LOG PERF_JSON)...

The table of bench/gpu_smoke.sh: one row per run. LOG is the run's job log (its JOB SUMMARY read by
utils/joblog.py), PERF_JSON utils/perf.py's --json report of it (docs/perf.md); a run
refused before it started has LOG "-" and, in place of PERF_JSON, the line that refused it.
STEPS is the number of steps each run was asked for: a log is complete when its JOB SUMMARY says
`status: completed` and its `steps:` line runs from 0 to STEPS - 1.
Exit 1 when a run did not train to the end, else 0.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "utils" / "entry.py"))["enter_venv"]()

import joblog  # the one reader of the job log and its JOB SUMMARY (utils/ on PYTHONPATH)

HEAD = (
    *("run", "exit", "steps (JOB SUMMARY)", "log complete", "step s", "tokens/s/dev"),
    *("TFLOP/s MaxText", "6N est.", "MFU"),
)
SPAN = re.compile(r"^(\d+)\.\.(\d+) ")


def _num(value: object, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def row(steps: int, label: str, rc: str, log: str, perf_path: str) -> tuple[list[str], bool]:
    """The table's cells for one run, and whether it trained to the end."""
    if log == "-":
        return [label, rc, "none: refused", "no (why: below)", "-", "-", "-", "-", "-"], False
    summary = joblog.scan(log).summary
    seen = summary.get("steps", "(no JOB SUMMARY)")
    span = SPAN.match(seen)
    complete = summary.get("status") == "completed" and bool(span) and span.groups() == ("0", str(steps - 1))
    why = "yes" if complete else f"no ({summary.get('status', 'no summary')}, {steps} steps asked)"
    try:
        perf = json.loads(Path(perf_path).read_text())
    except (OSError, ValueError):
        perf = {}
    check = perf.get("tflops_check") or {}
    mfu = perf.get("mfu")
    cells = [
        label,
        rc,
        seen,
        why,
        _num((perf.get("step_time") or {}).get("median"), ".3f"),
        _num((perf.get("tgs") or {}).get("steady"), ",.0f"),
        _num(perf.get("tflops_per_device"), ".1f"),
        _num(check.get("expected_tflops_per_device"), ".1f"),
        f"{mfu * 100:.1f} % of {perf.get('peak_tflops')}" if isinstance(mfu, (int, float)) else "-",
    ]
    return cells, complete and rc == "0"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help") or (len(argv) - 2) % 4:
        print(__doc__.strip(), file=sys.stdout if len(argv) > 1 and argv[1] in ("-h", "--help") else sys.stderr)
        return 0 if len(argv) > 1 and argv[1] in ("-h", "--help") else 2
    steps = int(argv[1])
    table, notes, ok = [list(HEAD)], [], True
    for i in range(2, len(argv), 4):
        cells, trained = row(steps, *argv[i : i + 4])
        table.append(cells)
        ok = ok and trained
        if argv[i + 2] == "-":
            notes.append(f"{argv[i]}: refused before it started: {argv[i + 3]}")
    widths = [max(len(r[c]) for r in table) for c in range(len(HEAD))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    for note in notes:
        print(note)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
