"""shellcheck on every shell script and ruff on every Python file of the project."""

import hashlib
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from helpers.cache import cache_dir

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
    """shellcheck on every shell script (.shellcheckrc: sourced files followed). A script's verdict is a
    function of it, of the files scripts source (the libraries: those without a shebang, or named
    by a source line), .shellcheckrc and shellcheck's version, so a pass is remembered per script
    under their hash (tests/helpers/cache.py, ~/.cache/maxtext-slurm/shellcheck/): the developer loop
    checks only the scripts that changed, and all of them after a library changed (a full check: 18
    CPU-s, the fast loop's longest test)."""
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed (tests/run.sh installs it)"
    scripts = sorted(shell_scripts())
    assert len(scripts) >= 10
    sourced = {
        m.group(1).rsplit("/", 1)[-1]
        for p in scripts
        for m in re.finditer(r"""(?m)^\s*(?:source|\.)\s+["']?([^"'\s;]+)""", p.read_text(errors="replace"))
    }
    libraries = [p for p in scripts if not p.read_bytes().startswith(b"#!") or p.name in sourced]
    common = hashlib.sha256(run([shellcheck, "--version"]).stdout.encode())
    for path in [REPO / ".shellcheckrc", *libraries]:
        common.update(f"\0{path.relative_to(REPO)}\0".encode() + path.read_bytes())
    key = {}
    for path in scripts:
        h = common.copy()
        h.update(f"\0{path.relative_to(REPO)}\0".encode() + path.read_bytes())
        key[path] = h.hexdigest()
    cache = cache_dir("shellcheck")
    todo = [p for p in scripts if cache is None or not (cache / key[p]).exists()]
    if not todo:
        return
    res = run([shellcheck, *map(str, todo)], cwd=REPO)
    assert res.returncode == 0, res.stdout
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        for path in todo:
            (cache / key[path]).touch()


def test_ruff_clean():
    res = run([str(VENV / "bin" / "ruff"), "check", str(REPO)], cwd=REPO)
    assert res.returncode == 0, res.stdout


def test_ruff_formatted():
    res = run([str(VENV / "bin" / "ruff"), "format", "--check", str(REPO)], cwd=REPO)
    assert res.returncode == 0, res.stdout


def entry_points() -> list[Path]:
    """Every program of the project: a file with a #! line (sourced libraries such as utils/launch/lib.sh
    and the modules of the packages have none), the test fixtures' stand-in programs left out."""
    return sorted(p for p in project_files() if p.read_bytes()[:2] == b"#!")


def python_files() -> list[Path]:
    return sorted(p for p in project_files() if p.suffix == ".py")


# A shell statement at the start of a line: what a help text that runs past its header shows
# (set -euo pipefail, repo=$(...), source ..., [[ ... ]] && ..., usage() { ..., PROG=x, esac).
CODE_LINE = re.compile(
    r"^(set -[euxo]|source [\"$]|\. [\"$]|exec [\"$]|export [A-Za-z_]\w*(=|;|$)|local [A-Za-z_]\w*=|local -|declare -"
    r"|readonly [A-Za-z_]|shopt -|trap [\"']|cd [\"$]|(if|while|until) (\[\[|\(\(|! )|(if|while|until) .*; (then|do)$"
    r"|for \w+ in |for \(\(|case \S+ in$|\[\[ |\(\( |: \"\$|\$\(|[A-Za-z_]\w*=(\$|\(|\S*$)|[A-Za-z_]\w*\(\) ?\{"
    r"|(fi|done|esac|then|else|\}|;;)$)"
)


def help_problems(script: Path, res: subprocess.CompletedProcess) -> list[str]:
    """What is wrong with SCRIPT's answer to --help: a non-zero exit, a traceback, no usage first; a
    shell script prints its usage header (utils/launch/lib.sh usage) and not one line of its code."""
    rel = script.relative_to(REPO).as_posix()
    if res.returncode != 0 or "Traceback" in res.stdout + res.stderr:
        return [f"{rel} --help: exit {res.returncode}: {(res.stderr or res.stdout)[-600:]}"]
    if b"python" in script.read_bytes().split(b"\n", 1)[0]:
        return [] if res.stdout.lower().startswith("usage:") else [f"{rel} --help: no usage: {res.stdout[:200]!r}"]
    if not res.stdout.startswith("Usage: "):
        return [f"{rel} --help does not start with 'Usage: ': {res.stdout[:200]!r}"]
    if res.stderr:
        return [f"{rel} --help wrote to stderr: {res.stderr[:300]}"]
    comments = {ln.rstrip() for ln in script.read_text().splitlines() if ln.startswith("#")}
    return [
        f"{rel} --help prints a line of code, or one that is not in its header comment: {line!r}"
        for line in res.stdout.splitlines()
        if CODE_LINE.match(line) or not ({f"# {line}".rstrip(), f"#{line}".rstrip()} & comments)
    ]


def test_every_entry_point_helps_from_anywhere():
    """Every program runs directly (its #! line; executable) from / with PATH=/usr/bin, as typed in a
    plain shell, and answers --help with its usage and nothing else: a Python one finds the project's
    environment itself, as the utils/ commands do (utils/entry.py). 8 at a time: 57
    programs in 2.8 s on a loaded 2-core machine (one after the other: 4.9 s)."""
    programs = entry_points()
    env = {"PATH": "/usr/bin", "HOME": os.environ.get("HOME", "/"), "MAXTEXT_SLURM_VENV": str(VENV)}

    def ask(script: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(script), "--help"], cwd="/", env=env, capture_output=True, text=True, timeout=120, check=False
        )

    not_executable = [p.relative_to(REPO).as_posix() for p in programs if not os.access(p, os.X_OK)]
    assert not_executable == [], f"programs (a #! line) without the executable bit: {not_executable}"
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, programs))
    problems = [
        problem for script, res in zip(programs, answers, strict=True) for problem in help_problems(script, res)
    ]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(
    "tool", ["triage", "diagnose", "perf", "investigate", "sweep", "job_monitor", "host_bridge", "mcp_server"]
)
def test_user_commands_run_directly(tool):
    """utils/<tool>.py runs through its #! line with whatever python3 is first on PATH: it finds the
    project's environment itself (no .venv/bin/python in front, no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    res = run([str(REPO / "utils" / f"{tool}.py"), "--help"], env=env, cwd="/", timeout=60)
    assert res.returncode == 0 and res.stdout.startswith(f"Usage: {tool}.py"), res.stdout + res.stderr
    # and a user error is one line, not a traceback or a usage dump, from any directory
    res = run([str(REPO / "utils" / f"{tool}.py"), "--no-such-option"], env=env, cwd="/", timeout=60)
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{tool}.py: "), res.stderr


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
    programs = {p.relative_to(REPO).as_posix() for p in entry_points()}
    shell = {p for p in programs if not p.endswith(".py")}
    python = {p for p in programs if p.endswith(".py")}
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
    assert {"bench/mcp_latency.py", "bench/triage_throughput.py", "utils/dev/joblog_dump.py"} <= python
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
