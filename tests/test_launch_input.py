"""Bad input to submit.sh / run_local.sh: one clear line, non-zero exit, nothing submitted or written.

A fake `sbatch` (and `scontrol`, which submit.sh uses to release its held job) first on PATH
records any call, so "nothing submitted" is checked without a cluster; the workspace must stay
empty (no snapshot, no job directory, no log).
"""

import os
import re
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

FAKE_SBATCH = (
    '#!/bin/sh\necho "$@" >> "$SBATCH_CALLS"\nprintf \'%s\' "$TRAIN_ENV_OVERRIDES" > "$SBATCH_CALLS.env"\necho 4242\n'
)
FAKE_SCONTROL = '#!/bin/sh\necho "scontrol $*" >> "$SBATCH_CALLS"\n'


@pytest.fixture()
def fake_sbatch(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(FAKE_SBATCH)
    (bindir / "sbatch").chmod(0o755)
    (bindir / "scontrol").write_text(FAKE_SCONTROL)
    (bindir / "scontrol").chmod(0o755)
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
    (["tiny", "-N", "100001"], "bad node count '100001'"),
    # the launcher's own variables cannot be set for the trainer behind the checks' back
    (["tiny", "--", "_env_MODEL=llama2-7b"], "'_env_MODEL' sets a launcher variable"),
    (["tiny", "--", "_env_JOB_DIR=/tmp/x"], "'_env_JOB_DIR' sets a launcher variable"),
    (["tiny", "--", "_env_TRAIN_OVERRIDES=steps=1"], "'_env_TRAIN_OVERRIDES' sets a launcher variable"),
    (["tiny", "--", "_env_MST_PYTHON=/tmp/evil/python"], "'_env_MST_PYTHON' sets a launcher variable"),
    (["tiny", "--", "_env_PATH=/tmp/evil:/usr/bin"], "'_env_PATH' sets a launcher variable"),
    # sbatch flags that would leave the printed log / job dir unwritten or the node count unchecked
    (["tiny", "-J", "other"], "sbatch flag '-J' contradicts submit.sh"),
    (["tiny", "--job-name=other"], "(--job-name) contradicts submit.sh"),
    (["tiny", "--job=other"], "(--job-name) contradicts submit.sh"),
    (["tiny", "-o", "/tmp/elsewhere.log"], "sbatch flag '-o' contradicts submit.sh"),
    (["tiny", "--output=/tmp/elsewhere.log"], "(--output) contradicts submit.sh"),
    (["tiny", "--out", "/tmp/elsewhere.log"], "(--output) contradicts submit.sh"),
    (["tiny", "-e", "/tmp/err.log"], "sbatch flag '-e' contradicts submit.sh"),
    (["tiny", "--open-mode=truncate"], "(--open-mode) contradicts submit.sh"),
    (["tiny", "--export=NONE"], "(--export) contradicts submit.sh"),
    (["tiny", "--node=4"], "'--node=4' (--nodes): give the node count as -N NODES"),
    # MaxText overrides are judged against MaxText's schema before anything is submitted
    (["tiny", "--", "stepz=1"], "bad override 'stepz=1': MaxText has no key 'stepz' (did you mean 'steps'?)"),
    (["tiny", "--", "steps=ten"], "bad override 'steps=ten': steps takes an integer"),
    (["tiny", "--", "_env_M_STEPS=abc"], "'_env_M_STEPS' would set a MaxText key behind the schema check"),
    (
        ["tiny", "--", "_env_NOT_SET_ANYWHERE_42"],
        "passes $NOT_SET_ANYWHERE_42 from your environment, but it is not set",
    ),
    # --checkpoint-every: a time, for a run, instead of checkpoint_period
    (["tiny", "--checkpoint-every", "30m"], "--checkpoint-every needs --run ALIAS"),
    (["tiny", "--run", "r", "--checkpoint-every", "30x"], "--checkpoint-every takes a time such as 900, 900s, 30m"),
    (["tiny", "--run", "r", "--checkpoint-every=0"], "--checkpoint-every takes a time such as 900, 900s, 30m"),
    (
        ["tiny", "--run", "r", "--checkpoint-every", "5m", "--", "checkpoint_period=3"],
        "give --checkpoint-every or checkpoint_period=..., not both",
    ),
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
        ({"CONTAINER_RUNTIME": "kubernetes"}, "CONTAINER_RUNTIME='kubernetes'"),
        ({"RAY": "yes"}, "RAY='yes' must be 0 or 1"),
        ({"STAGE_TIMEOUTS": "train:99999999999999999999"}, "1 <= SECONDS <= 31536000"),
        ({"STAGE_TIMEOUTS": "preflight:60\ntrain:100"}, "STAGE_TIMEOUTS has a line break"),
        ({"METRICS_INTERVAL": "abc"}, "METRICS_INTERVAL='abc' must be a whole number from 1 to 3600"),
        ({"METRICS_INTERVAL": "0"}, "METRICS_INTERVAL='0' must be a whole number"),
        ({"MST_RAY_JOIN_TIMEOUT": "abc"}, "MST_RAY_JOIN_TIMEOUT='abc' must be a whole number"),
        ({"ENABLE_COREDUMPS": "yes"}, "ENABLE_COREDUMPS='yes' must be 0 or 1"),
        ({"COREDUMP_DIR": "cores"}, "COREDUMP_DIR='cores' must be an absolute path"),
        ({"COREDUMP_WAIT": "-1"}, "COREDUMP_WAIT='-1' must be a whole number from 0 to 3600"),
        ({"DASHBOARD_BIND": "0.0.0.0"}, "DASHBOARD_BIND='0.0.0.0' must be a loopback address"),
        ({"CONTAINER_IMAGE_TAR": "images/m.tar"}, "CONTAINER_IMAGE_TAR='images/m.tar' must be an absolute path"),
        ({"CONTAINER_AUTH_FILE": "auth.json"}, "CONTAINER_AUTH_FILE='auth.json' must be an absolute path"),
        (
            {"CONTAINER_AUTH_FILE": "/etc/passwd"},
            "'/etc/passwd' has mode 644: others can read your registry credentials",
        ),
        ({"CONTAINER_MOUNTS": "/data:data"}, "CONTAINER_MOUNTS entry '/data:data' is not SRC:DST or SRC:DST:ro"),
        (
            {"PROMETHEUS_BIN": "/nonexistent/prometheus"},
            "PROMETHEUS_BIN='/nonexistent/prometheus' is not an executable",
        ),
    ],
)
def test_submit_rejects_bad_settings(env, message, fake_sbatch, workspace, venv):
    res = run([str(REPO / "submit.sh"), "tiny"], env={**fake_sbatch, **launcher_env(workspace), **env})
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, message)


