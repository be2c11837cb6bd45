"""Run a Python command of utils/ (utils/diagnose.py, triage.py ...) inside the test's own process.

`tool("diagnose", "4242", "--json", env=..., cwd=...)` calls the same `main(argv)` that the thin
command's `entry.run` calls, with the command's name as argv[0], the environment and the working
directory given, its stdout/stderr captured, and returns a `subprocess.CompletedProcess` as
`conftest.run` does. It saves the interpreter start and the imports of a subprocess (0.3-0.5 CPU-s a
call, most of the fast loop's time in the tools' tests). What a subprocess would show that this does
not: the thin command itself (its re-execution under the environment's python, its shebang), a
signal's default action (SIGPIPE: a reader that stops early), output written to fd 1/2 by a child the
tool starts without capturing it. The tests of those keep a real subprocess (tests/test_lint.py runs
every entry point's --help from /, tests/test_cli.py the early reader).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# utils/NAME.py's own `entry.run("MODULE"[, package="PACKAGE"])` says what it runs
CALL = re.compile(r'^entry\.run\("(\w+)"(?:, package="(\w+)")?', re.M)


def module_of(name: str) -> str:
    """The module utils/NAME.py runs, read from its entry.run call ("diagnosis.triage")."""
    m = CALL.search((REPO / "utils" / f"{name}.py").read_text())
    if m is None:
        raise ValueError(f"utils/{name}.py is no thin command (no entry.run call)")
    return f"{m.group(2) or 'diagnosis'}.{m.group(1)}"


@contextlib.contextmanager
def _environment(env: dict[str, str] | None, cwd: str | Path | None, argv0: str) -> Iterator[None]:
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    try:
        if env:
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = [argv0]
        yield
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def tool(
    name: str, *args: str | Path, env: dict[str, str] | None = None, cwd: str | Path | None = None, input: str = ""
) -> subprocess.CompletedProcess:
    """utils/NAME.py ARGS run in this process: exit status, stdout and stderr as text."""
    main = importlib.import_module(module_of(name)).main
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with _environment(env, cwd, str(REPO / "utils" / f"{name}.py")):
        saved_in = sys.stdin
        sys.stdin = io.StringIO(input)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(argv)
                except SystemExit as e:  # argparse's usage errors and --help, cli.fail in a parser
                    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                    if isinstance(e.code, str):
                        err.write(e.code + "\n")
        finally:
            sys.stdin = saved_in
    return subprocess.CompletedProcess([name, *argv], rc or 0, out.getvalue(), err.getvalue())
