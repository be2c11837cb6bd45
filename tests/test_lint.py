"""shellcheck on every shell script and ruff on every Python file of the project."""

import os
import shutil
from pathlib import Path

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


def test_every_entry_point_has_help():
    entry = ["submit.sh", "run_local.sh", "_job.sbatch", "_container.sh", "_train.sh", "tests/run.sh"]
    entry += [p.relative_to(REPO).as_posix() for p in (REPO / "utils").glob("*.sh") if p.stat().st_mode & 0o111]
    for e in entry:
        res = run([str(REPO / e), "--help"], cwd=REPO, timeout=30)
        assert res.returncode == 0 and "Usage" in res.stdout, f"{e} --help: {res.stdout}{res.stderr}"
