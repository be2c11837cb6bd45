"""Site settings (configs/site.env.sh, or the file MST_SITE_FILE names): read as data, applied only
where the user's environment and command line say nothing, shown in the dry run and the job header.

Every test points MST_SITE_FILE at a file of its own (or uses a scratch copy of the repository):
configs/site.env.sh of the checkout is never written. A fake `sbatch` first on PATH records its
arguments and the environment the job would get; one real job on the local cluster checks that
Slurm took the site's flags.
"""

import os
import re
import shlex
import uuid
from pathlib import Path

import pytest
from conftest import REPO, launcher_env, run

from helpers.jobs import SUBMITTED, summary, wait_job_end

FAKE_SBATCH = """#!/bin/sh
printf '%s\\n' "$@" > "$SBATCH_CALLS"
printf 'CONTAINER_IMAGE=%s\\nMST_SITE_APPLIED=%s\\n' "$CONTAINER_IMAGE" "$MST_SITE_APPLIED" > "$SBATCH_CALLS.env"
echo 4242
"""

SITE = """# a site
export SITE_SBATCH_FLAGS="--partition=gpu -A proj --exclusive -t 01:00:00"   # Slurm defaults
export CONTAINER_IMAGE=registry.example/maxtext:7
export CONTAINER_AUTH_FILE='/etc/mst/auth.json'
export CONTAINER_MOUNTS="/data:/data:ro /libs:/libs:ro"
  export NCCL_IB_HCA=^mlx5_0
"""


