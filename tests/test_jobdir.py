"""The job directory and the scheduler, each asked in one place (issue 21): utils/diagnosis/jobdir.py
reads the job directory (its listing, summary.txt, the JOB header, the planned steps), and
utils/diagnosis/scheduler.py is the only code in utils/ that runs scontrol, squeue or sacct. Slurm is
a stand-in here (this machine's tests without the cluster): shell scripts on PATH that answer as
`scontrol show job -o` does (https://slurm.schedmd.com/scontrol.html: "JobId=... JobState=RUNNING ...",
and "slurm_load_jobs error: Invalid job id specified" on stderr for an id Slurm forgot)."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from conftest import REPO, run

from diagnosis import jobdir, scheduler

UTILS = REPO / "utils"
SLURM_COMMANDS = {"scontrol", "squeue", "sacct"}
# who may run them: the scheduler, and the host bridge's policy, which runs a caller's own query
ASKERS = {"diagnosis/scheduler.py", "bridge/policy.py"}
# who may read summary.txt or list the workspace: the job directory's own module
READERS = {"diagnosis/jobdir.py"}


def python_files() -> list[tuple[str, ast.AST]]:
    out = []
    for p in sorted(UTILS.rglob("*.py")):
        rel = p.relative_to(UTILS).as_posix()
        if "__pycache__" not in rel and not rel.startswith("launch/"):
            out.append((rel, ast.parse(p.read_text(), rel)))
    return out


def test_only_scheduler_asks_slurm_and_only_jobdir_reads_the_job_directory():
    asks, reads, lists = [], [], []
    for rel, tree in python_files():
        for node in ast.walk(tree):
            if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant):
                if node.elts[0].value in SLURM_COMMANDS and rel not in ASKERS:  # ["squeue", ...]: an argv
                    asks.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Constant) and node.value == "summary.txt" and rel not in READERS:
                reads.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                arg = node.args[0] if node.args else None
                glob = isinstance(arg, ast.Constant) and isinstance(arg.value, str) and "-JAX-" in arg.value
                glob = glob or isinstance(arg, ast.JoinedStr) and "-JAX-" in ast.unparse(arg)
                if (node.func.attr in ("glob", "rglob") and glob) or (
                    node.func.attr == "iterdir" and "-JAX-" in ast.unparse(node)
                ):
                    lists.append(f"{rel}:{node.lineno}")
    assert asks == [], f"ask Slurm through diagnosis/scheduler.py: {asks}"
    assert reads == [], f"read summary.txt through diagnosis/jobdir.py (summary, parse_summary): {reads}"
    assert lists == [], f"list the workspace through diagnosis/jobdir.py (listing): {lists}"


def test_the_checker_sees_what_it_forbids(tmp_path, monkeypatch):
    (tmp_path / "tool.py").write_text('import subprocess\nsubprocess.run(["sacct", "-j", "1"])\nopen("summary.txt")\n')
    monkeypatch.setattr(f"{__name__}.UTILS", tmp_path)
    try:
        test_only_scheduler_asks_slurm_and_only_jobdir_reads_the_job_directory()
    except AssertionError as e:
        assert "tool.py:2" in str(e)
    else:
        raise AssertionError("a module running sacct was not seen")


def slurm(tmp_path: Path, state: str | None) -> dict[str, str]:
    """PATH with an scontrol that knows job 7 in STATE (None: it forgot every id)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    if state is None:
        body = 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'
    else:
        body = f'echo "JobId=$4 JobName=7-JAX-tiny JobState={state} Reason=None"'
    (bin_ / "scontrol").write_text(f"#!/bin/sh\n{body}\n")
    (bin_ / "scontrol").chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}"}


def test_one_answer_for_a_vanished_job(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", slurm(tmp_path, None)["PATH"])
    assert scheduler.slurm_state("7") == scheduler.GONE
    assert scheduler.slurm_state("local-7") is None  # a run_local.sh job: Slurm is not asked
    monkeypatch.setenv("PATH", "/nonexistent")
    assert scheduler.slurm_state("7") is None  # no Slurm here: cannot tell


def test_triage_says_a_vanished_job_is_gone_not_running(tmp_path):
    ws = tmp_path / "ws"
    (ws / "7-JAX-tiny").mkdir(parents=True)
    log = ws / "7-JAX-tiny.log"
    log.write_text(f"{jobdir.JOB_RULE}\njob: 7 7-JAX-tiny\nscheduler: slurm\nmodel: tiny\nnodes: 1 (n1)\n=====\n")
    env = {**slurm(tmp_path, None), "JOB_WORKSPACE": str(ws)}
    r = json.loads(run([str(UTILS / "triage.py"), "7", "--json"], env=env).stdout)
    assert r["scheduler_state"] == "GONE" and r["status"] == "unknown", r  # not "running": Slurm forgot it
    assert any("Slurm no longer knows job 7" in n for n in r["notes"]), r["notes"]
    env = {**slurm(tmp_path / "x", "CANCELLED"), "JOB_WORKSPACE": str(ws)}
    r = json.loads(run([str(UTILS / "triage.py"), "7", "--json"], env=env).stdout)
    assert r["scheduler_state"] == "CANCELLED" and r["status"] == "cancelled", r


def test_planned_steps_override_then_config(tmp_path):
    (tmp_path / "artifact/configs").mkdir(parents=True)
    (tmp_path / "artifact/configs/tiny.yml").write_text("steps: 1000  # the default\n")
    assert jobdir.planned_steps({"model": "tiny (configs/tiny.yml)", "overrides": "steps=5 steps=30"}, tmp_path) == 30
    assert jobdir.planned_steps({"model": "tiny (configs/tiny.yml)", "overrides": "log_period=5"}, tmp_path) == 1000
    assert jobdir.planned_steps({"model": "other", "overrides": ""}, tmp_path) is None
