"""run_local.sh: the same tiers on one machine — training, a config error, and the interactive
shell in the job's environment (a crash with core dumps: tests/test_coredumps.py)."""

import getpass
import socket
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

from helpers.jobs import log_has, summary

HOST = socket.gethostname()


def only_log(workspace: Path) -> Path:
    logs = list(workspace.glob("local-*-JAX-*.log"))
    assert len(logs) == 1, logs
    return logs[0]


@pytest.mark.slow
@pytest.mark.heavy
def test_trains_and_summarises(workspace, venv):
    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=5"], env=launcher_env(workspace), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    log = only_log(workspace)
    assert res.stdout.splitlines()[0] == f"run_local.sh: job {log.name.split('-JAX-')[0]}, log {log}"
    assert log_has(log, rf"^{HOST}: .*completed step: 4,")
    s = summary(log)
    assert s["status"] == "completed" and s["nodes"] == f"1 ({HOST})"
    job_dir = log.with_suffix("")
    assert (job_dir / "artifact" / ".submit" / "command.txt").read_text().strip() == "run_local.sh tiny -- steps=5"
    assert (job_dir / "summary.txt").read_text().startswith("==================== JOB SUMMARY")


def test_config_error_is_refused_before_the_run(workspace, venv):
    """A misspelt MaxText key costs a second, not a start-up: refused against MaxText's schema."""
    res = run(
        [str(REPO / "run_local.sh"), "tiny", "--", "per_device_batch_sizee=1"], env=launcher_env(workspace), timeout=300
    )
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert "MaxText has no key 'per_device_batch_sizee' (did you mean 'per_device_batch_size'" in lines[0]
    assert not any(workspace.iterdir())


def test_shell_has_the_job_environment(workspace, venv):
    script = 'echo "PY=$MST_PYTHON FRAC=$XLA_PYTHON_CLIENT_MEM_FRACTION RT=$MST_CONTAINER"; exit 0\n'
    res = run(
        [str(REPO / "run_local.sh")],
        env={**launcher_env(workspace), "CONTAINER_RUNTIME": "none"},
        input=script,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert f"PY={Path(launcher_env(workspace)['MAXTEXT_SLURM_VENV'])}/bin/python FRAC=0.93 RT=none" in res.stdout


# The credential overrides (argv, the log, the recorded command, HF_TOKEN_PATH, TensorBoard) are
# tested on a real run by test_shared_ws_trainer.py::test_the_hugging_face_token_never_reaches_tensorboard.


@pytest.mark.slow
@pytest.mark.heavy
def test_a_site_compile_cache_is_private_and_reused(workspace, venv, tmp_path):
    """COMPILE_CACHE_DIR (a site's node-local disk): the job's compiled programs go to the user's own
    private directory there, not to the workspace, and the next job of the same program finds them
    there: JAX says it read the train step from the cache (JAX_LOG_COMPILES, passed as an _env_
    override, logs each cache hit), and no second jit_train_step entry is written. JAX keeps only what
    took over a second to compile, so on a loaded machine the second job may add a small program the
    first compiled faster than that; nothing of the first is replaced."""
    caches = tmp_path / "nvme"
    env = launcher_env(workspace, COMPILE_CACHE_DIR=str(caches))
    mine = caches / getpass.getuser()

    def entries() -> set[str]:
        return {p.name for p in mine.iterdir()}

    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=3"], env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    first = entries()
    assert any(name.startswith("jit_train_step-") for name in first), first
    assert mine.stat().st_mode & 0o7777 == 0o700
    assert not (workspace / getpass.getuser() / ".jax_cache").exists()
    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=3", "_env_JAX_LOG_COMPILES=1"], env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "Persistent compilation cache hit for 'jit_train_step'" in res.stdout + res.stderr, res.stdout[-3000:]
    again = entries()
    assert first <= again, first - again

    def steps(names: set[str]) -> set[str]:
        return {n for n in names if n.startswith("jit_train_step-")}

    assert steps(again) == steps(first), again - first