@pytest.fixture()
def fake(tmp_path: Path, workspace: Path) -> dict[str, str]:
    """Environment with the fake sbatch (and scontrol, to release the held job) first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("scontrol", "#!/bin/sh\n")):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    # without the tests' shared compilation cache: it is a site setting, and one in your environment
    # wins over the site file's (these jobs never train)
    env = {k: v for k, v in launcher_env(workspace).items() if k != "COMPILE_CACHE_DIR"}
    return {
        **env,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "SBATCH_CALLS": str(tmp_path / "sbatch_calls"),
    }


def site_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "site.env.sh"
    path.write_text(text)
    return str(path)


def dry_run(env: dict[str, str], *args: str) -> dict[str, str]:
    res = run([str(REPO / "submit.sh"), "tiny", "--dry-run", *args], env=env)
    assert res.returncode == 0, res.stderr
    return dict(line.split(": ", 1) for line in res.stdout.splitlines() if ": " in line)


def test_site_defaults_reach_the_dry_run_and_the_job(fake, tmp_path, workspace, venv):
    env = {**fake, "MST_SITE_FILE": site_file(tmp_path, SITE)}
    out = dry_run(env, "--qos=high")
    site_flags = "--partition=gpu --account=proj --exclusive --time=01:00:00"
    assert f".log {site_flags} --qos=high <snapshot>/_job.sbatch" in out["sbatch"]  # site first, yours after
    assert out["site"] == (
        f"file={env['MST_SITE_FILE']} CONTAINER_IMAGE=registry.example/maxtext:7 CONTAINER_AUTH_FILE=<redacted>"
        " CONTAINER_MOUNTS='/data:/data:ro /libs:/libs:ro' NCCL_IB_HCA=^mlx5_0"
        " sbatch=--partition=gpu sbatch=--account=proj sbatch=--exclusive sbatch=--time=01:00:00"
    )
    assert "site_sbatch_dropped" not in out
    assert not Path(fake["SBATCH_CALLS"]).exists() and not any(workspace.iterdir())

    # a real submission: sbatch gets the flags, the job the variables and what the site contributed
    res = run([str(REPO / "submit.sh"), "tiny", "--qos=high"], env=env)
    assert res.returncode == 0, res.stderr
    argv = Path(fake["SBATCH_CALLS"]).read_text().split("\n")
    assert argv[argv.index("--partition=gpu") : argv.index("--qos=high") + 1] == [*site_flags.split(), "--qos=high"]
    job_env = dict(line.split("=", 1) for line in Path(fake["SBATCH_CALLS"] + ".env").read_text().splitlines())
    assert job_env["CONTAINER_IMAGE"] == "registry.example/maxtext:7"
    assert job_env["MST_SITE_APPLIED"] == out["site"]
    # the job header (printed by the job from that environment) shows it; without a site: none
    header = run([str(REPO / "utils/launch/job_header.sh")], env={"MST_SITE_APPLIED": out["site"]}).stdout
    assert f"\nsite: {out['site']}\n" in header and "/etc/mst/auth.json" not in header
    header = run([str(REPO / "utils/launch/job_header.sh")], env={"MST_SITE_APPLIED": ""}).stdout
    assert re.search(r"^container: .*\nsite: none\nray: ", header, re.M), header


def test_your_environment_and_flags_win(fake, tmp_path, workspace, venv):
    env = {
        **fake,
        "MST_SITE_FILE": site_file(tmp_path, SITE),
        "CONTAINER_IMAGE": "mine:1",
        "CONTAINER_MOUNTS": "",  # set empty: the site's mounts are dropped too
    }
    out = dry_run(env, "-p", "debug", "--ti=5", "--oversubscribe")
    # -p beats --partition, an abbreviation (--ti) beats -t, --oversubscribe beats --exclusive
    assert ".log --account=proj -p debug --ti=5 --oversubscribe <snapshot>" in out["sbatch"]
    assert out["site_sbatch_dropped"] == "--partition=gpu --exclusive --time=01:00:00 (you gave these options)"
    assert "CONTAINER_IMAGE" not in out["site"] and "CONTAINER_MOUNTS" not in out["site"]
    assert out["site"].endswith("NCCL_IB_HCA=^mlx5_0 sbatch=--account=proj")
    res = run([str(REPO / "submit.sh"), "tiny", "-p", "debug"], env=env)
    assert res.returncode == 0, res.stderr
    assert "CONTAINER_IMAGE=mine:1\n" in Path(fake["SBATCH_CALLS"] + ".env").read_text()
    # sbatch's own input variables are yours too (sbatch's command line would beat them)
    out = dry_run({**env, "SBATCH_ACCOUNT": "mine", "SBATCH_TIMELIMIT": "5"})
    assert out["site_sbatch_dropped"] == "--account=proj --time=01:00:00 (you gave these options)"
    # an empty SITE_SBATCH_FLAGS in your environment drops every site flag; --gpus is no
    # abbreviation of --gpus-per-node (sbatch takes the whole name first)
    out = dry_run({**env, "SITE_SBATCH_FLAGS": ""}, "--gpus=2")
    assert ".log --gpus=2 <snapshot>" in out["sbatch"] and "sbatch=" not in out["site"]
    site = site_file(tmp_path, 'export SITE_SBATCH_FLAGS="--gpus-per-node=8 --mem=0"\n')
    out = dry_run({**fake, "MST_SITE_FILE": site}, "--gpus=2", "--mem-per-gpu=10G")
    assert ".log --gpus-per-node=8 --gpus=2 --mem-per-gpu=10G <snapshot>" in out["sbatch"]  # --mem: one setting


def test_default_site_file_and_none(scratch_repo, fake, workspace):
    """Without MST_SITE_FILE the site file is configs/site.env.sh; a missing one is no error."""
    default = scratch_repo / "configs" / "site.env.sh"
    default.unlink(missing_ok=True)
    res = run([str(scratch_repo / "submit.sh"), "tiny", "--dry-run"], env=fake)
    assert res.returncode == 0 and "\nsite: none\n" in res.stdout, res.stderr
    default.write_text("export CONTAINER_RUNTIME=none\n")
    res = run([str(scratch_repo / "submit.sh"), "tiny", "--dry-run"], env=fake)
    assert f"\nsite: file={default} CONTAINER_RUNTIME=none\n" in res.stdout, res.stderr
    # /dev/null reads nothing
    res = run([str(scratch_repo / "submit.sh"), "tiny", "--dry-run"], env={**fake, "MST_SITE_FILE": "/dev/null"})
    assert "\nsite: file=/dev/null\n" in res.stdout, res.stderr


def test_user_and_home_expand(fake, tmp_path, venv):
    """$USER and $HOME (plain or "..."; not in '...', as in a shell) are the launching user's."""
    site = site_file(
        tmp_path,
        'export COREDUMP_DIR=/scratch/$USER/cores\nexport CONTAINER_MOUNTS="${HOME}/data:/data:ro"\n'
        "export CONTAINER_IMAGE='$USER'\n",
    )
    out = dry_run({**fake, "MST_SITE_FILE": site, "USER": "alice", "HOME": "/home/alice"})
    assert out["site"] == (
        f"file={site} COREDUMP_DIR=/scratch/alice/cores CONTAINER_MOUNTS=/home/alice/data:/data:ro"
        " CONTAINER_IMAGE='$USER'"
    )


