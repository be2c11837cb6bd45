"""Bad input to submit.sh / run_local.sh: one clear line, non-zero exit, nothing submitted or written.

A fake `sbatch` first on PATH records any call, so "nothing submitted" is checked without a
cluster; the workspace must stay empty (no snapshot, no job directory, no log).
"""

import os
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

FAKE_SBATCH = "#!/bin/sh\necho \"$@\" >> \"$SBATCH_CALLS\"\necho 4242\n"


@pytest.fixture()
def fake_sbatch(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(FAKE_SBATCH)
    (bindir / "sbatch").chmod(0o755)
    calls = tmp_path / "sbatch_calls"
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "SBATCH_CALLS": str(calls)}


def assert_rejected(res, calls: Path, workspace: Path, must_mention: str) -> None:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode != 0
    assert len(lines) == 1, res.stderr
    assert must_mention in lines[0], lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    assert not calls.exists(), "sbatch was called"
    assert not any(workspace.iterdir()), f"workspace not empty: {list(workspace.iterdir())}"


CASES = [
    (["nosuchmodel"], "unknown model 'nosuchmodel'; available:"),
    (["tiny", "-N", "0"], "bad node count '0'"),
    (["tiny", "-N", "two"], "bad node count 'two'"),
    (["tiny", "--nodes=-3"], "bad node count '-3'"),
    (["tiny", "--", "steps"], "override 'steps' has no '='"),
    (["tiny", "--", "steps=3", "_env_1BAD=x"], "bad environment name"),
    (["ti*ny"], "bad model name"),
    ([], "first argument must be MODEL[:TAG]"),
]


@pytest.mark.parametrize(("args", "message"), CASES)
def test_submit_rejects(args, message, fake_sbatch, workspace, venv):
    res = run([str(REPO / "submit.sh"), *args], env={**fake_sbatch, **launcher_env(workspace)})
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, message)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STAGE_TIMEOUTS": "train:soon"}, "STAGE_TIMEOUTS entry 'train:soon'"),
        ({"STAGE_TIMEOUTS": "compile:10"}, "STAGE_TIMEOUTS entry 'compile:10'"),
        ({"CONTAINER_RUNTIME": "singularity"}, "CONTAINER_RUNTIME='singularity'"),
        ({"RAY": "yes"}, "RAY='yes' must be 0 or 1"),
    ],
)
def test_submit_rejects_bad_settings(env, message, fake_sbatch, workspace, venv):
    res = run([str(REPO / "submit.sh"), "tiny"], env={**fake_sbatch, **launcher_env(workspace), **env})
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, message)


def test_unwritable_workspace(fake_sbatch, tmp_path, venv):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    res = run([str(REPO / "submit.sh"), "tiny"], env={**fake_sbatch, **launcher_env(blocker / "ws")})
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1 and "is not a writable directory" in lines[0]
    assert not Path(fake_sbatch["SBATCH_CALLS"]).exists()
    assert blocker.read_text() == "not a directory"


def test_ambiguous_and_unknown_names_list_candidates(scratch_repo, fake_sbatch, workspace):
    for name in ("alpha-7b", "alpha-70b", "beta-7b"):
        (scratch_repo / "configs" / f"{name}.yml").write_text('base_config: "base.yml"\n')
    submit = str(scratch_repo / "submit.sh")
    env = {**fake_sbatch, **launcher_env(workspace)}
    res = run([submit, "alpha"], env=env)
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, "ambiguous model 'alpha' matches: alpha-70b alpha-7b")
    res = run([submit, "7b"], env=env)
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, "ambiguous model '7b' matches: alpha-7b beta-7b")


def test_broken_yaml_config(scratch_repo, fake_sbatch, workspace):
    (scratch_repo / "configs" / "broken.yml").write_text('base_config: "base.yml"\nsteps: [1, 2\nper_device_batch_size: 1\n')
    res = run([str(scratch_repo / "submit.sh"), "broken"], env={**fake_sbatch, **launcher_env(workspace)})
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, "broken.yml is not valid YAML at line 3")


def test_run_local_rejects_without_side_effects(workspace, venv):
    for args, message in [
        (["nosuchmodel"], "unknown model"),
        (["tiny", "steps=3"], "overrides go after --"),
        (["tiny", "--", "steps"], "has no '='"),
    ]:
        res = run([str(REPO / "run_local.sh"), *args], env=launcher_env(workspace))
        lines = res.stderr.strip().splitlines()
        assert res.returncode != 0 and len(lines) == 1 and message in lines[0], res.stderr
        assert not any(workspace.iterdir())


def test_model_resolution_order(scratch_repo, fake_sbatch, workspace):
    """Exact name beats prefix, prefix beats substring; the tag is sanitised into the job name."""
    for name in ("gamma", "gamma-big", "delta-gamma2"):
        (scratch_repo / "configs" / f"{name}.yml").write_text('base_config: "base.yml"\n')
    env = {**fake_sbatch, **launcher_env(workspace)}
    calls = Path(fake_sbatch["SBATCH_CALLS"])
    for arg, job_name in [
        ("gamma", "JAX-gamma"),
        ("gamma-b", "JAX-gamma-big"),
        ("delta", "JAX-delta-gamma2"),
        ("gamma2:run 1/$(x)", "JAX-delta-gamma2-run_1___x_"),
    ]:
        res = run([str(scratch_repo / "submit.sh"), arg], env=env)
        assert res.returncode == 0, res.stderr
        assert f"--job-name={job_name} " in calls.read_text().splitlines()[-1]
        assert f"Submitted job 4242 ({job_name})" in res.stdout
        assert (workspace / f"4242-{job_name}" / "artifact" / "_job.sbatch").is_file()


def test_dry_run_submits_and_writes_nothing(fake_sbatch, workspace, venv):
    res = run([str(REPO / "submit.sh"), "tiny:t1", "-N", "2", "--dry-run", "-t", "10", "--", "steps=5",
               "_env_HF_TOKEN=abc123"], env={**fake_sbatch, **launcher_env(workspace)})
    assert res.returncode == 0, res.stderr
    assert "--job-name=JAX-tiny-t1 --nodes=2" in res.stdout and " -t 10 " in res.stdout
    assert "HF_TOKEN=<redacted>" in res.stdout and "abc123" not in res.stdout
    assert not Path(fake_sbatch["SBATCH_CALLS"]).exists()
    assert not any(workspace.iterdir())
