"""The command line the diagnosis tools share (triage, diagnose, perf, sweep).

- `Parser`: argparse whose --help starts with "Usage: " and keeps the description's line breaks
  (`Help`), and whose usage errors are one line on stderr, "PROG: what is wrong (see PROG --help)",
  exit BAD_INPUT, with no usage dump and no traceback.
- `number(...)`: an argparse type for a finite number within bounds, with a message that says
  what would be right.
- `Option` and `add_options`: a tool's options, each declared once (name, type, default, help,
  choices, bounds); the tool's argparse parser is built from them, and so is its MCP tool's input
  schema (mcpserver/server.py) for the ones not marked `cli_only` (tests/test_tool_options.py holds
  the two equal).
- `InputError` and `fail`: bad input found after parsing (no such job, not a job log) is raised as
  InputError and printed by the tool's main() as one line, "PROG: message", exit BAD_INPUT.
- The exit codes, by name.
- `emit`: the report as JSON (--json) or as text, ending quietly when the reader has gone
  (`tool ... --json | head`).

Standard library only (utils/triage.py needs nothing else).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
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


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a tool, declared once for its command line and its MCP tool.

    NAME is the Python and MCP name (hang_factor); the command line spells it --hang-factor. TYPE is
    bool (a flag), int, float, str or Path; a number's bounds (GE, GT, LE, LT) check it on both sides, and
    MUST says what would be right when the bounds alone say it badly. HELP is the MCP description and
    the start of the --help line, which ends with "(NOTE)": by default "default D" for a number with a
    default D. Options of one GROUP exclude each other. CLI_ONLY says why the MCP tool does not offer
    the option (its output is always JSON, it never asks Slurm, ...); empty: the MCP tool offers it."""

    name: str
    help: str
    type: type = str
    default: Any = None
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    must: str = ""
    metavar: str | None = None
    note: str | None = None
    group: str = ""
    cli_only: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def accepts(self, x: float) -> bool:
        """Whether the number X is within the bounds."""
        return (
            (self.ge is None or x >= self.ge)
            and (self.gt is None or x > self.gt)
            and (self.le is None or x <= self.le)
            and (self.lt is None or x < self.lt)
        )

    def bounds(self) -> str:
        """The bounds in words: MUST, else "a positive whole number", "0 .. 10", "1 or more", ..."""
        if self.must:
            return self.must
        if (self.ge, self.le, self.lt) == (None, None, None) and self.gt == 0:
            return "a positive whole number" if self.type is int else "a positive number"
        if self.ge is not None and self.le is not None and (self.gt, self.lt) == (None, None):
            return f"{self.ge:g} .. {self.le:g}"
        words = [f"{self.ge:g} or more"] if self.ge is not None else []
        words += [f"more than {self.gt:g}"] if self.gt is not None else []
        words += [f"at most {self.le:g}"] if self.le is not None else []
        words += [f"less than {self.lt:g}"] if self.lt is not None else []
        return " and ".join(words) or "a number"

    def cli_help(self) -> str:
        note = self.note
        if note is None and self.type in (int, float) and self.default is not None:
            note = f"default {self.default:g}"
        return f"{self.help} ({note})" if note else self.help


# The options every tool has
JSON = Option("json", "print the report as JSON (for agents and scripts)", bool, cli_only="the MCP tool answers JSON")
WORKSPACE = Option(
    "workspace",
    "where job ids and names are looked up (default $JOB_WORKSPACE or <repo>/outputs)",
    Path,
    metavar="DIR",
    cli_only="the MCP server's workspace is its own",
)


def tool_parser(
    prog: str, doc: str | None, positional: str, help: str, options: tuple[Option, ...], epilog: str | None = None
) -> Parser:
    """A tool's parser, from its module docstring DOC: the usage is its first line (`Usage: PROG ...`),
    the description the rest from its third line on; one POSITIONAL argument (its metavar) and the
    OPTIONS; EPILOG after them."""
    lines = (doc or "").strip().splitlines()
    usage = lines[0].removeprefix("Usage: ") if lines and lines[0].startswith("Usage: ") else None
    ap = Parser(prog=prog, usage=usage, description="\n".join(lines[2:]), epilog=epilog)
    ap.add_argument(positional.lower(), metavar=positional, help=help)
    add_options(ap, options)
    return ap


def add_options(ap: argparse.ArgumentParser, options: tuple[Option, ...]) -> None:
    """Add OPTIONS to AP in their order, as declared: a flag (store_true) for a bool, a checked
    number for an int or float with bounds, the choices of a str; each GROUP mutually exclusive."""
    groups: dict[str, Any] = {}
    for o in options:
        where: Any = ap
        if o.group:
            if o.group not in groups:
                groups[o.group] = ap.add_mutually_exclusive_group()
            where = groups[o.group]
        kw: dict[str, Any] = {"help": o.cli_help()}
        if o.type is bool:
            where.add_argument(o.flag, action="store_true", **kw)
            continue
        if o.metavar is not None:
            kw["metavar"] = o.metavar
        if o.choices:
            kw["choices"] = o.choices
        if o.type in (int, float) and (o.ge, o.gt, o.le, o.lt) != (None, None, None, None):
            kw["type"] = number(o.type, o.accepts, o.bounds())
        elif o.type is not str:
            kw["type"] = o.type
        where.add_argument(o.flag, default=o.default, **kw)


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