def test_the_example_documents_every_site_setting(fake, tmp_path, venv):
    """configs/site.env.sh.example with every example line switched on is a valid site file, and it
    names every setting a site file may set (the site column of utils/launch/settings.tsv)."""
    example = (REPO / "configs" / "site.env.sh.example").read_text()
    on = re.sub(r"^#export ", "export ", example, flags=re.M)
    home = tmp_path / "home"  # the example's remote-write secret, a file of the user's, mode 600
    secret = home / ".config/maxtext-slurm/remote-write.secret"
    secret.parent.mkdir(parents=True)
    secret.write_text("t0ken")
    secret.chmod(0o600)
    out = dry_run({**fake, "HOME": str(home), "MST_SITE_FILE": site_file(tmp_path, on)})
    rows = [line.split("\t") for line in (REPO / "utils/launch/settings.tsv").read_text().splitlines()]
    names = {row[0] for row in rows if not row[0].startswith("#") and row[3] == "yes"}
    assert names == set(re.findall(r"^export (\w+)=", on, re.M))
    applied = {kv.split("=", 1)[0] for kv in shlex.split(out["site"])[1:]}
    assert applied == names - {"SITE_SBATCH_FLAGS"} | {"sbatch"}


BAD = [
    ("export CONTAINER_IMAGE=$(touch {probe})", ":2: not a comment or an 'export NAME=VALUE' line"),
    ('export CONTAINER_IMAGE="x`touch {probe}`"', ":2: not a comment or an 'export NAME=VALUE' line"),
    ("export CONTAINER_IMAGE=a b", ":2: not a comment"),
    ("export COREDUMP_DIR=/x/$PWD", ":2: not a comment"),  # only $USER and $HOME expand
    ("export COREDUMP_DIR=/x/$USERX", ":2: not a comment"),
    ('export CONTAINER_IMAGE="${{USER:-{probe}}}"', ":2: not a comment"),
    ("export COREDUMP_DIR=/x/{{a,b}}", ":2: not a comment"),  # brace expansion
    ("CONTAINER_IMAGE=x", ":2: not a comment"),
    ("source {probe}", ":2: not a comment"),
    ("export CONTAINER_IMAGE=x; touch {probe}", ":2: not a comment"),
    ("export HF_TOKEN=hf_123", ":2: 'HF_TOKEN' is not a site setting; a site file may set: STAGE_TIMEOUTS "),
    ("export CONTAINER_IMAGE=x\nexport CONTAINER_IMAGE=y", ":3: CONTAINER_IMAGE is set twice (also on line 2)"),
    ("export CONTAINER_IMAGE=x\r", ":2: the line ends in a carriage return"),
    ("export SITE_SBATCH_FLAGS=--job-name=x", "(from {site}): sbatch flag '--job-name=x' (--job-name) contradicts"),
    ('export SITE_SBATCH_FLAGS="--partition gpu"', "(from {site}): 'gpu' is not an option; write each flag as one"),
    ("export SITE_SBATCH_FLAGS=-Z", "unknown short option '-Z'"),
    ("export CONTAINER_RUNTIME=kubernetes", "(CONTAINER_RUNTIME is set by the site file {site})"),
]


