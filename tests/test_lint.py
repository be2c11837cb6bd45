"""shellcheck on every shell script and ruff on every Python file of the project."""

import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

SKIP = {".git", ".venv", "outputs", ".local_cluster", "__pycache__", ".pytest_cache", ".ruff_cache", "fixtures"}


def project_files() -> list[Path]:
    """Every file of the project, symlinks not followed (fixture trees mirror /sys, loops included)."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP and not (Path(root) / d).is_symlink()]
        found += [Path(root) / f for f in files if (Path(root) / f).is_file() and not (Path(root) / f).is_symlink()]
    return found


def shell_scripts() -> list[Path]:
    found = []
    for p in project_files():
        if p.suffix in {".sh", ".sbatch"} or p.relative_to(REPO).as_posix() == ".ci/run":
            found.append(p)
        elif p.suffix == "" and p.read_bytes()[:40].startswith(b"#!") and b"sh" in p.read_bytes()[:40]:
            found.append(p)
    return found


def test_shellcheck_clean():
    assert shutil.which("shellcheck"), "shellcheck is not installed (tests/run.sh installs it)"
    scripts = shell_scripts()
    assert len(scripts) >= 10
    res = run(["shellcheck", *map(str, scripts)], cwd=REPO)
    assert res.returncode == 0, res.stdout


def test_ruff_clean():
    res = run([str(VENV / "bin" / "ruff"), "check", str(REPO)], cwd=REPO)
    assert res.returncode == 0, res.stdout


def test_ruff_formatted():
    res = run([str(VENV / "bin" / "ruff"), "format", "--check", str(REPO)], cwd=REPO)
    assert res.returncode == 0, res.stdout


def shell_entry_points() -> list[Path]:
    """Every shell script with a #! line (sourced libraries such as utils/launch/lib.sh have none)."""
    return sorted(p for p in shell_scripts() if p.read_bytes().startswith(b"#!"))


def python_files() -> list[Path]:
    return sorted(p for p in project_files() if p.suffix == ".py")


def python_entry_points() -> list[Path]:
    """Every Python file outside tests/ that runs as a program (it has a #! line)."""
    return [p for p in python_files() if "tests" not in p.relative_to(REPO).parts and p.read_bytes().startswith(b"#!")]


# A shell statement at the start of a line: what a help text that runs past its header shows
# (set -euo pipefail, repo=$(...), source ..., [[ ... ]] && ..., usage() { ..., PROG=x, esac).
CODE_LINE = re.compile(
    r"^(set -[euxo]|source [\"$]|\. [\"$]|exec [\"$]|export [A-Za-z_]\w*(=|;|$)|local [A-Za-z_]\w*=|local -|declare -"
    r"|readonly [A-Za-z_]|shopt -|trap [\"']|cd [\"$]|(if|while|until) (\[\[|\(\(|! )|(if|while|until) .*; (then|do)$"
    r"|for \w+ in |for \(\(|case \S+ in$|\[\[ |\(\( |: \"\$|\$\(|[A-Za-z_]\w*=(\$|\(|\S*$)|[A-Za-z_]\w*\(\) ?\{"
    r"|(fi|done|esac|then|else|\}|;;)$)"
)