@pytest.mark.parametrize(("name", "bad"), [("my ws", " "), ("ws%j", "%"), ("it's", "'")])
def test_workspace_with_unsafe_characters(name, bad, fake_sbatch, tmp_path, venv):
    """A space, '%' (sbatch expands it in --output) or a quote (Prometheus' YAML) would break the job."""
    ws = tmp_path / name
    res = run([str(REPO / "submit.sh"), "tiny"], env={**fake_sbatch, **launcher_env(ws)})
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, res.stderr
    assert f"has the character '{bad}'" in lines[0]
    assert not ws.exists() and not Path(fake_sbatch["SBATCH_CALLS"]).exists()


def test_overrides_too_long_for_the_environment(fake_sbatch, workspace, venv):
    """Over 128 KiB the exec of the next tier would fail with a raw 'Argument list too long'."""
    many = [f"key_{i:03d}=" + "x" * 700 for i in range(200)]  # 141 KB in all
    res = run([str(REPO / "submit.sh"), "tiny", "--", *many], env={**fake_sbatch, **launcher_env(workspace)})
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, "at most 100000 fit")


def test_secret_values_are_redacted_whole(fake_sbatch, workspace, venv):
    """Whole values (spaces included) of a broad set of secret names, and MaxText's credential
    keys, are hidden in the dry run, the recorded command and the job header."""
    secrets = {
        "_env_DB_PASSWORD": "correct horse battery",
        "_env_OPENAI_KEY": "sk-live-1",
        "_env_GITHUB_PAT": "ghp_2",
        "_env_PRIVATE_KEY": "pk-3",
        "_env_PROXY_AUTH": "user:pw4",
        "_env_AWS_SECRET_ACCESS_KEY": "aws5",
        "hf_access_token": "hf_6",
    }
    words = ["correct", "horse", "battery", "sk-live-1", "ghp_2", "pk-3", "pw4", "aws5", "hf_6"]
    args = ["tiny", "--", "steps=3", "_env_NCCL_DEBUG=INFO", *(f"{k}={v}" for k, v in secrets.items())]
    env = {**fake_sbatch, **launcher_env(workspace)}
    dry = run([str(REPO / "submit.sh"), args[0], "--dry-run", *args[1:]], env=env)
    assert dry.returncode == 0, dry.stderr
    assert "steps=3" in dry.stdout and "NCCL_DEBUG=INFO" in dry.stdout
    for k in secrets:
        assert f"{k.removeprefix('_env_')}=<redacted>" in dry.stdout, k
    res = run([str(REPO / "submit.sh"), *args], env=env)
    assert res.returncode == 0, res.stderr
    command = next(workspace.glob("4242-*/artifact/.submit/command.txt")).read_text()
    assert "_env_DB_PASSWORD=<redacted>" in command and "hf_access_token=<redacted>" in command
    header = run(
        [str(REPO / "utils/launch/job_header.sh")],
        env={
            "TRAIN_OVERRIDES": "steps=3\nhf_access_token=hf_6\n",
            "TRAIN_ENV_OVERRIDES": "".join(
                f"{k.removeprefix('_env_')}={v}\n" for k, v in secrets.items() if k.startswith("_env_")
            ),
        },
    )
    assert "env_overrides: DB_PASSWORD=<redacted>" in header.stdout
    for text in (dry.stdout, command, header.stdout):
        leaked = [w for w in words if w in text]
        assert not leaked, (leaked, text)


