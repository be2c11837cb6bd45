"""The env contract document matches the code; the tiers below _job.sbatch know nothing of Slurm;
the environment precedence is launcher defaults < configs/MODEL.env.sh < _env_ overrides."""

import getpass
import re
from pathlib import Path

from conftest import REPO, run

DOC = REPO / "docs" / "env-contract.md"


def documented() -> tuple[set[str], set[str]]:
    """(variables passed into containers, host-only variables) from the contract's tables."""
    text = DOC.read_text().split("## Set by the training tier")[0]
    passed, host_only = set(), set()
    for m in re.finditer(r"^\| `([A-Z_][A-Z0-9_]*)`( \*\(host only\)\*)? \|", text, re.M):
        (host_only if m.group(2) else passed).add(m.group(1))
    return passed, host_only


def container_vars() -> set[str]:
    """What _container.sh passes in: the table's container column (tests/test_settings.py holds it)."""
    script = f"source {REPO}/utils/launch/lib.sh; settings_names container"
    res = run(["bash", "-c", script])
    assert res.returncode == 0, res.stderr
    return set(res.stdout.split())


def test_container_list_matches_document():
    passed, _ = documented()
    assert container_vars() == passed


def test_every_exported_job_variable_is_documented():
    passed, host_only = documented()
    names = set()
    for f in ("_job.sbatch", "run_local.sh", "submit.sh", "utils/launch/launch_lib.sh", "_container.sh"):
        src = (REPO / f).read_text()
        for m in re.finditer(r"export ((?:[A-Z_][A-Z0-9_]*(?:=\S*)?\s*)+)", src):
            names.update(re.findall(r"([A-Z_][A-Z0-9_]*)(?:=|\s|$)", m.group(1)))
    names -= {"PATH"}
    undocumented = {n for n in names if n.startswith(("JOB_", "MST_", "MODEL", "TRAIN_"))} - passed - host_only
    assert not undocumented


def test_only_job_sbatch_reads_slurm_variables():
    offenders = []
    from test_lint import project_files

    for path in project_files():
        rel = path.relative_to(REPO)
        if rel.parts[0] in {"docs", "tests"}:
            continue
        if rel.name in {"_job.sbatch", "local_cluster.sh"} or rel.suffix in {".md", ".txt"}:
            continue
        text = path.read_text(errors="replace")
        if re.search(r"\$\{?SLURM_|environ(\.get)?\(?\[?['\"]SLURM_", text):
            offenders.append(str(rel))
    assert not offenders, f"Slurm variables read outside _job.sbatch: {offenders}"