@pytest.mark.parametrize("script", shell_entry_points(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_shell_help_is_the_usage_header(script):
    """--help prints the script's usage header (utils/launch/lib.sh usage) and not one line of its code."""
    rel = script.relative_to(REPO).as_posix()
    res = run([str(script), "--help"], cwd=REPO, timeout=30)
    assert res.returncode == 0, f"{rel} --help: exit {res.returncode}: {res.stderr}"
    assert res.stdout.startswith("Usage: "), f"{rel} --help does not start with 'Usage: ':\n{res.stdout}"
    assert res.stderr == "", f"{rel} --help wrote to stderr: {res.stderr}"
    comments = {ln.rstrip() for ln in script.read_text().splitlines() if ln.startswith("#")}
    for line in res.stdout.splitlines():
        assert not CODE_LINE.match(line), f"{rel} --help prints a line of code: {line!r}"
        assert f"# {line}".rstrip() in comments or f"#{line}".rstrip() in comments, (
            f"{rel} --help prints a line that is not in its header comment: {line!r}"
        )


@pytest.mark.parametrize("script", python_entry_points(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_python_help(script):
    rel = script.relative_to(REPO).as_posix()
    res = run([str(VENV / "bin" / "python"), str(script), "--help"], cwd=REPO, timeout=60)
    assert res.returncode == 0, f"{rel} --help: exit {res.returncode}: {res.stderr}"
    assert "Traceback" not in res.stdout + res.stderr, f"{rel} --help: {res.stderr}"
    assert res.stdout.lower().startswith("usage:"), f"{rel} --help: {res.stdout}"


@pytest.mark.parametrize("tool", ["triage", "diagnose", "perf", "sweep", "host_bridge", "mcp_server"])
def test_user_commands_run_directly(tool):
    """utils/<tool>.py runs through its #! line with whatever python3 is first on PATH: it finds the
    project's environment itself (no .venv/bin/python in front, no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    res = run([str(REPO / "utils" / f"{tool}.py"), "--help"], env=env, cwd="/", timeout=60)
    assert res.returncode == 0 and res.stdout.startswith(f"Usage: {tool}.py"), res.stdout + res.stderr
    # and a user error is one line, not a traceback, from any directory
    res = run([str(REPO / "utils" / f"{tool}.py"), "--no-such-option"], env=env, cwd="/", timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr


def test_no_import_path_hacks_and_modules_are_not_programs():
    """The import roots are utils/ and tests/ (pyproject's pythonpath, the environment's .pth):
    no file edits sys.path, and the modules of the diagnosis and sweep packages are not programs."""
    hack = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*(\+?=|\[)")
    hacks = [p.relative_to(REPO).as_posix() for p in python_files() if hack.search(p.read_text())]
    assert hacks == [], hacks
    package = sorted((REPO / "utils" / "diagnosis").glob("*.py")) + sorted((REPO / "utils" / "sweep").glob("*.py"))
    assert len(package) >= 20
    programs = [p.name for p in package if p.read_bytes().startswith(b"#!") or os.access(p, os.X_OK)]
    assert programs == [], programs


def test_every_entry_point_is_checked():
    """The discovery above finds the entry points the project documents (a broken glob tests nothing)."""
    shell = {p.relative_to(REPO).as_posix() for p in shell_entry_points()}
    python = {p.relative_to(REPO).as_posix() for p in python_entry_points()}
    assert {
        "submit.sh",
        "run_local.sh",
        "_job.sbatch",
        "_container.sh",
        "_train.sh",
        "_train_with_ray.sh",
        "tests/run.sh",
        ".ci/run",
        "utils/prometheus.sh",
        "utils/local_cluster.sh",
    } <= shell
    assert {"utils/observe/plugins/gpu_metrics_plugin.sh", "utils/observe/plugins/host_metrics_plugin.sh"} <= shell
    assert len([p for p in shell if p.startswith("bench/")]) >= 3
    assert {
        "_ray_actor.py",
        "utils/triage.py",
        "utils/diagnose.py",
        "utils/perf.py",
        "utils/sweep.py",
        "utils/host_bridge.py",
        "utils/mcp_server.py",
        "utils/observe/metrics_exporter.py",
        "utils/dev/failure_class_tables.py",
    } <= python
    assert not {p for p in shell if p.endswith("lib.sh")}, "a sourced library is not an entry point"


def test_security_doc_names_tests_that_exist():
    """docs/security.md backs each protection with a test: every test it names must exist."""
    import re

    text = (REPO / "docs" / "security.md").read_text()
    named = set(re.findall(r"`(tests/\w+\.py)(?:::(\w+))?`", text))
    assert len(named) >= 5
    for path, test in named:
        assert (REPO / path).is_file(), path
        assert not test or f"def {test}(" in (REPO / path).read_text(), f"{path}::{test}"