def test_secret_passed_by_name_from_the_environment(fake_sbatch, workspace, venv):
    """`_env_NAME` alone takes the value from the caller's environment: it is never on a command line."""
    env = {**fake_sbatch, **launcher_env(workspace), "HF_TOKEN": "hf_from_env_9"}
    res = run([str(REPO / "submit.sh"), "tiny", "--", "steps=2", "_env_HF_TOKEN"], env=env)
    assert res.returncode == 0, res.stderr
    command = next(workspace.glob("4242-*/artifact/.submit/command.txt")).read_text()
    assert command.strip() == "submit.sh tiny -- steps=2 _env_HF_TOKEN"
    # the job gets the value (sbatch passes the submitting environment on)
    assert Path(fake_sbatch["SBATCH_CALLS"] + ".env").read_text() == "HF_TOKEN=hf_from_env_9\n"
    header = run([str(REPO / "utils/launch/job_header.sh")], env={"TRAIN_ENV_OVERRIDES": "HF_TOKEN=hf_from_env_9\n"})
    assert "env_overrides: HF_TOKEN=<redacted>" in header.stdout and "hf_from_env_9" not in header.stdout


def test_dry_run_creates_no_workspace(fake_sbatch, tmp_path, venv):
    ws = tmp_path / "not_yet"
    res = run([str(REPO / "submit.sh"), "tiny", "--dry-run"], env={**fake_sbatch, **launcher_env(ws)})
    assert res.returncode == 0 and "dry run: nothing submitted" in res.stdout, res.stderr
    assert not ws.exists()


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
    assert_rejected(
        res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, "ambiguous model 'alpha' matches: alpha-70b alpha-7b"
    )
    res = run([submit, "7b"], env=env)
    assert_rejected(res, Path(fake_sbatch["SBATCH_CALLS"]), workspace, "ambiguous model '7b' matches: alpha-7b beta-7b")


