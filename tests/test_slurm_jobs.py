"""Real jobs on the local multi-node Slurm cluster (started by the tests): a 2-node MaxText run,
a killed rank, scancel and a stage timeout, each ending with a JOB SUMMARY, and utils/triage.py's
verdict on each (the real-job half of the diagnosis tests; a frozen rank is in test_ray_job.py)."""

import os
import re
import signal
import time
import uuid

import pytest
from conftest import run

from helpers.jobs import job_state, log_has, submit, summary, trainer_pid, triage, wait_for, wait_job_end, wait_log

pytestmark = pytest.mark.cluster
STEP = r"^{host}: .*completed step: {step},"


def test_two_node_job_trains_on_both_nodes(cluster, workspace, venv):
    secret = f"s3cr3t-{uuid.uuid4().hex}"  # made here, so no file of the repo contains it
    job_id, log = submit(cluster, workspace, "tiny:e2e", "-N", "2", "--", "steps=5", f"_env_MY_API_TOKEN={secret}")
    assert wait_job_end(cluster, job_id, 300) == "COMPLETED", log.read_text()[-3000:]
    for host in ("n1", "n2"):
        assert log_has(log, STEP.format(host=host, step=4)), f"{host} did not train"
    s = summary(log)
    assert s["status"] == "completed" and s["nodes"] == "2 (n1 n2)" and s["failed_nodes"] == "none"
    assert log_has(log, r"^stage_timeouts: image:1800,preflight:600,train:86400 \(defaults")

    job_dir = workspace / f"{job_id}-JAX-tiny-e2e"
    assert (job_dir / "log").resolve() == log.resolve()
    artifact = job_dir / "artifact"
    command = (artifact / ".submit" / "command.txt").read_text()
    assert command.startswith("submit.sh tiny:e2e -N 2 -- steps=5 _env_MY_API_TOKEN=<redacted>")
    assert re.search(r"^commit: [0-9a-f]{40}$", (artifact / ".submit" / "git.txt").read_text(), re.M)
    assert (artifact / "_job.sbatch").is_file()
    assert not (artifact.resolve().stat().st_mode & 0o222), "snapshot must be read-only"
    assert not ((artifact / "_job.sbatch").stat().st_mode & 0o222)
    # one outcome record per node, under the node's own hostname
    records = {p.name: p.read_text() for p in (job_dir / ".stages" / "train").iterdir()}
    assert sorted(records) == ["n1", "n2"] and all(r.startswith("rc=0 ") for r in records.values())
    # the secret value passed with _env_ appears nowhere the job wrote
    leaked = run(["grep", "-rl", secret, str(workspace)]).stdout
    assert not leaked, f"secret leaked into {leaked}"
    # TensorBoard events of process 0 are in the job directory
    assert list(job_dir.rglob("events.out.tfevents.*"))
    # triage by job id, as a user types it
    r = triage(job_id, {**cluster, "JOB_WORKSPACE": str(workspace)})
    assert r["status"] == "completed" and r["failure_class"] is None and r["culprit_hosts"] == [], r["summary"]
    assert r["progress"]["last_step"] == 4 and r["progress"]["total_steps"] == 5
    assert [h["host"] for h in r["hosts"]] == ["n1", "n2"] and r["tgs"]["steady"] > 0


def test_killed_rank_stops_the_job_fast(cluster, workspace, venv):
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000")
    wait_log(log, STEP.format(host="n2", step=3), 240, "n2 to train")
    pid = trainer_pid(job_id, rank=1)
    assert pid, "rank 1 trainer not found"
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_job_end(cluster, job_id, 60)
    elapsed = time.monotonic() - killed_at
    assert elapsed < 30, f"job took {elapsed:.1f} s to end after the kill"
    s = summary(log)
    assert s["status"] == "failed"
    assert s["failed_nodes"].startswith("n2 (exit 137)"), s
    assert s["first_failure"] == "n2"
    assert job_state(cluster, job_id) == "FAILED"
    assert trainer_pid(job_id, rank=0) is None, "rank 0 survived"
    # triage blames the killed node, not the survivor that saw the collective fail
    r = triage(log, cluster)
    assert r["status"] == "failed" and r["culprit_hosts"] == ["n2"], r["summary"]
    assert r["failure_class"] == "oom_host" and r["confidence"] == "low" and "SIGKILL" in r["summary"]
    assert any(e["file"].endswith("/.stages/train/n2") and e["text"].startswith("rc=137") for e in r["evidence"])


def test_scancel_still_writes_the_summary(cluster, workspace, venv):
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000")
    wait_log(log, STEP.format(host="n1", step=2), 240, "n1 to train")
    assert run(["scancel", job_id], env=cluster).returncode == 0
    wait_job_end(cluster, job_id, 60)
    s = wait_for(lambda: log_has(log, "^status: ") and summary(log), 30, "the summary")
    assert s["status"] == "cancelled", s
    assert s["stage"] == "train"
    assert trainer_pid(job_id, rank=0) is None and trainer_pid(job_id, rank=1) is None
    r = triage(log, cluster)
    assert r["status"] == "cancelled" and r["failure_class"] == "cancelled" and r["culprit_hosts"] == [], r["summary"]
    assert r["progress"]["last_step"] >= 2


def test_stage_timeout(cluster, workspace, venv):
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=1000000", STAGE_TIMEOUTS="train:25")
    wait_job_end(cluster, job_id, 180)
    s = summary(log)
    assert s["status"] == "stage_timeout", s
    assert s["failed_nodes"].startswith(("n1 (timeout, exit", "n2 (timeout, exit")), s
    assert log_has(log, r"^stage_timeouts: image:1800,preflight:600,train:25 ")
    assert log_has(log, r"stage 'train' exceeded its 25 s limit")
    r = triage(log, cluster)
    assert r["status"] == "failed" and r["failure_class"] == "stage_timeout", r["summary"]
    assert any("exceeded its 25 s limit" in e["text"] or "reason=timeout" in e["text"] for e in r["evidence"])


def test_preflight_failure_stops_before_training(cluster, workspace, venv):
    job_id, log = submit(cluster, workspace, "tiny", "-N", "2", "--", "steps=5", PREFLIGHT_MIN_FREE_GB="100000000")
    assert wait_job_end(cluster, job_id, 120) == "FAILED"
    s = summary(log)
    assert s["status"] == "failed" and s["stage"] == "preflight"
    assert "need PREFLIGHT_MIN_FREE_GB=100000000" in s.get("first_error", ""), s
    assert not log_has(log, "completed step")
