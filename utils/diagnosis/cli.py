"""The command line the diagnosis tools share (triage, diagnose, perf, sweep).

- `Parser`: argparse whose --help starts with "Usage: " and keeps the description's line breaks
  (`Help`), and whose usage errors are one line on stderr, "PROG: what is wrong (see PROG --help)",
  exit BAD_INPUT, with no usage dump and no traceback.
- `number(...)`: an argparse type for a finite number within bounds, with a message that says
  what would be right.
- `InputError` and `fail`: bad input found after parsing (no such job, not a job log) is raised as
  InputError and printed by the tool's main() as one line, "PROG: message", exit BAD_INPUT.
- The exit codes, by name.
- `emit`: the report as JSON (--json) or as text, ending quietly when the reader has gone
  (`tool ... --json | head`).

Standard library only (utils/triage.py needs nothing else).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

OK = 0  # the tool did its work (a failed job that was triaged is OK)
FAILED = 1  # the tool's own "no": diagnose: Prometheus could not serve; sweep: no measurement, a regression
BAD_INPUT = 2  # bad arguments or input: one line on stderr, nothing done
INTERRUPTED = 130  # stopped by a signal after cleaning up (sweep)


class InputError(Exception):
    """Bad input: printed as one line on stderr (see fail), exit BAD_INPUT, nothing done."""


def one_line(message: object) -> str:
    """MESSAGE on one line (a path or value with a line break in it must not make two)."""
    return " ".join(str(message).splitlines())


def fail(prog: str, message: object, code: int = BAD_INPUT) -> int:
    """Print "PROG: MESSAGE" as one line on stderr; returns CODE for main() to return."""
    print(f"{prog}: {one_line(message)}", file=sys.stderr)
    return code


class Help(argparse.RawDescriptionHelpFormatter):
    """--help as the tools print it: "Usage: " (not argparse's "usage: "), description as written."""

    def add_usage(self, usage: str | None, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, prefix="Usage: ")


class Parser(argparse.ArgumentParser):
    """argparse with the tools' conventions: Help, and a usage error as one line naming the
    problem and where the right form is written, exit BAD_INPUT. A subcommand's parser (prog
    "sweep.py batch") says its errors as the tool ("sweep.py: ...") and points at its own help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        fail(self.prog.split(" ")[0], f"{message} (see {self.prog} --help)")
        sys.exit(BAD_INPUT)


def number(kind: type[int] | type[float], ok: Callable[[float], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: a finite number of KIND (int: a whole number) for which ok(x) holds;
    otherwise the error says "'TEXT' is not a number" or "'TEXT' must be WHAT"."""

    def conv(text: str) -> int | float:
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"'{text}' is not {'a whole number' if kind is int else 'a number'}"
            ) from None
        if not math.isfinite(x) or not ok(x):
            raise argparse.ArgumentTypeError(f"'{text}' must be {what}")
        return x

    conv.__name__ = kind.__name__
    return conv


positive_int = number(int, lambda x: x > 0, "a positive whole number")
positive_float = number(float, lambda x: x > 0, "a positive number")


def emit(report: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    """Print a tool's report: JSON for programs (--json), else render(report) for people.

    When stdout is a pipe whose reader has gone (`tool ... --json | head -1`), the rest is
    dropped quietly: no BrokenPipeError traceback, and none when Python flushes stdout at exit.
    The exit status stays the tool's (the report was made; the reader chose to stop)."""
    text = json.dumps(report, indent=1) if as_json else render(report)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere at exit
        os.close(devnull)
