"""Start a command of utils/ (a diagnosis tool, the monitor, the MCP server ...) from its thin command
under the project's Python environment.

A command such as utils/triage.py may be run by any python3 (or directly, through its #! line).
`run("triage")` re-executes it with the environment's interpreter when that exists and is not
the one running ($MAXTEXT_SLURM_VENV, default <repo>/.venv, as utils/setup_env.sh makes it), then
calls diagnosis.triage.main(). Without the environment a missing library is one line that says
how to get it, exit 2, not a traceback. Standard library only, and no syntax newer than Python 3.6, so
that an old login-node python3 gets as far as the re-execution.
"""

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_ENVIRONMENT = 2  # cli.BAD_INPUT: nothing was done, the one line says what to set up


def venv_dir() -> Path:
    """The project's Python environment (it may not exist yet)."""
    return Path(os.environ.get("MAXTEXT_SLURM_VENV") or REPO / ".venv")


def enter_venv() -> None:
    """Re-execute this command with the environment's python unless it already runs it."""
    venv = venv_dir()
    python = venv / "bin" / "python"
    if not python.exists():
        return
    try:
        if Path(sys.prefix).resolve() == venv.resolve():
            return
    except OSError:
        return
    os.execv(str(python), [str(python), *sys.argv])


def no_environment(message: str) -> None:
    """One line on stderr and exit NO_ENVIRONMENT (no traceback)."""
    sys.stderr.write(message + "\n")
    sys.exit(NO_ENVIRONMENT)


def run(tool: str, package: str = "diagnosis", oldest: tuple = (3, 11)) -> None:
    """Run <package>.<tool>.main() with this process's arguments and exit with its status; OLDEST
    is the oldest Python it runs under (the host bridge's client runs in containers, 3.8)."""
    prog = Path(sys.argv[0]).name
    enter_venv()
    fix = "create the project's environment with {} (or set MAXTEXT_SLURM_VENV to one; looked for {})".format(
        REPO / "utils" / "setup_env.sh", venv_dir()
    )
    if sys.version_info < oldest:
        no_environment(
            "{}: needs Python {} or newer (this is {}); {}".format(
                prog, ".".join(map(str, oldest)), sys.version.split()[0], fix
            )
        )
    try:
        with one_blas_thread():
            module = importlib.import_module(package + "." + tool)
    except ModuleNotFoundError as e:
        no_environment(
            "{}: needs the Python package '{}', which {} lacks; {}".format(prog, e.name, sys.executable, fix)
        )
    sys.exit(module.main())


@contextlib.contextmanager
def one_blas_thread() -> "Iterator[None]":  # quoted: Python 3.6 reads this file (see above)
    """Import the tools' modules with OPENBLAS_NUM_THREADS=1 (unless set): numpy's OpenBLAS starts one
    thread per core (up to 64) at import, which costs a tool that multiplies no large matrices twice
    the CPU of the import (0.11 against 0.05 s on 2 cores) and, on a login node that caps each user's
    processes, fails with pthread_create errors. The setting is taken back before the tool runs, so
    nothing it starts (a job it submits) inherits it."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]
