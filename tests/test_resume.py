"""Checkpoint/resume with a run alias (`--run ALIAS`, utils/launch/run_alias.sh): real MaxText on the
CPU (configs/tiny.yml) through run_local.sh writes its checkpoints into $JOB_WORKSPACE/<user>/runs/ALIAS and
the next job of the run restores the latest one (the log's restore line, the header's run line,
triage's restored_from_step, and the steps go on from there); a job without --run is unaffected;
the run's lock refuses a second job while the first runs (a held lock, no second training) and is
taken over from a job that ended without giving it back; bad aliases and contradicting overrides
are refused in one line before anything is written."""

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run
from test_launch_input import assert_rejected, fake_sbatch  # noqa: F401 - fake_sbatch is a fixture

import joblog
from diagnosis import triage as triage_tool
from helpers.jobs import log_has, submit, summary, triage, wait_job_end

HOST = socket.gethostname()
USER = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
LIB = REPO / "utils" / "launch"


def owner_line(job: str, scheduler: str = "local", user: str = USER, host: str = HOST) -> str:
    return f"job={job} scheduler={scheduler} user={user} host={host} pid=1 since=2026-11-24T09:00:00Z"


def hold(workspace: Path, alias: str, owner: str) -> Path:
    """A lock on the run as a job that holds it leaves it: RUN_DIR/lock/owner."""
    lock = workspace / USER / "runs" / alias / "lock"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(owner + "\n")
    return lock


def claim(workspace: Path, job_id: str, alias: str = "r1", **env: str) -> subprocess.CompletedProcess:
    """run_claim of utils/launch/run_alias.sh as _job.sbatch calls it (PROG=_job.sbatch)."""
    job_dir = workspace / f"{job_id}-JAX-tiny"
    job_dir.mkdir(exist_ok=True)
    script = (
        f'source "{LIB}/lib.sh"; source "{LIB}/run_alias.sh"; PROG=_job.sbatch\n'
        'if run_claim; then echo CLAIMED; cat "$(run_dir)/lock/owner"; else echo REFUSED; fi\n'
    )
    base = {
        "JOB_WORKSPACE": str(workspace),
        "MST_RUN": alias,
        "JOB_ID": job_id,
        "JOB_NAME": job_dir.name,
        "JOB_DIR": str(job_dir),
        "JOB_SCHEDULER": "slurm",
    }
    return run(["bash", "-c", script], env={**base, **env})


# --- the lock --------------------------------------------------------------------------------
def test_a_running_slurm_job_keeps_the_run(workspace):
    lock = hold(workspace, "r1", owner_line("12", "slurm"))
    res = claim(workspace, "13", JOB_ACTIVE_IDS="12 13")
    assert res.stdout.split()[0] == "REFUSED", res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("_job.sbatch: run 'r1' is in use by job 12 (slurm job of"), lines
    assert "--dependency=afterany:12" in lines[0]
    assert (lock / "owner").read_text().startswith("job=12 ")
    assert not (workspace / "13-JAX-tiny" / "13-JAX-tiny").exists()


def test_the_lock_of_an_ended_slurm_job_is_taken_over(workspace):
    lock = hold(workspace, "r1", owner_line("12", "slurm"))
    res = claim(workspace, "13", JOB_ACTIVE_IDS="13")
    assert res.stdout.split()[:2] == ["CLAIMED", "job=13"], res.stdout + res.stderr
    assert res.stderr.strip() == (
        "_job.sbatch: run 'r1': took over the lock of job 12, which has ended without giving it back"
    )
    link = workspace / "13-JAX-tiny" / "13-JAX-tiny" / "checkpoints"
    assert link.is_symlink() and link.resolve() == (workspace / USER / "runs" / "r1" / "checkpoints").resolve()
    assert sorted(p.name for p in lock.iterdir()) == ["owner"]


def test_a_requeued_job_takes_its_own_lock_back(workspace):
    hold(workspace, "r1", owner_line("13", "slurm"))
    res = claim(workspace, "13", JOB_ACTIVE_IDS="13")
    assert res.stdout.startswith("CLAIMED"), res.stdout + res.stderr