@pytest.mark.parametrize(("line", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_bad_site_file_is_refused(line, message, fake, tmp_path, workspace, venv):
    """One line naming FILE:LINE, exit 1, nothing submitted or written, nothing in the file run."""
    probe = tmp_path / "ran"
    site = site_file(tmp_path, "# ok\n" + line.format(probe=probe) + "\n")
    for args in (["tiny"], ["tiny", "--dry-run"]):
        res = run([str(REPO / "submit.sh"), *args], env={**fake, "MST_SITE_FILE": site})
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, res.stderr
        assert lines[0].startswith("submit.sh: ") and message.format(site=site) in lines[0], lines[0]
        assert not probe.exists() and not Path(fake["SBATCH_CALLS"]).exists() and not any(workspace.iterdir())
    assert "hf_123" not in res.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/nonexistent/site.env.sh", "MST_SITE_FILE='/nonexistent/site.env.sh' does not exist"),
        ("", "MST_SITE_FILE is set but empty"),
        ("/", "site file '/' is not a readable file"),
    ],
)
def test_missing_site_file_is_an_error(value, message, fake, workspace, venv):
    for launcher in ("submit.sh", "run_local.sh"):
        res = run([str(REPO / launcher), "tiny"], env={**fake, "MST_SITE_FILE": value})
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1 and message in lines[0], res.stderr
        assert not Path(fake["SBATCH_CALLS"]).exists() and not any(workspace.iterdir())


def test_run_local_applies_the_site(fake, tmp_path, workspace, venv):
    """run_local.sh takes the same variables (here the preflight disk minimum, which fails the job
    in its first second, on purpose) and says once that it ignores the sbatch flags."""
    site = site_file(
        tmp_path,
        'export SITE_SBATCH_FLAGS="--partition=gpu --exclusive"\n'
        "export PREFLIGHT_MIN_FREE_GB=999999999\nexport CONTAINER_RUNTIME=none\n",
    )
    res = run([str(REPO / "run_local.sh"), "tiny", "--", "steps=1"], env={**fake, "MST_SITE_FILE": site}, timeout=120)
    assert res.returncode == 1
    note = "run_local.sh: the site's sbatch flags do not apply here (no Slurm): --partition=gpu --exclusive\n"
    assert res.stderr.count("sbatch flags") == 1 and note in res.stderr
    log = next(workspace.glob("local-*-JAX-tiny.log"))
    assert f"\nsite: file={site} PREFLIGHT_MIN_FREE_GB=999999999 CONTAINER_RUNTIME=none\n" in log.read_text()
    s = summary(log)
    assert s["status"] == "failed" and s["stage"] == "preflight"
    assert "(need PREFLIGHT_MIN_FREE_GB=999999999)" in s["first_error"]


@pytest.mark.cluster
def test_site_flags_and_variables_reach_a_slurm_job(cluster, tmp_path, workspace, venv):
    """A real job: the site's --comment and --time reach Slurm (scontrol), the user's --time beats
    the site's, a site variable reaches the job's nodes (the preflight disk minimum, which fails
    both nodes' preflight at once: no training needed), and the header shows the site line."""
    tag = f"mst-site-{uuid.uuid4().hex[:8]}"
    site = site_file(
        tmp_path,
        f'export SITE_SBATCH_FLAGS="--comment={tag} --time=00:09:00"\nexport PREFLIGHT_MIN_FREE_GB=999999999\n',
    )
    env = {**cluster, **launcher_env(workspace), "MST_SITE_FILE": site}
    res = run([str(REPO / "submit.sh"), "tiny", "-N", "2", "--time=00:07:00"], env=env)
    assert res.returncode == 0, res.stderr
    m = re.search(r"Submitted job (\d+)", res.stdout)
    assert m, res.stdout
    job_id = m.group(1)
    SUBMITTED.append(job_id)
    wait_job_end(cluster, job_id, 120)
    info = run(["scontrol", "show", "job", "-o", job_id], env=cluster).stdout
    assert f"Comment={tag}" in info and "TimeLimit=00:07:00" in info, info
    log = workspace / f"{job_id}-JAX-tiny.log"
    text = log.read_text()
    assert f"\nsite: file={site} PREFLIGHT_MIN_FREE_GB=999999999 sbatch=--comment={tag}\n" in text, text[:2000]
    for host in ("n1", "n2"):
        assert re.search(rf"^{host}: preflight: FAILED: .*\(need PREFLIGHT_MIN_FREE_GB=999999999\)", text, re.M)
    assert summary(log)["stage"] == "preflight"
