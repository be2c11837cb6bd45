"""utils/answer.sh: a tool's --json answer saved once per job, options and log state, in a private
cache; again when the log grew or with --fresh; a failing tool saves nothing; bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import REPO, VENV

TOOL = str(REPO / "utils/answer.sh")
LOG = """==================== JOB ====================
job: 51 51-JAX-tiny
scheduler: local
model: tiny
nodes: 1 (n1)
overrides: steps=3
started: 2026-11-26T22:00:00Z
=============================================
n1: I1126 22:00:10.000000 1394 metric_logger.py:265] completed step: 0, seconds: 0.500, TFLOP/s/device: 0.001, \
Tokens/s/device: 128.000, total_weights: 64, loss: 5.000
"""


def answer(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "JOB_WORKSPACE": str(tmp_path / "ws"),
        "MAXTEXT_SLURM_VENV": str(VENV),
    }
    return subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=120, env=env)


def job(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "51-JAX-tiny").mkdir(parents=True)
    log = ws / "51-JAX-tiny.log"
    log.write_text(LOG)
    (ws / "51-JAX-tiny" / "log").symlink_to(log)
    return log


def test_saved_once_then_again_when_the_log_grows(tmp_path):
    log = job(tmp_path)
    first = answer(tmp_path, "triage", "51")
    assert first.returncode == 0, first.stderr
    path = Path(first.stdout.strip())
    assert json.loads(path.read_text())["progress"]["last_step"] == 0
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700" and oct(path.stat().st_mode & 0o777) == "0o600"
    mtime = path.stat().st_mtime_ns
    again = answer(tmp_path, "triage", str(log.with_suffix("")))  # the job dir names the same job
    assert again.stdout.strip() == str(path) and path.stat().st_mtime_ns == mtime  # not run again
    with log.open("a") as f:
        f.write(LOG.splitlines()[-1].replace("step: 0", "step: 1") + "\n")
    grown = Path(answer(tmp_path, "triage", "51").stdout.strip())
    assert grown != path and json.loads(grown.read_text())["progress"]["last_step"] == 1
    other = answer(tmp_path, "triage", "51", "--hang-factor", "5")  # other options: another answer
    assert other.returncode == 0 and Path(other.stdout.strip()) not in (path, grown)
    fresh = answer(tmp_path, "triage", "51", "--fresh")
    assert Path(fresh.stdout.strip()) == grown and grown.stat().st_mtime_ns >= mtime


def test_a_failing_tool_saves_nothing_and_bad_input_is_one_line(tmp_path):
    job(tmp_path)
    r = answer(tmp_path, "triage", "977")
    assert r.returncode == 2 and r.stdout == "" and "triage.py: " in r.stderr, r.stderr
    assert list((tmp_path / "cache/maxtext-slurm/answers").glob("*")) == []
    for args, says in (
        (["melt", "51"], "unknown TOOL 'melt'"),
        (["triage"], "expected TOOL JOB"),
        (["perf", ""], "empty JOB"),
    ):
        r = answer(tmp_path, *args)
        assert r.returncode == 2 and r.stderr.splitlines() == [f"answer.sh: {r.stderr.split(': ', 1)[1].strip()}"]
        assert says in r.stderr, r.stderr
    assert answer(tmp_path, "--help").stdout.startswith("Usage: utils/answer.sh TOOL JOB")