@pytest.mark.parametrize(
    ("owner", "env"),
    [
        (owner_line("12", "slurm"), {}),  # squeue failed: JOB_ACTIVE_IDS unset
        (owner_line("12", "slurm", user="someoneelse"), {"JOB_ACTIVE_IDS": "13"}),
        (owner_line("local-1-2", host="elsewhere"), {"JOB_ACTIVE_IDS": "13"}),
    ],
    ids=["no-squeue", "other-user", "local-job-on-another-host"],
)
def test_a_holder_this_job_cannot_check_is_left_alone(owner, env, workspace):
    lock = hold(workspace, "r1", owner)
    res = claim(workspace, "13", **env)
    assert res.stdout.startswith("REFUSED")
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "which this job cannot check: if it has ended, remove" in lines[0], lines
    assert str(lock) in lines[0] and (lock / "owner").read_text().strip() == owner


def test_a_local_holder_runs_while_a_process_has_its_job_id(workspace):
    """A local job runs while any process of it (stage, trainer, log writer) carries its JOB_ID."""
    hold(workspace, "r1", owner_line("local-20261124-000000-1"))
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "JOB_ID": "local-20261124-000000-1"})
    try:
        res = claim(workspace, "13", JOB_ACTIVE_IDS="13")
        assert res.stdout.startswith("REFUSED") and "in use by job local-20261124-000000-1 (local job" in res.stderr
        assert "dependency" not in res.stderr
    finally:
        proc.kill()
        proc.wait()
    res = claim(workspace, "13", JOB_ACTIVE_IDS="13")
    assert res.stdout.startswith("CLAIMED") and "took over the lock of job local-20261124-000000-1" in res.stderr


def test_release_only_by_the_holder(workspace):
    hold(workspace, "r1", owner_line("12", "slurm"))
    script = f'source "{LIB}/lib.sh"; source "{LIB}/run_alias.sh"; run_release'
    env = {"JOB_WORKSPACE": str(workspace), "MST_RUN": "r1"}
    assert run(["bash", "-c", script], env={**env, "JOB_ID": "13"}).returncode == 0
    assert (workspace / USER / "runs" / "r1" / "lock" / "owner").exists()
    assert run(["bash", "-c", script], env={**env, "JOB_ID": "12"}).returncode == 0
    assert not (workspace / USER / "runs" / "r1" / "lock").exists()


def test_refused_slurm_job_ends_with_a_summary_that_triage_explains(workspace):
    """What _job.sbatch writes when the run is held: the header, the refusal, a JOB SUMMARY with
    stage none (no node ran a stage, so none lacks an exit record); triage names the holder."""
    hold(workspace, "r1", owner_line("12", "slurm"))
    name = "13-JAX-tiny"
    log = workspace / f"{name}.log"
    (workspace / name).mkdir()
    env = {
        "JOB_WORKSPACE": str(workspace),
        "MST_RUN": "r1",
        "JOB_ID": "13",
        "JOB_NAME": name,
        "JOB_DIR": str(workspace / name),
        "JOB_LOG": str(log),
        "JOB_SCHEDULER": "slurm",
        "JOB_NUM_NODES": "2",
        "JOB_NODELIST": "n1 n2",
        "JOB_ACTIVE_IDS": "12 13",
        "MODEL": "tiny",
    }
    script = (
        f'source "{LIB}/lib.sh"; source "{LIB}/run_alias.sh"; PROG=_job.sbatch\n'
        f'"{LIB}/job_header.sh"; run_claim || "{LIB}/job_summary.sh" failed none\n'
    )
    with log.open("w") as out:
        assert subprocess.run(["bash", "-c", script], env={**os.environ, **env}, stdout=out, stderr=out).returncode == 0
    s = summary(log)
    assert s["status"] == "failed" and s["stage"] == "none" and "no_exit_record" not in s, s
    assert log_has(log, r"^run: r1 \S+/runs/r1 \(no checkpoint: starts from step 0\)$")
    r = triage(log, None, "--no-scheduler")
    assert r["status"] == "failed" and r["failure_class"] is None and r["culprit_hosts"] == []
    assert r["summary"].startswith("not started: _job.sbatch: run 'r1' is in use by job 12 ("), r["summary"]
    assert r["evidence"][0]["text"].startswith("_job.sbatch: run 'r1' is in use by job 12")
    assert r["run"] == {
        "alias": "r1",
        "dir": str(workspace / USER / "runs" / "r1"),
        "checkpoint_at_start": None,
        "restored_from_step": None,
        "restore_line": None,
    }


