"""Safe on a shared cluster, shown on the local Slurm cluster: a reused job id never merges into
or overwrites an earlier job, and preflight stops a finished job's leftovers only when it knows
which jobs are alive (squeue answered), never another workspace's or a newer job's."""

import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

from helpers.jobs import log_has, submit, summary, wait_job_end

pytestmark = pytest.mark.cluster


def next_job_id(cluster: dict[str, str]) -> int:
    """The id Slurm gives the next job: submit a held no-op job, read its id, cancel it."""
    res = run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"], env=cluster)
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    run(["scancel", str(jid)], env=cluster)
    return jid + 1


def fake_leftover(workspace: Path, job_id: str = "1") -> tuple[subprocess.Popen, Path]:
    """What a finished job of this user might have left on a node: a process carrying its job
    variables, and its labelled private scratch dir (utils/launch/lib.sh job_scratch)."""
    env = {
        **os.environ,
        "JOB_ID": job_id,
        "JOB_SCHEDULER": "slurm",
        "MST_REPO": "/old/snapshot",
        "JOB_WORKSPACE": str(workspace),
    }
    proc = subprocess.Popen(["sleep", "600"], env=env)
    scratch = Path(
        run(
            ["bash", "-c", f"source {REPO}/utils/launch/lib.sh; job_scratch"],
            env={"JOB_SCHEDULER": "slurm", "JOB_ID": job_id, "JOB_HOSTNAME": "n1", "JOB_WORKSPACE": str(workspace)},
        ).stdout.strip()
    )
    assert scratch.is_dir() and (scratch / "job").is_file()
    return proc, scratch


def test_reused_job_id_moves_the_earlier_job_aside(cluster, workspace, venv):
    jid = next_job_id(cluster)
    # what an earlier job with the same id left (Slurm's ids restart after a state reset)
    old_log = workspace / f"{jid}-JAX-tiny.log"
    old_log.write_text("==================== JOB ====================\nn1: ValueError: the earlier run's error\n")
    old_dir = workspace / f"{jid}-JAX-tiny"
    (old_dir / ".stages" / "train").mkdir(parents=True)
    (old_dir / ".stages" / "train" / "n1").write_text("rc=1 end=1.0 reason=exit\n")
    (old_dir / "summary.txt").write_text("status: failed\n")
    leftover, scratch = fake_leftover(workspace)
    try:
        res = run([str(REPO / "submit.sh"), "tiny", "--", "steps=3"], env={**cluster, **launcher_env(workspace)})
        assert res.returncode == 0 and f"Submitted job {jid} " in res.stdout, res.stderr
        moved = [line for line in res.stderr.splitlines() if "belonged to an earlier job with the same id" in line]
        assert len(moved) == 2, res.stderr
        assert wait_job_end(cluster, str(jid), 240) == "COMPLETED", old_log.read_text()[-3000:]
        # preflight knew the active jobs: the finished job's leftovers are gone
        assert leftover.wait(timeout=10) == -9
        assert not scratch.exists()
    finally:
        if leftover.poll() is None:
            leftover.kill()
    s = summary(old_log)
    assert s["status"] == "completed" and "first_error" not in s
    assert "earlier run" not in old_log.read_text()
    assert not (old_dir / "summary.txt").read_text().startswith("status: failed")
    kept_log = [p for p in workspace.glob(f"{jid}-JAX-tiny.log.earlier-*")]
    kept_dir = [p for p in workspace.glob(f"{jid}-JAX-tiny.earlier-*")]
    assert len(kept_log) == 1 and "the earlier run's error" in kept_log[0].read_text()
    assert len(kept_dir) == 1 and (kept_dir[0] / ".stages" / "train" / "n1").read_text().startswith("rc=1")


def test_preflight_kills_nothing_when_squeue_fails(cluster, workspace, tmp_path, venv):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "squeue").write_text("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    (bindir / "squeue").chmod(0o755)
    leftover, scratch = fake_leftover(workspace)
    other_ws = tmp_path / "other_ws"
    other, other_scratch = fake_leftover(other_ws)
    try:
        job_id, log = submit(cluster, workspace, "tiny", "--", "steps=2", PATH=f"{bindir}:{os.environ['PATH']}")
        assert wait_job_end(cluster, job_id, 240) == "COMPLETED", log.read_text()[-3000:]
        assert log_has(log, r"^_job\.sbatch: squeue failed, so no leftovers of earlier jobs are cleaned: squeue: error")
        assert log_has(log, r"^n1: preflight: the scheduler did not say which of your jobs are active")
        assert leftover.poll() is None and scratch.is_dir(), "preflight touched a process or dir it could not judge"
        assert other.poll() is None and other_scratch.is_dir()
        # the same job with a working squeue: this workspace's leftovers go, another workspace's stay
        job_id, log = submit(cluster, workspace, "tiny", "--", "steps=2")
        assert wait_job_end(cluster, job_id, 240) == "COMPLETED", log.read_text()[-3000:]
        assert leftover.wait(timeout=10) == -9 and not scratch.exists()
        assert log_has(log, rf"^n\d: preflight: removing leftover scratch {scratch} of finished job 1$")
        assert other.poll() is None and other_scratch.is_dir()
    finally:
        for p in (leftover, other):
            if p.poll() is None:
                p.kill()
        run(["rm", "-rf", str(scratch), str(other_scratch)])


def test_summary_reads_only_this_run_of_an_appended_log(tmp_path):
    """A requeued job appends to its earlier run's log: the summary must not report that run's error."""
    log = tmp_path / "7-JAX-tiny.log"
    log.write_text(
        "==================== JOB ====================\nn1: ValueError: the first run's error\n"
        "==================== JOB ====================\nn1: RuntimeError: this run's error\n"
    )
    job_dir = tmp_path / "7-JAX-tiny"
    (job_dir / ".stages" / "train").mkdir(parents=True)
    (job_dir / ".stages" / "train" / "n1").write_text("rc=1 end=2.0 reason=exit\n")
    res = run(
        [str(REPO / "utils/launch/job_summary.sh"), "failed", "train"],
        env={"JOB_DIR": str(job_dir), "JOB_LOG": str(log), "JOB_NODELIST": "n1", "JOB_ID": "7"},
    )
    assert "first_error: n1: RuntimeError: this run's error" in res.stdout, res.stdout