def test_env_precedence(scratch_repo: Path):
    (scratch_repo / "configs" / "probe.yml").write_text('base_config: "base.yml"\n')
    (scratch_repo / "configs" / "probe.env.sh").write_text(
        "# probe model env\nexport XLA_PYTHON_CLIENT_MEM_FRACTION=0.5\nexport PROBE_MODEL_ONLY=model\n"
    )
    train = str(scratch_repo / "_train.sh")

    def composed(**env: str) -> dict[str, str]:
        res = run([train, "--print-env"], env={"MST_REPO": str(scratch_repo), **env})
        assert res.returncode == 0, res.stderr
        return dict(line.split("=", 1) for line in res.stdout.splitlines())

    # launcher default only
    assert composed(MODEL="tiny")["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.93"
    # the model's env file beats the launcher default
    got = composed(MODEL="probe")
    assert got["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5" and got["PROBE_MODEL_ONLY"] == "model"
    # _env_ overrides beat both; the Hugging Face token reaches the trainer as a private file
    # (HF_TOKEN_PATH, redacted: a secret-looking name), never as HF_TOKEN (MaxText copies that into its config)
    got = composed(MODEL="probe", TRAIN_ENV_OVERRIDES="XLA_PYTHON_CLIENT_MEM_FRACTION=0.7\nHF_TOKEN=hunter2\n")
    assert got["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.7"
    assert got["HF_TOKEN_PATH"] == "<redacted>" and "HF_TOKEN" not in got
    # the generic job variables become MaxText's multi-process variables
    got = composed(
        MODEL="tiny",
        JOB_COORDINATOR_ADDR="10.1.2.3",
        JOB_COORDINATOR_PORT="61500",
        JOB_NUM_NODES="4",
        JOB_NODE_RANK="3",
    )
    assert (got["JAX_COORDINATOR_IP"], got["JAX_COORDINATOR_PORT"], got["NNODES"], got["NODE_RANK"]) == (
        "10.1.2.3",
        "61500",
        "4",
        "3",
    )
    assert got["JAX_COORDINATOR_BIND_ADDRESS"] == "10.1.2.3:61500"


def test_trainer_command(scratch_repo: Path):
    """MaxText overrides go on the command line, except credentials (argv is public: ps; they reach the
    Hugging Face libraries in a private file, docs/security.md); -P keeps the working directory off the import path."""
    env = {
        "MST_REPO": str(scratch_repo),
        "MODEL": "tiny",
        "JOB_DIR": "/jobs/7-JAX-tiny",
        "JOB_NAME": "7-JAX-tiny",
        "JOB_WORKSPACE": "/jobs",
        "MST_PYTHON": "/venv/bin/python",
        "TRAIN_OVERRIDES": "steps=3\nhf_access_token=hf_secret7\nper_device_batch_size=2\n",
        "COMPILE_CACHE_DIR": "",  # unset: the default
    }
    res = run([str(scratch_repo / "_train.sh"), "--print-cmd"], env=env)
    assert res.returncode == 0, res.stderr
    printed_env = run([str(scratch_repo / "_train.sh"), "--print-env"], env=env).stdout.splitlines()
    assert "HF_TOKEN_PATH=<redacted>" in printed_env and "hf_secret7" not in "".join(printed_env)
    assert not [v for v in printed_env if v.startswith("M_")], printed_env
    assert res.stdout.split() == [
        "/venv/bin/python",
        "-P",
        "-m",
        "maxtext.trainers.pre_train.train",
        f"{scratch_repo}/configs/tiny.yml",
        "run_name=7-JAX-tiny",
        "base_output_directory=/jobs/7-JAX-tiny",
        "jax_cache_dir=/jobs/7-JAX-tiny/.jax_cache",
        "steps=3",
        "per_device_batch_size=2",
    ]
    # a site's COMPILE_CACHE_DIR: the user's own directory in it
    res = run([str(scratch_repo / "_train.sh"), "--print-cmd"], env={**env, "COMPILE_CACHE_DIR": "/local/jax/"})
    assert f"jax_cache_dir=/local/jax/{getpass.getuser()}" in res.stdout.split(), res.stdout


def test_every_launcher_variable_is_reserved_from_env_overrides():
    """_env_ cannot reset what the launcher set and checked (the GPU visibility variables, which the
    site sets and the launcher only passes through, and the network of the collectives, which the user
    or the site may set and the launcher only fills in where unset, stay the user's)."""
    passed, host_only = documented()
    names = (passed | host_only | container_vars()) - {
        "CUDA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "MAXTEXT_SLURM_VENV",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
    }
    script = f'source {REPO}/utils/launch/lib.sh; for n in "$@"; do is_reserved_env "$n" || echo "$n"; done'
    res = run(["bash", "-c", script, "bash", *sorted(names)])
    assert res.returncode == 0 and res.stdout.split() == [], f"not reserved: {res.stdout.split()}"


def test_secret_maxtext_keys_are_the_schemas_credentials():
    """The launcher hides (and keeps out of argv) exactly MaxText's credential keys."""
    import json

    schema = json.loads((REPO / "requirements" / "maxtext-schema.json").read_text())
    res = run(["bash", "-c", f'source {REPO}/utils/launch/lib.sh; echo "$SECRET_MAXTEXT_KEYS"'])
    assert set(res.stdout.split()) == set(schema["secret_keys"]) != set()