# --- input checks ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "a b"], "bad run alias 'a b': use letters, digits, . _ -"),
        (["--run=.hidden"], "bad run alias '.hidden'"),
        (["--run", "x" * 65], "bad run alias"),
        (["--run"], "--run needs a run alias, e.g. --run exp1"),
        (["--run", "r1", "--", "run_name=mine"], "'run_name=...' contradicts --run"),
        (["--run", "r1", "--", "base_output_directory=/tmp/x"], "'base_output_directory=...' contradicts --run"),
        (["--run", "r1", "--", "enable_checkpointing=False"], "'enable_checkpointing=False' contradicts --run"),
    ],
)
def test_bad_run_input_is_refused(args, message, fake_sbatch, workspace, venv):  # noqa: F811
    res = run([str(REPO / "submit.sh"), "tiny", *args], env={**fake_sbatch, **launcher_env(workspace)})
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, message)
    res = run([str(REPO / "run_local.sh"), "tiny", *args], env=launcher_env(workspace))
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1 and message in lines[0], res.stderr
    assert not any(workspace.iterdir())


def test_dry_run_shows_the_run_and_an_inherited_alias_is_dropped(fake_sbatch, workspace, venv):  # noqa: F811
    ckpts = workspace / USER / "runs" / "r1" / "checkpoints"
    for d in ("3", "12", "15.orbax-checkpoint-tmp-1795512232", "notes"):
        (ckpts / d).mkdir(parents=True)
    env = {**fake_sbatch, **launcher_env(workspace)}
    res = run([str(REPO / "submit.sh"), "tiny", "--run", "r1", "--dry-run"], env=env)
    assert res.returncode == 0, res.stderr
    assert f"run: r1 {workspace}/{USER}/runs/r1 (latest checkpoint: step 12, training goes on at step 13)" in res.stdout
    res = run([str(REPO / "submit.sh"), "tiny", "--dry-run"], env={**env, "MST_RUN": "r1"})
    assert res.returncode == 0 and not re.search(r"^run: ", res.stdout, re.M), res.stdout


def test_run_local_is_refused_while_the_run_is_held(workspace, venv):
    """Nothing of the refused job is written: no job directory, log or snapshot."""
    lock = hold(workspace, "r1", owner_line("local-20261124-000000-2"))
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "JOB_ID": "local-20261124-000000-2"})
    try:
        res = run([str(REPO / "run_local.sh"), "tiny", "--run", "r1", "--", "steps=3"], env=launcher_env(workspace))
    finally:
        proc.kill()
        proc.wait()
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith("run_local.sh: run 'r1' is in use by job local-20261124-000000-2 (local job of")
    assert sorted(p.name for p in workspace.iterdir()) == [USER]
    assert not any((workspace / USER / ".snapshots").iterdir())
    assert (lock / "owner").read_text().startswith("job=local-20261124-000000-2 ")


# --- the parser -------------------------------------------------------------------------------
ABSL = "I1124 09:29:29.708791 140442443393920 "


def test_parser_finds_the_restore_line_of_the_last_run(tmp_path):
    """The restore line is an absl INFO line (the scanner skips those): found in any block, and a
    requeued log's report is about its last run only."""
    header = [
        "==================== JOB ====================",
        "job: 7 7-JAX-tiny",
        "nodes: 1 (vm)",
        "run: r1 /ws/runs/r1 (latest checkpoint: step 5, training goes on at step 6)",
        "started: 2026-11-24T09:29:00Z",
        "=============================================",
    ]
    filler = [f"vm: {ABSL}pyconfig.py:591] Config param p{i}: {'x' * 60}" for i in range(60000)]  # > 4 MiB
    restore = f"vm: {ABSL}checkpointing.py:705] restoring from this run's directory step 5"
    log = tmp_path / "7-JAX-tiny.log"
    log.write_text(
        "\n".join([*header, *filler, restore, f"vm: {ABSL}metric_logger.py:265] completed step: 6, seconds: 0.1"])
        + "\n"
    )
    s = joblog.scan(log)
    assert s.restored is not None and s.restored.host == "vm" and s.restored.data == {"step": 5}
    assert s.restored.line == len(header) + len(filler) + 1 and s.restored.raw == restore
    assert joblog.run_of(s) == {
        "alias": "r1",
        "dir": "/ws/runs/r1",
        "checkpoint_at_start": 5,
        "restored_from_step": 5,
        "restore_line": s.restored.line,
    }
    # a second run appended (requeued) that restored nothing
    with log.open("a") as f:
        f.write("\n".join([*header[:3], "run: r1 /ws/runs/r1 (no checkpoint: starts from step 0)", *header[4:]]) + "\n")
    s = joblog.scan(log)
    assert s.runs == 2 and s.restored is None
    assert joblog.run_of(s)["restored_from_step"] is None
    # no run line, no restore line: no run
    log.write_text("\n".join(header[:3] + header[4:]) + "\n")
    assert joblog.run_of(joblog.scan(log)) is None
    # a short log (both runs in the scanner's first block): the report is still about the last run only,
    # its steps and its restore line (the first run's steps 0..2 and restore of step 5 are not its)
    step = f"vm: {ABSL}metric_logger.py:265] completed step: {{}}, seconds: 0.1"
    rerun = [*header[:3], "run: r1 /ws/runs/r1 (latest checkpoint: step 2, training goes on at step 3)", *header[4:]]
    first = [*header, restore, *(step.format(i) for i in range(3))]
    log.write_text(
        "\n".join([*first, *rerun, restore.replace("step 5", "step 2"), step.format(3), step.format(4)]) + "\n"
    )
    s = joblog.scan(log)
    assert s.runs == 2 and s.steps.step == [3, 4] and s.restored is not None and s.restored.data == {"step": 2}
    assert joblog.run_of(s)["checkpoint_at_start"] == 2