def test_broken_yaml_config(scratch_repo, fake_sbatch, workspace):
    (scratch_repo / "configs" / "broken.yml").write_text(
        'base_config: "base.yml"\nsteps: [1, 2\nper_device_batch_size: 1\n'
    )
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
        sbatch_call, release = calls.read_text().splitlines()[-2:]
        assert f"--job-name={job_name} " in sbatch_call and "--hold " in sbatch_call
        assert release == "scontrol release 4242"
        assert f"Submitted job 4242 ({job_name})" in res.stdout
        assert (workspace / f"4242-{job_name}" / "artifact" / "_job.sbatch").is_file()


def test_dry_run_submits_and_writes_nothing(fake_sbatch, workspace, venv):
    res = run(
        [
            str(REPO / "submit.sh"),
            "tiny:t1",
            "-N",
            "2",
            "--dry-run",
            "-t",
            "10",
            "--",
            "steps=5",
            "_env_HF_TOKEN=abc123",
        ],
        env={**fake_sbatch, **launcher_env(workspace)},
    )
    assert res.returncode == 0, res.stderr
    assert "--job-name=JAX-tiny-t1 --nodes=2" in res.stdout and " -t 10 " in res.stdout
    assert "HF_TOKEN=<redacted>" in res.stdout and "abc123" not in res.stdout
    assert not Path(fake_sbatch["SBATCH_CALLS"]).exists()
    assert not any(workspace.iterdir())


@pytest.mark.parametrize(
    ("cmd", "env", "status", "message"),
    [
        (["submit.sh", "tiny", "-N", "two"], {}, 2, "bad node count 'two'"),
        (["submit.sh", "--bogus"], {}, 2, "first argument must be MODEL[:TAG]"),
        (["submit.sh", "tiny", "--run", "a b"], {}, 2, "bad run alias 'a b'"),
        (["run_local.sh", "tiny", "--bogus"], {}, 2, "unexpected '--bogus'"),
        (["utils/prometheus.sh", "bogus"], {}, 2, "unknown command 'bogus'"),
        (["submit.sh", "tiny"], {"RAY": "yes"}, 1, "RAY='yes' must be 0 or 1"),
        (["submit.sh", "nosuchmodel"], {}, 1, "unknown model 'nosuchmodel'"),
        (["utils/prometheus.sh", "view", "/nonexistent/job"], {}, 1, "/nonexistent/job does not exist"),
    ],
)
def test_exit_status_rule(cmd, env, status, message, fake_sbatch, workspace, venv):
    """utils/launch/lib.sh "Exit status": 2 for a wrong command line (die_usage), 1 for everything else
    (die); one line either way."""
    res = run([str(REPO / cmd[0]), *cmd[1:]], env={**fake_sbatch, **launcher_env(workspace), **env})
    lines = res.stderr.strip().splitlines()
    assert (res.returncode, len(lines)) == (status, 1), res.stderr
    assert message in lines[0]


def test_command_line_errors_use_die_usage():
    """The phrases of a wrong command line are never said through die (exit 1) in a shell script."""
    from test_lint import project_files

    usage = re.compile(
        r'\bdie "(unknown option|unknown command|[^"]* takes one |bad node count'
        r"|(--?[a-z-]+|\$1) needs (a value|a count|a node count|a run alias|START))"
    )
    wrong = [
        f"{path.relative_to(REPO)}:{n}"
        for path in project_files()
        if path.suffix in {".sh", ".sbatch"} or path.name in {"submit.sh", "run_local.sh"}
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if usage.search(line)
    ]
    assert not wrong, wrong