# --- real training ------------------------------------------------------------------------------
def only_new_log(workspace: Path, before: set[Path]) -> Path:
    logs = set(workspace.glob("local-*-JAX-*.log")) - before
    assert len(logs) == 1, logs
    return logs.pop()


def train(workspace: Path, *args: str) -> Path:
    before = set(workspace.glob("local-*-JAX-*.log"))
    res = run([str(REPO / "run_local.sh"), "tiny", *args], env=launcher_env(workspace), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    log = only_new_log(workspace, before)
    assert summary(log)["status"] == "completed"
    return log


def steps_of(log: Path) -> list[int]:
    return [int(m) for m in re.findall(rf"^{HOST}: .*completed step: (\d+),", log.read_text(), re.M)]


@pytest.mark.slow
@pytest.mark.heavy
def test_a_resubmission_restores_the_latest_checkpoint(workspace, venv):
    run_dir = workspace / USER / "runs" / "r1"
    ckpt = "checkpoint_period=3 async_checkpointing=false".split()
    # job 1: a new run (checkpointing switched on by --run), checkpoints at steps 0, 3 and the last, 5
    log1 = train(workspace, "--run", "r1", "--", "steps=6", *ckpt)
    assert log_has(log1, rf"^run: r1 {run_dir} \(no checkpoint: starts from step 0\)$")
    assert not log_has(log1, "restoring from this run's directory")
    assert steps_of(log1) == list(range(6))
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [0, 3, 5]
    out1 = log1.with_suffix("") / log1.stem
    assert (out1 / "checkpoints").is_symlink() and (out1 / "checkpoints").resolve() == (run_dir / "checkpoints")
    assert list((out1 / "tensorboard").rglob("events.out.tfevents.*")), "TensorBoard events stay in the job dir"
    assert not (run_dir / "lock").exists(), "the lock is given back at the end"
    r1 = triage(log1)
    assert r1["run"] == {
        "alias": "r1", "dir": str(run_dir), "checkpoint_at_start": None, "restored_from_step": None,
        "restore_line": None,
    }  # fmt: skip

    # job 2 of the run, after a job that was killed holding the lock: takes it over, restores step 5
    hold(workspace, "r1", owner_line("local-20261124-000000-3"))
    before = set(workspace.glob("local-*-JAX-*.log"))
    res = run(
        [str(REPO / "run_local.sh"), "tiny", "--run", "r1", "--", "steps=10", "enable_checkpointing=true", *ckpt],
        env=launcher_env(workspace),
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (
        "run_local.sh: run 'r1': took over the lock of job local-20261124-000000-3, which has ended without giving "
        "it back" in res.stderr
    )
    log2 = only_new_log(workspace, before)
    assert log_has(log2, rf"^run: r1 {run_dir} \(latest checkpoint: step 5, training goes on at step 6\)$")
    restore = [
        (i, ln) for i, ln in enumerate(log2.read_text().splitlines(), 1) if "restoring from this run's directory" in ln
    ]
    assert len(restore) == 1 and restore[0][1].endswith(
        "checkpointing.py:705] restoring from this run's directory step 5"
    )
    assert steps_of(log2) == list(range(6, 10)), "training goes on after the restored step, not from 0"
    assert 9 in {int(p.name) for p in (run_dir / "checkpoints").iterdir()}
    r2 = triage(log2)
    assert r2["status"] == "completed" and r2["progress"]["last_step"] == 9
    assert r2["run"] == {
        "alias": "r1", "dir": str(run_dir), "checkpoint_at_start": 5, "restored_from_step": 5,
        "restore_line": restore[0][0],
    }  # fmt: skip
    assert "restored the checkpoint of step 5 and ran steps 6-9" in r2["summary"]
    text = run([str(REPO / "utils" / "triage.py"), str(log2)]).stdout
    assert f"run: r1 ({run_dir}): restored_from_step 5 (log line {restore[0][0]})" in text
    assert triage_tool.render(r2) == text.rstrip("\n")

    # a job without --run in the same workspace: its checkpoints stay in its own job dir, nothing restored
    log3 = train(workspace, "--", "steps=2", "enable_checkpointing=true", *ckpt)
    out3 = log3.with_suffix("") / log3.stem
    assert (out3 / "checkpoints").is_dir() and not (out3 / "checkpoints").is_symlink()
    assert not log_has(log3, "^run: ") and not log_has(log3, "restoring from this run's directory")
    assert steps_of(log3) == [0, 1]
    assert triage(log3)["run"] is None


# --- the local Slurm cluster ------------------------------------------------------------------------
@pytest.mark.cluster
def test_a_slurm_run_restores_on_two_nodes_and_refuses_a_second_job(cluster, workspace, venv):
    """submit.sh --run on 2 nodes: the resubmission restores on both; while a job of the run is
    active (here a held one, which squeue lists) another is refused before its first stage."""
    run_dir = workspace / USER / "runs" / "c1"
    ckpt = ["checkpoint_period=2", "async_checkpointing=false"]
    job1, log1 = submit(cluster, workspace, "tiny", "-N", "2", "--run", "c1", "--", "steps=4", *ckpt)
    assert wait_job_end(cluster, job1, 300) == "COMPLETED", log1.read_text()[-3000:]
    assert log_has(log1, rf"^run: c1 {run_dir} \(no checkpoint: starts from step 0\)$")
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [0, 2, 3]
    assert not (run_dir / "lock").exists()

    holder, _ = submit(cluster, workspace, "tiny", "--hold")  # pending (held): active for squeue
    hold(workspace, "c1", owner_line(holder, "slurm"))
    job2, log2 = submit(cluster, workspace, "tiny", "-N", "2", "--run", "c1", "--", "steps=7", *ckpt)
    assert wait_job_end(cluster, job2, 120) == "FAILED", log2.read_text()[-3000:]
    assert log_has(log2, rf"^_job\.sbatch: run 'c1' is in use by job {holder} \(slurm job of ")
    s = summary(log2)
    assert s["status"] == "failed" and s["stage"] == "none" and "no_exit_record" not in s, s
    assert not (workspace / f"{job2}-JAX-tiny" / ".stages").exists(), "no stage ran"
    r = triage(log2, cluster)
    assert r["failure_class"] is None and r["summary"].startswith(
        f"not started: _job.sbatch: run 'c1' is in use by job {holder} "
    )
    assert run(["scancel", holder], env=cluster).returncode == 0
    wait_job_end(cluster, holder, 60)

    # the holder has ended without giving the lock back: the next job takes it over and restores step 3
    job3, log3 = submit(cluster, workspace, "tiny", "-N", "2", "--run", "c1", "--", "steps=7", *ckpt)
    assert wait_job_end(cluster, job3, 300) == "COMPLETED", log3.read_text()[-3000:]
    assert log_has(log3, rf"^_job\.sbatch: run 'c1': took over the lock of job {holder}, which has ended")
    assert log_has(log3, rf"^run: c1 {run_dir} \(latest checkpoint: step 3, training goes on at step 4\)$")
    for host in ("n1", "n2"):
        assert log_has(log3, rf"^{host}: .*restoring from this run's directory step 3$"), host
        steps = [int(m) for m in re.findall(rf"^{host}: .*completed step: (\d+),", log3.read_text(), re.M)]
        assert steps == [4, 5, 6], (host, steps)
    r = triage(log3, cluster)
    assert r["status"] == "completed" and r["run"]["alias"] == "c1" and r["run"]["restored_from_step"] == 3
    assert not (run_dir / "lock").exists()
